//! A partitioned outbox against the `DELETE` cleanup (PostgreSQL): 10M published rows retained over ten
//! days (1M a day), then 100k pending over 10k aggregates. For each table shape: the relay's rate alone,
//! the cleanup that removes the oldest day (1M rows: `DELETE` batches of 1000, or one partition dropped),
//! the relay's rate while that cleanup runs, and what a writer waits meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::{TimeZone, Utc};
use outbox_seaorm::partition::{self, PartitionInterval};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{NewEvent, SeaOrmStore};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend};

use super::{Ctx, NullPublisher, Shape, config, drain_ours, fill_ours};
use crate::report::{Table, fmt, quantile};

const DAY_MS: i64 = 86_400_000;
const DAYS: i64 = 10;
/// The floor of the partitioned relay's rate against one table's (measured: 0.88-0.97x).
const PARTITIONED_FLOOR: f64 = 0.7;

pub async fn run(ctx: &Ctx) -> Result<()> {
    if ctx.target.backend != DbBackend::Postgres {
        eprintln!("[{}] partitions: skipped, a partitioned outbox is PostgreSQL only", ctx.target.label());
        return Ok(());
    }
    let per_day = ctx.size(1_000_000, 20_000) as i64;
    let shape = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let mut table = Table::new(
        format!(
            "partitions: {} published rows over {DAYS} days retained, {} pending over 10,000 aggregates, batch 1000 \
             ({}, 1 round)",
            per_day * DAYS,
            shape.events,
            ctx.target.label()
        ),
        &[
            "outbox",
            "relay alone, events/s",
            "cleanup of the oldest day",
            "cleanup took, s",
            "relay during the cleanup, events/s",
            "a writer's commit during the cleanup, p50 / max ms",
            "relay after the cleanup, events/s",
        ],
    );
    // (alone, after the cleanup) per shape, for the floors.
    let mut rates = Vec::new();
    for partitioned in [false, true] {
        let db = ctx.target.fresh().await?;
        let now = Utc::now();
        let today = now.timestamp_millis().div_euclid(DAY_MS) * DAY_MS;
        if partitioned {
            partition::partition_outbox(&db, PartitionInterval::Day).await?;
            // The past days' partitions, as a service running all along would have made them.
            for back in (0..=DAYS).rev().step_by(4) {
                let then = Utc.timestamp_millis_opt(today - back * DAY_MS).single().context("a past day")?;
                partition::maintain(&db, then, Duration::from_secs(1000 * 86_400), 1000).await?;
            }
        }
        let started = Instant::now();
        fill_days(&db, today, per_day).await?;
        ctx.target.vacuum_analyze(&db).await?;
        eprintln!("[{}] partitions: filled {} rows in {:.1?}", ctx.target.label(), per_day * DAYS, started.elapsed());

        fill_ours(&db, shape, "a").await?;
        let alone = drain_ours(ctx, &config(1000), 1, NullPublisher, shape.events as u64).await?;

        fill_ours(&db, shape, "b").await?;
        // The cutoff falls on the end of the oldest day, so both shapes remove exactly its rows.
        let retention_ms = now.timestamp_millis() - (today - (DAYS - 1) * DAY_MS);
        let retention = Duration::from_millis(u64::try_from(retention_ms).context("retention")?);
        let store = SeaOrmStore::new(ctx.target.connect().await?);
        let cleanup = tokio::spawn(async move {
            let started = Instant::now();
            let removed = store.cleanup(now, retention, 1000).await?;
            Ok::<_, outbox_seaorm::Error>((removed, started.elapsed()))
        });
        let stop = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn(write_one_by_one(ctx.target.connect().await?, stop.clone()));
        let during = drain_ours(ctx, &config(1000), 1, NullPublisher, shape.events as u64).await?;
        let (removed, took) = cleanup.await.context("cleanup task")??;
        stop.store(true, Ordering::Relaxed);
        let mut commits = writer.await.context("writer task")??;
        fill_ours(&db, shape, "c").await?;
        let after = drain_ours(ctx, &config(1000), 1, NullPublisher, shape.events as u64).await?;
        if removed != per_day as u64 {
            bail!("the cleanup removed {removed} rows; expected the oldest day's {per_day}");
        }
        commits.sort_by(f64::total_cmp);
        rates.push((alone.rate(), after.rate()));
        table.row(vec![
            if partitioned { "partitioned by day" } else { "one table" }.to_owned(),
            fmt(alone.rate()),
            if partitioned {
                "1 partition dropped".to_owned()
            } else {
                format!("{} DELETEs of 1000 rows", per_day / 1000)
            },
            format!("{:.2}", took.as_secs_f64()),
            fmt(during.rate()),
            format!("{} / {}", fmt(quantile(&commits, 0.5)), fmt(commits.last().copied().unwrap_or(0.0))),
            fmt(after.rate()),
        ]);
        db.close().await.context("close")?;
    }
    if let [(one_alone, one_after), (part_alone, part_after)] = rates[..] {
        // Without the partition skipping the relay ran at 0.6x; with a plan that scans every pending row by
        // creation time, at 0.03x (BENCHMARKS.md, "A partitioned outbox").
        ctx.floor("partitioned / one table, the relay alone", part_alone / one_alone, PARTITIONED_FLOOR);
        ctx.floor("partitioned / one table, after the cleanup", part_after / one_after, PARTITIONED_FLOOR);
    }
    table.note(
        "Command: `outbox-relay-bench --scenario partitions` (1 round: each shape fills 10M rows). The published rows \
         are written by one INSERT … SELECT per day and analyzed; the pending ones by enqueue_all. The cleanup is \
         `MaintenanceStore::cleanup` (what the service runs) with a retention ending at the oldest day's end; it \
         starts with the drain of the second 100k. The writer commits one event at a time on its own pool until \
         the drain and the cleanup are done.",
    );
    table.emit(ctx.out.as_deref())
}

/// `per_day` published rows for each of the [`DAYS`] days before `today`, 10,000 aggregates, event ids
/// in order (so the fill appends to the `event_id` index instead of scattering into it).
async fn fill_days(db: &DatabaseConnection, today: i64, per_day: i64) -> Result<()> {
    for day in 0..DAYS {
        let from = today - (DAYS - day) * DAY_MS;
        let first = day * per_day;
        let sql = format!(
            "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
             schema_version, payload, headers, created_at_ms, attempts, next_attempt_at_ms, published_at_ms) \
             SELECT '00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'), 'order', 'r' || (g % 10000), \
             g / 10000 + 1, 'order.placed', 1, '{{\"total_minor\": 4900, \"currency\": \"EUR\"}}'::jsonb, '{{}}'::jsonb, \
             {from} + (g - {first}) * {DAY_MS} / {per_day}, 1, {from}, {from} + (g - {first}) * {DAY_MS} / {per_day} + 50 \
             FROM generate_series({first}::bigint, {first} + {per_day} - 1) AS g"
        );
        db.execute_unprepared(&sql).await.with_context(|| format!("fill day {day}"))?;
    }
    Ok(())
}

/// Commits one event at a time until `stop`; returns each commit's milliseconds.
async fn write_one_by_one(db: DatabaseConnection, stop: Arc<AtomicBool>) -> Result<Vec<f64>> {
    let mut commits = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let event = NewEvent::new("order", format!("w{}", n % 100), "order.placed", &serde_json::json!({ "n": n }))?;
        let started = Instant::now();
        outbox_seaorm::enqueue_all(&db, &[event]).await.context("writer enqueue")?;
        commits.push(started.elapsed().as_secs_f64() * 1000.0);
        n += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(commits)
}

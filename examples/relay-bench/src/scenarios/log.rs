//! The log relay (`outbox_seaorm::log`, PostgreSQL logical replication) against the polling relay, both on
//! the cluster with `wal_level = logical` (`OUTBOX_BENCH_LOG_URL`, default port 5433, schema
//! `outbox_bench`; `.ci/pg-logical.sh start`): a drain of a backlog over 10,000 aggregates and over one, to
//! a publisher that confirms at once and to NATS JetStream; the writers' commit rate while each relay keeps
//! up; commit → publish latency at 1,000 events/s written by another process; WAL bytes per event over its
//! whole life. Skipped, with the reason printed, when that cluster does not answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_seaorm::log::{self, LogRelay, LogRelayConfig};
use outbox_seaorm::{CancellationToken, Destination, OutboxEvent, PublishError, Publisher, Relay, SeaOrmStore};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

use super::latency::{Recorder, write_in_child};
use super::{Ctx, NullPublisher, Shape, alternate_with, config, drain_ours, fill_ours, round_ratio};
use crate::report::{RATE_HEADER, Run, Table, fmt, quantile, summary};
use crate::target::Target;

/// The variable naming the logical-replication bench target.
pub const LOG_URL_VAR: &str = "OUTBOX_BENCH_LOG_URL";
const DEFAULT_LOG_URL: &str = "postgres://postgres@127.0.0.1:5433/test?options=-c%20search_path%3Doutbox_bench";
const SLOT: &str = "outbox_bench_slot";
const PUBLICATION: &str = "outbox_bench_pub";
const NATS_URL: &str = "nats://127.0.0.1:4222";

/// Counts the events its inner publisher confirmed.
#[derive(Clone)]
struct Counted<P> {
    inner: P,
    confirmed: Arc<AtomicU64>,
}

impl<P: Publisher> Publisher for Counted<P> {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let results = self.inner.publish(events).await;
        let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
        self.confirmed.fetch_add(ok, Ordering::Relaxed);
        results
    }
}

fn counted<P>(inner: P) -> Counted<P> {
    Counted { inner, confirmed: Arc::default() }
}

fn log_config() -> Result<LogRelayConfig> {
    Ok(LogRelayConfig::default().with_slot(SLOT)?.with_publication(PUBLICATION)?)
}

/// Runs the scenario, or prints why it is skipped.
pub async fn run(outer: &Ctx) -> Result<()> {
    if outer.target.backend != DbBackend::Postgres {
        println!("\nlog: skipped: the log relay reads PostgreSQL's log");
        return Ok(());
    }
    let url = std::env::var(LOG_URL_VAR).unwrap_or_else(|_| DEFAULT_LOG_URL.to_owned());
    let target = Target::parse(&url)?;
    let probe = match target.connect().await {
        Ok(db) => scalar(&db, "SHOW wal_level").await.ok(),
        Err(_) => None,
    };
    if probe.as_deref() != Some("logical") {
        println!(
            "\nlog: skipped: no PostgreSQL with wal_level = logical at {LOG_URL_VAR} (bash .ci/pg-logical.sh start)"
        );
        return Ok(());
    }
    let ctx = Ctx {
        target,
        quick: outer.quick,
        rounds: outer.rounds,
        budget: outer.budget,
        out: outer.out.clone(),
        plots: None,
        notify: false,
        floors: outer.floors,
        below: std::sync::Mutex::default(),
    };
    let result = async {
        if std::env::var("OUTBOX_BENCH_LOG_ONLY").as_deref() == Ok("drain") {
            // One drain, for a look at where its time goes.
            let run = drain_log(&ctx, Shape { events: 100_000, aggregates: 10_000 }, NullPublisher, false).await?;
            println!("log relay drain: {:.0} events/s", run.rate());
            return Ok(());
        }
        if std::env::var("OUTBOX_BENCH_LOG_ONLY").as_deref() == Ok("wal") {
            return wal(&ctx).await;
        }
        drains(&ctx).await?;
        commit_rate(&ctx).await?;
        latency(&ctx).await?;
        wal(&ctx).await
    }
    .await;
    let admin = ctx.target.connect().await?;
    drop_slot(&admin).await?;
    outer
        .below
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend(ctx.below.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner));
    result
}

async fn scalar(db: &DatabaseConnection, sql: &str) -> Result<String> {
    let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await?.context("no row")?;
    Ok(row.try_get_by_index::<String>(0)?)
}

async fn wal_lsn(db: &DatabaseConnection) -> Result<i64> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint",
        ))
        .await?
        .context("no row")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

async fn drop_slot(db: &DatabaseConnection) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match log::drop_slot(db, SLOT).await {
            Ok(_) => return Ok(()),
            Err(error) if error.to_string().contains("is active") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error).context("drop the bench slot"),
        }
    }
}

/// A fresh schema with the publication, and a slot that is caught up (a relay ran on the empty table and
/// stopped): what is enqueued next is in the log for the next relay.
async fn fresh_with_slot(ctx: &Ctx) -> Result<DatabaseConnection> {
    let db = ctx.target.fresh().await?;
    drop_slot(&db).await?;
    db.execute_unprepared(&format!("DROP PUBLICATION IF EXISTS {PUBLICATION}")).await.context("drop publication")?;
    log::create_publication(&db, &log_config()?).await?;
    let running = start_log(ctx, &db, NullPublisher, log_config()?).await?;
    wait_active(&db).await?;
    running.stop().await?;
    Ok(db)
}

struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), outbox_seaorm::log::LogError>>,
}

impl Running {
    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.task.await.context("log relay panicked")?.context("log relay")
    }
}

async fn start_log<P: Publisher + 'static>(
    ctx: &Ctx,
    db: &DatabaseConnection,
    publisher: P,
    config: LogRelayConfig,
) -> Result<Running> {
    let relay = LogRelay::new(db.clone(), &ctx.target.url, publisher, config)?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    Ok(Running { shutdown, task: tokio::spawn(async move { relay.run(stop).await }) })
}

async fn wait_active(db: &DatabaseConnection) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !log::slot_state(db, SLOT).await?.is_some_and(|slot| slot.streaming) {
        anyhow::ensure!(Instant::now() < deadline, "the log relay did not start reading within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One drain: `shape` enqueued behind a caught-up slot, then a log relay times until `publisher`
/// confirmed every event.
async fn drain_log<P: Publisher + Clone + 'static>(ctx: &Ctx, shape: Shape, publisher: P, delete: bool) -> Result<Run> {
    let db = fresh_with_slot(ctx).await?;
    fill_ours(&db, shape, "o").await?;
    let publisher = counted(publisher);
    let confirmed = publisher.confirmed.clone();
    let started = Instant::now();
    let running = start_log(ctx, &db, publisher, log_config()?.with_delete_published(delete)).await?;
    let mut timed_out = false;
    while confirmed.load(Ordering::Relaxed) < shape.events as u64 {
        if started.elapsed() > ctx.budget {
            timed_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let run = Run { done: confirmed.load(Ordering::Relaxed), secs: started.elapsed().as_secs_f64(), timed_out };
    running.stop().await?;
    drop_slot(&db).await?;
    db.close().await.context("close")?;
    Ok(run)
}

async fn drain_polling<P: Publisher + Clone + 'static>(ctx: &Ctx, shape: Shape, publisher: P) -> Result<Run> {
    let db = ctx.target.fresh().await?;
    fill_ours(&db, shape, "o").await?;
    let run = drain_ours(ctx, &config(1000), 1, publisher, shape.events as u64).await;
    db.close().await.context("close")?;
    run
}

async fn drains(ctx: &Ctx) -> Result<()> {
    let nats = match outbox_seaorm::brokers::nats::NatsPublisher::connect(
        NATS_URL,
        Destination::parse("outbox_bench_log.{aggregate_type}.{event_type}").context("destination")?,
    )
    .await
    {
        Ok(publisher) => {
            let stream = format!("OUTBOX_BENCH_LOG_{}", chrono::Utc::now().timestamp_millis());
            publisher.ensure_stream(&stream, &["outbox_bench_log.>"]).await.context("create the bench stream")?;
            Some((Arc::new(publisher), stream))
        }
        Err(error) => {
            println!("log: the NATS cells are skipped: {error}");
            None
        }
    };
    let mut table =
        Table::new(ctx.title("log: drain, log relay vs polling relay (batch 1000), events/s"), &RATE_HEADER);
    let cases = [(ctx.size(100_000, 10_000), 10_000usize), (ctx.size(100_000, 5_000), 1)];
    for (events, aggregates) in cases {
        let shape = Shape { events, aggregates };
        let runs = alternate_with(ctx, 3, async |i| match i {
            0 => drain_polling(ctx, shape, NullPublisher).await,
            1 => drain_log(ctx, shape, NullPublisher, false).await,
            _ => drain_log(ctx, shape, NullPublisher, true).await,
        })
        .await?;
        let case = format!("{events} events, {aggregates} aggregates, confirm at once");
        table.rate_row(&case, "polling relay", &runs[0], None, "events/s");
        table.rate_row(&case, "log relay", &runs[1], Some(&runs[0]), "events/s");
        table.rate_row(&case, "log relay, delete_published", &runs[2], Some(&runs[0]), "events/s");
        if aggregates > 1 {
            // Quick mode's 10,000 events are mostly the relay's start (slot, catch-up check, replication
            // connection): 0.6-1.0x there (0.61 in a CI run), 1.3x at full size; the quick floor only
            // catches a relay several times slower.
            let floor = if ctx.quick { 0.3 } else { 1.2 };
            ctx.floor("log relay / polling relay, confirm at once", round_ratio(&runs[1], &runs[0]), floor);
        }
    }
    if let Some((publisher, stream)) = &nats {
        for (events, aggregates) in [(ctx.size(100_000, 10_000), 10_000usize), (ctx.size(10_000, 2_000), 1)] {
            let shape = Shape { events, aggregates };
            let runs = alternate_with(ctx, 2, async |i| {
                if i == 0 {
                    drain_polling(ctx, shape, publisher.clone()).await
                } else {
                    drain_log(ctx, shape, publisher.clone(), false).await
                }
            })
            .await?;
            let case = format!("{events} events, {aggregates} aggregates, NATS JetStream");
            table.rate_row(&case, "polling relay", &runs[0], None, "events/s");
            table.rate_row(&case, "log relay", &runs[1], Some(&runs[0]), "events/s");
        }
        publisher
            .jetstream()
            .delete_stream(stream)
            .await
            .map_err(|e| anyhow::anyhow!("delete stream {stream}: {e}"))?;
    }
    table.note(
        "The log relay's run is timed from its start to the broker's last confirmation (its bulk marks trail by \
         a window); the polling relay's until its last pass marked its rows. Both on the wal_level=logical cluster.",
    );
    table.emit(ctx.out.as_deref())
}

/// Which relay runs beside the writers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beside {
    Nothing,
    Polling,
    Log,
}

/// 8 writers committing one event per transaction for `duration`, with `beside` publishing meanwhile.
async fn commit_run(ctx: &Ctx, beside: Beside, duration: Duration) -> Result<Run> {
    let db = if beside == Beside::Log { fresh_with_slot(ctx).await? } else { ctx.target.fresh().await? };
    let shutdown = CancellationToken::new();
    let log_relay =
        if beside == Beside::Log { Some(start_log(ctx, &db, NullPublisher, log_config()?).await?) } else { None };
    let polling = if beside == Beside::Polling {
        let relay = Relay::new(SeaOrmStore::new(ctx.target.connect().await?), NullPublisher, config(1000))?;
        let stop = shutdown.clone();
        Some(tokio::spawn(async move { relay.run(stop).await }))
    } else {
        None
    };
    let ids = Arc::new(AtomicU64::new(0));
    let payload = serde_json::json!({"customer": "bench", "total_minor": 4900, "lines": [1, 2, 3]});
    let run = super::load(8, duration, &ids, (db.clone(), payload), |(db, payload), n| async move {
        let event = outbox_seaorm::NewEvent::new("order", format!("o{}", n % 10_000), "order.placed", &payload)?;
        outbox_seaorm::enqueue(&db, &event).await?;
        Ok(1)
    })
    .await?;
    shutdown.cancel();
    if let Some(task) = polling {
        task.await.context("polling relay panicked")?;
    }
    if let Some(running) = log_relay {
        running.stop().await?;
        drop_slot(&db).await?;
    }
    db.close().await.context("close")?;
    Ok(run)
}

async fn commit_rate(ctx: &Ctx) -> Result<()> {
    let duration = Duration::from_secs(ctx.size(10, 3) as u64);
    let variants = [(Beside::Nothing, "no relay"), (Beside::Polling, "polling relay"), (Beside::Log, "log relay")];
    let runs = alternate_with(ctx, variants.len(), async |i| commit_run(ctx, variants[i].0, duration).await).await?;
    let mut table = Table::new(
        ctx.title(&format!("log: 8 writers, one event per transaction, {} s, commits/s", duration.as_secs())),
        &RATE_HEADER,
    );
    for (i, (_, name)) in variants.iter().enumerate() {
        table.rate_row("8 writers", name, &runs[i], (i > 0).then_some(runs[0].as_slice()), "commits/s");
    }
    table.note("vs baseline = the writers' rate beside that relay / their rate with no relay, per round.");
    table.emit(ctx.out.as_deref())
}

/// Commit → confirmation of every event a writer in another process enqueues at `rate` for `duration`.
async fn latency_run(ctx: &Ctx, rate: u32, duration: Duration) -> Result<Vec<f64>> {
    let db = fresh_with_slot(ctx).await?;
    let recorder = Recorder::default();
    let running = start_log(ctx, &db, recorder.clone(), log_config()?).await?;
    wait_active(&db).await?;
    let written = write_in_child(ctx, rate, duration).await?;
    let wait = Instant::now();
    while (recorder.0.lock().map(|v| v.len()).unwrap_or(0) as u64) < written && wait.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await?;
    drop_slot(&db).await?;
    db.close().await.context("close")?;
    let mut seen = recorder.0.lock().map(|v| v.clone()).unwrap_or_default();
    anyhow::ensure!(seen.len() as u64 >= written, "only {} of {written} events published", seen.len());
    seen.sort_by(f64::total_cmp);
    Ok(seen)
}

async fn latency(ctx: &Ctx) -> Result<()> {
    let duration = Duration::from_secs(ctx.size(10, 3) as u64);
    let mut rounds = Vec::new();
    for _ in 0..ctx.rounds {
        rounds.push(latency_run(ctx, 1000, duration).await?);
    }
    let stat = |q: f64| summary(&rounds.iter().map(|v| quantile(v, q)).collect::<Vec<_>>());
    let cell = |(m, lo, hi): (f64, f64, f64)| format!("{} ({}–{})", fmt(m), fmt(lo), fmt(hi));
    let mut table = Table::new(
        ctx.title(&format!("log: commit → publish, 1,000 events/s from another process for {} s", duration.as_secs())),
        &["relay", "p50 ms", "p90 ms", "p99 ms", "max ms"],
    );
    table.row(vec!["log relay".into(), cell(stat(0.5)), cell(stat(0.9)), cell(stat(0.99)), cell(stat(1.0))]);
    table.note("created_at is the enqueue time (ms precision), before the commit; the publisher confirms at once.");
    table.emit(ctx.out.as_deref())
}

/// WAL bytes per event over its whole life: written (transactions of 10), published, then gone from the
/// table (the polling relay's mark and a cleanup `DELETE`; the log relay's bulk mark and the same
/// cleanup; the log relay deleting on publish).
async fn wal_run(ctx: &Ctx, variant: usize, events: usize) -> Result<f64> {
    let db = if variant == 0 { ctx.target.fresh().await? } else { fresh_with_slot(ctx).await? };
    db.execute_unprepared("ALTER TABLE outbox_events SET (autovacuum_enabled = false)").await?;
    let running = match variant {
        0 => None,
        1 => Some(start_log(ctx, &db, NullPublisher, log_config()?).await?),
        _ => Some(start_log(ctx, &db, NullPublisher, log_config()?.with_delete_published(true)).await?),
    };
    let before = wal_lsn(&db).await?;
    let payload: serde_json::Value = serde_json::from_str(crate::baselines::PAYLOAD)?;
    for start in (0..events).step_by(10) {
        let batch = (start..(start + 10).min(events))
            .map(|i| outbox_seaorm::NewEvent::new("order", format!("o{}", i % 1000), "order.placed", &payload))
            .collect::<Result<Vec<_>, _>>()?;
        let txn = sea_orm::TransactionTrait::begin(&db).await?;
        outbox_seaorm::enqueue_all(&txn, &batch).await?;
        txn.commit().await?;
    }
    if variant == 0 {
        super::drain_untimed(&db, &config(1000)).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let left_sql = if variant == 2 {
        "SELECT count(*)::text FROM outbox_events"
    } else {
        "SELECT count(*)::text FROM outbox_events WHERE published_at_ms IS NULL"
    };
    while scalar(&db, left_sql).await? != "0" {
        anyhow::ensure!(Instant::now() < deadline, "the relay did not publish every event within 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if variant < 2 {
        db.execute_unprepared("DELETE FROM outbox_events WHERE published_at_ms IS NOT NULL").await?;
    }
    let after = wal_lsn(&db).await?;
    if let Some(running) = running {
        running.stop().await?;
        drop_slot(&db).await?;
    }
    db.close().await.context("close")?;
    Ok((after - before) as f64 / events as f64)
}

async fn wal(ctx: &Ctx) -> Result<()> {
    let events = ctx.size(20_000, 2_000);
    let names = [
        "polling relay: insert + mark + cleanup",
        "log relay: insert + bulk mark + cleanup",
        "log relay, delete_published: insert + delete",
    ];
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for _ in 0..ctx.rounds {
        for (i, figure) in figures.iter_mut().enumerate() {
            figure.push(wal_run(ctx, i, events).await?);
        }
    }
    let mut table = Table::new(
        ctx.title(&format!("log: WAL bytes per event over its life ({events} events, transactions of 10)")),
        &["variant", "median", "min", "max", "vs polling"],
    );
    let base = summary(&figures[0]).0;
    for (name, figure) in names.iter().zip(&figures) {
        let (median, lo, hi) = summary(figure);
        table.row(vec![(*name).into(), fmt(median), fmt(lo), fmt(hi), format!("{:.2}x", median / base)]);
    }
    table.note("pg_current_wal_insert_lsn() before the first write and after the last row is gone or marked; autovacuum off on the table.");
    table.emit(ctx.out.as_deref())
}

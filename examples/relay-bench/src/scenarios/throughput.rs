//! Drain throughput: ours against the plain-SQL baselines, and how it moves with aggregates, batch size,
//! concurrent relays, claim mode, retained rows, a blocked aggregate and stale planner statistics.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox_seaorm::{ClaimMode, OutboxEvent, PublishError, Publisher, Relay, SeaOrmStore};

use super::{
    Ctx, NullPublisher, Shape, Variant, alternate, alternate_with, config, drain_ours, drain_untimed, fill_ours,
    median_rate, round_ratio,
};
use crate::baselines::Baseline;
use crate::report::{RATE_HEADER, Run, Series, Table, plot};

/// Throughput vs the number of aggregates the backlog spreads over; ours vs the three baselines.
pub async fn aggregates(ctx: &Ctx) -> Result<()> {
    let events = ctx.size(100_000, 10_000);
    let variants = [
        Variant::Base(Baseline::RawCeiling, 1000),
        Variant::Ours(config(1000)),
        Variant::Base(Baseline::Seed000, 1000),
        Variant::Base(Baseline::Seed001, 1000),
    ];
    let mut table =
        Table::new(ctx.title(&format!("aggregates: {events} events, batch 1000, 1 relay, events/s")), &RATE_HEADER);
    let mut series: Vec<Series> = variants.iter().map(|v| Series { label: v.name(), points: Vec::new() }).collect();
    let mut ours = Vec::new();
    for aggregates in [10_000, 1000, 100, 10, 1] {
        let shape = Shape { events, aggregates };
        let list: Vec<_> = variants.iter().map(|v| (v.clone(), shape, 1)).collect();
        let runs = alternate(ctx, &list).await?;
        let first = runs[0].clone();
        for (i, (variant, runs)) in variants.iter().zip(&runs).enumerate() {
            let base = if i == 0 { None } else { Some(first.as_slice()) };
            table.rate_row(&format!("{aggregates} aggregates"), &variant.name(), runs, base, "events/s");
            series[i].points.push((aggregates as f64, median_rate(runs)));
        }
        ours.push(runs[1].clone());
    }
    let hot_floor = match ctx.target.backend {
        sea_orm::DbBackend::MySql => 0.2,
        _ => 0.7,
    };
    ctx.floor("hot aggregate / 10,000 aggregates", round_ratio(&ours[4], &ours[0]), hot_floor);
    table.note("seed001 always uses the article's LIMIT 100. raw-ceiling and the seeds keep no per-aggregate order.");
    table.emit(ctx.out.as_deref())?;
    if let Some(dir) = &ctx.plots {
        for s in &mut series {
            s.points.reverse();
        }
        let file = format!("aggregates-{}.svg", ctx.target.label().to_lowercase());
        let title = format!("throughput vs aggregates ({}, {events} events)", ctx.target.label());
        let path = plot(dir, &file, &title, "aggregates (log)", "events/s", &series, true)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// Ours against the seeds' relays: their SQL replayed from Rust, and (PostgreSQL, when Node.js and the
/// relays' packages are installed) their own Node.js code as written, on the same backlog.
pub async fn seeds(ctx: &Ctx) -> Result<()> {
    let shape = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let mut variants = vec![
        Variant::Ours(config(1000)),
        Variant::Base(Baseline::Seed000, 1000),
        Variant::Base(Baseline::Seed001, 1000),
    ];
    let skipped = crate::baselines::node_unavailable(ctx.target.backend);
    match &skipped {
        None => {
            variants.extend([Variant::Base(Baseline::Seed000Node, 1000), Variant::Base(Baseline::Seed001Node, 1000)])
        }
        Some(why) => println!("seeds: the Node relays are skipped: {why}"),
    }
    let list: Vec<_> = variants.iter().map(|v| (v.clone(), shape, 1)).collect();
    let runs = alternate(ctx, &list).await?;
    let mut table = Table::new(
        ctx.title(&format!("seeds: {} events over 10,000 aggregates, batch 1000, 1 relay, events/s", shape.events)),
        &RATE_HEADER,
    );
    for (i, (variant, these)) in variants.iter().zip(&runs).enumerate() {
        let base = if i == 0 { None } else { Some(runs[0].as_slice()) };
        table.rate_row("10000 aggregates", &variant.name(), these, base, "events/s");
    }
    table.note(
        "vs baseline = the seed's rate / ours, per round. Seed 000's relay runs at batch 1000 here (its default \
         is 10); seed 001's always takes the article's 100. The Node relays are the seeds' code with the table \
         names changed, stopping at the first empty batch (`node/seed-relays.mjs`).",
    );
    if let Some(why) = skipped {
        table.note(format!("The Node relays did not run: {why}."));
    }
    table.emit(ctx.out.as_deref())
}

/// Throughput vs batch size (10,000 aggregates): ours vs the one-statement ceiling on its own table and on
/// ours (pinned plan, same rows), each ratio the median of per-round ratios.
pub async fn batch(ctx: &Ctx) -> Result<()> {
    let mut table = Table::new(ctx.title("batch: 10,000 aggregates, 1 relay, events/s"), &RATE_HEADER);
    let names = ["raw-ceiling", Baseline::OwnTableCeiling.name(), "ours"];
    let mut series: Vec<Series> = names.iter().map(|n| Series { label: (*n).into(), points: Vec::new() }).collect();
    for (batch, full, quick) in
        [(1u32, 5_000, 1_000), (10, 20_000, 5_000), (100, 100_000, 10_000), (1000, 100_000, 10_000)]
    {
        let shape = Shape { events: ctx.size(full, quick), aggregates: 10_000 };
        let list = [
            (Variant::Base(Baseline::RawCeiling, batch), shape, 1),
            (Variant::Base(Baseline::OwnTableCeiling, batch), shape, 1),
            (Variant::Ours(config(batch)), shape, 1),
        ];
        let runs = alternate(ctx, &list).await?;
        let case = format!("batch {batch} ({} events)", shape.events);
        table.rate_row(&case, names[0], &runs[0], None, "events/s");
        table.rate_row(&case, names[1], &runs[1], Some(&runs[0]), "events/s");
        table.rate_row(&case, "ours", &runs[2], Some(&runs[1]), "events/s");
        for (line, runs) in series.iter_mut().zip(&runs) {
            line.points.push((f64::from(batch), median_rate(runs)));
        }
        if batch >= 10 {
            ctx.floor(&format!("ours / ceiling on our table, batch {batch}"), round_ratio(&runs[2], &runs[1]), 0.2);
        }
    }
    let plan = crate::baselines::PINNED_PLAN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    table.note(format!(
        "`ours` is against `{}` (the one-statement ceiling run on `outbox_events`, pinned to this plan: {}); \
         that row against `raw-ceiling` (its own three-column table).",
        names[1],
        plan.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" / ")
    ));
    table.emit(ctx.out.as_deref())?;
    if let Some(dir) = &ctx.plots {
        let file = format!("batch-{}.svg", ctx.target.label().to_lowercase());
        let title = format!("throughput vs batch size ({})", ctx.target.label());
        let path = plot(dir, &file, &title, "batch size (log)", "events/s", &series, true)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// 1, 2 and 4 concurrent relays (each its own pool), transaction mode; vs raw-ceiling with as many.
pub async fn relays(ctx: &Ctx) -> Result<()> {
    let shape = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let mut table = Table::new(
        ctx.title(&format!("relays: {} events over 10,000 aggregates, batch 1000, events/s", shape.events)),
        &RATE_HEADER,
    );
    for relays in [1, 2, 4] {
        let list =
            [(Variant::Base(Baseline::RawCeiling, 1000), shape, relays), (Variant::Ours(config(1000)), shape, relays)];
        let runs = alternate(ctx, &list).await?;
        let case = format!("{relays} relay(s)");
        table.rate_row(&case, "raw-ceiling", &runs[0], None, "events/s");
        table.rate_row(&case, "ours", &runs[1], Some(&runs[0]), "events/s");
    }
    table.emit(ctx.out.as_deref())
}

/// Transaction claims vs lease claims (60 s lease).
pub async fn lease(ctx: &Ctx) -> Result<()> {
    let shape = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let lease = config(1000).with_claim_mode(ClaimMode::Lease { duration: Duration::from_secs(60) });
    let list = [(Variant::Ours(config(1000)), shape, 1), (Variant::Ours(lease), shape, 1)];
    let runs = alternate(ctx, &list).await?;
    let mut table = Table::new(
        ctx.title(&format!("lease: {} events over 10,000 aggregates, batch 1000, 1 relay, events/s", shape.events)),
        &RATE_HEADER,
    );
    table.rate_row("claim mode", "ours (transaction)", &runs[0], None, "events/s");
    table.rate_row("claim mode", "ours (lease 60 s)", &runs[1], Some(&runs[0]), "events/s");
    ctx.floor("lease / transaction claims", round_ratio(&runs[1], &runs[0]), 0.45);
    table.emit(ctx.out.as_deref())
}

/// The same drain with a growing pending backlog over 10,000 aggregates: a claim whose cost depends on the
/// batch drains each at the same rate.
pub async fn backlog(ctx: &Ctx) -> Result<()> {
    let sizes: Vec<usize> = if ctx.quick { vec![5_000, 20_000] } else { vec![20_000, 100_000, 300_000] };
    let list: Vec<_> =
        sizes.iter().map(|&events| (Variant::Ours(config(1000)), Shape { events, aggregates: 10_000 }, 1)).collect();
    let runs = alternate(ctx, &list).await?;
    let mut table = Table::new(
        ctx.title("backlog: pending events over 10,000 aggregates, batch 1000, 1 relay, events/s"),
        &RATE_HEADER,
    );
    rows_against_first(&mut table, sizes.iter().map(|n| format!("{n} pending")), &runs);
    table.emit(ctx.out.as_deref())
}

/// Already-published rows retained in the outbox before the backlog.
pub async fn retained(ctx: &Ctx) -> Result<()> {
    let shape = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let sizes: Vec<usize> = if ctx.quick { vec![0, 20_000] } else { vec![0, 100_000, 1_000_000] };
    let runs = alternate_with(ctx, sizes.len(), async |i| {
        let db = ctx.target.fresh().await?;
        if sizes[i] > 0 {
            fill_ours(&db, Shape { events: sizes[i], aggregates: 10_000 }, "r").await?;
            let published = drain_untimed(&db, &config(1000)).await?;
            if published != sizes[i] as u64 {
                bail!("retained set-up published {published} of {} rows", sizes[i]);
            }
            ctx.target.vacuum_analyze(&db).await?;
        }
        fill_ours(&db, shape, "o").await?;
        let run = drain_ours(ctx, &config(1000), 1, NullPublisher, shape.events as u64).await;
        db.close().await.context("close")?;
        run
    })
    .await?;
    let mut table = Table::new(
        ctx.title(&format!(
            "retained: {} events over 10,000 aggregates after N published rows, events/s",
            shape.events
        )),
        &RATE_HEADER,
    );
    rows_against_first(&mut table, sizes.iter().map(|n| format!("{n} retained")), &runs);
    table.note(
        "Retained rows are enqueued with enqueue_all and drained by the relay (public API only), then every table of \
         the bench schema gets VACUUM ANALYZE (PostgreSQL) / ANALYZE TABLE (MySQL) / ANALYZE (SQLite).",
    );
    table.emit(ctx.out.as_deref())
}

/// Fails permanently every event of aggregate `blocked`, confirms the rest.
#[derive(Clone, Copy)]
struct FailBlocked;

/// The aggregate id whose head is made dead.
const BLOCKED: &str = "blocked";

impl Publisher for FailBlocked {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        events
            .iter()
            .map(|e| {
                if e.aggregate_id == BLOCKED { Err(PublishError::permanent("bench: dead on purpose")) } else { Ok(()) }
            })
            .collect()
    }
}

/// One aggregate whose head is dead with rows behind it, plus a healthy backlog: the healthy throughput vs
/// the same healthy backlog alone.
pub async fn blocked(ctx: &Ctx) -> Result<()> {
    let behind = ctx.size(20_000, 2_000);
    let others = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let runs = alternate_with(ctx, 2, async |i| {
        let db = ctx.target.fresh().await?;
        if i == 1 {
            let payload: serde_json::Value = serde_json::from_str(crate::baselines::PAYLOAD).context("payload")?;
            let head =
                outbox_seaorm::NewEvent::new("order", BLOCKED, "order.placed", &payload).context("build event")?;
            outbox_seaorm::enqueue(&db, &head).await.context("enqueue the blocked head")?;
            let relay = Relay::new(SeaOrmStore::new(db.clone()), FailBlocked, config(1000)).context("build a relay")?;
            let pass = relay.run_once().await.context("make the head dead")?;
            if pass.dead != 1 {
                bail!("expected the blocked head to be dead after one pass, got {pass:?}");
            }
            // The blocked aggregate's rows come first (older), as a stuck aggregate's backlog would.
            let rest: Vec<_> = (1..behind)
                .map(|_| outbox_seaorm::NewEvent::new("order", BLOCKED, "order.placed", &payload))
                .collect::<Result<_, _>>()
                .context("build events")?;
            for chunk in rest.chunks(5000) {
                outbox_seaorm::enqueue_all(&db, chunk).await.context("enqueue the blocked rows")?;
            }
        }
        fill_ours(&db, others, "o").await?;
        let run = drain_ours(ctx, &config(1000), 1, NullPublisher, others.events as u64).await;
        db.close().await.context("close")?;
        run
    })
    .await?;
    let mut table = Table::new(
        ctx.title(&format!(
            "blocked: {} events over 10,000 healthy aggregates, with and without 1 dead-headed aggregate holding {behind} rows, events/s",
            others.events
        )),
        &RATE_HEADER,
    );
    table.rate_row("healthy backlog alone", "ours", &runs[0], None, "events/s");
    table.rate_row(&format!("+ dead head with {behind} rows"), "ours", &runs[1], Some(&runs[0]), "events/s");
    table.note("The head is made dead by one pass whose publisher fails it with PublishError::permanent (default policy: BlockAggregate).");
    table.emit(ctx.out.as_deref())
}

/// An empty outbox whose tables were just analyzed, then a burst; vs the steady backlog (no analyze).
pub async fn burst(ctx: &Ctx) -> Result<()> {
    let shape = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let runs = alternate_with(ctx, 2, async |i| {
        let db = ctx.target.fresh().await?;
        if i == 1 {
            ctx.target.vacuum_analyze(&db).await?;
        }
        fill_ours(&db, shape, "o").await?;
        let run = drain_ours(ctx, &config(1000), 1, NullPublisher, shape.events as u64).await;
        db.close().await.context("close")?;
        run
    })
    .await?;
    let mut table = Table::new(
        ctx.title(&format!("burst-after-vacuum: {} events over 10,000 aggregates, batch 1000, events/s", shape.events)),
        &RATE_HEADER,
    );
    table.rate_row("steady backlog", "ours", &runs[0], None, "events/s");
    table.rate_row("burst after VACUUM ANALYZE of the empty outbox", "ours", &runs[1], Some(&runs[0]), "events/s");
    table.emit(ctx.out.as_deref())
}

/// A quiet outbox (published rows retained, nothing pending) analyzed, then a burst into the same
/// aggregates, claimed on the statistics of the quiet hour; vs the same burst analyzed after it arrived.
pub async fn burst_after_analyze(ctx: &Ctx) -> Result<()> {
    let retained = Shape { events: ctx.size(1_000_000, 20_000), aggregates: 10_000 };
    let burst = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let runs = alternate_with(ctx, 2, async |i| {
        let db = ctx.target.fresh().await?;
        fill_ours(&db, retained, "o").await?;
        let published = drain_untimed(&db, &config(1000)).await?;
        if published != retained.events as u64 {
            bail!("retained set-up published {published} of {} rows", retained.events);
        }
        let stale = i == 1;
        if stale {
            ctx.target.vacuum_analyze(&db).await?;
        }
        fill_ours(&db, burst, "o").await?;
        if !stale {
            ctx.target.vacuum_analyze(&db).await?;
        }
        let run = drain_ours(ctx, &config(1000), 1, NullPublisher, burst.events as u64).await;
        db.close().await.context("close")?;
        run
    })
    .await?;
    let mut table = Table::new(
        ctx.title(&format!(
            "burst-after-analyze: {} events into the 10,000 aggregates of {} retained published rows, events/s",
            burst.events, retained.events
        )),
        &RATE_HEADER,
    );
    table.rate_row("analyzed with the burst pending", "ours", &runs[0], None, "events/s");
    table.rate_row("analyzed before the burst, nothing pending", "ours", &runs[1], Some(&runs[0]), "events/s");
    table.note("Statistics: VACUUM ANALYZE (PostgreSQL) / ANALYZE TABLE (MySQL) / ANALYZE (SQLite) of every table.");
    ctx.floor("burst after analyze / analyzed with the burst", round_ratio(&runs[1], &runs[0]), 0.4);
    table.emit(ctx.out.as_deref())
}

/// One "ours" row per case, each against the first case's median.
fn rows_against_first(table: &mut Table, cases: impl Iterator<Item = String>, runs: &[Vec<Run>]) {
    for (i, (case, these)) in cases.zip(runs).enumerate() {
        let base = if i == 0 { None } else { Some(runs[0].as_slice()) };
        table.rate_row(&case, "ours", these, base, "events/s");
    }
}

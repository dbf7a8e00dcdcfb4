//! The scenarios, and what they share: the run context, backlog filling and timed drains.

pub mod commit_rate;
pub mod compose;
pub mod consume;
pub mod dashboard;
pub mod enqueue_tax;
pub mod latency;
pub mod log;
pub mod nats;
pub mod partitions;
pub mod rss;
pub mod telemetry;
pub mod throughput;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_seaorm::{NewEvent, OutboxEvent, PublishError, Publisher, Relay, RelayConfig, SeaOrmStore};
use sea_orm::DatabaseConnection;

use crate::baselines::{Baseline, PAYLOAD};
use crate::report::Run;
use crate::target::Target;

/// Every scenario name, in run order.
pub const ALL: [&str; 21] = [
    "aggregates",
    "backlog",
    "batch",
    "seeds",
    "relays",
    "lease",
    "retained",
    "blocked",
    "burst-after-vacuum",
    "burst-after-analyze",
    "enqueue-tax",
    "compose",
    "latency",
    "commit-rate",
    "rss",
    "nats",
    "consume",
    "telemetry",
    "dashboard",
    "partitions",
    "log",
];

/// What every scenario needs to know about this invocation.
pub struct Ctx {
    /// The checked database target.
    pub target: Target,
    /// Smaller sizes for a short run.
    pub quick: bool,
    /// Rounds per figure (alternating variants).
    pub rounds: usize,
    /// Time budget of one drain.
    pub budget: Duration,
    /// Markdown file to append tables to.
    pub out: Option<PathBuf>,
    /// Directory for SVG plots.
    pub plots: Option<PathBuf>,
    /// The latency scenario measures the cross-process LISTEN/NOTIFY wake-up (PostgreSQL).
    pub notify: bool,
    /// Check each guarded ratio against its floor ([`Ctx::floor`]).
    pub floors: bool,
    /// The ratios found below their floor.
    pub below: std::sync::Mutex<Vec<String>>,
}

impl Ctx {
    /// `full` in full mode, `quick` in quick mode.
    pub fn size(&self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
    }

    /// With `--floors`: prints `ratio` against `floor` and records it when below, so that a regression of
    /// a guarded ratio fails the run (CI runs `--quick --floors`). The floors sit well under the measured
    /// figures (BENCHMARKS.md): they catch a regression, not noise.
    pub fn floor(&self, what: &str, ratio: f64, floor: f64) {
        if !self.floors {
            return;
        }
        let ok = ratio >= floor;
        println!(
            "floor: {what} ({}): {ratio:.2} against a floor of {floor:.2}: {}",
            self.target.label(),
            if ok { "ok" } else { "BELOW" }
        );
        if !ok {
            let line = format!("{what} ({}): {ratio:.2} < {floor:.2}", self.target.label());
            self.below.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line);
        }
    }

    /// Title prefix naming the backend.
    pub fn title(&self, what: &str) -> String {
        format!("{what} ({}, {} round(s))", self.target.label(), self.rounds)
    }
}

/// Runs scenario `name` against `ctx`.
pub async fn run(ctx: &Ctx, name: &str) -> Result<()> {
    let started = Instant::now();
    match name {
        "aggregates" => throughput::aggregates(ctx).await,
        "backlog" => throughput::backlog(ctx).await,
        "batch" => throughput::batch(ctx).await,
        "seeds" => throughput::seeds(ctx).await,
        "relays" => throughput::relays(ctx).await,
        "lease" => throughput::lease(ctx).await,
        "retained" => throughput::retained(ctx).await,
        "blocked" => throughput::blocked(ctx).await,
        "burst-after-vacuum" => throughput::burst(ctx).await,
        "burst-after-analyze" => throughput::burst_after_analyze(ctx).await,
        "enqueue-tax" => enqueue_tax::run(ctx).await,
        "compose" => compose::run(ctx).await,
        "latency" => latency::run(ctx).await,
        "commit-rate" => commit_rate::run(ctx).await,
        "rss" => rss::run(ctx).await,
        "nats" => nats::run(ctx).await,
        "consume" => consume::run(ctx).await,
        "telemetry" => telemetry::run(ctx).await,
        "dashboard" => dashboard::run(ctx).await,
        "partitions" => partitions::run(ctx).await,
        "log" => log::run(ctx).await,
        other => anyhow::bail!("unknown scenario {other:?}; expected one of {}", ALL.join(", ")),
    }
    .with_context(|| format!("scenario {name} on {}", ctx.target.label()))?;
    eprintln!("[{}] {name} took {:.1?}", ctx.target.label(), started.elapsed());
    Ok(())
}

/// `clients` tasks running `op(state, n)` back to back for `duration`, each with the next `n` of `ids`;
/// `op` returns how many units (transactions, orders) it did.
pub async fn load<S, F, Fut>(clients: usize, duration: Duration, ids: &Arc<AtomicU64>, state: S, op: F) -> Result<Run>
where
    S: Clone + Send + 'static,
    F: Fn(S, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<u64>> + Send,
{
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (ids, state, op) = (ids.clone(), state.clone(), op.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while started.elapsed() < duration {
                done += op(state.clone(), ids.fetch_add(1, Ordering::Relaxed)).await?;
            }
            Ok::<_, anyhow::Error>(done)
        }));
    }
    let mut done = 0;
    for task in tasks {
        done += task.await.context("client task panicked")??;
    }
    Ok(Run { done, secs: started.elapsed().as_secs_f64(), timed_out: false })
}

/// Confirms every event without sending it anywhere.
#[derive(Clone, Copy)]
pub struct NullPublisher;

impl Publisher for NullPublisher {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        vec![Ok(()); events.len()]
    }
}

/// A backlog: `events` rows spread round-robin over `aggregates` aggregates.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Rows in the backlog.
    pub events: usize,
    /// Distinct aggregates.
    pub aggregates: usize,
}

/// Enqueues `shape` with `enqueue_all`, 5000 events per call, aggregate ids `{prefix}{i % aggregates}`.
pub async fn fill_ours(db: &DatabaseConnection, shape: Shape, prefix: &str) -> Result<()> {
    let payload: serde_json::Value = serde_json::from_str(PAYLOAD).context("parse the bench payload")?;
    let mut start = 0;
    while start < shape.events {
        let end = (start + 5000).min(shape.events);
        let events = (start..end)
            .map(|i| {
                NewEvent::new("order", format!("{prefix}{}", i % shape.aggregates.max(1)), "order.placed", &payload)
            })
            .collect::<Result<Vec<_>, _>>()
            .context("build events")?;
        outbox_seaorm::enqueue_all(db, &events).await.with_context(|| format!("enqueue events {start}..{end}"))?;
        start = end;
    }
    Ok(())
}

/// Drains with `relays` relays (each its own pool) through clones of `publisher` until `expected` events
/// are published or the budget runs out.
pub async fn drain_ours<P>(ctx: &Ctx, config: &RelayConfig, relays: usize, publisher: P, expected: u64) -> Result<Run>
where
    P: Publisher + Clone + 'static,
{
    let published = Arc::new(AtomicU64::new(0));
    let mut built = Vec::new();
    for _ in 0..relays {
        let store = SeaOrmStore::new(ctx.target.connect().await?);
        built.push(Relay::new(store, publisher.clone(), config.clone()).context("build a relay")?);
    }
    let budget = ctx.budget;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for relay in built {
        let published = published.clone();
        tasks.push(tokio::spawn(async move {
            while published.load(Ordering::Relaxed) < expected {
                if started.elapsed() > budget {
                    return Ok(true);
                }
                let pass = relay.run_once().await?;
                published.fetch_add(pass.published, Ordering::Relaxed);
                if pass.claimed == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Ok::<_, outbox_seaorm::Error>(false)
        }));
    }
    let mut timed_out = false;
    for task in tasks {
        timed_out |= task.await.context("relay task panicked")?.context("relay pass")?;
    }
    Ok(Run { done: published.load(Ordering::Relaxed), secs: started.elapsed().as_secs_f64(), timed_out })
}

/// A throughput variant: our relay or a baseline, with a number of concurrent relays.
#[derive(Clone, Debug)]
pub enum Variant {
    /// `outbox_seaorm::Relay` with this config.
    Ours(RelayConfig),
    /// A plain-SQL baseline at this batch size.
    Base(Baseline, u32),
}

impl Variant {
    /// The name printed in tables.
    pub fn name(&self) -> String {
        match self {
            Variant::Ours(c) if matches!(c.claim_mode, outbox_seaorm::ClaimMode::Lease { .. }) => "ours (lease)".into(),
            Variant::Ours(_) => "ours".into(),
            Variant::Base(b, _) => b.name().into(),
        }
    }
}

/// One run of `variant` on a clean schema: fill `shape`, then drain it with `relays` relays.
pub async fn drain_run(ctx: &Ctx, variant: &Variant, shape: Shape, relays: usize) -> Result<Run> {
    let db = ctx.target.fresh().await?;
    let run = match variant {
        Variant::Ours(config) => {
            fill_ours(&db, shape, "o").await?;
            drain_ours(ctx, config, relays, NullPublisher, shape.events as u64).await?
        }
        Variant::Base(base, batch) if base.is_node() => {
            base.create(&db).await?;
            base.fill(&db, shape.events, shape.aggregates).await?;
            let (url, schema) = (&ctx.target.url, ctx.target.name());
            crate::baselines::drain_in_node(*base, url, schema, *batch, ctx.budget).await?
        }
        Variant::Base(base, batch) => {
            base.create(&db).await?;
            base.fill(&db, shape.events, shape.aggregates).await?;
            let mut tasks = Vec::new();
            for _ in 0..relays {
                let db = if *base == Baseline::OwnTableCeiling {
                    let db = ctx.target.connect_pinned().await?;
                    crate::baselines::pin_and_keep(&db, *batch).await?;
                    db
                } else {
                    ctx.target.connect().await?
                };
                let (base, batch, budget) = (*base, *batch, ctx.budget);
                tasks.push(tokio::spawn(async move { base.drain(&db, batch, budget).await }));
            }
            let mut total = Run { done: 0, secs: 0.0, timed_out: false };
            for task in tasks {
                let run = task.await.context("baseline task panicked")??;
                total.done += run.done;
                total.secs = total.secs.max(run.secs);
                total.timed_out |= run.timed_out;
            }
            total
        }
    };
    db.close().await.context("close the bench connection")?;
    Ok(run)
}

/// Runs every variant `ctx.rounds` times, alternating (A B A B ...), and returns the runs per variant.
pub async fn alternate(ctx: &Ctx, variants: &[(Variant, Shape, usize)]) -> Result<Vec<Vec<Run>>> {
    let mut runs = vec![Vec::new(); variants.len()];
    for round in 0..ctx.rounds {
        for (i, (variant, shape, relays)) in variants.iter().enumerate() {
            let run = drain_run(ctx, variant, *shape, *relays)
                .await
                .with_context(|| format!("{} round {}", variant.name(), round + 1))?;
            runs[i].push(run);
        }
    }
    Ok(runs)
}

/// The batch-1000 relay config used unless a scenario varies it.
pub fn config(batch: u32) -> RelayConfig {
    RelayConfig::default().with_batch_size(batch)
}

/// Runs `run(i)` for every variant index `i < n`, `ctx.rounds` times, alternating.
pub async fn alternate_with(ctx: &Ctx, n: usize, run: impl AsyncFn(usize) -> Result<Run>) -> Result<Vec<Vec<Run>>> {
    let mut runs = vec![Vec::new(); n];
    for round in 0..ctx.rounds {
        for (i, slot) in runs.iter_mut().enumerate() {
            slot.push(run(i).await.with_context(|| format!("variant {i} round {}", round + 1))?);
        }
    }
    Ok(runs)
}

pub use crate::report::round_ratio;

/// The median rate of `runs`.
pub fn median_rate(runs: &[Run]) -> f64 {
    crate::report::summary(&runs.iter().map(Run::rate).collect::<Vec<_>>()).0
}

/// Drains with one relay until a pass claims nothing (no time budget): for setting up retained rows.
pub async fn drain_untimed(db: &DatabaseConnection, config: &RelayConfig) -> Result<u64> {
    let relay = Relay::new(SeaOrmStore::new(db.clone()), NullPublisher, config.clone()).context("build a relay")?;
    let mut published = 0;
    loop {
        let pass = relay.run_once().await.context("relay pass")?;
        if pass.claimed == 0 {
            return Ok(published);
        }
        published += pass.published;
    }
}

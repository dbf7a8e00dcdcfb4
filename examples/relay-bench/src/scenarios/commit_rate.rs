//! What a cross-process wake-up costs the writers (PostgreSQL): 8 writers commit single-event transactions
//! as fast as they can, without a wake-up, with the notify trigger, with `pg_notify` called by the app
//! inside each transaction, and with a 5 ms commit watch running. A listener drains the channel during the
//! notifying variants, as a relay's would.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_seaorm::notify::{self, NotifyChannel};
use outbox_seaorm::{CancellationToken, NewEvent};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, TransactionTrait};

use super::{Ctx, alternate_with};
use crate::report::{RATE_HEADER, Run, Table};

/// Concurrent writers.
const WRITERS: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// No notification.
    Off,
    /// The statement-level trigger (`outbox notify install`).
    Trigger,
    /// `SELECT pg_notify(…)` by the app in each transaction, one more round trip.
    InTransaction,
    /// No notification; a `CommitWatch` reads the highest `seq` every 5 ms.
    Watch,
}

impl Variant {
    const ALL: [Variant; 4] = [Variant::Off, Variant::Trigger, Variant::InTransaction, Variant::Watch];

    fn name(self) -> &'static str {
        match self {
            Variant::Off => "no NOTIFY",
            Variant::Trigger => "notify trigger",
            Variant::InTransaction => "pg_notify in the transaction",
            Variant::Watch => "commit watch, 5 ms",
        }
    }
}

/// One run: `WRITERS` tasks committing one event per transaction for `duration`.
async fn run_variant(ctx: &Ctx, variant: Variant, duration: Duration) -> Result<Run> {
    let db = ctx.target.fresh().await?;
    let channel = NotifyChannel::default();
    if variant == Variant::Trigger {
        notify::install_notify_trigger(&db, &channel).await.context("install the notify trigger")?;
    }
    let stop_listener = CancellationToken::new();
    let watch = match variant {
        Variant::Watch => {
            let pool = ctx.target.connect().await?;
            let watch = outbox_seaorm::SeaOrmStore::new(pool.clone()).commit_watch(Duration::from_millis(5))?;
            let stats = watch.stats();
            Some((pool, stats, tokio::spawn(watch.run(stop_listener.clone()))))
        }
        _ => None,
    };
    let listener = match variant {
        Variant::Off | Variant::Watch => None,
        _ => {
            let pool = ctx.target.connect().await?;
            let listener = notify::NotifyListener::new(&pool, channel.clone()).context("notify listener")?;
            let stats = listener.stats();
            let task = tokio::spawn(listener.run(stop_listener.clone()));
            Some((pool, stats, task))
        }
    };
    let payload = serde_json::json!({"customer": "bench", "total_minor": 4900, "lines": [1, 2, 3]});
    let committed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (db, committed, payload) = (db.clone(), committed.clone(), payload.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while started.elapsed() < duration {
                // Each writer its own aggregates: the writers never wait for each other's row locks.
                let event = NewEvent::new("order", format!("w{w}-{}", i % 1000), "order.placed", &payload)?;
                match variant {
                    Variant::InTransaction => {
                        let txn = db.begin().await?;
                        outbox_seaorm::enqueue(&txn, &event).await?;
                        txn.execute_unprepared("SELECT pg_notify('outbox_events', '')").await?;
                        txn.commit().await?;
                    }
                    _ => {
                        outbox_seaorm::enqueue(&db, &event).await?;
                    }
                }
                committed.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        }));
    }
    for writer in writers {
        writer.await.context("writer panicked")?.context("writer")?;
    }
    let secs = started.elapsed().as_secs_f64();
    if let Some((pool, stats, task)) = listener {
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop_listener.cancel();
        task.await.context("listener panicked")?;
        let seen = stats.get();
        eprintln!("commit-rate {}: listener received {} notifications", variant.name(), seen.notifications);
        pool.close().await.context("close")?;
    }
    if let Some((pool, stats, task)) = watch {
        stop_listener.cancel();
        task.await.context("watch panicked")?;
        let seen = stats.get();
        eprintln!("commit-rate {}: {} probes, {} wake-ups", variant.name(), seen.probes, seen.wakes);
        pool.close().await.context("close")?;
    }
    db.close().await.context("close")?;
    Ok(Run { done: committed.load(Ordering::Relaxed), secs, timed_out: false })
}

/// Runs the scenario (the notifying variants on PostgreSQL only).
pub async fn run(ctx: &Ctx) -> Result<()> {
    let probe: DatabaseConnection = ctx.target.connect().await?;
    let backend = probe.get_database_backend();
    probe.close().await.context("close")?;
    let variants: &[Variant] =
        if backend == DbBackend::Postgres { &Variant::ALL } else { &[Variant::Off, Variant::Watch] };
    let duration = Duration::from_secs(ctx.size(10, 3) as u64);
    let runs = alternate_with(ctx, variants.len(), async |i| run_variant(ctx, variants[i], duration).await).await?;
    let mut table = Table::new(
        ctx.title(&format!("commit-rate: {WRITERS} writers, one event per transaction, {} s", duration.as_secs())),
        &RATE_HEADER,
    );
    let base = runs[0].as_slice();
    for (i, (variant, runs)) in variants.iter().zip(&runs).enumerate() {
        table.rate_row("commits/s", variant.name(), runs, (i > 0).then_some(base), "commits/s");
    }
    table.note(
        "Each writer commits `enqueue` through the pool (its own transaction), on aggregates of its own; the \
         notifying variants run a LISTEN on the channel meanwhile.",
    );
    table.emit(ctx.out.as_deref())
}

//! Run with: cargo run --release -p outbox-relay-bench -- --events 100000 --aggregates 10000 --batch 1000
//!
//! Relay throughput on a real database: enqueues a backlog, then drains it with one or more relays whose
//! publisher confirms every event at once, so the figure is the store's claim + mark cost plus the relay's
//! own overhead. `DATABASE_URL` picks the database (default: the machine's PostgreSQL, schema `bench`).

use std::time::Instant;

use clap::Parser;
use outbox_seaorm::{ClaimMode, NewEvent, OutboxEvent, PublishError, Publisher, Relay, RelayConfig, SeaOrmStore};
use sea_orm::ConnectionTrait;

/// Confirms every event without sending it anywhere.
struct NullPublisher;

impl Publisher for NullPublisher {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        vec![Ok(()); events.len()]
    }
}

#[derive(Parser)]
struct Args {
    /// Events in the backlog.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Distinct aggregates the events spread over (a relay claims one event per aggregate per pass).
    #[arg(long, default_value_t = 10_000)]
    aggregates: usize,
    /// Relay batch size.
    #[arg(long, default_value_t = 1000)]
    batch: u32,
    /// Relays draining at once, each with its own pool.
    #[arg(long, default_value_t = 1)]
    relays: usize,
    /// Lease claims instead of transaction claims.
    #[arg(long)]
    lease: bool,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3Dbench".to_owned());
    let db = outbox_seaorm::connect(&url).await?;
    if url.starts_with("postgres") {
        db.execute_unprepared("DROP SCHEMA IF EXISTS bench CASCADE; CREATE SCHEMA bench").await?;
    } else {
        for table in ["outbox_events", "inbox_messages", "outbox_seaorm_migrations"] {
            db.execute_unprepared(&format!("DROP TABLE IF EXISTS {table}")).await?;
        }
    }
    outbox_seaorm::migrate(&db).await?;

    let started = Instant::now();
    let payload = serde_json::json!({"customer": "bench", "total_minor": 4900, "lines": [1, 2, 3]});
    for chunk in (0..args.events).collect::<Vec<_>>().chunks(5000) {
        let events = chunk
            .iter()
            .map(|i| NewEvent::new("order", format!("o{}", i % args.aggregates), "order.placed", &payload))
            .collect::<Result<Vec<_>, _>>()?;
        outbox_seaorm::enqueue_all(&db, &events).await?;
    }
    let enqueue = started.elapsed();
    println!(
        "enqueued {} events over {} aggregates in {:.2?} ({:.0} events/s, multi-row inserts)",
        args.events,
        args.aggregates,
        enqueue,
        args.events as f64 / enqueue.as_secs_f64()
    );

    let mode = if args.lease {
        ClaimMode::Lease { duration: std::time::Duration::from_secs(60) }
    } else {
        ClaimMode::Transaction
    };
    let config = RelayConfig::default().with_batch_size(args.batch).with_claim_mode(mode);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.relays {
        let relay = Relay::new(SeaOrmStore::new(outbox_seaorm::connect(&url).await?), NullPublisher, config.clone())?;
        tasks.push(tokio::spawn(async move {
            let mut published = 0u64;
            let mut passes = 0u64;
            loop {
                let pass = relay.run_once().await?;
                if pass.claimed == 0 {
                    break;
                }
                passes += 1;
                published += pass.published;
            }
            Ok::<_, outbox_seaorm::Error>((published, passes))
        }));
    }
    let (mut published, mut passes) = (0, 0);
    for task in tasks {
        let (p, n) = task.await??;
        published += p;
        passes += n;
    }
    let drain = started.elapsed();
    println!(
        "{} relay(s), batch {}, {:?} claims: published {published} in {passes} passes in {:.2?}: {:.0} events/s",
        args.relays,
        args.batch,
        if args.lease { "lease" } else { "transaction" },
        drain,
        published as f64 / drain.as_secs_f64()
    );
    Ok(())
}

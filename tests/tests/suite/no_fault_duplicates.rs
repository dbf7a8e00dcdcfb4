//! Without a fault, no event reaches the broker twice: 8 writers commit events over 200 aggregates while
//! two, then four relays (batch 100) drain an outbox that starts empty, again and again. A relay pass that
//! failed after publishing (a deadlock at the mark, say) would publish its batch again through the next
//! pass or another relay; here every event must arrive exactly once, in order per aggregate, and every
//! writer's transaction must commit.
//!
//! `OUTBOX_NO_FAULT_RUNS` sets the runs per relay count (default 10), `OUTBOX_NO_FAULT_TRANSACTIONS` each
//! writer's transactions per run (default 40); `OUTBOX_SQLITE_WAL` runs SQLite in WAL mode.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{assert_per_aggregate_order, count_published};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::{CancellationToken, InMemoryPublisher, NewEvent, Relay, RelayConfig, SeaOrmStore};
use sea_orm::{ConnectionTrait, TransactionTrait};

const WRITERS: u64 = 8;
const AGGREGATES: u64 = 200;
const BATCH: u32 = 100;

fn runs() -> usize {
    std::env::var("OUTBOX_NO_FAULT_RUNS").ok().and_then(|runs| runs.parse().ok()).unwrap_or(10)
}

fn transactions_per_writer() -> u64 {
    std::env::var("OUTBOX_NO_FAULT_TRANSACTIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(40)
}

/// Writer `w`'s transaction `i`: one to four events of aggregates spread over all 200.
fn transaction_events(run: usize, w: u64, i: u64) -> Vec<NewEvent> {
    let n = w * transactions_per_writer() + i;
    (0..1 + n % 4)
        .map(|k| {
            let aggregate = (n * 7 + k * 13) % AGGREGATES;
            let payload = serde_json::json!({ "run": run, "n": n, "k": k });
            NewEvent::new("order", format!("o{aggregate}"), "placed", &payload).expect("valid event")
        })
        .collect()
}

/// One run: relays start on an empty outbox, the writers commit, the relays drain it. Returns the events
/// committed.
async fn one_run(t: &TestDb, run: usize, relay_count: usize) -> u64 {
    for table in ["outbox_events", "outbox_aggregates"] {
        t.db.execute_unprepared(&format!("DELETE FROM {table}")).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    let broker = InMemoryPublisher::new();
    let shutdown = CancellationToken::new();
    let config = RelayConfig::default().with_batch_size(BATCH).with_poll_interval(Duration::from_millis(5));
    let mut relays = Vec::new();
    for _ in 0..relay_count {
        let relay = Relay::new(SeaOrmStore::new(t.reconnect().await), broker.clone(), config.clone())
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        let shutdown = shutdown.clone();
        relays.push(tokio::spawn(async move { relay.run(shutdown).await }));
    }
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let db = t.db.clone();
        writers.push(tokio::spawn(async move {
            let mut committed = 0u64;
            let mut failures = Vec::new();
            for i in 0..transactions_per_writer() {
                let events = transaction_events(run, w, i);
                let written = async {
                    let txn = db.begin().await?;
                    outbox_seaorm::enqueue_all(&txn, &events)
                        .await
                        .map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
                    txn.commit().await
                };
                match written.await {
                    Ok(()) => committed += events.len() as u64,
                    Err(e) => failures.push(e.to_string()),
                }
            }
            (committed, failures)
        }));
    }
    let mut committed = 0;
    let mut failures = Vec::new();
    for writer in writers {
        let (n, failed) = writer.await.unwrap_or_else(|e| panic!("{t}: {e}"));
        committed += n;
        failures.extend(failed);
    }
    assert!(failures.is_empty(), "{t}: run {run}: {} writer transactions failed: {failures:?}", failures.len());

    let deadline = Instant::now() + Duration::from_secs(120);
    while count_published(t).await < committed {
        assert!(Instant::now() < deadline, "{t}: run {run}: the relays did not publish {committed} events in 120 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    for relay in relays {
        relay.await.unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    let received = broker.received();
    let mut deliveries: HashMap<_, u32> = HashMap::new();
    for event in &received {
        *deliveries.entry(event.id).or_default() += 1;
    }
    let twice = deliveries.values().filter(|&&n| n > 1).count();
    assert_eq!(
        (deliveries.len() as u64, twice, received.len() as u64),
        (committed, 0, committed),
        "{t}: run {run} with {relay_count} relays: (distinct events, events delivered more than once, deliveries) \
         for {committed} committed events"
    );
    assert_per_aggregate_order(&received, t);
    committed
}

async fn relays_without_faults_publish_each_event_exactly_once(t: TestDb) {
    if t.backend == sea_orm::DbBackend::Sqlite && std::env::var("OUTBOX_SQLITE_WAL").is_ok() {
        t.db.execute_unprepared("PRAGMA journal_mode=WAL").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    for relay_count in [2, 4] {
        let mut events = 0;
        for run in 0..runs() {
            events += one_run(&t, run, relay_count).await;
        }
        eprintln!("{t}: {relay_count} relays: {} runs, {events} events, each delivered once", runs());
    }
}
per_backend!(relays_without_faults_publish_each_event_exactly_once, "no_fault_duplicates");

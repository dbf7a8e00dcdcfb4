//! Several relays on one outbox, each on its own pool: every event is published exactly once and per-aggregate
//! order holds, in transaction mode and in lease mode. On SQLite the relays take turns (`BEGIN IMMEDIATE`).

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{assert_per_aggregate_order, count_published, enqueue_committed, event};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::{BatchOutcome, ClaimRequest, ClaimedBatch, MaintenanceStore, OutboxStore};
use outbox_seaorm::{
    Backoff, ClaimMode, DeadLetterPolicy, InMemoryPublisher, NewEvent, Relay, RelayConfig, SeaOrmStore,
};
use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};

const LEASE: ClaimMode = ClaimMode::Lease { duration: Duration::from_secs(30) };

/// Runs passes until the outbox has nothing pending; returns how many events this relay published.
async fn run_until_drained(relay: &Relay<SeaOrmStore, InMemoryPublisher>, t: &TestDb, faults: bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut published = 0;
    loop {
        assert!(Instant::now() < deadline, "{t}: relays did not drain the outbox in 20 s");
        let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        published += pass.published;
        assert_eq!((pass.dead, pass.fenced), (0, 0), "{t}: {pass:?}");
        assert!(faults || pass.failed == 0, "{t}: {pass:?}");
        if pass.claimed == 0 {
            // Pending rows may be held by the other relay or wait for their backoff: wait rather than stop.
            if relay.store().stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}")).pending == 0 {
                return published;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Two relays, each on its own pool, drain 120 events of 12 aggregates concurrently. With `faults`, the
/// broker is down for 5 messages, loses 6 acks and rejects 4 aggregates twice; retries wait 1–5 ms.
async fn two_relays_publish_each_event_once_in_order(t: &TestDb, mode: ClaimMode, faults: bool) {
    const AGGREGATES: u64 = 12;
    const EVENTS: u64 = 120;
    const LOST_ACKS: u32 = 6;
    let events: Vec<NewEvent> = (0..EVENTS).map(|i| event(&format!("agg-{}", i % AGGREGATES), "step", i)).collect();
    enqueue_committed(t, &events).await;

    let broker = InMemoryPublisher::new();
    broker.set_delay(Duration::from_millis(3));
    // Small batches, so both relays find heads to claim while the other one is publishing.
    let mut config = RelayConfig::default().with_claim_mode(mode).with_batch_size(4);
    if faults {
        broker.go_down_for(5);
        broker.lose_acks(LOST_ACKS);
        for a in 0..4 {
            broker.fail_aggregate(format!("agg-{a}"), 2);
        }
        let backoff = Backoff { initial: Duration::from_millis(1), max: Duration::from_millis(5), multiplier: 2 };
        config = config.with_backoff(backoff).with_max_attempts(1000);
    }
    let relay_a = Relay::new(SeaOrmStore::new(t.reconnect().await), broker.clone(), config.clone()).expect("config");
    let relay_b = Relay::new(SeaOrmStore::new(t.reconnect().await), broker.clone(), config).expect("config");
    let (a, b) = tokio::join!(run_until_drained(&relay_a, t, faults), run_until_drained(&relay_b, t, faults));

    let received = broker.received();
    let distinct: HashSet<_> = received.iter().map(|e| e.id).collect();
    let expected_messages = if faults { EVENTS + u64::from(LOST_ACKS) } else { EVENTS };
    assert_eq!(a + b, EVENTS, "{t}: relay A published {a}, relay B {b}");
    assert_eq!(received.len() as u64, expected_messages, "{t}: {} messages for {EVENTS} events", received.len());
    assert_eq!(distinct.len() as u64, EVENTS, "{t}: an event was never published");
    assert_eq!(count_published(t).await, EVENTS, "{t}");
    assert_per_aggregate_order(&received, t);
    if !faults {
        // Without lost acks, no event may reach the broker twice: not even adjacent repeats.
        assert_eq!(received.len(), distinct.len(), "{t}: an event was published twice");
    }
}

async fn two_transaction_mode_relays_publish_every_event_once_in_order(t: TestDb) {
    two_relays_publish_each_event_once_in_order(&t, ClaimMode::Transaction, false).await;
}
per_backend!(two_transaction_mode_relays_publish_every_event_once_in_order, "two_relays_transaction_mode");

async fn two_lease_mode_relays_publish_every_event_once_in_order(t: TestDb) {
    two_relays_publish_each_event_once_in_order(&t, LEASE, false).await;
}
per_backend!(two_lease_mode_relays_publish_every_event_once_in_order, "two_relays_lease_mode");

async fn two_transaction_mode_relays_keep_order_through_broker_faults(t: TestDb) {
    two_relays_publish_each_event_once_in_order(&t, ClaimMode::Transaction, true).await;
}
per_backend!(two_transaction_mode_relays_keep_order_through_broker_faults, "two_relays_transaction_mode_faults");

async fn two_lease_mode_relays_keep_order_through_broker_faults(t: TestDb) {
    two_relays_publish_each_event_once_in_order(&t, LEASE, true).await;
}
per_backend!(two_lease_mode_relays_keep_order_through_broker_faults, "two_relays_lease_mode_faults");

fn request(mode: ClaimMode, limit: u32) -> ClaimRequest {
    ClaimRequest { now: chrono::Utc::now(), limit, mode, dead_letters: DeadLetterPolicy::BlockAggregate }
}

fn aggregates(batch: &impl ClaimedBatch) -> Vec<String> {
    batch.events().iter().map(|e| format!("{}:{}", e.aggregate_id, e.event_type)).collect()
}

fn all_published(batch: &impl ClaimedBatch) -> BatchOutcome {
    BatchOutcome {
        now: chrono::Utc::now(),
        published: batch.events().iter().map(|e| e.seq).collect(),
        failed: Vec::new(),
        released: Vec::new(),
    }
}

/// While relay A holds the head of aggregate `x`, relay B must not get `x`'s later event, only other
/// aggregates' runs; once A is done, `x`'s next event becomes claimable.
async fn held_head_keeps_its_aggregate_from_other_relays(t: &TestDb, mode: ClaimMode) {
    enqueue_committed(
        t,
        &[event("x", "first", 1), event("y", "first", 2), event("x", "second", 3), event("y", "second", 4)],
    )
    .await;
    let store_a = SeaOrmStore::new(t.reconnect().await);
    let store_b = SeaOrmStore::new(t.reconnect().await);

    let held_by_a = store_a.claim(request(mode, 1)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(aggregates(&held_by_a), ["x:first"], "{t}");
    let held_by_b = store_b.claim(request(mode, 10)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(aggregates(&held_by_b), ["y:first", "y:second"], "{t}: B may take y's run but nothing of x");
    let third = store_b.claim(request(mode, 10)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(third.events().is_empty(), "{t}: every head is held, later events must wait: {:?}", aggregates(&third));
    drop(third);

    // A marks x:first while B still holds y's run: B's claim must not lock anything but its own rows.
    let outcome = all_published(&held_by_a);
    let report = tokio::time::timeout(Duration::from_secs(30), held_by_a.complete(outcome))
        .await
        .unwrap_or_else(|_| panic!("{t}: marking A's batch waited on B's claim"))
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(report.published, 1, "{t}: {report:?}");
    let next = store_a.claim(request(mode, 10)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(aggregates(&next), ["x:second"], "{t}: y's events are still B's");
    let outcome = all_published(&next);
    next.complete(outcome).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let outcome = all_published(&held_by_b);
    held_by_b.complete(outcome).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let last = store_a.claim(request(mode, 10)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(last.events().is_empty(), "{t}: {:?}", aggregates(&last));
    assert_eq!(count_published(t).await, 4, "{t}");
}

async fn an_aggregate_whose_head_another_relay_locks_is_skipped_whole(t: TestDb) {
    // SQLite has no row locks: a second claim waits for the first relay's write transaction to end, so
    // this interleaving cannot happen there (the relays take turns).
    if t.backend == DbBackend::Sqlite {
        return;
    }
    held_head_keeps_its_aggregate_from_other_relays(&t, ClaimMode::Transaction).await;
}
per_backend!(an_aggregate_whose_head_another_relay_locks_is_skipped_whole, "held_head_transaction_mode");

async fn an_aggregate_whose_head_another_relay_leases_is_skipped_whole(t: TestDb) {
    held_head_keeps_its_aggregate_from_other_relays(&t, LEASE).await;
}
per_backend!(an_aggregate_whose_head_another_relay_leases_is_skipped_whole, "held_head_lease_mode");

async fn an_enqueue_never_waits_for_a_relays_open_transaction_claim(t: TestDb) {
    // SQLite has one writer at a time: there an enqueue waits for the relay's transaction (the crate
    // docs say so, and recommend lease mode).
    if t.backend == DbBackend::Sqlite {
        return;
    }
    enqueue_committed(&t, &[event("x", "first", 1), event("y", "first", 2)]).await;
    let relay_pool = SeaOrmStore::new(t.reconnect().await);
    let held = relay_pool.claim(request(ClaimMode::Transaction, 10)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(held.events().len(), 2, "{t}");

    // New events of a held aggregate and of a fresh one, while the claim is open.
    let more = [event("x", "second", 3), event("z", "first", 4)];
    tokio::time::timeout(Duration::from_secs(30), enqueue_committed(&t, &more))
        .await
        .unwrap_or_else(|_| panic!("{t}: the enqueue waited for the relay's claim (gap locks?)"));

    let outcome = all_published(&held);
    let report = held.complete(outcome).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(report.published, 2, "{t}: {report:?}");
    let next = relay_pool.claim(request(ClaimMode::Transaction, 10)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let mut next_events = aggregates(&next);
    next_events.sort();
    assert_eq!(next_events, ["x:second", "z:first"], "{t}");
}
per_backend!(an_enqueue_never_waits_for_a_relays_open_transaction_claim, "enqueue_beside_open_claim");

/// An event written by the contention test's writers.
#[derive(outbox_seaorm::DomainEvent, serde::Serialize, serde::Deserialize)]
#[domain_event(name = "concurrency.written", version = 1, aggregate = "order")]
struct Written {
    #[aggregate_id]
    order_id: String,
    n: u64,
}

/// A writer whose transaction reads before it writes: the shape SQLite refuses to upgrade to a write, at
/// once and whatever the busy timeout, when another connection wrote since it began (unless it began
/// `IMMEDIATE`).
struct Writer {
    db: sea_orm::DatabaseConnection,
}

const COUNT_EVENTS: &str = "SELECT COUNT(*) AS n FROM outbox_events";

#[outbox_seaorm::transactional_outbox(conn = self.db)]
impl Writer {
    async fn write(&self, n: u64) -> Result<(), sea_orm::DbErr> {
        let backend = self.db.get_database_backend();
        self.db.query_one_raw(sea_orm::Statement::from_string(backend, COUNT_EVENTS)).await?;
        outbox_seaorm::emit!(Written { order_id: "hot".into(), n });
        Ok(())
    }
}

/// The same through a caller's scope and `enqueue`.
async fn write_in_scope(db: &sea_orm::DatabaseConnection, n: u64) -> Result<(), sea_orm::DbErr> {
    outbox_seaorm::transaction(db, async |txn| {
        let backend = txn.get_database_backend();
        txn.query_one_raw(sea_orm::Statement::from_string(backend, COUNT_EVENTS)).await?;
        let event = NewEvent::new("order", "hot", "concurrency.written", &serde_json::json!({ "n": n }))
            .map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
        outbox_seaorm::enqueue(txn, &event).await.map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
        Ok(())
    })
    .await
}

async fn eight_writers_of_one_aggregate_beside_two_relays_all_commit(t: TestDb) {
    const WRITERS: u64 = 8;
    const EACH: u64 = 125;
    let broker = InMemoryPublisher::new();
    let shutdown = outbox_seaorm::CancellationToken::new();
    let mut relays = Vec::new();
    for _ in 0..2 {
        let relay = Relay::new(SeaOrmStore::new(t.reconnect().await), broker.clone(), common::fast_config())
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        relays.push(tokio::spawn({
            let shutdown = shutdown.clone();
            async move { relay.run(shutdown).await }
        }));
    }
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let writer = Writer { db: t.db.clone() };
        writers.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            for i in 0..EACH {
                let n = w * EACH + i;
                let written = if i % 2 == 0 { writer.write(n).await } else { write_in_scope(&writer.db, n).await };
                if let Err(e) = written {
                    failures.push(e.to_string());
                }
            }
            failures
        }));
    }
    let mut failures = Vec::new();
    for writer in writers {
        failures.extend(writer.await.unwrap_or_else(|e| panic!("{t}: {e}")));
    }
    assert!(failures.is_empty(), "{t}: {} of {} transactions failed: {:?}", failures.len(), WRITERS * EACH, failures);

    let deadline = Instant::now() + Duration::from_secs(60);
    while count_published(&t).await < WRITERS * EACH {
        assert!(Instant::now() < deadline, "{t}: the relays did not publish the 1000 events within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    for relay in relays {
        relay.await.unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    let received = broker.received();
    let distinct: HashSet<_> = received.iter().map(|e| e.id).collect();
    assert_eq!(distinct.len() as u64, WRITERS * EACH, "{t}: every committed event published");
    assert_per_aggregate_order(&received, &t);
}
per_backend!(eight_writers_of_one_aggregate_beside_two_relays_all_commit, "eight_writers_two_relays");

/// SQLite: a `db.begin()` that reads, then enqueues after another connection wrote, is refused the write
/// lock at once (its snapshot is stale, in WAL mode); the error says why and what to do.
async fn on_sqlite_a_transaction_that_read_first_is_told_how_to_begin(t: TestDb) {
    if t.backend != DbBackend::Sqlite {
        return;
    }
    t.db.execute_unprepared("PRAGMA journal_mode=WAL").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let reader = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    reader.query_one_raw(sea_orm::Statement::from_string(t.backend, COUNT_EVENTS)).await.expect("read first");
    let other = t.reconnect().await;
    outbox_seaorm::enqueue(&other, &event("other", "written", 1)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let error = outbox_seaorm::enqueue(&reader, &event("mine", "written", 2)).await.expect_err("a stale snapshot");
    let message = error.to_string();
    assert!(message.contains("database is locked") && message.contains("begin it IMMEDIATE"), "{t}: {message}");
}
per_backend!(on_sqlite_a_transaction_that_read_first_is_told_how_to_begin, "sqlite_read_first");

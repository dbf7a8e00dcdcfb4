//! In-process wake-ups: a commit in this process starts an idle relay at once, far below its poll
//! interval; the poll stays the fallback.

mod common;

use std::time::{Duration, Instant};

use common::event;
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{InMemoryPublisher, OutboxService};
use sea_orm::{DbErr, TransactionTrait};
use serde::{Deserialize, Serialize};

/// The relays' poll: a wake-up must beat it by an order of magnitude.
const POLL: Duration = Duration::from_secs(10);
/// Half the poll: only a wake-up gets there (typically in 5-15 ms), with room for a loaded machine.
const FAST: Duration = Duration::from_secs(5);

/// A service over `t` with a [`POLL`]-second poll, started and idle (its first pass found nothing).
async fn idle_service(t: &TestDb, broker: &InMemoryPublisher) -> OutboxService {
    let service = OutboxService::builder(SeaOrmStore::new(t.db.clone()), broker.clone())
        .relay_config(RelayConfig::default().with_poll_interval(POLL))
        .without_cleanup()
        .start()
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while service.health().last_success_at.is_none() {
        assert!(Instant::now() < deadline, "{t}: the relay never made its first pass");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await; // asleep in its poll now
    service
}

/// How long until the broker holds `count` messages (panics after a poll and a half).
async fn until_received(t: &TestDb, broker: &InMemoryPublisher, count: usize, since: Instant) -> Duration {
    while broker.received_count() < count {
        assert!(since.elapsed() < POLL + POLL / 2, "{t}: not published even by the poll");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    since.elapsed()
}

async fn a_commit_in_this_process_wakes_an_idle_relay_long_before_its_poll(t: TestDb) {
    let broker = InMemoryPublisher::new();
    let service = idle_service(&t, &broker).await;

    // Through the pool: `enqueue` commits the row itself and then wakes the relay.
    let since = Instant::now();
    outbox_seaorm::enqueue(&t.db, &event("o1", "order.placed", 1)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let plain = until_received(&t, &broker, 1, since).await;
    tokio::time::sleep(Duration::from_millis(50)).await; // idle again

    // Inside the caller's transaction: the signal from `enqueue` is early; `notify_committed` is not.
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    outbox_seaorm::enqueue(&txn, &event("o2", "order.placed", 2)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    tokio::time::sleep(Duration::from_millis(50)).await; // the early wake-up finds nothing and sleeps again
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let since = Instant::now();
    outbox_seaorm::notify_committed();
    let in_txn = until_received(&t, &broker, 2, since).await;

    eprintln!("{t}: poll {POLL:?}; published {plain:?} after enqueue, {in_txn:?} after commit + notify_committed");
    assert!(plain < FAST, "{t}: enqueue through the pool took {plain:?} to reach the broker (poll {POLL:?})");
    assert!(in_txn < FAST, "{t}: notify_committed took {in_txn:?} to reach the broker (poll {POLL:?})");
    service.shutdown().await;
}
per_backend!(a_commit_in_this_process_wakes_an_idle_relay_long_before_its_poll, "wake_after_commit");

async fn without_a_signal_after_the_commit_the_poll_still_publishes(t: TestDb) {
    let broker = InMemoryPublisher::new();
    let service = idle_service(&t, &broker).await;
    // The early signal of `enqueue` inside a transaction, and no `notify_committed` after the commit.
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    outbox_seaorm::enqueue(&txn, &event("o1", "order.placed", 1)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    // Within a poll and a half (sooner when another test of this process happens to wake the relays).
    until_received(&t, &broker, 1, Instant::now()).await;
    service.shutdown().await;
}
per_backend!(without_a_signal_after_the_commit_the_poll_still_publishes, "wake_poll_fallback");

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug)]
#[domain_event(name = "ping.sent", version = 1, aggregate = "ping")]
struct PingSent {
    #[aggregate_id]
    ping_id: String,
}

struct Pings;

#[transactional_outbox]
impl Pings {
    async fn send(&self, db: &sea_orm::DatabaseConnection, id: &str) -> Result<(), DbErr> {
        emit!(PingSent { ping_id: id.to_owned() });
        Ok(())
    }
}

async fn a_transactional_outbox_commit_wakes_an_idle_relay(t: TestDb) {
    let broker = InMemoryPublisher::new();
    let service = idle_service(&t, &broker).await;
    let since = Instant::now();
    Pings.send(&t.db, "p1").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let took = until_received(&t, &broker, 1, since).await;
    eprintln!("{t}: poll {POLL:?}; a #[transactional_outbox] commit was published after {took:?}");
    assert!(took < FAST, "{t}: took {took:?} (poll {POLL:?})");
    service.shutdown().await;
}
// The method's outermost commit signals the relays of this process after it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_outbox_commit_wakes_an_idle_relay_sqlite() {
    use outbox_integration_tests::{Backend, run_on};
    run_on(Backend::Sqlite, "wake_transactional_outbox", a_transactional_outbox_commit_wakes_an_idle_relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_outbox_commit_wakes_an_idle_relay_postgres() {
    use outbox_integration_tests::{Backend, run_on};
    run_on(Backend::Postgres, "wake_transactional_outbox", a_transactional_outbox_commit_wakes_an_idle_relay).await;
}

//! In-process wake-ups: a commit in this process starts an idle relay at once, far below its poll
//! interval; the poll stays the fallback. Relays here poll every 10 minutes and events are awaited for at
//! most one, so a publication proves a wake-up without a latency bound that a loaded machine could break.

use crate::common;

use std::time::{Duration, Instant};

use common::event;
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{InMemoryPublisher, OutboxService};
use sea_orm::{DbErr, TransactionTrait};
use serde::{Deserialize, Serialize};

/// The poll of the relays whose wake-up is tested: ten times [`WAIT`], so an event published within
/// [`WAIT`] was published by a wake-up (typically in 5-15 ms), never by the poll. A state, not a latency
/// bound: a loaded machine makes the wake-up slower, not the test fail.
const LONG_POLL: Duration = Duration::from_secs(600);
/// The poll of the relay whose fallback is tested.
const SHORT_POLL: Duration = Duration::from_secs(2);
/// How long a test waits for a publication.
const WAIT: Duration = Duration::from_secs(60);

/// A service over `t` polling every `poll`, started and idle (its first pass found nothing).
async fn idle_service(t: &TestDb, broker: &InMemoryPublisher, poll: Duration) -> OutboxService {
    let service = OutboxService::builder(SeaOrmStore::new(t.db.clone()), broker.clone())
        .relay_config(RelayConfig::default().with_poll_interval(poll))
        .without_cleanup()
        .start()
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while service.health().last_success_at.is_none() {
        assert!(Instant::now() < deadline, "{t}: the relay never made its first pass");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await; // asleep in its poll now
    service
}

/// How long until the broker holds `count` messages (panics after [`WAIT`]).
async fn until_received(t: &TestDb, broker: &InMemoryPublisher, count: usize, since: Instant) -> Duration {
    while broker.received_count() < count {
        assert!(since.elapsed() < WAIT, "{t}: {count} events not published within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    since.elapsed()
}

async fn a_commit_in_this_process_wakes_an_idle_relay_long_before_its_poll(t: TestDb) {
    let broker = InMemoryPublisher::new();
    let service = idle_service(&t, &broker, LONG_POLL).await;

    // Through the pool: `enqueue` commits the row itself and then wakes the relay.
    let since = Instant::now();
    outbox_seaorm::enqueue(&t.db, &event("o1", "order.placed", 1)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let plain = until_received(&t, &broker, 1, since).await;
    tokio::time::sleep(Duration::from_millis(50)).await; // idle again

    // Inside the caller's transaction: the signal from `enqueue` is early; `wake_relays` is not.
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    outbox_seaorm::enqueue(&txn, &event("o2", "order.placed", 2)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    tokio::time::sleep(Duration::from_millis(50)).await; // the early wake-up finds nothing and sleeps again
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let since = Instant::now();
    outbox_seaorm::wake_relays();
    let in_txn = until_received(&t, &broker, 2, since).await;

    // Both within WAIT, a tenth of the poll: woken, not polled.
    eprintln!("{t}: poll {LONG_POLL:?}; published {plain:?} after enqueue, {in_txn:?} after commit + wake_relays");
    service.shutdown().await;
}
per_backend!(a_commit_in_this_process_wakes_an_idle_relay_long_before_its_poll, "wake_after_commit");

async fn without_a_signal_after_the_commit_the_poll_still_publishes(t: TestDb) {
    let broker = InMemoryPublisher::new();
    let service = idle_service(&t, &broker, SHORT_POLL).await;
    // The early signal of `enqueue` inside a transaction, and no `wake_relays` after the commit.
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    outbox_seaorm::enqueue(&txn, &event("o1", "order.placed", 1)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    // By the poll (or sooner, when another test of this process happens to wake the relays).
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
    let service = idle_service(&t, &broker, LONG_POLL).await;
    let since = Instant::now();
    Pings.send(&t.db, "p1").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let took = until_received(&t, &broker, 1, since).await;
    // Within WAIT, a tenth of the poll: woken, not polled.
    eprintln!("{t}: poll {LONG_POLL:?}; a #[transactional_outbox] commit was published after {took:?}");
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

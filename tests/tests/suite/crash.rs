//! A relay that dies between publishing and marking: the broker has the message, the row is still pending,
//! so it is published again (at-least-once) and the consumer's inbox applies it once.

use crate::common;

use std::time::Duration;

use common::{
    after, count_inbox, count_table, count_unpublished, create_shop_tables, enqueue_committed, event, fast_config,
};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::{ClaimRequest, ClaimedBatch, OutboxStore};
use outbox_seaorm::{ClaimMode, DeadLetterPolicy, InMemoryPublisher, Publisher, Relay, SeaOrmStore};

/// Claims, publishes to `broker`, and "crashes": the batch is dropped without `complete`.
async fn publish_then_crash(
    t: &TestDb,
    broker: &InMemoryPublisher,
    mode: ClaimMode,
    now: chrono::DateTime<chrono::Utc>,
) {
    let store = SeaOrmStore::new(t.reconnect().await);
    let request = ClaimRequest { now, limit: 10, mode, dead_letters: DeadLetterPolicy::BlockAggregate };
    let batch = store.claim(request).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(batch.events().len(), 1, "{t}");
    let results = broker.publish(batch.events()).await;
    assert!(results.iter().all(Result::is_ok), "{t}: {results:?}");
    drop(batch); // the process dies before marking
    drop(store);
}

/// Feeds every received message to the billing consumer; returns (processed, duplicates).
async fn bill(t: &TestDb, broker: &InMemoryPublisher) -> (u32, u32) {
    common::bill(t, broker.received().into_iter().map(|m| (m.id, m.aggregate_id))).await
}

async fn a_crash_between_publish_and_mark_republishes_and_the_inbox_applies_it_once(t: TestDb) {
    create_shop_tables(&t).await;
    let e = event("o1", "order.placed", 1);
    enqueue_committed(&t, std::slice::from_ref(&e)).await;
    let broker = InMemoryPublisher::new();
    publish_then_crash(&t, &broker, ClaimMode::Transaction, chrono::Utc::now()).await;
    assert_eq!(broker.received_count(), 1, "{t}");
    assert_eq!(count_unpublished(&t).await, 1, "{t}: the claim rolled back, the row is still pending");

    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    // The dead relay's transaction rolls back when the server notices (a dropped SeaORM transaction rolls
    // back asynchronously): until then its row lock makes the claim skip the row. Wait for that state.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut published = 0;
    while published == 0 {
        assert!(std::time::Instant::now() < deadline, "{t}: the crashed claim's lock was never released");
        let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert!(pass.published <= 1, "{t}: {pass:?}");
        published += pass.published;
        if published == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let received = broker.received();
    assert_eq!(received.len(), 2, "{t}: the broker holds two copies");
    assert_eq!(received[0].id, e.id(), "{t}");
    assert_eq!(received[1].id, e.id(), "{t}");
    assert_eq!(count_unpublished(&t).await, 0, "{t}");

    assert_eq!(bill(&t, &broker).await, (1, 1), "{t}");
    assert_eq!(count_table(&t, "invoices").await, 1, "{t}: the effect happened once");
    assert_eq!(count_inbox(&t, "billing").await, 1, "{t}");
}
per_backend!(
    a_crash_between_publish_and_mark_republishes_and_the_inbox_applies_it_once,
    "crash_before_mark_transaction"
);

async fn a_crashed_lease_holders_event_is_republished_once_the_lease_expires(t: TestDb) {
    create_shop_tables(&t).await;
    enqueue_committed(&t, &[event("o1", "order.placed", 1)]).await;
    let broker = InMemoryPublisher::new();
    let lease = Duration::from_secs(30);
    let now = chrono::Utc::now();
    publish_then_crash(&t, &broker, ClaimMode::Lease { duration: lease }, now).await;
    assert_eq!(count_unpublished(&t).await, 1, "{t}");

    let config = fast_config().with_claim_mode(ClaimMode::Lease { duration: lease });
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config).expect("config");
    let pass = relay.run_once_at(after(now, lease / 2)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.claimed, 0, "{t}: the dead relay's lease still holds the row: {pass:?}");
    let pass =
        relay.run_once_at(after(now, lease + Duration::from_secs(1))).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.published, 1, "{t}: {pass:?}");
    assert_eq!(broker.received_count(), 2, "{t}");
    assert_eq!(count_unpublished(&t).await, 0, "{t}");

    assert_eq!(bill(&t, &broker).await, (1, 1), "{t}");
    assert_eq!(count_table(&t, "invoices").await, 1, "{t}");
}
per_backend!(a_crashed_lease_holders_event_is_republished_once_the_lease_expires, "crash_before_mark_lease");

//! The seed lab's scenarios, on every backend: a crash before COMMIT leaves nothing behind, a committed
//! event is published, and an unreliable broker produces duplicates that the inbox absorbs.

use crate::common;

use common::{
    CAP, after, count_inbox, count_outbox, count_published, count_table, create_shop_tables, fast_config,
    insert_invoice, invoice_total,
};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{InMemoryPublisher, InboxOutcome, NewEvent, Relay, SeaOrmStore};
use sea_orm::{ConnectionTrait, TransactionTrait};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: String,
    total_minor: i64,
}

/// The app's unit of work: the order row and its event commit together. `crash_before_commit` makes the
/// process "die" after both writes but before COMMIT (the transaction is dropped, so it rolls back).
async fn place_order(t: &TestDb, id: &str, total_minor: i64, crash_before_commit: bool) -> Result<(), String> {
    let txn = t.db.begin().await.map_err(|e| e.to_string())?;
    txn.execute_unprepared(&format!(
        "INSERT INTO orders (id, customer, total_minor) VALUES ('{id}', 'c-{id}', {total_minor})"
    ))
    .await
    .map_err(|e| e.to_string())?;
    let event = NewEvent::new("order", id, "order.placed", &OrderPlaced { order_id: id.to_owned(), total_minor })
        .map_err(|e| e.to_string())?;
    outbox_seaorm::enqueue(&txn, &event).await.map_err(|e| e.to_string())?;
    if crash_before_commit {
        return Err("the process died before COMMIT".to_owned());
    }
    txn.commit().await.map_err(|e| e.to_string())
}

async fn a_crash_before_commit_leaves_no_order_no_event_and_nothing_to_publish(t: TestDb) {
    create_shop_tables(&t).await;
    let err = place_order(&t, "o0", 900, true).await.expect_err("the unit of work must fail");
    assert!(err.contains("died"), "{t}: {err}");
    assert_eq!(count_table(&t, "orders").await, 0, "{t}: the order must roll back");
    assert_eq!(count_outbox(&t).await, 0, "{t}: the event must roll back with the order");

    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.claimed, 0, "{t}: {pass:?}");
    assert_eq!(broker.received_count(), 0, "{t}: nothing may reach the broker");
}
per_backend!(a_crash_before_commit_leaves_no_order_no_event_and_nothing_to_publish, "lab_crash_before_commit");

async fn a_committed_order_is_pending_until_one_relay_pass_publishes_it(t: TestDb) {
    create_shop_tables(&t).await;
    place_order(&t, "o1", 44_900, false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(count_table(&t, "orders").await, 1, "{t}");

    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    let stats = relay.store().stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead, stats.max_attempts), (1, 0, 0), "{t}: {stats:?}");
    assert!(stats.oldest_pending_seconds <= 1, "{t}: {stats:?}");
    assert_eq!(broker.received_count(), 0, "{t}: enqueue alone publishes nothing");

    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published, pass.failed), (1, 1, 0), "{t}: {pass:?}");
    let received = broker.received();
    assert_eq!(received.len(), 1, "{t}");
    assert_eq!(received[0].event_type, "order.placed", "{t}");
    let order: OrderPlaced = received[0].decode().unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((order.order_id.as_str(), order.total_minor), ("o1", 44_900), "{t}");

    let stats = relay.store().stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(stats.pending, 0, "{t}: {stats:?}");
    assert_eq!(count_published(&t).await, 1, "{t}");
}
per_backend!(a_committed_order_is_pending_until_one_relay_pass_publishes_it, "lab_commit_then_publish");

async fn twenty_orders_through_an_outage_and_lost_acks_are_invoiced_exactly_once(t: TestDb) {
    create_shop_tables(&t).await;
    for i in 1..=20 {
        place_order(&t, &format!("o{i}"), 1000 * i, false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    let broker = InMemoryPublisher::new();
    broker.go_down_for(3);
    broker.lose_acks(4);
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config().with_batch_size(5)).expect("config");

    // Step the clock past every backoff instead of sleeping.
    let mut now = chrono::Utc::now();
    let mut passes = 0;
    while relay.store().stats(now).await.unwrap_or_else(|e| panic!("{t}: {e}")).pending > 0 {
        passes += 1;
        assert!(passes <= 50, "{t}: the relay did not drain the outbox in 50 passes");
        relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: pass {passes}: {e}"));
        now = after(now, CAP);
    }
    assert_eq!(count_published(&t).await, 20, "{t}");
    // 3 rejected messages never arrived; 4 arrived whose acks were lost, and were sent again.
    let received = broker.received();
    assert_eq!(received.len(), 24, "{t}: at-least-once: 20 events + 4 redeliveries");
    let distinct: std::collections::HashSet<_> = received.iter().map(|e| e.id).collect();
    assert_eq!(distinct.len(), 20, "{t}");

    // The billing consumer de-duplicates through its inbox.
    let (mut processed, mut duplicates) = (0, 0);
    for message in &received {
        let order: OrderPlaced = message.decode().unwrap_or_else(|e| panic!("{t}: {e}"));
        let outcome = outbox_seaorm::handle_once(&t.db, "billing", &message.id.to_string(), async |txn| {
            insert_invoice(txn, &order.order_id, order.total_minor).await
        })
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
        match outcome {
            InboxOutcome::Processed(()) => processed += 1,
            InboxOutcome::Duplicate => duplicates += 1,
        }
    }
    assert_eq!((processed, duplicates), (20, 4), "{t}");
    assert_eq!(count_table(&t, "invoices").await, 20, "{t}: one invoice per order");
    assert_eq!(invoice_total(&t).await, 210_000, "{t}: 1000 + 2000 + … + 20000");
    assert_eq!(count_inbox(&t, "billing").await, 20, "{t}");
}
per_backend!(twenty_orders_through_an_outage_and_lost_acks_are_invoiced_exactly_once, "lab_outage_lost_acks");

//! The test kit against the real relay and inbox on every backend: through a broker that fails, loses
//! acks, duplicates and reorders within calls, every committed event is applied once, in order; and the
//! history check reports a broker that drops an event or breaks an aggregate's order.

use crate::common;

use common::{
    CAP, after, count_inbox, count_table, create_shop_tables, event, fast_config, insert_invoice, outbox_row,
};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::testkit::{FaultyPublisher, History, HistoryReport, Recorded, Reorder};
use outbox_seaorm::{InMemoryPublisher, InboxOutcome, NewEvent, Relay, SeaOrmStore};
use sea_orm::TransactionTrait;

/// Commits `events` in one transaction and records them in `history` with the versions the outbox gave.
async fn commit(t: &TestDb, history: &History, events: &[NewEvent]) {
    common::enqueue_committed(t, events).await;
    for e in events {
        let row = outbox_row(t, e.id()).await;
        history.committed(Recorded { id: e.id(), aggregate: row.aggregate_id, version: row.aggregate_version });
    }
}

/// Runs relay passes (stepping the clock past every backoff) until nothing is pending.
async fn drain(t: &TestDb, relay: &Relay<SeaOrmStore, FaultyPublisher<InMemoryPublisher>>) {
    let mut now = chrono::Utc::now();
    for pass in 1..=200 {
        if relay.store().stats(now).await.unwrap_or_else(|e| panic!("{t}: {e}")).pending == 0 {
            return;
        }
        relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: pass {pass}: {e}"));
        now = after(now, CAP);
    }
    panic!("{t}: the relay did not drain the outbox in 200 passes");
}

/// Billing: every message the broker holds, redeliveries included, through the inbox; records the
/// history as it goes.
async fn bill_everything(t: &TestDb, broker: &InMemoryPublisher, history: &History) {
    for message in broker.received() {
        history.delivered(message.id);
        let outcome = outbox_seaorm::handle_once(&t.db, "billing", &message.id.to_string(), async |txn| {
            insert_invoice(txn, &message.aggregate_id, 100).await
        })
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
        if let InboxOutcome::Processed(()) = outcome {
            history.applied(Recorded::of(&message));
        }
    }
}

async fn a_faulty_broker_still_gets_every_committed_event_applied_once_in_order(t: TestDb) {
    create_shop_tables(&t).await;
    let history = History::new();
    for n in 0..5 {
        let events: Vec<NewEvent> = (0..8).map(|a| event(&format!("o{a}"), "order.placed", n)).collect();
        commit(&t, &history, &events).await;
    }
    // A transaction that rolls back after its enqueue: its event must never reach anyone.
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    outbox_seaorm::enqueue(&txn, &event("o0", "order.placed", 99)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.rollback().await.unwrap_or_else(|e| panic!("{t}: {e}"));

    let broker = InMemoryPublisher::new();
    let faulty = FaultyPublisher::new(broker.clone()).with_seed(3);
    faulty.set_fail_rate(0.2);
    faulty.set_lost_ack_rate(0.2);
    faulty.set_duplicate_rate(0.1);
    faulty.set_reorder(Reorder::WithinCall);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), faulty.clone(), fast_config().with_batch_size(10))
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    drain(&t, &relay).await;
    bill_everything(&t, &broker, &history).await;

    let report = history.check();
    assert!(report.is_ok(), "{t}: {report}");
    let counts = faulty.counts();
    assert!(counts.failed > 0 && counts.lost_acks > 0 && counts.duplicated > 0, "{t}: every fault fired: {counts:?}");
    let received = broker.received().len() as u64;
    assert_eq!((report.committed, report.delivered, report.applied), (40, received, 40), "{t}: {report}");
    assert_eq!(report.duplicates_absorbed, received - 40, "{t}: every redelivery absorbed");
    assert_eq!(count_table(&t, "invoices").await, 40, "{t}: one invoice per committed event");
    assert_eq!(count_inbox(&t, "billing").await, 40, "{t}");
}
per_backend!(a_faulty_broker_still_gets_every_committed_event_applied_once_in_order, "testkit_faulty_broker");

async fn a_broker_that_drops_an_event_is_reported_lost_though_the_outbox_marked_it_published(t: TestDb) {
    create_shop_tables(&t).await;
    let history = History::new();
    let events: Vec<NewEvent> = (0..5).map(|a| event(&format!("o{a}"), "order.placed", 1)).collect();
    commit(&t, &history, &events).await;

    let broker = InMemoryPublisher::new();
    let faulty = FaultyPublisher::new(broker.clone());
    faulty.drop_next(1);
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), faulty, fast_config()).unwrap_or_else(|e| panic!("{t}: {e}"));
    drain(&t, &relay).await;
    assert_eq!(common::count_published(&t).await, 5, "{t}: the relay cannot see the loss");
    bill_everything(&t, &broker, &history).await;

    let report: HistoryReport = history.check();
    assert_eq!((report.committed, report.applied, report.lost), (5, 4, 1), "{t}: {report}");
    assert!(!report.is_ok(), "{t}");
    assert_eq!(count_table(&t, "invoices").await, 4, "{t}");
}
per_backend!(
    a_broker_that_drops_an_event_is_reported_lost_though_the_outbox_marked_it_published,
    "testkit_dropped_event"
);

async fn a_broker_that_lets_an_aggregates_next_event_overtake_is_an_order_violation(t: TestDb) {
    create_shop_tables(&t).await;
    let history = History::new();
    commit(&t, &history, &[event("o1", "order.placed", 1), event("o1", "order.paid", 2)]).await;

    let broker = InMemoryPublisher::new();
    let faulty = FaultyPublisher::new(broker.clone());
    faulty.hold_back_next(1); // o1 v1 is confirmed but reaches the broker after v2
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), faulty, fast_config()).unwrap_or_else(|e| panic!("{t}: {e}"));
    drain(&t, &relay).await;
    let versions: Vec<i64> = broker.received().iter().map(|e| e.aggregate_version).collect();
    assert_eq!(versions, [2, 1], "{t}");
    bill_everything(&t, &broker, &history).await;

    let report = history.check();
    assert_eq!((report.lost, report.applied_twice, report.order_violations), (0, 0, 1), "{t}: {report}");
    assert_eq!(count_table(&t, "invoices").await, 2, "{t}");
}
per_backend!(a_broker_that_lets_an_aggregates_next_event_overtake_is_an_order_violation, "testkit_order_violation");

//! Writing events: `enqueue_all` keeps the given order, every envelope field survives the trip through the
//! database to the broker, and enqueue joins whatever connection or transaction it is given.

use crate::common;

use common::{count_outbox, enqueue_committed, fast_config, outbox_rows};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::entity::outbox_event;
use outbox_seaorm::{EventId, InMemoryPublisher, NewEvent, Relay, SeaOrmStore};
use sea_orm::{EntityTrait, QueryOrder, QuerySelect, TransactionTrait};

fn mixed_events() -> Vec<NewEvent> {
    (0..8)
        .map(|i| {
            let aggregate = ["o1", "o2", "o3"][i % 3];
            NewEvent::new("order", aggregate, format!("order.step{i}"), &serde_json::json!({ "i": i }))
                .expect("valid")
                .with_schema_version(1 + (i as i32 % 2))
                .expect("a valid version")
        })
        .collect()
}

async fn enqueue_all_inserts_events_in_the_given_order(t: TestDb) {
    let events = mixed_events();
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let ids = outbox_seaorm::enqueue_all(&txn, &events).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(outbox_seaorm::enqueue_all(&txn, &[]).await.unwrap_or_else(|e| panic!("{t}: {e}")).is_empty(), "{t}");
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(ids, events.iter().map(NewEvent::id).collect::<Vec<_>>(), "{t}: ids in the given order");

    let rows = outbox_rows(&t).await;
    assert_eq!(rows.len(), events.len(), "{t}");
    assert!(rows.windows(2).all(|w| w[0].seq < w[1].seq), "{t}: seq ascending");
    for (row, event) in rows.iter().zip(&events) {
        assert_eq!(row.event_id, event.id().to_string(), "{t}: row {} is out of order", row.seq);
        assert_eq!(row.aggregate_id, event.aggregate_id(), "{t}");
        assert_eq!(row.event_type, event.event_type(), "{t}");
        assert_eq!(row.schema_version, event.schema_version(), "{t}");
        let payload: serde_json::Value = serde_json::from_str(event.payload_json()).expect("json");
        assert_eq!(row.payload, payload, "{t}");
        assert_eq!((row.attempts, row.published_at_ms, row.dead_at_ms), (0, None, None), "{t}");
        assert_eq!(row.next_attempt_at_ms, row.created_at_ms, "{t}: due at once");
    }
}
per_backend!(enqueue_all_inserts_events_in_the_given_order, "enqueue_all_keeps_order");

async fn every_envelope_field_reaches_the_broker_unchanged(t: TestDb) {
    let id = EventId::new();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let payload = serde_json::json!({"total_minor": 4900, "lines": [{"sku": "ä-1", "qty": 2}], "note": null});
    let e = NewEvent::new("order", "o-42", "order.placed", &payload)
        .expect("valid")
        .with_id(id)
        .with_schema_version(3)
        .expect("a valid version")
        .with_header("traceparent", traceparent)
        .expect("header")
        .with_header("tenant", "acme")
        .expect("header");
    let before = chrono::Utc::now().timestamp_millis();
    enqueue_committed(&t, std::slice::from_ref(&e)).await;

    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let got = broker.received().pop().unwrap_or_else(|| panic!("{t}: nothing published"));
    assert_eq!(got.id, id, "{t}");
    assert_eq!((got.aggregate_type.as_str(), got.aggregate_id.as_str()), ("order", "o-42"), "{t}");
    assert_eq!((got.event_type.as_str(), got.schema_version), ("order.placed", 3), "{t}");
    assert_eq!(got.headers.get("traceparent").map(String::as_str), Some(traceparent), "{t}");
    assert_eq!(got.headers.get("tenant").map(String::as_str), Some("acme"), "{t}");
    assert_eq!(got.decode::<serde_json::Value>().unwrap_or_else(|e| panic!("{t}: {e}")), payload, "{t}");
    let created = got.created_at.timestamp_millis();
    assert!(created >= before && created <= chrono::Utc::now().timestamp_millis(), "{t}: created_at {created}");
    assert_eq!((got.attempts, got.last_error.as_deref()), (0, None), "{t}");
}
per_backend!(every_envelope_field_reaches_the_broker_unchanged, "envelope_reaches_broker");

async fn enqueue_joins_the_given_transaction_or_writes_alone(t: TestDb) {
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let e = NewEvent::new("order", "o1", "order.placed", &serde_json::json!({"n": 1})).expect("valid");
    assert_eq!(outbox_seaorm::enqueue(&txn, &e).await.unwrap_or_else(|e| panic!("{t}: {e}")), e.id(), "{t}");
    // A savepoint inside the transaction: rolled back alone.
    let savepoint = txn.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let dropped = NewEvent::new("order", "o1", "order.cancelled", &serde_json::json!({"n": 2})).expect("valid");
    outbox_seaorm::enqueue(&savepoint, &dropped).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    savepoint.rollback().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let rows = outbox_rows(&t).await;
    assert_eq!(rows.iter().map(|r| r.event_type.as_str()).collect::<Vec<_>>(), ["order.placed"], "{t}");

    // No business change to go with it: a plain connection writes the event on its own.
    let alone = NewEvent::new("order", "o2", "order.placed", &serde_json::json!({"n": 3})).expect("valid");
    outbox_seaorm::enqueue(&t.db, &alone).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(count_outbox(&t).await, 2, "{t}");
}
per_backend!(enqueue_joins_the_given_transaction_or_writes_alone, "enqueue_joins_transaction");

async fn enqueue_all_takes_more_events_than_one_statement_can_bind(t: TestDb) {
    // 7000 events bind 70 000 values: over SQLite's 32 766 and PostgreSQL's and MySQL's 65 535 per statement.
    const EVENTS: u64 = 7000;
    let events: Vec<NewEvent> = (0..EVENTS).map(|i| common::event(&format!("a{}", i % 50), "t", i)).collect();
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let ids = outbox_seaorm::enqueue_all(&txn, &events).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(ids.len() as u64, EVENTS, "{t}");
    let stored: Vec<String> = outbox_event::Entity::find()
        .select_only()
        .column(outbox_event::Column::EventId)
        .order_by_asc(outbox_event::Column::Seq)
        .into_tuple()
        .all(&t.db)
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    let expected: Vec<String> = events.iter().map(|e| e.id().to_string()).collect();
    assert!(stored == expected, "{t}: {} rows, not all in the given order", stored.len());
}
per_backend!(enqueue_all_takes_more_events_than_one_statement_can_bind, "enqueue_all_many_events");

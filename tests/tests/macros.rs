//! The macros on real databases: `#[transactional_outbox]` services commit their events with their
//! changes or not at all, compose through savepoints, and `#[idempotent_handler]` consumers apply each
//! event once, upcasting old payloads.

#[path = "suite/common/mod.rs"]
mod common;

use common::{count_inbox, count_outbox, count_table, create_shop_tables, insert_invoice, invoice_total, outbox_rows};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{Error, InMemoryPublisher, InboxError, OutboxEvent};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait};
use serde::{Deserialize, Serialize};

/// Version 1 stored the total in major units and had no customer; events.lock keeps its fields.
#[derive(PayloadSchema, Serialize, Deserialize)]
struct OrderPlacedV1 {
    order_id: String,
    total: i64,
}

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "order.placed", version = 2, aggregate = "order", upcast_from(v1 = OrderPlacedV1))]
struct OrderPlaced {
    #[aggregate_id]
    order_id: String,
    customer: String,
    total_minor: i64,
}

impl From<OrderPlacedV1> for OrderPlaced {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlaced { order_id: v1.order_id, customer: "unknown".into(), total_minor: v1.total * 100 }
    }
}

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[domain_event(name = "order.paid", version = 1, aggregate = "order")]
#[serde(rename_all = "camelCase")]
struct OrderPaid {
    #[aggregate_id]
    order_id: String,
    amount_minor: i64,
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error(transparent)]
    Db(#[from] DbErr),
    #[error("order {0} rejected")]
    Rejected(String),
}

struct Orders;

#[transactional_outbox]
impl Orders {
    /// Saves an order and emits `order.placed`; rejects non-positive totals after emitting, so a
    /// rejection must take the event back.
    async fn place<C>(&self, db: &C, id: &str, total_minor: i64) -> Result<(), ShopError>
    where
        C: ConnectionTrait + TransactionTrait,
    {
        let sql = format!("INSERT INTO orders (id, customer, total_minor) VALUES ('{id}', 'c-{id}', {total_minor})");
        db.execute_unprepared(&sql).await?;
        emit!(OrderPlaced { order_id: id.to_owned(), customer: format!("c-{id}"), total_minor });
        if total_minor <= 0 {
            return Err(ShopError::Rejected(id.to_owned()));
        }
        Ok(())
    }

    async fn pay(&self, db: &DatabaseTransaction, id: &str, amount_minor: i64) -> Result<(), ShopError> {
        emit!(OrderPaid { order_id: id.to_owned(), amount_minor });
        Ok(())
    }

    /// Panics after emitting: nothing may be left behind.
    async fn place_then_panic(&self, db: &DatabaseConnection, id: &str) -> Result<(), ShopError> {
        emit!(OrderPlaced { order_id: id.to_owned(), customer: "p".into(), total_minor: 1 });
        panic!("the process died mid-method");
    }
}

/// Two services composed in one transaction; `fail_at_end` makes the outer one fail after both ran.
#[transactional_outbox]
async fn checkout(db: &DatabaseConnection, id: &str, fail_at_end: bool) -> Result<(), ShopError> {
    Orders.place(db, id, 500).await?;
    Orders.pay(db, id, 500).await?;
    if fail_at_end {
        return Err(ShopError::Rejected(id.to_owned()));
    }
    Ok(())
}

/// Tries a rejected order first (its savepoint rolls back), then places a good one.
#[transactional_outbox]
async fn retry_with_good_order(db: &DatabaseConnection) -> Result<(), ShopError> {
    let rejected = Orders.place(db, "bad", 0).await;
    assert!(matches!(rejected, Err(ShopError::Rejected(_))));
    Orders.place(db, "good", 700).await
}

#[idempotent_handler]
async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<i64, DbErr> {
    insert_invoice(txn, &event.order_id, event.total_minor).await?;
    Ok(event.total_minor)
}

/// A handler that reads the envelope: the invoice row is keyed by the event id it came in.
#[idempotent_handler]
async fn audit(txn: &DatabaseTransaction, event: OrderPlaced, envelope: &OutboxEvent) -> Result<String, DbErr> {
    insert_invoice(txn, &envelope.id.to_string(), event.total_minor).await?;
    Ok(envelope.headers.get("tenant").cloned().unwrap_or_default())
}

fn types_of(rows: &[outbox_seaorm::entity::outbox_event::Model]) -> Vec<(String, String)> {
    rows.iter().map(|r| (r.event_type.clone(), r.aggregate_id.clone())).collect()
}

async fn published(t: &TestDb) -> Vec<OutboxEvent> {
    let broker = InMemoryPublisher::new();
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), RelayConfig::default()).expect("valid config");
    relay.drain(100).await.unwrap_or_else(|e| panic!("{t}: relay: {e}"));
    broker.received()
}

async fn a_failed_service_call_emits_nothing_and_saves_nothing(t: TestDb) {
    create_shop_tables(&t).await;
    let rejected = Orders.place(&t.db, "o1", 0).await;
    assert!(matches!(rejected, Err(ShopError::Rejected(_))), "{t}: {rejected:?}");
    assert_eq!(count_outbox(&t).await, 0, "{t}: the emitted event was rolled back");
    assert_eq!(count_table(&t, "orders").await, 0, "{t}: the order was rolled back");

    Orders.place(&t.db, "o2", 100).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(types_of(&outbox_rows(&t).await), [("order.placed".into(), "o2".into())], "{t}");
    assert_eq!(count_table(&t, "orders").await, 1, "{t}");
}
per_backend!(a_failed_service_call_emits_nothing_and_saves_nothing, "mac_rollback");

async fn composed_services_emit_in_order_in_one_transaction(t: TestDb) {
    create_shop_tables(&t).await;
    checkout(&t.db, "o1", false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let rows = outbox_rows(&t).await;
    assert_eq!(types_of(&rows), [("order.placed".into(), "o1".into()), ("order.paid".into(), "o1".into())], "{t}");
    let paid: serde_json::Value = rows[1].payload.clone();
    assert_eq!(paid, serde_json::json!({"orderId": "o1", "amountMinor": 500}), "{t}: serde renames apply");
    assert_eq!((rows[0].schema_version, rows[1].schema_version), (2, 1), "{t}");

    let failed = checkout(&t.db, "o2", true).await;
    assert!(failed.is_err(), "{t}");
    assert_eq!(count_outbox(&t).await, 2, "{t}: the failed checkout took both inner events back");
    assert_eq!(count_table(&t, "orders").await, 1, "{t}");
}
per_backend!(composed_services_emit_in_order_in_one_transaction, "mac_compose");

async fn a_failed_inner_service_rolls_back_only_its_savepoint(t: TestDb) {
    create_shop_tables(&t).await;
    retry_with_good_order(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(types_of(&outbox_rows(&t).await), [("order.placed".into(), "good".into())], "{t}");
    assert_eq!(count_table(&t, "orders").await, 1, "{t}");
}
per_backend!(a_failed_inner_service_rolls_back_only_its_savepoint, "mac_savepoint");

async fn a_panicking_service_leaves_no_half_written_outbox(t: TestDb) {
    create_shop_tables(&t).await;
    let db = t.db.clone();
    let joined = tokio::spawn(async move { Orders.place_then_panic(&db, "o1").await }).await;
    assert!(joined.is_err_and(|e| e.is_panic()), "{t}");
    assert_eq!(count_outbox(&t).await, 0, "{t}");
    // The pool is still usable afterwards.
    Orders.place(&t.db, "o2", 1).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(count_outbox(&t).await, 1, "{t}");
}
per_backend!(a_panicking_service_leaves_no_half_written_outbox, "mac_panic");

async fn a_handler_run_twice_applies_its_effect_once(t: TestDb) {
    create_shop_tables(&t).await;
    Orders.place(&t.db, "o1", 4900).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let messages = published(&t).await;
    assert_eq!(messages.len(), 1, "{t}");
    let first =
        outbox_seaorm::deliver(&t.db, "billing", &messages[0], bill).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(first, InboxOutcome::Processed(4900), "{t}");
    let again =
        outbox_seaorm::deliver(&t.db, "billing", &messages[0], bill).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(again, InboxOutcome::Duplicate, "{t}");
    assert_eq!(count_table(&t, "invoices").await, 1, "{t}");
    assert_eq!(count_inbox(&t, "billing").await, 1, "{t}");
}
per_backend!(a_handler_run_twice_applies_its_effect_once, "mac_handler_once");

async fn an_old_version_payload_is_upcast_by_the_handler(t: TestDb) {
    create_shop_tables(&t).await;
    let v1 = NewEvent::new("order", "o9", "order.placed", &serde_json::json!({"order_id": "o9", "total": 7}))
        .unwrap()
        .with_schema_version(1)
        .unwrap();
    outbox_seaorm::enqueue(&t.db, &v1).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let messages = published(&t).await;
    let outcome =
        outbox_seaorm::deliver(&t.db, "billing", &messages[0], bill).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(outcome, InboxOutcome::Processed(700), "{t}: v1 total 7 became 700 minor units");
    assert_eq!(invoice_total(&t).await, 700, "{t}");
}
per_backend!(an_old_version_payload_is_upcast_by_the_handler, "mac_upcast");

async fn unknown_types_and_newer_versions_are_errors_that_record_nothing(t: TestDb) {
    create_shop_tables(&t).await;
    let payload = serde_json::json!({"order_id": "o1", "customer": "c", "total_minor": 1});
    let cancelled = NewEvent::new("order", "o1", "order.cancelled", &payload).unwrap();
    let from_the_future =
        NewEvent::new("order", "o1", "order.placed", &payload).unwrap().with_schema_version(3).unwrap();
    let malformed = NewEvent::new("order", "o1", "order.placed", &serde_json::json!({"order_id": 5})).unwrap();
    outbox_seaorm::enqueue_all(&t.db, &[cancelled, from_the_future, malformed]).await.unwrap();
    let broker = InMemoryPublisher::new();
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), RelayConfig::default()).expect("valid config");
    for _ in 0..3 {
        relay.run_once().await.unwrap();
    }
    let messages = broker.received();
    assert_eq!(messages.len(), 3, "{t}");
    let errors: Vec<_> = {
        let mut errors = Vec::new();
        for m in &messages {
            errors.push(outbox_seaorm::deliver(&t.db, "billing", m, bill).await.expect_err("must not be processed"));
        }
        errors
    };
    assert!(matches!(errors[0], InboxError::Outbox(Error::UnknownEventType { .. })), "{t}: {}", errors[0]);
    assert!(
        matches!(errors[1], InboxError::Outbox(Error::UnsupportedVersion { version: 3, .. })),
        "{t}: {}",
        errors[1]
    );
    assert!(matches!(errors[2], InboxError::Outbox(Error::Deserialize { .. })), "{t}: {}", errors[2]);
    assert_eq!(count_inbox(&t, "billing").await, 0, "{t}: nothing recorded");
    assert_eq!(count_table(&t, "invoices").await, 0, "{t}");
}
per_backend!(unknown_types_and_newer_versions_are_errors_that_record_nothing, "mac_unknown");

/// The event schemas of this test binary (with the `upcast_from` structs of older versions) are locked in
/// `tests/events.lock`, found without a list; bless new ones with `OUTBOX_BLESS=1 cargo test`. The derive
/// checks the same file at compile time. The library's events (linked here only when used) are locked by
/// its own unit test, so this test sees every linked event locked either way.
#[test]
fn events_lock_matches_the_event_types() {
    outbox_seaorm::verify_events_lock_all(concat!(env!("CARGO_MANIFEST_DIR"), "/events.lock")).unwrap();
}

async fn a_cancelled_service_call_leaves_no_half_written_outbox(t: TestDb) {
    create_shop_tables(&t).await;
    let slow = slow_place(&t.db, "o1");
    let cancelled = tokio::time::timeout(std::time::Duration::from_millis(200), slow).await;
    assert!(cancelled.is_err(), "{t}: the call was cancelled mid-way");
    assert_eq!(count_outbox(&t).await, 0, "{t}");
    assert_eq!(count_table(&t, "orders").await, 0, "{t}");
    Orders.place(&t.db, "o2", 1).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(count_outbox(&t).await, 1, "{t}: the pool is still usable");
}
per_backend!(a_cancelled_service_call_leaves_no_half_written_outbox, "mac_cancel");

/// Saves an order, emits its event, then waits far longer than any caller will.
#[transactional_outbox]
async fn slow_place(db: &DatabaseConnection, id: &str) -> Result<(), ShopError> {
    Orders.place(db, id, 100).await?;
    tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    Ok(())
}

#[test]
fn the_event_contract_exports_as_json_schema_with_its_name_and_version() {
    let schema = outbox_seaorm::event_json_schema::<OrderPaid>();
    assert_eq!(schema["x-event-name"], "order.paid");
    assert_eq!(schema["x-event-version"], 1);
    assert_eq!(schema["x-aggregate-type"], "order");
    assert_eq!(schema["properties"]["amountMinor"]["type"], "integer", "{schema}");
    assert_eq!(schema["required"], serde_json::json!(["orderId", "amountMinor"]), "{schema}");
}

/// `#[idempotent_handler]` with a third parameter gets the envelope: id, headers.
async fn a_handler_can_read_the_envelope(t: TestDb) {
    create_shop_tables(&t).await;
    let placed = OrderPlaced { order_id: "o7".into(), customer: "c".into(), total_minor: 700 };
    let event = placed.to_new_event().expect("event").with_header("tenant", "acme").expect("header");
    outbox_seaorm::enqueue(&t.db, &event).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let message = published(&t).await.pop().unwrap_or_else(|| panic!("{t}: nothing published"));
    let outcome = outbox_seaorm::deliver(&t.db, "audit", &message, audit).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(outcome, InboxOutcome::Processed("acme".to_owned()), "{t}");
    assert_eq!(
        outbox_seaorm::deliver(&t.db, "audit", &message, audit).await.unwrap_or_else(|e| panic!("{t}: {e}")),
        InboxOutcome::Duplicate,
        "{t}"
    );
    let sql = format!("SELECT COUNT(*) AS n FROM invoices WHERE order_id = '{}'", message.id);
    let row = t.db.query_one_raw(sea_orm::Statement::from_string(t.backend, sql)).await.expect("query").expect("row");
    assert_eq!(row.try_get::<i64>("", "n").expect("n"), 1, "{t}: the effect saw the envelope's id");
}
per_backend!(a_handler_can_read_the_envelope, "handler_reads_envelope");

/// An app error that takes the outbox's own error beside the database's.
#[derive(Debug, thiserror::Error)]
enum TypedError {
    #[error(transparent)]
    Db(#[from] DbErr),
    #[error(transparent)]
    Outbox(#[from] Error),
}

struct Tagged {
    db: DatabaseConnection,
}

#[transactional_outbox(conn = self.db)]
impl Tagged {
    /// Emits with a header name that is no header name: the `emit!` fails.
    async fn typed(&self, id: &str) -> Result<(), TypedError> {
        emit!(OrderPaid { order_id: id.to_owned(), amount_minor: 1 }, headers = [("", "x")]);
        Ok(())
    }

    /// The same through an error type that only takes `DbErr`.
    async fn untyped(&self, id: &str) -> Result<(), DbErr> {
        emit!(OrderPaid { order_id: id.to_owned(), amount_minor: 1 }, headers = [("", "x")]);
        Ok(())
    }
}

async fn a_refused_emit_keeps_the_outbox_error_typed_when_the_error_type_takes_it(t: TestDb) {
    let service = Tagged { db: t.db.clone() };
    match service.typed("t1").await {
        Err(TypedError::Outbox(Error::InvalidEvent { .. })) => {}
        other => panic!("{t}: expected the typed InvalidEvent, got {other:?}"),
    }
    match service.untyped("t2").await {
        Err(DbErr::Custom(text)) => assert!(text.contains("header"), "{t}: {text}"),
        other => panic!("{t}: expected DbErr::Custom, got {other:?}"),
    }
    assert_eq!(count_outbox(&t).await, 0, "{t}: nothing written");
}
per_backend!(a_refused_emit_keeps_the_outbox_error_typed_when_the_error_type_takes_it, "mac_typed_error");

//! Bad input is rejected with a typed error naming what is wrong, before anything is written or started.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{count_outbox, count_table, create_shop_tables, enqueue_committed, event, fast_config};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::limits::DEFAULT_MAX_PAYLOAD_BYTES;
use outbox_seaorm::limits::MAX_AGGREGATE_ID_LEN;
use outbox_seaorm::limits::MAX_AGGREGATE_TYPE_LEN;
use outbox_seaorm::limits::MAX_EVENT_TYPE_LEN;
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{ClaimMode, Error, InMemoryPublisher, NewEvent, Relay, RelayConfig, SeaOrmStore};
use sea_orm::{ConnectionTrait, TransactionTrait};

/// The app's unit of work: insert the order, build its event (which may be rejected), enqueue, commit. An
/// error drops the transaction, rolling back the order too.
async fn place_order(t: &TestDb, build: impl FnOnce() -> outbox_seaorm::Result<NewEvent>) -> outbox_seaorm::Result<()> {
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.execute_unprepared("INSERT INTO orders (id, customer, total_minor) VALUES ('o1', 'ann', 4900)")
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    let event = build()?;
    outbox_seaorm::enqueue(&txn, &event).await?;
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    Ok(())
}

/// Builds an event, or fails to.
type Build<'a> = Box<dyn FnOnce() -> outbox_seaorm::Result<NewEvent> + 'a>;

/// A payload whose `Serialize` fails (JSON object keys must be strings).
fn unserializable() -> HashMap<(u8, u8), &'static str> {
    HashMap::from([((1, 2), "tuple keys are not JSON object keys")])
}

async fn invalid_events_are_typed_errors_and_leave_no_rows(t: TestDb) {
    create_shop_tables(&t).await;
    let too_long_id = "i".repeat(MAX_AGGREGATE_ID_LEN + 1);
    let too_long_type = "t".repeat(MAX_EVENT_TYPE_LEN + 1);
    let too_long_aggregate_type = "a".repeat(MAX_AGGREGATE_TYPE_LEN + 1);
    let too_big = "x".repeat(DEFAULT_MAX_PAYLOAD_BYTES);
    let payload = serde_json::json!({"total_minor": 4900});
    let cases: Vec<(&str, Build<'_>)> = vec![
        ("aggregate_id", Box::new(|| NewEvent::new("order", "", "order.placed", &payload))),
        ("aggregate_id", Box::new(|| NewEvent::new("order", "  ", "order.placed", &payload))),
        ("aggregate_id", Box::new(|| NewEvent::new("order", too_long_id.as_str(), "order.placed", &payload))),
        ("aggregate_id", Box::new(|| NewEvent::new("order", "o\n1", "order.placed", &payload))),
        ("event_type", Box::new(|| NewEvent::new("order", "o1", "", &payload))),
        ("event_type", Box::new(|| NewEvent::new("order", "o1", too_long_type.as_str(), &payload))),
        ("aggregate_type", Box::new(|| NewEvent::new(too_long_aggregate_type.as_str(), "o1", "t", &payload))),
        ("payload", Box::new(|| NewEvent::new("order", "o1", "order.placed", &too_big))),
        ("payload", Box::new(|| NewEvent::from_json("order", "o1", "order.placed", "{not json".to_owned()))),
        ("headers", Box::new(|| NewEvent::new("order", "o1", "t", &payload)?.with_header("", "v"))),
        ("serialize", Box::new(|| NewEvent::new("order", "o1", "order.placed", &unserializable()))),
        ("payload", Box::new(|| NewEvent::new("order", "o1", "t", &serde_json::json!({"note": "a\0b"})))),
        ("payload", Box::new(|| NewEvent::from_json("order", "o1", "t", r#"{"note":"\ud800"}"#.to_owned()))),
        ("payload", Box::new(|| NewEvent::new("order", "o1", "t", &"a bare string"))),
        ("payload", Box::new(|| NewEvent::new("order", "o1", "t", &[1, 2, 3]))),
        ("headers", Box::new(|| NewEvent::new("order", "o1", "t", &payload)?.with_header("note", "a\0b"))),
        ("headers", Box::new(|| NewEvent::new("order", "o1", "t", &payload)?.with_header("big", "x".repeat(2 << 20)))),
        ("schema_version", Box::new(|| NewEvent::new("order", "o1", "t", &payload)?.with_schema_version(-1))),
    ];
    for (expected, build) in cases {
        let err = place_order(&t, build).await.expect_err("the event must be rejected");
        match (&err, expected) {
            (Error::Serialize { event_type, .. }, "serialize") => assert_eq!(event_type, "order.placed", "{t}"),
            (Error::InvalidEvent { field, .. }, _) => assert_eq!(*field, expected, "{t}: {err}"),
            _ => panic!("{t}: expected a typed error for {expected}, got {err}"),
        }
        assert!(
            err.to_string().contains(if expected == "serialize" { "order.placed" } else { expected }),
            "{t}: {err}"
        );
    }
    assert_eq!(count_outbox(&t).await, 0, "{t}: no event row");
    assert_eq!(count_table(&t, "orders").await, 0, "{t}: and the business change rolled back with it");
}
per_backend!(invalid_events_are_typed_errors_and_leave_no_rows, "bad_events_write_nothing");

async fn a_rejected_event_leaves_the_callers_transaction_usable(t: TestDb) {
    // PostgreSQL aborts a transaction on any failed statement: the checks run before any SQL, so the
    // business change and a valid event still commit.
    create_shop_tables(&t).await;
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.execute_unprepared("INSERT INTO orders (id, customer, total_minor) VALUES ('o1', 'ann', 4900)")
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    let nul = NewEvent::new("order", "o1", "order.placed", &serde_json::json!({"note": "a\0b"}));
    assert!(matches!(nul, Err(Error::InvalidEvent { field: "payload", .. })), "{t}: {:?}", nul.err());
    let good = NewEvent::new("order", "o1", "order.placed", &serde_json::json!({"note": "ab"})).expect("valid");
    outbox_seaorm::enqueue(&txn, &good).await.unwrap_or_else(|e| panic!("{t}: the transaction is still usable: {e}"));
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((count_outbox(&t).await, count_table(&t, "orders").await), (1, 1), "{t}");
}
per_backend!(a_rejected_event_leaves_the_callers_transaction_usable, "bad_event_txn_usable");

async fn events_at_every_size_limit_fit_their_columns_and_round_trip(t: TestDb) {
    // Multi-byte characters: the limits are bytes, so these hold fewer characters than the columns do.
    let aggregate_type = "ä".repeat(MAX_AGGREGATE_TYPE_LEN / 2);
    let aggregate_id = "i".repeat(MAX_AGGREGATE_ID_LEN);
    let event_type = "t".repeat(MAX_EVENT_TYPE_LEN);
    // A JSON object of exactly the payload limit: `{"p":"` and `"}` around the text.
    let text = "p".repeat(DEFAULT_MAX_PAYLOAD_BYTES - 8);
    let payload = serde_json::json!({ "p": text });
    let e = NewEvent::new(aggregate_type.as_str(), aggregate_id.as_str(), event_type.as_str(), &payload)
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    let over = serde_json::json!({ "p": format!("{text}p") });
    assert!(NewEvent::new("order", "o1", "t", &over).is_err(), "{t}: one byte over the limit");
    enqueue_committed(&t, std::slice::from_ref(&e)).await;

    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.published, 1, "{t}: {pass:?}");
    let got = &broker.received()[0];
    assert_eq!(
        (got.aggregate_type.as_str(), got.aggregate_id.as_str(), got.event_type.as_str()),
        (aggregate_type.as_str(), aggregate_id.as_str(), event_type.as_str()),
        "{t}"
    );
    let back: serde_json::Value = got.decode().unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(back == payload, "{t}: the payload came back changed ({} bytes)", got.payload.len());
}
per_backend!(events_at_every_size_limit_fit_their_columns_and_round_trip, "limits_fit_their_columns");

async fn an_event_id_can_be_enqueued_only_once(t: TestDb) {
    let e = event("o1", "order.placed", 1);
    enqueue_committed(&t, std::slice::from_ref(&e)).await;
    let again =
        NewEvent::new("order", "o1", "order.placed", &serde_json::json!({"n": 2})).expect("valid").with_id(e.id());
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let err = outbox_seaorm::enqueue(&txn, &again).await.expect_err("a second row with the same id");
    assert!(matches!(err, Error::Store { table: "outbox_events", .. }), "{t}: {err}");
    txn.rollback().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(count_outbox(&t).await, 1, "{t}");
}
per_backend!(an_event_id_can_be_enqueued_only_once, "event_id_is_unique");

/// `Relay::new` with `config`, expecting `InvalidConfig` naming `field`.
fn assert_rejected(t: &TestDb, config: RelayConfig, field: &str) {
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), config.clone());
    match relay {
        Err(Error::InvalidConfig { field: got, .. }) => assert_eq!(got, field, "{t}: {config:?}"),
        Err(other) => panic!("{t}: expected InvalidConfig for {field}, got {other}"),
        Ok(_) => panic!("{t}: a relay was created with {config:?}"),
    }
}

async fn a_relay_with_out_of_range_settings_is_never_created(t: TestDb) {
    enqueue_committed(&t, &[event("o1", "order.placed", 1)]).await;
    assert_rejected(&t, RelayConfig::default().with_batch_size(0), "batch_size");
    assert_rejected(&t, RelayConfig::default().with_max_attempts(0), "max_attempts");
    assert_rejected(&t, RelayConfig::default().with_poll_interval(Duration::ZERO), "poll_interval");
    let short_lease = ClaimMode::Lease { duration: Duration::from_secs(5) };
    assert_rejected(&t, RelayConfig::default().with_claim_mode(short_lease), "claim_mode");
    // What once passed validation and then misbehaved: a lease that wrapped to an expired one, an uncapped
    // backoff whose 51st delay overflowed the clock.
    let endless_lease = ClaimMode::Lease { duration: Duration::MAX };
    assert_rejected(&t, RelayConfig::default().with_claim_mode(endless_lease), "claim_mode");
    let uncapped = outbox_seaorm::Backoff { initial: Duration::from_secs(1), max: Duration::MAX, multiplier: 2 };
    assert_rejected(&t, RelayConfig::default().with_backoff(uncapped), "backoff");
    assert_rejected(&t, RelayConfig::default().with_publish_timeout(Duration::MAX), "publish_timeout");
    // Nothing was claimed or touched.
    let stats = SeaOrmStore::new(t.db.clone()).stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.max_attempts), (1, 0), "{t}: {stats:?}");
}
per_backend!(a_relay_with_out_of_range_settings_is_never_created, "bad_relay_config");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_rejects_an_unsupported_url_scheme_before_connecting() {
    // A listener that counts as a connection attempt: nothing may reach it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let http = format!("http://127.0.0.1:{port}/test");
    let sqlite_ish = format!("sqlite-ish://127.0.0.1:{port}");
    for url in ["redis://x", http.as_str(), "", sqlite_ish.as_str()] {
        match outbox_seaorm::connect(url).await {
            Err(Error::InvalidConfig { field, reason }) => {
                assert_eq!(field, "database_url", "{url:?}");
                assert!(
                    reason.contains("postgres") && reason.contains("sqlite"),
                    "{url:?}: lists the schemes: {reason}"
                );
            }
            Err(other) => panic!("{url:?}: expected InvalidConfig, got {other}"),
            Ok(_) => panic!("{url:?}: connected"),
        }
    }
    // A connection attempt would be waiting in the listener's backlog by now.
    let attempted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(attempted.is_err(), "a connection was attempted: {attempted:?}");
    let err = outbox_seaorm::connect("redis://x").await.expect_err("rejected");
    assert!(err.to_string().contains("\"redis\""), "names the scheme: {err}");
}

//! A first end-to-end pass on every backend.

use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{InMemoryPublisher, NewEvent, Relay, RelayConfig, SeaOrmStore};
use sea_orm::TransactionTrait;

async fn an_enqueued_event_is_published_once_and_counted(t: TestDb) {
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let event = NewEvent::new("order", "o1", "order.placed", &serde_json::json!({"total": 5})).expect("valid");
    outbox_seaorm::enqueue(&txn, &event).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let store = SeaOrmStore::new(t.db.clone());
    let stats = store.stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(stats.pending, 1, "{t}");
    let broker = InMemoryPublisher::new();
    let relay = Relay::new(store, broker.clone(), RelayConfig::default()).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.published, 1, "{t}: {pass:?}");
    let payload: serde_json::Value = serde_json::from_str(&broker.received()[0].payload).expect("JSON");
    assert_eq!(payload, serde_json::json!({"total": 5}), "{t}");
    assert_eq!(relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}")).claimed, 0, "{t}");
    let stats = relay.store().stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(stats.pending, 0, "{t}");
}
per_backend!(an_enqueued_event_is_published_once_and_counted, "smoke");

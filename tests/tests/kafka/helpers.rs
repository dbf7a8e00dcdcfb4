//! Helpers the Kafka tests share (`broker_kafka.rs` against tansu, `broker_kafka_mock.rs` against
//! librdkafka's mock cluster): the `parcel.shipped` event, the `kafka_shipping` consumer with its
//! `#[idempotent_handler]` effect, and reading committed offsets.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_integration_tests::TestDb;
use outbox_seaorm::brokers::kafka::{KafkaTransport, Subscription};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{Backoff, Consumer, ConsumerConfig, Destination, InboxOutcome, NewEvent, Received};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "parcel.shipped", version = 1, aggregate = "parcel")]
pub struct ParcelShipped {
    #[aggregate_id]
    pub parcel_id: String,
    pub n: i64,
}

/// The effect: one shipment row per applied event (no unique key: only the inbox prevents doubles).
#[idempotent_handler]
async fn record_shipment(txn: &DatabaseTransaction, event: ParcelShipped) -> Result<i64, DbErr> {
    let sql = format!("INSERT INTO kafka_shipments (parcel_id, n) VALUES ('{}', {})", event.parcel_id, event.n);
    txn.execute_unprepared(&sql).await?;
    Ok(event.n)
}

pub async fn create_shipments(t: &TestDb) {
    let sql = "CREATE TABLE kafka_shipments (parcel_id VARCHAR(64) NOT NULL, n BIGINT NOT NULL)";
    t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
}

/// A `parcel.shipped` event of `parcel`.
pub fn shipped(parcel: &str, n: i64) -> NewEvent {
    ParcelShipped { parcel_id: parcel.to_owned(), n }.to_new_event().expect("valid event")
}

/// A topic name no other test (or earlier run against the same broker) uses.
pub fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

/// Every event goes to `topic`.
pub fn to(topic: &str) -> Destination {
    Destination::fixed(topic).expect("topic")
}

/// `(parcel, n)` of every event the handler applied (first applications), in commit order.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<(String, i64)>>>);

impl Seen {
    pub fn all(&self) -> Vec<(String, i64)> {
        self.0.lock().expect("seen").clone()
    }
}

/// Fast retries and short fetch waits.
pub fn consumer_config() -> ConsumerConfig {
    ConsumerConfig::default()
        .with_backoff(Backoff { initial: Duration::from_millis(50), max: Duration::from_millis(200), multiplier: 2 })
        .with_fetch_wait(Duration::from_millis(200))
}

/// The consumer `kafka_shipping`: the `#[idempotent_handler]` on `db`; `fail(event, delivery)` makes a
/// delivery fail before the effect.
pub fn shipping(
    db: &DatabaseConnection,
    seen: &Seen,
    fail: impl Fn(&ParcelShipped, u32) -> bool + Send + Sync + 'static,
) -> Consumer {
    let (db, seen, fail) = (db.clone(), seen.clone(), Arc::new(fail));
    let handler = move |received: Received<ParcelShipped>| {
        let (db, seen, fail) = (db.clone(), seen.clone(), fail.clone());
        async move {
            if fail(&received.event, received.delivery) {
                return Err(format!("injected failure of n={}", received.event.n));
            }
            let outcome = outbox_seaorm::deliver(&db, "kafka_shipping", &received.envelope, record_shipment)
                .await
                .map_err(|e| e.to_string())?;
            if let InboxOutcome::Processed(n) = &outcome {
                seen.0.lock().expect("seen").push((received.event.parcel_id.clone(), *n));
            }
            Ok::<_, String>(outcome)
        }
    };
    Consumer::new("kafka_shipping").with_config(consumer_config()).on::<ParcelShipped>(handler)
}

/// Waits until `check` holds, at most `limit`.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The committed offsets of `group` on `topic` (partitions `0..partitions`).
pub async fn committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<(String, i32, i64)> {
    let probe = KafkaTransport::connect(bootstrap, group, assignment(topic, partitions), &[]).expect("probe");
    probe.committed(Duration::from_secs(5)).await.expect("committed")
}

/// Partitions `0..partitions` of `topic`, assigned directly (no group join).
pub fn assignment(topic: &str, partitions: i32) -> Subscription {
    Subscription::Partitions((0..partitions).map(|p| (topic.to_owned(), p)).collect())
}

/// The sum of the committed offsets: in fresh topics, how many messages were committed past.
pub fn committed_total(committed: &[(String, i32, i64)]) -> i64 {
    committed.iter().map(|(_, _, offset)| offset).sum()
}

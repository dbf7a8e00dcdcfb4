//! The Kafka adapter end to end: outbox rows → `Relay` + `KafkaPublisher` → Kafka → `KafkaConsumer` → an
//! `#[idempotent_handler]` that writes an effect row.
//!
//! - Against a real Kafka-protocol broker (tansu on 127.0.0.1:9092, started by `.ci/kafka.sh start`;
//!   skipped when absent outside CI): round trip on every backend, per-aggregate order for 1,000 events,
//!   a message without an envelope is parked.
//! - Against librdkafka's in-process mock cluster (always runs): broker down and back, a lost ack, bad
//!   input, a message over `message.max.bytes`, a handler retry, a group subscription. The
//!   unreachable-broker test uses the mock cluster rather than the `Proxy`: tansu advertises its own
//!   address (127.0.0.1:9092) in the metadata, so after bootstrapping through a proxy the client talks to
//!   the broker directly (checked: a publish after `Proxy::cut` still succeeded); the mock cluster's
//!   `broker_down` does cut it off.
//!
//! Consumers of tansu use direct partition assignment: a consumer-group join there takes about 23 s.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use common::{CAP, after, assert_per_aggregate_order, count_inbox, count_table, count_unpublished, fast_config};
use outbox_integration_tests::proxy::server_available;
use outbox_integration_tests::{TestDb, all_backends};
use outbox_seaorm::brokers::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_seaorm::brokers::kafka::rdkafka::client::DefaultClientContext;
use outbox_seaorm::brokers::kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use outbox_seaorm::brokers::kafka::rdkafka::message::{Headers as _, Message as _};
use outbox_seaorm::brokers::kafka::rdkafka::mocking::MockCluster;
use outbox_seaorm::brokers::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_seaorm::brokers::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use outbox_seaorm::brokers::kafka::{KafkaConsumer, KafkaPublisher, Subscription, default_destination};
use outbox_seaorm::entity::outbox_event;
use outbox_seaorm::prelude::*;
use outbox_seaorm::{
    CancellationToken, Destination, Disposition, Error, MessageHandler, NewEvent, OutboxEvent, PublishError, Publisher,
    disposition,
};
use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait, QueryFilter};
use serde::{Deserialize, Serialize};

const TANSU: &str = "127.0.0.1:9092";

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "parcel.shipped", version = 1, aggregate = "parcel")]
struct ParcelShipped {
    #[aggregate_id]
    parcel_id: String,
    n: i64,
}

/// The effect: one shipment row per applied event (no unique key: only the inbox prevents doubles).
#[idempotent_handler(consumer = "kafka_shipping")]
async fn record_shipment(txn: &DatabaseTransaction, event: ParcelShipped) -> Result<i64, DbErr> {
    let sql = format!("INSERT INTO kafka_shipments (parcel_id, n) VALUES ('{}', {})", event.parcel_id, event.n);
    txn.execute_unprepared(&sql).await?;
    Ok(event.n)
}

async fn create_shipments(t: &TestDb) {
    let sql = "CREATE TABLE kafka_shipments (parcel_id VARCHAR(64) NOT NULL, n BIGINT NOT NULL)";
    t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
}

fn shipped(parcel: &str, n: i64) -> NewEvent {
    ParcelShipped { parcel_id: parcel.to_owned(), n }.to_new_event().expect("valid event")
}

/// A topic name no other test (or earlier run against the same broker) uses.
fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

/// Every event goes to `topic`.
fn to(topic: &str) -> Destination {
    Destination::fixed(topic).expect("topic")
}

/// What the consumer's handler saw, in arrival order, and what it decided.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(OutboxEvent, Disposition)>>>);

impl Seen {
    fn acked(&self) -> Vec<OutboxEvent> {
        let seen = self.0.lock().expect("seen");
        seen.iter().filter(|(_, d)| *d == Disposition::Ack).map(|(e, _)| e.clone()).collect()
    }

    fn len(&self) -> usize {
        self.0.lock().expect("seen").len()
    }
}

/// The consumer's handler: the `#[idempotent_handler]` on `db`, its result mapped to a disposition, and
/// every call recorded in `seen`.
fn shipping_handler(
    db: DatabaseConnection,
    seen: Seen,
) -> impl Fn(OutboxEvent) -> std::pin::Pin<Box<dyn Future<Output = Disposition> + Send>> + Send + Sync + 'static {
    move |event: OutboxEvent| {
        let db = db.clone();
        let seen = seen.clone();
        Box::pin(async move {
            let d = disposition(&record_shipment(&db, &event).await);
            seen.0.lock().expect("seen").push((event, d));
            d
        })
    }
}

/// Runs `consumer` with `handler` in a task until the returned token is cancelled.
fn spawn_consumer<H: MessageHandler>(
    consumer: Arc<KafkaConsumer>,
    handler: H,
) -> (CancellationToken, tokio::task::JoinHandle<outbox_seaorm::Result<()>>) {
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    (shutdown, tokio::spawn(async move { consumer.run(handler, token).await }))
}

async fn stop(shutdown: CancellationToken, task: tokio::task::JoinHandle<outbox_seaorm::Result<()>>) {
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(15), task).await;
    result.expect("consumer stops within 15 s").expect("consumer task").expect("consumer run");
}

/// Waits until `check` holds, at most `limit`.
async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
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

fn assignment(topic: &str, partitions: i32) -> Subscription {
    Subscription::Partitions((0..partitions).map(|p| (topic.to_owned(), p)).collect())
}

async fn create_topics(bootstrap: &str, topics: &[(&str, i32)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
    let new: Vec<NewTopic<'_>> =
        topics.iter().map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1))).collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin.create_topics(&new, &options).await.expect("create topics");
    for result in results {
        result.unwrap_or_else(|(topic, code)| panic!("create topic {topic}: {code:?}"));
    }
}

/// `(partition, offset, key, payload, headers)` of every message in `topic` (partitions `0..partitions`).
type Raw = (i32, i64, Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, String)>);

fn read_all(bootstrap: &str, topic: &str, partitions: i32, expected: usize) -> Vec<Raw> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("kafka-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition_offset(topic, p, Offset::Beginning).expect("partition");
    }
    consumer.assign(&list).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < expected && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let headers = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned()))
                        .collect()
                })
                .unwrap_or_default();
            out.push((
                m.partition(),
                m.offset(),
                m.key().map(<[u8]>::to_vec),
                m.payload().map(<[u8]>::to_vec),
                headers,
            ));
        }
    }
    out
}

async fn outbox_row(t: &TestDb, id: outbox_seaorm::EventId) -> outbox_event::Model {
    outbox_event::Entity::find()
        .filter(outbox_event::Column::EventId.eq(id.to_string()))
        .one(&t.db)
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"))
        .unwrap_or_else(|| panic!("{t}: no row for {id}"))
}

fn committed_total(committed: &[(String, i32, i64)]) -> i64 {
    committed.iter().map(|(_, _, offset)| offset).sum()
}

// ---------------------------------------------------------------------------------------------------------
// Against tansu (a real Kafka-protocol broker).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_round_trip_applies_each_event_once_and_commits_after_the_handler() {
    if !server_available("Kafka", TANSU).await {
        return;
    }
    for t in all_backends("kafka_round_trip").await {
        create_shipments(&t).await;
        let topic = unique("kafka-round-trip");
        create_topics(TANSU, &[(&topic, 3)]).await;
        let events: Vec<NewEvent> = (0..30).map(|i| shipped(&format!("p{}", i % 6), i)).collect();
        outbox_seaorm::enqueue_all(&t.db, &events).await.unwrap_or_else(|e| panic!("{t}: {e}"));

        let publisher = KafkaPublisher::connect(&format!("kafka://{TANSU}"), to(&topic), &[]).expect("publisher");
        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
        let passes = relay.drain(100).await.unwrap_or_else(|e| panic!("{t}: relay: {e}"));
        assert_eq!(passes.iter().map(|p| p.published).sum::<u64>(), 30, "{t}: {passes:?}");
        assert_eq!(count_unpublished(&t).await, 0, "{t}");

        // The broker has them with the envelope in the headers, keyed by aggregate id.
        let raw = read_all(TANSU, &topic, 3, 30);
        assert_eq!(raw.len(), 30, "{t}");
        let (_, _, key, payload, headers) = &raw[0];
        let payload: serde_json::Value = serde_json::from_slice(payload.as_deref().expect("payload")).expect("JSON");
        assert_eq!(key.as_deref(), Some(payload["parcel_id"].as_str().expect("parcel_id").as_bytes()), "{t}");
        let names: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
        for name in ["ce_id", "ce_type", "ce_subject", "ce_specversion", "outbox_schema_version"] {
            assert!(names.contains(&name), "{t}: header {name} missing from {names:?}");
        }

        let consumer = KafkaConsumer::connect(TANSU, &unique("kafka-billing"), assignment(&topic, 3), &[])
            .expect("consumer")
            .with_retry_delay(Duration::from_millis(100));
        let consumer = Arc::new(consumer);
        let seen = Seen::default();
        let (shutdown, task) = spawn_consumer(consumer.clone(), shipping_handler(t.db.clone(), seen.clone()));
        eventually("30 shipments", Duration::from_secs(20), || async {
            count_table(&t, "kafka_shipments").await == 30
        })
        .await;
        stop(shutdown, task).await;

        assert_eq!(seen.acked().len(), 30, "{t}: each message handled once");
        assert_eq!(count_table(&t, "kafka_shipments").await, 30, "{t}");
        assert_eq!(count_inbox(&t, "kafka_shipping").await, 30, "{t}");
        assert_per_aggregate_order(&seen.acked(), &t);
        // Offsets were committed past every handled message (offsets start at 0 in a fresh topic).
        let committed = consumer.committed(Duration::from_secs(5)).await.expect("committed");
        assert_eq!(committed_total(&committed), 30, "{t}: {committed:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_keeps_per_aggregate_order_for_1000_events_over_50_aggregates() {
    if !server_available("Kafka", TANSU).await {
        return;
    }
    let t = all_backends("kafka_order").await.swap_remove(0);
    create_shipments(&t).await;
    let topic = unique("kafka-order");
    create_topics(TANSU, &[(&topic, 4)]).await;
    // Round-robin over the aggregates, so every batch holds many aggregates.
    let events: Vec<NewEvent> = (0..1000).map(|i| shipped(&format!("p{}", i % 50), i)).collect();
    outbox_seaorm::enqueue_all(&t.db, &events).await.unwrap_or_else(|e| panic!("{t}: {e}"));

    let seen = Seen::default();
    let consumer = KafkaConsumer::connect(TANSU, &unique("kafka-order"), assignment(&topic, 4), &[])
        .expect("consumer")
        .with_retry_delay(Duration::from_millis(100));
    let consumer = Arc::new(consumer);
    let recorder = {
        let seen = seen.clone();
        move |event: OutboxEvent| {
            let seen = seen.clone();
            async move {
                seen.0.lock().expect("seen").push((event, Disposition::Ack));
                Disposition::Ack
            }
        }
    };
    let (shutdown, task) = spawn_consumer(consumer.clone(), recorder);

    let started = Instant::now();
    let publisher = KafkaPublisher::connect(TANSU, to(&topic), &[]).expect("publisher");
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config().with_batch_size(500)).expect("relay");
    let passes = relay.drain(1000).await.unwrap_or_else(|e| panic!("{t}: relay: {e}"));
    let relayed = started.elapsed();
    assert_eq!(passes.iter().map(|p| p.published).sum::<u64>(), 1000, "{t}");
    eventually("1000 messages at the consumer", Duration::from_secs(30), || async { seen.len() >= 1000 }).await;
    let consumed = started.elapsed();
    stop(shutdown, task).await;
    eprintln!(
        "kafka order: relayed 1000 events in {} passes in {relayed:?}, all consumed after {consumed:?}",
        passes.len()
    );

    let received = seen.acked();
    assert_eq!(received.len(), 1000, "{t}: no duplicates, nothing lost");
    assert_per_aggregate_order(&received, &t);
    for aggregate in 0..50 {
        let ns: Vec<i64> = received
            .iter()
            .filter(|e| e.aggregate_id == format!("p{aggregate}"))
            .map(|e| ParcelShipped::from_envelope(e).expect("decodes").n)
            .collect();
        let expected: Vec<i64> = (0..20).map(|k| aggregate + 50 * k).collect();
        assert_eq!(ns, expected, "{t}: aggregate p{aggregate} in enqueue order");
    }
    let committed = consumer.committed(Duration::from_secs(5)).await.expect("committed");
    assert_eq!(committed_total(&committed), 1000, "{t}: {committed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_parks_a_message_without_an_envelope_and_processes_the_next() {
    if !server_available("Kafka", TANSU).await {
        return;
    }
    let t = all_backends("kafka_park").await.swap_remove(0);
    create_shipments(&t).await;
    let topic = unique("kafka-park");
    let dlq = format!("{topic}.dlq");
    create_topics(TANSU, &[(&topic, 1), (&dlq, 1)]).await;

    // A message from a producer that knows nothing about the outbox: no envelope headers.
    let raw: FutureProducer = ClientConfig::new().set("bootstrap.servers", TANSU).create().expect("producer");
    raw.send(FutureRecord::to(&topic).key("p1").payload("{\"hello\":1}"), Duration::from_secs(5))
        .await
        .expect("raw message delivered");
    outbox_seaorm::enqueue_all(&t.db, &[shipped("p1", 1), shipped("p2", 2)]).await.expect("enqueue");
    let publisher = KafkaPublisher::connect(TANSU, to(&topic), &[]).expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    relay.drain(10).await.expect("relay");

    let consumer = KafkaConsumer::connect(TANSU, &unique("kafka-park"), assignment(&topic, 1), &[])
        .expect("consumer")
        .with_retry_delay(Duration::from_millis(100))
        .with_dead_letter_suffix(".dlq")
        .expect("dead letters");
    let consumer = Arc::new(consumer);
    let seen = Seen::default();
    let (shutdown, task) = spawn_consumer(consumer.clone(), shipping_handler(t.db.clone(), seen.clone()));
    eventually("2 shipments", Duration::from_secs(20), || async { count_table(&t, "kafka_shipments").await == 2 })
        .await;
    stop(shutdown, task).await;

    assert_eq!(seen.len(), 2, "{t}: the raw message never reached the handler");
    let committed = consumer.committed(Duration::from_secs(5)).await.expect("committed");
    assert_eq!(committed, vec![(topic.clone(), 0, 3)], "{t}: committed past the parked message and both events");
    let parked = read_all(TANSU, &dlq, 1, 1);
    assert_eq!(parked.len(), 1, "{t}: the raw message is in {dlq}");
    let (_, _, key, payload, headers) = &parked[0];
    assert_eq!((key.as_deref(), payload.as_deref()), (Some(&b"p1"[..]), Some(&b"{\"hello\":1}"[..])), "{t}");
    let reason = headers.iter().find(|(k, _)| k == "outbox_park_reason").map(|(_, v)| v.as_str());
    assert!(reason.is_some_and(|r| r.contains("`ce_id`")), "{t}: {headers:?}");
}

// ---------------------------------------------------------------------------------------------------------
// Against librdkafka's mock cluster (in process, no server).

struct Mock {
    cluster: MockCluster<'static, outbox_seaorm::brokers::kafka::rdkafka::producer::DefaultProducerContext>,
    bootstrap: String,
}

fn mock(topics: &[(&str, i32)]) -> Mock {
    let cluster = MockCluster::new(1).expect("mock cluster");
    for (topic, partitions) in topics {
        cluster.create_topic(topic, *partitions, 1).expect("mock topic");
    }
    let bootstrap = cluster.bootstrap_servers();
    Mock { cluster, bootstrap }
}

fn mock_publisher(m: &Mock, destination: Destination, extra: &[(&str, &str)]) -> KafkaPublisher {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &m.bootstrap);
    for (key, value) in extra {
        config.set(*key, *value);
    }
    KafkaPublisher::from_config(config, destination).expect("publisher")
}

fn mock_consumer(m: &Mock, topic: &str, partitions: i32) -> Arc<KafkaConsumer> {
    let consumer = KafkaConsumer::connect(&m.bootstrap, &unique("kafka-mock"), assignment(topic, partitions), &[])
        .expect("consumer")
        .with_retry_delay(Duration::from_millis(50));
    Arc::new(consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_broker_down_keeps_rows_pending_and_the_backlog_drains_when_it_returns() {
    let t = all_backends("kafka_broker_down").await.swap_remove(0);
    create_shipments(&t).await;
    let topic = unique("kafka-down");
    let m = mock(&[(&topic, 2)]);
    let publisher = mock_publisher(
        &m,
        to(&topic),
        &[("message.timeout.ms", "1500"), ("reconnect.backoff.ms", "50"), ("reconnect.backoff.max.ms", "200")],
    );
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");

    // Up: the first event goes through (and the producer has its connection and producer id).
    outbox_seaorm::enqueue(&t.db, &shipped("p0", 0)).await.expect("enqueue");
    assert_eq!(relay.run_once().await.expect("pass").published, 1);

    m.cluster.broker_down(-1).expect("broker down");
    let events: Vec<NewEvent> = (1..=10).map(|i| shipped(&format!("p{i}"), i)).collect();
    outbox_seaorm::enqueue_all(&t.db, &events).await.expect("enqueue");
    let now = Utc::now();
    let started = Instant::now();
    let pass = relay.run_once_at(now).await.expect("a failed publish is not a relay error");
    eprintln!("kafka broker down: the pass failed after {:?}: {pass:?}", started.elapsed());
    assert_eq!((pass.claimed, pass.published, pass.failed, pass.dead), (10, 0, 10, 0), "{t}: {pass:?}");
    assert_eq!(count_unpublished(&t).await, 10, "{t}: the rows stay pending");
    let row = outbox_row(&t, events[0].id()).await;
    assert!(row.last_error.as_deref().is_some_and(|e| e.contains("Kafka did not acknowledge")), "{t}: {row:?}");

    m.cluster.broker_up(-1).expect("broker up");
    let mut published = 0;
    let mut at = after(now, CAP);
    for _ in 0..5 {
        published += relay.run_once_at(at).await.expect("pass").published;
        if published == 10 {
            break;
        }
        at = after(at, CAP);
    }
    eprintln!("kafka broker down: drained after {:?}", started.elapsed());
    assert_eq!(published, 10, "{t}: the backlog drained once the broker was back");
    assert_eq!(count_unpublished(&t).await, 0, "{t}");

    // Nothing lost: every event arrives (a publish that timed out may also have landed: the inbox absorbs it).
    let consumer = mock_consumer(&m, &topic, 2);
    let seen = Seen::default();
    let (shutdown, task) = spawn_consumer(consumer, shipping_handler(t.db.clone(), seen.clone()));
    eventually("11 shipments", Duration::from_secs(20), || async { count_table(&t, "kafka_shipments").await == 11 })
        .await;
    stop(shutdown, task).await;
    eprintln!("kafka broker down: consumed after {:?}", started.elapsed());
    assert_eq!(count_inbox(&t, "kafka_shipping").await, 11, "{t}");
}

/// Reports the first batch as failed although the broker acknowledged it (an ack lost on the way back).
struct LosesFirstAck {
    inner: KafkaPublisher,
    lost: Mutex<bool>,
}

impl Publisher for LosesFirstAck {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let results = self.inner.publish(events).await;
        let mut lost = self.lost.lock().expect("lost");
        if *lost {
            return results;
        }
        *lost = true;
        assert!(results.iter().all(Result::is_ok), "delivered: {results:?}");
        vec![Err(PublishError::transient("ack lost after delivery")); events.len()]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_lost_ack_republish_is_absorbed_by_the_inbox() {
    let t = all_backends("kafka_lost_ack").await.swap_remove(0);
    create_shipments(&t).await;
    let topic = unique("kafka-lost-ack");
    let m = mock(&[(&topic, 2)]);
    let events: Vec<NewEvent> = (0..5).map(|i| shipped(&format!("p{i}"), i)).collect();
    outbox_seaorm::enqueue_all(&t.db, &events).await.expect("enqueue");
    let publisher = LosesFirstAck { inner: mock_publisher(&m, to(&topic), &[]), lost: Mutex::new(false) };
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    let now = Utc::now();
    let first = relay.run_once_at(now).await.expect("pass");
    assert_eq!((first.published, first.failed), (0, 5), "{t}: {first:?}");
    let second = relay.run_once_at(after(now, CAP)).await.expect("pass");
    assert_eq!(second.published, 5, "{t}: {second:?}");

    let consumer = mock_consumer(&m, &topic, 2);
    let seen = Seen::default();
    let (shutdown, task) = spawn_consumer(consumer.clone(), shipping_handler(t.db.clone(), seen.clone()));
    eventually("10 deliveries", Duration::from_secs(20), || async { seen.len() == 10 }).await;
    stop(shutdown, task).await;
    assert_eq!(seen.acked().len(), 10, "{t}: duplicates are acked too");
    assert_eq!(count_table(&t, "kafka_shipments").await, 5, "{t}: each effect once");
    assert_eq!(count_inbox(&t, "kafka_shipping").await, 5, "{t}");
    let committed = consumer.committed(Duration::from_secs(5)).await.expect("committed");
    assert_eq!(committed_total(&committed), 10, "{t}: {committed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_bad_input_is_a_clear_error_or_a_dead_row() {
    // Configuration mistakes are errors before anything runs.
    for (bootstrap, expected) in [
        ("kafka://", "has no host"),
        ("kafka//127.0.0.1:9092", "'/'"),
        ("kafka://127.0.0.1:nine", "port \"nine\""),
        ("amqp://127.0.0.1:5672", "scheme \"amqp\""),
    ] {
        let error = KafkaPublisher::connect(bootstrap, default_destination(), &[]).expect_err(bootstrap);
        assert!(matches!(error, Error::InvalidConfig { .. }), "{bootstrap}: {error}");
        assert!(error.to_string().contains(expected), "{bootstrap}: {error}");
        let error = KafkaConsumer::connect(bootstrap, "g", assignment("t", 1), &[]).expect_err(bootstrap);
        assert!(error.to_string().contains(expected), "{bootstrap}: {error}");
    }
    let template = Destination::parse("orders/{aggregate_type}").expect("a valid template");
    let error = KafkaPublisher::connect("127.0.0.1:9092", template, &[]).expect_err("invalid topic literal");
    assert!(error.to_string().contains("cannot make a valid Kafka topic name"), "{error}");
    let error = KafkaPublisher::connect("127.0.0.1:9092", default_destination(), &[("acks", "maybe")])
        .expect_err("invalid librdkafka setting");
    assert!(error.to_string().contains("acks"), "{error}");

    // A rendered topic Kafka would refuse: that event is dead at once, its neighbour is published.
    let t = all_backends("kafka_bad_input").await.swap_remove(0);
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let m = mock(&[(&format!("parcel.p1.{suffix}"), 1)]);
    let destination = Destination::parse(&format!("{{aggregate_type}}.{{aggregate_id}}.{suffix}")).expect("template");
    let publisher = mock_publisher(&m, destination, &[]);
    let bad = shipped("p/1", 1);
    let good = shipped("p1", 2);
    outbox_seaorm::enqueue_all(&t.db, &[bad.clone(), good.clone()]).await.expect("enqueue");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    let pass = relay.run_once().await.expect("pass");
    assert_eq!((pass.published, pass.dead), (1, 1), "{t}: {pass:?}");
    let row = outbox_row(&t, bad.id()).await;
    assert!(row.dead_at_ms.is_some(), "{t}: {row:?}");
    let error = row.last_error.unwrap_or_default();
    assert!(
        error.contains(&format!("invalid Kafka topic \"parcel.p/1.{suffix}\"")) && error.contains("'/'"),
        "{t}: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_message_over_max_bytes_is_a_dead_row() {
    let t = all_backends("kafka_too_large").await.swap_remove(0);
    let topic = unique("kafka-too-large");
    let m = mock(&[(&topic, 1)]);
    let publisher = mock_publisher(&m, to(&topic), &[("message.max.bytes", "10000")]);
    let large = NewEvent::new("parcel", "p1", "parcel.shipped", &serde_json::json!({"blob": "x".repeat(20_000)}))
        .expect("event");
    let small = shipped("p2", 1);
    outbox_seaorm::enqueue_all(&t.db, &[large.clone(), small]).await.expect("enqueue");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    let pass = relay.run_once().await.expect("pass");
    assert_eq!((pass.published, pass.dead), (1, 1), "{t}: {pass:?}");
    let row = outbox_row(&t, large.id()).await;
    assert!(row.dead_at_ms.is_some(), "{t}: {row:?}");
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("over message.max.bytes (10000 bytes here"), "{t}: {error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_retry_redelivers_the_message_before_the_next_one() {
    let t = all_backends("kafka_retry").await.swap_remove(0);
    create_shipments(&t).await;
    let topic = unique("kafka-retry");
    let m = mock(&[(&topic, 1)]);
    let events: Vec<NewEvent> = (0..6).map(|i| shipped("p1", i)).collect();
    outbox_seaorm::enqueue_all(&t.db, &events).await.expect("enqueue");
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), mock_publisher(&m, to(&topic), &[]), fast_config()).expect("relay");
    relay.drain(20).await.expect("relay");

    // The handler fails event n=2 twice (its transaction rolled back), then succeeds.
    let failures = Arc::new(Mutex::new(2));
    let seen = Seen::default();
    let inner = shipping_handler(t.db.clone(), seen.clone());
    let seen_failures = seen.clone();
    let consumer = mock_consumer(&m, &topic, 1);
    let (probe, committed_at_retry) = (consumer.clone(), Arc::new(Mutex::new(Vec::new())));
    let committed_at_retry_log = committed_at_retry.clone();
    let handler = move |event: OutboxEvent| {
        let fail = ParcelShipped::from_envelope(&event).is_ok_and(|e| e.n == 2) && {
            let mut left = failures.lock().expect("failures");
            *left > 0 && {
                *left -= 1;
                true
            }
        };
        let seen = seen_failures.clone();
        let run = inner(event.clone());
        let (probe, log) = (probe.clone(), committed_at_retry_log.clone());
        async move {
            if fail {
                let committed = probe.committed(Duration::from_secs(5)).await.expect("committed");
                log.lock().expect("log").push(committed_total(&committed));
                seen.0.lock().expect("seen").push((event, Disposition::Retry));
                return Disposition::Retry;
            }
            run.await
        }
    };
    let (shutdown, task) = spawn_consumer(consumer.clone(), handler);
    eventually("6 shipments", Duration::from_secs(20), || async { count_table(&t, "kafka_shipments").await == 6 })
        .await;
    stop(shutdown, task).await;

    let calls: Vec<(i64, Disposition)> = seen
        .0
        .lock()
        .expect("seen")
        .iter()
        .map(|(e, d)| (ParcelShipped::from_envelope(e).expect("decodes").n, *d))
        .collect();
    let acked: Vec<i64> = calls.iter().filter(|(_, d)| *d == Disposition::Ack).map(|(n, _)| *n).collect();
    assert_eq!(acked, [0, 1, 2, 3, 4, 5], "{t}: the retried message came back before the next one: {calls:?}");
    assert_eq!(calls.iter().filter(|(_, d)| *d == Disposition::Retry).count(), 2, "{t}: {calls:?}");
    let during = committed_at_retry.lock().expect("log").clone();
    assert!(during.iter().all(|&offset| offset <= 2), "{t}: nothing committed past the failing message: {during:?}");
    let committed = consumer.committed(Duration::from_secs(5)).await.expect("committed");
    assert_eq!(committed, vec![(topic.clone(), 0, 6)], "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_group_subscription_consumes_and_commits() {
    let t = all_backends("kafka_group").await.swap_remove(0);
    create_shipments(&t).await;
    let topic = unique("kafka-group");
    let m = mock(&[(&topic, 2)]);
    let events: Vec<NewEvent> = (0..8).map(|i| shipped(&format!("p{i}"), i)).collect();
    outbox_seaorm::enqueue_all(&t.db, &events).await.expect("enqueue");
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), mock_publisher(&m, to(&topic), &[]), fast_config()).expect("relay");
    relay.drain(20).await.expect("relay");

    let started = Instant::now();
    let consumer = KafkaConsumer::connect(
        &m.bootstrap,
        &unique("kafka-group"),
        Subscription::Topics(vec![topic.clone()]),
        &[("session.timeout.ms", "6000"), ("heartbeat.interval.ms", "500")],
    )
    .expect("consumer");
    let consumer = Arc::new(consumer);
    let seen = Seen::default();
    let (shutdown, task) = spawn_consumer(consumer.clone(), shipping_handler(t.db.clone(), seen.clone()));
    eventually("8 shipments", Duration::from_secs(30), || async { count_table(&t, "kafka_shipments").await == 8 })
        .await;
    eprintln!("kafka group: joined and consumed 8 messages in {:?}", started.elapsed());
    stop(shutdown, task).await;
    let committed = consumer.committed(Duration::from_secs(5)).await.expect("committed");
    assert_eq!(committed_total(&committed), 8, "{t}: {committed:?}");
}

//! The RabbitMQ adapter against a real RabbitMQ (127.0.0.1:5672, guest/guest) and real databases: events
//! go outbox → relay → exchange → queue → consumer → inbox, each applied once, through a broker outage, lost
//! confirms, unroutable messages and undecodable ones; per-aggregate order holds at the consumer.

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use common::{CAP, after, count_inbox, count_published, count_table, enqueue_committed, fast_config, outbox_rows};
use outbox_integration_tests::proxy::{Proxy, server_available};
use outbox_integration_tests::{TestDb, all_backends};
use outbox_seaorm::brokers::rabbitmq::{DEFAULT_ROUTING_KEY, RabbitConsumer, RabbitPublisher, lapin};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{
    CancellationToken, Destination, Disposition, Error, MessageHandler, OutboxEvent, PublishError, Publisher,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr};
use serde::{Deserialize, Serialize};

const RABBIT: &str = "127.0.0.1:5672";
const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const CONSUMER: &str = "rmq-shipping";

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "rmq.parcel.shipped", version = 1, aggregate = "parcel")]
struct ParcelShipped {
    #[aggregate_id]
    parcel_id: String,
    n: u64,
}

/// The consumer's effect: one `parcels_shipped` row per event, deliberately without a unique key, so only
/// the inbox keeps a redelivered event from shipping twice.
#[idempotent_handler(consumer = "rmq-shipping")]
async fn ship(txn: &DatabaseTransaction, event: ParcelShipped) -> Result<u64, DbErr> {
    let sql = format!("INSERT INTO parcels_shipped (parcel_id, n) VALUES ('{}', {})", event.parcel_id, event.n);
    txn.execute_unprepared(&sql).await?;
    Ok(event.n)
}

async fn create_effect_table(t: &TestDb) {
    let sql = "CREATE TABLE parcels_shipped (parcel_id VARCHAR(64) NOT NULL, n BIGINT NOT NULL)";
    t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
}

fn shipped(parcel: impl Into<String>, n: u64) -> NewEvent {
    ParcelShipped { parcel_id: parcel.into(), n }.to_new_event().expect("valid event")
}

/// What the consumer's handler saw.
#[derive(Default)]
struct Stats {
    calls: AtomicU64,
    processed: AtomicU64,
    duplicates: AtomicU64,
    parked: AtomicU64,
    /// `(parcel, n)` of each processed event, in processing order.
    applied: Mutex<Vec<(String, u64)>>,
}

impl Stats {
    fn processed(&self) -> u64 {
        self.processed.load(Ordering::SeqCst)
    }
    fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::SeqCst)
    }
    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
    fn parked(&self) -> u64 {
        self.parked.load(Ordering::SeqCst)
    }
}

/// The consumer side of a service: the idempotent handler, with the outcome counted.
#[derive(Clone)]
struct Shipping {
    db: DatabaseConnection,
    stats: Arc<Stats>,
}

impl MessageHandler for Shipping {
    async fn handle(&self, message: OutboxEvent) -> Disposition {
        self.stats.calls.fetch_add(1, Ordering::SeqCst);
        let result = ship(&self.db, &message).await;
        match &result {
            Ok(InboxOutcome::Processed(n)) => {
                self.stats.applied.lock().expect("stats lock").push((message.aggregate_id.clone(), *n));
                self.stats.processed.fetch_add(1, Ordering::SeqCst);
            }
            Ok(_) => {
                self.stats.duplicates.fetch_add(1, Ordering::SeqCst);
            }
            Err(_) => {}
        }
        let disposition = outbox_seaorm::disposition(&result);
        if disposition == Disposition::Park {
            self.stats.parked.fetch_add(1, Ordering::SeqCst);
        }
        disposition
    }
}

/// A consumer running in the background until [`Running::stop`].
struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<outbox_seaorm::Result<()>>,
}

impl Running {
    fn start(consumer: RabbitConsumer, handler: Shipping) -> Running {
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move { consumer.run(handler, token).await });
        Running { shutdown, task }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the consumer stops within 5 s of shutdown")
            .expect("the consumer task does not panic");
        result.expect("the consumer ends cleanly on shutdown");
    }
}

/// Waits until `done()` holds, panicking with `what` after `timeout`.
async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Async variant of [`wait_until`].
async fn wait_until_async<F: Future<Output = bool>>(what: &str, timeout: Duration, mut done: impl FnMut() -> F) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Unique exchange and queue names for one test run.
fn names(test: &str) -> (String, String) {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    (format!("rmq-test-{test}-x-{suffix}"), format!("rmq-test-{test}-q-{suffix}"))
}

async fn publisher(url: &str, exchange: &str) -> RabbitPublisher {
    let routing_key = Destination::parse(DEFAULT_ROUTING_KEY).expect("default template");
    RabbitPublisher::connect(url, exchange, routing_key).await.expect("connect the publisher")
}

async fn teardown(admin: &RabbitPublisher, exchange: &str, queues: &[&str]) {
    for queue in queues {
        admin.delete_queue(queue).await.unwrap_or_else(|e| panic!("delete queue {queue}: {e}"));
    }
    admin.delete_exchange(exchange).await.unwrap_or_else(|e| panic!("delete exchange {exchange}: {e}"));
}

/// Relay passes at `now` until one claims nothing.
async fn drain_at<P: Publisher>(relay: &Relay<SeaOrmStore, P>, now: chrono::DateTime<Utc>) -> u64 {
    let mut published = 0;
    for _ in 0..100 {
        let pass = relay.run_once_at(now).await.expect("relay pass");
        if pass.claimed == 0 {
            return published;
        }
        published += pass.published;
    }
    panic!("the relay did not drain within 100 passes");
}

async fn sqlite_only(test: &str) -> TestDb {
    all_backends(test)
        .await
        .into_iter()
        .find(|t| t.backend == DbBackend::Sqlite)
        .expect("all_backends always includes SQLite")
}

async fn raw_connection() -> lapin::Connection {
    lapin::Connection::connect(AMQP_URL, lapin::ConnectionProperties::default()).await.expect("raw lapin connection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_goes_through_rabbitmq_and_is_applied_once() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    for t in all_backends("rmq_round_trip").await {
        create_effect_table(&t).await;
        let (exchange, queue) = names("round-trip");
        let audit = format!("{queue}-audit");
        let publisher = publisher(AMQP_URL, &exchange).await;
        publisher.declare_queue(&exchange, &queue, "parcel.#").await.expect("declare queue");
        publisher.declare_queue(&exchange, &audit, "#").await.expect("declare audit queue");

        let events: Vec<NewEvent> = (0..20).map(|i| shipped(format!("p{}", i % 5), i / 5)).collect();
        enqueue_committed(&t, &events).await;
        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
        assert_eq!(drain_at(&relay, Utc::now()).await, 20, "{t}: every event confirmed by RabbitMQ");
        assert_eq!(count_published(&t).await, 20, "{t}");

        // What went over the wire: a persistent message with the envelope in properties and headers.
        let raw = raw_connection().await;
        let channel = raw.create_channel().await.expect("channel");
        let got = channel
            .basic_get(audit.as_str().into(), lapin::options::BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
            .expect("the audit queue has a message");
        let first = &outbox_rows(&t).await[0];
        let properties = &got.delivery.properties;
        assert_eq!(properties.delivery_mode(), &Some(2), "{t}: persistent");
        assert_eq!(properties.message_id().as_ref().map(|s| s.to_string()), Some(first.event_id.clone()), "{t}");
        assert_eq!(properties.content_type().as_ref().map(|s| s.to_string()).as_deref(), Some("application/json"));
        assert_eq!(got.delivery.routing_key.as_str(), "parcel.rmq.parcel.shipped", "{t}");
        let headers = properties.headers().as_ref().expect("headers");
        for name in ["ce_id", "ce_type", "ce_subject", "ce_time", "ce_specversion", "outbox_aggregate_type"] {
            assert!(headers.contains_key(name), "{t}: header {name} missing: {headers:?}");
        }
        raw.close(200, "OK".into()).await.ok();

        let stats = Arc::new(Stats::default());
        let consumer = RabbitConsumer::connect(AMQP_URL, &queue, "rmq-round-trip").await.expect("consumer");
        let running = Running::start(consumer, Shipping { db: t.db.clone(), stats: stats.clone() });
        wait_until("20 events are processed", Duration::from_secs(10), || stats.processed() >= 20).await;
        running.stop().await;

        assert_eq!((stats.processed(), stats.duplicates()), (20, 0), "{t}");
        assert_eq!(count_table(&t, "parcels_shipped").await, 20, "{t}: each event applied once");
        assert_eq!(count_inbox(&t, CONSUMER).await, 20, "{t}");
        let admin = relay.publisher();
        assert_eq!(admin.message_count(&queue).await.expect("count"), 0, "{t}: everything acked");
        teardown(admin, &exchange, &[&queue, &audit]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_loses_nothing_and_publisher_and_consumer_reconnect() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    let t = sqlite_only("rmq_outage").await;
    create_effect_table(&t).await;
    let (exchange, queue) = names("outage");
    let admin = publisher(AMQP_URL, &exchange).await;
    admin.declare_queue(&exchange, &queue, "parcel.#").await.expect("declare queue");

    // Relay and consumer both reach RabbitMQ through a proxy the test can cut.
    let proxy = Proxy::start(RABBIT).await;
    let via_proxy = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port());
    let flaky = publisher(&via_proxy, &exchange)
        .await
        .with_confirm_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(2));
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), flaky, fast_config()).expect("relay");
    let stats = Arc::new(Stats::default());
    let consumer = RabbitConsumer::connect(&via_proxy, &queue, "rmq-outage")
        .await
        .expect("consumer")
        .with_retry_delay(Duration::from_millis(100));
    let running = Running::start(consumer, Shipping { db: t.db.clone(), stats: stats.clone() });

    enqueue_committed(&t, &(0..10).map(|i| shipped(format!("p{i}"), 0)).collect::<Vec<_>>()).await;
    assert_eq!(drain_at(&relay, Utc::now()).await, 10, "{t}: published while the broker is up");
    wait_until("the first 10 events are processed", Duration::from_secs(10), || stats.processed() >= 10).await;

    enqueue_committed(&t, &(0..10).map(|i| shipped(format!("p{i}"), 1)).collect::<Vec<_>>()).await;
    proxy.cut();
    let now = Utc::now();
    for step in [now, after(now, CAP)] {
        let pass = relay.run_once_at(step).await.expect("a broker outage is not a relay error");
        assert_eq!((pass.claimed, pass.published, pass.failed, pass.dead), (10, 0, 10, 0), "{t}: {pass:?}");
    }
    let rows = outbox_rows(&t).await;
    let pending: Vec<_> = rows.iter().filter(|r| r.published_at_ms.is_none()).collect();
    assert_eq!(pending.len(), 10, "{t}: nothing lost, nothing marked published");
    for row in &pending {
        assert!(row.dead_at_ms.is_none(), "{t}: an outage kills nothing");
        let error = row.last_error.as_deref().unwrap_or_default();
        assert!(error.contains("RabbitMQ"), "{t}: last_error names the broker: {error}");
    }

    proxy.restore();
    assert_eq!(drain_at(&relay, after(now, CAP * 3)).await, 10, "{t}: the backlog drains after a reconnect");
    assert_eq!(count_published(&t).await, 20, "{t}");
    wait_until("the consumer reconnects and processes all 20", Duration::from_secs(10), || stats.processed() >= 20)
        .await;
    running.stop().await;
    assert_eq!(stats.processed(), 20, "{t}");
    assert_eq!(count_table(&t, "parcels_shipped").await, 20, "{t}: every event processed once");
    assert_eq!(admin.message_count(&queue).await.expect("count"), 0, "{t}: everything acked");
    teardown(&admin, &exchange, &[&queue]).await;
}

/// Asks for a retry the first time it sees each message, then handles it.
#[derive(Clone)]
struct RetriesOnce {
    inner: Shipping,
    seen: Arc<Mutex<std::collections::HashSet<String>>>,
}

impl MessageHandler for RetriesOnce {
    async fn handle(&self, message: OutboxEvent) -> Disposition {
        if self.seen.lock().expect("lock").insert(message.id.to_string()) {
            return Disposition::Retry;
        }
        self.inner.handle(message).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_message_is_requeued_and_applied_once() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    let t = sqlite_only("rmq_retry").await;
    create_effect_table(&t).await;
    let (exchange, queue) = names("retry");
    let publisher = publisher(AMQP_URL, &exchange).await;
    publisher.declare_queue(&exchange, &queue, "parcel.#").await.expect("declare queue");
    enqueue_committed(&t, &(0..5).map(|i| shipped(format!("p{i}"), 0)).collect::<Vec<_>>()).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    assert_eq!(drain_at(&relay, Utc::now()).await, 5, "{t}");

    let stats = Arc::new(Stats::default());
    let handler = RetriesOnce { inner: Shipping { db: t.db.clone(), stats: stats.clone() }, seen: Arc::default() };
    let consumer = RabbitConsumer::connect(AMQP_URL, &queue, "rmq-retry")
        .await
        .expect("consumer")
        .with_retry_delay(Duration::from_millis(20));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { consumer.run(handler, shutdown).await }
    });
    wait_until("5 events are processed after one retry each", Duration::from_secs(10), || stats.processed() >= 5).await;
    shutdown.cancel();
    task.await.expect("consumer task").expect("clean shutdown");
    assert_eq!((stats.processed(), stats.duplicates()), (5, 0), "{t}");
    assert_eq!(count_table(&t, "parcels_shipped").await, 5, "{t}");
    let publisher = relay.publisher();
    assert_eq!(publisher.message_count(&queue).await.expect("count"), 0, "{t}");
    teardown(publisher, &exchange, &[&queue]).await;
}

/// The real publisher, whose confirms can be "lost on the way back": the broker has the message, the relay
/// hears a failure and publishes it again.
struct LosesConfirms {
    inner: RabbitPublisher,
    lose: AtomicBool,
}

impl Publisher for LosesConfirms {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let results = self.inner.publish(events).await;
        if !self.lose.load(Ordering::SeqCst) {
            return results;
        }
        results
            .into_iter()
            .map(|r| r.and(Err(PublishError::transient("the confirm was lost on the way back"))))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_confirm_republishes_and_the_inbox_drops_the_duplicate() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    let t = sqlite_only("rmq_lost_ack").await;
    create_effect_table(&t).await;
    let (exchange, queue) = names("lost-ack");
    let inner = publisher(AMQP_URL, &exchange).await;
    inner.declare_queue(&exchange, &queue, "parcel.#").await.expect("declare queue");
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), LosesConfirms { inner, lose: AtomicBool::new(true) }, fast_config())
            .expect("relay");

    enqueue_committed(&t, &(0..10).map(|i| shipped(format!("p{i}"), 0)).collect::<Vec<_>>()).await;
    let now = Utc::now();
    let pass = relay.run_once_at(now).await.expect("pass");
    assert_eq!((pass.published, pass.failed), (0, 10), "{t}: the relay heard failures");
    relay.publisher().lose.store(false, Ordering::SeqCst);
    assert_eq!(drain_at(&relay, after(now, CAP)).await, 10, "{t}: republished after the backoff");
    let admin = &relay.publisher().inner;
    assert_eq!(admin.message_count(&queue).await.expect("count"), 20, "{t}: RabbitMQ holds every event twice");

    let stats = Arc::new(Stats::default());
    let consumer = RabbitConsumer::connect(AMQP_URL, &queue, "rmq-lost-ack").await.expect("consumer");
    let running = Running::start(consumer, Shipping { db: t.db.clone(), stats: stats.clone() });
    wait_until("20 deliveries are handled", Duration::from_secs(10), || stats.calls() >= 20).await;
    running.stop().await;
    assert_eq!(stats.processed(), 10, "{t}: each event applied once");
    assert_eq!(stats.duplicates(), 10, "{t}: the inbox dropped every second copy");
    assert_eq!(count_table(&t, "parcels_shipped").await, 10, "{t}");
    assert_eq!(count_inbox(&t, CONSUMER).await, 10, "{t}");
    assert_eq!(admin.message_count(&queue).await.expect("count"), 0, "{t}: duplicates are acked, not requeued");
    teardown(admin, &exchange, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_event_stays_pending_until_a_queue_is_bound() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    let t = sqlite_only("rmq_unroutable").await;
    let (exchange, queue) = names("unroutable");
    let publisher = publisher(AMQP_URL, &exchange).await;
    // Only `rmq.parcel.shipped` is bound; `rmq.parcel.lost` routes nowhere.
    publisher.declare_queue(&exchange, &queue, "parcel.rmq.parcel.shipped").await.expect("declare queue");
    let mut events: Vec<NewEvent> = (0..3).map(|i| shipped(format!("p{i}"), 0)).collect();
    for i in 0..3 {
        let payload = serde_json::json!({ "parcel_id": format!("l{i}"), "n": 0 });
        events.push(NewEvent::new("parcel", format!("l{i}"), "rmq.parcel.lost", &payload).expect("event"));
    }
    enqueue_committed(&t, &events).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");

    let now = Utc::now();
    let pass = relay.run_once_at(now).await.expect("pass");
    assert_eq!((pass.claimed, pass.published, pass.failed, pass.dead), (6, 3, 3, 0), "{t}: {pass:?}");
    for row in outbox_rows(&t).await {
        if row.event_type == "rmq.parcel.lost" {
            assert!(row.published_at_ms.is_none() && row.dead_at_ms.is_none(), "{t}: pending, not dead");
            let error = row.last_error.unwrap_or_default();
            assert!(error.contains("unroutable"), "{t}: {error}");
            assert!(error.contains(&exchange) && error.contains("parcel.rmq.parcel.lost"), "{t}: {error}");
        } else {
            assert!(row.published_at_ms.is_some(), "{t}: the routable events of the batch are published");
        }
    }

    let publisher = relay.publisher();
    publisher.declare_queue(&exchange, &queue, "parcel.#").await.expect("bind the missing key");
    assert_eq!(drain_at(&relay, after(now, CAP)).await, 3, "{t}: retried after the backoff, now routable");
    assert_eq!(count_published(&t).await, 6, "{t}");
    assert_eq!(publisher.message_count(&queue).await.expect("count"), 6, "{t}: nothing dropped");
    teardown(publisher, &exchange, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_aggregate_arrives_in_order_at_the_consumer() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    let t = sqlite_only("rmq_order").await;
    create_effect_table(&t).await;
    let (exchange, queue) = names("order");
    let admin = publisher(AMQP_URL, &exchange).await;
    admin.declare_queue(&exchange, &queue, "parcel.#").await.expect("declare queue");
    let events: Vec<NewEvent> = (0..20u64).flat_map(|n| (0..50).map(move |p| shipped(format!("p{p:02}"), n))).collect();
    enqueue_committed(&t, &events).await;

    let stats = Arc::new(Stats::default());
    let consumer = RabbitConsumer::connect(AMQP_URL, &queue, "rmq-order").await.expect("consumer").with_prefetch(64);
    let running = Running::start(consumer, Shipping { db: t.db.clone(), stats: stats.clone() });
    let config = fast_config().with_batch_size(200).with_poll_interval(Duration::from_millis(20));
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), publisher(AMQP_URL, &exchange).await, config).expect("relay");
    let relay_stop = CancellationToken::new();
    let relay_task = tokio::spawn({
        let stop = relay_stop.clone();
        async move { relay.run(stop).await }
    });

    wait_until("1,000 events are processed", Duration::from_secs(20), || stats.processed() >= 1000).await;
    relay_stop.cancel();
    relay_task.await.expect("relay task");
    running.stop().await;

    let applied = stats.applied.lock().expect("stats lock").clone();
    assert_eq!(applied.len(), 1000, "{t}");
    let mut per_parcel: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (parcel, n) in applied {
        per_parcel.entry(parcel).or_default().push(n);
    }
    assert_eq!(per_parcel.len(), 50, "{t}");
    for (parcel, ns) in &per_parcel {
        assert_eq!(ns, &(0..20).collect::<Vec<u64>>(), "{t}: parcel {parcel} applied out of order");
    }
    assert_eq!(count_table(&t, "parcels_shipped").await, 1000, "{t}");
    teardown(&admin, &exchange, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_message_is_parked_once_and_later_messages_still_flow() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    let t = sqlite_only("rmq_parked").await;
    create_effect_table(&t).await;
    let (exchange, queue) = names("parked");
    let dead_letters = format!("{queue}-dlq");
    let publisher = publisher(AMQP_URL, &exchange).await;
    publisher
        .declare_queue_with_dead_letters(&exchange, &queue, "parcel.#", &dead_letters)
        .await
        .expect("declare queues");

    // First a message from some other producer: raw bytes, no envelope headers.
    let raw = raw_connection().await;
    let channel = raw.create_channel().await.expect("channel");
    channel.confirm_select(lapin::options::ConfirmSelectOptions::default()).await.expect("confirms");
    channel
        .basic_publish(
            exchange.as_str().into(),
            "parcel.garbage".into(),
            lapin::options::BasicPublishOptions::default(),
            b"\xff not an outbox envelope",
            lapin::BasicProperties::default(),
        )
        .await
        .expect("publish raw")
        .await
        .expect("raw message confirmed");
    raw.close(200, "OK".into()).await.ok();

    // Then valid events, and one whose type the handler does not know (the handler parks it).
    let mut events: Vec<NewEvent> = (0..3).map(|i| shipped(format!("p{i}"), 0)).collect();
    let unknown = serde_json::json!({ "parcel_id": "u1", "n": 0 });
    events.push(NewEvent::new("parcel", "u1", "rmq.parcel.unknown", &unknown).expect("event"));
    enqueue_committed(&t, &events).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    assert_eq!(drain_at(&relay, Utc::now()).await, 4, "{t}");

    let stats = Arc::new(Stats::default());
    let consumer = RabbitConsumer::connect(AMQP_URL, &queue, "rmq-parked").await.expect("consumer");
    let running = Running::start(consumer, Shipping { db: t.db.clone(), stats: stats.clone() });
    wait_until("3 events are processed and 1 parked", Duration::from_secs(10), || {
        stats.processed() >= 3 && stats.parked() >= 1
    })
    .await;
    let publisher = relay.publisher();
    wait_until_async("both parked messages reach the dead-letter queue", Duration::from_secs(5), || async {
        publisher.message_count(&dead_letters).await.expect("count") >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;

    assert_eq!(stats.calls(), 4, "{t}: the handler never saw the undecodable message, and nothing looped");
    assert_eq!(stats.processed(), 3, "{t}");
    assert_eq!(publisher.message_count(&dead_letters).await.expect("count"), 2, "{t}: parked exactly once each");
    assert_eq!(publisher.message_count(&queue).await.expect("count"), 0, "{t}: nothing requeued");
    assert_eq!(count_table(&t, "parcels_shipped").await, 3, "{t}");
    teardown(publisher, &exchange, &[&queue, &dead_letters]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_are_typed_errors_and_an_oversized_routing_key_is_a_dead_row() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    let key = || Destination::parse(DEFAULT_ROUTING_KEY).expect("template");
    for url in [
        "mqtt://127.0.0.1:1883",
        "nats://127.0.0.1:4222",
        "amqp://",
        "127.0.0.1:5672",
        "amqp://guest:guest@127.0.0.1:notaport/%2f",
        "amqps://guest:guest@127.0.0.1:5671/%2f",
    ] {
        let err = RabbitPublisher::connect(url, "x", key()).await.expect_err(url);
        assert!(matches!(err, Error::InvalidConfig { field: "broker_url", .. }), "{url}: {err}");
        let err = RabbitConsumer::connect(url, "q", "c").await.expect_err(url);
        assert!(matches!(err, Error::InvalidConfig { field: "broker_url", .. }), "{url}: {err}");
    }
    let long_exchange = "x".repeat(256);
    let err = RabbitPublisher::connect(AMQP_URL, &long_exchange, key()).await.expect_err("exchange too long");
    assert!(matches!(err, Error::InvalidConfig { field: "exchange", .. }), "{err}");
    let err = RabbitPublisher::connect("amqp://guest:wrong@127.0.0.1:5672/%2f", "", key()).await.expect_err("login");
    assert!(matches!(err, Error::Broker { broker: "RabbitMQ", .. }), "{err}");
    assert!(!err.to_string().contains("wrong"), "the password is not echoed: {err}");
    let err = RabbitPublisher::connect("amqp://guest:guest@127.0.0.1:1/%2f", "", key()).await.expect_err("closed port");
    assert!(matches!(err, Error::Broker { broker: "RabbitMQ", .. }), "{err}");
    let err = RabbitConsumer::connect(AMQP_URL, "rmq-test-no-such-queue", "c").await.expect_err("missing queue");
    assert!(matches!(err, Error::Broker { .. }) && err.to_string().contains("no-such-queue"), "{err}");

    // A routing key over 255 bytes: that row is dead with a clear reason; its batch-mate is published.
    let t = sqlite_only("rmq_bad_input").await;
    let (exchange, queue) = names("bad-input");
    let by_id = Destination::parse("{aggregate_id}.{event_type}").expect("template");
    let publisher = RabbitPublisher::connect(AMQP_URL, &exchange, by_id).await.expect("publisher");
    publisher.declare_queue(&exchange, &queue, "#").await.expect("declare queue");
    let long_id = "a".repeat(128);
    let long_type = format!("rmq.{}", "t".repeat(124));
    let payload = serde_json::json!({ "n": 1 });
    let too_long = NewEvent::new("parcel", long_id.as_str(), long_type.as_str(), &payload).expect("event");
    let fine = NewEvent::new("parcel", "p1", "rmq.parcel.shipped", &payload).expect("event");
    enqueue_committed(&t, &[too_long.clone(), fine]).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    let pass = relay.run_once().await.expect("pass");
    assert_eq!((pass.claimed, pass.published, pass.failed, pass.dead), (2, 1, 0, 1), "{t}: {pass:?}");
    let row = common::outbox_row(&t, too_long.id()).await;
    assert!(row.dead_at_ms.is_some() && row.published_at_ms.is_none(), "{t}: dead right away");
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("routing key is 257 bytes") && error.contains("255"), "{t}: {error}");
    let publisher = relay.publisher();
    assert_eq!(publisher.message_count(&queue).await.expect("count"), 1, "{t}");
    teardown(publisher, &exchange, &[&queue]).await;
}

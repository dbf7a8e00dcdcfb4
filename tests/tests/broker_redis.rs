//! The Redis Streams adapter against a real Redis (127.0.0.1:6379) and real databases: events relayed with
//! `XADD` reach an `#[idempotent_handler]` through a consumer group exactly once in effect, across a broker
//! outage, lost confirmations, a consumer that died before acking, and entries that cannot be decoded.

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use common::{
    CAP, after, assert_per_aggregate_order, count_inbox, count_published, count_table, count_unpublished,
    create_shop_tables, enqueue_committed, fast_config, insert_invoice, n_of, outbox_row,
};
use outbox_integration_tests::proxy::{Proxy, server_available};
use outbox_integration_tests::{TestDb, all_backends};
use outbox_seaorm::brokers::redis::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use outbox_seaorm::brokers::redis::{
    DEFAULT_STREAM_TEMPLATE, RedisConsumer, RedisConsumerConfig, RedisPublisher, RedisPublisherConfig, dead_field,
};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{
    CancellationToken, Destination, Disposition, Error, EventId, MessageHandler, OutboxEvent, PublishError, Publisher,
};
use sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

const REDIS: &str = "127.0.0.1:6379";
const REDIS_URL: &str = "redis://127.0.0.1:6379";
const CONSUMER: &str = "redis-shipping";

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "parcel.shipped", version = 1, aggregate = "parcel")]
struct ParcelShipped {
    #[aggregate_id]
    parcel_id: String,
    n: u64,
}

/// The consumer's effect: one invoice row per shipped parcel event (the `invoices` table has no unique key,
/// so only the inbox keeps a duplicate from adding a second row).
#[idempotent_handler(consumer = "redis-shipping")]
async fn record_shipment(txn: &DatabaseTransaction, event: ParcelShipped) -> Result<(), DbErr> {
    let n = i64::try_from(event.n).expect("n fits");
    insert_invoice(txn, &event.parcel_id, n).await
}

/// The handler a consumer runs: the idempotent handler, its result mapped to ack / retry / park.
fn shipment_handler(t: &TestDb) -> impl MessageHandler {
    let db = t.db.clone();
    move |message: OutboxEvent| {
        let db = db.clone();
        async move { outbox_seaorm::disposition(&record_shipment(&db, &message).await) }
    }
}

/// `handler`, counting the messages it finished with into `calls`.
fn counted(handler: impl MessageHandler, calls: Arc<AtomicUsize>) -> impl MessageHandler {
    let handler = Arc::new(handler);
    move |event: OutboxEvent| {
        let handler = handler.clone();
        let calls = calls.clone();
        async move {
            let disposition = handler.handle(event).await;
            calls.fetch_add(1, Ordering::SeqCst);
            disposition
        }
    }
}

fn shipped(parcel: &str, n: u64) -> NewEvent {
    ParcelShipped { parcel_id: parcel.to_owned(), n }.to_new_event().expect("valid event")
}

/// `count` events spread round-robin over `parcels` parcels, numbered per parcel from 0.
fn shipments(parcels: u64, count: u64) -> Vec<NewEvent> {
    (0..count).map(|i| shipped(&format!("p{}", i % parcels), i / parcels)).collect()
}

/// A fresh stream namespace for one test: its template, and the stream the `parcel` aggregate goes to.
struct Streams {
    prefix: String,
}

impl Streams {
    fn new(test: &str) -> Self {
        Streams { prefix: format!("outbox-test:{test}:{}", uuid::Uuid::new_v4().simple()) }
    }

    /// `<prefix>:{aggregate_type}`, like [`DEFAULT_STREAM_TEMPLATE`] under a unique prefix.
    fn destination(&self) -> Destination {
        let template = DEFAULT_STREAM_TEMPLATE.replacen("outbox", &self.prefix, 1);
        Destination::parse(&template).expect("template")
    }

    fn stream(&self, aggregate_type: &str) -> String {
        format!("{}:{aggregate_type}", self.prefix)
    }

    fn parcels(&self) -> String {
        self.stream("parcel")
    }

    /// Deletes every key of the namespace.
    async fn cleanup(&self) {
        let mut conn = raw().await;
        let keys: Vec<String> = conn.keys(format!("{}:*", self.prefix)).await.expect("KEYS");
        if !keys.is_empty() {
            let _: i64 = conn.del(keys).await.expect("DEL");
        }
    }
}

async fn raw() -> MultiplexedConnection {
    redis::Client::open(REDIS_URL).expect("client").get_multiplexed_async_connection().await.expect("connect")
}

async fn xlen(stream: &str) -> usize {
    raw().await.xlen(stream).await.expect("XLEN")
}

/// Entries of `group` read but not acked.
async fn pending(stream: &str, group: &str) -> usize {
    let reply: redis::streams::StreamPendingReply = raw().await.xpending(stream, group).await.expect("XPENDING");
    reply.count()
}

/// The entries of the dead-letter stream.
async fn dead_entries(stream: &str) -> Vec<redis::streams::StreamId> {
    let reply: redis::streams::StreamRangeReply =
        raw().await.xrange_all(format!("{stream}:dead")).await.expect("XRANGE");
    reply.ids
}

fn fast_consumer() -> RedisConsumerConfig {
    RedisConsumerConfig::default()
        .with_block(Duration::from_millis(50))
        .with_min_idle(Duration::from_millis(300))
        .with_reclaim_interval(Duration::from_millis(100))
        .with_retry_delay(Duration::from_millis(50), Duration::from_millis(200))
}

/// A consumer running in its own task until [`Running::stop`].
struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<outbox_seaorm::Result<()>>,
}

impl Running {
    fn start(consumer: RedisConsumer, handler: impl MessageHandler) -> Running {
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move { consumer.run(handler, token).await });
        Running { shutdown, task }
    }

    /// Cancels the consumer and checks it stopped promptly and cleanly.
    async fn stop(self) {
        let started = Instant::now();
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(3), self.task)
            .await
            .expect("the consumer stops within 3 s of shutdown")
            .expect("the consumer task did not panic");
        result.expect("the consumer ends with Ok after shutdown");
        assert!(started.elapsed() < Duration::from_secs(2), "shutdown took {:?}", started.elapsed());
    }
}

/// Waits (at most 15 s) until `check` holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_invoices(t: &TestDb, expected: i64) {
    eventually(&format!("{t}: {expected} invoices"), || async { count_table(t, "invoices").await >= expected }).await;
    // Give a wrongly repeated effect a moment to show up before the exact count is checked.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(count_table(t, "invoices").await, expected, "{t}: every event applied exactly once");
    assert_eq!(count_inbox(t, CONSUMER).await, u64::try_from(expected).expect("count"), "{t}: one inbox row each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_relayed_through_redis_streams_is_applied_once() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    for t in all_backends("redis_round_trip").await {
        create_shop_tables(&t).await;
        let streams = Streams::new("round-trip");
        let publisher = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
        let consumer = RedisConsumer::connect_with(REDIS_URL, &streams.parcels(), "shipping", "c1", fast_consumer())
            .await
            .expect("consumer");
        assert_eq!(consumer.dead_letter_stream(), format!("{}:dead", streams.parcels()));
        let running = Running::start(consumer, shipment_handler(&t));

        enqueue_committed(&t, &shipments(5, 30)).await;
        relay.drain(100).await.unwrap_or_else(|e| panic!("{t}: relay: {e}"));
        assert_eq!(count_published(&t).await, 30, "{t}");
        assert_eq!(xlen(&streams.parcels()).await, 30, "{t}: one entry per event");

        wait_for_invoices(&t, 30).await;
        eventually("every entry acked", || async { pending(&streams.parcels(), "shipping").await == 0 }).await;
        running.stop().await;
        assert!(dead_entries(&streams.parcels()).await.is_empty(), "{t}: nothing parked");
        streams.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_loses_nothing_and_the_backlog_drains_after_it_returns() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_outage").await.remove(0);
    create_shop_tables(&t).await;
    let streams = Streams::new("outage");
    let proxy = Proxy::start(REDIS).await;
    let via_proxy = format!("redis://127.0.0.1:{}", proxy.port());
    let config = RedisPublisherConfig::default()
        .with_connect_timeout(Duration::from_millis(500))
        .with_response_timeout(Duration::from_secs(1));
    let publisher = RedisPublisher::connect_with(&via_proxy, streams.destination(), config).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    // The consumer goes through the proxy too: it must come back on its own after the outage.
    let consumer = RedisConsumer::connect_with(&via_proxy, &streams.parcels(), "shipping", "c1", fast_consumer())
        .await
        .expect("consumer");
    let running = Running::start(consumer, shipment_handler(&t));

    let events = shipments(4, 20);
    enqueue_committed(&t, &events[..4]).await;
    let first = relay.run_once().await.expect("first pass");
    assert_eq!((first.claimed, first.published), (4, 4), "{t}: one event of each aggregate");
    enqueue_committed(&t, &events[4..]).await;

    proxy.cut();
    let now = Utc::now();
    for step in 0..2 {
        let pass = relay.run_once_at(after(now, CAP * step)).await.expect("a failed publish is not a relay error");
        assert_eq!((pass.claimed, pass.published, pass.failed, pass.dead), (16, 0, 4, 0), "{t}: pass {step}: {pass:?}");
    }
    assert_eq!(count_published(&t).await, 4, "{t}: nothing marked published while Redis is unreachable");
    assert_eq!(count_unpublished(&t).await, 16, "{t}: every other event is still pending");

    proxy.restore();
    let mut step = 2;
    while count_unpublished(&t).await > 0 {
        assert!(step < 40, "{t}: the backlog did not drain");
        relay.run_once_at(after(now, CAP * step)).await.expect("pass");
        step += 1;
    }
    assert_eq!(count_published(&t).await, 20, "{t}");
    wait_for_invoices(&t, 20).await;
    running.stop().await;
    streams.cleanup().await;
}

/// Publishes for real, then reports the confirmation lost while `lose` is set (the broker has the events,
/// the relay does not know it).
struct LosesConfirmations {
    inner: RedisPublisher,
    lose: AtomicBool,
}

impl Publisher for LosesConfirmations {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let results = self.inner.publish(events).await;
        if self.lose.swap(false, Ordering::SeqCst) {
            return results.into_iter().map(|r| r.and(Err(PublishError::transient("confirmation lost")))).collect();
        }
        results
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_appended_twice_after_a_lost_confirmation_is_applied_once() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_lost_ack").await.remove(0);
    create_shop_tables(&t).await;
    let streams = Streams::new("lost-ack");
    let inner = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
    let publisher = LosesConfirmations { inner, lose: AtomicBool::new(true) };
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();

    enqueue_committed(&t, &shipments(10, 10)).await;
    let now = Utc::now();
    let lost = relay.run_once_at(now).await.expect("pass");
    assert_eq!((lost.published, lost.failed), (0, 10), "{t}: {lost:?}");
    let again = relay.run_once_at(after(now, CAP)).await.expect("pass");
    assert_eq!(again.published, 10, "{t}: {again:?}");
    assert_eq!(xlen(&streams.parcels()).await, 20, "{t}: Redis has every event twice (no server-side dedup)");

    let consumer = RedisConsumer::connect_with(REDIS_URL, &streams.parcels(), "shipping", "c1", fast_consumer())
        .await
        .expect("consumer");
    let calls = Arc::new(AtomicUsize::new(0));
    let running = Running::start(consumer, counted(shipment_handler(&t), calls.clone()));
    eventually("all 20 entries handled", || async { calls.load(Ordering::SeqCst) >= 20 }).await;
    eventually("all 20 entries acked", || async { pending(&streams.parcels(), "shipping").await == 0 }).await;
    wait_for_invoices(&t, 10).await;
    assert_eq!(calls.load(Ordering::SeqCst), 20, "{t}: each entry handled once, the duplicate as a no-op");
    running.stop().await;
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_left_pending_by_a_dead_consumer_are_reclaimed_and_applied_once() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_autoclaim").await.remove(0);
    create_shop_tables(&t).await;
    let streams = Streams::new("autoclaim");
    let stream = streams.parcels();
    // Connecting B creates the group; B does not run yet.
    let b = RedisConsumer::connect_with(REDIS_URL, &stream, "shipping", "b", fast_consumer()).await.expect("consumer");
    let publisher = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    enqueue_committed(&t, &shipments(10, 10)).await;
    relay.drain(10).await.expect("relay");

    // Consumer A reads every entry, then dies before handling or acking any of them.
    let options = redis::streams::StreamReadOptions::default().group("shipping", "a").count(100);
    let read: redis::streams::StreamReadReply =
        raw().await.xread_options(&[&stream], &[">"], &options).await.expect("XREADGROUP as A");
    assert_eq!(read.keys.first().map(|k| k.ids.len()), Some(10), "A received every entry");
    assert_eq!(pending(&stream, "shipping").await, 10, "A's entries are pending");

    let running = Running::start(b, shipment_handler(&t));
    wait_for_invoices(&t, 10).await;
    eventually("B acked A's entries", || async { pending(&stream, "shipping").await == 0 }).await;
    running.stop().await;
    assert!(dead_entries(&stream).await.is_empty(), "nothing parked");
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_events_over_fifty_aggregates_arrive_in_per_aggregate_order() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_order").await.remove(0);
    let streams = Streams::new("order");
    let received = Arc::new(Mutex::new(Vec::<OutboxEvent>::new()));
    let sink = received.clone();
    let consumer = RedisConsumer::connect_with(REDIS_URL, &streams.parcels(), "audit", "c1", fast_consumer())
        .await
        .expect("consumer");
    let running = Running::start(consumer, move |event: OutboxEvent| {
        let sink = sink.clone();
        async move {
            sink.lock().expect("lock").push(event);
            Disposition::Ack
        }
    });

    enqueue_committed(&t, &shipments(50, 1000)).await;
    let publisher = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    relay.drain(100).await.expect("relay");
    assert_eq!(count_published(&t).await, 1000, "{t}");

    eventually("1000 events received", || async { received.lock().expect("lock").len() >= 1000 }).await;
    running.stop().await;
    let received = received.lock().expect("lock").clone();
    assert_eq!(received.len(), 1000, "{t}: each entry delivered once");
    assert_per_aggregate_order(&received, &t);
    for parcel in 0..50 {
        let id = format!("p{parcel}");
        let ns: Vec<u64> = received.iter().filter(|e| e.aggregate_id == id).map(n_of).collect();
        assert_eq!(ns, (0..20).collect::<Vec<_>>(), "{t}: parcel {id} applied in emit order");
    }
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_entry_is_parked_and_acked_while_later_entries_are_processed() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_poison").await.remove(0);
    create_shop_tables(&t).await;
    let streams = Streams::new("poison");
    let stream = streams.parcels();
    let consumer =
        RedisConsumer::connect_with(REDIS_URL, &stream, "shipping", "c1", fast_consumer()).await.expect("consumer");

    // Entries no outbox publisher wrote: no envelope at all, an envelope without a payload, and an id that
    // is not UTF-8. They come first, so valid entries behind them must not be held up.
    let mut conn = raw().await;
    let no_envelope: String = conn.xadd(&stream, "*", &[("foo", "bar")]).await.expect("XADD");
    let no_payload: String = conn.xadd(&stream, "*", &[("ce_id", "x"), ("ce_type", "parcel.shipped")]).await.unwrap();
    let not_utf8: String =
        conn.xadd(&stream, "*", &[("ce_id", &b"\xff\xfe"[..]), ("payload", &b"{}"[..])]).await.unwrap();

    let publisher = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    enqueue_committed(&t, &shipments(5, 5)).await;
    relay.drain(10).await.expect("relay");

    let running = Running::start(consumer, shipment_handler(&t));
    wait_for_invoices(&t, 5).await;
    eventually("everything acked", || async { pending(&stream, "shipping").await == 0 }).await;
    // Longer than min_idle and several reclaim rounds: a parked entry never comes back.
    tokio::time::sleep(Duration::from_millis(600)).await;
    running.stop().await;

    let dead = dead_entries(&stream).await;
    let parked: Vec<String> = dead.iter().map(|e| e.get(dead_field::ENTRY_ID).expect("entry id")).collect();
    assert_eq!(parked, [no_envelope, no_payload, not_utf8], "each bad entry parked once, in order");
    let first = &dead[0];
    let reason: String = first.get(dead_field::REASON).expect("reason");
    assert!(reason.contains("cannot decode") && reason.contains("payload"), "{reason}");
    assert_eq!(first.get::<String>("foo").as_deref(), Some("bar"), "the original fields are kept");
    assert_eq!(first.get::<String>(dead_field::STREAM), Some(stream.clone()));
    assert_eq!(first.get::<String>(dead_field::GROUP).as_deref(), Some("shipping"));
    let reason: String = dead[2].get(dead_field::REASON).expect("reason");
    assert!(reason.contains("UTF-8"), "{reason}");
    assert_eq!(count_table(&t, "invoices").await, 5);
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_the_handler_keeps_retrying_is_parked_after_max_deliveries() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_max_deliveries").await.remove(0);
    create_shop_tables(&t).await;
    let streams = Streams::new("max-deliveries");
    let stream = streams.parcels();
    let config = fast_consumer().with_min_idle(Duration::from_millis(100)).with_max_deliveries(3);
    let consumer = RedisConsumer::connect_with(REDIS_URL, &stream, "shipping", "c1", config).await.expect("consumer");

    let publisher = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    enqueue_committed(&t, &shipments(4, 4)).await;
    relay.drain(10).await.expect("relay");

    // Parcel p2's handler fails every time (say its effect hits a constraint); the others succeed.
    let attempts = Arc::new(Mutex::new(0_u32));
    let counter = attempts.clone();
    let inner = Arc::new(shipment_handler(&t));
    let handler = move |event: OutboxEvent| {
        let inner = inner.clone();
        let counter = counter.clone();
        async move {
            if event.aggregate_id == "p2" {
                *counter.lock().expect("lock") += 1;
                return Disposition::Retry;
            }
            inner.handle(event).await
        }
    };
    let running = Running::start(consumer, handler);
    eventually("p2 parked", || async { !dead_entries(&stream).await.is_empty() }).await;
    eventually("everything acked", || async { pending(&stream, "shipping").await == 0 }).await;
    running.stop().await;

    assert_eq!(*attempts.lock().expect("lock"), 3, "handled max_deliveries times, then parked");
    let dead = dead_entries(&stream).await;
    assert_eq!(dead.len(), 1);
    let reason: String = dead[0].get(dead_field::REASON).expect("reason");
    assert!(reason.contains("delivered 4 times") && reason.contains("max_deliveries is 3"), "{reason}");
    assert_eq!(dead[0].get::<String>("ce_subject").as_deref(), Some("p2"));
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_urls_and_other_brokers_schemes_are_config_errors() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let destination = || Destination::parse(DEFAULT_STREAM_TEMPLATE).expect("template");
    for url in ["not a url", "mqtt://127.0.0.1:6379", "nats://127.0.0.1:4222", "redis://", "redis://:6379"] {
        let error = RedisPublisher::connect(url, destination()).await.expect_err(url);
        assert!(matches!(error, Error::InvalidConfig { field: "broker_url", .. }), "{url}: {error}");
        let error = RedisConsumer::connect(url, "s", "g", "c").await.expect_err(url);
        assert!(matches!(error, Error::InvalidConfig { field: "broker_url", .. }), "{url}: {error}");
    }
    let error = RedisPublisher::connect("redis://user:secret@127.0.0.1:1", destination()).await.expect_err("port 1");
    assert!(matches!(error, Error::Broker { broker: "Redis Streams", .. }), "{error}");
    assert!(!error.to_string().contains("secret"), "the password is not in the message: {error}");

    let error = RedisConsumer::connect(REDIS_URL, "", "g", "c").await.expect_err("empty stream");
    assert!(matches!(error, Error::InvalidConfig { field: "stream", .. }), "{error}");
    let long = "s".repeat(2000);
    let error = RedisConsumer::connect(REDIS_URL, &long, "g", "c").await.expect_err("long stream");
    assert!(matches!(error, Error::InvalidConfig { field: "stream", .. }), "{error}");
    let config = RedisPublisherConfig::default().with_max_payload_bytes(0);
    let error = RedisPublisher::connect_with(REDIS_URL, destination(), config).await.expect_err("max 0");
    assert!(matches!(error, Error::InvalidConfig { field: "max_payload_bytes", .. }), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_payload_or_a_non_stream_key_is_a_dead_row_with_a_clear_error() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_bad_input").await.remove(0);
    let streams = Streams::new("bad-input");
    // The `blocked` aggregate's stream key already holds a plain string.
    let _: () = raw().await.set(streams.stream("blocked"), "not a stream").await.expect("SET");

    let config = RedisPublisherConfig::default().with_max_payload_bytes(1024).with_max_len(1000);
    let publisher = RedisPublisher::connect_with(REDIS_URL, streams.destination(), config).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    let big = NewEvent::new("parcel", "big", "parcel.shipped", &serde_json::json!({"pad": "x".repeat(4096)})).unwrap();
    let blocked = NewEvent::new("blocked", "b1", "parcel.shipped", &serde_json::json!({"n": 1})).unwrap();
    let (big_id, blocked_id) = (big.id(), blocked.id());
    enqueue_committed(&t, &[shipped("ok", 0), big, blocked]).await;

    let pass = relay.run_once().await.expect("a bad event is not a relay error");
    assert_eq!((pass.claimed, pass.published, pass.dead), (3, 1, 2), "{t}: {pass:?}");
    let row = outbox_row(&t, big_id).await;
    assert!(row.dead_at_ms.is_some() && row.published_at_ms.is_none(), "{t}: {row:?}");
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("over the Redis Streams publisher's max_payload_bytes of 1024"), "{t}: {error}");
    let row = outbox_row(&t, blocked_id).await;
    assert!(row.dead_at_ms.is_some(), "{t}: {row:?}");
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("WRONGTYPE") && error.contains(":blocked"), "{t}: {error}");
    assert_eq!(xlen(&streams.parcels()).await, 1, "{t}: only the valid event was appended");

    // An entry Redis appended but no replica confirmed is not reported published.
    let config = RedisPublisherConfig::default().with_min_replicas(1, Duration::from_millis(50));
    let publisher = RedisPublisher::connect_with(REDIS_URL, streams.destination(), config).await.expect("publisher");
    let event = OutboxEvent {
        seq: 1,
        aggregate_version: 1,
        id: EventId::new(),
        aggregate_type: "parcel".into(),
        aggregate_id: "r1".into(),
        event_type: "parcel.shipped".into(),
        schema_version: 1,
        payload: r#"{"parcel_id":"r1","n":0}"#.into(),
        headers: Default::default(),
        created_at: Utc::now(),
        attempts: 0,
        last_error: None,
    };
    let results = publisher.publish(&[event]).await;
    let error = results[0].clone().expect_err("no replica in this setup");
    assert!(!error.is_permanent() && error.message().contains("WAIT 1"), "{error}");
    streams.cleanup().await;
}

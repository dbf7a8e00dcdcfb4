//! The Redis Streams adapter against a real Redis (127.0.0.1:6379) and real databases, beyond the contract
//! suite (`contract_redis.rs`): the publisher through an outage and lost confirmations, no trimming by
//! default, entries of a consumer that died claimed by another, held entries kept from other consumers,
//! and bad entries and bad settings ending as dead letters or typed errors.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    count_inbox, count_table, count_unpublished, create_shop_tables, enqueue_committed, fast_config, insert_invoice,
};
use outbox_integration_tests::contract::{Running, eventually};
use outbox_integration_tests::proxy::server_available;
use outbox_integration_tests::{TestDb, all_backends};
use outbox_seaorm::brokers::redis::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use outbox_seaorm::brokers::redis::{
    DEFAULT_STREAM_TEMPLATE, PAYLOAD_FIELD, RedisPublisher, RedisPublisherConfig, RedisTransport, RedisTransportConfig,
    dead_field,
};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{Consumer, ConsumerConfig, ConsumerStats, Destination, Error, OutboxEvent, Publisher, Received};
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
#[idempotent_handler]
async fn record_shipment(txn: &DatabaseTransaction, event: ParcelShipped) -> Result<(), DbErr> {
    let n = i64::try_from(event.n).expect("n fits");
    insert_invoice(txn, &event.parcel_id, n).await
}

/// Settings for tests: short waits.
fn consumer_config() -> ConsumerConfig {
    outbox_integration_tests::contract::fast_config()
}

/// A consumer running `record_shipment` on every `ParcelShipped`; `gate`, if given, holds each handler
/// until a permit is added.
fn shipping(t: &TestDb, gate: Option<Arc<tokio::sync::Semaphore>>) -> Consumer {
    let db = t.db.clone();
    let handler = move |received: Received<ParcelShipped>| {
        let (db, gate) = (db.clone(), gate.clone());
        async move {
            if let Some(gate) = gate {
                gate.acquire().await.expect("gate").forget();
            }
            outbox_seaorm::deliver(&db, CONSUMER, &received.envelope, record_shipment).await
        }
    };
    Consumer::new(CONSUMER).with_config(consumer_config()).on::<ParcelShipped>(handler)
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

fn transport_config() -> RedisTransportConfig {
    RedisTransportConfig::default()
        .with_min_idle(Duration::from_millis(600))
        .with_reclaim_interval(Duration::from_millis(100))
        .with_max_block(Duration::from_millis(100))
}

async fn transport(url: &str, stream: &str, group: &str, name: &str) -> RedisTransport {
    RedisTransport::connect_with(url, stream, group, name, transport_config())
        .await
        .unwrap_or_else(|e| panic!("transport {name}: {e}"))
}

/// Waits (at most 15 s) until `expected` invoices exist, then checks each was applied exactly once.
async fn wait_for_invoices(t: &TestDb, expected: i64) {
    eventually(Duration::from_secs(15), &format!("{t}: {expected} invoices"), async || {
        count_table(t, "invoices").await >= expected
    })
    .await;
    // Give a wrongly repeated effect a moment to show up before the exact count is checked.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(count_table(t, "invoices").await, expected, "{t}: every event applied exactly once");
    assert_eq!(count_inbox(t, CONSUMER).await, u64::try_from(expected).expect("count"), "{t}: one inbox row each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_never_trims_a_stream_by_default() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_no_trim").await.remove(0);
    let streams = Streams::new("no-trim");
    let publisher = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
    assert_eq!(publisher.config().max_len, None);
    // A group exists and has read nothing: trimming would delete what it never applied.
    let _idle = transport(REDIS_URL, &streams.parcels(), "slow", "s1").await;
    enqueue_committed(&t, &shipments(1, 300)).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    while count_unpublished(&t).await > 0 {
        relay.run_once().await.expect("pass");
    }
    assert_eq!(xlen(&streams.parcels()).await, 300, "every entry kept");
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_left_pending_by_a_dead_consumer_are_claimed_and_applied_once() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_autoclaim").await.remove(0);
    create_shop_tables(&t).await;
    let streams = Streams::new("autoclaim");
    let stream = streams.parcels();
    // Connecting B creates the group; B does not run yet.
    let b = transport(REDIS_URL, &stream, "shipping", "b").await;
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

    let running = Running::start(shipping(&t, None), b);
    wait_for_invoices(&t, 10).await;
    eventually(Duration::from_secs(30), "B acked A's entries", async || pending(&stream, "shipping").await == 0).await;
    let stats = running.stop().await;
    assert_eq!(stats.processed, 10, "{stats:?}");
    assert!(dead_entries(&stream).await.is_empty(), "nothing dead-lettered");
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_held_by_a_live_consumer_is_not_claimed_by_another() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_keep_alive").await.remove(0);
    create_shop_tables(&t).await;
    let streams = Streams::new("keep-alive");
    let stream = streams.parcels();
    // The group (and its stream) first: the publisher appends only to streams that exist.
    drop(transport(REDIS_URL, &stream, "shipping", "setup").await);
    let publisher = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    enqueue_committed(&t, &shipments(1, 3)).await;
    relay.drain(10).await.expect("relay");

    // A takes the three entries of parcel p0 and holds them (its handler waits) for 2 × min_idle. A min_idle
    // of 3 s, kept alive every second: a keep-alive may come 2 s late on a loaded machine before B could
    // claim (with 600 ms, a 400 ms stall was enough).
    let min_idle = Duration::from_secs(3);
    let config = || transport_config().with_min_idle(min_idle);
    let connect = async |name: &str| {
        RedisTransport::connect_with(REDIS_URL, &stream, "shipping", name, config())
            .await
            .unwrap_or_else(|e| panic!("transport {name}: {e}"))
    };
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let a = Running::start(shipping(&t, Some(gate.clone())), connect("a").await);
    eventually(Duration::from_secs(30), "A holds the entries", async || pending(&stream, "shipping").await == 3).await;
    let b = Running::start(shipping(&t, None), connect("b").await);
    tokio::time::sleep(min_idle * 2).await;
    let b_stats: ConsumerStats = b.stop().await;
    assert_eq!(b_stats.processed + b_stats.duplicates, 0, "B never got A's held entries: {b_stats:?}");

    gate.add_permits(3);
    wait_for_invoices(&t, 3).await;
    let a_stats = a.stop().await;
    assert_eq!(a_stats.processed, 3, "{a_stats:?}");
    assert_eq!(pending(&stream, "shipping").await, 0);
    streams.cleanup().await;
}

/// An envelope for raw entries.
fn sample_event(payload: serde_json::Value) -> OutboxEvent {
    let event = NewEvent::new("parcel", "raw", "parcel.shipped", &payload).expect("event");
    outbox_seaorm::testkit::outbox_event(&event, 1, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_entries_are_dead_lettered_once_with_their_fields_while_later_entries_are_processed() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_bad_entries").await.remove(0);
    create_shop_tables(&t).await;
    let streams = Streams::new("bad-entries");
    let stream = streams.parcels();
    let consumer = transport(REDIS_URL, &stream, "shipping", "c1").await;

    // Entries no outbox publisher wrote come first, so valid entries behind them must not be held up.
    let mut conn = raw().await;
    let no_envelope: String = conn.xadd(&stream, "*", &[("foo", "bar")]).await.expect("XADD");
    let not_utf8: String =
        conn.xadd(&stream, "*", &[("ce_id", &b"\xff\xfe"[..]), ("payload", &b"{}"[..])]).await.expect("XADD");
    let event = sample_event(serde_json::json!({"parcel_id": "raw", "n": 1}));
    let mut fields = outbox_seaorm::broker::envelope_headers(&event);
    fields.push(("x-note".into(), "line one\nforged: yes".into()));
    fields.push((PAYLOAD_FIELD.into(), event.payload.clone()));
    let control: String = conn.xadd(&stream, "*", &fields).await.expect("XADD");
    let big = sample_event(serde_json::json!({"parcel_id": "raw", "n": 2, "pad": "x".repeat(4096)}));
    let mut fields = outbox_seaorm::broker::envelope_headers(&big);
    fields.push((PAYLOAD_FIELD.into(), big.payload.clone()));
    let oversized: String = conn.xadd(&stream, "*", &fields).await.expect("XADD");

    let publisher = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    enqueue_committed(&t, &shipments(5, 5)).await;
    relay.drain(10).await.expect("relay");

    let config = ConsumerConfig { max_payload_bytes: 1024, ..consumer_config() };
    let db = t.db.clone();
    let handler = move |received: Received<ParcelShipped>| {
        let db = db.clone();
        async move { outbox_seaorm::deliver(&db, CONSUMER, &received.envelope, record_shipment).await }
    };
    let consumer_app = Consumer::new(CONSUMER).with_config(config).on::<ParcelShipped>(handler);
    let running = Running::start(consumer_app, consumer);
    wait_for_invoices(&t, 5).await;
    eventually(Duration::from_secs(30), "everything acked", async || pending(&stream, "shipping").await == 0).await;
    // Longer than min_idle and several reclaim rounds: a dead-lettered entry never comes back.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let stats = running.stop().await;
    assert_eq!((stats.processed, stats.dead_lettered), (5, 3), "the non-UTF-8 entry is the transport's: {stats:?}");

    let dead = dead_entries(&stream).await;
    let mut ids: Vec<String> = dead.iter().map(|e| e.get(dead_field::ENTRY_ID).expect("entry id")).collect();
    ids.sort();
    let mut expected = vec![no_envelope.clone(), not_utf8.clone(), control.clone(), oversized.clone()];
    expected.sort();
    assert_eq!(ids, expected, "each bad entry dead-lettered once");
    let by_id =
        |id: &str| dead.iter().find(|e| e.get::<String>(dead_field::ENTRY_ID).as_deref() == Some(id)).expect("dead");
    let first = by_id(&no_envelope);
    assert_eq!(first.get::<String>("foo").as_deref(), Some("bar"), "the original fields are kept");
    assert!(first.get::<String>("outbox_dead_reason").expect("reason").contains("ce_id"));
    assert_eq!(first.get::<String>("outbox_dead_origin"), Some(stream.clone()));
    assert_eq!(first.get::<String>(dead_field::GROUP).as_deref(), Some("shipping"));
    let bytes = by_id(&not_utf8);
    assert_eq!(bytes.get::<Vec<u8>>("ce_id"), Some(b"\xff\xfe".to_vec()), "kept byte for byte");
    assert!(bytes.get::<String>("outbox_dead_reason").expect("reason").contains("UTF-8"));
    let forged = by_id(&control);
    let reason: String = forged.get("outbox_dead_reason").expect("reason");
    assert!(reason.contains("control characters") && !reason.contains('\n'), "escaped: {reason:?}");
    assert_eq!(forged.get::<String>("x-note").as_deref(), Some("line one\nforged: yes"));
    let large = by_id(&oversized);
    assert_eq!(large.get::<String>(PAYLOAD_FIELD), Some(big.payload.clone()), "the payload is kept whole");
    assert!(large.get::<String>("outbox_dead_reason").expect("reason").contains("max_payload_bytes"));
    assert_eq!(count_table(&t, "invoices").await, 5);
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stream_names_and_settings_are_config_errors() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let destination = || Destination::parse(DEFAULT_STREAM_TEMPLATE).expect("template");
    // Publisher URLs: the publisher contract (`publisher_refuses_bad_urls`); the transport parses the same way.
    let error = RedisTransport::connect("redis://", "s", "g", "c").await.expect_err("no host");
    assert!(matches!(error, Error::InvalidConfig { field: "broker_url", .. }), "{error}");
    let error = RedisTransport::connect("redis://user:secret@127.0.0.1:1", "s", "g", "c").await.expect_err("port 1");
    assert!(matches!(error, Error::Broker { .. }) && !error.to_string().contains("secret"), "{error}");

    let streams = Streams::new("config");
    let stream = streams.parcels();
    let long = "s".repeat(2000);
    let error = RedisTransport::connect(REDIS_URL, "", "g", "c").await.expect_err("empty stream");
    assert!(matches!(error, Error::InvalidConfig { field: "stream", .. }), "{error}");
    let error = RedisTransport::connect(REDIS_URL, &long, "g", "c").await.expect_err("long stream");
    assert!(matches!(error, Error::InvalidConfig { field: "stream", .. }), "{error}");
    let near_limit = "s".repeat(1020);
    let error = RedisTransport::connect(REDIS_URL, &near_limit, "g", "c").await.expect_err("long dead-letter key");
    assert!(matches!(error, Error::InvalidConfig { field: "dead_letter_stream", .. }), "{error}");
    for (dead, why) in [("", "empty"), (stream.as_str(), "the consumed stream"), (long.as_str(), "too long")] {
        let config = RedisTransportConfig::default().with_dead_letter_stream(dead);
        let error = RedisTransport::connect_with(REDIS_URL, &stream, "g", "c", config).await.expect_err(why);
        assert!(matches!(error, Error::InvalidConfig { field: "dead_letter_stream", .. }), "{why}: {error}");
    }
    // A dead-letter key that already holds something else.
    let blocked = streams.stream("dead-string");
    let _: () = raw().await.set(&blocked, "not a stream").await.expect("SET");
    let config = RedisTransportConfig::default().with_dead_letter_stream(&blocked);
    let error = RedisTransport::connect_with(REDIS_URL, &stream, "g", "c", config).await.expect_err("string key");
    assert!(matches!(error, Error::InvalidConfig { field: "dead_letter_stream", .. }), "{error}");
    assert!(error.to_string().contains("not a stream"), "{error}");
    let error = RedisTransport::connect_with(
        REDIS_URL,
        &stream,
        "g",
        "c",
        RedisTransportConfig::default().with_max_block(Duration::ZERO),
    )
    .await
    .expect_err("block 0");
    assert!(matches!(error, Error::InvalidConfig { field: "max_block", .. }), "{error}");
    let config = RedisPublisherConfig::default().with_max_payload_bytes(0);
    let error = RedisPublisher::connect_with(REDIS_URL, destination(), config).await.expect_err("max 0");
    assert!(matches!(error, Error::InvalidConfig { field: "max_payload_bytes", .. }), "{error}");
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_for_a_stream_no_group_reads_stays_pending_until_a_consumer_creates_it() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let t = all_backends("redis_no_stream").await.remove(0);
    create_shop_tables(&t).await;
    let streams = Streams::new("no-stream");
    let stream = streams.parcels();
    let publisher = RedisPublisher::connect(REDIS_URL, streams.destination()).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).unwrap();
    enqueue_committed(&t, &shipments(2, 6)).await;

    // No consumer group, no stream: nothing is appended, nothing is marked published, the reason is given.
    let pass = relay.run_once().await.expect("pass");
    assert_eq!((pass.published, pass.failed), (0, 2), "{t}: the heads of both parcels failed: {pass:?}");
    assert_eq!(xlen(&stream).await, 0, "{t}: no stream was created");
    assert_eq!(count_unpublished(&t).await, 6, "{t}: every event still pending");
    let row = common::outbox_rows(&t).await.into_iter().find(|row| row.last_error.is_some()).expect("a failed row");
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("does not exist") && error.contains(&stream), "{t}: {error}");

    // The consumer creates its group and stream; the retries go out and are applied once each.
    let running = Running::start(shipping(&t, None), transport(REDIS_URL, &stream, "shipping", "c1").await);
    let later = chrono::Utc::now() + chrono::Duration::from_std(common::CAP).expect("cap");
    while count_unpublished(&t).await > 0 {
        relay.run_once_at(later).await.expect("pass");
    }
    wait_for_invoices(&t, 6).await;
    let stats = running.stop().await;
    assert_eq!(stats.processed, 6, "{t}: {stats:?}");
    assert_eq!(xlen(&stream).await, 6, "{t}: each event appended once");
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_no_replica_confirmed_is_not_reported_published() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let streams = Streams::new("replicas");
    // An entry Redis appended but no replica confirmed is not reported published.
    let config =
        RedisPublisherConfig::default().with_min_replicas(1, Duration::from_millis(50)).with_create_streams(true);
    let publisher = RedisPublisher::connect_with(REDIS_URL, streams.destination(), config).await.expect("publisher");
    let event = sample_event(serde_json::json!({"parcel_id": "r1", "n": 0}));
    let results = publisher.publish(&[event]).await;
    let error = results[0].clone().expect_err("no replica in this setup");
    assert!(!error.is_permanent() && error.message().contains("WAIT 1"), "{error}");
    streams.cleanup().await;
}

//! The NATS JetStream adapter against a real nats-server (127.0.0.1:4222, JetStream on): events cross from
//! the outbox through JetStream to an `#[idempotent_handler]` exactly once, survive an unreachable broker
//! and a lost publish ack, keep per-aggregate order, and bad input ends as a typed error or a dead row,
//! never a panic or a redelivery loop.
//!
//! Each test uses its own stream and subject prefix (uuid suffix) and deletes the stream at the end.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{CAP, after, count_inbox, count_published, count_table, fast_config, outbox_row, outbox_rows};
use outbox_integration_tests::proxy::{Proxy, server_available};
use outbox_integration_tests::{TestDb, all_backends};
use outbox_seaorm::brokers::nats::async_nats::connection::State;
use outbox_seaorm::brokers::nats::async_nats::jetstream::message::PublishMessage;
use outbox_seaorm::brokers::nats::{NatsConsumer, NatsConsumerOptions, NatsPublisher};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{
    CancellationToken, Destination, Disposition, Error, OutboxEvent, PublishError, Publisher, RelayPass,
};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

const NATS: &str = "127.0.0.1:4222";
const NATS_URL: &str = "nats://127.0.0.1:4222";
const CONSUMER: &str = "nats_counter";

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "item.counted", version = 1, aggregate = "item")]
struct ItemCounted {
    #[aggregate_id]
    item: String,
    n: u64,
}

/// The consumer's effect: one `nats_effects` row per applied event (no unique key: only the inbox keeps
/// a redelivery from applying twice).
#[idempotent_handler(consumer = "nats_counter")]
async fn count_item(txn: &DatabaseTransaction, event: ItemCounted) -> Result<u64, DbErr> {
    let sql = format!("INSERT INTO nats_effects (item, n) VALUES ('{}', {})", event.item, event.n);
    txn.execute_unprepared(&sql).await?;
    Ok(event.n)
}

async fn create_effects_table(t: &TestDb) {
    let sql = "CREATE TABLE nats_effects (item VARCHAR(64) NOT NULL, n BIGINT NOT NULL)";
    t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
}

fn item_event(item: &str, n: u64) -> NewEvent {
    ItemCounted { item: item.to_owned(), n }.to_new_event().expect("valid event")
}

/// `items` aggregates with `per_item` events each, interleaved as a busy service would write them.
fn item_events(items: usize, per_item: u64) -> Vec<NewEvent> {
    (0..per_item).flat_map(|n| (0..items).map(move |i| item_event(&format!("it{i}"), n))).collect()
}

async fn enqueue_committed(t: &TestDb, events: &[NewEvent]) {
    for chunk in events.chunks(200) {
        outbox_seaorm::enqueue_all(&t.db, chunk).await.unwrap_or_else(|e| panic!("{t}: enqueue: {e}"));
    }
}

/// A stream and subject prefix of this test only, and a publisher connected to `url`.
struct Setup {
    publisher: NatsPublisher,
    stream: String,
    prefix: String,
}

impl Setup {
    async fn new(tag: &str, url: &str) -> Setup {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let stream = format!("OUTBOX_{}_{}", tag.to_ascii_uppercase(), &suffix[..12]);
        let prefix = format!("nats_{tag}_{}", &suffix[..12]);
        let destination =
            Destination::parse(&format!("{prefix}.{{aggregate_type}}.{{event_type}}")).expect("valid template");
        let publisher = NatsPublisher::connect(url, destination).await.unwrap_or_else(|e| panic!("connect: {e}"));
        publisher.ensure_stream(&stream, &[&format!("{prefix}.>")]).await.unwrap_or_else(|e| panic!("stream: {e}"));
        Setup { publisher, stream, prefix }
    }

    async fn consumer(&self, options: NatsConsumerOptions) -> Arc<NatsConsumer> {
        let consumer = NatsConsumer::connect_with(NATS_URL, &self.stream, CONSUMER, None, options)
            .await
            .unwrap_or_else(|e| panic!("consumer: {e}"));
        Arc::new(consumer)
    }

    async fn stream_messages(&self) -> u64 {
        let stream = self.publisher.jetstream().get_stream(&self.stream).await.expect("stream");
        stream.get_info().await.expect("stream info").state.messages
    }

    async fn delete(self) {
        self.publisher.jetstream().delete_stream(&self.stream).await.expect("delete stream");
    }
}

fn fast_consumer() -> NatsConsumerOptions {
    NatsConsumerOptions {
        fetch_wait: Duration::from_millis(300),
        retry_delay: Duration::from_millis(20),
        max_retry_delay: Duration::from_millis(200),
        ..NatsConsumerOptions::default()
    }
}

/// A consumer running `count_item` in the background; records every arrival `(item, n)` at the handler.
struct Running {
    consumer: Arc<NatsConsumer>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<outbox_seaorm::Result<()>>,
    arrivals: Arc<Mutex<Vec<(String, u64)>>>,
}

/// Starts `consumer` over `t`; the first delivery of every event whose `n` makes `fail_first` true returns
/// `Retry` without touching the database, as a handler whose transaction failed would.
fn start(t: &TestDb, consumer: Arc<NatsConsumer>, fail_first: fn(u64) -> bool) -> Running {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let failed = Arc::new(Mutex::new(HashSet::new()));
    let db = t.db.clone();
    let seen = arrivals.clone();
    let handler = move |event: OutboxEvent| {
        let db = db.clone();
        let seen = seen.clone();
        let failed = failed.clone();
        async move {
            let n = serde_json::from_str::<serde_json::Value>(&event.payload).ok().and_then(|v| v["n"].as_u64());
            if let Some(n) = n {
                seen.lock().expect("arrivals").push((event.aggregate_id.clone(), n));
                if fail_first(n) && failed.lock().expect("failed").insert(event.id) {
                    return Disposition::Retry;
                }
            }
            outbox_seaorm::disposition(&count_item(&db, &event).await)
        }
    };
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let running = consumer.clone();
    let task = tokio::spawn(async move { running.run(handler, token).await });
    Running { consumer, shutdown, task, arrivals }
}

impl Running {
    async fn stop(self) -> Vec<(String, u64)> {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        let run = result.expect("the consumer stops promptly on shutdown").expect("consumer task");
        run.unwrap_or_else(|e| panic!("consumer run: {e}"));
        self.arrivals.lock().expect("arrivals").clone()
    }
}

fn never(_: u64) -> bool {
    false
}

/// Polls `check` until it holds or `limit` passes.
async fn eventually(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn effects(t: &TestDb) -> i64 {
    count_table(t, "nats_effects").await
}

/// Within each aggregate, `n` never goes down at the handler (a repeat right after itself is a redelivery).
fn assert_increasing_per_aggregate(arrivals: &[(String, u64)], t: &TestDb) {
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for (item, n) in arrivals {
        if let Some(&previous) = last.get(item.as_str()) {
            assert!(*n >= previous, "{t}: aggregate {item}: n={n} arrived after n={previous}");
        }
        last.insert(item, *n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_crosses_nats_once_and_is_acked_after_its_commit() {
    if !server_available("NATS", NATS).await {
        return;
    }
    for t in all_backends("nats_round_trip").await {
        create_effects_table(&t).await;
        let nats = Setup::new("rt", NATS_URL).await;
        enqueue_committed(&t, &item_events(5, 4)).await;
        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), nats.publisher.clone(), fast_config()).unwrap();
        let passes = relay.drain(20).await.unwrap_or_else(|e| panic!("{t}: relay: {e}"));
        assert_eq!(passes.iter().map(|p| p.published).sum::<u64>(), 20, "{t}: {passes:?}");
        assert_eq!(nats.stream_messages().await, 20, "{t}");

        // Every 3rd event's first delivery fails before its commit: it is redelivered and applied once.
        let running = start(&t, nats.consumer(fast_consumer()).await, |n| n % 3 == 1);
        eventually(Duration::from_secs(10), "20 effects", async || effects(&t).await == 20).await;
        eventually(Duration::from_secs(5), "every message acked", async || {
            running.consumer.info().await.is_ok_and(|i| i.num_ack_pending == 0 && i.num_pending == 0)
        })
        .await;
        let arrivals = running.stop().await;
        assert_eq!(arrivals.len(), 25, "{t}: 20 events + 5 failed first deliveries");
        assert_increasing_per_aggregate(&arrivals, &t);
        assert_eq!(effects(&t).await, 20, "{t}");
        assert_eq!(count_inbox(&t, CONSUMER).await, 20, "{t}");
        nats.delete().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_acked_only_after_the_handler_committed() {
    if !server_available("NATS", NATS).await {
        return;
    }
    let t = all_backends("nats_ack_after_commit").await.remove(0);
    create_effects_table(&t).await;
    let nats = Setup::new("ackcommit", NATS_URL).await;
    enqueue_committed(&t, &[item_event("it0", 0)]).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), nats.publisher.clone(), fast_config()).unwrap();
    relay.drain(5).await.unwrap();

    // The handler holds the message until the test opens the gate, then commits its effect.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let db = t.db.clone();
    let held = gate.clone();
    let handler = move |event: OutboxEvent| {
        let db = db.clone();
        let held = held.clone();
        async move {
            held.acquire().await.expect("gate").forget();
            outbox_seaorm::disposition(&count_item(&db, &event).await)
        }
    };
    let consumer = nats.consumer(fast_consumer()).await;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let consumer = consumer.clone();
        let shutdown = shutdown.clone();
        async move { consumer.run(handler, shutdown).await }
    });
    eventually(Duration::from_secs(5), "the message is delivered", async || {
        consumer.info().await.is_ok_and(|i| i.num_ack_pending == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let info = consumer.info().await.unwrap();
    assert_eq!((info.num_ack_pending, info.ack_floor.stream_sequence), (1, 0), "{t}: not acked before the commit");
    assert_eq!(effects(&t).await, 0, "{t}");

    gate.add_permits(1);
    eventually(Duration::from_secs(5), "the message is acked", async || {
        consumer.info().await.is_ok_and(|i| i.num_ack_pending == 0 && i.ack_floor.stream_sequence == 1)
    })
    .await;
    assert_eq!(effects(&t).await, 1, "{t}");
    assert_eq!(count_inbox(&t, CONSUMER).await, 1, "{t}");
    shutdown.cancel();
    task.await.unwrap().unwrap();
    nats.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_drains_after_nats_comes_back() {
    if !server_available("NATS", NATS).await {
        return;
    }
    let t = all_backends("nats_outage").await.remove(0);
    create_effects_table(&t).await;
    let proxy = Proxy::start(NATS).await;
    let nats = Setup::new("outage", &format!("nats://{}", proxy.addr())).await;
    let events = item_events(10, 3);
    enqueue_committed(&t, &events[..10]).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), nats.publisher.clone(), fast_config()).unwrap();
    let now = chrono::Utc::now();
    let first = relay.run_once_at(now).await.unwrap();
    assert_eq!(first.published, 10, "{t}: {first:?}");
    enqueue_committed(&t, &events[10..]).await;

    proxy.cut();
    let client = nats.publisher.client().clone();
    eventually(Duration::from_secs(5), "the client notices the cut", async || {
        client.connection_state() != State::Connected
    })
    .await;
    for k in 1..=2 {
        let pass = relay.run_once_at(after(now, CAP * k)).await.unwrap();
        // Each aggregate's run stops at its failed head; the events behind it are released untried.
        let expected = RelayPass { claimed: 20, failed: 10, released: 10, ..RelayPass::default() };
        assert_eq!(pass, expected, "{t}: pass {k}");
    }
    let rows = outbox_rows(&t).await;
    let waiting: Vec<_> = rows.iter().filter(|r| r.published_at_ms.is_none()).collect();
    assert_eq!(waiting.len(), 20, "{t}: nothing lost, nothing published during the outage");
    assert!(waiting.iter().all(|r| r.dead_at_ms.is_none()), "{t}: transient failures never kill a row");
    let retried: Vec<_> = waiting.iter().filter(|r| r.attempts > 0).collect();
    assert_eq!(retried.len(), 10, "{t}: the head of each aggregate was tried");
    assert!(
        retried.iter().all(|r| r.attempts == 2),
        "{t}: {:?}",
        retried.iter().map(|r| r.attempts).collect::<Vec<_>>()
    );
    let error = retried[0].last_error.clone().unwrap_or_default();
    assert!(error.contains("not connected"), "{t}: last_error = {error:?}");

    proxy.restore();
    eventually(Duration::from_secs(10), "the client reconnects", async || {
        client.connection_state() == State::Connected
    })
    .await;
    let mut k = 3;
    while count_published(&t).await < 30 {
        assert!(k < 20, "{t}: the backlog did not drain");
        relay.run_once_at(after(now, CAP * k)).await.unwrap();
        k += 1;
    }
    assert_eq!(nats.stream_messages().await, 30, "{t}: each event stored once");

    let running = start(&t, nats.consumer(fast_consumer()).await, never);
    eventually(Duration::from_secs(10), "30 effects", async || effects(&t).await == 30).await;
    let arrivals = running.stop().await;
    assert_eq!(arrivals.len(), 30, "{t}: every event arrived once");
    assert_increasing_per_aggregate(&arrivals, &t);
    assert_eq!(count_inbox(&t, CONSUMER).await, 30, "{t}");
    nats.delete().await;
}

/// Publishes for real, then reports every event as failed: the broker's ack was "lost".
struct LosesAcks {
    inner: NatsPublisher,
    sent: Mutex<Vec<OutboxEvent>>,
}

impl Publisher for LosesAcks {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let results = self.inner.publish(events).await;
        assert!(results.iter().all(Result::is_ok), "the real publish succeeded: {results:?}");
        self.sent.lock().expect("sent").extend(events.iter().cloned());
        vec![Err(PublishError::transient("connection reset before the ack arrived")); events.len()]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_publish_ack_is_republished_and_jetstream_keeps_one_copy() {
    if !server_available("NATS", NATS).await {
        return;
    }
    for t in all_backends("nats_lost_ack").await {
        create_effects_table(&t).await;
        let nats = Setup::new("lostack", NATS_URL).await;
        enqueue_committed(&t, &item_events(8, 1)).await;
        let losing = LosesAcks { inner: nats.publisher.clone(), sent: Mutex::new(Vec::new()) };
        let now = chrono::Utc::now();
        let lossy = Relay::new(SeaOrmStore::new(t.db.clone()), &losing, fast_config()).unwrap();
        let pass = lossy.run_once_at(now).await.unwrap();
        assert_eq!((pass.claimed, pass.failed), (8, 8), "{t}: {pass:?}");
        assert_eq!(count_published(&t).await, 0, "{t}: the relay believes nothing was published");
        assert_eq!(nats.stream_messages().await, 8, "{t}: but JetStream has them");

        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), nats.publisher.clone(), fast_config()).unwrap();
        let pass = relay.run_once_at(after(now, CAP)).await.unwrap();
        assert_eq!((pass.claimed, pass.published), (8, 8), "{t}: {pass:?}");
        assert_eq!(nats.stream_messages().await, 8, "{t}: the republish was deduplicated by Nats-Msg-Id");

        // The broker itself says so: the same id again is acked as a duplicate.
        let sent = losing.sent.lock().expect("sent").clone();
        let again = nats.publisher.publish(&sent).await;
        assert!(again.iter().all(Result::is_ok), "{t}: {again:?}");
        let first = &sent[0];
        let subject = nats.publisher.destination().render(first);
        let ack = nats
            .publisher
            .jetstream()
            .send_publish(
                subject,
                PublishMessage::build().payload(first.payload.clone().into()).message_id(first.id.to_string()),
            )
            .await
            .expect("publish")
            .await
            .expect("ack");
        assert!(ack.duplicate, "{t}: {ack:?}");
        assert_eq!(nats.stream_messages().await, 8, "{t}");

        let running = start(&t, nats.consumer(fast_consumer()).await, never);
        eventually(Duration::from_secs(10), "8 effects", async || effects(&t).await == 8).await;
        let arrivals = running.stop().await;
        assert_eq!(arrivals.len(), 8, "{t}");
        assert_eq!(count_inbox(&t, CONSUMER).await, 8, "{t}");
        nats.delete().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_events_keep_per_aggregate_order_through_nats() {
    if !server_available("NATS", NATS).await {
        return;
    }
    let t = all_backends("nats_order").await.remove(0);
    create_effects_table(&t).await;
    let nats = Setup::new("order", NATS_URL).await;
    enqueue_committed(&t, &item_events(50, 20)).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), nats.publisher.clone(), fast_config()).unwrap();
    let started = Instant::now();
    let passes = relay.drain(100).await.unwrap();
    let publish_time = started.elapsed();
    assert_eq!(passes.iter().map(|p| p.published).sum::<u64>(), 1000, "{t}");
    assert_eq!(nats.stream_messages().await, 1000, "{t}");

    // Event n=4 of every aggregate fails once at the handler, while n=5 is in the same fetch: the retry must
    // not let n=5 overtake it.
    let started = Instant::now();
    let running = start(&t, nats.consumer(fast_consumer()).await, |n| n == 4);
    eventually(Duration::from_secs(20), "1000 effects", async || effects(&t).await == 1000).await;
    let consume_time = started.elapsed();
    let arrivals = running.stop().await;
    println!(
        "{t}: 1000 events over 50 aggregates: relay {publish_time:?} ({} passes), consumer {consume_time:?}",
        passes.len()
    );
    assert_eq!(arrivals.len(), 1050, "{t}: 1000 events + 50 failed first deliveries");
    assert_increasing_per_aggregate(&arrivals, &t);
    for i in 0..50 {
        let item = format!("it{i}");
        let ns: Vec<u64> = arrivals.iter().filter(|(a, _)| *a == item).map(|(_, n)| *n).collect();
        let mut expected: Vec<u64> = (0..20).collect();
        expected.insert(5, 4);
        assert_eq!(ns, expected, "{t}: aggregate {item}");
    }
    assert_eq!(count_inbox(&t, CONSUMER).await, 1000, "{t}");
    nats.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_message_is_parked_once_and_the_stream_moves_on() {
    if !server_available("NATS", NATS).await {
        return;
    }
    let t = all_backends("nats_poison").await.remove(0);
    create_effects_table(&t).await;
    let nats = Setup::new("poison", NATS_URL).await;
    let js = nats.publisher.jetstream();
    // No envelope at all, then an envelope with a broken id: neither can be decoded.
    js.publish(format!("{}.raw.garbage", nats.prefix), "not an outbox message".into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    js.send_publish(
        format!("{}.raw.garbage", nats.prefix),
        PublishMessage::build().payload("{}".into()).header("ce_id", "not-a-uuid").header("outbox_schema_version", "1"),
    )
    .await
    .expect("publish")
    .await
    .expect("ack");
    // An event type this handler does not know: the handler parks it.
    let unknown = NewEvent::new("item", "it0", "item.renamed", &serde_json::json!({"item": "it0"})).unwrap();
    let mut events = vec![unknown];
    events.extend(item_events(3, 2));
    enqueue_committed(&t, &events).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), nats.publisher.clone(), fast_config()).unwrap();
    relay.drain(10).await.unwrap();
    assert_eq!(nats.stream_messages().await, 9, "{t}");

    let running = start(&t, nats.consumer(fast_consumer()).await, never);
    eventually(Duration::from_secs(10), "6 effects", async || effects(&t).await == 6).await;
    // Give a redelivery loop the chance to show itself: two more fetch rounds.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let info = running.consumer.info().await.unwrap();
    let arrivals = running.stop().await;
    assert_eq!(arrivals.len(), 6, "{t}: the unparseable messages never reached the handler");
    assert_eq!(info.num_ack_pending, 0, "{t}: {info:?}");
    assert_eq!(info.num_redelivered, 0, "{t}: nothing was redelivered: {info:?}");
    assert_eq!(info.delivered.stream_sequence, 9, "{t}: {info:?}");
    assert_eq!(info.ack_floor.stream_sequence, 9, "{t}: parked messages are terminated, not pending: {info:?}");
    assert_eq!(count_inbox(&t, CONSUMER).await, 6, "{t}");
    nats.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_templates_are_typed_config_errors() {
    if !server_available("NATS", NATS).await {
        return;
    }
    let d = || Destination::parse("events.{aggregate_type}.{event_type}").unwrap();
    for (url, expected) in [
        ("127.0.0.1:4222", "is not a URL"),
        ("mqtt://127.0.0.1:4222", "scheme \"mqtt\""),
        ("kafka://127.0.0.1:9092", "is not a NATS URL"),
        ("nats://", "has no host"),
    ] {
        let err = NatsPublisher::connect(url, d()).await.expect_err(url);
        assert!(matches!(err, Error::InvalidConfig { .. }), "{url}: {err:?}");
        assert!(err.to_string().contains(expected), "{url}: {err}");
        let err = NatsConsumer::connect(url, "S", "c", None).await.expect_err(url);
        assert!(matches!(err, Error::InvalidConfig { .. }), "{url}: {err:?}");
    }
    // Nothing listens on port 1: a broker error naming what failed, without the password.
    let err = NatsPublisher::connect("nats://user:secret@127.0.0.1:1", d()).await.expect_err("refused");
    assert!(matches!(err, Error::Broker { .. }), "{err:?}");
    assert!(
        err.to_string().contains("connect to nats://***@127.0.0.1:1") && !err.to_string().contains("secret"),
        "{err}"
    );

    for template in ["events..{event_type}", "events.{event_type}.", "events.*.{event_type}", "ev ents.{event_type}"] {
        let err = NatsPublisher::connect(NATS_URL, Destination::parse(template).unwrap()).await.expect_err(template);
        assert!(matches!(err, Error::InvalidConfig { field: "destination", .. }), "{template}: {err:?}");
        assert!(err.to_string().contains("cannot form a NATS subject"), "{template}: {err}");
    }

    let err = NatsConsumer::connect(NATS_URL, "NO_SUCH_STREAM_NATS_TEST", "c", None).await.expect_err("no stream");
    assert!(matches!(err, Error::Broker { .. }), "{err:?}");
    assert!(err.to_string().contains("NO_SUCH_STREAM_NATS_TEST"), "{err}");
    let options = NatsConsumerOptions { batch_size: 0, ..NatsConsumerOptions::default() };
    let err = NatsConsumer::connect_with(NATS_URL, "S", "c", None, options).await.expect_err("batch 0");
    assert!(matches!(err, Error::InvalidConfig { field: "batch_size", .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_subject_or_oversized_message_goes_dead_with_a_clear_error() {
    if !server_available("NATS", NATS).await {
        return;
    }
    for t in all_backends("nats_bad_subject").await {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let prefix = format!("nats_bad_{}", &suffix[..12]);
        let stream = format!("OUTBOX_BAD_{}", &suffix[..12]);
        let destination = Destination::parse(&format!("{prefix}.{{aggregate_type}}.{{aggregate_id}}")).unwrap();
        let publisher = NatsPublisher::connect(NATS_URL, destination).await.unwrap();
        publisher.ensure_stream(&stream, &[&format!("{prefix}.>")]).await.unwrap();
        let max_payload = publisher.client().server_info().max_payload;

        let payload = |n: u64| serde_json::json!({ "n": n });
        let spaced = NewEvent::new("item", "has space", "item.counted", &payload(1)).unwrap();
        let wildcard = NewEvent::new("item", "a*", "item.counted", &payload(2)).unwrap();
        let tail = NewEvent::new("item", "x.", "item.counted", &payload(3)).unwrap();
        // Within the outbox's own limit, over the server's once the headers are added.
        let big_text = "x".repeat(max_payload.min(outbox_seaorm::DEFAULT_MAX_PAYLOAD_BYTES) - 64);
        let big = NewEvent::new("item", "big", "item.counted", &big_text).unwrap();
        let fine = NewEvent::new("item", "ok-1", "item.counted", &payload(4)).unwrap();
        let ids: Vec<_> = [&spaced, &wildcard, &tail, &big, &fine].iter().map(|e| e.id()).collect();
        outbox_seaorm::enqueue_all(&t.db, &[spaced, wildcard, tail, big, fine]).await.unwrap();

        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher.clone(), fast_config()).unwrap();
        let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(pass, RelayPass { claimed: 5, published: 1, dead: 4, ..RelayPass::default() }, "{t}");
        for (id, expected) in [
            (ids[0], "contains whitespace"),
            (ids[1], "contains a wildcard"),
            (ids[2], "has an empty token"),
            (ids[3], "over the server's max_payload"),
        ] {
            let row = outbox_row(&t, id).await;
            let error = row.last_error.clone().unwrap_or_default();
            assert!(row.dead_at_ms.is_some() && row.attempts == 1, "{t}: {row:?}");
            assert!(error.contains(expected), "{t}: last_error of {} = {error:?}", row.aggregate_id);
        }
        assert!(outbox_row(&t, ids[4]).await.published_at_ms.is_some(), "{t}");
        let info = publisher.jetstream().get_stream(&stream).await.unwrap().get_info().await.unwrap();
        assert_eq!(info.state.messages, 1, "{t}: only the valid event reached the stream");
        publisher.jetstream().delete_stream(&stream).await.unwrap();
    }
}

//! The NATS JetStream adapter against a real nats-server (127.0.0.1:4222, JetStream on), beyond the
//! contract suite (`contract_nats.rs`): the publisher through an unreachable broker and a lost publish
//! ack, acks only after the commit, the order after a consumer crashed holding messages, and bad input
//! and bad settings ending as typed errors or dead letters, never a panic or a redelivery loop.
//!
//! Each test uses its own stream and subject prefix (uuid suffix) and deletes them at the end.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{CAP, after, count_inbox, count_published, count_table, fast_config};
use outbox_integration_tests::contract::{RawMessage, Running, case_db, counting_consumer, eventually};
use outbox_integration_tests::proxy::server_available;
use outbox_integration_tests::{TestDb, all_backends};
use outbox_seaorm::brokers::nats::async_nats::jetstream::consumer::{self, AckPolicy};
use outbox_seaorm::brokers::nats::async_nats::jetstream::message::PublishMessage;
use outbox_seaorm::brokers::nats::async_nats::jetstream::stream::RawMessageErrorKind;
use outbox_seaorm::brokers::nats::async_nats::{HeaderMap, HeaderValue};
use outbox_seaorm::brokers::nats::{NatsPublisher, NatsTransport, NatsTransportOptions};
use outbox_seaorm::consume::Transport;
use outbox_seaorm::prelude::*;
use outbox_seaorm::{
    Consumer, ConsumerConfig, Destination, Error, OutboxEvent, PublishError, Publisher, Received, SeaOrmGroupCommit,
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
#[idempotent_handler]
async fn count_item(txn: &DatabaseTransaction, event: ItemCounted) -> Result<u64, DbErr> {
    let sql = format!("INSERT INTO nats_effects (item, n) VALUES ('{}', {})", event.item, event.n);
    txn.execute_unprepared(&sql).await?;
    Ok(event.n)
}

async fn create_effects_table(t: &TestDb) {
    let sql = "CREATE TABLE nats_effects (item VARCHAR(64) NOT NULL, n BIGINT NOT NULL)";
    t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
}

/// A consumer running `count_item` on every `ItemCounted`, registered as written, in groups on the test's
/// database.
fn counting(t: &TestDb) -> Consumer {
    let config = ConsumerConfig::default().with_fetch_wait(Duration::from_millis(300));
    Consumer::new(CONSUMER).with_config(config).with_group_commit(SeaOrmGroupCommit::new(t.db.clone())).on(count_item)
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

/// Short `ack_wait`, so redeliveries come within the test's time.
fn options() -> NatsTransportOptions {
    NatsTransportOptions::default().with_ack_wait(Duration::from_secs(2))
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
        let stream = format!("OUTBOX_{}_{}", tag.to_ascii_uppercase(), &suffix[..16]);
        let prefix = format!("nats_{tag}_{}", &suffix[..16]);
        let destination =
            Destination::parse(&format!("{prefix}.{{aggregate_type}}.{{event_type}}")).expect("valid template");
        let publisher = NatsPublisher::connect(url, destination).await.unwrap_or_else(|e| panic!("connect: {e}"));
        publisher.ensure_stream(&stream, &[&format!("{prefix}.>")]).await.unwrap_or_else(|e| panic!("stream: {e}"));
        Setup { publisher, stream, prefix }
    }

    async fn transport(&self, durable: &str, options: NatsTransportOptions) -> NatsTransport {
        NatsTransport::connect_with(NATS_URL, &self.stream, durable, None, options)
            .await
            .unwrap_or_else(|e| panic!("transport: {e}"))
    }

    async fn stream_messages(&self) -> u64 {
        let stream = self.publisher.jetstream().get_stream(&self.stream).await.expect("stream");
        stream.get_info().await.expect("stream info").state.messages
    }

    async fn consumer_info(&self, durable: &str) -> consumer::Info {
        let stream = self.publisher.jetstream().get_stream(&self.stream).await.expect("stream");
        stream.consumer_info(durable).await.expect("consumer info")
    }

    /// The dead letters on `outbox.dead.<stream>.<durable>`: headers and payload.
    async fn dead_letters(&self, durable: &str) -> Vec<(BTreeMap<String, String>, Vec<u8>)> {
        let dead = self.publisher.jetstream().get_stream_no_info(format!("{}_DEAD", self.stream)).await.expect("dead");
        let subject = format!("outbox.dead.{}.{durable}", self.stream);
        let mut out = Vec::new();
        let mut next = 1;
        loop {
            match dead.get_first_raw_message_by_subject(&subject, next).await {
                Ok(message) => {
                    next = message.sequence + 1;
                    let headers = message
                        .headers
                        .iter()
                        .filter_map(|(k, v)| v.last().map(|v| (k.to_string(), v.as_str().to_owned())))
                        .collect();
                    out.push((headers, message.payload.to_vec()));
                }
                Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => return out,
                Err(error) => panic!("dead letters: {error}"),
            }
        }
    }

    async fn delete(self) {
        let js = self.publisher.jetstream();
        js.delete_stream(&self.stream).await.expect("delete stream");
        let _ = js.delete_stream(format!("{}_DEAD", self.stream)).await;
    }
}

async fn effects(t: &TestDb) -> i64 {
    count_table(t, "nats_effects").await
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
    let (db, held) = (t.db.clone(), gate.clone());
    let handler = move |received: Received<ItemCounted>| {
        let (db, held) = (db.clone(), held.clone());
        async move {
            held.acquire().await.expect("gate").forget();
            outbox_seaorm::deliver(&db, CONSUMER, &received.envelope, count_item).await
        }
    };
    let consumer = Consumer::new(CONSUMER).on::<ItemCounted>(handler);
    // An ack_wait of 6 s, kept alive every 2 s: a keep-alive may come 4 s late on a loaded machine before
    // the server would redeliver (with 2 s, a 1.3 s stall was enough).
    let ack_wait = Duration::from_secs(6);
    let running = Running::start(consumer, nats.transport(CONSUMER, options().with_ack_wait(ack_wait)).await);
    eventually(Duration::from_secs(30), "the message is delivered", async || {
        nats.consumer_info(CONSUMER).await.num_ack_pending == 1
    })
    .await;
    // Longer than ack_wait: the transport keeps the held message alive, so it is not redelivered.
    tokio::time::sleep(ack_wait + Duration::from_secs(2)).await;
    let info = nats.consumer_info(CONSUMER).await;
    assert_eq!((info.num_ack_pending, info.ack_floor.stream_sequence), (1, 0), "{t}: not acked before the commit");
    assert_eq!(info.num_redelivered, 0, "{t}: kept alive while held: {info:?}");
    assert_eq!(effects(&t).await, 0, "{t}");

    gate.add_permits(1);
    eventually(Duration::from_secs(30), "the message is acked", async || {
        let info = nats.consumer_info(CONSUMER).await;
        info.num_ack_pending == 0 && info.ack_floor.stream_sequence == 1
    })
    .await;
    assert_eq!(effects(&t).await, 1, "{t}");
    assert_eq!(count_inbox(&t, CONSUMER).await, 1, "{t}");
    running.stop().await;
    nats.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_crashed_consumer_held_are_applied_before_newer_ones() {
    if !server_available("NATS", NATS).await {
        return;
    }
    let t = case_db("nats_crash_order").await;
    let nats = Setup::new("crash", NATS_URL).await;
    let events = outbox_integration_tests::contract::counted_events(1, 6);
    outbox_seaorm::enqueue_all(&t.db, &events).await.unwrap();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), nats.publisher.clone(), fast_config()).unwrap();
    let mut published = 0;
    while published < 6 {
        published += relay.run_once().await.unwrap().published;
    }

    for (durable, recover) in [("kept", true), ("unordered", false)] {
        // A process takes the first two messages and dies without acking them.
        let crashed = nats.transport(durable, options()).await;
        let taken = crashed.fetch(2, Duration::from_secs(1)).await.expect("fetch");
        assert_eq!(taken.len(), 2, "{durable}");
        drop(crashed);

        let options = options().with_wait_for_lost_deliveries(recover);
        let config = outbox_integration_tests::contract::fast_config();
        let (consumer, applied) = counting_consumer(&t, durable, config, |_, _| false);
        let running = Running::start(consumer, nats.transport(durable, options).await);
        eventually(Duration::from_secs(20), "6 applied", async || applied.all().len() == 6).await;
        running.stop().await;
        let order: Vec<u64> = applied.all().into_iter().map(|(_, n)| n).collect();
        if recover {
            assert_eq!(order, [0, 1, 2, 3, 4, 5], "the crashed consumer's messages first, after ack_wait");
        } else {
            // What the recovery prevents: JetStream redelivers the lost two only after ack_wait.
            assert_eq!(order, [2, 3, 4, 5, 0, 1], "without recovery, newer messages overtake");
        }
    }
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

        let running = Running::start(counting(&t), nats.transport(CONSUMER, options()).await);
        eventually(Duration::from_secs(10), "8 effects", async || effects(&t).await == 8).await;
        let stats = running.stop().await;
        assert_eq!((stats.processed, stats.duplicates), (8, 0), "{t}: {stats:?}");
        assert_eq!(count_inbox(&t, CONSUMER).await, 8, "{t}");
        nats.delete().await;
    }
}

/// An envelope for raw messages.
fn sample_event(payload: serde_json::Value) -> OutboxEvent {
    let event = NewEvent::new("item", "raw", "contract.counted", &payload).expect("event");
    outbox_seaorm::testkit::outbox_event(&event.with_schema_version(2).expect("version"), 1, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_dead_lettered_once_with_their_payload_and_headers() {
    if !server_available("NATS", NATS).await {
        return;
    }
    let t = case_db("nats_bad_messages").await;
    let nats = Setup::new("badmsg", NATS_URL).await;
    let js = nats.publisher.jetstream();
    let publish = async |headers: Vec<(String, String)>, payload: Vec<u8>| {
        let mut map = HeaderMap::new();
        for (name, value) in &headers {
            map.insert(name.as_str(), value.parse::<HeaderValue>().expect("value"));
        }
        let subject = format!("{}.raw.message", nats.prefix);
        let message = PublishMessage::build().payload(payload.into()).headers(map);
        js.send_publish(subject, message).await.expect("publish").await.expect("ack");
    };
    // No envelope at all.
    publish(Vec::new(), b"not an outbox message".to_vec()).await;
    // A header with a control character, which could forge a log line.
    let event = sample_event(serde_json::json!({"item": "raw", "n": 1}));
    let mut headers = outbox_seaorm::broker::envelope_headers(&event);
    headers.push(("x-note".into(), "line one\u{1}forged".into()));
    publish(headers, event.payload.clone().into_bytes()).await;
    // A payload over the consumer's max_payload_bytes, carrying its own Nats-Msg-Id.
    let big = sample_event(serde_json::json!({"item": "raw", "n": 2, "pad": "x".repeat(4096)}));
    let mut headers = outbox_seaorm::broker::envelope_headers(&big);
    headers.push(("Nats-Msg-Id".into(), big.id.to_string()));
    publish(headers, big.payload.clone().into_bytes()).await;
    // And a valid event behind them.
    outbox_seaorm::enqueue_all(&t.db, &outbox_integration_tests::contract::counted_events(1, 1)).await.unwrap();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), nats.publisher.clone(), fast_config()).unwrap();
    relay.drain(5).await.unwrap();

    // Two consumers of the stream dead-letter the same messages: each keeps its own dead letters.
    for durable in ["bm_a", "bm_b"] {
        let config = ConsumerConfig { max_payload_bytes: 1024, ..outbox_integration_tests::contract::fast_config() };
        let (consumer, applied) = counting_consumer(&t, durable, config, |_, _| false);
        let running = Running::start(consumer, nats.transport(durable, options()).await);
        eventually(Duration::from_secs(10), "1 applied, 3 dead", async || {
            applied.all().len() == 1 && running.stats().dead_lettered == 3
        })
        .await;
        // Longer than ack_wait: a message acked after its dead letter never comes back.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let stats = running.stop().await;
        assert_eq!((stats.processed, stats.dead_lettered, stats.retried), (1, 3, 0), "{durable}: {stats:?}");
        let info = nats.consumer_info(durable).await;
        assert_eq!((info.num_ack_pending, info.num_redelivered), (0, 0), "{durable}: {info:?}");
        assert_eq!(info.ack_floor.stream_sequence, 4, "{durable}: {info:?}");

        let dead = nats.dead_letters(durable).await;
        assert_eq!(dead.len(), 3, "{durable}: {dead:?}");
        let find = |what: &str, pick: &dyn Fn(&RawMessage) -> bool| {
            dead.iter().find(|d| pick(d)).unwrap_or_else(|| panic!("{durable}: no dead letter {what}: {dead:?}"))
        };
        find("with the raw payload", &|(_, p)| p.as_slice() == b"not an outbox message");
        let (headers, _) = find("of the control characters", &|(h, _)| h.contains_key("x-note"));
        let reason = &headers["outbox_dead_reason"];
        assert!(reason.contains("control characters") && !reason.contains('\u{1}'), "escaped: {reason:?}");
        assert_eq!(headers["x-note"], "line one\u{1}forged", "the original header is kept as it was");
        assert_eq!(headers["ce_id"], event.id.to_string());
        let (headers, payload) = find("of the big payload", &|(_, p)| p.as_slice() == big.payload.as_bytes());
        assert!(headers["outbox_dead_reason"].contains("max_payload_bytes"), "{headers:?}");
        assert_eq!(headers["outbox_dead_Nats-Msg-Id"], big.id.to_string(), "the original id is kept, renamed");
        assert_eq!(headers["outbox_dead_consumer"], durable);
        assert_eq!(headers["outbox_dead_origin"], format!("{}.raw.message", nats.prefix));
        assert_eq!(payload.len(), big.payload.len());
    }
    nats.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_templates_are_typed_config_errors() {
    if !server_available("NATS", NATS).await {
        return;
    }
    // URLs: the publisher contract (`publisher_refuses_bad_urls`); the transport parses them the same way.
    let err = NatsTransport::connect("nats://", "S", "c", None).await.expect_err("no host");
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    let err = NatsTransport::connect("nats://user:secret@127.0.0.1:1", "S", "c", None).await.expect_err("refused");
    assert!(!err.to_string().contains("secret"), "{err}");

    for template in ["events..{event_type}", "events.{event_type}.", "events.*.{event_type}", "ev ents.{event_type}"] {
        let err = NatsPublisher::connect(NATS_URL, Destination::parse(template).unwrap()).await.expect_err(template);
        assert!(matches!(err, Error::InvalidConfig { field: "destination", .. }), "{template}: {err:?}");
        assert!(err.to_string().contains("cannot form a NATS subject"), "{template}: {err}");
    }

    let err = NatsTransport::connect(NATS_URL, "NO_SUCH_STREAM_NATS_TEST", "c", None).await.expect_err("no stream");
    assert!(matches!(err, Error::Broker { .. }), "{err:?}");
    assert!(err.to_string().contains("NO_SUCH_STREAM_NATS_TEST"), "{err}");

    let nats = Setup::new("config", NATS_URL).await;
    let connect = async |durable: &str, options: NatsTransportOptions| {
        NatsTransport::connect_with(NATS_URL, &nats.stream, durable, None, options).await.map(|_| ())
    };
    let cases: Vec<(&str, NatsTransportOptions, &str)> = vec![
        ("a.b", NatsTransportOptions::default(), "durable_name"),
        ("c", NatsTransportOptions::default().with_dead_letters("BAD.NAME", "dead.x"), "dead_letter_stream"),
        ("c", NatsTransportOptions::default().with_dead_letters("DEAD_OK", "dead.*"), "dead_letter_subject"),
        ("c", NatsTransportOptions::default().with_dead_letters("DEAD_OK", "dead..x"), "dead_letter_subject"),
        ("c", NatsTransportOptions::default().with_dead_letters(&nats.stream, "dead.x"), "dead_letter_stream"),
        (
            "c",
            NatsTransportOptions::default().with_dead_letters("DEAD_OK", &format!("{}.dead", nats.prefix)),
            "dead_letter_subject",
        ),
        ("c", NatsTransportOptions::default().with_ack_wait(Duration::from_millis(500)), "ack_wait"),
        ("c", NatsTransportOptions::default().with_max_deliver(0), "max_deliver"),
    ];
    for (durable, options, field) in cases {
        let err = connect(durable, options.clone()).await.expect_err(field);
        assert!(
            matches!(&err, Error::InvalidConfig { field: f, .. } if *f == field),
            "{durable} {options:?}: expected {field}: {err}"
        );
    }
    // The default dead-letter stream of a stream name near the limit would be too long.
    let long = "S".repeat(252);
    let err = NatsTransport::connect(NATS_URL, &long, "c", None).await.expect_err("long");
    assert!(matches!(err, Error::InvalidConfig { field: "dead_letter_stream", .. }), "{err}");

    // A durable created elsewhere with `ack_policy: all` would let an ack cover earlier messages.
    let stream = nats.publisher.jetstream().get_stream(&nats.stream).await.unwrap();
    let config = consumer::pull::Config {
        durable_name: Some("acks_all".into()),
        ack_policy: AckPolicy::All,
        ..Default::default()
    };
    stream.create_consumer(config).await.expect("create consumer");
    let err = connect("acks_all", options()).await.expect_err("ack policy all");
    assert!(matches!(err, Error::InvalidConfig { field: "durable_name", .. }), "{err}");
    assert!(err.to_string().contains("explicit acks"), "{err}");
    nats.delete().await;
}

//! The Kafka adapter end to end against a real Kafka-protocol broker: outbox rows → `Relay` +
//! `KafkaPublisher` → Kafka → `KafkaTransport` and the `Consumer` driver → an `#[idempotent_handler]` that
//! writes an effect row.
//!
//! tansu on 127.0.0.1:9092, started by `.ci/kafka.sh start` (skipped when absent outside CI): round trip on
//! every backend, a foreign message dead-lettered with its key, payload and raw headers (not UTF-8, control
//! characters) to a `.dlq` topic created on first use. The faults run against librdkafka's mock cluster in
//! `broker_kafka_mock.rs`; what every broker shares is in `contract_kafka.rs`.
//!
//! Transports of tansu here use direct partition assignment: a consumer-group join there takes about 23 s
//! with librdkafka's default timeouts.

use crate::common;
use crate::kafka;

use std::time::{Duration, Instant};

use common::{count_inbox, count_table, count_unpublished, fast_config};
use kafka::{
    Seen, assignment, committed, committed_total, create_shipments, eventually, shipped, shipping, to, unique,
};
use outbox_integration_tests::all_backends;
use outbox_integration_tests::contract::Running;
use outbox_integration_tests::proxy::server_available;
use outbox_seaorm::brokers::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_seaorm::brokers::kafka::rdkafka::client::DefaultClientContext;
use outbox_seaorm::brokers::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use outbox_seaorm::brokers::kafka::rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders};
use outbox_seaorm::brokers::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_seaorm::brokers::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use outbox_seaorm::brokers::kafka::{KafkaPublisher, KafkaTransport};
use outbox_seaorm::{NewEvent, Relay, SeaOrmStore};

const TANSU: &str = "127.0.0.1:9092";

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
    let deadline = Instant::now() + Duration::from_secs(30);
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

        let group = unique("kafka-billing");
        let transport = KafkaTransport::connect(TANSU, &group, assignment(&topic, 3), &[]).expect("transport");
        let seen = Seen::default();
        let running = Running::start(shipping(&t.db, &seen, |_, _| false), transport);
        eventually("30 shipments", Duration::from_secs(20), || async {
            count_table(&t, "kafka_shipments").await == 30
        })
        .await;
        let stats = running.stop().await;

        assert_eq!((stats.processed, stats.duplicates, stats.dead_lettered), (30, 0, 0), "{t}: {stats:?}");
        assert_eq!(count_inbox(&t, "kafka_shipping").await, 30, "{t}");
        let mut per_parcel: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
        for (parcel, n) in seen.all() {
            per_parcel.entry(parcel).or_default().push(n);
        }
        for (parcel, ns) in &per_parcel {
            assert!(ns.windows(2).all(|w| w[0] < w[1]), "{t}: {parcel} applied out of order: {ns:?}");
        }
        // Offsets were committed past every handled message (offsets start at 0 in a fresh topic).
        let committed = committed(TANSU, &group, &topic, 3).await;
        assert_eq!(committed_total(&committed), 30, "{t}: {committed:?}");
    }
}

/// A message from a producer that knows nothing about the outbox, with a key, a header that is not
/// UTF-8 and one with control characters: dead-lettered to `<topic>.dlq` (created on first use) with
/// its key, payload and headers byte for byte, and the messages after it are processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_dead_letters_keep_key_payload_and_raw_headers() {
    if !server_available("Kafka", TANSU).await {
        return;
    }
    let t = all_backends("kafka_dead_letter").await.swap_remove(0);
    create_shipments(&t).await;
    let topic = unique("kafka-dead-letter");
    let dlq = format!("{topic}.dlq");
    create_topics(TANSU, &[(&topic, 1)]).await;

    let raw: FutureProducer = ClientConfig::new().set("bootstrap.servers", TANSU).create().expect("producer");
    let headers = OwnedHeaders::new()
        .insert(Header { key: "binary", value: Some(&[0xff_u8, 0x00, 0xfe][..]) })
        .insert(Header { key: "note", value: Some("line\nbreak\u{1b}[31m".as_bytes()) });
    raw.send(FutureRecord::to(&topic).key("p1").payload("{\"hello\":1}").headers(headers), Duration::from_secs(5))
        .await
        .expect("raw message delivered");
    outbox_seaorm::enqueue_all(&t.db, &[shipped("p1", 1), shipped("p2", 2)]).await.expect("enqueue");
    let publisher = KafkaPublisher::connect(TANSU, to(&topic), &[]).expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    relay.drain(10).await.expect("relay");

    let group = unique("kafka-dead-letter");
    let transport = KafkaTransport::connect(TANSU, &group, assignment(&topic, 1), &[]).expect("transport");
    assert_eq!(transport.dead_letter_topic(&topic), dlq);
    let seen = Seen::default();
    let running = Running::start(shipping(&t.db, &seen, |_, _| false), transport);
    eventually("2 shipments and a dead letter", Duration::from_secs(20), || async {
        count_table(&t, "kafka_shipments").await == 2 && running.stats().dead_lettered == 1
    })
    .await;
    let stats = running.stop().await;
    assert_eq!((stats.processed, stats.dead_lettered), (2, 1), "{t}: {stats:?}");
    let committed = committed(TANSU, &group, &topic, 1).await;
    assert_eq!(committed, vec![(topic.clone(), 0, 3)], "{t}: committed past the dead letter and both events");

    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", TANSU)
        .set("group.id", unique("kafka-reader"))
        .create()
        .expect("reader");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(&dlq, 0, Offset::Beginning).expect("partition");
    reader.assign(&list).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(30);
    let letter = loop {
        assert!(Instant::now() < deadline, "{t}: no dead letter in {dlq}");
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) {
            break m.detach();
        }
    };
    assert_eq!((letter.key(), letter.payload()), (Some(&b"p1"[..]), Some(&b"{\"hello\":1}"[..])), "{t}");
    let headers: Vec<(String, Option<Vec<u8>>)> = letter
        .headers()
        .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
        .unwrap_or_default();
    let get = |name: &str| headers.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.clone());
    assert_eq!(get("binary").as_deref(), Some(&[0xff_u8, 0x00, 0xfe][..]), "{t}: non-UTF-8 header kept");
    assert_eq!(get("note").as_deref(), Some("line\nbreak\u{1b}[31m".as_bytes()), "{t}: header kept as it was");
    let reason = String::from_utf8(get("outbox_dead_reason").unwrap_or_default()).expect("UTF-8 reason");
    assert!(reason.contains("ce_id") && !reason.chars().any(char::is_control), "{t}: {reason:?}");
    assert_eq!(get("outbox_dead_origin").as_deref(), Some(topic.as_bytes()), "{t}");
    assert_eq!(get("outbox_dead_consumer").as_deref(), Some(&b"kafka_shipping"[..]), "{t}");
    // Every client that knows the topics goes first: librdkafka 2.12 can crash (a NULL topic name in its
    // metadata cache) when a live client's metadata refresh meets a topic deleted under it.
    drop((reader, raw));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", TANSU).create().expect("admin client");
    let _ = admin.delete_topics(&[&topic, &dlq], &options).await;
}

//! The RabbitMQ adapter against a real RabbitMQ (127.0.0.1:5672, guest/guest) and real databases: events
//! go outbox → relay → exchange → queue → consumer → inbox, each applied once, through a broker outage, lost
//! confirms and unroutable messages; bad configuration and bad input (control characters in headers, an
//! oversized payload, invalid dead-letter queue names). What every broker shares (order under retries,
//! poison messages, replay, newer versions, lost acks) is in `contract_rabbitmq.rs`.

use crate::common;

use std::time::{Duration, Instant};

use chrono::Utc;
use common::{CAP, after, count_published, count_table, enqueue_committed, fast_config, outbox_rows};
use outbox_integration_tests::contract::Running;
use outbox_integration_tests::proxy::server_available;
use outbox_integration_tests::{TestDb, all_backends};
use outbox_seaorm::brokers::rabbitmq::{DEFAULT_ROUTING_KEY, RabbitPublisher, RabbitTransport, lapin};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{Backoff, Consumer, ConsumerConfig, Destination, Error, Publisher, Received};
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
#[idempotent_handler]
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

/// A consumer of `ParcelShipped` named [`CONSUMER`] applying [`ship`], with short retry delays.
fn shipping(db: &DatabaseConnection) -> Consumer {
    let db = db.clone();
    let config = ConsumerConfig::default()
        .with_backoff(Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200), multiplier: 2 })
        .with_fetch_wait(Duration::from_millis(200));
    Consumer::new(CONSUMER).with_config(config).on::<ParcelShipped>(move |received: Received<ParcelShipped>| {
        let db = db.clone();
        async move { outbox_seaorm::deliver(&db, CONSUMER, &received.envelope, ship).await }
    })
}

/// Waits until `done()` holds, panicking with `what` after `timeout`.
async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
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
        // The dead-letter queue a transport declared, if one did.
        let _ = admin.delete_queue(&format!("{queue}.dead")).await;
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
async fn a_published_event_is_a_persistent_message_with_the_envelope_in_properties_and_headers() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    for t in all_backends("rmq_round_trip").await {
        create_effect_table(&t).await;
        let (exchange, queue) = names("round-trip");
        let audit = format!("{queue}-audit");
        let publisher = publisher(AMQP_URL, &exchange).await;
        publisher.declare_queue(&exchange, &queue, "rmq.parcel.#").await.expect("declare queue");
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
        assert_eq!(got.delivery.routing_key.as_str(), "rmq.parcel.shipped", "{t}");
        let headers = properties.headers().as_ref().expect("headers");
        for name in ["ce_id", "ce_type", "ce_subject", "ce_time", "ce_specversion", "outbox_aggregate_type"] {
            assert!(headers.contains_key(name), "{t}: header {name} missing: {headers:?}");
        }
        raw.close(200, "OK".into()).await.ok();
        let admin = relay.publisher();
        teardown(admin, &exchange, &[&queue, &audit]).await;
    }
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
    publisher.declare_queue(&exchange, &queue, "rmq.parcel.shipped").await.expect("declare queue");
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
            assert!(error.contains(&exchange) && error.contains("rmq.parcel.lost"), "{t}: {error}");
        } else {
            assert!(row.published_at_ms.is_some(), "{t}: the routable events of the batch are published");
        }
    }

    let publisher = relay.publisher();
    publisher.declare_queue(&exchange, &queue, "rmq.parcel.#").await.expect("bind the missing key");
    assert_eq!(drain_at(&relay, after(now, CAP)).await, 3, "{t}: retried after the backoff, now routable");
    assert_eq!(count_published(&t).await, 6, "{t}");
    assert_eq!(publisher.message_count(&queue).await.expect("count"), 6, "{t}: nothing dropped");
    teardown(publisher, &exchange, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_exchange_queue_and_dead_letter_names_are_typed_errors() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    let key = || Destination::parse(DEFAULT_ROUTING_KEY).expect("template");
    // Publisher URLs, a refused login and a closed port: the publisher contract (`publisher_refuses_bad_urls`).
    let err = RabbitTransport::connect("amqp://", "q", "c").await.expect_err("no host");
    assert!(matches!(err, Error::InvalidConfig { field: "broker_url", .. }), "{err}");
    let long_exchange = "x".repeat(256);
    let err = RabbitPublisher::connect(AMQP_URL, &long_exchange, key()).await.expect_err("exchange too long");
    assert!(matches!(err, Error::InvalidConfig { field: "exchange", .. }), "{err}");
    let err = RabbitTransport::connect(AMQP_URL, "rmq-test-no-such-queue", "c").await.expect_err("missing queue");
    assert!(matches!(err, Error::Broker { .. }) && err.to_string().contains("no-such-queue"), "{err}");
    let err = RabbitTransport::connect("amqp://guest:wrong@127.0.0.1:5672/%2f", "q", "c").await.expect_err("login");
    assert!(matches!(err, Error::Broker { broker: "RabbitMQ", .. }) && !err.to_string().contains("wrong"), "{err}");

    // Dead-letter queue names RabbitMQ would refuse, or that would loop, are refused before connecting.
    let long = "d".repeat(256);
    for (dead, why) in
        [("", "is empty"), ("q", "itself"), ("amq.dead", "amq."), ("a\nb", "control"), (&long[..], "255")]
    {
        let err = RabbitTransport::connect_with_dead_letter_queue(AMQP_URL, "q", "c", dead).await.expect_err(dead);
        assert!(matches!(err, Error::InvalidConfig { field: "dead_letter_queue", .. }), "{dead:?}: {err}");
        assert!(err.to_string().contains(why), "{dead:?}: {err}");
    }
    let err = RabbitTransport::connect(AMQP_URL, &"q".repeat(252), "c").await.expect_err("default name too long");
    assert!(matches!(err, Error::InvalidConfig { field: "dead_letter_queue", .. }), "{err}");
}

/// An envelope of `ParcelShipped` as the relay would publish it, with `payload`.
fn envelope(parcel: &str, payload: String) -> Vec<(String, String)> {
    let payload: serde_json::Value = serde_json::from_str(&payload).expect("JSON payload");
    let event = NewEvent::new("parcel", parcel, "rmq.parcel.shipped", &payload).expect("event");
    let event = outbox_seaorm::testkit::outbox_event(&event, 1, 1);
    outbox_seaorm::broker::envelope_headers(&event)
}

async fn publish_raw(exchange: &str, headers: &[(String, String)], payload: &[u8]) {
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let raw = raw_connection().await;
    let channel = raw.create_channel().await.expect("channel");
    channel.confirm_select(lapin::options::ConfirmSelectOptions::default()).await.expect("confirms");
    let mut table = FieldTable::default();
    for (name, value) in headers {
        table.insert(name.as_str().into(), AMQPValue::LongString(LongString::from(value.as_str())));
    }
    let options = lapin::options::BasicPublishOptions { mandatory: true, immediate: false };
    let properties = lapin::BasicProperties::default().with_headers(table);
    let confirm = channel
        .basic_publish(exchange.into(), "rmq.parcel.raw".into(), options, payload, properties)
        .await
        .expect("publish raw")
        .await
        .expect("confirm");
    assert!(matches!(confirm, lapin::Confirmation::Ack(None)), "{confirm:?}");
    raw.close(200, "OK".into()).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_dead_lettered_with_their_original_headers_and_the_next_one_flows() {
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    let t = sqlite_only("rmq_bad_messages").await;
    create_effect_table(&t).await;
    let (exchange, queue) = names("bad-messages");
    let publisher = publisher(AMQP_URL, &exchange).await;
    publisher.declare_queue(&exchange, &queue, "rmq.parcel.#").await.expect("declare queue");

    // A valid envelope with control characters in a header (log forging, header injection), and a valid
    // envelope with a payload over the consumer's limit; then a good event.
    let forged = "line one\nline two \u{1b}[31m red";
    let mut headers = envelope("p1", r#"{"parcel_id":"p1","n":0}"#.to_owned());
    headers.push(("note".to_owned(), forged.to_owned()));
    publish_raw(&exchange, &headers, br#"{"parcel_id":"p1","n":0}"#).await;
    let big = format!(r#"{{"parcel_id":"p2","n":0,"pad":"{}"}}"#, "x".repeat(2_000));
    publish_raw(&exchange, &envelope("p2", big.clone()), big.as_bytes()).await;
    enqueue_committed(&t, &[shipped("p3", 0)]).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    assert_eq!(drain_at(&relay, Utc::now()).await, 1, "{t}");

    let mut consumer = shipping(&t.db);
    let mut config = consumer.config().clone();
    config.max_payload_bytes = 1_000;
    consumer = consumer.with_config(config);
    let transport = RabbitTransport::connect(AMQP_URL, &queue, "rmq-bad-messages").await.expect("transport");
    let running = Running::start(consumer, transport);
    wait_until("1 applied and 2 dead-lettered", Duration::from_secs(10), || {
        let stats = running.stats();
        stats.processed >= 1 && stats.dead_lettered >= 2
    })
    .await;
    let stats = running.stop().await;
    assert_eq!((stats.processed, stats.dead_lettered, stats.retried), (1, 2, 0), "{t}: {stats:?}");
    assert_eq!(count_table(&t, "parcels_shipped").await, 1, "{t}");

    let raw = raw_connection().await;
    let channel = raw.create_channel().await.expect("channel");
    let dead_queue = format!("{queue}.dead");
    let mut dead = Vec::new();
    while let Some(got) = channel
        .basic_get(dead_queue.as_str().into(), lapin::options::BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
    {
        dead.push(got.delivery);
    }
    raw.close(200, "OK".into()).await.ok();
    assert_eq!(dead.len(), 2, "{t}");
    let header = |d: &lapin::message::Delivery, name: &str| -> Option<String> {
        match d.properties.headers().as_ref()?.inner().get(name)? {
            lapin::types::AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            _ => None,
        }
    };
    let forged_letter = dead.iter().find(|d| header(d, "note").is_some()).expect("the forged message is dead");
    assert_eq!(header(forged_letter, "note").as_deref(), Some(forged), "{t}: the original header is kept as it was");
    let reason = header(forged_letter, "outbox_dead_reason").unwrap_or_default();
    assert!(reason.contains("control characters") && !reason.chars().any(char::is_control), "{t}: {reason:?}");
    assert_eq!(header(forged_letter, "outbox_dead_origin").as_deref(), Some(&*format!("{exchange}/rmq.parcel.raw")));
    let big_letter = dead.iter().find(|d| header(d, "note").is_none()).expect("the big message is dead");
    assert_eq!(big_letter.data, big.as_bytes(), "{t}: the payload is kept");
    let reason = header(big_letter, "outbox_dead_reason").unwrap_or_default();
    assert!(reason.contains("max_payload_bytes"), "{t}: {reason}");
    let publisher = relay.publisher();
    assert_eq!(publisher.message_count(&queue).await.expect("count"), 0, "{t}: everything settled");
    teardown(publisher, &exchange, &[&queue]).await;
}

/// A quorum queue, as a RabbitMQ cluster runs them: the consumer dead-letters a poison event at its last
/// delivery into the quorum dead-letter queue, as on a classic queue; a message whose consumer died during
/// each delivery is dead-lettered by RabbitMQ itself (`x-delivery-limit`) into the same queue. Both are
/// listed with a reason; RabbitMQ's is replayed to its queue and applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_quorum_queue_the_consumers_and_the_delivery_limits_dead_letters_meet_in_one_queue() {
    use outbox_seaorm::consume::{DeadFilter, DeadLetters};
    if !server_available("RabbitMQ", RABBIT).await {
        return;
    }
    const MAX_DELIVERIES: u32 = 3;
    let t = sqlite_only("rmq_quorum").await;
    create_effect_table(&t).await;
    let (exchange, queue) = names("quorum");
    let dead_queue = format!("{queue}.dead");
    let publisher = publisher(AMQP_URL, &exchange).await;
    publisher
        .declare_quorum_queue(&exchange, &queue, "rmq.parcel.#", &dead_queue, MAX_DELIVERIES)
        .await
        .expect("declare the quorum queues");
    let bad = publisher.declare_quorum_queue(&exchange, &queue, "rmq.parcel.#", &dead_queue, 0).await;
    assert!(matches!(bad, Err(Error::InvalidConfig { .. })), "a delivery limit of 0: {bad:?}");
    enqueue_committed(&t, &[shipped("q1", 0)]).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    assert_eq!(drain_at(&relay, Utc::now()).await, 1, "{t}");

    // A consumer that dies during every delivery of q1: each returns it unacknowledged, until RabbitMQ
    // dead-letters it.
    let raw = raw_connection().await;
    let channel = raw.create_channel().await.expect("channel");
    let mut returned = 0;
    while let Some(got) = channel
        .basic_get(queue.as_str().into(), lapin::options::BasicGetOptions { no_ack: false })
        .await
        .expect("basic.get")
    {
        returned += 1;
        assert!(returned <= 10, "RabbitMQ never dead-lettered q1 after {returned} returns");
        let requeue = lapin::options::BasicNackOptions { multiple: false, requeue: true };
        got.delivery.acker.nack(requeue).await.expect("nack");
    }
    raw.close(200, "OK".into()).await.ok();

    // A poison event the consumer dead-letters itself at its last delivery.
    enqueue_committed(&t, &[shipped("q2", 0)]).await;
    assert_eq!(drain_at(&relay, Utc::now()).await, 1, "{t}");
    let db = t.db.clone();
    let config = ConsumerConfig::default()
        .with_backoff(Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(100), multiplier: 2 })
        .with_fetch_wait(Duration::from_millis(200))
        .with_max_deliveries(MAX_DELIVERIES);
    let poisoned =
        Consumer::new(CONSUMER).with_config(config).on::<ParcelShipped>(move |received: Received<ParcelShipped>| {
            let db = db.clone();
            async move {
                if received.event.parcel_id == "q2" {
                    return Err("q2 cannot be shipped".into());
                }
                outbox_seaorm::deliver(&db, CONSUMER, &received.envelope, ship)
                    .await
                    .map_err(outbox_seaorm::BoxError::from)
            }
        });
    let transport = RabbitTransport::connect(AMQP_URL, &queue, "rmq-quorum").await.expect("transport on quorum queues");
    let running = Running::start(poisoned, transport);
    wait_until("q2 dead-lettered", Duration::from_secs(30), || running.stats().dead_lettered >= 1).await;
    running.stop().await;

    let letters = RabbitTransport::connect(AMQP_URL, &queue, "rmq-quorum-ops").await.expect("transport");
    let all = letters.list_dead_letters(&DeadFilter::default(), 10).await.expect("list");
    assert_eq!(all.len(), 2, "{t}: {all:?}");
    let by_rabbit = all.iter().find(|l| l.aggregate_id.as_deref() == Some("q1")).expect("q1 is a dead letter");
    let reason = by_rabbit.reason.clone().unwrap_or_default();
    assert!(reason.contains("delivery_limit") && reason.contains(&queue), "{t}: {reason}");
    assert_eq!(by_rabbit.origin.as_deref(), Some(&*format!("/{queue}")), "{t}: back to its queue");
    let by_consumer = all.iter().find(|l| l.aggregate_id.as_deref() == Some("q2")).expect("q2 is a dead letter");
    assert_eq!(by_consumer.consumer.as_deref(), Some(CONSUMER), "{t}");
    assert!(by_consumer.reason.as_deref().is_some_and(|r| r.contains("cannot be shipped")), "{t}: {by_consumer:?}");

    let replayed =
        letters.replay_dead_letters_matching(&DeadFilter::default().id(&by_rabbit.id)).await.expect("replay q1");
    assert_eq!(replayed, 1, "{t}");
    let running = Running::start(
        shipping(&t.db),
        RabbitTransport::connect(AMQP_URL, &queue, "rmq-quorum-2").await.expect("transport"),
    );
    wait_until("q1 applied", Duration::from_secs(30), || running.stats().processed >= 1).await;
    running.stop().await;
    assert_eq!(count_table(&t, "parcels_shipped").await, 1, "{t}: q1 applied once, q2 still dead");
    assert_eq!(letters.list_dead_letters(&DeadFilter::default(), 10).await.expect("list").len(), 1, "{t}");
    teardown(relay.publisher(), &exchange, &[&queue]).await;
}

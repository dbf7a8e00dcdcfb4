//! The Kafka adapter against librdkafka's in-process mock cluster (always runs, no server): broker down
//! and back, a lost ack, bad configuration and input, a message over `message.max.bytes`, commits that
//! stop at a message held for a retry, a group subscription, a hung offset commit. The round trip against
//! a real broker is in `broker_kafka.rs`; what every broker shares is in `contract_kafka.rs`.
//!
//! The unreachable-broker test uses the mock cluster rather than the `Proxy`: tansu advertises its own
//! address (127.0.0.1:9092) in the metadata, so after bootstrapping through a proxy the client talks to
//! the broker directly (checked: a publish after `Proxy::cut` still succeeded); the mock cluster's
//! `broker_down` does cut it off.

use crate::common;
use crate::kafka;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{count_table, fast_config};
use kafka::{
    Seen, assignment, committed, committed_total, create_shipments, eventually, shipped, shipping, to, unique,
};
use outbox_integration_tests::all_backends;
use outbox_integration_tests::contract::Running;
use outbox_seaorm::brokers::kafka::rdkafka::ClientConfig;
use outbox_seaorm::brokers::kafka::rdkafka::mocking::{MockCluster, MockCoordinator};
use outbox_seaorm::brokers::kafka::{KafkaPublisher, KafkaTransport, Subscription, default_destination};
use outbox_seaorm::consume::Transport;
use outbox_seaorm::{Destination, Error, NewEvent, Relay, SeaOrmStore};
use sea_orm::ConnectionTrait;

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

fn mock_transport(m: &Mock, group: &str, topic: &str, partitions: i32) -> KafkaTransport {
    KafkaTransport::connect(&m.bootstrap, group, assignment(topic, partitions), &[]).expect("transport")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_bad_settings_are_clear_errors() {
    // URLs: the publisher contract (`publisher_refuses_bad_urls`); the transport parses them the same way.
    let error = KafkaTransport::connect("kafka://", "g", assignment("t", 1), &[]).expect_err("no host");
    assert!(error.to_string().contains("has no host"), "{error}");
    // Transport settings: a group, a subscription, dead-letter topics Kafka accepts.
    for (group, subscription, field) in [
        ("", assignment("t", 1), "group"),
        ("g", Subscription::Topics(vec![]), "subscription"),
        ("g", Subscription::Topics(vec!["a/b".into()]), "subscription"),
        ("g", Subscription::Topics(vec!["t".repeat(247)]), "dead_letter_suffix"),
    ] {
        let error = KafkaTransport::connect("127.0.0.1:9092", group, subscription, &[]).expect_err(field);
        assert!(matches!(error, Error::InvalidConfig { field: f, .. } if f == field), "{field}: {error}");
    }
    let transport = KafkaTransport::connect("127.0.0.1:9092", "g", assignment("orders", 1), &[]).expect("transport");
    for suffix in ["", "/dead", ".dead letters", ".\u{0}"] {
        let error = KafkaTransport::connect("127.0.0.1:9092", "g", assignment("orders", 1), &[])
            .expect("transport")
            .with_dead_letter_suffix(suffix)
            .expect_err(suffix);
        assert!(matches!(error, Error::InvalidConfig { field: "dead_letter_suffix", .. }), "{suffix:?}: {error}");
        assert!(!error.to_string().chars().any(char::is_control), "{error}");
    }
    assert_eq!(transport.with_dead_letter_suffix("-dead").expect("valid").dead_letter_topic("orders"), "orders-dead");
    let error = KafkaTransport::connect("127.0.0.1:9092", "g", assignment("t", 1), &[("fetch.wait.max.ms", "soon")])
        .expect_err("invalid librdkafka setting");
    assert!(matches!(error, Error::InvalidConfig { .. }) && error.to_string().contains("fetch.wait.max.ms"), "{error}");
    let template = Destination::parse("orders/{aggregate_type}").expect("a valid template");
    let error = KafkaPublisher::connect("127.0.0.1:9092", template, &[]).expect_err("invalid topic literal");
    assert!(error.to_string().contains("cannot make a valid Kafka topic name"), "{error}");
    let error = KafkaPublisher::connect("127.0.0.1:9092", default_destination(), &[("acks", "maybe")])
        .expect_err("invalid librdkafka setting");
    assert!(error.to_string().contains("acks"), "{error}");
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
    let group = unique("kafka-group");
    // Nothing committed yet: the lag is every message of both partitions.
    let lag = mock_transport(&m, &group, &topic, 2).lag().await.expect("lag").expect("a reading");
    assert_eq!((lag.unacked, lag.undelivered), (None, Some(8)), "{t}");
    let transport = KafkaTransport::connect(
        &m.bootstrap,
        &group,
        Subscription::Topics(vec![topic.clone()]),
        &[("session.timeout.ms", "6000"), ("heartbeat.interval.ms", "500")],
    )
    .expect("transport");
    let running = Running::start(shipping(&t.db, &Seen::default(), |_, _| false), transport);
    eventually("8 shipments", Duration::from_secs(30), || async { count_table(&t, "kafka_shipments").await == 8 })
        .await;
    eprintln!("kafka group: joined and consumed 8 messages in {:?}", started.elapsed());
    running.stop().await;
    let committed = committed(&m.bootstrap, &group, &topic, 2).await;
    assert_eq!(committed_total(&committed), 8, "{t}: {committed:?}");
    let lag = mock_transport(&m, &group, &topic, 2).lag().await.expect("lag").expect("a reading");
    assert_eq!(lag.total(), 0, "{t}: every message committed: {lag:?}");
}

/// One partition, two aggregates: `a` fails at offset 2 while `b`'s later messages are applied; nothing
/// is committed past offset 2 until `a`'s message is applied, then everything is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_commits_stop_at_a_message_held_for_a_retry() {
    let t = all_backends("kafka_contiguous").await.swap_remove(0);
    create_shipments(&t).await;
    let topic = unique("kafka-contiguous");
    let m = mock(&[(&topic, 1)]);
    let events: Vec<NewEvent> = (0..6_i64).map(|i| shipped(if i % 2 == 0 { "a" } else { "b" }, i)).collect();
    outbox_seaorm::enqueue_all(&t.db, &events).await.expect("enqueue");
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), mock_publisher(&m, to(&topic), &[]), fast_config()).expect("relay");
    relay.drain(20).await.expect("relay");

    // a/2 (offset 2) fails on its first 4 deliveries, about 0.5 s of backoff.
    let group = unique("kafka-contiguous");
    let seen = Seen::default();
    let consumer = shipping(&t.db, &seen, |e, delivery| e.n == 2 && delivery <= 4);
    let running = Running::start(consumer, mock_transport(&m, &group, &topic, 1));
    eventually("b applied while a/2 waits", Duration::from_secs(20), || async {
        seen.all().iter().filter(|(p, _)| p == "b").count() == 3
    })
    .await;
    let during = committed(&m.bootstrap, &group, &topic, 1).await;
    assert!(during.iter().all(|(_, _, offset)| *offset <= 2), "{t}: committed past the held message: {during:?}");
    eventually("6 shipments", Duration::from_secs(20), || async { count_table(&t, "kafka_shipments").await == 6 })
        .await;
    let stats = running.stop().await;
    assert!(stats.retried >= 3, "{t}: {stats:?}");
    let a: Vec<i64> = seen.all().into_iter().filter(|(p, _)| p == "a").map(|(_, n)| n).collect();
    assert_eq!(a, [0, 2, 4], "{t}: a in order");
    eventually("everything committed", Duration::from_secs(10), || async {
        committed(&m.bootstrap, &group, &topic, 1).await == vec![(topic.clone(), 0, 6)]
    })
    .await;
}

/// The group coordinator stops answering (a round trip of an hour) while the partition leader answers:
/// the consumer goes on applying one aggregate's messages in order (an ack that waited for its commit would
/// hold that lane), the unanswered commits are counted and superseded, the offsets reach the broker once the
/// coordinator answers again, and a shutdown during a hang ends (its final commit gives up after the commit
/// timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_hung_offset_commit_does_not_stop_consumption() {
    outbox_integration_tests::log_to_test_output();
    let t = all_backends("kafka_hung_commit").await.swap_remove(0);
    create_shipments(&t).await;
    let topic = unique("kafka-hung-commit");
    let group = unique("kafka-hung-commit");
    let cluster = MockCluster::new(2).expect("mock cluster");
    cluster.create_topic(&topic, 1, 1).expect("mock topic");
    cluster.partition_leader(&topic, 0, Some(1)).expect("leader on broker 1");
    cluster.coordinator(MockCoordinator::Group(group.clone()), 2).expect("coordinator on broker 2");
    let bootstrap = cluster.bootstrap_servers();
    let m = Mock { cluster, bootstrap };
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), mock_publisher(&m, to(&topic), &[]), fast_config()).expect("relay");
    let publish = async |events: Vec<NewEvent>| {
        outbox_seaorm::enqueue_all(&t.db, &events).await.expect("enqueue");
        let published: u64 = relay.drain(100).await.expect("relay").iter().map(|pass| pass.published).sum();
        assert_eq!(published, events.len() as u64, "{t}: relayed");
    };
    let committed_now = async || {
        let probe = KafkaTransport::connect(&m.bootstrap, &group, assignment(&topic, 1), &[]).expect("probe");
        probe.committed(Duration::from_secs(2)).await.ok()
    };

    // A request unanswered for 3 s times out in librdkafka (its connection is then reopened).
    let transport =
        KafkaTransport::connect(&m.bootstrap, &group, assignment(&topic, 1), &[("socket.timeout.ms", "3000")])
            .expect("transport")
            .with_commit_interval(Duration::from_millis(100))
            .expect("interval")
            .with_commit_timeout(Duration::from_secs(1))
            .expect("timeout");
    let transport = Arc::new(transport);
    let consumer = Arc::new(shipping(&t.db, &Seen::default(), |_, _| false));
    let shutdown = outbox_seaorm::CancellationToken::new();
    let task = {
        let (consumer, transport, shutdown) = (consumer.clone(), transport.clone(), shutdown.clone());
        tokio::spawn(async move { consumer.run(&*transport, shutdown).await })
    };

    publish(vec![shipped("p", 0)]).await;
    eventually("the first offset committed", Duration::from_secs(30), || async {
        committed_now().await == Some(vec![(topic.clone(), 0, 1)])
    })
    .await;
    eventually("the commit's answer seen by the transport", Duration::from_secs(30), || async {
        transport.commit_stats().committed >= 1
    })
    .await;

    m.cluster.broker_round_trip_time(2, Duration::from_secs(3600)).expect("coordinator hangs");
    publish((1..=10).map(|n| shipped("p", n)).collect()).await;
    eventually("10 more shipments of one parcel while commits hang", Duration::from_secs(60), || async {
        count_table(&t, "kafka_shipments").await == 11
    })
    .await;
    eventually("an unanswered commit counted", Duration::from_secs(60), || async {
        let stats = transport.commit_stats();
        stats.timed_out + stats.failed >= 1
    })
    .await;
    eprintln!("kafka hung commit: during the hang {:?}", transport.commit_stats());

    m.cluster.broker_round_trip_time(2, Duration::ZERO).expect("coordinator answers");
    eventually("every offset committed once the coordinator answers", Duration::from_secs(60), || async {
        committed_now().await == Some(vec![(topic.clone(), 0, 11)])
    })
    .await;

    // Shutdown while the coordinator hangs again: the final commit gives up, the driver returns.
    m.cluster.broker_round_trip_time(2, Duration::from_secs(3600)).expect("coordinator hangs");
    publish(vec![shipped("p", 11)]).await;
    eventually("the 12th shipment", Duration::from_secs(60), || async {
        count_table(&t, "kafka_shipments").await == 12
    })
    .await;
    let before = transport.commit_stats();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("shutdown finished although the coordinator never answers")
        .expect("consumer task")
        .expect("consumer run");
    let after = transport.commit_stats();
    assert!(after.timed_out > before.timed_out, "{t}: the final commit gave up: {before:?} → {after:?}");
    let stats = consumer.stats();
    assert_eq!((stats.processed, stats.ack_failures), (12, 0), "{t}: {stats:?}");
    let shipped_n: Vec<i64> = {
        let rows =
            t.db.query_all_raw(sea_orm::Statement::from_string(t.backend, "SELECT n FROM kafka_shipments ORDER BY n"))
                .await
                .expect("shipments");
        rows.iter().map(|r| r.try_get::<i64>("", "n").expect("n")).collect()
    };
    assert_eq!(shipped_n, (0..12).collect::<Vec<i64>>(), "{t}: each once");
    m.cluster.broker_round_trip_time(2, Duration::ZERO).expect("coordinator answers");
}

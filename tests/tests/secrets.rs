//! Secrets never leave: a password planted in a database URL, a broker URL or a publisher's error text
//! appears in no error, no log line (at trace level, every crate) and no stored row.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use outbox_integration_tests::{Backend, TestDb, run_on};
use outbox_seaorm::{Destination, NewEvent, OutboxEvent, PublishError, Publisher, Relay, RelayConfig, SeaOrmStore};
use sea_orm::ConnectionTrait;

/// Every password planted below contains this, so one search finds any of them.
const PLANTED: &str = "PlantedS3cret";

/// Everything every crate logged in this test binary, at trace level.
fn captured_logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: Arc<Mutex<Vec<u8>>> = Arc::default();
        let sink = logs.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .try_init();
        logs
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn assert_no_secret_logged(context: &str) {
    let logs = captured_logs().lock().unwrap_or_else(|p| p.into_inner());
    let text = String::from_utf8_lossy(&logs);
    assert!(!text.is_empty(), "{context}: the trace subscriber captured something");
    if let Some(at) = text.find(PLANTED) {
        let start = text[..at].char_indices().rev().nth(200).map_or(0, |(i, _)| i);
        panic!("{context}: a planted password was logged: …{}…", &text[start..(at + 40).min(text.len())]);
    }
}

fn assert_secret_free(context: &str, text: &str) {
    assert!(!text.contains(PLANTED), "{context}: {text}");
}

/// Fails every event with an error that quotes credentials, as some client libraries do.
#[derive(Clone)]
struct LeakyBroker;

impl Publisher for LeakyBroker {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let message = format!(
            "connect to amqp://guest:{PLANTED}-1@rabbit:5672/%2f refused (host=db password={PLANTED}-2 user=x)"
        );
        events.iter().map(|_| Err(PublishError::transient(message.clone()))).collect()
    }
}

async fn a_publisher_error_with_credentials_is_stored_and_logged_without_them(t: TestDb) {
    captured_logs();
    // The relay's own connection carries a password too (PostgreSQL's trust auth accepts any).
    let schema = t.url.split_once('#').map(|(_, schema)| schema.to_owned()).unwrap_or_default();
    let url = format!("postgres://postgres:{PLANTED}-0@127.0.0.1:5432/test");
    let db = outbox_seaorm::connect_with(&url, |options| {
        options.set_schema_search_path(schema.clone());
    })
    .await
    .unwrap_or_else(|e| panic!("{t}: {e}"));
    let event = NewEvent::new("order", "o1", "order.placed", &serde_json::json!({"n": 1})).expect("valid");
    outbox_seaorm::enqueue(&db, &event).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let relay = Relay::new(SeaOrmStore::new(db.clone()), LeakyBroker, RelayConfig::default()).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.failed, 1, "{t}: {pass:?}");

    let row =
        t.db.query_one_raw(sea_orm::Statement::from_string(t.backend, "SELECT last_error FROM outbox_events"))
            .await
            .unwrap_or_else(|e| panic!("{t}: {e}"))
            .expect("the row");
    let last_error: String = row.try_get("", "last_error").expect("last_error");
    assert_secret_free("last_error", &last_error);
    assert!(last_error.contains("amqp://***@rabbit:5672") && last_error.contains("password=***"), "{last_error}");
    assert_no_secret_logged("relay pass");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_error_with_credentials_is_stored_and_logged_without_them_postgres() {
    run_on(
        Backend::Postgres,
        "secrets_publisher_error",
        a_publisher_error_with_credentials_is_stored_and_logged_without_them,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_urls_with_passwords_fail_without_showing_them_and_in_seconds() {
    captured_logs();
    let cases = [
        // MariaDB's root has no password: a wrong one is refused, and the refusal must not quote it.
        format!("mysql://root:{PLANTED}-3@127.0.0.1:3306/test"),
        format!("mariadb://root:{PLANTED}-4@127.0.0.1:3306/test"),
        // Nothing listens on port 1: refused at once, not after sqlx's 30 s default.
        format!("postgres://postgres:{PLANTED}-5@127.0.0.1:1/test"),
        format!("mysql://root:{PLANTED}-6@127.0.0.1:1/test"),
        // Unparsable: the driver repeats the URL in its error.
        format!("postgres://postgres:{PLANTED}-7@127.0.0.1:notaport/test"),
        format!("mysql://root:{PLANTED}-8@127.0.0.1:3306/test?ssl-mode=bogus"),
    ];
    for url in &cases {
        let started = Instant::now();
        let err = outbox_seaorm::connect(url).await.expect_err("the connection must fail");
        let elapsed = started.elapsed();
        let shown = format!("{err} / {err:?}");
        assert_secret_free(url, &shown);
        // Refused or unparsable: fails at once. The bound only tells it apart from sqlx's 30 s default
        // acquire timeout, with room for a loaded machine.
        assert!(elapsed < Duration::from_secs(25), "{url}: failed after {elapsed:?}; the connect timeout is 5 s");
        println!("{}: {err} ({elapsed:?})", outbox_seaorm::redact_url(url));
    }
    assert_no_secret_logged("connect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_urls_with_passwords_fail_without_showing_them() {
    captured_logs();
    let destination = || Destination::parse("orders.{aggregate_id}").expect("destination");
    let mut errors = Vec::new();
    let nats = format!("nats://user:{PLANTED}-9@127.0.0.1:1");
    errors.push(outbox_seaorm::brokers::nats::NatsPublisher::connect(&nats, destination()).await.err());
    let amqp = format!("amqp://guest:{PLANTED}-10@127.0.0.1:5672/%2f");
    errors.push(outbox_seaorm::brokers::rabbitmq::RabbitPublisher::connect(&amqp, "orders", destination()).await.err());
    let redis = format!("redis://default:{PLANTED}-11@127.0.0.1:6379/0");
    errors.push(outbox_seaorm::brokers::redis::RedisPublisher::connect(&redis, destination()).await.err());
    for error in errors.iter().flatten() {
        assert_secret_free("broker error", &format!("{error} / {error:?}"));
        println!("{error}");
    }
    assert!(errors.iter().flatten().count() >= 2, "wrong credentials or a closed port fail: {errors:?}");
    assert_no_secret_logged("broker connect");
}

//! A broker that comes up after the app: `connect_with_retry` keeps trying while it is unreachable and
//! connects once it answers; one that stays down is given up on after the bound, with an error that says
//! how many attempts failed. Against a real Redis, behind a proxy the test cuts and restores.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use outbox_integration_tests::proxy::{Proxy, server_available};
use outbox_seaorm::brokers::redis::{RedisPublisher, RedisPublisherConfig};
use outbox_seaorm::brokers::{ConnectRetry, connect_with_retry};
use outbox_seaorm::{Destination, NewEvent, Publisher, testkit};

const REDIS: &str = "127.0.0.1:6379";

fn fast(give_up_after: Option<Duration>) -> ConnectRetry {
    ConnectRetry { initial_delay: Duration::from_millis(20), max_delay: Duration::from_millis(200), give_up_after }
}

fn destination() -> Destination {
    let stream = format!("outbox-test:connect:{}", uuid::Uuid::new_v4().simple());
    Destination::parse(&format!("{stream}:{{aggregate_type}}")).expect("template")
}

/// Connects through `url`, counting attempts in `attempts`.
async fn connect(url: String, retry: ConnectRetry, attempts: Arc<AtomicU32>) -> outbox_seaorm::Result<RedisPublisher> {
    connect_with_retry(&url, retry, || {
        attempts.fetch_add(1, Ordering::SeqCst);
        // Connecting is what this is about: the first event may create its stream.
        RedisPublisher::connect_with(&url, destination(), RedisPublisherConfig::default().with_create_streams(true))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_comes_up_late_is_connected_and_published_to() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let proxy = Proxy::start(REDIS).await;
    proxy.cut();
    let attempts = Arc::new(AtomicU32::new(0));
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let connecting = tokio::spawn(connect(url, fast(None), attempts.clone()));
    while attempts.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!connecting.is_finished(), "it keeps trying while the broker is down");

    proxy.restore();
    let publisher = connecting.await.expect("task").expect("connected once the broker answered");
    let event = NewEvent::new("order", "o1", "order.placed", &serde_json::json!({ "n": 1 })).expect("event");
    let results = publisher.publish(&[testkit::outbox_event(&event, 1, 1)]).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_stays_down_is_given_up_on_with_the_attempts_said() {
    if !server_available("Redis", REDIS).await {
        return;
    }
    let proxy = Proxy::start(REDIS).await;
    proxy.cut();
    let attempts = Arc::new(AtomicU32::new(0));
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let error = connect(url, fast(Some(Duration::from_millis(500))), attempts.clone()).await.expect_err("gave up");
    let message = error.to_string();
    assert!(message.contains("gave up after") && message.contains("attempts over"), "{message}");
    assert!(attempts.load(Ordering::SeqCst) >= 2, "{message}");
    assert!(message.contains(&format!("127.0.0.1:{}", proxy.port())), "the message names the broker: {message}");
}

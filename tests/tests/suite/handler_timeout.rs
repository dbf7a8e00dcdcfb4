//! `ConsumerConfig::handler_timeout` with a real database and a real broker (Redis Streams on
//! 127.0.0.1:6379; skipped with a reason when unreachable, except under `CI=true`), on SQLite, PostgreSQL
//! and MariaDB: a handler that hangs inside its transaction is abandoned, its effect and inbox row rolled
//! back, and the message applied exactly once by a later delivery; a shutdown ends while a handler hangs,
//! and the message it held comes back to the next consumer.
//!
//! The handler writes its effect first and hangs after, so a transaction that was not rolled back would
//! leave a row (or hold a lock the retry would wait on for ever).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{count_table, create_shop_tables, enqueue_committed, fast_config, insert_invoice};
use outbox_integration_tests::contract::{Running, eventually};
use outbox_integration_tests::proxy::server_available;
use outbox_integration_tests::{TestDb, count_inbox, per_backend};
use outbox_seaorm::brokers::redis::{DEFAULT_STREAM_TEMPLATE, RedisPublisher, RedisTransport, RedisTransportConfig};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{Consumer, ConsumerConfig, Destination, Received};
use sea_orm::{ConnectionTrait as _, DbErr, Statement};
use serde::{Deserialize, Serialize};

const REDIS: &str = "127.0.0.1:6379";
const REDIS_URL: &str = "redis://127.0.0.1:6379";
const CONSUMER: &str = "timeout-shipping";

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "parcel.shipped", version = 1, aggregate = "parcel")]
struct ParcelShipped {
    #[aggregate_id]
    parcel_id: String,
    n: i64,
}

/// A handler short enough for a test, long enough for a loaded machine to finish a real one.
const HANDLER_TIMEOUT: Duration = Duration::from_secs(2);

/// The consumer `timeout-shipping`: through the inbox, inserts one invoice per event, then hangs for ever
/// when `hang(event, delivery)` says so (inside the transaction, after the insert). `calls` counts the
/// handler calls.
fn shipping(
    t: &TestDb,
    calls: Arc<AtomicU32>,
    hang: impl Fn(&ParcelShipped, u32) -> bool + Send + Sync + 'static,
) -> Consumer {
    let (db, hang) = (t.db.clone(), Arc::new(hang));
    let handler = move |received: Received<ParcelShipped>| {
        let (db, calls, hang) = (db.clone(), calls.clone(), hang.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let hangs = hang(&received.event, received.delivery);
            let (parcel, n) = (received.event.parcel_id.clone(), received.event.n);
            let id = received.envelope.id.to_string();
            outbox_seaorm::handle_once(&db, CONSUMER, &id, async |txn| {
                insert_invoice(txn, &parcel, n).await?;
                if hangs {
                    std::future::pending::<()>().await;
                }
                Ok::<_, DbErr>(())
            })
            .await
            .map_err(|e| e.to_string())
        }
    };
    let config: ConsumerConfig =
        outbox_integration_tests::contract::fast_config().with_handler_timeout(HANDLER_TIMEOUT).with_max_deliveries(10);
    Consumer::new(CONSUMER).with_config(config).on::<ParcelShipped>(handler)
}

fn shipped(parcel: &str, n: i64) -> NewEvent {
    ParcelShipped { parcel_id: parcel.to_owned(), n }.to_new_event().expect("valid event")
}

/// Invoices of `parcel`, committed.
async fn invoices_of(t: &TestDb, parcel: &str) -> i64 {
    let sql = format!("SELECT COUNT(*) AS n FROM invoices WHERE order_id = '{parcel}'");
    let row =
        t.db.query_one_raw(Statement::from_string(t.backend, sql))
            .await
            .unwrap_or_else(|e| panic!("{t}: count invoices: {e}"))
            .unwrap_or_else(|| panic!("{t}: COUNT(*) returned no row"));
    row.try_get::<i64>("", "n").unwrap_or_else(|e| panic!("{t}: {e}"))
}

async fn transport(stream: &str, name: &str) -> RedisTransport {
    let config = RedisTransportConfig::default()
        .with_min_idle(Duration::from_millis(600))
        .with_reclaim_interval(Duration::from_millis(100))
        .with_max_block(Duration::from_millis(100));
    RedisTransport::connect_with(REDIS_URL, stream, "shipping", name, config)
        .await
        .unwrap_or_else(|e| panic!("transport {name}: {e}"))
}

/// Phase 1: `p1` hangs on its first two deliveries: both are abandoned after the handler timeout, rolled
/// back, and the third applies it once. Phase 2: `p2` hangs for ever and the consumer is shut down
/// meanwhile: shutdown ends, nothing of `p2` committed. Phase 3: a consumer that does not hang gets `p2`
/// back from Redis and applies it once.
async fn a_hung_handler_is_rolled_back_retried_and_applied_once(t: TestDb) {
    if !server_available("Redis", REDIS).await {
        return;
    }
    outbox_integration_tests::log_to_test_output();
    create_shop_tables(&t).await;
    let prefix = format!("outbox-test:handler-timeout:{}", uuid::Uuid::new_v4().simple());
    let template = DEFAULT_STREAM_TEMPLATE.replacen("outbox", &prefix, 1);
    let destination = Destination::parse(&template).expect("template");
    let stream = format!("{prefix}:parcel");
    let publisher = RedisPublisher::connect(REDIS_URL, destination).await.expect("publisher");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("relay");
    let publish = async |event: NewEvent| {
        enqueue_committed(&t, &[event]).await;
        let published: u64 = relay.drain(20).await.expect("relay").iter().map(|pass| pass.published).sum();
        assert_eq!(published, 1, "{t}: relayed");
    };

    // Phase 1: abandoned twice, applied by the third delivery.
    let calls = Arc::new(AtomicU32::new(0));
    let consumer = shipping(&t, calls.clone(), |e, delivery| e.parcel_id == "p1" && delivery <= 2);
    let running = Running::start(consumer, transport(&stream, "c1").await);
    publish(shipped("p1", 1)).await;
    eventually(Duration::from_secs(60), &format!("{t}: p1 applied"), async || running.stats().processed == 1).await;
    let stats = running.stop().await;
    assert_eq!((stats.timed_out, stats.retried, stats.processed), (2, 2, 1), "{t}: {stats:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 3, "{t}: two abandoned calls and the one that applied it");
    assert_eq!(invoices_of(&t, "p1").await, 1, "{t}: the abandoned transactions left no invoice");
    assert_eq!(count_inbox(&t, CONSUMER).await, 1, "{t}: nor an inbox row");

    // Phase 2: shutdown while the handler of p2 hangs.
    let calls = Arc::new(AtomicU32::new(0));
    let consumer = Arc::new(shipping(&t, calls.clone(), |e, _| e.parcel_id == "p2"));
    let shutdown = outbox_seaorm::CancellationToken::new();
    let task = {
        let (consumer, shutdown, transport) = (consumer.clone(), shutdown.clone(), transport(&stream, "c2").await);
        tokio::spawn(async move { consumer.run(&transport, shutdown).await })
    };
    publish(shipped("p2", 2)).await;
    eventually(Duration::from_secs(60), &format!("{t}: p2's handler hangs"), async || {
        calls.load(Ordering::SeqCst) >= 1
    })
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .unwrap_or_else(|_| panic!("{t}: shutdown did not finish while the handler hung"))
        .expect("consumer task")
        .expect("consumer run");
    let stats = consumer.stats();
    assert_eq!((stats.processed, stats.released), (0, 1), "{t}: handed back unapplied: {stats:?}");
    assert_eq!(invoices_of(&t, "p2").await, 0, "{t}: nothing of p2 committed");

    // Phase 3: p2 comes back from Redis (pending, then reclaimed) and is applied once.
    let calls = Arc::new(AtomicU32::new(0));
    let running = Running::start(shipping(&t, calls, |_, _| false), transport(&stream, "c3").await);
    eventually(Duration::from_secs(60), &format!("{t}: p2 applied"), async || running.stats().processed == 1).await;
    running.stop().await;
    assert_eq!((invoices_of(&t, "p1").await, invoices_of(&t, "p2").await), (1, 1), "{t}: each once");
    assert_eq!(count_table(&t, "invoices").await, 2, "{t}");
    assert_eq!(count_inbox(&t, CONSUMER).await, 2, "{t}");
    cleanup(&prefix).await;
}

/// Deletes the test's streams.
async fn cleanup(prefix: &str) {
    use outbox_seaorm::brokers::redis::redis::{self, AsyncCommands as _};
    let client = redis::Client::open(REDIS_URL).expect("client");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let keys: Vec<String> = conn.keys(format!("{prefix}:*")).await.expect("KEYS");
    if !keys.is_empty() {
        let _: i64 = conn.del(keys).await.expect("DEL");
    }
}

per_backend!(a_hung_handler_is_rolled_back_retried_and_applied_once, "handler_timeout_rollback");

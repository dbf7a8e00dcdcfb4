//! With the default claim mode, the app's own writes never wait for a broker, on any backend: SQLite's
//! default is a lease, so its one write lock is held for the claim and the mark, never while publishing.
//!
//! The broker hangs until the test lets it go, so the check is a state, not a latency: every business
//! transaction commits while the publish is still hung (a writer that waited for it would never finish).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{count_published, create_shop_tables, event};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::{
    CancellationToken, ClaimMode, InMemoryPublisher, OutboxEvent, PublishError, Publisher, Relay, RelayConfig,
    SeaOrmStore,
};
use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};

/// A broker whose publishes hang until [`release`](Gated::release).
#[derive(Clone)]
struct Gated {
    inner: InMemoryPublisher,
    open: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    calls: std::sync::Arc<AtomicUsize>,
}

impl Gated {
    fn new() -> Self {
        Gated {
            inner: InMemoryPublisher::new(),
            open: std::sync::Arc::new(tokio::sync::watch::Sender::new(false)),
            calls: std::sync::Arc::default(),
        }
    }

    fn release(&self) {
        self.open.send_replace(true);
    }
}

impl Publisher for Gated {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.subscribe();
        if open.wait_for(|open| *open).await.is_err() {
            return vec![Err(PublishError::transient("the test's gate was dropped")); events.len()];
        }
        self.inner.publish(events).await
    }
}

/// Longer than any test: the relay never gives up on the hung publish by itself.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(600);

/// One business write: an order row and its event, in one transaction.
async fn place_order(db: &sea_orm::DatabaseConnection, t: &str, writer: usize, n: usize) {
    let txn = db.begin().await.unwrap_or_else(|e| panic!("{t}: begin: {e}"));
    let sql = format!("INSERT INTO orders (id, customer, total_minor) VALUES ('w{writer}-{n}', 'ann', {n})");
    txn.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let e = event(&format!("agg-{}", n % 5), "order.placed", (writer * 1000 + n) as u64);
    outbox_seaorm::enqueue(&txn, &e).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: commit: {e}"));
}

async fn business_writes_never_wait_for_a_hung_broker(t: TestDb) {
    create_shop_tables(&t).await;
    for n in 0..20 {
        place_order(&t.db, &t.to_string(), 0, n).await;
    }
    let broker = Gated::new(); // every publish hangs until released
    let config =
        RelayConfig::default().with_publish_timeout(PUBLISH_TIMEOUT).with_poll_interval(Duration::from_millis(50));
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config.clone()).expect("config");
    if t.backend == DbBackend::Sqlite {
        assert!(matches!(relay.config().claim_mode, ClaimMode::Lease { .. }), "{t}: SQLite leases by default");
    } else {
        assert_eq!(relay.config().claim_mode, ClaimMode::Transaction, "{t}: row locks elsewhere");
    }
    // A shared store (as `OutboxService` holds it) decides the same way.
    let shared = Relay::new(std::sync::Arc::new(SeaOrmStore::new(t.db.clone())), broker.clone(), config);
    assert_eq!(shared.expect("config").config().claim_mode, relay.config().claim_mode, "{t}");
    let stop = CancellationToken::new();
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    // Let the relay claim and start its hung publish.
    while broker.calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Four writers, 25 transactions each, while the broker hangs.
    let started = Instant::now();
    let mut writers = Vec::new();
    for writer in 1..=4 {
        let (db, label) = (t.db.clone(), t.to_string());
        writers.push(tokio::spawn(async move {
            for n in 0..25 {
                place_order(&db, &label, writer, n).await;
            }
        }));
    }
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        for writer in writers {
            writer.await.expect("writer");
        }
    })
    .await;
    assert!(all.is_ok(), "{t}: the business transactions waited for the hung publish");
    println!("{t}: 100 business transactions beside a hung publish took {:?}", started.elapsed());
    assert_eq!(broker.inner.received_count(), 0, "{t}: the publish was still hung meanwhile");

    // The broker recovers: every event goes out once, in order per aggregate.
    broker.release();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count_published(&t).await < 120 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.expect("relay");
    assert_eq!(count_published(&t).await, 120, "{t}: every event published");
    let received = broker.inner.received();
    let mut ids: Vec<_> = received.iter().map(|e| e.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 120, "{t}: every event reached the broker");
    // Concurrent writers commit out of `seq` order; the order is the aggregate's version order.
    let mut last = std::collections::HashMap::new();
    for e in &received {
        let previous = last.insert(e.aggregate_id.clone(), e.aggregate_version).unwrap_or(0);
        assert!(e.aggregate_version > previous, "{t}: {} v{} after v{previous}", e.aggregate_id, e.aggregate_version);
    }
}
per_backend!(business_writes_never_wait_for_a_hung_broker, "hung_broker_writes");

//! With the default claim mode, the app's own writes never wait for a broker, on any backend: SQLite's
//! default is a lease, so its one write lock is held for the claim and the mark, never while publishing.

mod common;

use std::time::{Duration, Instant};

use common::{count_published, create_shop_tables, event};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::{CancellationToken, ClaimMode, InMemoryPublisher, Relay, RelayConfig, SeaOrmStore};
use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};

/// How long each publish hangs: a writer that waited for one would take half of it at least (a writer takes
/// milliseconds; the margin is for a loaded machine).
const HANG: Duration = Duration::from_secs(10);

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
    let broker = InMemoryPublisher::new();
    broker.set_delay(HANG); // every publish hangs
    let config = RelayConfig::default()
        .with_publish_timeout(HANG + Duration::from_secs(10))
        .with_poll_interval(Duration::from_millis(50));
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
    while broker.publish_calls() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Four writers, 25 transactions each, while the broker hangs.
    let started = Instant::now();
    let mut writers = Vec::new();
    for writer in 1..=4 {
        let (db, label) = (t.db.clone(), t.to_string());
        writers.push(tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            for n in 0..25 {
                let one = Instant::now();
                place_order(&db, &label, writer, n).await;
                slowest = slowest.max(one.elapsed());
            }
            slowest
        }));
    }
    let mut slowest = Duration::ZERO;
    for writer in writers {
        slowest = slowest.max(writer.await.expect("writer"));
    }
    let all = started.elapsed();
    println!("{t}: 100 business transactions beside a hung publish took {all:?}, the slowest {slowest:?}");
    assert!(
        slowest < HANG / 2,
        "{t}: a business transaction waited {slowest:?} while the broker hung ({HANG:?} a publish)"
    );

    // The broker recovers: every event goes out once, in order per aggregate.
    broker.set_delay(Duration::ZERO);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count_published(&t).await < 120 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.expect("relay");
    assert_eq!(count_published(&t).await, 120, "{t}: every event published");
    let received = broker.received();
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

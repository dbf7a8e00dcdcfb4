//! The relay as a service (`OutboxService`): shutdown leaves nothing claimed, store errors back off and
//! show in its health, cleanup deletes only published rows and runs in one replica at a time.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::{count_outbox, count_published, count_unpublished, enqueue_committed, event, fast_config, outbox_rows};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::{ClaimRequest, MaintenanceStore, OutboxStats, OutboxStore, SeaOrmBatch, StoreLock};
use outbox_seaorm::{
    Backoff, ClaimMode, CleanupConfig, DeadLetterPolicy, Error, InMemoryPublisher, OutboxService, Relay, RelayConfig,
    SeaOrmStore,
};

/// Polls `condition` every 10 ms until it holds or `within` passes; returns whether it held.
async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Rows that carry a claim: a lease token or a lease expiry.
async fn count_claimed(t: &TestDb) -> usize {
    outbox_rows(t).await.iter().filter(|row| row.lease_token.is_some() || row.lease_until_ms.is_some()).count()
}

/// Four aggregates with five events each: one claim of 20 rows, published in five waves of four.
async fn four_runs_of_five(t: &TestDb) {
    let events: Vec<_> = (0..20).map(|i| event(&format!("o{}", i % 4), "order.placed", i)).collect();
    enqueue_committed(t, &events).await;
}

async fn shutdown_mid_batch_leaves_no_row_claimed(t: TestDb) {
    four_runs_of_five(&t).await;
    let broker = InMemoryPublisher::new();
    // 3 s a wave: waiting for all four would take 12 s, for the one in flight at most 3 s.
    broker.set_delay(Duration::from_secs(3));
    let lease = ClaimMode::Lease { duration: Duration::from_secs(60) };
    let config = fast_config().with_claim_mode(lease).with_publish_timeout(Duration::from_secs(10));
    let service = OutboxService::builder(SeaOrmStore::new(t.db.clone()), broker.clone())
        .relay_config(config)
        .without_cleanup()
        .start()
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(eventually(Duration::from_secs(30), || broker.publish_calls() >= 1).await, "{t}: no publish");
    assert_eq!(
        count_claimed(&t).await,
        4,
        "{t}: each of the four runs is leased (on its head) while the first wave is out"
    );

    // Not a duration bound: had shutdown waited for every wave, all 20 would be published (checked below).
    tokio::time::timeout(Duration::from_secs(60), service.shutdown())
        .await
        .unwrap_or_else(|_| panic!("{t}: shutdown did not finish within 60 s"));
    assert_eq!(count_claimed(&t).await, 0, "{t}: a row is still leased after shutdown");
    let published = count_published(&t).await;
    assert!((4..20).contains(&published), "{t}: the wave in flight was recorded, the rest released: {published}");
    assert!(
        outbox_rows(&t).await.iter().filter(|r| r.published_at_ms.is_none()).all(|r| r.attempts == 0),
        "{t}: released rows were not counted as failed attempts"
    );
    assert!(service.health().stopped, "{t}");
}
per_backend!(shutdown_mid_batch_leaves_no_row_claimed, "service_shutdown_lease");

async fn shutdown_mid_batch_in_transaction_mode_lets_another_relay_claim_the_rest_at_once(t: TestDb) {
    four_runs_of_five(&t).await;
    let broker = InMemoryPublisher::new();
    broker.set_delay(Duration::from_millis(300));
    let service = OutboxService::builder(SeaOrmStore::new(t.db.clone()), broker.clone())
        .relay_config(fast_config())
        .without_cleanup()
        .start()
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(eventually(Duration::from_secs(30), || broker.publish_calls() >= 1).await, "{t}: no publish");
    service.shutdown().await;

    let unpublished = count_unpublished(&t).await;
    assert!(unpublished > 0 && unpublished < 20, "{t}: {unpublished}");
    let other = SeaOrmStore::new(t.reconnect().await);
    let request = ClaimRequest {
        now: Utc::now(),
        limit: 100,
        mode: ClaimMode::Transaction,
        dead_letters: DeadLetterPolicy::BlockAggregate,
    };
    let batch: SeaOrmBatch = other.claim(request).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    use outbox_seaorm::store::ClaimedBatch;
    assert_eq!(batch.events().len() as u64, unpublished, "{t}: every unpublished row is free to claim");
}
per_backend!(shutdown_mid_batch_in_transaction_mode_lets_another_relay_claim_the_rest_at_once, "service_shutdown_txn");

/// A store whose claims fail while `failing` is set, counting every claim.
struct FlakyStore {
    inner: SeaOrmStore,
    failing: Arc<AtomicBool>,
    claims: Arc<AtomicU64>,
}

impl OutboxStore for FlakyStore {
    type Batch = SeaOrmBatch;

    async fn claim(&self, request: ClaimRequest) -> outbox_seaorm::Result<SeaOrmBatch> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::Store {
                operation: "claim a batch",
                table: "outbox_events",
                backend: "test",
                source: "connection refused".into(),
            });
        }
        self.inner.claim(request).await
    }
}

impl MaintenanceStore for FlakyStore {
    async fn stats(&self, now: DateTime<Utc>) -> outbox_seaorm::Result<OutboxStats> {
        self.inner.stats(now).await
    }

    async fn cleanup(&self, now: DateTime<Utc>, retention: Duration, batch: u32) -> outbox_seaorm::Result<u64> {
        self.inner.cleanup(now, retention, batch).await
    }
}

async fn store_errors_back_off_exponentially_and_count_towards_health(t: TestDb) {
    let (failing, claims) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicU64::new(0)));
    let store = FlakyStore { inner: SeaOrmStore::new(t.db.clone()), failing: failing.clone(), claims: claims.clone() };
    let broker = InMemoryPublisher::new();
    let service = OutboxService::builder(store, broker.clone())
        .relay_config(fast_config().with_poll_interval(Duration::from_millis(10)))
        .error_backoff(Backoff { initial: Duration::from_millis(40), max: Duration::from_millis(200), multiplier: 2 })
        .stats_interval(Duration::from_millis(50))
        .without_cleanup()
        .start()
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    enqueue_committed(&t, &[event("o1", "order.placed", 1)]).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // Every 10 ms would be ~120 claims; 20–40, 40–80, 80–160 ms and then 100–200 ms apart is under 15.
    let failed = claims.load(Ordering::SeqCst);
    // (At least one: a starved machine may run fewer; the point is the upper bound.)
    assert!((1..=15).contains(&failed), "{t}: {failed} claims in 1.2 s while the store was down");
    let health = service.health();
    assert!(health.consecutive_failures as u64 >= failed - 1, "{t}: {health:?} after {failed} claims");
    assert!(health.last_error.as_deref().is_some_and(|e| e.contains("connection refused")), "{t}: {health:?}");
    assert!(!health.is_healthy(), "{t}");
    assert_eq!(health.stats.map(|s| s.pending), Some(1), "{t}: the sampler still samples: {health:?}");
    assert!(health.oldest_pending_age().is_some(), "{t}");

    failing.store(false, Ordering::SeqCst);
    let recovered =
        eventually(Duration::from_secs(30), || service.health().published_events == 1 && broker.received_count() == 1)
            .await;
    assert!(recovered, "{t}: the event was not published after the store came back");
    let health = service.health();
    assert_eq!((health.consecutive_failures, health.last_error.as_deref()), (0, None), "{t}: {health:?}");
    assert!(health.is_healthy() && health.last_success_at.is_some(), "{t}: {health:?}");
    assert_eq!(health.published_events, 1, "{t}");
    service.shutdown().await;
}
per_backend!(store_errors_back_off_exponentially_and_count_towards_health, "service_error_backoff");

/// 30 published rows and 4 that never will be (2 pending in backoff, 2 dead).
async fn published_and_unpublished(t: &TestDb) {
    let events: Vec<_> = (0..30).map(|i| event(&format!("p{i}"), "order.placed", i)).collect();
    enqueue_committed(t, &events).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), fast_config()).expect("config");
    assert_eq!(relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}")).published, 30, "{t}");
    enqueue_committed(t, &[event("w1", "order.placed", 1), event("w2", "order.placed", 2)]).await;
    enqueue_committed(t, &[event("d1", "order.placed", 1), event("d2", "order.placed", 2)]).await;
    let broker = InMemoryPublisher::new();
    broker.fail_aggregate("w1", 1);
    broker.fail_aggregate("w2", 1);
    broker.fail_aggregate("d1", 1);
    broker.fail_aggregate("d2", 1);
    let dying = RelayConfig { max_attempts: 1, ..fast_config() };
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker, dying).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.dead, 4, "{t}: {pass:?}");
    // Two of them come back as pending (in backoff); they stay unpublished like the dead ones.
    let filter = outbox_ops::admin::DeadFilter::default().aggregate_id("w1");
    outbox_ops::admin::replay_dead(&t.db, &filter).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let filter = outbox_ops::admin::DeadFilter::default().aggregate_id("w2");
    outbox_ops::admin::replay_dead(&t.db, &filter).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((count_published(t).await, count_unpublished(t).await), (30, 4), "{t}");
}

async fn two_services_clean_up_concurrently_without_double_deleting_or_touching_unpublished_rows(t: TestDb) {
    published_and_unpublished(&t).await;
    let down = InMemoryPublisher::new();
    down.go_down_for(u32::MAX); // the two pending rows stay unpublished whatever the relays do
    let cleanup = CleanupConfig::default().with_interval(Duration::from_millis(20)).with_batch_size(7);
    let config = fast_config().with_poll_interval(Duration::from_millis(20));
    let start = |db| {
        OutboxService::builder(SeaOrmStore::new(db), down.clone())
            .relay_config(config.clone())
            .cleanup(cleanup.clone().with_outbox_retention(Duration::ZERO))
            .start()
    };
    let a = start(t.reconnect().await).unwrap_or_else(|e| panic!("{t}: {e}"));
    let b = start(t.reconnect().await).unwrap_or_else(|e| panic!("{t}: {e}"));
    let deleted = || a.health().cleaned_outbox_rows + b.health().cleaned_outbox_rows;
    assert!(eventually(Duration::from_secs(30), || deleted() >= 30).await, "{t}: deleted {}", deleted());
    // Both take turns on the lock: wait (a state, not a time) until each has run a cleanup of its own, so
    // the count below is checked after rounds of both, whichever ran first on a loaded machine.
    let both_ran = || a.health().last_cleanup_at.is_some() && b.health().last_cleanup_at.is_some();
    assert!(eventually(Duration::from_secs(30), both_ran).await, "{t}: a {:?}, b {:?}", a.health(), b.health());
    assert_eq!(deleted(), 30, "{t}: each row is deleted (and counted) once");
    for (name, service) in [("a", &a), ("b", &b)] {
        let health = service.health();
        assert_eq!(health.last_cleanup_error, None, "{t}: service {name}: {health:?}");
    }
    assert_eq!((count_outbox(&t).await, count_unpublished(&t).await), (4, 4), "{t}: unpublished rows stay");
    a.shutdown().await;
    b.shutdown().await;
}
per_backend!(
    two_services_clean_up_concurrently_without_double_deleting_or_touching_unpublished_rows,
    "service_cleanup_concurrent"
);

async fn the_cleanup_lock_admits_one_process_at_a_time(t: TestDb) {
    let a = SeaOrmStore::new(t.reconnect().await);
    let b = SeaOrmStore::new(t.reconnect().await);
    let held = a.try_lock("outbox_test").await.unwrap_or_else(|e| panic!("{t}: {e}")).expect("free at first");
    let second: Option<StoreLock> = b.try_lock("outbox_test").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    if t.backend == sea_orm::DbBackend::Sqlite {
        assert!(second.is_some(), "{t}: SQLite needs no lock: its writers take turns");
        return;
    }
    assert!(second.is_none(), "{t}: a second process took a held lock");
    let other = b.try_lock("outbox_other").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(other.is_some(), "{t}: locks of other names are independent");
    held.release().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let taken = b.try_lock("outbox_test").await.unwrap_or_else(|e| panic!("{t}: {e}")).expect("free after release");

    drop(taken); // never released: closing its connection lets it go
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(lock) = a.try_lock("outbox_test").await.unwrap_or_else(|e| panic!("{t}: {e}")) {
            lock.release().await.unwrap_or_else(|e| panic!("{t}: {e}"));
            break;
        }
        assert!(Instant::now() < deadline, "{t}: a dropped lock stayed held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
per_backend!(the_cleanup_lock_admits_one_process_at_a_time, "service_cleanup_lock");

#[tokio::test]
async fn an_inbox_retention_shorter_than_the_redelivery_horizon_does_not_start() {
    let store = outbox_seaorm::SeaOrmStore::new(sea_orm::DatabaseConnection::default());
    let cleanup = CleanupConfig::default().with_inbox_retention(Duration::from_secs(60));
    let err = OutboxService::builder(store, InMemoryPublisher::new()).cleanup(cleanup).start().unwrap_err();
    let message = err.to_string();
    assert!(message.contains("inbox_retention") && message.contains("redelivery horizon"), "{message}");
}

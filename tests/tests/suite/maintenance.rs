//! Operating the outbox: backlog stats for alerting, and cleanup of old published rows.

use crate::common;

use std::time::Duration;

use common::{CAP, after, count_outbox, count_published, count_unpublished, enqueue_committed, event, fast_config};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::{MaintenanceStore, OutboxStats};
use outbox_seaorm::{Error, InMemoryPublisher, NewEvent, Relay, SeaOrmStore};

async fn stats_report_pending_dead_the_oldest_age_and_the_most_attempts(t: TestDb) {
    let store = SeaOrmStore::new(t.db.clone());
    let empty = store.stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(empty, OutboxStats::default(), "{t}: an empty outbox");

    enqueue_committed(&t, &[event("a", "t", 1), event("b", "t", 2), event("c", "t", 3)]).await;
    let now = chrono::Utc::now();
    let stats = store.stats(after(now, Duration::from_secs(5))).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead, stats.max_attempts), (3, 0, 0), "{t}: {stats:?}");
    assert!((5..=6).contains(&stats.oldest_pending_seconds), "{t}: {stats:?}");

    let broker = InMemoryPublisher::new();
    broker.fail_aggregate("a", 100);
    broker.fail_aggregate("b", 1);
    let relay = Relay::new(store, broker, fast_config().with_max_attempts(2)).expect("config");
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.published, pass.failed), (1, 2), "{t}: {pass:?}");
    let stats = relay.store().stats(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead, stats.max_attempts), (2, 0, 1), "{t}: {stats:?}");

    let later = after(now, CAP);
    let pass = relay.run_once_at(later).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.published, pass.dead), (1, 1), "{t}: {pass:?}");
    let stats = relay.store().stats(later).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead, stats.max_attempts), (0, 1, 2), "{t}: {stats:?}");
    assert_eq!(stats.oldest_pending_seconds, 0, "{t}: nothing pending: {stats:?}");
}
per_backend!(stats_report_pending_dead_the_oldest_age_and_the_most_attempts, "stats_backlog_figures");

async fn cleanup_deletes_only_published_rows_past_the_retention_in_batches(t: TestDb) {
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), fast_config()).expect("config");
    let batch =
        |prefix: &str, n: u64| -> Vec<NewEvent> { (0..n).map(|i| event(&format!("{prefix}{i}"), "t", i)).collect() };
    // 25 rows published at t0, 5 published 90 minutes later, 3 never published.
    enqueue_committed(&t, &batch("old", 25)).await;
    let t0 = chrono::Utc::now();
    assert_eq!(relay.run_once_at(t0).await.unwrap_or_else(|e| panic!("{t}: {e}")).published, 25, "{t}");
    enqueue_committed(&t, &batch("recent", 5)).await;
    let t1 = after(t0, Duration::from_secs(90 * 60));
    assert_eq!(relay.run_once_at(t1).await.unwrap_or_else(|e| panic!("{t}: {e}")).published, 5, "{t}");
    enqueue_committed(&t, &batch("pending", 3)).await;
    assert_eq!(count_outbox(&t).await, 33, "{t}");

    let hour = Duration::from_secs(3600);
    let store = relay.store();
    let deleted = store.cleanup(after(t0, hour / 2), hour, 10).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(deleted, 0, "{t}: nothing is older than the retention yet");

    let deleted = store.cleanup(after(t0, 2 * hour), hour, 10).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(deleted, 25, "{t}: three batches of at most 10");
    assert_eq!(count_published(&t).await, 5, "{t}: rows published within the retention stay");
    assert_eq!(count_unpublished(&t).await, 3, "{t}: pending rows are never cleaned up");

    let deleted = store.cleanup(after(t1, 2 * hour), hour, 10).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(deleted, 5, "{t}");
    let far = after(t1, 1000 * hour);
    assert_eq!(store.cleanup(far, hour, 10).await.unwrap_or_else(|e| panic!("{t}: {e}")), 0, "{t}");
    assert_eq!((count_outbox(&t).await, count_unpublished(&t).await), (3, 3), "{t}");

    match store.cleanup(far, hour, 0).await {
        Err(Error::InvalidConfig { .. }) => {}
        other => panic!("{t}: a zero cleanup batch must be rejected, got {other:?}"),
    }
}
per_backend!(cleanup_deletes_only_published_rows_past_the_retention_in_batches, "cleanup_old_published_rows");

/// The cleanup re-arms aggregates whose hint was lost (the safety net under the hints): their events are
/// claimed again. It never waits for a writer: an aggregate a writer's open transaction holds is left
/// alone (the writer's enqueue sets its hint itself).
async fn cleanup_rearms_lost_hints_without_waiting_for_writers(t: TestDb) {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), fast_config()).expect("config");
    enqueue_committed(&t, &[event("lost-1", "t", 1), event("lost-2", "t", 2)]).await;
    t.db.execute_unprepared("UPDATE outbox_aggregates SET due_at_ms = NULL")
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}")).claimed, 0, "{t}: the hints are lost");

    // A writer holds another aggregate's row (not on SQLite, where a writer holds the whole database).
    let writer = if t.backend == sea_orm::DbBackend::Sqlite {
        None
    } else {
        let other = t.reconnect().await;
        let txn = other.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        outbox_seaorm::enqueue(&txn, &event("held", "t", 3)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        Some((other, txn))
    };
    let hour = Duration::from_secs(3600);
    let cleanup = relay.store().cleanup(chrono::Utc::now(), hour, 100);
    let deleted = tokio::time::timeout(Duration::from_secs(60), cleanup)
        .await
        .unwrap_or_else(|_| panic!("{t}: the cleanup waited for the writer"))
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(deleted, 0, "{t}");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.published, 2, "{t}: both re-armed aggregates published: {pass:?}");
    if let Some((_other, txn)) = writer {
        txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(pass.published, 1, "{t}: the writer's event, hinted by its own enqueue: {pass:?}");
    }
}
per_backend!(cleanup_rearms_lost_hints_without_waiting_for_writers, "cleanup_rearm");

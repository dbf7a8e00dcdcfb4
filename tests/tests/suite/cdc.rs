//! CDC mode (Debezium reads the WAL, so no row is ever marked published): cleanup deletes rows by age
//! whether or not they were published, never a new one; the default mode never deletes an unpublished
//! row; stats report rows kept instead of a backlog.

use crate::common;

use std::time::Duration;

use common::{count_outbox, count_published, count_unpublished, enqueue_committed, event};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_ops::admin::{self, CleanupConfig, StatsMode};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{InMemoryPublisher, Relay, RelayConfig, SeaOrmStore};
use sea_orm::ConnectionTrait;

const DAY: Duration = Duration::from_secs(86_400);

/// Makes the rows of aggregates whose id starts with `prefix` look `age` old.
async fn age_rows(t: &TestDb, prefix: &str, age: Duration) {
    let created = chrono::Utc::now().timestamp_millis() - age.as_millis() as i64;
    let sql = format!("UPDATE outbox_events SET created_at_ms = {created} WHERE aggregate_id LIKE '{prefix}%'");
    t.db.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
}

/// 12 rows four days old (2 of them published by a relay), 5 new rows, all but those 2 unpublished.
async fn old_and_new_rows(t: &TestDb) {
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), RelayConfig::default()).expect("config");
    enqueue_committed(t, &[event("pub-0", "t", 0), event("pub-1", "t", 1)]).await;
    assert_eq!(relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}")).published, 2, "{t}");
    let old: Vec<_> = (0..10).map(|i| event(&format!("old-{i}"), "t", i)).collect();
    enqueue_committed(t, &old).await;
    age_rows(t, "old", 4 * DAY).await;
    let new: Vec<_> = (0..5).map(|i| event(&format!("new-{i}"), "t", i)).collect();
    enqueue_committed(t, &new).await;
    assert_eq!((count_outbox(t).await, count_unpublished(t).await), (17, 15), "{t}");
}

async fn cdc_cleanup_deletes_old_unpublished_rows_and_never_new_ones(t: TestDb) {
    old_and_new_rows(&t).await;
    let config = CleanupConfig::default()
        .with_outbox_retention(3 * DAY)
        .with_delete_unpublished_after(3 * DAY)
        .with_batch_size(4);
    config.validate(&RelayConfig::default()).unwrap_or_else(|e| panic!("{t}: {e}"));
    let mut batches = Vec::new();
    let report = admin::cleanup(&t.db, &config, |p| batches.push((p.table, p.deleted)))
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(report.outbox_deleted, 10, "{t}: the 10 old unpublished rows (the published ones are too recent)");
    assert_eq!(count_outbox(&t).await, 7, "{t}");
    assert_eq!(count_unpublished(&t).await, 5, "{t}: every new row stays");
    assert!(batches.iter().all(|(_, deleted)| *deleted <= 4), "{t}: in batches of at most 4: {batches:?}");

    // The service's path (the store's CDC cleanup) deletes by age too: the published rows, 4 days old now,
    // and nothing new.
    age_rows(&t, "pub-", 4 * DAY).await;
    let store = SeaOrmStore::new(t.db.clone());
    let deleted =
        store.cleanup_unpublished(chrono::Utc::now(), 3 * DAY, 4).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(deleted, 2, "{t}: the old rows, published or not");
    assert_eq!((count_outbox(&t).await, count_published(&t).await), (5, 0), "{t}");

    let stats = admin::stats_in(&t.db, StatsMode::Cdc).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(
        (stats.mode, stats.rows, stats.totals.pending),
        (StatsMode::Cdc, Some(5), 0),
        "{t}: no backlog: {stats:?}"
    );
    assert!(stats.oldest_row_seconds.is_some_and(|s| s < 60), "{t}: {stats:?}");
    assert!(stats.by_aggregate_type.is_empty(), "{t}: {stats:?}");
}
per_backend!(cdc_cleanup_deletes_old_unpublished_rows_and_never_new_ones, "cdc_cleanup_by_age");

async fn default_cleanup_never_deletes_unpublished_rows_however_old(t: TestDb) {
    old_and_new_rows(&t).await;
    let config = CleanupConfig::default().with_outbox_retention(Duration::from_secs(1)).with_batch_size(4);
    // The two published rows: marked a moment ago, so wait past the 1 s retention.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = admin::cleanup(&t.db, &config, |_| {}).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(report.outbox_deleted, 2, "{t}: only the published rows");
    assert_eq!((count_outbox(&t).await, count_unpublished(&t).await), (15, 15), "{t}: the 4-day-old unpublished stay");

    let relay_stats = admin::stats(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((relay_stats.mode, relay_stats.totals.pending, relay_stats.rows), (StatsMode::Relay, 15, None), "{t}");
    assert!(relay_stats.totals.oldest_pending_seconds >= 4 * 86_400 - 60, "{t}: {relay_stats:?}");
}
per_backend!(default_cleanup_never_deletes_unpublished_rows_however_old, "cdc_default_keeps_unpublished");

#[test]
fn a_cdc_age_within_the_redelivery_horizon_is_refused_with_the_reason() {
    let config = CleanupConfig::default().with_delete_unpublished_after(Duration::from_secs(60));
    let err = config.validate(&RelayConfig::default()).expect_err("too short").to_string();
    assert!(err.contains("cleanup.delete_unpublished_after"), "{err}");
    assert!(err.contains("redelivery horizon"), "{err}");
}

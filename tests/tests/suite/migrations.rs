//! Every way the guide (docs/transactions.md) offers to create the outbox tables works on one database, in
//! either order, and again: an app's own `Migrator` with `outbox_seaorm::migrations()` added (bookkeeping in
//! `seaql_migrations`), and `outbox_seaorm::migrate` (what `outbox migrate` runs; bookkeeping in
//! `outbox_seaorm_migrations`), also from several pools at once. The schema comes out the same each way.

use crate::common;

use common::{count_published, enqueue_committed, event};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::{InMemoryPublisher, Relay, RelayConfig, SeaOrmStore};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use sea_orm_migration::{MigrationTrait, MigratorTrait};

/// An app's own migrator: its tables (none here) and the outbox's, in `seaql_migrations`.
struct AppMigrator;

impl MigratorTrait for AppMigrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        outbox_seaorm::migrations()
    }
}

/// The outbox's tables, columns, indexes and triggers, as text, without the bookkeeping tables.
async fn schema(t: &TestDb) -> Vec<String> {
    let sql = match t.backend {
        DbBackend::Postgres => {
            "SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type AS item \
             FROM information_schema.columns WHERE table_schema = current_schema() AND table_name NOT LIKE '%migrations' \
             UNION ALL SELECT 'index ' || replace(indexdef, current_schema() || '.', '') FROM pg_indexes \
             WHERE schemaname = current_schema() AND tablename NOT LIKE '%migrations' \
             UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger \
             WHERE tgrelid = to_regclass('outbox_events') AND NOT tgisinternal ORDER BY 1"
        }
        DbBackend::MySql => {
            "SELECT CONCAT('column ', table_name, '.', column_name, ' ', column_type) AS item FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name NOT LIKE '%migrations' \
             UNION ALL SELECT CONCAT('index ', table_name, '.', index_name, '.', seq_in_index, ' ', column_name) \
             FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name NOT LIKE '%migrations' \
             UNION ALL SELECT CONCAT('trigger ', trigger_name) FROM information_schema.triggers \
             WHERE trigger_schema = DATABASE() ORDER BY 1"
        }
        _ => {
            "SELECT type || ' ' || name || ' ' || COALESCE(sql, '') AS item FROM sqlite_master \
              WHERE name NOT LIKE '%migrations%' ORDER BY 1"
        }
    };
    let rows = t.db.query_all_raw(Statement::from_string(t.backend, sql)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    rows.iter().map(|row| row.try_get::<String>("", "item").unwrap_or_else(|e| panic!("{t}: {e}"))).collect()
}

async fn migrate(t: &TestDb) {
    outbox_seaorm::migrate(&t.db).await.unwrap_or_else(|e| panic!("{t}: outbox_seaorm::migrate: {e}"));
}

async fn app_migrator(t: &TestDb) {
    AppMigrator::up(&t.db, None).await.unwrap_or_else(|e| panic!("{t}: the app's Migrator: {e}"));
}

/// The outbox works: nothing is reported pending, and an event is published.
async fn assert_usable(t: &TestDb) {
    let pending = outbox_ops::admin::pending_migrations(&t.db, None).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(pending.is_empty(), "{t}: pending {pending:?}");
    enqueue_committed(t, &[event("o1", "placed", 1)]).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), RelayConfig::default())
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(count_published(t).await, 1, "{t}");
}

async fn migrate_after_the_apps_migrator_and_the_other_way_round(t: TestDb) {
    let first = t.empty("mig_app_first").await;
    app_migrator(&first).await;
    let created = schema(&first).await;
    assert!(created.iter().any(|item| item.contains("outbox_events")), "{t}: {created:?}");
    assert!(created.iter().any(|item| item.starts_with("trigger outbox_events_numbering")), "{t}: {created:?}");
    migrate(&first).await;
    migrate(&first).await;
    assert_eq!(schema(&first).await, created, "{t}: outbox migrate after the app's Migrator changed nothing");
    assert_usable(&first).await;

    let second = t.empty("mig_outbox_first").await;
    migrate(&second).await;
    assert_eq!(schema(&second).await, created, "{t}: both ways create the same schema");
    app_migrator(&second).await;
    app_migrator(&second).await;
    assert_eq!(schema(&second).await, created, "{t}: the app's Migrator after outbox migrate changed nothing");
    assert_usable(&second).await;
}
per_backend!(migrate_after_the_apps_migrator_and_the_other_way_round, "mig_orders");

async fn four_pools_migrating_at_once_all_succeed(t: TestDb) {
    let fresh = t.empty("mig_at_once").await;
    let mut runs = Vec::new();
    for _ in 0..4 {
        let db = fresh.reconnect().await;
        runs.push(tokio::spawn(async move { outbox_seaorm::migrate(&db).await.map_err(|e| e.to_string()) }));
    }
    for run in runs {
        run.await.unwrap_or_else(|e| panic!("{t}: {e}")).unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    app_migrator(&fresh).await;
    assert_usable(&fresh).await;
}
per_backend!(four_pools_migrating_at_once_all_succeed, "mig_at_once_run");

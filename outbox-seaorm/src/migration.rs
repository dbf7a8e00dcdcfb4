//! Schema migrations for the outbox and inbox tables.
//!
//! An application with its own `Migrator` adds [`migrations()`] to its list; an application without one
//! calls [`migrate`], which keeps its own bookkeeping table (`outbox_seaorm_migrations`). Both may run on
//! one database, in either order: a migration whose last object exists records itself and does nothing.
//! Shipped migrations are never renamed, and never change what they create; changes come as new ones.

use sea_orm::{ConnectionTrait, DbBackend};
use sea_orm_migration::prelude::*;

use crate::error::{Result, store_error};

mod operations;
mod partitioned;
pub use operations::{m20261218_000007_dead_index, m20261219_000008_relay_heartbeats};
pub use partitioned::{m20261220_000009_partitioned_outbox, partitioned};

/// The migrations of this crate, oldest first, for an application's own `Migrator`.
pub fn migrations() -> Vec<Box<dyn MigrationTrait>> {
    vec![
        Box::new(m20261129_000001_create_outbox::Migration),
        Box::new(m20261129_000002_create_inbox::Migration),
        Box::new(m20261201_000003_aggregate_versions::Migration),
        Box::new(m20261215_000004_inbox_retention_index::Migration),
        Box::new(m20261216_000005_foreign_writers::Migration),
        Box::new(m20261217_000006_one_pending_index::Migration),
        Box::new(m20261218_000007_dead_index::Migration),
        Box::new(m20261219_000008_relay_heartbeats::Migration),
    ]
}

/// A migrator with its own bookkeeping table, for applications without a `Migrator`.
pub struct Migrator;

impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        migrations()
    }

    fn migration_table_name() -> DynIden {
        "outbox_seaorm_migrations".into_iden()
    }
}

/// How long [`migrate`] waits for another process's migration to finish.
pub const MIGRATE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Applies every pending outbox and inbox migration; safe when several replicas start at once.
///
/// On PostgreSQL and MySQL/MariaDB the migration runs under a database lock (`pg_try_advisory_lock`,
/// `GET_LOCK`): one process migrates, the others wait for it (up to [`MIGRATE_LOCK_WAIT`]) and then find
/// nothing left to do. On SQLite the whole migration is one `BEGIN IMMEDIATE` transaction (SQLite's DDL is
/// transactional), so the second process waits for the file's write lock and finds the work done.
pub async fn migrate(db: &sea_orm::DatabaseConnection) -> Result<()> {
    let backend = db.get_database_backend();
    let error = |operation| move |e| store_error(operation, "outbox_events", backend, e);
    if backend == DbBackend::Sqlite {
        let txn = crate::transaction::begin_writer(db).await.map_err(error("begin a migration"))?;
        Migrator::up(&txn, None).await.map_err(error("migrate"))?;
        return txn.commit().await.map_err(error("commit a migration"));
    }
    let lock = crate::lock::lock(db, "outbox_migrate", MIGRATE_LOCK_WAIT)
        .await
        .map_err(error("take the migration lock"))?
        .ok_or_else(|| {
            crate::Error::invalid_config(
                "migrate",
                format!(
                    "another process has held the outbox migration lock for {MIGRATE_LOCK_WAIT:?}; is a migration stuck?"
                ),
            )
        })?;
    let migrated = Migrator::up(db, None).await.map_err(error("migrate"));
    let released = lock.release().await;
    migrated?;
    released
}

/// Whether a migration already ran under another bookkeeping table: the last object it creates exists.
/// An app may add [`migrations()`] to its own `Migrator` (table `seaql_migrations`) and also run
/// [`migrate`] or `outbox migrate` (table `outbox_seaorm_migrations`), in either order; each migration then
/// finds its work done and only records itself.
async fn done_already(
    manager: &SchemaManager<'_>,
    table: &str,
    index: Option<&str>,
) -> std::result::Result<bool, DbErr> {
    match index {
        None => manager.has_table(table).await,
        Some(index) => Ok(manager.has_table(table).await? && manager.has_index(table, index).await?),
    }
}

/// Whether trigger `name` exists on `outbox_events` (in the current schema on PostgreSQL).
async fn has_trigger(manager: &SchemaManager<'_>, name: &str) -> std::result::Result<bool, DbErr> {
    let backend = manager.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT 1 AS found FROM pg_trigger WHERE tgname = $1 AND tgrelid = to_regclass('outbox_events')"
        }
        DbBackend::MySql => {
            "SELECT 1 AS found FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = ?"
        }
        _ => "SELECT 1 AS found FROM sqlite_master WHERE type = 'trigger' AND name = ?",
    };
    let statement = sea_orm::Statement::from_sql_and_values(backend, sql, [name.into()]);
    Ok(manager.get_connection().query_one_raw(statement).await?.is_some())
}

/// Runs `statements`, one at a time, on `manager`'s connection.
async fn execute_all(manager: &SchemaManager<'_>, statements: &[&str]) -> std::result::Result<(), DbErr> {
    let db = manager.get_connection();
    for sql in statements {
        db.execute_unprepared(sql).await?;
    }
    Ok(())
}

#[derive(DeriveIden)]
enum OutboxEvents {
    Table,
    Seq,
    EventId,
    AggregateType,
    AggregateId,
    AggregateVersion,
    EventType,
    SchemaVersion,
    Payload,
    Headers,
    CreatedAtMs,
    Attempts,
    NextAttemptAtMs,
    LastError,
    PublishedAtMs,
    DeadAtMs,
    LeaseToken,
    LeaseUntilMs,
}

#[derive(DeriveIden)]
enum OutboxAggregates {
    Table,
    AggregateType,
    AggregateId,
    LastVersion,
    DueAtMs,
}

#[derive(DeriveIden)]
enum InboxMessages {
    Table,
    Consumer,
    MessageId,
    ProcessedAtMs,
}

/// Creates `outbox_events` and the indexes the relay's claim, stats and cleanup use.
#[allow(non_camel_case_types)]
pub mod m20261129_000001_create_outbox {
    use super::*;

    /// The migration.
    pub struct Migration;

    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261129_000001_create_outbox"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            if done_already(manager, "outbox_events", None).await? {
                return Ok(());
            }
            manager
                .create_table(
                    Table::create()
                        .table(OutboxEvents::Table)
                        .col(ColumnDef::new(OutboxEvents::Seq).big_integer().not_null().auto_increment().primary_key())
                        .col(ColumnDef::new(OutboxEvents::EventId).string_len(36).not_null().unique_key())
                        .col(ColumnDef::new(OutboxEvents::AggregateType).string_len(64).not_null())
                        .col(ColumnDef::new(OutboxEvents::AggregateId).string_len(128).not_null())
                        .col(ColumnDef::new(OutboxEvents::EventType).string_len(128).not_null())
                        .col(ColumnDef::new(OutboxEvents::SchemaVersion).integer().not_null())
                        .col(ColumnDef::new(OutboxEvents::Payload).json_binary().not_null())
                        .col(ColumnDef::new(OutboxEvents::Headers).json_binary().not_null())
                        .col(ColumnDef::new(OutboxEvents::CreatedAtMs).big_integer().not_null())
                        .col(ColumnDef::new(OutboxEvents::Attempts).integer().not_null().default(0))
                        .col(ColumnDef::new(OutboxEvents::NextAttemptAtMs).big_integer().not_null())
                        .col(ColumnDef::new(OutboxEvents::LastError).text().null())
                        .col(ColumnDef::new(OutboxEvents::PublishedAtMs).big_integer().null())
                        .col(ColumnDef::new(OutboxEvents::DeadAtMs).big_integer().null())
                        .col(ColumnDef::new(OutboxEvents::LeaseToken).string_len(36).null())
                        .col(ColumnDef::new(OutboxEvents::LeaseUntilMs).big_integer().null())
                        .to_owned(),
                )
                .await?;
            // The claim scans unpublished rows by seq and probes each aggregate's earlier unpublished rows;
            // cleanup scans published rows by age. Where partial indexes exist they hold pending rows only,
            // so they stay small however large the table grows.
            let indexes: &[&str] = match manager.get_database_backend() {
                DbBackend::MySql => &[
                    "CREATE INDEX outbox_events_pending ON outbox_events (published_at_ms, seq)",
                    "CREATE INDEX outbox_events_aggregate ON outbox_events (aggregate_type, aggregate_id, published_at_ms, seq)",
                ],
                _ => &[
                    "CREATE INDEX outbox_events_pending ON outbox_events (seq) WHERE published_at_ms IS NULL",
                    "CREATE INDEX outbox_events_aggregate ON outbox_events (aggregate_type, aggregate_id, seq) WHERE published_at_ms IS NULL",
                    "CREATE INDEX outbox_events_published ON outbox_events (published_at_ms) WHERE published_at_ms IS NOT NULL",
                ],
            };
            execute_all(manager, indexes).await
        }

        async fn down(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            manager.drop_table(Table::drop().table(OutboxEvents::Table).to_owned()).await
        }
    }
}

/// Creates `inbox_messages`, keyed by `(consumer, message_id)`.
#[allow(non_camel_case_types)]
pub mod m20261129_000002_create_inbox {
    use super::*;

    /// The migration.
    pub struct Migration;

    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261129_000002_create_inbox"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            if done_already(manager, "inbox_messages", None).await? {
                return Ok(());
            }
            manager
                .create_table(
                    Table::create()
                        .table(InboxMessages::Table)
                        .col(ColumnDef::new(InboxMessages::Consumer).string_len(128).not_null())
                        .col(ColumnDef::new(InboxMessages::MessageId).string_len(128).not_null())
                        .col(ColumnDef::new(InboxMessages::ProcessedAtMs).big_integer().not_null())
                        .primary_key(Index::create().col(InboxMessages::Consumer).col(InboxMessages::MessageId))
                        .to_owned(),
                )
                .await
        }

        async fn down(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            manager.drop_table(Table::drop().table(InboxMessages::Table).to_owned()).await
        }
    }
}

/// Adds per-aggregate versions and the `outbox_aggregates` table the relay claims runs through.
///
/// Existing rows get versions 1, 2, 3, … per aggregate in `seq` order, and every aggregate a row, so a
/// backlog enqueued before the upgrade drains as before.
#[allow(non_camel_case_types)]
pub mod m20261201_000003_aggregate_versions {
    use super::*;

    /// The migration.
    pub struct Migration;

    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261201_000003_aggregate_versions"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            if done_already(manager, "outbox_aggregates", Some("outbox_aggregates_due")).await? {
                return Ok(());
            }
            manager
                .create_table(
                    Table::create()
                        .table(OutboxAggregates::Table)
                        .col(ColumnDef::new(OutboxAggregates::AggregateType).string_len(64).not_null())
                        .col(ColumnDef::new(OutboxAggregates::AggregateId).string_len(128).not_null())
                        .col(ColumnDef::new(OutboxAggregates::LastVersion).big_integer().not_null())
                        .col(ColumnDef::new(OutboxAggregates::DueAtMs).big_integer().null())
                        .primary_key(
                            Index::create().col(OutboxAggregates::AggregateType).col(OutboxAggregates::AggregateId),
                        )
                        .to_owned(),
                )
                .await?;
            manager
                .alter_table(
                    Table::alter()
                        .table(OutboxEvents::Table)
                        .add_column(ColumnDef::new(OutboxEvents::AggregateVersion).big_integer().not_null().default(0))
                        .to_owned(),
                )
                .await?;
            let numbered = "SELECT seq, ROW_NUMBER() OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY seq) AS v FROM outbox_events";
            let backfill = match manager.get_database_backend() {
                DbBackend::MySql => {
                    format!("UPDATE outbox_events e JOIN ({numbered}) r ON e.seq = r.seq SET e.aggregate_version = r.v")
                }
                DbBackend::Postgres => format!(
                    "UPDATE outbox_events e SET aggregate_version = r.v FROM ({numbered}) r WHERE e.seq = r.seq"
                ),
                _ => format!(
                    "UPDATE outbox_events SET aggregate_version = r.v FROM ({numbered}) AS r WHERE outbox_events.seq = r.seq"
                ),
            };
            let aggregates = "INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) \
                SELECT aggregate_type, aggregate_id, MAX(aggregate_version), \
                MIN(CASE WHEN published_at_ms IS NULL THEN next_attempt_at_ms END) \
                FROM outbox_events GROUP BY aggregate_type, aggregate_id";
            execute_all(manager, &[backfill.as_str(), aggregates]).await?;
            // `outbox_events_version`: one row per version, and the point lookups of the relay's hints.
            // `outbox_events_runs`: an aggregate's pending events in version order (its head first).
            // `outbox_aggregates_due`: aggregates with work, soonest first.
            let indexes: &[&str] = match manager.get_database_backend() {
                DbBackend::MySql => &[
                    "DROP INDEX outbox_events_aggregate ON outbox_events",
                    "CREATE UNIQUE INDEX outbox_events_version ON outbox_events (aggregate_type, aggregate_id, aggregate_version)",
                    "CREATE INDEX outbox_events_runs ON outbox_events (aggregate_type, aggregate_id, published_at_ms, aggregate_version)",
                    "CREATE INDEX outbox_aggregates_due ON outbox_aggregates (due_at_ms, aggregate_type, aggregate_id)",
                ],
                _ => &[
                    "DROP INDEX outbox_events_aggregate",
                    "CREATE UNIQUE INDEX outbox_events_version ON outbox_events (aggregate_type, aggregate_id, aggregate_version)",
                    "CREATE INDEX outbox_events_runs ON outbox_events (aggregate_type, aggregate_id, aggregate_version) WHERE published_at_ms IS NULL",
                    "CREATE INDEX outbox_aggregates_due ON outbox_aggregates (due_at_ms, aggregate_type, aggregate_id) WHERE due_at_ms IS NOT NULL",
                ],
            };
            execute_all(manager, indexes).await
        }

        async fn down(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            manager.drop_table(Table::drop().table(OutboxAggregates::Table).to_owned()).await?;
            let statements: &[&str] = match manager.get_database_backend() {
                DbBackend::MySql => &[
                    "DROP INDEX outbox_events_runs ON outbox_events",
                    "DROP INDEX outbox_events_version ON outbox_events",
                    "CREATE INDEX outbox_events_aggregate ON outbox_events (aggregate_type, aggregate_id, published_at_ms, seq)",
                ],
                _ => &[
                    "DROP INDEX outbox_events_runs",
                    "DROP INDEX outbox_events_version",
                    "CREATE INDEX outbox_events_aggregate ON outbox_events (aggregate_type, aggregate_id, seq) WHERE published_at_ms IS NULL",
                ],
            };
            execute_all(manager, statements).await?;
            manager
                .alter_table(
                    Table::alter().table(OutboxEvents::Table).drop_column(OutboxEvents::AggregateVersion).to_owned(),
                )
                .await
        }
    }
}

/// Indexes `inbox_messages` by processing time, for the retention cleanup (which deletes the oldest rows
/// in batches).
#[allow(non_camel_case_types)]
pub mod m20261215_000004_inbox_retention_index {
    use super::*;

    /// The migration.
    pub struct Migration;

    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261215_000004_inbox_retention_index"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            if done_already(manager, "inbox_messages", Some("inbox_messages_processed")).await? {
                return Ok(());
            }
            execute_all(manager, &["CREATE INDEX inbox_messages_processed ON inbox_messages (processed_at_ms)"]).await
        }

        async fn down(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            let drop: &str = match manager.get_database_backend() {
                DbBackend::MySql => "DROP INDEX inbox_messages_processed ON inbox_messages",
                _ => "DROP INDEX inbox_messages_processed",
            };
            execute_all(manager, &[drop]).await
        }
    }
}

/// Publishes rows that other writers insert with plain SQL (another service, another language, a tool).
///
/// Such a writer knows the event's columns but not `aggregate_version` or `outbox_aggregates`, through
/// which the relay finds work: its row would be pending for ever (and a second row of the same aggregate
/// would collide on version 0). A row trigger on `outbox_events` numbers every row inserted without a
/// version (`aggregate_version` left at its default, 0) the way `enqueue` does: it upserts the
/// aggregate's `outbox_aggregates` row, takes the next version from it (the row stays locked until the
/// writer commits, so one aggregate's rows are numbered, and published, in commit order) and marks the
/// aggregate due. Rows written by this crate carry their version and skip the trigger's body.
///
/// - PostgreSQL: `BEFORE INSERT … FOR EACH ROW WHEN (NEW.aggregate_version = 0)`, whose function runs
///   with the `search_path` the migration ran with (a writer with another `search_path` still reaches
///   the outbox's own `outbox_aggregates`).
/// - MySQL/MariaDB: `BEFORE INSERT … FOR EACH ROW`, the body behind `IF NEW.aggregate_version = 0`. With
///   binary logging on, creating a trigger needs the `TRIGGER` privilege and, unless
///   `log_bin_trust_function_creators` is set, `SUPER`.
/// - SQLite: `AFTER INSERT … WHEN NEW.aggregate_version = 0` (SQLite cannot change the row being
///   inserted): the row is written with version 0, then numbered by `seq` in the same statement.
///
/// Rows written with version 0 before this migration (at most one per aggregate, the unique index
/// refused the rest) are numbered by it.
#[allow(non_camel_case_types)]
pub mod m20261216_000005_foreign_writers {
    use sea_orm::Statement;

    use super::*;

    /// The trigger's name (and, on PostgreSQL, its function's).
    pub const TRIGGER: &str = "outbox_events_numbering";

    /// The migration.
    pub struct Migration;

    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261216_000005_foreign_writers"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            if has_trigger(manager, TRIGGER).await? {
                return Ok(());
            }
            let backend = manager.get_database_backend();
            let statements: &[&str] = match backend {
                DbBackend::Postgres => &[
                    "CREATE OR REPLACE FUNCTION outbox_events_numbering() RETURNS trigger LANGUAGE plpgsql \
                     SET search_path FROM CURRENT AS $$ \
                     BEGIN \
                       INSERT INTO outbox_aggregates AS a (aggregate_type, aggregate_id, last_version, due_at_ms) \
                       VALUES (NEW.aggregate_type, NEW.aggregate_id, 1, NEW.next_attempt_at_ms) \
                       ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE \
                       SET last_version = a.last_version + 1, due_at_ms = COALESCE(a.due_at_ms, EXCLUDED.due_at_ms) \
                       RETURNING a.last_version INTO NEW.aggregate_version; \
                       RETURN NEW; \
                     END $$",
                    "CREATE TRIGGER outbox_events_numbering BEFORE INSERT ON outbox_events FOR EACH ROW \
                     WHEN (NEW.aggregate_version = 0) EXECUTE FUNCTION outbox_events_numbering()",
                ],
                DbBackend::MySql => &["CREATE TRIGGER outbox_events_numbering BEFORE INSERT ON outbox_events \
                     FOR EACH ROW BEGIN \
                       IF NEW.aggregate_version = 0 THEN \
                         INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) \
                         VALUES (NEW.aggregate_type, NEW.aggregate_id, 1, NEW.next_attempt_at_ms) \
                         ON DUPLICATE KEY UPDATE last_version = last_version + 1, \
                         due_at_ms = COALESCE(due_at_ms, VALUES(due_at_ms)); \
                         SET NEW.aggregate_version = (SELECT last_version FROM outbox_aggregates \
                           WHERE aggregate_type = NEW.aggregate_type AND aggregate_id = NEW.aggregate_id); \
                       END IF; \
                     END"],
                _ => &["CREATE TRIGGER outbox_events_numbering AFTER INSERT ON outbox_events \
                     FOR EACH ROW WHEN NEW.aggregate_version = 0 BEGIN \
                       INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) \
                       VALUES (NEW.aggregate_type, NEW.aggregate_id, 1, NEW.next_attempt_at_ms) \
                       ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE \
                       SET last_version = last_version + 1, due_at_ms = COALESCE(due_at_ms, excluded.due_at_ms); \
                       UPDATE outbox_events SET aggregate_version = (SELECT last_version FROM outbox_aggregates \
                         WHERE aggregate_type = NEW.aggregate_type AND aggregate_id = NEW.aggregate_id) \
                       WHERE seq = NEW.seq; \
                     END"],
            };
            execute_all(manager, statements).await?;
            number_earlier_orphans(manager).await
        }

        async fn down(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            let statements: &[&str] = match manager.get_database_backend() {
                DbBackend::Postgres => &[
                    "DROP TRIGGER IF EXISTS outbox_events_numbering ON outbox_events",
                    "DROP FUNCTION IF EXISTS outbox_events_numbering()",
                ],
                _ => &["DROP TRIGGER IF EXISTS outbox_events_numbering"],
            };
            execute_all(manager, statements).await
        }
    }

    /// Numbers the rows a plain writer inserted before the trigger existed, oldest first, as the trigger
    /// would have. One full scan of `outbox_events`, once.
    async fn number_earlier_orphans(manager: &SchemaManager<'_>) -> std::result::Result<(), DbErr> {
        let db = manager.get_connection();
        let backend = manager.get_database_backend();
        let orphans = db
            .query_all_raw(Statement::from_string(
                backend,
                "SELECT seq, aggregate_type, aggregate_id, next_attempt_at_ms FROM outbox_events \
                 WHERE aggregate_version = 0 ORDER BY seq",
            ))
            .await?;
        let (upsert, read, number) = match backend {
            DbBackend::Postgres => (
                "INSERT INTO outbox_aggregates AS a (aggregate_type, aggregate_id, last_version, due_at_ms) \
                 VALUES ($1, $2, 1, $3) ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE \
                 SET last_version = a.last_version + 1, due_at_ms = COALESCE(a.due_at_ms, EXCLUDED.due_at_ms)",
                "SELECT last_version FROM outbox_aggregates WHERE aggregate_type = $1 AND aggregate_id = $2",
                "UPDATE outbox_events SET aggregate_version = $1 WHERE seq = $2",
            ),
            DbBackend::MySql => (
                "INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) \
                 VALUES (?, ?, 1, ?) ON DUPLICATE KEY UPDATE last_version = last_version + 1, \
                 due_at_ms = COALESCE(due_at_ms, VALUES(due_at_ms))",
                "SELECT last_version FROM outbox_aggregates WHERE aggregate_type = ? AND aggregate_id = ?",
                "UPDATE outbox_events SET aggregate_version = ? WHERE seq = ?",
            ),
            _ => (
                "INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) \
                 VALUES (?, ?, 1, ?) ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE \
                 SET last_version = last_version + 1, due_at_ms = COALESCE(due_at_ms, excluded.due_at_ms)",
                "SELECT last_version FROM outbox_aggregates WHERE aggregate_type = ? AND aggregate_id = ?",
                "UPDATE outbox_events SET aggregate_version = ? WHERE seq = ?",
            ),
        };
        for row in orphans {
            let seq: i64 = row.try_get("", "seq")?;
            let aggregate_type: String = row.try_get("", "aggregate_type")?;
            let aggregate_id: String = row.try_get("", "aggregate_id")?;
            let due: i64 = row.try_get("", "next_attempt_at_ms")?;
            let key = [aggregate_type.clone().into(), aggregate_id.clone().into()];
            db.execute_raw(Statement::from_sql_and_values(
                backend,
                upsert,
                [aggregate_type.into(), aggregate_id.into(), due.into()],
            ))
            .await?;
            let version: i64 = db
                .query_one_raw(Statement::from_sql_and_values(backend, read, key))
                .await?
                .ok_or_else(|| DbErr::RecordNotFound(format!("outbox_aggregates row of outbox_events row {seq}")))?
                .try_get("", "last_version")?;
            db.execute_raw(Statement::from_sql_and_values(backend, number, [version.into(), seq.into()])).await?;
        }
        Ok(())
    }
}

/// Drops `outbox_events_pending` (`seq`, pending rows only) on PostgreSQL and SQLite, so the claim's
/// per-aggregate probes have one partial index to choose, the one they match: `outbox_events_runs`.
///
/// Both indexes hold exactly the pending rows. After an `ANALYZE` taken while nothing was pending (what
/// autovacuum does after a quiet hour), the statistics say both are empty, and PostgreSQL's planner picked
/// the `seq` one for "the head of aggregate X", then filtered every pending row for each aggregate: a
/// burst of 100k events after 1M published rows drained at 22 events/s. Nothing needs the `seq` index
/// since the claim finds work through `outbox_aggregates`; `stats` reads the pending rows through
/// `outbox_events_runs` instead. MySQL/MariaDB keep theirs: it is not partial there, `stats` needs its
/// `published_at_ms` prefix, and InnoDB estimates a probe's rows from the index itself.
#[allow(non_camel_case_types)]
pub mod m20261217_000006_one_pending_index {
    use super::*;

    /// The migration.
    pub struct Migration;

    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261217_000006_one_pending_index"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            match manager.get_database_backend() {
                DbBackend::MySql => Ok(()),
                _ => execute_all(manager, &["DROP INDEX IF EXISTS outbox_events_pending"]).await,
            }
        }

        async fn down(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            match manager.get_database_backend() {
                DbBackend::MySql => Ok(()),
                _ => {
                    execute_all(
                        manager,
                        &["CREATE INDEX IF NOT EXISTS outbox_events_pending ON outbox_events (seq) WHERE published_at_ms IS NULL"],
                    )
                    .await
                }
            }
        }
    }
}

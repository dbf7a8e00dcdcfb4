//! The migrations operations read through: the dead rows' index (lists and counts of dead events) and the
//! relays' heartbeats (which relay processes are alive).

use super::*;

/// Indexes the dead rows, for the dashboard's and `outbox dead`'s lists and counts: without it, listing
/// the oldest dead rows walked the primary key past every published row (340 ms on PostgreSQL with 1M
/// published rows and 10k dead ones; `relay-bench --scenario dashboard`).
///
/// PostgreSQL and SQLite: a partial index holding the dead rows only, so writers and the relay never
/// touch it (a row enters it when it dies). Its predicate is not implied by the claim's, so no claim
/// statement can choose it. MySQL/MariaDB, without partial indexes: `(dead_at_ms, seq)`, whose range
/// `dead_at_ms IS NOT NULL` holds the dead rows.
#[allow(non_camel_case_types)]
pub mod m20261218_000007_dead_index {
    use super::*;

    /// The migration.
    pub struct Migration;

    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261218_000007_dead_index"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            if done_already(manager, "outbox_events", Some("outbox_events_dead")).await? {
                return Ok(());
            }
            let create: &str = match manager.get_database_backend() {
                DbBackend::MySql => "CREATE INDEX outbox_events_dead ON outbox_events (dead_at_ms, seq)",
                _ => {
                    "CREATE INDEX outbox_events_dead ON outbox_events (seq) \
                     WHERE dead_at_ms IS NOT NULL AND published_at_ms IS NULL"
                }
            };
            execute_all(manager, &[create]).await
        }

        async fn down(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            let drop: &str = match manager.get_database_backend() {
                DbBackend::MySql => "DROP INDEX outbox_events_dead ON outbox_events",
                _ => "DROP INDEX outbox_events_dead",
            };
            execute_all(manager, &[drop]).await
        }
    }
}

/// The relay processes' heartbeats (`outbox_relays`): each `OutboxService` writes its own at every stats
/// sample (`admin::relays` reads them; the dashboard shows them), so any process can see which relays are
/// alive. A row per process start, forgotten a day after its last heartbeat.
#[allow(non_camel_case_types)]
pub mod m20261219_000008_relay_heartbeats {
    use super::*;

    /// The migration.
    pub struct Migration;

    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261219_000008_relay_heartbeats"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            if done_already(manager, "outbox_relays", None).await? {
                return Ok(());
            }
            let big = |name: &str| ColumnDef::new(Alias::new(name)).big_integer().not_null().to_owned();
            manager
                .create_table(
                    Table::create()
                        .table(Alias::new("outbox_relays"))
                        .col(ColumnDef::new(Alias::new("process")).string_len(100).not_null().primary_key())
                        .col(ColumnDef::new(Alias::new("host")).string_len(100).not_null())
                        .col(big("pid"))
                        .col(big("relays"))
                        .col(big("started_at_ms"))
                        .col(big("seen_at_ms"))
                        .col(big("every_ms"))
                        .col(ColumnDef::new(Alias::new("last_success_at_ms")).big_integer().null())
                        .col(big("consecutive_failures"))
                        .col(ColumnDef::new(Alias::new("last_error")).text().null())
                        .col(big("published_events"))
                        .col(ColumnDef::new(Alias::new("stopped")).boolean().not_null())
                        .to_owned(),
                )
                .await
        }

        async fn down(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            manager.drop_table(Table::drop().table(Alias::new("outbox_relays")).to_owned()).await
        }
    }
}

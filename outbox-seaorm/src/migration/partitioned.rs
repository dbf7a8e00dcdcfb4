//! The opt-in migration to a partitioned outbox (PostgreSQL), for an application's own `Migrator`.

use super::*;
use crate::partition::PartitionInterval;

/// The migration that partitions `outbox_events` by creation time in `interval`s (see
/// [`crate::partition`]), for an application's own `Migrator`, after [`migrations()`]:
///
/// ```ignore
/// let mut list = outbox_seaorm::migrations();
/// list.push(outbox_seaorm::migration::partitioned(PartitionInterval::Day));
/// ```
///
/// Without a `Migrator`, call [`crate::partition::partition_outbox`] after [`migrate`]. On MySQL/MariaDB
/// and SQLite the migration fails with an error that says so.
pub fn partitioned(interval: PartitionInterval) -> Box<dyn MigrationTrait> {
    Box::new(m20261220_000009_partitioned_outbox::Migration { interval })
}

/// Partitions `outbox_events` by `created_at_ms` (see [`partitioned`]). Cannot be undone by `down`: a
/// partitioned outbox goes back to one table by a copy, which this crate leaves to the operator.
#[allow(non_camel_case_types)]
pub mod m20261220_000009_partitioned_outbox {
    use super::*;

    /// The migration, with the partitions' width.
    pub struct Migration {
        /// How much creation time each partition covers.
        pub interval: PartitionInterval,
    }

    impl MigrationName for Migration {
        fn name(&self) -> &str {
            "m20261220_000009_partitioned_outbox"
        }
    }

    #[async_trait::async_trait]
    impl MigrationTrait for Migration {
        async fn up(&self, manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            crate::partition::refuse_unless_postgres(manager.get_database_backend())
                .map_err(|e| DbErr::Migration(e.to_string()))?;
            let now_ms = chrono::Utc::now().timestamp_millis();
            crate::partition::convert(manager.get_connection(), self.interval, now_ms).await.map(|_| ())
        }

        async fn down(&self, _manager: &SchemaManager) -> std::result::Result<(), DbErr> {
            Err(DbErr::Migration(
                "a partitioned outbox is not turned back into one table by a migration: copy its rows into a new \
                 table and rename it, in a quiet hour"
                    .into(),
            ))
        }
    }
}

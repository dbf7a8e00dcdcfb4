//! The store's upkeep, besides relaying: deleting what retention allows, the backlog figures and the relay
//! processes' heartbeats. [`OutboxService`](crate::OutboxService) runs them through
//! [`SeaOrmStore`](crate::SeaOrmStore); the operating tools (crate `outbox-ops`: the `outbox` command and
//! the dashboard) call the same functions.
//!
//! ```no_run
//! # async fn demo() -> outbox_seaorm::Result<()> {
//! use outbox_seaorm::maintenance::{self, CleanupConfig};
//!
//! let db = outbox_seaorm::connect("postgres://outbox@db/app").await?;
//! let report = maintenance::cleanup(&db, &CleanupConfig::default(), |_| {}).await?;
//! println!("{} published rows deleted", report.outbox_deleted);
//! println!("{} still pending", maintenance::stats(&db).await?.totals.pending);
//! # Ok(()) }
//! ```

mod cleanup;
mod heartbeat;
mod stats;

pub use cleanup::{CleanupProgress, CleanupReport, CleanupTable, cleanup};
pub use heartbeat::{HEARTBEAT_COLUMNS, HEARTBEAT_RETENTION, HEARTBEATS_TABLE};
pub use stats::{GroupStats, Stats, StatsMode, stats, stats_in};

pub use outbox_runtime::CleanupConfig;

pub(crate) use cleanup::{clean_outbox, cutoff_ms, delete_in_batches};
pub(crate) use heartbeat::record_heartbeat;
pub(crate) use stats::totals;

/// The names of the outbox migrations, oldest first: what `outbox check` looks for in the migrations
/// table (also without the `migrations` feature).
pub const MIGRATION_NAMES: [&str; 8] = [
    "m20261129_000001_create_outbox",
    "m20261129_000002_create_inbox",
    "m20261201_000003_aggregate_versions",
    "m20261215_000004_inbox_retention_index",
    "m20261216_000005_foreign_writers",
    "m20261217_000006_one_pending_index",
    "m20261218_000007_dead_index",
    "m20261219_000008_relay_heartbeats",
];

#[cfg(all(test, feature = "migrations"))]
mod tests {
    #[test]
    fn the_migration_names_the_checks_look_for_are_the_shipped_migrations() {
        let shipped: Vec<String> = crate::migrations().iter().map(|m| m.name().to_owned()).collect();
        assert_eq!(shipped, super::MIGRATION_NAMES);
    }
}

//! Operating the outbox: what the `outbox` CLI runs, as plain functions over a connection.
//!
//! - [`stats`]: the backlog, per aggregate type and event type ([`Stats`] serialises to JSON);
//! - [`list_dead`], [`count_dead`], [`show_dead`], [`replay_dead`], [`discard_dead`]: dead events, selected by a
//!   [`DeadFilter`];
//! - [`cleanup`]: published outbox rows and inbox rows past their retention, in batches, with progress;
//! - [`check`]: connection, migrations, a writable primary, clock skew;
//! - [`relays`]: the relay processes' heartbeats: which are alive, failing, stopped or gone;
//! - [`migrate`](crate::migrate): safe when several replicas start at once.
//!
//! None of them needs a trait or a time library in scope:
//!
//! ```no_run
//! # async fn demo() -> outbox_seaorm::Result<()> {
//! use outbox_seaorm::admin::{self, DeadFilter};
//!
//! let db = outbox_seaorm::connect("postgres://outbox@db/app").await?;
//! let report = admin::check(&db, &admin::CheckOptions::default()).await;
//! assert!(report.ok, "{:?}", report.first_failure());
//! let replayed = admin::replay_dead(&db, &DeadFilter::default().event_type("order.placed")).await?;
//! println!("{replayed} replayed; {} still pending", admin::stats(&db).await?.totals.pending);
//! # Ok(()) }
//! ```

mod check;
mod cleanup;
mod dead;
mod relays;
mod stats;

pub use check::{Check, CheckOptions, CheckReport, check, clock_skew, pending_migrations, read_only_reason};
pub use cleanup::{CleanupProgress, CleanupReport, CleanupTable, cleanup};
pub use dead::{DeadEvent, DeadFilter, count_dead, discard_dead, list_dead, replay_dead, show_dead};
pub use relays::{HEARTBEAT_RETENTION, RelayProcess, relays};
pub use stats::{GroupStats, Stats, StatsMode, stats, stats_in};

pub use outbox_runtime::CleanupConfig;

pub(crate) use cleanup::{clean_outbox, cutoff_ms, delete_in_batches};
#[cfg(feature = "dashboard")]
pub(crate) use dead::{dead_rows, rfc3339};
pub(crate) use relays::record as record_heartbeat;
#[cfg(feature = "dashboard")]
pub(crate) use stats::count;
pub(crate) use stats::totals;

/// The names of the outbox migrations, oldest first: what [`pending_migrations`] looks for (also without
/// the `migrations` feature).
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

//! Operating the outbox: what the `outbox` command runs, as plain functions over a connection.
//!
//! - [`stats`]: the backlog, per aggregate type and event type ([`Stats`] serialises to JSON);
//! - [`list_dead`], [`count_dead`], [`show_dead`], [`replay_dead`], [`discard_dead`]: dead events, selected by a
//!   [`DeadFilter`];
//! - [`cleanup`]: published outbox rows and inbox rows past their retention, in batches, with progress;
//! - [`check`]: connection, migrations, a writable primary, clock skew;
//! - [`relays`]: the relay processes' heartbeats: which are alive, failing, stopped or gone;
//! - [`migrate`](outbox_seaorm::migrate): safe when several replicas start at once.
//!
//! The backlog figures and the cleanup are the store's own upkeep ([`outbox_seaorm::maintenance`], which the
//! app's `OutboxService` runs too), re-exported here so that one module holds every operation. None of
//! them needs a trait or a time library in scope:
//!
//! ```no_run
//! # async fn demo() -> outbox_seaorm::Result<()> {
//! use outbox_ops::admin::{self, DeadFilter};
//!
//! let db = outbox_seaorm::connect("postgres://outbox@db/app").await?;
//! let report = admin::check(&db, &admin::CheckOptions::default()).await;
//! assert!(report.ok, "{:?}", report.first_failure());
//! let replayed = admin::replay_dead(&db, &DeadFilter::default().event_type("order.placed")).await?;
//! println!("{replayed} replayed; {} still pending", admin::stats(&db).await?.totals.pending);
//! # Ok(()) }
//! ```

mod check;
mod dead;
mod relays;

pub use check::{Check, CheckOptions, CheckReport, check, clock_skew, pending_migrations, read_only_reason};
pub use dead::{DeadEvent, count_dead, discard_dead, list_dead, replay_dead, show_dead};
pub use outbox_seaorm::DeadFilter;
pub use outbox_seaorm::maintenance::{
    CleanupConfig, CleanupProgress, CleanupReport, CleanupTable, GroupStats, HEARTBEAT_RETENTION, MIGRATION_NAMES,
    Stats, StatsMode, cleanup, stats, stats_in,
};
pub use relays::{RelayProcess, relays};

#[cfg(feature = "dashboard")]
pub(crate) use dead::{dead_rows, rfc3339};

/// A `COUNT` column as `u64` (`None` and negatives as 0).
#[cfg(feature = "dashboard")]
pub(crate) fn count(row: &sea_orm::QueryResult, name: &str) -> std::result::Result<u64, sea_orm::DbErr> {
    Ok(Ord::max(row.try_get::<Option<i64>>("", name)?.unwrap_or_default(), 0) as u64)
}

/// `now - age` in epoch ms.
fn cutoff_ms(now_ms: i64, age: std::time::Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
}

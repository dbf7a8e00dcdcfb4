//! Cross-process wake-ups on every backend, at no cost to the writers: watch `outbox_events` for rows that
//! other processes committed.
//!
//! A [`CommitWatch`] asks the database for the highest `seq` every `interval` (one primary-key lookup: no
//! lock, no trigger, nothing on the writers' path) and wakes this process's relays
//! ([`wake_relays`](outbox_runtime::wake_relays)) when it grew. With a 5 ms watch, a row committed by another
//! service, an `outbox` CLI, a plain `INSERT` or another replica is claimed within a few milliseconds,
//! where the relay's poll alone takes up to `poll_interval`.
//!
//! Compared with PostgreSQL's LISTEN/NOTIFY ([`notify`](crate::notify)), which serialises the commits of
//! every notifying transaction (BENCHMARKS.md measures 0.44–0.53x of the writers' commit rate with 8
//! writers), a watch costs the database one cheap read per interval per relay process, whatever the
//! write rate, and works on MySQL/MariaDB and SQLite too.
//!
//! What it cannot see: a row whose transaction took its `seq` before a row that committed first (two
//! writers racing) becomes visible without raising the highest `seq`; the next commit anywhere, or the
//! relay's poll, wakes the relay for it. Rows waiting for their retry time are the poll's, as ever.
//!
//! ```no_run
//! # async fn demo(db: sea_orm::DatabaseConnection, publisher: outbox_seaorm::InMemoryPublisher) -> outbox_seaorm::Result<()> {
//! use std::time::Duration;
//! use outbox_seaorm::{OutboxService, SeaOrmStore};
//!
//! let store = SeaOrmStore::new(db);
//! let watch = store.commit_watch(Duration::from_millis(5))?;
//! let service = OutboxService::builder(store, publisher).with_task(move |stop| watch.run(stop)).start()?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_runtime::CancellationToken;
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

use crate::error::{Error, Result};

/// Shortest interval a watch accepts.
pub const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(1);
/// Longest interval a watch accepts: beyond it, the relay's own poll does the same job.
pub const MAX_WATCH_INTERVAL: Duration = Duration::from_secs(60);

/// Wakes this process's relays when another process commits outbox rows; see the [module docs](self).
#[derive(Debug)]
pub struct CommitWatch {
    db: DatabaseConnection,
    interval: Duration,
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    probes: AtomicU64,
    wakes: AtomicU64,
    failures: AtomicU64,
}

/// What a [`CommitWatch`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommitWatchStats {
    /// Reads of the highest `seq`.
    pub probes: u64,
    /// Times it found new rows and woke the relays.
    pub wakes: u64,
    /// Reads that failed (the relays keep polling meanwhile).
    pub failures: u64,
}

/// A handle that reads a [`CommitWatch`]'s figures while it runs.
#[derive(Clone, Debug)]
pub struct CommitWatchStatsHandle(Arc<Counters>);

impl CommitWatchStatsHandle {
    /// The figures now.
    pub fn get(&self) -> CommitWatchStats {
        let c = &self.0;
        CommitWatchStats {
            probes: c.probes.load(Ordering::Relaxed),
            wakes: c.wakes.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
        }
    }
}

impl CommitWatch {
    /// A watch over `db` that looks every `interval`, between [`MIN_WATCH_INTERVAL`] and
    /// [`MAX_WATCH_INTERVAL`].
    pub fn new(db: &DatabaseConnection, interval: Duration) -> Result<Self> {
        if !(MIN_WATCH_INTERVAL..=MAX_WATCH_INTERVAL).contains(&interval) {
            return Err(Error::invalid_config(
                "commit watch interval",
                format!("{interval:?} is outside {MIN_WATCH_INTERVAL:?}..={MAX_WATCH_INTERVAL:?}"),
            ));
        }
        Ok(CommitWatch { db: db.clone(), interval, counters: Arc::default() })
    }

    /// A handle on the watch's figures, to keep before [`CommitWatch::run`] consumes it.
    pub fn stats(&self) -> CommitWatchStatsHandle {
        CommitWatchStatsHandle(self.counters.clone())
    }

    /// Watches until `shutdown` is cancelled. Never fails: a failed read is logged (once per outage) and
    /// retried at the next interval, while the relays go on polling.
    pub async fn run(self, shutdown: CancellationToken) {
        let statement = Statement::from_string(
            self.db.get_database_backend(),
            "SELECT MAX(seq) AS top FROM outbox_events".to_owned(),
        );
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The highest `seq` of the last read (`Some(None)`: the table was empty); `None` before the first.
        let (mut seen, mut failing) = (None::<Option<i64>>, false);
        tracing::debug!(interval = ?self.interval, "outbox commit watch started");
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.counters.probes.fetch_add(1, Ordering::Relaxed);
            let top = match self.db.query_one_raw(statement.clone()).await {
                Ok(row) => row.and_then(|row| row.try_get::<Option<i64>>("", "top").ok().flatten()),
                Err(error) => {
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                    if !failing {
                        tracing::warn!(%error, "outbox commit watch cannot read outbox_events; relays keep polling");
                    }
                    failing = true;
                    continue;
                }
            };
            if std::mem::take(&mut failing) {
                tracing::info!("outbox commit watch reads outbox_events again");
                // Whatever committed during the outage: one pass finds it.
                outbox_runtime::wake_relays();
            }
            match seen {
                Some(before) if top > before => {
                    self.counters.wakes.fetch_add(1, Ordering::Relaxed);
                    tracing::trace!(top, "outbox rows committed elsewhere; waking the relays");
                    outbox_runtime::wake_relays();
                }
                _ => {}
            }
            seen = Some(top);
        }
        tracing::debug!("outbox commit watch stopped");
    }
}

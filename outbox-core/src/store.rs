//! What a database must provide to hold the outbox, in two halves: [`OutboxStore`] for the relay (claim
//! due rows, then record each outcome) and [`MaintenanceStore`] for the tasks of
//! [`OutboxService`](crate::OutboxService) beside it (backlog figures, cleanup, a database-wide lock).
//! `outbox-seaorm`'s `SeaOrmStore` implements both.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::{ClaimMode, DeadLetterPolicy};
use crate::envelope::OutboxEvent;
use crate::error::Result;

/// What the relay asks a store to claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The relay's clock; rows with `next_attempt_at <= now` are due.
    pub now: DateTime<Utc>,
    /// Most rows to claim.
    pub limit: u32,
    /// Transaction or lease claim.
    pub mode: ClaimMode,
    /// Whether a dead event blocks its aggregate.
    pub dead_letters: DeadLetterPolicy,
}

/// A failed publish of one claimed row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The row's sequence number.
    pub seq: i64,
    /// Recorded as `last_error`.
    pub error: String,
    /// When the row is due again.
    pub next_attempt_at: DateTime<Utc>,
    /// Whether the row is now dead (attempts reached `max_attempts`, or the failure is permanent).
    pub dead: bool,
}

/// The outcome of publishing a claimed batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// The pass's clock: the `now` of the [`ClaimRequest`] this batch was claimed with, not the time the
    /// outcome is written. The store records it as `published_at` of the published rows and `dead_at` of
    /// the dead ones.
    pub now: DateTime<Utc>,
    /// Sequence numbers the broker confirmed.
    pub published: Vec<i64>,
    /// Rows the broker did not confirm.
    pub failed: Vec<Failure>,
    /// Rows not published in this pass because an earlier event of their run failed (or the pass ran out
    /// of time): neither published nor failed, free to be claimed again once their run's head is.
    pub released: Vec<i64>,
}

/// What a store wrote when completing a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MarkReport {
    /// Rows marked published.
    pub published: u64,
    /// Rows marked failed (including dead ones).
    pub failed: u64,
    /// Of the rows marked failed, those marked dead.
    pub dead: u64,
    /// Rows not marked because their lease had passed to another relay (lease mode only).
    pub fenced: u64,
}

/// Rows a store has claimed for one relay pass.
///
/// Dropping a batch without completing it releases the claim: the transaction rolls back, or the lease
/// expires. Either way the rows are published again later, never lost.
pub trait ClaimedBatch: Send {
    /// The claimed rows: for each aggregate a *run*, its oldest unpublished event and the due events
    /// after it, consecutive in `aggregate_version` and in that order. Runs of different aggregates may
    /// interleave; within an aggregate the slice is in version order.
    fn events(&self) -> &[OutboxEvent];

    /// Records the outcome with set-based statements (one per kind of outcome, split only for very large
    /// batches; never one per row), and releases the claim.
    fn complete(self, outcome: BatchOutcome) -> impl Future<Output = Result<MarkReport>> + Send;

    /// Rows the claim found it could not decode (headers that are not a string map, an event id that is
    /// not a UUID, ... written by hand or by another tool) and marked dead on the spot, with a
    /// `last_error` saying what is wrong, instead of failing the claim for every aggregate. Not part of
    /// [`ClaimedBatch::events`].
    fn dead_on_claim(&self) -> u64 {
        0
    }
}

/// Backlog figures for alerting: a growing `oldest_pending_age` means a stopped relay, a broker outage or a
/// poison event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OutboxStats {
    /// Unpublished events that will still be tried.
    pub pending: u64,
    /// Unpublished events that reached `max_attempts` (or failed permanently).
    pub dead: u64,
    /// Age in whole seconds of the oldest pending event, 0 when none.
    pub oldest_pending_seconds: u64,
    /// The highest attempt count among unpublished events.
    pub max_attempts: i32,
}

/// What a running [`OutboxService`](crate::OutboxService) says about itself at every stats sample, so that
/// other processes (the dashboard, an operator) can see which relays are alive and how they fare.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Heartbeat {
    /// This service's id, unique per start: `host:pid:start time in ms`.
    pub process: String,
    /// The machine's host name (`unknown` when it cannot be read).
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// Relay tasks in the service.
    pub relays: u32,
    /// When the service started.
    pub started_at: DateTime<Utc>,
    /// When this heartbeat was written.
    pub at: DateTime<Utc>,
    /// How long until the next one: a heartbeat older than a few of these means the process is gone.
    pub every: Duration,
    /// When a relay pass last succeeded.
    pub last_success_at: Option<DateTime<Utc>>,
    /// Relay passes that failed in a row.
    pub consecutive_failures: u32,
    /// The last failed pass's error, until a pass succeeds.
    pub last_error: Option<String>,
    /// Events published since the service started.
    pub published_events: u64,
    /// The service was shut down: its last heartbeat.
    pub stopped: bool,
}

/// What the relay needs of a database: claim due rows as runs, then record each outcome
/// ([`ClaimedBatch::complete`]).
pub trait OutboxStore: Send + Sync {
    /// The claim handed back by [`OutboxStore::claim`].
    type Batch: ClaimedBatch;

    /// Claims up to `request.limit` due rows as runs (see [`ClaimedBatch::events`]), skipping aggregates
    /// another relay holds. No row is claimed while an earlier row of its aggregate is unpublished (dead
    /// ones aside under [`DeadLetterPolicy::SkipDead`]).
    fn claim(&self, request: ClaimRequest) -> impl Future<Output = Result<Self::Batch>> + Send;

    /// Whether a [`ClaimMode::Transaction`] claim keeps the app's own
    /// writes waiting while the broker answers (SQLite: its transaction holds the only write lock). Then
    /// [`ClaimMode::Auto`] leases instead. Default `false`.
    fn claims_block_writers(&self) -> bool {
        false
    }
}

/// What the maintenance tasks of [`OutboxService`](crate::OutboxService) need of a database: backlog
/// figures for the stats sampler, and cleanup under a database-wide lock. Replaying dead rows is an
/// operator's act, not a task: `outbox_ops::admin::replay_dead`.
pub trait MaintenanceStore: Send + Sync {
    /// Current backlog figures.
    fn stats(&self, now: DateTime<Utc>) -> impl Future<Output = Result<OutboxStats>> + Send;

    /// Deletes published rows older than `retention`, at most `batch` rows per statement; returns how many.
    fn cleanup(&self, now: DateTime<Utc>, retention: Duration, batch: u32) -> impl Future<Output = Result<u64>> + Send;

    /// CDC mode ([`CleanupConfig::delete_unpublished_after`](crate::CleanupConfig)): deletes rows created
    /// before `now - age` whether or not they were published, at most `batch` rows per statement; returns
    /// how many. The default refuses, so a store that cannot do it never silently keeps growing.
    fn cleanup_unpublished(
        &self,
        now: DateTime<Utc>,
        age: Duration,
        batch: u32,
    ) -> impl Future<Output = Result<u64>> + Send {
        let _ = (now, age, batch);
        async {
            Err(crate::Error::invalid_config(
                "cleanup.delete_unpublished_after",
                "this store cannot delete unpublished rows (CDC mode)",
            ))
        }
    }

    /// Deletes inbox rows (consumers' de-duplication records) processed before `now - retention`, at most
    /// `batch` rows per statement; returns how many. The default deletes nothing: a store without an inbox.
    fn cleanup_inbox(
        &self,
        now: DateTime<Utc>,
        retention: Duration,
        batch: u32,
    ) -> impl Future<Output = Result<u64>> + Send {
        let _ = (now, retention, batch);
        async { Ok(0) }
    }

    /// Records `beat`, replacing the previous heartbeat of the same [`Heartbeat::process`]; stores may also
    /// forget heartbeats long gone. The default records nothing: a store without a place for them.
    fn record_heartbeat(&self, beat: &Heartbeat) -> impl Future<Output = Result<()>> + Send {
        let _ = beat;
        async { Ok(()) }
    }

    /// Tries to take the database-wide lock `name` without waiting: `Some` when this process now holds it,
    /// `None` when another process does. Maintenance that every replica runs (cleanup) takes it first, so
    /// N replicas do not all delete at once.
    ///
    /// The default is [`StoreLock::local`], a lock that excludes nobody: right for a store that only one
    /// process uses, and harmless elsewhere (cleanup is idempotent, only wasteful when duplicated).
    fn try_lock(&self, name: &'static str) -> impl Future<Output = Result<Option<StoreLock>>> + Send {
        let _ = name;
        async { Ok(Some(StoreLock::local())) }
    }
}

type Release = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send>;

/// A database-wide lock held by this process (see [`MaintenanceStore::try_lock`]).
///
/// [`StoreLock::release`] lets it go and reports errors. Dropping it also lets it go: the store's release
/// closure owns whatever holds the lock (a connection that closes when dropped), so a panic or a cancelled
/// task cannot leave the lock held.
#[must_use = "the lock is released when dropped"]
pub struct StoreLock {
    release: Option<Release>,
}

impl fmt::Debug for StoreLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreLock").field("held", &self.release.is_some()).finish()
    }
}

impl StoreLock {
    /// A lock whose release runs `release`. For implementors: `release` must own what holds the lock, so
    /// that dropping it unreleased also frees the lock.
    pub fn new<F, Fut>(release: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        StoreLock { release: Some(Box::new(move || Box::pin(release()))) }
    }

    /// A lock that guards nothing beyond this process: what a store without database locks hands out
    /// (SQLite, whose writers take turns anyway).
    pub fn local() -> Self {
        StoreLock { release: None }
    }

    /// Lets the lock go.
    pub async fn release(mut self) -> Result<()> {
        match self.release.take() {
            Some(release) => release().await,
            None => Ok(()),
        }
    }
}

/// A shared store is a store: the relay tasks of one [`OutboxService`](crate::OutboxService) share one
/// store through an `Arc` (its maintenance tasks call the store behind it).
impl<S: OutboxStore> OutboxStore for Arc<S> {
    type Batch = S::Batch;

    fn claim(&self, request: ClaimRequest) -> impl Future<Output = Result<Self::Batch>> + Send {
        (**self).claim(request)
    }

    fn claims_block_writers(&self) -> bool {
        (**self).claims_block_writers()
    }
}

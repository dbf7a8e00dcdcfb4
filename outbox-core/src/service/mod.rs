//! The relay as a service: relay tasks, periodic cleanup and a stats sampler behind one handle, with
//! health figures and a shutdown that leaves nothing claimed.
//!
//! ```no_run
//! # use outbox_runtime::store::{MaintenanceStore, OutboxStore};
//! # async fn demo<S: OutboxStore + MaintenanceStore + 'static, P: outbox_runtime::Publisher + 'static>(store: S, publisher: P) -> outbox_runtime::Result<()> {
//! use std::time::Duration;
//! use outbox_runtime::{CleanupConfig, OutboxService, RelayConfig};
//!
//! let service = OutboxService::builder(store, publisher)
//!     .relay_config(RelayConfig::default().with_batch_size(500))
//!     .cleanup(CleanupConfig::default().with_inbox_retention(Duration::from_secs(14 * 86_400)))
//!     .start()?;
//! // … serve requests; a health endpoint reads `service.health()` …
//! service.shutdown().await; // no further claims; the in-flight batch is recorded or released
//! # Ok(()) }
//! ```
//!
//! ## What runs
//! - `relays` relay tasks ([`Relay::run`]'s loop): a pass straight after a pass that found work, otherwise
//!   at the next poll or at once on an in-process [`wake_relays`](crate::wake_relays). A failing pass
//!   (the store is down) backs off exponentially up to [`ServiceConfig::error_backoff`]'s cap instead of
//!   retrying every poll, and counts towards [`Health::consecutive_failures`].
//! - one cleanup task: every [`CleanupConfig::interval`], under the store's database lock
//!   ([`MaintenanceStore::try_lock`]) so that of N replicas one deletes, it removes published outbox rows older
//!   than the outbox retention (in CDC mode, [`CleanupConfig::delete_unpublished_after`], also unpublished
//!   rows by age) and, when an inbox retention is set, inbox rows older than that, in batches of separate
//!   statements. It shares nothing with the relay tasks, so a long cleanup never delays a
//!   publish.
//! - one stats sampler: [`MaintenanceStore::stats`] every [`ServiceConfig::stats_interval`], for
//!   [`Health::stats`] (the oldest pending event's age is what to alert on), and then the service's
//!   [`Heartbeat`](crate::store::Heartbeat) ([`MaintenanceStore::record_heartbeat`]), so other processes see it alive.
//! - the tasks given to [`OutboxServiceBuilder::with_task`], e.g. a LISTEN/NOTIFY wake-up source, with the
//!   service's shutdown token.
//!
//! ## Shutdown
//! [`OutboxService::shutdown`] cancels every task and waits for them. A relay claims nothing more; a pass in
//! flight publishes no further wave, records what the broker confirmed and releases the rest (in
//! transaction mode the commit lets the rows go, in lease mode their leases are cleared), so no row stays
//! claimed until a lease expires. The wave already sent is waited for, at most `publish_timeout`.
//! Dropping the handle cancels the tasks without waiting.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Backoff, DEFAULT_ERROR_BACKOFF, RelayConfig};
use crate::error::{Error, Result};
use crate::publisher::Publisher;
use crate::relay::{PassReport, Relay, run_loop};
use crate::store::{MaintenanceStore, OutboxStats, OutboxStore};

/// The name of the database lock the cleanup takes.
pub const CLEANUP_LOCK: &str = "outbox_cleanup";

/// What the service's cleanup deletes, and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CleanupConfig {
    /// Time between cleanups (default 5 minutes). The first runs after this or 10 s, whichever is less.
    pub interval: Duration,
    /// Published outbox rows older than this are deleted (default 7 days). Unpublished rows, dead ones
    /// included, are never deleted by a cleanup, unless [`CleanupConfig::delete_unpublished_after`] is set.
    pub outbox_retention: Duration,
    /// Inbox rows processed longer ago than this are deleted; `None` (the default) keeps them, since a
    /// deleted inbox row can no longer catch a duplicate. Must exceed the relay's
    /// [`RelayConfig::redelivery_horizon`].
    pub inbox_retention: Option<Duration>,
    /// Most rows per `DELETE` statement (default 1000): each statement is its own short transaction.
    pub batch_size: u32,
    /// CDC mode: outbox rows created longer ago than this are deleted **whether or not they were
    /// published** (default `None`: never delete an unpublished row). For a deployment where a log-based
    /// reader (Debezium's Outbox Event Router) publishes from the write-ahead log, so no relay ever marks
    /// a row published; see DEBEZIUM.md. Never set it while a relay publishes from the table: an event
    /// older than this that the relay has not published yet would be lost. Must exceed the relay's
    /// [`RelayConfig::redelivery_horizon`].
    pub delete_unpublished_after: Option<Duration>,
}

impl Default for CleanupConfig {
    fn default() -> Self {
        CleanupConfig {
            interval: Duration::from_secs(300),
            outbox_retention: Duration::from_secs(7 * 86_400),
            inbox_retention: None,
            batch_size: 1000,
            delete_unpublished_after: None,
        }
    }
}

impl CleanupConfig {
    /// Sets [`CleanupConfig::interval`].
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }
    /// Sets [`CleanupConfig::outbox_retention`].
    pub fn with_outbox_retention(mut self, retention: Duration) -> Self {
        self.outbox_retention = retention;
        self
    }
    /// Sets [`CleanupConfig::inbox_retention`].
    pub fn with_inbox_retention(mut self, retention: Duration) -> Self {
        self.inbox_retention = Some(retention);
        self
    }
    /// Sets [`CleanupConfig::delete_unpublished_after`]: CDC mode, where rows are deleted by age alone.
    pub fn with_delete_unpublished_after(mut self, retention: Duration) -> Self {
        self.delete_unpublished_after = Some(retention);
        self
    }
    /// Sets [`CleanupConfig::batch_size`].
    pub fn with_batch_size(mut self, batch_size: u32) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Checks every setting against the relay that publishes the events: an inbox retention must exceed
    /// `relay`'s [`RelayConfig::redelivery_horizon`], and the error says why.
    pub fn validate(&self, relay: &RelayConfig) -> Result<()> {
        if self.interval.is_zero() {
            return Err(Error::invalid_config("cleanup.interval", "is zero; the cleanup would spin"));
        }
        if self.batch_size == 0 || self.batch_size > 100_000 {
            return Err(Error::invalid_config(
                "cleanup.batch_size",
                format!("is {}; expected 1..=100000", self.batch_size),
            ));
        }
        if let Some(age) = self.delete_unpublished_after {
            let horizon = relay.redelivery_horizon();
            if age <= horizon {
                return Err(Error::invalid_config(
                    "cleanup.delete_unpublished_after",
                    format!(
                        "is {age:?}, not longer than the relay's redelivery horizon of {horizon:?}: unpublished rows \
                         are deleted by age alone in CDC mode, so keep them well past any retry; keep them for days"
                    ),
                ));
            }
        }
        if let Some(inbox) = self.inbox_retention {
            let horizon = relay.redelivery_horizon();
            if inbox <= horizon {
                return Err(Error::invalid_config(
                    "cleanup.inbox_retention",
                    format!(
                        "is {inbox:?}, not longer than the relay's redelivery horizon of {horizon:?} ({} attempts, \
                         retry delays up to {:?}, publish_timeout {:?}): the inbox drops a redelivered event only \
                         while it still holds that event's row, so a late retry after a lost ack would be processed \
                         twice; keep inbox rows for days",
                        relay.max_attempts, relay.backoff.max, relay.publish_timeout
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Everything an [`OutboxService`] runs with; [`ServiceConfig::validate`] runs in
/// [`OutboxServiceBuilder::start`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceConfig {
    /// The relay tasks' settings.
    pub relay: RelayConfig,
    /// How many relay tasks (default 1). More than one helps when publishing, not claiming, is the
    /// bottleneck; on SQLite they take turns.
    pub relays: u32,
    /// The wait after failed passes (default 500 ms doubling up to 30 s, jittered).
    pub error_backoff: Backoff,
    /// Time between stats samples and heartbeats (default 15 s).
    pub stats_interval: Duration,
    /// The periodic cleanup; `None` runs none.
    pub cleanup: Option<CleanupConfig>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            relay: RelayConfig::default(),
            relays: 1,
            error_backoff: DEFAULT_ERROR_BACKOFF,
            stats_interval: Duration::from_secs(15),
            cleanup: Some(CleanupConfig::default()),
        }
    }
}

impl ServiceConfig {
    /// Checks every setting, naming the first that is out of range and why.
    pub fn validate(&self) -> Result<()> {
        self.relay.validate()?;
        if !(1..=64).contains(&self.relays) {
            return Err(Error::invalid_config("relays", format!("is {}; expected 1..=64", self.relays)));
        }
        let backoff = &self.error_backoff;
        if backoff.initial.is_zero() || backoff.initial > backoff.max || backoff.multiplier == 0 {
            return Err(Error::invalid_config(
                "error_backoff",
                format!(
                    "initial delay {:?} must be positive and at most the cap {:?}, multiplier at least 1",
                    backoff.initial, backoff.max
                ),
            ));
        }
        if self.stats_interval.is_zero() {
            return Err(Error::invalid_config("stats_interval", "is zero; the sampler would spin"));
        }
        match &self.cleanup {
            Some(cleanup) => cleanup.validate(&self.relay),
            None => Ok(()),
        }
    }
}

/// What an [`OutboxService`] reports for health checks and alerting.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Health {
    /// When a relay pass last succeeded (found work or not).
    pub last_success_at: Option<DateTime<Utc>>,
    /// Relay passes that failed in a row since the last success (0 while healthy).
    pub consecutive_failures: u32,
    /// The last failed pass's error, until a pass succeeds.
    pub last_error: Option<String>,
    /// Events this service's relays published since it started.
    pub published_events: u64,
    /// The last stats sample.
    pub stats: Option<OutboxStats>,
    /// When [`Health::stats`] was sampled.
    pub sampled_at: Option<DateTime<Utc>>,
    /// When this service's cleanup last ran (not counting runs another replica's lock skipped).
    pub last_cleanup_at: Option<DateTime<Utc>>,
    /// Outbox rows this service's cleanup deleted since it started.
    pub cleaned_outbox_rows: u64,
    /// Inbox rows this service's cleanup deleted since it started.
    pub cleaned_inbox_rows: u64,
    /// The last cleanup's error, until a cleanup succeeds.
    pub last_cleanup_error: Option<String>,
    /// A relay that reads the database's log (`outbox_seaorm::log`): the WAL bytes its replication slot
    /// holds that it has not confirmed, at its last sample; `None` for the polling relay.
    pub replication_lag_bytes: Option<u64>,
    /// Whether the service was shut down (or its handle dropped).
    pub stopped: bool,
}

impl Health {
    /// Running, and the last relay pass succeeded. A probe that tolerates blips reads
    /// [`Health::consecutive_failures`] instead.
    pub fn is_healthy(&self) -> bool {
        !self.stopped && self.consecutive_failures == 0 && self.last_success_at.is_some()
    }

    /// The age of the oldest pending event at the last sample; `None` before the first sample.
    pub fn oldest_pending_age(&self) -> Option<Duration> {
        self.stats.map(|stats| Duration::from_secs(stats.oldest_pending_seconds))
    }
}

mod sampler;
use sampler::{Beacon, sample_loop};

#[derive(Clone, Default)]
struct SharedHealth(Arc<Mutex<Health>>);

/// A running [`OutboxService`]'s health, read on demand ([`OutboxService::health_probe`]); cheap to clone.
#[derive(Clone)]
pub struct HealthProbe {
    health: SharedHealth,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for HealthProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("HealthProbe").field(&self.health()).finish()
    }
}

impl HealthProbe {
    /// The service's health now, as [`OutboxService::health`] gives it.
    pub fn health(&self) -> Health {
        let mut health = self.health.lock().clone();
        health.stopped = self.shutdown.is_cancelled();
        health
    }
}

impl SharedHealth {
    fn lock(&self) -> MutexGuard<'_, Health> {
        // Plain figures: a panic while holding the lock leaves nothing inconsistent worth stopping for.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Builds an [`OutboxService`]; see [`OutboxService::builder`].
#[must_use = "nothing runs until `start()`"]
pub struct OutboxServiceBuilder<S, P> {
    store: S,
    publisher: P,
    config: ServiceConfig,
    shutdown: Option<CancellationToken>,
    tasks: Vec<ExtraTask>,
    relay: Option<RelayTask>,
}

type ExtraTask = Box<dyn FnOnce(CancellationToken) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;
type RelayTask =
    Box<dyn FnOnce(CancellationToken, PassReporter) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// How a relay that is not [`Relay::run`]'s loop (the log relay of `outbox_seaorm::log`) reports to the
/// service that runs it ([`OutboxServiceBuilder::with_relay`]): its passes and failures feed
/// [`Health`], the heartbeats and readiness as the polling relay's do. Cheap to clone.
#[derive(Clone)]
pub struct PassReporter {
    health: SharedHealth,
}

impl std::fmt::Debug for PassReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PassReporter")
    }
}

impl PassReporter {
    /// A pass succeeded (also one that found nothing to do: an idle relay reports those, or readiness
    /// sees no recent success).
    pub fn passed(&self, pass: &crate::RelayPass) {
        record_pass(&self.health, PassReport::Done(*pass));
    }

    /// A pass failed with `error`.
    pub fn failed(&self, error: &dyn std::fmt::Display) {
        let mut health = self.health.lock();
        health.consecutive_failures = health.consecutive_failures.saturating_add(1);
        health.last_error = Some(crate::text::one_line(&error.to_string()));
    }

    /// The replication slot's unconfirmed WAL, in bytes ([`Health::replication_lag_bytes`]).
    pub fn replication_lag(&self, bytes: u64) {
        self.health.lock().replication_lag_bytes = Some(bytes);
    }
}

impl<S: OutboxStore + MaintenanceStore + 'static, P: Publisher + 'static> OutboxServiceBuilder<S, P> {
    /// Replaces every setting.
    pub fn config(mut self, config: ServiceConfig) -> Self {
        self.config = config;
        self
    }
    /// Sets [`ServiceConfig::relay`].
    pub fn relay_config(mut self, relay: RelayConfig) -> Self {
        self.config.relay = relay;
        self
    }
    /// Sets [`ServiceConfig::relays`].
    pub fn relays(mut self, relays: u32) -> Self {
        self.config.relays = relays;
        self
    }
    /// Sets [`ServiceConfig::error_backoff`].
    pub fn error_backoff(mut self, backoff: Backoff) -> Self {
        self.config.error_backoff = backoff;
        self
    }
    /// Sets [`ServiceConfig::stats_interval`].
    pub fn stats_interval(mut self, interval: Duration) -> Self {
        self.config.stats_interval = interval;
        self
    }
    /// Sets [`ServiceConfig::cleanup`].
    pub fn cleanup(mut self, cleanup: CleanupConfig) -> Self {
        self.config.cleanup = Some(cleanup);
        self
    }
    /// Runs no cleanup (another process does, or the app deletes rows itself).
    pub fn without_cleanup(mut self) -> Self {
        self.config.cleanup = None;
        self
    }
    /// Also stops when `token` is cancelled (the app's own shutdown token); the service then still needs
    /// [`OutboxService::shutdown`] (or [`OutboxService::stopped`]) to wait for its tasks.
    pub fn shutdown_on(mut self, token: &CancellationToken) -> Self {
        self.shutdown = Some(token.child_token());
        self
    }

    /// Runs `task` alongside the relays for as long as the service runs: it is started by
    /// [`start`](Self::start) with the service's shutdown token, and [`OutboxService::shutdown`] waits for
    /// it. For a wake-up source such as `outbox_seaorm`'s LISTEN/NOTIFY listener
    /// (`.with_task(move |stop| listener.run(stop))`); the task should return soon after the token is
    /// cancelled.
    pub fn with_task<F, Fut>(mut self, task: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks.push(Box::new(move |token| Box::pin(task(token))));
        self
    }

    /// Runs `relay` instead of the [`ServiceConfig::relays`] polling relay tasks: a relay of another kind
    /// (`outbox_seaorm::log::LogRelay`, which reads PostgreSQL's log), given the service's shutdown token
    /// and a [`PassReporter`] for its passes. Cleanup, stats, heartbeats and health stay the service's.
    pub fn with_relay<F, Fut>(mut self, relay: F) -> Self
    where
        F: FnOnce(CancellationToken, PassReporter) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.relay = Some(Box::new(move |token, reporter| Box::pin(relay(token, reporter))));
        self
    }

    /// Validates the settings and starts the tasks on the current Tokio runtime.
    pub fn start(self) -> Result<OutboxService> {
        self.config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid_config("runtime", "start() was called outside a Tokio runtime"));
        }
        let OutboxServiceBuilder { store, publisher, config, shutdown, tasks, relay } = self;
        let shutdown = shutdown.unwrap_or_default();
        let (store, publisher) = (Arc::new(store), Arc::new(publisher));
        let health = SharedHealth::default();
        let tracker = TaskTracker::new();
        let polling_relays = if relay.is_some() { 0 } else { config.relays };
        if let Some(relay) = relay {
            tracker.spawn(relay(shutdown.clone(), PassReporter { health: health.clone() }));
        }
        for index in 0..polling_relays {
            let relay = Relay::new(store.clone(), publisher.clone(), config.relay.clone())?;
            let (shutdown, health, backoff) = (shutdown.clone(), health.clone(), config.error_backoff);
            tracker.spawn(async move {
                tracing::debug!(relay = index, "outbox relay task started");
                let mut report = |report: PassReport<'_>| record_pass(&health, report);
                run_loop(&relay, &shutdown, &backoff, &mut report).await;
                tracing::debug!(relay = index, "outbox relay task stopped");
            });
        }
        if let Some(cleanup) = config.cleanup.clone() {
            tracker.spawn(cleanup_loop(store.clone(), cleanup, shutdown.clone(), health.clone()));
        }
        let beacon = Beacon::new(config.relays, config.stats_interval);
        tracker.spawn(sample_loop(store, beacon, shutdown.clone(), health.clone()));
        for task in tasks {
            tracker.spawn(task(shutdown.clone()));
        }
        tracker.close();
        tracing::info!(relays = config.relays, cleanup = config.cleanup.is_some(), "outbox service started");
        Ok(OutboxService { shutdown, tracker, health })
    }
}

fn record_pass(health: &SharedHealth, report: PassReport<'_>) {
    let mut health = health.lock();
    match report {
        PassReport::Done(pass) => {
            health.published_events += pass.published;
            health.last_success_at = Some(Utc::now());
            health.consecutive_failures = 0;
            health.last_error = None;
        }
        PassReport::Failed(error) => {
            health.consecutive_failures = health.consecutive_failures.saturating_add(1);
            health.last_error = Some(crate::text::one_line(&error.to_string()));
        }
    }
}

/// Runs relay tasks, cleanup and a stats sampler over one store and publisher (see the [module
/// docs](self)).
pub struct OutboxService {
    shutdown: CancellationToken,
    tracker: TaskTracker,
    health: SharedHealth,
}

impl std::fmt::Debug for OutboxService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxService").field("health", &self.health()).finish_non_exhaustive()
    }
}

impl OutboxService {
    /// A builder over `store` and `publisher` with [`ServiceConfig::default`].
    pub fn builder<S: OutboxStore + MaintenanceStore + 'static, P: Publisher + 'static>(
        store: S,
        publisher: P,
    ) -> OutboxServiceBuilder<S, P> {
        OutboxServiceBuilder {
            store,
            publisher,
            config: ServiceConfig::default(),
            shutdown: None,
            tasks: Vec::new(),
            relay: None,
        }
    }

    /// The current health figures.
    pub fn health(&self) -> Health {
        self.health_probe().health()
    }

    /// A handle on this service's health that whoever reports it (a dashboard, a readiness endpoint) can
    /// keep and clone, while the app keeps the service itself (to shut it down).
    pub fn health_probe(&self) -> HealthProbe {
        HealthProbe { health: self.health.clone(), shutdown: self.shutdown.clone() }
    }

    /// Stops claiming, lets the in-flight pass record or release its batch, and waits for every task.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.stopped().await;
    }

    /// Waits until every task has stopped (after [`OutboxService::shutdown`] or the token given to
    /// [`OutboxServiceBuilder::shutdown_on`] was cancelled).
    pub async fn stopped(&self) {
        self.tracker.wait().await;
        tracing::info!("outbox service stopped");
    }
}

impl Drop for OutboxService {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn cleanup_loop<S: MaintenanceStore>(
    store: Arc<S>,
    config: CleanupConfig,
    shutdown: CancellationToken,
    health: SharedHealth,
) {
    let mut wait = config.interval.min(Duration::from_secs(10));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
        wait = config.interval;
        // Each batch is its own statement: abandoning one at shutdown loses nothing.
        let result = tokio::select! {
            () = shutdown.cancelled() => break,
            result = cleanup_once(&*store, &config) => result,
        };
        match result {
            Ok(Some((outbox, inbox))) => {
                let mut health = health.lock();
                health.last_cleanup_at = Some(Utc::now());
                health.cleaned_outbox_rows += outbox;
                health.cleaned_inbox_rows += inbox;
                health.last_cleanup_error = None;
                if outbox + inbox > 0 {
                    tracing::info!(outbox, inbox, "outbox cleanup deleted old rows");
                }
            }
            Ok(None) => tracing::debug!("outbox cleanup skipped: another process holds the cleanup lock"),
            Err(error) => {
                tracing::warn!(%error, "outbox cleanup failed; trying again at the next interval");
                health.lock().last_cleanup_error = Some(crate::text::one_line(&error.to_string()));
            }
        }
    }
}

/// One cleanup under the database lock; `None` when another process holds it.
async fn cleanup_once<S: MaintenanceStore>(store: &S, config: &CleanupConfig) -> Result<Option<(u64, u64)>> {
    let Some(lock) = store.try_lock(CLEANUP_LOCK).await? else { return Ok(None) };
    let now = Utc::now();
    let outbox = match config.delete_unpublished_after {
        Some(age) => match store.cleanup(now, config.outbox_retention, config.batch_size).await {
            Ok(published) => {
                store.cleanup_unpublished(now, age, config.batch_size).await.map(|unpublished| published + unpublished)
            }
            Err(error) => Err(error),
        },
        None => store.cleanup(now, config.outbox_retention, config.batch_size).await,
    };
    let inbox = match config.inbox_retention {
        Some(retention) if outbox.is_ok() => store.cleanup_inbox(now, retention, config.batch_size).await,
        _ => Ok(0),
    };
    let released = lock.release().await;
    let (outbox, inbox) = (outbox?, inbox?);
    released?;
    Ok(Some((outbox, inbox)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inbox_retention_within_the_redelivery_horizon_is_rejected_with_the_reason() {
        let config = ServiceConfig {
            cleanup: Some(CleanupConfig::default().with_inbox_retention(Duration::from_secs(300))),
            ..ServiceConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("`cleanup.inbox_retention` is 300s"), "{err}");
        assert!(err.contains("redelivery horizon of 641s"), "{err}"); // 611 s and the 30 s lease SQLite may take
        assert!(err.contains("processed twice"), "{err}");
        let days = ServiceConfig {
            cleanup: Some(CleanupConfig::default().with_inbox_retention(Duration::from_secs(86_400))),
            ..ServiceConfig::default()
        };
        days.validate().unwrap();
    }

    #[test]
    fn zero_relays_and_a_zero_cleanup_batch_are_rejected_by_name() {
        let err = ServiceConfig { relays: 0, ..ServiceConfig::default() }.validate().unwrap_err();
        assert!(err.to_string().contains("`relays` is 0"), "{err}");
        let config =
            ServiceConfig { cleanup: Some(CleanupConfig::default().with_batch_size(0)), ..ServiceConfig::default() };
        assert!(config.validate().unwrap_err().to_string().contains("cleanup.batch_size"));
    }
}

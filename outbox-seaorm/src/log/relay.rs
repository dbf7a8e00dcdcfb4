//! The log relay's loop: make sure the slot exists and everything before it was published (the
//! catch-up), then read the log a window at a time, publish, record, confirm.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::Utc;
use outbox_runtime::CancellationToken;

use outbox_runtime::{OutboxEvent, PassReporter, PublishError, Publisher, Relay};

use crate::SeaOrmStore;

use super::session::Session;
use super::stream::{PgWireStream, ReplicationStream, StreamFailure};
use super::table::{self, Aggregate};
use super::{LogError, LogRelay, setup};

/// What one window of the log did, for tracing and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogPass {
    /// Events the broker confirmed.
    pub published: u64,
    /// Rows now dead (refused by the broker, or not decodable).
    pub dead: u64,
    /// Rows left waiting behind a dead event of their aggregate.
    pub waiting: u64,
}

impl LogPass {
    /// The window as a polling pass's figures (every row read counts as claimed), for the metrics and a
    /// service's health.
    pub(super) fn as_relay_pass(&self) -> outbox_runtime::RelayPass {
        outbox_runtime::RelayPass {
            claimed: self.published + self.dead + self.waiting,
            published: self.published,
            dead: self.dead,
            ..Default::default()
        }
    }
}

/// What the relay knows across sessions: the aggregates held back by a dead event (with the event that
/// holds them), and the last version the parked-aggregate sweep published of each aggregate it freed,
/// so the log does not publish those again.
#[derive(Default)]
pub(super) struct Held {
    pub(super) parked: HashMap<Aggregate, String>,
    pub(super) swept: HashMap<Aggregate, i64>,
}

impl<P: Publisher> LogRelay<P> {
    /// Runs until `shutdown` is cancelled: returns `Err` only for a set-up problem (which waiting does not
    /// fix); database, broker and connection failures are logged and retried with backoff.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), LogError> {
        self.run_reporting(shutdown, None).await
    }

    /// [`LogRelay::run`], reporting each window, each failure and the slot's lag to `reporter`: how an
    /// [`OutboxService`](outbox_runtime::OutboxService) runs it, with its cleanup, stats, heartbeats and
    /// health ([`OutboxServiceBuilder::with_relay`](outbox_runtime::OutboxServiceBuilder::with_relay)):
    ///
    /// ```no_run
    /// # async fn demo(db: sea_orm::DatabaseConnection, relay: outbox_seaorm::log::LogRelay<outbox_seaorm::InMemoryPublisher>) -> outbox_seaorm::Result<()> {
    /// let service = outbox_seaorm::OutboxService::builder(outbox_seaorm::SeaOrmStore::new(db), outbox_seaorm::InMemoryPublisher::new())
    ///     .with_relay(move |stop, reporter| async move {
    ///         if let Err(error) = relay.run_reporting(stop, Some(reporter)).await {
    ///             tracing::error!(%error, "the log relay stopped");
    ///         }
    ///     })
    ///     .start()?;
    /// # Ok(()) }
    /// ```
    pub async fn run_reporting(
        &self,
        shutdown: CancellationToken,
        reporter: Option<PassReporter>,
    ) -> Result<(), LogError> {
        self.check().await?;
        let mut held = Held::default();
        let mut failures: i32 = 0;
        let mut standing_by = false;
        let last_confirm = Arc::new(AtomicI64::new(Utc::now().timestamp_millis()));
        let sampler = tokio::spawn(sample_slot(
            self.db.clone(),
            self.config.slot().to_owned(),
            self.config.slot_sample,
            last_confirm.clone(),
            reporter.clone(),
            shutdown.clone(),
        ));
        let progress = Progress { reporter, last_confirm };
        while !shutdown.is_cancelled() {
            let outcome = self.session(&shutdown, &mut held, &mut standing_by, &progress).await;
            let delay = match outcome {
                Ok(Some(pause)) => pause,
                Ok(None) => {
                    failures = 0;
                    continue;
                }
                Err(LogError::Setup(problem)) => {
                    sampler.abort();
                    return Err(problem.into());
                }
                Err(error) => {
                    if let Some(reporter) = &progress.reporter {
                        reporter.failed(&error);
                    }
                    failures = failures.saturating_add(1);
                    let delay = self.config.relay.backoff.delay(failures).min(Duration::from_secs(30));
                    tracing::error!(%error, consecutive_failures = failures, retry_in = ?delay, "log relay failed");
                    delay
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(delay) => {}
            }
        }
        sampler.abort();
        Ok(())
    }

    /// One connection's life: the slot, the catch-up if one is owed, then the log until it ends or
    /// `shutdown`. `Ok(Some(pause))` asks to wait before the next session (a standby).
    async fn session(
        &self,
        shutdown: &CancellationToken,
        held: &mut Held,
        standing_by: &mut bool,
        progress: &Progress,
    ) -> Result<Option<Duration>, LogError> {
        let slot = self.config.slot();
        table::ensure_state_table(&self.db).await?;
        match setup::slot_state(&self.db, slot).await? {
            Some(state) if !state.is_lost() => {}
            state => {
                if state.is_some() {
                    tracing::warn!(
                        slot,
                        "the log relay's slot is lost (the server removed WAL it needed); recreating it and catching up from the table"
                    );
                    setup::drop_slot(&self.db, slot).await?;
                } else {
                    tracing::info!(slot, "no replication slot yet: creating it, then publishing what the table holds");
                }
                // In this order: a relay killed between the two finds the catch-up still owed.
                table::set_caught_up(&self.db, slot, false).await?;
                setup::create_slot(&self.db, slot).await?;
            }
        }
        if !table::caught_up(&self.db, slot).await? {
            self.catch_up(shutdown).await?;
            if shutdown.is_cancelled() {
                return Ok(None);
            }
            table::set_caught_up(&self.db, slot, true).await?;
        }
        held.parked = table::parked_aggregates(&self.db).await?;
        let mut stream = match PgWireStream::start(&self.url, &self.config).await {
            Ok(stream) => stream,
            Err(StreamFailure::SlotBusy(message)) => {
                if !*standing_by {
                    tracing::info!(slot, %message, "another relay reads the slot; standing by");
                    *standing_by = true;
                }
                return Ok(Some(self.config.standby_retry));
            }
            Err(StreamFailure::SlotGone(message)) => {
                tracing::warn!(slot, %message, "the slot went away as the stream started");
                return Ok(Some(self.config.standby_retry));
            }
            Err(StreamFailure::Other(message)) => return Err(LogError::Replication(message)),
        };
        if std::mem::take(standing_by) {
            tracing::info!(slot, "took the slot over");
        }
        tracing::info!(slot, parked = held.parked.len(), "reading the log");
        let mut session = Session::new(self, shutdown, held, progress);
        let result = session.read(&mut stream).await;
        let settled = session.settle(&stream, true).await;
        stream.close().await;
        result.and(settled).map(|()| None)
    }

    /// Publishes every unpublished row of the table with the polling claim, until none is left that a
    /// dead row does not hold back: what the log cannot give (rows committed before the slot existed).
    async fn catch_up(&self, shutdown: &CancellationToken) -> Result<(), LogError> {
        let relay = Relay::new(SeaOrmStore::new(self.db.clone()), &self.publisher, self.config.relay.clone())?;
        let mut round: i32 = 0;
        loop {
            table::make_due(&self.db, Utc::now().timestamp_millis()).await?;
            let mut published = 0;
            loop {
                if shutdown.is_cancelled() {
                    return Ok(());
                }
                let pass = relay.run_once().await?;
                published += pass.published;
                if pass.claimed == 0 {
                    break;
                }
            }
            let left = table::publishable(&self.db).await?;
            tracing::info!(published, left, "log relay catch-up from the table");
            if left == 0 {
                return Ok(());
            }
            round = round.saturating_add(1);
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.config.relay.backoff.delay(round)) => {}
            }
        }
    }

    /// One publish call, bounded by `publish_timeout`, with exactly one result per event.
    pub(super) async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let timeout = self.config.relay.publish_timeout;
        match tokio::time::timeout(timeout, self.publisher.publish(events)).await {
            Ok(mut results) => {
                results
                    .resize(events.len(), Err(PublishError::transient("publisher returned no result for this event")));
                results
            }
            Err(_) => vec![Err(PublishError::transient(format!("publish timed out after {timeout:?}"))); events.len()],
        }
    }
}

/// Who hears about the relay's progress: a service's health, and the slot sampler.
pub(super) struct Progress {
    reporter: Option<PassReporter>,
    /// When a position was last confirmed, in ms since the epoch.
    pub(super) last_confirm: Arc<AtomicI64>,
}

impl Progress {
    pub(super) fn passed(&self, pass: &LogPass) {
        if let Some(reporter) = &self.reporter {
            reporter.passed(&pass.as_relay_pass());
        }
    }
}

/// Samples the slot every `every`: its lag and retained WAL as metrics and for the service's health.
async fn sample_slot(
    db: sea_orm::DatabaseConnection,
    slot: String,
    every: Duration,
    last_confirm: Arc<AtomicI64>,
    reporter: Option<PassReporter>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match setup::slot_state(&db, &slot).await {
            Ok(Some(state)) => {
                let lag = state.lag_bytes.unwrap_or(0).max(0) as u64;
                let retained = state.retained_bytes.unwrap_or(0).max(0) as u64;
                let since = Utc::now().timestamp_millis() - last_confirm.load(Ordering::Relaxed);
                let age = if lag > 0 { Duration::from_millis(since.max(0) as u64) } else { Duration::ZERO };
                outbox_runtime::metrics::log_slot(&slot, lag, retained, age);
                if let Some(reporter) = &reporter {
                    reporter.replication_lag(lag);
                }
            }
            Ok(None) => tracing::debug!(slot, "no slot to sample yet"),
            Err(error) => tracing::debug!(%error, "sampling the log relay's slot failed"),
        }
    }
}

//! The relay: claim due rows, publish them, record the outcome. At-least-once: a row is marked published
//! only after the broker confirmed it, so a crash in between publishes it again, never loses it.

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::envelope::OutboxEvent;
use crate::error::Result;
use crate::publisher::{PublishError, Publisher};
use crate::store::{BatchOutcome, ClaimRequest, ClaimedBatch, Failure, OutboxStore};

/// What one relay pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RelayPass {
    /// Rows claimed.
    pub claimed: u64,
    /// Rows the broker confirmed and the store marked published.
    pub published: u64,
    /// Rows that failed and will be retried after their backoff.
    pub failed: u64,
    /// Rows that failed for the last time and are now dead.
    pub dead: u64,
    /// Rows whose lease another relay took over before this one marked them (lease mode).
    pub fenced: u64,
}

/// Moves committed outbox rows to a broker.
///
/// ```no_run
/// # async fn demo<S: outbox_core::OutboxStore, P: outbox_core::Publisher>(store: S, publisher: P) -> outbox_core::Result<()> {
/// use outbox_core::{Relay, RelayConfig};
/// let relay = Relay::new(store, publisher, RelayConfig::default().with_batch_size(500))?;
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// relay.run(shutdown).await; // until cancelled
/// # Ok(()) }
/// ```
pub struct Relay<S, P> {
    store: S,
    publisher: P,
    config: RelayConfig,
}

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    /// A relay over `store` and `publisher`; fails if `config` is invalid.
    pub fn new(store: S, publisher: P, config: RelayConfig) -> Result<Self> {
        config.validate()?;
        Ok(Relay { store, publisher, config })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }

    /// The settings.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// One pass at the current time.
    pub async fn run_once(&self) -> Result<RelayPass> {
        self.run_once_at(Utc::now()).await
    }

    /// One pass as if the clock read `now` (tests use it to step over backoff delays).
    #[tracing::instrument(name = "outbox.relay.pass", skip(self), level = "debug", err)]
    pub async fn run_once_at(&self, now: DateTime<Utc>) -> Result<RelayPass> {
        let batch = self
            .store
            .claim(ClaimRequest {
                now,
                limit: self.config.batch_size,
                mode: self.config.claim_mode,
                dead_letters: self.config.dead_letters,
            })
            .await?;
        let claimed = batch.events().len() as u64;
        if claimed == 0 {
            return Ok(RelayPass::default());
        }
        let results = self.publish(batch.events()).await;
        let outcome = self.outcome(now, batch.events(), results);
        let dead = outcome.failed.iter().filter(|f| f.dead).count() as u64;
        let report = batch.complete(outcome).await?;
        let pass = RelayPass {
            claimed,
            published: report.published,
            failed: report.failed.saturating_sub(dead),
            dead,
            fenced: report.fenced,
        };
        tracing::debug!(?pass, "relay pass done");
        if dead > 0 {
            tracing::warn!(dead, "outbox events reached max_attempts and are dead");
        }
        Ok(pass)
    }

    /// Passes until a pass claims nothing at the current time, at most `max_passes`; returns the passes
    /// that claimed something. Failed rows wait for their backoff, so a drain stops at them.
    pub async fn drain(&self, max_passes: usize) -> Result<Vec<RelayPass>> {
        let mut passes = Vec::new();
        for _ in 0..max_passes {
            let pass = self.run_once().await?;
            if pass.claimed == 0 {
                break;
            }
            passes.push(pass);
        }
        Ok(passes)
    }

    /// Runs passes until `shutdown` is cancelled: straight on while there is work, otherwise every
    /// `poll_interval`. Store errors are logged and retried after the poll interval; an in-flight pass is
    /// finished before returning.
    pub async fn run(&self, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            let idle = match self.run_once().await {
                Ok(pass) => pass.claimed == 0,
                Err(error) => {
                    tracing::error!(%error, "outbox relay pass failed");
                    true
                }
            };
            if idle {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                }
            }
        }
    }

    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        match tokio::time::timeout(self.config.publish_timeout, self.publisher.publish(events)).await {
            Ok(mut results) => {
                if results.len() != events.len() {
                    tracing::error!(
                        expected = events.len(),
                        got = results.len(),
                        "publisher broke its contract: one result per event; unconfirmed events will be retried"
                    );
                    results.truncate(events.len());
                    results.resize(
                        events.len(),
                        Err(PublishError::transient("publisher returned no result for this event")),
                    );
                }
                results
            }
            Err(_) => {
                let error =
                    PublishError::transient(format!("publish timed out after {:?}", self.config.publish_timeout));
                vec![Err(error); events.len()]
            }
        }
    }

    fn outcome(
        &self,
        now: DateTime<Utc>,
        events: &[OutboxEvent],
        results: Vec<Result<(), PublishError>>,
    ) -> BatchOutcome {
        let mut outcome = BatchOutcome { now, ..BatchOutcome::default() };
        for (event, result) in events.iter().zip(results) {
            match result {
                Ok(()) => outcome.published.push(event.seq),
                Err(error) => {
                    let attempts = event.attempts.saturating_add(1);
                    let dead = error.is_permanent() || attempts >= self.config.max_attempts;
                    let delay = self.config.backoff.delay(attempts);
                    let next_attempt_at = now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
                    tracing::debug!(event_id = %event.id, attempts, dead, %error, "publish failed");
                    outcome.failed.push(Failure {
                        seq: event.seq,
                        error: error.message().to_owned(),
                        next_attempt_at,
                        dead,
                    });
                }
            }
        }
        outcome
    }
}

//! The relay: claim due rows, publish them, record the outcome. At-least-once: a row is marked published
//! only after the broker confirmed it, so a crash in between publishes it again, never loses it.

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::config::{Backoff, DEFAULT_ERROR_BACKOFF, RelayConfig};
use crate::envelope::OutboxEvent;
use crate::error::Result;
use crate::publisher::{PublishError, Publisher};
use crate::store::{BatchOutcome, ClaimRequest, ClaimedBatch, Failure, OutboxStore};
use crate::wake::WakeListener;

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
    /// Rows claimed but not tried because an earlier event of their aggregate failed in this pass (or the
    /// pass reached `publish_timeout`); they go out after it, never before.
    pub released: u64,
    /// Rows whose lease another relay took over before this one marked them (lease mode).
    pub fenced: u64,
}

/// Moves committed outbox rows to a broker.
///
/// ```no_run
/// # async fn demo<S: outbox_runtime::store::OutboxStore, P: outbox_runtime::Publisher>(store: S, publisher: P) -> outbox_runtime::Result<()> {
/// use outbox_runtime::{Relay, RelayConfig};
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
    /// [`ClaimMode::Auto`](crate::ClaimMode::Auto) is decided here, for `store`: [`Relay::config`] shows
    /// the mode in use.
    pub fn new(store: S, publisher: P, mut config: RelayConfig) -> Result<Self> {
        config.claim_mode = config.claim_mode.resolve(store.claims_block_writers(), config.publish_timeout);
        config.validate()?;
        crate::metrics::describe();
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
    pub async fn run_once_at(&self, now: DateTime<Utc>) -> Result<RelayPass> {
        self.pass(now, None).await
    }

    /// One pass; once `stop` is cancelled no further wave is published and the rest is released.
    #[tracing::instrument(name = "outbox.relay.pass", skip(self, stop), level = "debug", err)]
    pub(crate) async fn pass(&self, now: DateTime<Utc>, stop: Option<&CancellationToken>) -> Result<RelayPass> {
        let claim_started = std::time::Instant::now();
        let batch = self
            .store
            .claim(ClaimRequest {
                now,
                limit: self.config.batch_size,
                mode: self.config.claim_mode,
                dead_letters: self.config.dead_letters,
            })
            .await?;
        crate::metrics::claim_duration(claim_started.elapsed());
        let claimed = batch.events().len() as u64;
        let dead_on_claim = batch.dead_on_claim();
        if dead_on_claim > 0 {
            tracing::error!(
                dead = dead_on_claim,
                "outbox rows that cannot be decoded were marked dead; see their last_error"
            );
        }
        if claimed == 0 {
            return Ok(RelayPass { dead: dead_on_claim, ..RelayPass::default() });
        }
        let outcome = self.publish_runs(now, batch.events(), stop).await;
        let released = outcome.released.len() as u64;
        // What the store marked, in either claim mode: in lease mode a row whose lease passed to another
        // relay is fenced, neither failed nor dead here.
        let report = batch.complete(outcome).await?;
        let pass = RelayPass {
            claimed,
            published: report.published,
            failed: report.failed.saturating_sub(report.dead),
            dead: report.dead + dead_on_claim,
            released,
            fenced: report.fenced,
        };
        tracing::debug!(?pass, "relay pass done");
        crate::metrics::relay_pass(&pass);
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

    /// Runs passes until `shutdown` is cancelled: straight on while there is work, otherwise at the next
    /// `poll_interval` or in-process [`wake_relays`](crate::wake_relays), whichever comes first. A failed
    /// pass (the store is down) is retried after an exponential backoff (500 ms doubling up to 30 s), not
    /// every poll. On cancellation the in-flight pass publishes no further wave, records what it has and
    /// releases the rest before returning. [`OutboxService`](crate::OutboxService) runs this loop with
    /// health reporting.
    pub async fn run(&self, shutdown: CancellationToken) {
        run_loop(self, &shutdown, &DEFAULT_ERROR_BACKOFF, &mut |_| {}).await;
    }

    /// Publishes the claimed runs in *waves*: wave `k` holds the `k`-th event of every run still going, so a
    /// publish call never carries two events of one aggregate (the [`Publisher`] contract) and an event is
    /// sent only after the broker confirmed the previous event of its aggregate. The first failure in a run
    /// stops it; its later events are released. All waves together get `publish_timeout`.
    /// Once `stop` is cancelled no further wave starts: the runs still going are released (not failed, so
    /// no attempt is counted) and the pass records what it has.
    async fn publish_runs(
        &self,
        now: DateTime<Utc>,
        events: &[OutboxEvent],
        stop: Option<&CancellationToken>,
    ) -> BatchOutcome {
        let mut outcome = BatchOutcome { now, ..BatchOutcome::default() };
        let deadline = tokio::time::Instant::now() + self.config.publish_timeout;
        let mut runs: Vec<std::collections::VecDeque<&OutboxEvent>> = group_runs(events);
        while !runs.is_empty() {
            let wave: Vec<OutboxEvent> = runs.iter_mut().filter_map(|run| run.pop_front().cloned()).collect();
            let results = self.publish_wave(&wave, deadline).await;
            let confirmed_at = Utc::now();
            let mut still_going = Vec::with_capacity(runs.len());
            for ((event, result), run) in wave.iter().zip(results).zip(runs) {
                match result {
                    Ok(()) => {
                        crate::metrics::publish_latency(event, confirmed_at);
                        outcome.published.push(event.seq);
                        if !run.is_empty() {
                            still_going.push(run);
                        }
                    }
                    Err(error) => {
                        outcome.failed.push(self.failure(now, event, &error));
                        outcome.released.extend(run.iter().map(|e| e.seq));
                    }
                }
            }
            runs = still_going;
            if stop.is_some_and(CancellationToken::is_cancelled) && !runs.is_empty() {
                tracing::debug!("relay stopping; the rest of the claimed runs is released");
                outcome.released.extend(runs.iter().flatten().map(|e| e.seq));
                break;
            }
            if tokio::time::Instant::now() >= deadline && !runs.is_empty() {
                tracing::warn!(
                    timeout = ?self.config.publish_timeout,
                    "publish_timeout reached within a pass; the rest of its runs is released"
                );
                outcome.released.extend(runs.iter().flatten().map(|e| e.seq));
                break;
            }
        }
        outcome
    }

    /// One publish call, bounded by the pass's deadline, with exactly one result per event.
    async fn publish_wave(
        &self,
        events: &[OutboxEvent],
        deadline: tokio::time::Instant,
    ) -> Vec<Result<(), PublishError>> {
        let span = crate::telemetry::publish_span(&self.publisher, events);
        let started = std::time::Instant::now();
        let published = tokio::time::timeout_at(deadline, self.publisher.publish(events)).instrument(span).await;
        crate::metrics::publish_duration(started.elapsed());
        match published {
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

    fn failure(&self, now: DateTime<Utc>, event: &OutboxEvent, error: &PublishError) -> Failure {
        let attempts = event.attempts.saturating_add(1);
        let dead = dead_reason(error, attempts, self.config.max_attempts);
        let delay = self.config.backoff.delay(attempts);
        // Validation bounds the delay to a week; the checked sum still never panics on a clock near the end.
        let next_attempt_at = chrono::Duration::from_std(delay)
            .ok()
            .and_then(|delay| now.checked_add_signed(delay))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        match &dead {
            Some(reason) => tracing::warn!(event_id = %event.id, attempts, %error, "outbox event is dead: {reason}"),
            None => tracing::debug!(event_id = %event.id, attempts, %error, "publish failed; retried after backoff"),
        }
        Failure { seq: event.seq, error: error.message().to_owned(), next_attempt_at, dead: dead.is_some() }
    }
}

/// Why a row whose publish failed at its `attempts`-th try is now dead, or `None` while it will be retried:
/// a permanent failure is never retried, whatever the attempt; a transient one is retried until
/// `max_attempts`.
fn dead_reason(error: &PublishError, attempts: i32, max_attempts: i32) -> Option<String> {
    if error.is_permanent() {
        Some(format!("the publish failed permanently at attempt {attempts}; it is not retried"))
    } else if attempts >= max_attempts {
        Some(format!("the publish failed {attempts} times, reaching max_attempts ({max_attempts})"))
    } else {
        None
    }
}

/// What the run loop reports after each pass.
pub(crate) enum PassReport<'a> {
    Done(RelayPass),
    Failed(&'a crate::Error),
}

/// The relay's loop (see [`Relay::run`]); `report` sees every pass.
pub(crate) async fn run_loop<S: OutboxStore, P: Publisher>(
    relay: &Relay<S, P>,
    shutdown: &CancellationToken,
    error_backoff: &Backoff,
    report: &mut (dyn FnMut(PassReport<'_>) + Send),
) {
    let mut wake = WakeListener::new();
    let mut failures: u32 = 0;
    while !shutdown.is_cancelled() {
        wake.mark_seen();
        let pause = match relay.pass(Utc::now(), Some(shutdown)).await {
            Ok(pass) => {
                failures = 0;
                report(PassReport::Done(pass));
                if pass.claimed > 0 {
                    continue;
                }
                None
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                crate::metrics::relay_pass_failed();
                let delay = error_backoff.delay(i32::try_from(failures).unwrap_or(i32::MAX));
                tracing::error!(%error, consecutive_failures = failures, retry_in = ?delay, "outbox relay pass failed");
                report(PassReport::Failed(&error));
                Some(delay)
            }
        };
        match pause {
            // Idle: the next poll, or a commit in this process, whichever comes first.
            None => tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(relay.config.poll_interval) => {}
                () = wake.woken() => tracing::trace!("relay woken by a commit"),
            },
            // Failing: back off, whatever commits meanwhile (they are still there after the backoff).
            Some(delay) => tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(delay) => {}
            },
        }
    }
}

/// The claimed events as runs, one per aggregate, each in version order, runs in order of first appearance.
fn group_runs(events: &[OutboxEvent]) -> Vec<std::collections::VecDeque<&OutboxEvent>> {
    let mut index: std::collections::HashMap<(&str, &str), usize> = std::collections::HashMap::new();
    let mut runs: Vec<std::collections::VecDeque<&OutboxEvent>> = Vec::new();
    for event in events {
        let key = (event.aggregate_type.as_str(), event.aggregate_id.as_str());
        let slot = *index.entry(key).or_insert_with(|| {
            runs.push(std::collections::VecDeque::new());
            runs.len() - 1
        });
        runs[slot].push_back(event);
    }
    for run in &mut runs {
        run.make_contiguous().sort_by_key(|e| (e.aggregate_version, e.seq));
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_row_is_logged_with_why_it_is_dead() {
        let permanent = PublishError::permanent("message too large");
        let first = dead_reason(&permanent, 1, 10).expect("a permanent failure is dead at once");
        assert!(first.contains("permanently at attempt 1"), "{first}");
        assert!(!first.contains("max_attempts"), "not attempts exhausted: {first}");

        let transient = PublishError::transient("broker unavailable");
        assert_eq!(dead_reason(&transient, 9, 10), None, "retried below max_attempts");
        let last = dead_reason(&transient, 10, 10).expect("attempts exhausted");
        assert!(last.contains("10 times") && last.contains("max_attempts (10)"), "{last}");
    }
}

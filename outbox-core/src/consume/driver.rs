//! The consume loop: fetch, lanes per aggregate, settle each message, shut down in order.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::group::GroupCommit;
use super::route::{Attempt, BoxFuture, Handled, Route};
use super::transport::{DeadLetter, Delivery, Transport};
use super::{Consumer, Counters};
use crate::broker::{decode_message, header};
use crate::envelope::OutboxEvent;
use crate::error::Result;
use crate::metrics::Consumed;
use crate::text::one_line;

/// How many times an ack is tried before the message is left to the broker's redelivery.
const ACK_ATTEMPTS: u32 = 3;
/// The pause before the second ack attempt (doubled before the third).
const ACK_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between fetches after the broker failed.
const MAX_FETCH_PAUSE: Duration = Duration::from_secs(5);

mod grouped;
use grouped::{MAX_FILL_WAIT, PARTIAL_GROUPS_RUNNING, fills_a_group};

pub(super) async fn run<T: Transport>(consumer: &Consumer, transport: &T, shutdown: CancellationToken) -> Result<()> {
    let span = tracing::info_span!(
        "outbox.consume",
        messaging.system = crate::telemetry::messaging_system(transport.broker()),
        messaging.consumer.group.name = %consumer.name,
        messaging.source.name = %transport.source(),
    );
    crate::metrics::describe();
    let driver = Driver {
        consumer,
        transport,
        permits: Semaphore::new(consumer.config.concurrency),
        shutdown: shutdown.child_token(),
        misconfigured: std::sync::Mutex::new(None),
    };
    // The lag sampler runs beside the driver and stops with it.
    tokio::select! {
        result = driver.run().instrument(span.clone()) => result?,
        never = sample_lag(consumer, transport).instrument(span) => match never {},
    }
    match driver.misconfigured.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        Some(reason) => Err(crate::Error::invalid_config("handler", reason)),
        None => Ok(()),
    }
}

/// Reads the consumer's lag at its broker every [`ConsumerConfig::lag_interval`] into the
/// [`CONSUMER_LAG`](crate::metrics::CONSUMER_LAG) gauge, until dropped; idle for good when the broker
/// cannot say.
async fn sample_lag<T: Transport>(consumer: &Consumer, transport: &T) -> std::convert::Infallible {
    loop {
        match transport.lag().await {
            Ok(Some(lag)) => {
                crate::metrics::consumer_lag(&consumer.name, lag.total());
                *consumer.lag.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(lag);
            }
            Ok(None) => return std::future::pending().await,
            Err(error) => tracing::debug!(%error, "cannot read the consumer's lag"),
        }
        tokio::time::sleep(consumer.config.lag_interval).await;
    }
}

/// A fetch in progress: when it started, and what the broker returned.
type Fetch<'a, R> = BoxFuture<'a, (Instant, Result<Vec<Delivery<R>>>)>;

struct Driver<'a, T> {
    consumer: &'a Consumer,
    transport: &'a T,
    permits: Semaphore,
    /// The caller's token, or cancelled by the driver itself when a handler reported a configuration error.
    shutdown: CancellationToken,
    /// The configuration error a handler reported: [`run`] stops and returns it.
    misconfigured: std::sync::Mutex<Option<String>>,
}

/// What the driver decided before any handler ran.
enum Plan<'r> {
    Handle(&'r dyn Route, Box<OutboxEvent>),
    Skip(Box<OutboxEvent>),
    Poison(String),
}

impl<'a, T: Transport> Driver<'a, T> {
    fn counters(&self) -> &Counters {
        &self.consumer.counters
    }

    async fn run(&self) -> Result<()> {
        let config = &self.consumer.config;
        tracing::info!(handles = ?self.consumer.event_types(), group_commit = self.grouping().is_some(), "consumer started");
        let mut lanes: HashMap<String, Lane<T::Receipt>> = HashMap::new();
        // Lanes with queued messages and nothing running: the next to dispatch, oldest first.
        let mut ready: VecDeque<String> = VecDeque::new();
        let mut running: FuturesUnordered<BoxFuture<'_, Settled<T::Receipt>>> = FuturesUnordered::new();
        let mut groups_running = 0usize;
        // When the group that waits to fill (see `dispatch`) starts anyway.
        let mut filling: Option<Instant> = None;
        let mut fetch: Option<Fetch<'_, T::Receipt>> = None;
        let mut held = 0usize;
        let mut pause = Duration::ZERO;
        let mut fetch_failures = 0u32;
        let mut anonymous = 0u64;
        let mut stopping = false;
        loop {
            if !stopping {
                self.dispatch(&mut lanes, &mut ready, &mut running, &mut groups_running, &mut filling);
            }
            if !stopping && fetch.is_none() && held < config.max_in_flight {
                tracing::trace!(held, lanes = lanes.len(), running = running.len(), "fetching");
                let max = config.batch_size.min(config.max_in_flight - held);
                let wait = config.fetch_wait;
                let delay = std::mem::take(&mut pause);
                let shutdown = &self.shutdown;
                fetch = Some(Box::pin(async move {
                    if !delay.is_zero() {
                        tokio::select! {
                            () = shutdown.cancelled() => return (Instant::now(), Ok(Vec::new())),
                            () = tokio::time::sleep(delay) => {}
                        }
                    }
                    let started = Instant::now();
                    (started, self.transport.fetch(max, wait).await)
                }));
            }
            if stopping && running.is_empty() && fetch.is_none() {
                break;
            }
            tokio::select! {
                biased;
                () = self.shutdown.cancelled(), if !stopping => {
                    stopping = true;
                    tracing::info!(held, "consumer stopping: finishing running handlers, releasing the rest");
                    // Lanes with nothing running have nothing ahead of their messages to wait for.
                    for lane in ready.drain(..) {
                        if let Some(idle) = lanes.remove(&lane) {
                            held -= idle.queue.len();
                            for delivery in &idle.queue {
                                self.release(delivery).await;
                            }
                        }
                    }
                }
                () = async { tokio::time::sleep_until(filling.expect("guarded by is_some").into()).await }, if filling.is_some() && !stopping => {}
                Some(settled) = running.next(), if !running.is_empty() => {
                    let finished = match settled {
                        Settled::One(lane) => {
                            held -= 1;
                            vec![(lane, Vec::new())]
                        }
                        Settled::Group { lanes: done, applied } => {
                            groups_running -= 1;
                            held -= applied;
                            done
                        }
                    };
                    for (lane, unsettled) in finished {
                        let Some(state) = lanes.get_mut(&lane) else { continue };
                        // What the group left goes first, in order, each message alone.
                        state.alone += unsettled.len();
                        for delivery in unsettled.into_iter().rev() {
                            state.queue.push_front(delivery);
                        }
                        if stopping {
                            let rest = lanes.remove(&lane).map(|l| l.queue).unwrap_or_default();
                            held -= rest.len();
                            for delivery in &rest {
                                self.release(delivery).await;
                            }
                        } else if state.alone > 0 {
                            state.alone -= 1;
                            let delivery = state.queue.pop_front().expect("a message left by its group");
                            running.push(Box::pin(self.settle_one(delivery, lane)));
                        } else if state.queue.is_empty() {
                            lanes.remove(&lane);
                        } else {
                            state.busy = false;
                            ready.push_back(lane);
                        }
                    }
                }
                (started, fetched) = async { fetch.as_mut().expect("guarded by is_some").await }, if fetch.is_some() => {
                    fetch = None;
                    match fetched {
                        Err(error) => {
                            fetch_failures = fetch_failures.saturating_add(1);
                            pause = config.backoff.delay(i32::try_from(fetch_failures).unwrap_or(i32::MAX)).min(MAX_FETCH_PAUSE);
                            tracing::warn!(%error, ?pause, failures = fetch_failures, "fetch failed; retrying");
                        }
                        Ok(batch) if stopping => {
                            for delivery in &batch {
                                self.release(delivery).await;
                            }
                        }
                        Ok(batch) => {
                            fetch_failures = 0;
                            if batch.is_empty() && started.elapsed() < config.fetch_wait / 2 {
                                // The broker answered "nothing" at once: do not spin.
                                pause = (config.fetch_wait / 4).max(Duration::from_millis(5));
                            }
                            for delivery in batch {
                                held += 1;
                                let lane = lane_of(&delivery, &mut anonymous);
                                let state = lanes.entry(lane.clone()).or_default();
                                if !state.busy && state.queue.is_empty() {
                                    ready.push_back(lane);
                                }
                                state.queue.push_back(delivery);
                            }
                        }
                    }
                }
            }
        }
        if let Err(error) = self.transport.flush().await {
            tracing::warn!(%error, "final flush of acks failed; the broker delivers those messages again and the inbox absorbs them");
        }
        tracing::info!(stats = ?self.consumer.stats(), "consumer stopped");
        Ok(())
    }

    /// The group commit, when the consumer has one and groups of more than one message.
    fn grouping(&self) -> Option<&'a dyn GroupCommit> {
        let consumer: &'a Consumer = self.consumer;
        consumer.group.as_deref().filter(|_| consumer.config.group_size > 1)
    }

    /// Starts work on the ready lanes: each lane's head alone, or, with a group commit, groups of up to
    /// `group_size` messages (several of one lane, in order) while fewer than `concurrency` groups run.
    /// `filling` is when a group left waiting to fill starts anyway; set only when one waits.
    fn dispatch<'s>(
        &'s self,
        lanes: &mut HashMap<String, Lane<T::Receipt>>,
        ready: &mut VecDeque<String>,
        running: &mut FuturesUnordered<BoxFuture<'s, Settled<T::Receipt>>>,
        groups_running: &mut usize,
        filling: &mut Option<Instant>,
    ) {
        let waiting_until = filling.take();
        let config = &self.consumer.config;
        let Some(group) = self.grouping() else {
            for lane in ready.drain(..) {
                let Some(state) = lanes.get_mut(&lane) else { continue };
                let Some(delivery) = state.queue.pop_front() else { continue };
                state.busy = true;
                running.push(Box::pin(self.settle_one(delivery, lane)));
            }
            return;
        };
        while *groups_running < config.concurrency && !ready.is_empty() {
            // A group that would leave room waits while another commits: the messages fetched meanwhile
            // fill it, and commits are the consumer's cost (a live stream at 1,900 events/s averaged 3.4-4.2
            // messages per commit dispatching whatever was ready, 6.9-7.5 this way, lag unchanged). It waits
            // until a group ends or for `MAX_FILL_WAIT`, so a slow or hung group holds no other lane back.
            if *groups_running >= PARTIAL_GROUPS_RUNNING && !fills_a_group(lanes, ready, config.group_size) {
                let until = waiting_until.unwrap_or_else(|| Instant::now() + MAX_FILL_WAIT);
                if Instant::now() < until {
                    *filling = Some(until);
                    return;
                }
            }
            let mut taken = Vec::new();
            let mut size = 0;
            while size < config.group_size
                && let Some(lane) = ready.pop_front()
            {
                let Some(state) = lanes.get_mut(&lane) else { continue };
                let n = (config.group_size - size).min(state.queue.len());
                state.busy = true;
                size += n;
                taken.push((lane, state.queue.drain(..n).collect::<Vec<_>>()));
            }
            if taken.is_empty() {
                return;
            }
            *groups_running += 1;
            running.push(Box::pin(self.settle_group(group, taken)));
        }
    }

    /// One message alone, to its end; its lane.
    async fn settle_one(&self, delivery: Delivery<T::Receipt>, lane: String) -> Settled<T::Receipt> {
        Settled::One(self.settle(delivery, lane).await)
    }

    /// One handler call of a message applied alone, through the group commit's
    /// [`run_alone`](GroupCommit::run_alone) when the consumer has one.
    async fn attempt_alone(&self, route: &dyn Route, event: OutboxEvent, delivery: u32) -> Attempt {
        let Some(group) = self.consumer.group.as_deref() else { return self.attempt(route, event, delivery).await };
        let mut attempt = None;
        group.run_alone(Box::pin(async { attempt = Some(self.attempt(route, event, delivery).await) })).await;
        attempt.unwrap_or_else(|| Attempt::Failed("the group commit's `run_alone` dropped the handler call".to_owned()))
    }

    /// One handler call, bounded by `handler_timeout`, timed.
    async fn attempt(&self, route: &dyn Route, event: OutboxEvent, delivery: u32) -> Attempt {
        let event_type = event.event_type.clone();
        self.bounded(&event_type, route.attempt(event, delivery)).await.unwrap_or_else(Attempt::Failed)
    }

    /// Runs one handler call (of one message or a batch) bounded by `handler_timeout`, and records its
    /// duration; past the bound, the reason the call was abandoned.
    async fn bounded<R>(&self, event_type: &str, call: impl Future<Output = R>) -> std::result::Result<R, String> {
        let started = Instant::now();
        let limit = self.consumer.config.handler_timeout;
        let outcome = tokio::time::timeout(limit, call).await.map_err(|_| {
            // Dropping the call rolls back the transaction it had open.
            Counters::add(&self.counters().timed_out);
            format!(
                "the handler did not finish within {limit:?} (handler_timeout); abandoned, its transaction rolled back"
            )
        });
        crate::metrics::handler_duration(&self.consumer.name, event_type, started.elapsed());
        outcome
    }

    /// Takes one message to its end: acked (applied, duplicate, skipped, dead-lettered) or released
    /// (shutdown). Returns its lane.
    async fn settle(&self, delivery: Delivery<T::Receipt>, lane: String) -> String {
        let span = self.process_span(&delivery);
        self.settle_in_span(delivery, lane).instrument(span).await
    }

    /// The span of one attempt at a message.
    fn process_span(&self, delivery: &Delivery<T::Receipt>) -> tracing::Span {
        crate::telemetry::process_span(
            self.transport.broker(),
            &self.consumer.name,
            &delivery.origin,
            &delivery.headers,
            delivery.deliveries,
        )
    }

    async fn settle_in_span(&self, delivery: Delivery<T::Receipt>, lane: String) -> String {
        let previous = delivery.deliveries.saturating_sub(1);
        tracing::trace!(lane = %one_line(&lane), deliveries = delivery.deliveries, "settling");
        match self.plan(&delivery) {
            Plan::Skip(event) => {
                tracing::debug!(event_id = %event.id, event_type = %one_line(&event.event_type), "no handler for this event type here; acked untouched");
                Counters::add(&self.counters().skipped);
                crate::metrics::consumer_dead_lettered_or_skipped(&self.consumer.name, false);
                self.ack(&delivery).await;
            }
            Plan::Poison(reason) => self.dead_letter(&delivery, reason, previous + 1).await,
            Plan::Handle(route, event) => self.handle(&delivery, route, &event, previous).await,
        }
        lane
    }

    fn plan(&self, delivery: &Delivery<T::Receipt>) -> Plan<'a> {
        let limit = self.consumer.config.max_payload_bytes;
        if delivery.payload.len() > limit {
            return Plan::Poison(format!(
                "payload is {} bytes; this consumer accepts at most {limit} (max_payload_bytes)",
                delivery.payload.len()
            ));
        }
        let event = match decode_message(&delivery.headers, &delivery.payload) {
            Ok(event) => Box::new(event),
            Err(error) => return Plan::Poison(format!("not a valid outbox message: {error}")),
        };
        match self.consumer.routes.get(event.event_type.as_str()) {
            Some(route) => Plan::Handle(route.as_ref(), event),
            None => Plan::Skip(event),
        }
    }

    async fn handle(&self, delivery: &Delivery<T::Receipt>, route: &dyn Route, event: &OutboxEvent, previous: u32) {
        let max = self.consumer.config.max_deliveries;
        let backoff = &self.consumer.config.backoff;
        let (mut failures, mut waits) = (0u32, 0u32);
        loop {
            let attempt = {
                let _permit = self.permits.acquire().await;
                self.attempt_alone(route, event.clone(), previous + failures + 1).await
            };
            let reason = match attempt {
                Attempt::Done(Handled::Processed) => {
                    Counters::add(&self.counters().processed);
                    crate::metrics::consumed(&self.consumer.name, &event.event_type, Consumed::Processed);
                    return self.ack(delivery).await;
                }
                Attempt::Done(Handled::Duplicate) => {
                    Counters::add(&self.counters().duplicates);
                    crate::metrics::consumed(&self.consumer.name, &event.event_type, Consumed::Duplicate);
                    return self.ack(delivery).await;
                }
                Attempt::Poison(reason) => return self.dead_letter(delivery, reason, previous + failures + 1).await,
                Attempt::Misconfigured(reason) => {
                    tracing::error!(event_id = %event.id, reason = %one_line(&reason), "a handler reported a configuration error: the consumer stops, the message goes back to the broker");
                    self.misconfigured.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(reason);
                    self.shutdown.cancel();
                    return self.release(delivery).await;
                }
                Attempt::Newer(reason) => {
                    waits = waits.saturating_add(1);
                    Counters::add(&self.counters().newer_version);
                    if waits == 1 {
                        tracing::warn!(event_id = %event.id, %reason, "a newer schema version than this consumer decodes: kept and retried until this consumer is upgraded");
                    }
                    backoff.delay(i32::try_from(waits).unwrap_or(i32::MAX))
                }
                Attempt::Failed(reason) => {
                    failures += 1;
                    let deliveries = previous + failures;
                    if deliveries >= max {
                        return self.dead_letter(delivery, reason, deliveries).await;
                    }
                    Counters::add(&self.counters().retried);
                    crate::metrics::consumed(&self.consumer.name, &event.event_type, Consumed::Retried);
                    let pause = backoff.delay(i32::try_from(failures).unwrap_or(i32::MAX));
                    tracing::warn!(event_id = %event.id, reason = %one_line(&reason), deliveries, max_deliveries = max, ?pause, "handler failed; retrying in place");
                    pause
                }
            };
            if !self.hold(reason).await {
                return self.release(delivery).await;
            }
        }
    }

    /// Publishes the dead letter until the broker confirms it, then acks the original; on shutdown before
    /// a confirmation, releases it instead.
    async fn dead_letter(&self, delivery: &Delivery<T::Receipt>, reason: String, attempts: u32) {
        let letter =
            DeadLetter { reason, attempts, consumer: self.consumer.name.to_string(), origin: delivery.origin.clone() };
        let mut failures = 0i32;
        loop {
            match self.transport.dead_letter(delivery, &letter).await {
                Ok(()) => {
                    Counters::add(&self.counters().dead_lettered);
                    crate::metrics::consumer_dead_lettered_or_skipped(&self.consumer.name, true);
                    tracing::warn!(
                        event_id = %one_line(delivery.headers.get(header::ID).map_or("(none)", String::as_str)),
                        origin = %one_line(&delivery.origin),
                        reason = %one_line(&letter.reason),
                        attempts,
                        "message dead-lettered"
                    );
                    return self.ack(delivery).await;
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    let pause = self.consumer.config.backoff.delay(failures);
                    tracing::warn!(%error, ?pause, "dead-letter publish not confirmed; the message is kept and the dead letter retried");
                    if !self.hold(pause).await {
                        return self.release(delivery).await;
                    }
                }
            }
        }
    }

    /// Waits `pause` (the transport keeps the message alive at the broker meanwhile); `false` when
    /// shutdown came first.
    async fn hold(&self, pause: Duration) -> bool {
        tokio::select! {
            () = self.shutdown.cancelled() => false,
            () = tokio::time::sleep(pause) => true,
        }
    }

    /// Acks, trying [`ACK_ATTEMPTS`] times a short moment apart (acking twice is harmless; a lost ack costs a
    /// redelivery, which the inbox absorbs).
    async fn ack(&self, delivery: &Delivery<T::Receipt>) {
        let mut attempt = 1u32;
        loop {
            match self.transport.ack(&delivery.receipt).await {
                Ok(()) => {
                    tracing::trace!(deliveries = delivery.deliveries, "acked");
                    return;
                }
                Err(error) if attempt < ACK_ATTEMPTS && !self.shutdown.is_cancelled() => {
                    tracing::debug!(%error, attempt, "ack failed; trying again");
                    tokio::time::sleep(ACK_RETRY_PAUSE * attempt).await;
                    attempt += 1;
                }
                Err(error) => {
                    Counters::add(&self.counters().ack_failures);
                    tracing::warn!(%error, attempts = attempt, "ack failed; the broker redelivers the message and the inbox absorbs it");
                    return;
                }
            }
        }
    }

    async fn release(&self, delivery: &Delivery<T::Receipt>) {
        Counters::add(&self.counters().released);
        if let Err(error) = self.transport.release(&delivery.receipt).await {
            tracing::debug!(%error, "release failed; the broker redelivers the message after its deadline");
        }
    }
}

/// The messages of one aggregate the driver holds.
struct Lane<R> {
    /// Waiting, in delivery order.
    queue: VecDeque<Delivery<R>>,
    /// Something of this lane is running (a message alone, or part of a group).
    busy: bool,
    /// Messages at the head of `queue` a rolled-back group left, to run alone before grouping again.
    alone: usize,
}

impl<R> Default for Lane<R> {
    fn default() -> Self {
        Lane { queue: VecDeque::new(), busy: false, alone: 0 }
    }
}

/// What finished running.
enum Settled<R> {
    /// A message alone; its lane.
    One(String),
    /// A group: per lane, the messages it did not settle (to run alone, in order); how many it settled.
    Group { lanes: Vec<(String, Vec<Delivery<R>>)>, applied: usize },
}

/// The lane of a message: its aggregate, or a lane of its own when it has no envelope.
fn lane_of<R>(delivery: &Delivery<R>, anonymous: &mut u64) -> String {
    match (delivery.headers.get(header::AGGREGATE_TYPE), delivery.headers.get(header::SUBJECT)) {
        (Some(aggregate_type), Some(aggregate_id)) => format!("{aggregate_type}\u{0}{aggregate_id}"),
        _ => {
            *anonymous += 1;
            format!("\u{1}{anonymous}")
        }
    }
}

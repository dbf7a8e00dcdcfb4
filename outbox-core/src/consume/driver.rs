//! The consume loop: fetch, lanes per aggregate, settle each message, shut down in order.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

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

pub(super) async fn run<T: Transport>(consumer: &Consumer, transport: &T, shutdown: CancellationToken) -> Result<()> {
    let span = tracing::info_span!(
        "outbox.consume",
        messaging.system = transport.broker(),
        messaging.consumer.group.name = %consumer.name,
        messaging.source.name = %transport.source(),
    );
    crate::metrics::describe();
    let driver = Driver { consumer, transport, permits: Semaphore::new(consumer.config.concurrency), shutdown };
    driver.run().instrument(span).await
}

/// A fetch in progress: when it started, and what the broker returned.
type Fetch<'a, R> = BoxFuture<'a, (Instant, Result<Vec<Delivery<R>>>)>;

struct Driver<'a, T> {
    consumer: &'a Consumer,
    transport: &'a T,
    permits: Semaphore,
    shutdown: CancellationToken,
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
        tracing::info!(handles = ?self.consumer.event_types(), "consumer started");
        // A lane per aggregate: present while its head message is running; the queue holds the messages
        // behind it, in delivery order.
        let mut lanes: HashMap<String, VecDeque<Delivery<T::Receipt>>> = HashMap::new();
        let mut running: FuturesUnordered<BoxFuture<'_, String>> = FuturesUnordered::new();
        let mut fetch: Option<Fetch<'_, T::Receipt>> = None;
        let mut held = 0usize;
        let mut pause = Duration::ZERO;
        let mut fetch_failures = 0u32;
        let mut anonymous = 0u64;
        let mut stopping = false;
        loop {
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
                }
                Some(lane) = running.next(), if !running.is_empty() => {
                    held -= 1;
                    let next = lanes.get_mut(&lane).and_then(VecDeque::pop_front);
                    match next {
                        Some(delivery) if !stopping => running.push(Box::pin(self.settle(delivery, lane))),
                        Some(delivery) => {
                            let rest = lanes.remove(&lane).unwrap_or_default();
                            held -= 1 + rest.len();
                            for delivery in std::iter::once(delivery).chain(rest) {
                                self.release(&delivery).await;
                            }
                        }
                        None => {
                            lanes.remove(&lane);
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
                                match lanes.get_mut(&lane) {
                                    Some(queue) => queue.push_back(delivery),
                                    None => {
                                        lanes.insert(lane.clone(), VecDeque::new());
                                        running.push(Box::pin(self.settle(delivery, lane)));
                                    }
                                }
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

    /// Takes one message to its end: acked (applied, duplicate, skipped, dead-lettered) or released
    /// (shutdown). Returns its lane.
    async fn settle(&self, delivery: Delivery<T::Receipt>, lane: String) -> String {
        let span = crate::telemetry::process_span(
            self.transport.broker(),
            &self.consumer.name,
            &delivery.origin,
            &delivery.headers,
            delivery.deliveries,
        );
        self.settle_in_span(delivery, lane).instrument(span).await
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
                let started = Instant::now();
                let limit = self.consumer.config.handler_timeout;
                let call = route.attempt(event.clone(), previous + failures + 1);
                let attempt = match tokio::time::timeout(limit, call).await {
                    Ok(attempt) => attempt,
                    // Dropping the call rolls back the transaction it had open.
                    Err(_) => {
                        Counters::add(&self.counters().timed_out);
                        Attempt::Failed(format!(
                            "the handler did not finish within {limit:?} (handler_timeout); abandoned, its transaction rolled back"
                        ))
                    }
                };
                crate::metrics::handler_duration(&self.consumer.name, &event.event_type, started.elapsed());
                attempt
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
            if !self.hold(delivery, reason).await {
                return self.release(delivery).await;
            }
        }
    }

    /// Publishes the dead letter until the broker confirms it, then acks the original; on shutdown before
    /// a confirmation, releases it instead.
    async fn dead_letter(&self, delivery: &Delivery<T::Receipt>, reason: String, attempts: u32) {
        let letter =
            DeadLetter { reason, attempts, consumer: self.consumer.name.clone(), origin: delivery.origin.clone() };
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
                    if !self.hold(delivery, pause).await {
                        return self.release(delivery).await;
                    }
                }
            }
        }
    }

    /// Waits `pause` while keeping the message alive at the broker; `false` when shutdown came first.
    async fn hold(&self, delivery: &Delivery<T::Receipt>, pause: Duration) -> bool {
        let until = tokio::time::Instant::now() + pause;
        let every = self.transport.keep_alive_every();
        loop {
            let now = tokio::time::Instant::now();
            if now >= until {
                return true;
            }
            let step = every.map_or(until - now, |every| every.min(until - now));
            tokio::select! {
                () = self.shutdown.cancelled() => return false,
                () = tokio::time::sleep(step) => {}
            }
            if every.is_some()
                && tokio::time::Instant::now() < until
                && let Err(error) = self.transport.keep_alive(&delivery.receipt).await
            {
                tracing::debug!(%error, "keep-alive failed; the broker may redeliver the message (the inbox absorbs it)");
            }
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

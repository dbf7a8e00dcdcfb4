//! The consume side: one driver for every broker.
//!
//! A [`Consumer`] names a subscriber (its inbox key) and maps event types to typed handlers; its
//! [`run`](Consumer::run) drives any broker [`Transport`]: fetch → decode the envelope → route by event
//! type → handler (inbox dedup + effect, one transaction) → ack after the commit. Nothing is acked unless
//! it was applied, skipped as not this consumer's, or confirmed in the dead-letter destination:
//!
//! | the message | what the driver does |
//! |---|---|
//! | applied, or a duplicate the inbox absorbed | ack |
//! | handler error or panic | retry in place after a backoff; after `max_deliveries`, dead-letter, then ack |
//! | newer schema version than this code decodes | retry in place after a backoff, never dead-lettered: deploy the new code |
//! | event type with no handler here | ack without running anything (counted as skipped, logged at debug) |
//! | no valid envelope, payload over the limit, undecodable payload, version older than any upcaster | dead-letter at once, then ack |
//! | dead-letter publish not confirmed | not acked; the dead letter is retried after a backoff |
//!
//! **Order.** Messages are processed in lanes, one per aggregate: a message waiting for a retry holds every
//! later message of its aggregate behind it (in memory, kept alive at the broker), while other aggregates
//! go on. So within one consumer, first applications follow the broker's delivery order per aggregate.
//!
//! **Shutdown.** Cancelling the token stops fetching; handlers running finish, messages waiting for a
//! retry or not started are released to the broker (in order, after the message ahead of them settled),
//! then [`run`](Consumer::run) returns.

mod dead_letters;
mod driver;
mod group;
#[cfg(any(feature = "nats", feature = "redis"))]
pub(crate) mod held;
mod route;
mod transport;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use dead_letters::{DeadFilter, DeadLetterAction, DeadLetterEntry, DeadLetterOutcome, DeadLetters};
pub use group::{AloneCall, GroupCalls, GroupCommit, GroupKeys, GroupOutcome};
pub use route::{BatchHandler, EventHandler, Handled, Received};
pub use transport::{DeadLetter, Delivery, Lag, MAX_DEAD_REASON_LEN, Replayable, Transport, dead_header, replayable};

use crate::config::Backoff;
use crate::envelope::DEFAULT_MAX_PAYLOAD_BYTES;
use crate::error::{Error, Result};
use crate::event::DomainEvent;
use crate::inbox::MAX_CONSUMER_LEN;
use route::{Route, Typed, TypedBatch};

/// Consumer settings. [`ConsumerConfig::validate`] runs in [`Consumer::run`], before its first fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Deliveries of a failing message before it is dead-lettered (default 10; at least 1). Messages of a
    /// newer schema version never count towards it.
    pub max_deliveries: u32,
    /// Delays between retries of one message (default 200 ms doubling to 30 s, jittered).
    pub backoff: Backoff,
    /// Most messages asked of the broker at once (default 64).
    pub batch_size: usize,
    /// Most messages held at once, running, waiting for a retry or queued behind one (default 512);
    /// fetching pauses at this bound.
    pub max_in_flight: usize,
    /// Most handlers running at once, one per aggregate (default 16).
    pub concurrency: usize,
    /// How long one fetch waits for messages when none is ready (default 1 s).
    pub fetch_wait: Duration,
    /// Largest payload handed to a handler; a bigger one is dead-lettered (default 1 MiB).
    pub max_payload_bytes: usize,
    /// How long one handler call may run (default 30 s). Past it the call is abandoned (dropped, so its
    /// database transaction rolls back), counted in [`ConsumerStats::timed_out`] and retried like a
    /// failure; it also bounds how long shutdown waits for a running handler.
    pub handler_timeout: Duration,
    /// Most messages applied in one transaction when the consumer has a [`GroupCommit`] (default 64, one
    /// fetch of the default [`batch_size`](Self::batch_size); 1 applies each message in its own
    /// transaction). A group starts at once when nothing else runs, so a quiet consumer never waits to
    /// fill one; while a group runs, another starts when it is full or has waited 10 ms, so what arrives
    /// meanwhile fills it.
    pub group_size: usize,
    /// How often the running consumer reads its lag at the broker ([`Transport::lag`]) into the
    /// [`CONSUMER_LAG`](crate::metrics::CONSUMER_LAG) gauge (default 15 s; at least 1 s).
    pub lag_interval: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            max_deliveries: 10,
            backoff: Backoff { initial: Duration::from_millis(200), max: Duration::from_secs(30), multiplier: 2 },
            batch_size: 64,
            max_in_flight: 512,
            concurrency: 16,
            fetch_wait: Duration::from_secs(1),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            handler_timeout: Duration::from_secs(30),
            group_size: 64,
            lag_interval: Duration::from_secs(15),
        }
    }
}

impl ConsumerConfig {
    /// Checks every bound; the error names the setting.
    pub fn validate(&self) -> Result<()> {
        if self.max_deliveries == 0 {
            return Err(Error::invalid_config(
                "max_deliveries",
                "is 0; a message needs at least one delivery (use 1 to dead-letter on the first failure)",
            ));
        }
        if self.backoff.initial.is_zero() || self.backoff.max < self.backoff.initial {
            return Err(Error::invalid_config("backoff", "needs a non-zero initial delay not above its max"));
        }
        if self.backoff.max > Duration::from_secs(24 * 3600) {
            return Err(Error::invalid_config("backoff", "max is over a day"));
        }
        if self.batch_size == 0 || self.concurrency == 0 {
            return Err(Error::invalid_config("batch_size", "and `concurrency` must be at least 1"));
        }
        if self.max_in_flight < self.batch_size {
            return Err(Error::invalid_config("max_in_flight", "must be at least `batch_size`"));
        }
        if self.fetch_wait.is_zero() || self.fetch_wait > Duration::from_secs(300) {
            return Err(Error::invalid_config("fetch_wait", "must be between 1 ms and 5 minutes"));
        }
        if self.max_payload_bytes == 0 {
            return Err(Error::invalid_config("max_payload_bytes", "is 0"));
        }
        if self.group_size == 0 || self.group_size > 10_000 {
            return Err(Error::invalid_config("group_size", "must be between 1 and 10000 (1 turns grouping off)"));
        }
        if self.lag_interval < Duration::from_secs(1) {
            return Err(Error::invalid_config("lag_interval", "must be at least 1 s"));
        }
        if self.handler_timeout.is_zero() || self.handler_timeout > Duration::from_secs(24 * 3600) {
            return Err(Error::invalid_config("handler_timeout", "must be between 1 ms and a day"));
        }
        Ok(())
    }

    /// Sets [`max_deliveries`](Self::max_deliveries).
    pub fn with_max_deliveries(mut self, deliveries: u32) -> Self {
        self.max_deliveries = deliveries;
        self
    }

    /// Sets [`backoff`](Self::backoff).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets [`fetch_wait`](Self::fetch_wait).
    pub fn with_fetch_wait(mut self, wait: Duration) -> Self {
        self.fetch_wait = wait;
        self
    }

    /// Sets [`batch_size`](Self::batch_size).
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Sets [`max_in_flight`](Self::max_in_flight).
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight;
        self
    }

    /// Sets [`max_payload_bytes`](Self::max_payload_bytes).
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Sets [`concurrency`](Self::concurrency).
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Sets [`group_size`](Self::group_size).
    pub fn with_group_size(mut self, size: usize) -> Self {
        self.group_size = size;
        self
    }

    /// Sets [`handler_timeout`](Self::handler_timeout).
    pub fn with_handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// Sets [`lag_interval`](Self::lag_interval).
    pub fn with_lag_interval(mut self, every: Duration) -> Self {
        self.lag_interval = every;
        self
    }
}

/// What a consumer did so far; read with [`Consumer::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Messages whose effect ran and committed.
    pub processed: u64,
    /// Messages the inbox had seen already.
    pub duplicates: u64,
    /// Messages of event types this consumer has no handler for, acked untouched.
    pub skipped: u64,
    /// Failed attempts that were retried.
    pub retried: u64,
    /// Attempts at messages of a newer schema version, retried later.
    pub newer_version: u64,
    /// Messages confirmed in the dead-letter destination.
    pub dead_lettered: u64,
    /// Messages handed back to the broker unprocessed (shutdown).
    pub released: u64,
    /// Acks the broker did not take (the message comes back; the inbox absorbs it).
    pub ack_failures: u64,
    /// Handler calls abandoned after [`ConsumerConfig::handler_timeout`] (each also counts as retried, or
    /// ends in a dead letter when it was the last delivery allowed).
    pub timed_out: u64,
    /// Groups committed with a [`GroupCommit`] (their messages count in `processed` and `duplicates`).
    pub groups: u64,
    /// Groups rolled back because one of their handlers failed, or whose commit failed: their messages ran
    /// again alone.
    pub group_rollbacks: u64,
}

#[derive(Debug, Default)]
struct Counters {
    processed: AtomicU64,
    duplicates: AtomicU64,
    skipped: AtomicU64,
    retried: AtomicU64,
    newer_version: AtomicU64,
    dead_lettered: AtomicU64,
    released: AtomicU64,
    ack_failures: AtomicU64,
    timed_out: AtomicU64,
    groups: AtomicU64,
    group_rollbacks: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ConsumerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ConsumerStats {
            processed: get(&self.processed),
            duplicates: get(&self.duplicates),
            skipped: get(&self.skipped),
            retried: get(&self.retried),
            newer_version: get(&self.newer_version),
            dead_lettered: get(&self.dead_lettered),
            released: get(&self.released),
            ack_failures: get(&self.ack_failures),
            timed_out: get(&self.timed_out),
            groups: get(&self.groups),
            group_rollbacks: get(&self.group_rollbacks),
        }
    }
}

/// A named subscriber with one typed handler per event type.
///
/// ```no_run
/// # use outbox_runtime::{Consumer, Received, DomainEvent};
/// # fn demo<P: DomainEvent, C: DomainEvent>() -> outbox_runtime::Result<()> {
/// let consumer = Consumer::new("billing")
///     .on::<P>(async |placed: Received<P>| -> Result<(), std::io::Error> { /* bill */ Ok(()) })
///     .on::<C>(async |cancelled: Received<C>| -> Result<(), std::io::Error> { /* refund */ Ok(()) });
/// # Ok(()) }
/// ```
pub struct Consumer {
    name: Arc<str>,
    config: ConsumerConfig,
    routes: HashMap<&'static str, Box<dyn Route>>,
    group: Option<Box<dyn GroupCommit>>,
    counters: Arc<Counters>,
    /// The last lag the running consumer read at its broker.
    lag: std::sync::Mutex<Option<Lag>>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut types: Vec<_> = self.routes.keys().collect();
        types.sort();
        f.debug_struct("Consumer")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("handles", &types)
            .field("group_commit", &self.group.is_some())
            .finish()
    }
}

impl Consumer {
    /// A consumer named `name` with the default [`ConsumerConfig`] and no handlers yet. The name is its
    /// inbox key, handed to each handler with each message ([`Received::consumer`]): non-empty, at most
    /// 128 bytes, no control characters, checked by [`run`](Self::run) with the settings.
    pub fn new(name: &str) -> Self {
        Consumer {
            name: Arc::from(name),
            config: ConsumerConfig::default(),
            routes: HashMap::new(),
            group: None,
            counters: Arc::default(),
            lag: std::sync::Mutex::new(None),
        }
    }

    /// Replaces the settings ([`Consumer::run`] checks them before its first fetch).
    pub fn with_config(mut self, config: ConsumerConfig) -> Self {
        self.config = config;
        self
    }

    /// Handles events of type `E` (every stored version `E` upcasts from) with `handler`. A second
    /// handler for the same event name replaces the first.
    pub fn on<E: DomainEvent>(mut self, handler: impl EventHandler<E>) -> Self {
        if self.routes.insert(E::NAME, Box::new(Typed::<E, _>::new(Arc::clone(&self.name), handler))).is_some() {
            tracing::warn!(consumer = %self.name, event_type = E::NAME, "a second handler replaced the first");
        }
        self
    }

    /// Handles events of type `E` with `handler`, several at once: inside a group commit, the events of
    /// type `E` that are next to each other in the group (up to [`ConsumerConfig::group_size`], several
    /// aggregates', each aggregate's in order) go to one call, so that their effects can be written in one
    /// statement (with `outbox-seaorm`: `handle_batch_once`). Without a group commit, or when a group
    /// rolled back and its messages run alone, each call holds one event.
    ///
    /// A failing call fails every event of its batch: the group rolls back and its messages run again
    /// alone, so a poison event is retried and dead-lettered by itself. A second handler for the same event
    /// name, batched or not, replaces the first.
    ///
    /// ```no_run
    /// # use outbox_runtime::{Consumer, Handled, Received, DomainEvent};
    /// # fn demo<P: DomainEvent>() -> outbox_runtime::Result<()> {
    /// let consumer = Consumer::new("billing").on_batch::<P>(async |placed: Vec<Received<P>>| {
    ///     /* bill them all in one statement */
    ///     Ok::<_, std::io::Error>(vec![Handled::Processed; placed.len()])
    /// });
    /// # Ok(()) }
    /// ```
    pub fn on_batch<E: DomainEvent>(mut self, handler: impl BatchHandler<E>) -> Self {
        if self.routes.insert(E::NAME, Box::new(TypedBatch::<E, _>::new(Arc::clone(&self.name), handler))).is_some() {
            tracing::warn!(consumer = %self.name, event_type = E::NAME, "a second handler replaced the first");
        }
        self
    }

    /// Applies messages in groups, each in one transaction committed once (see [`GroupCommit`]): up to
    /// [`ConsumerConfig::group_size`] messages per commit instead of one. Per-aggregate order and
    /// exactly-once effects hold as without it; acks follow the group's commit.
    ///
    /// ```no_run
    /// # use outbox_runtime::consume::{GroupCalls, GroupCommit, GroupKeys, GroupOutcome};
    /// # struct Db; impl GroupCommit for Db { fn run<'a>(&'a self, _: &'a GroupKeys, c: GroupCalls<'a>) -> GroupOutcome<'a> { Box::pin(async { Ok(c.await) }) } }
    /// # fn demo(db: Db) -> outbox_runtime::Result<()> {
    /// // With outbox-seaorm: `.with_group_commit(SeaOrmGroupCommit::new(db.clone()))`.
    /// let consumer = outbox_runtime::Consumer::new("billing").with_group_commit(db);
    /// # Ok(()) }
    /// ```
    pub fn with_group_commit(mut self, group: impl GroupCommit) -> Self {
        self.group = Some(Box::new(group));
        self
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The settings.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// The event types this consumer handles, sorted.
    pub fn event_types(&self) -> Vec<&'static str> {
        let mut types: Vec<_> = self.routes.keys().copied().collect();
        types.sort_unstable();
        types
    }

    /// Counts since the consumer was built.
    pub fn stats(&self) -> ConsumerStats {
        self.counters.snapshot()
    }

    /// The last lag the running consumer read at its broker (every
    /// [`ConsumerConfig::lag_interval`]); `None` before the first reading or when the broker cannot say.
    pub fn lag(&self) -> Option<Lag> {
        *self.lag.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Consumes from `transport` until `shutdown` is cancelled (see the [module docs](self)). Fetch errors
    /// are logged and retried with a backoff: the broker being down is not an error of `run`.
    pub async fn run<T: Transport>(&self, transport: &T, shutdown: crate::CancellationToken) -> Result<()> {
        crate::envelope::check_name("consumer", &self.name, MAX_CONSUMER_LEN)
            .map_err(|e| Error::invalid_config("consumer", e.to_string()))?;
        self.config.validate()?;
        driver::run(self, transport, shutdown).await
    }
}

#[cfg(test)]
mod tests;

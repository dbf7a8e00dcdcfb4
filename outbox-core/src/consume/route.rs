//! Typed handlers, one per event type: decoding and upcasting before the handler runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::FutureExt as _;

use crate::envelope::OutboxEvent;
use crate::error::{BoxError, Error};
use crate::event::DomainEvent;
use crate::inbox::InboxOutcome;

/// An event handed to a handler: the decoded (and upcast) event, the envelope it came in, and the consumer
/// it was delivered to (the inbox key's first half, so a handler never names its consumer again).
#[derive(Clone, Debug)]
pub struct Received<E> {
    /// The event, decoded at the version this code knows.
    pub event: E,
    /// The envelope: id (the inbox key), time, headers, aggregate, stored schema version.
    pub envelope: OutboxEvent,
    /// Deliveries of this message so far, this one included.
    pub delivery: u32,
    /// The name of the consumer it was delivered to ([`Consumer::name`](super::Consumer::name)).
    pub consumer: Arc<str>,
}

impl<E: DomainEvent> Received<E> {
    /// Decodes (and upcasts) `envelope` for `consumer`, as the consume driver does before a handler runs:
    /// for tests and hand-written loops that call a handler themselves. `delivery` counts from 1.
    pub fn decode(consumer: &str, envelope: OutboxEvent, delivery: u32) -> crate::Result<Self> {
        let event = E::from_envelope(&envelope)?;
        Ok(Received { event, envelope, delivery, consumer: Arc::from(consumer) })
    }
}

/// What a handler did with an event it accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    /// Its effect ran and committed.
    Processed,
    /// The inbox had seen it already: the effect did not run again.
    Duplicate,
}

impl From<()> for Handled {
    fn from((): ()) -> Self {
        Handled::Processed
    }
}

impl<T> From<InboxOutcome<T>> for Handled {
    fn from(outcome: InboxOutcome<T>) -> Self {
        match outcome {
            InboxOutcome::Processed(_) => Handled::Processed,
            InboxOutcome::Duplicate => Handled::Duplicate,
        }
    }
}

/// A handler of events of type `E`: returns once the effect committed (or was found a duplicate); an
/// error means nothing was applied and the message is retried.
///
/// Implemented for async closures `Fn(Received<E>) -> impl Future<Output = Result<O, Err>>` where `O` is
/// `()`, [`Handled`] or an [`InboxOutcome`] and `Err` any error type, so an `#[idempotent_handler]`
/// (which returns `Result<InboxOutcome<T>, InboxError<E>>`) fits as it is.
pub trait EventHandler<E>: Send + Sync + 'static {
    /// Handles one event.
    fn handle(&self, received: Received<E>) -> impl Future<Output = Result<Handled, BoxError>> + Send;
}

impl<E, F, Fut, O, Err> EventHandler<E> for F
where
    F: Fn(Received<E>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, Err>> + Send,
    O: Into<Handled>,
    Err: Into<BoxError>,
{
    fn handle(&self, received: Received<E>) -> impl Future<Output = Result<Handled, BoxError>> + Send {
        let future = self(received);
        async move { future.await.map(Into::into).map_err(Into::into) }
    }
}

/// A handler of several events of type `E` at once: the events of one group that are next to each other
/// in it (see [`Consumer::on_batch`](super::Consumer::on_batch)), so that their effects can be one
/// statement instead of one each. Returns what it did with each event, in the batch's order, once the
/// effects committed (or joined the group's transaction); an error means none of them was applied.
///
/// Implemented for async closures `Fn(Vec<Received<E>>) -> impl Future<Output = Result<O, Err>>` where `O`
/// iterates over [`Handled`] or [`InboxOutcome`] values (one per event), so `outbox-seaorm`'s
/// `handle_batch_once` fits as it is.
pub trait BatchHandler<E>: Send + Sync + 'static {
    /// Handles the events of one batch, in order.
    fn handle(&self, batch: Vec<Received<E>>) -> impl Future<Output = Result<Vec<Handled>, BoxError>> + Send;
}

impl<E, F, Fut, O, Err> BatchHandler<E> for F
where
    F: Fn(Vec<Received<E>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, Err>> + Send,
    O: IntoIterator<Item: Into<Handled>>,
    Err: Into<BoxError>,
{
    fn handle(&self, batch: Vec<Received<E>>) -> impl Future<Output = Result<Vec<Handled>, BoxError>> + Send {
        let future = self(batch);
        async move { future.await.map(|handled| handled.into_iter().map(Into::into).collect()).map_err(Into::into) }
    }
}

/// What one attempt at a message came to.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Applied or a duplicate: ack.
    Done(Handled),
    /// The handler failed or panicked: retry after a backoff, dead-letter after `max_deliveries`.
    Failed(String),
    /// Written by newer code than this consumer: keep it, retry after a backoff, never dead-letter.
    Newer(String),
    /// Can never be processed by any version of this code: dead-letter at once.
    Poison(String),
    /// The handler reported a configuration error ([`Error::InvalidConfig`]): no retry can succeed and no
    /// message is at fault, so the consumer stops with that error and the message goes back to the broker.
    Misconfigured(String),
}

impl Attempt {
    /// Why the attempt did not end in `Done` (empty when it did).
    pub(crate) fn reason(&self) -> &str {
        match self {
            Attempt::Done(_) => "",
            Attempt::Failed(reason)
            | Attempt::Newer(reason)
            | Attempt::Poison(reason)
            | Attempt::Misconfigured(reason) => reason,
        }
    }
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A message decoded by a batched route, waiting for its batch: a `Received<E>` of the route's `E`.
pub(crate) type Decoded = Box<dyn std::any::Any + Send>;

/// The type-erased handler of one event type.
pub(crate) trait Route: Send + Sync {
    /// One message, decoded and handled.
    fn attempt<'a>(&'a self, envelope: OutboxEvent, delivery: u32) -> BoxFuture<'a, Attempt>;

    /// The route's batch side, when its handler takes several messages at once: the driver then decodes a
    /// group's messages one by one and hands those next to each other to one handler call.
    fn batch(&self) -> Option<&dyn BatchRoute> {
        None
    }
}

/// The batch side of a route whose handler takes several messages at once.
pub(crate) trait BatchRoute: Send + Sync {
    /// Decodes a message for a batch; `Err` is the attempt it came to without running (newer, poison).
    fn decode(&self, envelope: OutboxEvent, delivery: u32) -> Result<Decoded, Attempt>;

    /// One handler call for messages this route decoded: what it did with each, in order, or why it failed
    /// (then none of them was applied): [`Attempt::Failed`] or [`Attempt::Misconfigured`].
    fn attempt_batch<'a>(&'a self, batch: Vec<Decoded>) -> BoxFuture<'a, Result<Vec<Handled>, Attempt>>;
}

pub(crate) struct Typed<E, H> {
    handler: H,
    consumer: Arc<str>,
    _event: std::marker::PhantomData<fn() -> E>,
}

impl<E, H> Typed<E, H> {
    pub(crate) fn new(consumer: Arc<str>, handler: H) -> Self {
        Typed { handler, consumer, _event: std::marker::PhantomData }
    }
}

impl<E: DomainEvent, H: EventHandler<E>> Route for Typed<E, H> {
    fn attempt<'a>(&'a self, envelope: OutboxEvent, delivery: u32) -> BoxFuture<'a, Attempt> {
        Box::pin(async move {
            let received = match received::<E>(&self.consumer, envelope, delivery) {
                Ok(received) => received,
                Err(attempt) => return attempt,
            };
            caught(self.handler.handle(received)).await.map_or_else(|attempt| attempt, Attempt::Done)
        })
    }
}

/// A [`BatchHandler`]'s route.
pub(crate) struct TypedBatch<E, H> {
    handler: H,
    consumer: Arc<str>,
    _event: std::marker::PhantomData<fn() -> E>,
}

impl<E, H> TypedBatch<E, H> {
    pub(crate) fn new(consumer: Arc<str>, handler: H) -> Self {
        TypedBatch { handler, consumer, _event: std::marker::PhantomData }
    }
}

impl<E: DomainEvent, H: BatchHandler<E>> Route for TypedBatch<E, H> {
    fn attempt<'a>(&'a self, envelope: OutboxEvent, delivery: u32) -> BoxFuture<'a, Attempt> {
        Box::pin(async move {
            let decoded = match self.decode(envelope, delivery) {
                Ok(decoded) => decoded,
                Err(attempt) => return attempt,
            };
            match self.attempt_batch(vec![decoded]).await.map(|handled| handled.into_iter().next()) {
                Ok(Some(handled)) => Attempt::Done(handled),
                Ok(None) => Attempt::Failed("the batch handler returned no outcome for its one event".to_owned()),
                Err(attempt) => attempt,
            }
        })
    }

    fn batch(&self) -> Option<&dyn BatchRoute> {
        Some(self)
    }
}

impl<E: DomainEvent, H: BatchHandler<E>> BatchRoute for TypedBatch<E, H> {
    fn decode(&self, envelope: OutboxEvent, delivery: u32) -> Result<Decoded, Attempt> {
        received::<E>(&self.consumer, envelope, delivery).map(|received| Box::new(received) as Decoded)
    }

    fn attempt_batch<'a>(&'a self, batch: Vec<Decoded>) -> BoxFuture<'a, Result<Vec<Handled>, Attempt>> {
        Box::pin(async move {
            let events = batch.len();
            let batch: Vec<Received<E>> = batch
                .into_iter()
                .filter_map(|decoded| decoded.downcast::<Received<E>>().ok().map(|received| *received))
                .collect();
            if batch.len() != events {
                return Err(Attempt::Failed("a message decoded for another event type reached this batch".to_owned()));
            }
            let handled = caught(self.handler.handle(batch)).await?;
            if handled.len() != events {
                return Err(Attempt::Failed(format!(
                    "the batch handler returned {} outcomes for {events} events (one per event, in order)",
                    handled.len()
                )));
            }
            Ok(handled)
        })
    }
}

/// Decodes (and upcasts) a message for a handler of `E`; `Err` is what the attempt came to without one.
fn received<E: DomainEvent>(consumer: &Arc<str>, envelope: OutboxEvent, delivery: u32) -> Result<Received<E>, Attempt> {
    match E::from_envelope(&envelope) {
        Ok(event) => Ok(Received { event, envelope, delivery, consumer: Arc::clone(consumer) }),
        Err(error @ Error::UnsupportedVersion { version, newest, .. }) if version > newest => {
            Err(Attempt::Newer(error.to_string()))
        }
        Err(error) => Err(Attempt::Poison(error.to_string())),
    }
}

/// Runs a handler call, turning its error or panic into the reason a retry or dead letter carries
/// ([`Attempt::Failed`]), or, for a configuration error, [`Attempt::Misconfigured`].
async fn caught<T>(call: impl Future<Output = Result<T, BoxError>>) -> Result<T, Attempt> {
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(Ok(value)) => Ok(value),
        // Handler errors reach logs and dead-letter headers: credentials in them never do.
        Ok(Err(error)) => {
            let reason = crate::text::redact_secrets(&error_chain(&*error));
            Err(if misconfigured(&*error) { Attempt::Misconfigured(reason) } else { Attempt::Failed(reason) })
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic".to_owned());
            Err(Attempt::Failed(crate::text::redact_secrets(&format!("the handler panicked: {message}"))))
        }
    }
}

/// Whether `error` or one of its sources is an [`Error::InvalidConfig`].
fn misconfigured(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if matches!(error.downcast_ref::<Error>(), Some(Error::InvalidConfig { .. })) {
            return true;
        }
        next = error.source();
    }
    false
}

/// `error` and its sources, `outer: inner: innermost`.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = inner.source();
    }
    text
}

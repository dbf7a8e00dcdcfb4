//! Typed handlers, one per event type: decoding and upcasting before the handler runs.

use std::future::Future;
use std::pin::Pin;

use futures_util::FutureExt as _;

use crate::envelope::OutboxEvent;
use crate::error::{BoxError, Error};
use crate::event::DomainEvent;
use crate::inbox::InboxOutcome;

/// An event handed to a handler: the decoded (and upcast) event and the envelope it came in.
#[derive(Clone, Debug)]
pub struct Received<E> {
    /// The event, decoded at the version this code knows.
    pub event: E,
    /// The envelope: id (the inbox key), time, headers, aggregate, stored schema version.
    pub envelope: OutboxEvent,
    /// Deliveries of this message so far, this one included.
    pub delivery: u32,
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
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The type-erased handler of one event type.
pub(crate) trait Route: Send + Sync {
    fn attempt<'a>(&'a self, envelope: OutboxEvent, delivery: u32) -> BoxFuture<'a, Attempt>;
}

pub(crate) struct Typed<E, H> {
    handler: H,
    _event: std::marker::PhantomData<fn() -> E>,
}

impl<E, H> Typed<E, H> {
    pub(crate) fn new(handler: H) -> Self {
        Typed { handler, _event: std::marker::PhantomData }
    }
}

impl<E: DomainEvent, H: EventHandler<E>> Route for Typed<E, H> {
    fn attempt<'a>(&'a self, envelope: OutboxEvent, delivery: u32) -> BoxFuture<'a, Attempt> {
        Box::pin(async move {
            let event = match E::from_envelope(&envelope) {
                Ok(event) => event,
                Err(error @ Error::UnsupportedVersion { version, newest, .. }) if version > newest => {
                    return Attempt::Newer(error.to_string());
                }
                Err(error) => return Attempt::Poison(error.to_string()),
            };
            let received = Received { event, envelope, delivery };
            match std::panic::AssertUnwindSafe(self.handler.handle(received)).catch_unwind().await {
                Ok(Ok(handled)) => Attempt::Done(handled),
                // Handler errors reach logs and dead-letter headers: credentials in them never do.
                Ok(Err(error)) => Attempt::Failed(crate::text::redact_secrets(&error_chain(&*error))),
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a non-string panic".to_owned());
                    Attempt::Failed(crate::text::redact_secrets(&format!("the handler panicked: {message}")))
                }
            }
        })
    }
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

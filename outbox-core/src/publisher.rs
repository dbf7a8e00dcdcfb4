//! The broker side of the relay: a [`Publisher`] sends a batch and reports, per event, whether the broker
//! confirmed it. The relay marks a row published only after that confirmation.

use std::future::Future;

use crate::envelope::OutboxEvent;

/// Why one event was not confirmed by the broker. The message becomes the row's `last_error` and appears in
/// logs, so credentials in it (URL user info, `password=` settings) are replaced by `***` on construction.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PublishError {
    message: String,
    permanent: bool,
}

impl PublishError {
    /// A failure worth retrying later (broker down, timeout, lost ack).
    pub fn transient(message: impl Into<String>) -> Self {
        PublishError { message: crate::text::redact_secrets(&message.into()), permanent: false }
    }

    /// A failure no retry can fix (payload over the broker's size limit, invalid destination): the event
    /// goes straight to the dead letters with this message as its `last_error`.
    pub fn permanent(message: impl Into<String>) -> Self {
        PublishError { message: crate::text::redact_secrets(&message.into()), permanent: true }
    }

    /// Whether a retry cannot help.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The message recorded as the row's `last_error`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Sends events to a broker.
///
/// The returned vector has one entry per input event, in the same order: `Ok` only once the broker has
/// acknowledged that event durably. Events of one aggregate never share a call: the relay sends an
/// aggregate's run one event per call (in waves across aggregates) and the next only after this one was
/// confirmed, so an implementation may publish a call's events concurrently without breaking order.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox publisher",
    note = "implement `outbox_runtime::Publisher` for it, or use one of the broker adapters"
)]
pub trait Publisher: Send + Sync {
    /// Publishes `events`, returning one result per event.
    fn publish(&self, events: &[OutboxEvent]) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send;

    /// The broker's name as OpenTelemetry's `messaging.system` (`kafka`, `rabbitmq`, `nats`, `redis`, …),
    /// put on the relay's `outbox.relay.publish` span. Defaults to `"unknown"`.
    fn system(&self) -> &'static str {
        "unknown"
    }

    /// Where `event` goes (subject, topic, routing key, stream key) as OpenTelemetry's
    /// `messaging.destination.name`, put on the relay's publish span when every event of the call goes to
    /// the same place. Only called while that span is enabled. Defaults to `None`.
    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        let _ = event;
        None
    }
}

impl<P: Publisher> Publisher for std::sync::Arc<P> {
    fn publish(&self, events: &[OutboxEvent]) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send {
        (**self).publish(events)
    }

    fn system(&self) -> &'static str {
        (**self).system()
    }

    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        (**self).destination_name(event)
    }
}

impl<P: Publisher> Publisher for &P {
    fn publish(&self, events: &[OutboxEvent]) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send {
        (**self).publish(events)
    }

    fn system(&self) -> &'static str {
        (**self).system()
    }

    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        (**self).destination_name(event)
    }
}

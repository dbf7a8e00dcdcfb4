//! The spans the relay and the consume driver open, with OpenTelemetry messaging attribute names
//! (`messaging.*`, `otel.kind`), so a `tracing-opentelemetry` layer exports them as producer and consumer
//! spans without a mapping.

use std::collections::BTreeMap;

use crate::broker::header;
use crate::envelope::OutboxEvent;
use crate::publisher::Publisher;
use crate::text::one_line;

/// `outbox.relay.publish`: one publish call of the relay (a wave, at most one event per aggregate).
///
/// With the `opentelemetry` feature it links to the trace context each event was written in.
pub(crate) fn publish_span<P: Publisher>(publisher: &P, events: &[OutboxEvent]) -> tracing::Span {
    let span = tracing::info_span!(
        "outbox.relay.publish",
        otel.kind = "producer",
        messaging.system = publisher.system(),
        messaging.operation.type = "send",
        messaging.operation.name = "publish",
        messaging.batch.message_count = events.len(),
        messaging.message.id = tracing::field::Empty,
        messaging.destination.name = tracing::field::Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let [event] = events {
        span.record("messaging.message.id", tracing::field::display(event.id));
    }
    let mut destinations = events.iter().map(|event| publisher.destination_name(event));
    if let Some(Some(first)) = destinations.next()
        && destinations.all(|other| other.as_deref() == Some(first.as_str()))
    {
        span.record("messaging.destination.name", first.as_str());
    }
    #[cfg(feature = "opentelemetry")]
    crate::trace_context::link_events(&span, events);
    span
}

/// `outbox.consume.process`: one delivery taken to its end by the consume driver. With the `opentelemetry`
/// feature its parent is the span whose context the message's `traceparent` carries (the one the event was
/// written in), so the handler's spans join the producer's trace.
pub(crate) fn process_span(
    system: &'static str,
    consumer: &str,
    origin: &str,
    headers: &BTreeMap<String, String>,
    deliveries: u32,
) -> tracing::Span {
    let id = headers.get(header::ID).map_or_else(String::new, |id| one_line(id));
    let event_type = headers.get(header::TYPE).map_or_else(String::new, |t| one_line(t));
    let span = tracing::info_span!(
        "outbox.consume.process",
        otel.kind = "consumer",
        messaging.system = system,
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.consumer.group.name = consumer,
        messaging.destination.name = %one_line(origin),
        messaging.message.id = %id,
        outbox.event_type = %event_type,
        outbox.deliveries = deliveries,
    );
    #[cfg(feature = "opentelemetry")]
    crate::trace_context::set_parent(&span, headers);
    span
}

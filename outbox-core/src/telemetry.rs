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

/// OpenTelemetry's `messaging.system` id of a broker, from the name a
/// [`Transport::broker`](crate::consume::Transport::broker) gives for logs (`NATS JetStream` is `nats`), so
/// consumer spans carry the same id as the relay's publish spans ([`Publisher::system`]). A name this
/// does not know is kept as it is.
pub(crate) fn messaging_system(broker: &'static str) -> &'static str {
    match broker {
        "NATS JetStream" | "NATS" => "nats",
        "Kafka" => "kafka",
        "RabbitMQ" => "rabbitmq",
        "Redis Streams" | "Redis" => "redis",
        other => other,
    }
}

/// `outbox.consume.process`: one delivery taken to its end by the consume driver. With the `opentelemetry`
/// feature its parent is the span whose context the message's `traceparent` carries (the one the event was
/// written in), so the handler's spans join the producer's trace.
pub(crate) fn process_span(
    broker: &'static str,
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
        messaging.system = messaging_system(broker),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_spans_name_the_broker_as_publish_spans_do() {
        let ids: Vec<_> =
            ["NATS JetStream", "Kafka", "RabbitMQ", "Redis Streams", "memory"].map(messaging_system).into();
        assert_eq!(ids, ["nats", "kafka", "rabbitmq", "redis", "memory"]);
    }
}

//! What every broker adapter shares: where an event goes ([`Destination`]) and the headers that carry its
//! envelope ([`envelope_headers`], [`decode_message`]). The consumer side is [`crate::consume`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::envelope::{EventId, Headers, OutboxEvent};
use crate::error::{Error, Result};
use crate::text::one_line;

/// Header names of the envelope, CloudEvents attribute names (binary content mode) where one fits.
pub mod header {
    /// The event id: the broker's dedup id and the consumer's inbox key.
    pub const ID: &str = "ce_id";
    /// The event name.
    pub const TYPE: &str = "ce_type";
    /// The aggregate id.
    pub const SUBJECT: &str = "ce_subject";
    /// When the event was enqueued, RFC 3339.
    pub const TIME: &str = "ce_time";
    /// Always `1.0`.
    pub const SPECVERSION: &str = "ce_specversion";
    /// The payload's content type, `application/json`.
    pub const CONTENT_TYPE: &str = "content-type";
    /// The aggregate type.
    pub const AGGREGATE_TYPE: &str = "outbox_aggregate_type";
    /// The payload schema version.
    pub const SCHEMA_VERSION: &str = "outbox_schema_version";
    /// The outbox sequence number (diagnostics).
    pub const SEQ: &str = "outbox_seq";
    /// The event's gapless position in its aggregate (1, 2, 3, … in commit order).
    pub const AGGREGATE_VERSION: &str = "outbox_aggregate_version";
}

/// The envelope of `event` as broker headers, followed by its own headers (`traceparent`, user metadata).
pub fn envelope_headers(event: &OutboxEvent) -> Vec<(String, String)> {
    let mut headers = vec![
        (header::SPECVERSION.to_owned(), "1.0".to_owned()),
        (header::ID.to_owned(), event.id.to_string()),
        (header::TYPE.to_owned(), event.event_type.clone()),
        (header::SUBJECT.to_owned(), event.aggregate_id.clone()),
        (header::TIME.to_owned(), event.created_at.to_rfc3339()),
        (header::CONTENT_TYPE.to_owned(), "application/json".to_owned()),
        (header::AGGREGATE_TYPE.to_owned(), event.aggregate_type.clone()),
        (header::SCHEMA_VERSION.to_owned(), event.schema_version.to_string()),
        (header::SEQ.to_owned(), event.seq.to_string()),
        (header::AGGREGATE_VERSION.to_owned(), event.aggregate_version.to_string()),
    ];
    headers.extend(event.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
    headers
}

const ENVELOPE: [&str; 10] = [
    header::SPECVERSION,
    header::ID,
    header::TYPE,
    header::SUBJECT,
    header::TIME,
    header::CONTENT_TYPE,
    header::AGGREGATE_TYPE,
    header::SCHEMA_VERSION,
    header::SEQ,
    header::AGGREGATE_VERSION,
];

/// Rebuilds an [`OutboxEvent`] from received headers and payload bytes. A message without a valid
/// envelope (a missing or malformed header, a control character in any header) is an
/// [`Error::InvalidEvent`]: the consume driver dead-letters it.
pub fn decode_message(headers: &BTreeMap<String, String>, payload: &[u8]) -> Result<OutboxEvent> {
    let get = |name: &'static str| {
        headers
            .get(name)
            .cloned()
            .ok_or_else(|| Error::invalid_event("headers", format!("the message has no `{name}` header")))
    };
    let id: EventId = get(header::ID)?.parse()?;
    let schema_version = get(header::SCHEMA_VERSION)?
        .parse::<i32>()
        .map_err(|e| Error::invalid_event("headers", format!("`{}` is not a number: {e}", header::SCHEMA_VERSION)))?;
    let created_at = match headers.get(header::TIME) {
        None => Utc::now(),
        Some(time) => DateTime::parse_from_rfc3339(time).map(|t| t.with_timezone(&Utc)).map_err(|e| {
            Error::invalid_event(
                "headers",
                format!("`{}` is not an RFC 3339 time ({e}): {:?}", header::TIME, one_line(time)),
            )
        })?,
    };
    for (name, value) in headers {
        if name.chars().chain(value.chars()).any(char::is_control) {
            return Err(Error::invalid_event(
                "headers",
                format!("header {:?} has control characters: {:?}", one_line(name), one_line(value)),
            ));
        }
    }
    let payload = std::str::from_utf8(payload)
        .map_err(|e| Error::invalid_event("payload", format!("is not UTF-8 JSON: {e}")))?
        .to_owned();
    let user: Headers =
        headers.iter().filter(|(k, _)| !ENVELOPE.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    let aggregate_type = get(header::AGGREGATE_TYPE)?;
    let aggregate_id = get(header::SUBJECT)?;
    let event_type = get(header::TYPE)?;
    crate::envelope::check_name("aggregate_type", &aggregate_type, crate::envelope::MAX_AGGREGATE_TYPE_LEN)?;
    crate::envelope::check_name("aggregate_id", &aggregate_id, crate::envelope::MAX_AGGREGATE_ID_LEN)?;
    crate::envelope::check_name("event_type", &event_type, crate::envelope::MAX_EVENT_TYPE_LEN)?;
    Ok(OutboxEvent {
        seq: headers.get(header::SEQ).and_then(|s| s.parse().ok()).unwrap_or(0),
        aggregate_version: headers.get(header::AGGREGATE_VERSION).and_then(|s| s.parse().ok()).unwrap_or(0),
        id,
        aggregate_type,
        aggregate_id,
        event_type,
        schema_version,
        payload,
        headers: user,
        created_at,
        attempts: 0,
        last_error: None,
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    AggregateType,
    AggregateId,
    EventType,
    Version,
}

/// The default destination template of NATS subjects, RabbitMQ routing keys and `outbox relay`: the event
/// type alone, so aggregate `order` with event type `order.placed` goes to `order.placed` (event types
/// name their aggregate, as `#[domain_event(name = "order.placed", aggregate = "order")]` does). Kafka's
/// default is a topic per aggregate type instead, and Redis's a stream per aggregate type.
pub const DEFAULT_DESTINATION: &str = "{event_type}";

/// Where an event goes: a template such as `"{aggregate_type}.{event_type}"` over `{aggregate_type}`,
/// `{aggregate_id}`, `{event_type}` and `{version}`, checked when parsed; each adapter then checks the
/// rendered name against its broker's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    template: String,
    parts: Vec<Part>,
}

impl Destination {
    /// Parses `template`; an unknown or unclosed placeholder is an [`Error::InvalidConfig`].
    pub fn parse(template: &str) -> Result<Self> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| {
                Error::invalid_config("destination", format!("template {template:?} has an unclosed `{{`"))
            })?;
            parts.push(match &after[..close] {
                "aggregate_type" => Part::AggregateType,
                "aggregate_id" => Part::AggregateId,
                "event_type" => Part::EventType,
                "version" => Part::Version,
                other => {
                    return Err(Error::invalid_config(
                        "destination",
                        format!(
                            "template {template:?} has unknown placeholder `{{{other}}}`; expected one of {{aggregate_type}}, {{aggregate_id}}, {{event_type}}, {{version}}"
                        ),
                    ));
                }
            });
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        if parts.is_empty() {
            return Err(Error::invalid_config("destination", "template is empty"));
        }
        Ok(Destination { template: template.to_owned(), parts })
    }

    /// A fixed destination (one topic, queue or stream for every event).
    pub fn fixed(name: &str) -> Result<Self> {
        if name.is_empty() {
            return Err(Error::invalid_config("destination", "is empty"));
        }
        Ok(Destination { template: name.to_owned(), parts: vec![Part::Literal(name.to_owned())] })
    }

    /// The template as written.
    pub fn template(&self) -> &str {
        &self.template
    }

    /// The template rendered with a plain value (`a`, version `1`) in every placeholder: what adapters check
    /// at configuration time, so a template whose fixed parts can never form a valid name is rejected
    /// before any event is published.
    pub fn render_sample(&self) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Version => out.push('1'),
                Part::AggregateType | Part::AggregateId | Part::EventType => out.push('a'),
            }
        }
        out
    }

    /// The destination of `event`.
    pub fn render(&self, event: &OutboxEvent) -> String {
        self.render_for(&event.aggregate_type, &event.aggregate_id, &event.event_type, event.schema_version)
    }

    /// The destination of an event with these fields (what a row's columns hold): where the relay sends it,
    /// for tools that show it without claiming the row.
    pub fn render_for(&self, aggregate_type: &str, aggregate_id: &str, event_type: &str, version: i32) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::AggregateType => out.push_str(aggregate_type),
                Part::AggregateId => out.push_str(aggregate_id),
                Part::EventType => out.push_str(event_type),
                Part::Version => out.push_str(&version.to_string()),
            }
        }
        out
    }
}

pub use crate::text::redact_url;

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OutboxEvent {
        OutboxEvent {
            seq: 7,
            aggregate_version: 3,
            id: EventId::new(),
            aggregate_type: "order".into(),
            aggregate_id: "o-1".into(),
            event_type: "order.placed".into(),
            schema_version: 2,
            payload: r#"{"total":5}"#.into(),
            headers: [("traceparent".to_owned(), "00-abc-def-01".to_owned())].into(),
            created_at: DateTime::from_timestamp_millis(1_700_000_000_123).unwrap_or_default(),
            attempts: 3,
            last_error: None,
        }
    }

    #[test]
    fn the_default_destination_names_the_event_once() {
        let event = sample();
        assert_eq!(Destination::parse(DEFAULT_DESTINATION).unwrap().render(&event), "order.placed");
    }

    #[test]
    fn envelope_headers_round_trip_through_decode() {
        let event = sample();
        let headers: BTreeMap<_, _> = envelope_headers(&event).into_iter().collect();
        let decoded = decode_message(&headers, event.payload.as_bytes()).unwrap();
        assert_eq!(decoded, OutboxEvent { attempts: 0, ..event });
    }

    #[test]
    fn a_message_without_an_envelope_is_rejected_by_name() {
        let err = decode_message(&BTreeMap::new(), b"{}").unwrap_err();
        assert!(err.to_string().contains("`ce_id`"), "{err}");
    }

    #[test]
    fn destination_templates_render_and_reject_unknown_placeholders() {
        let d = Destination::parse("events.{aggregate_type}.{event_type}.v{version}").unwrap();
        assert_eq!(d.render(&sample()), "events.order.order.placed.v2");
        let err = Destination::parse("events.{aggregate}").unwrap_err();
        assert!(err.to_string().contains("unknown placeholder `{aggregate}`"), "{err}");
        assert!(Destination::parse("events.{event_type").is_err());
        assert!(Destination::parse("").is_err());
    }
}

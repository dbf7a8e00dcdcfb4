//! The event envelope: what an application enqueues and what the relay hands a publisher.
//!
//! Field names follow CloudEvents where one fits: [`OutboxEvent::id`] is `id`, `event_type` is `type`,
//! `aggregate_id` is `subject`, `created_at` is `time`; the broker adapters send them as headers
//! ([`envelope_headers`](crate::broker::envelope_headers)).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::error::{Error, Result};

/// Longest aggregate type the schema stores (`VARCHAR(64)`).
pub const MAX_AGGREGATE_TYPE_LEN: usize = 64;
/// Longest aggregate id the schema stores (`VARCHAR(128)`).
pub const MAX_AGGREGATE_ID_LEN: usize = 128;
/// Longest event type the schema stores (`VARCHAR(128)`).
pub const MAX_EVENT_TYPE_LEN: usize = 128;
/// Longest header name accepted.
pub const MAX_HEADER_NAME_LEN: usize = 128;
/// Longest header value accepted: 8 KiB, under every supported broker's header limit (NATS, Kafka and
/// RabbitMQ accept far more, but a header is metadata, not a second payload).
pub const MAX_HEADER_VALUE_LEN: usize = 8 * 1024;
/// Default cap on a serialized payload: 1 MiB, below every supported broker's default message limit.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The globally unique id of one event; brokers use it as their dedup id and consumers as their inbox key.
///
/// A UUIDv7, so ids sort roughly by creation time, but the outbox orders rows by its sequence, never by id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventId(Uuid);

impl EventId {
    /// A fresh, time-ordered id.
    pub fn new() -> Self {
        EventId(Uuid::now_v7())
    }

    /// The id as a UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for EventId {
    fn default() -> Self {
        Self::new()
    }
}

impl From<Uuid> for EventId {
    fn from(id: Uuid) -> Self {
        EventId(id)
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventId({self})")
    }
}

impl FromStr for EventId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Uuid::parse_str(s).map(EventId).map_err(|e| Error::invalid_event("id", format!("is not a UUID ({e}): {s:?}")))
    }
}

/// String headers carried with an event: trace context (`traceparent`) and user metadata.
pub type Headers = BTreeMap<String, String>;

/// An event ready to be written to the outbox, validated on construction.
///
/// ```
/// use outbox_runtime::NewEvent;
/// let event = NewEvent::new("order", "o-1", "order.placed", &serde_json::json!({"total_minor": 4900}))?
///     .with_schema_version(2)?
///     .with_header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")?;
/// assert_eq!(event.schema_version(), 2);
/// # Ok::<(), outbox_runtime::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct NewEvent {
    id: EventId,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    schema_version: i32,
    payload: Box<RawValue>,
    headers: Headers,
}

impl NewEvent {
    /// Builds an event, serializing `payload` once; the relay never re-encodes it.
    ///
    /// Fails with [`Error::InvalidEvent`] when a name is empty, too long or contains control characters,
    /// or the payload exceeds [`DEFAULT_MAX_PAYLOAD_BYTES`], and with [`Error::Serialize`] when the payload
    /// does not serialize.
    pub fn new<P: Serialize + ?Sized>(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: &P,
    ) -> Result<Self> {
        let event_type = event_type.into();
        let json = serde_json::to_string(payload)
            .map_err(|source| Error::Serialize { event_type: event_type.clone(), source })?;
        Self::from_json(aggregate_type, aggregate_id, event_type, json)
    }

    /// Builds an event from an already serialized JSON payload, checked to be a JSON object without `\u0000`
    /// or unpaired surrogate escapes (PostgreSQL's `jsonb` rejects both, MySQL and SQLite would store them,
    /// so they are refused here for every backend alike).
    pub fn from_json(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload_json: String,
    ) -> Result<Self> {
        let aggregate_type = aggregate_type.into();
        let aggregate_id = aggregate_id.into();
        let event_type = event_type.into();
        check_name("aggregate_type", &aggregate_type, MAX_AGGREGATE_TYPE_LEN)?;
        check_name("aggregate_id", &aggregate_id, MAX_AGGREGATE_ID_LEN)?;
        check_name("event_type", &event_type, MAX_EVENT_TYPE_LEN)?;
        check_payload_size(payload_json.len(), DEFAULT_MAX_PAYLOAD_BYTES)?;
        let payload = RawValue::from_string(payload_json)
            .map_err(|e| Error::invalid_event("payload", format!("is not valid JSON: {e}")))?;
        check_payload_text(payload.get())?;
        Ok(NewEvent {
            id: EventId::new(),
            aggregate_type,
            aggregate_id,
            event_type,
            schema_version: 1,
            payload,
            headers: Headers::new(),
        })
    }

    /// Sets the payload's schema version (default 1); versions start at 1.
    pub fn with_schema_version(mut self, version: i32) -> Result<Self> {
        if version < 1 {
            return Err(Error::invalid_event("schema_version", format!("is {version}; versions start at 1")));
        }
        self.schema_version = version;
        Ok(self)
    }

    /// Uses a caller-chosen id instead of a fresh UUIDv7 (e.g. to make enqueue itself idempotent).
    pub fn with_id(mut self, id: EventId) -> Self {
        self.id = id;
        self
    }

    /// Adds a header; names must be non-empty identifiers of at most [`MAX_HEADER_NAME_LEN`] bytes, values
    /// at most [`MAX_HEADER_VALUE_LEN`] bytes without control characters (a tab aside): brokers carry
    /// headers as text lines, where a NUL or a line break would cut or forge one.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let value = value.into();
        check_name("headers", &name, MAX_HEADER_NAME_LEN)?;
        check_header_value(&name, &value)?;
        self.headers.insert(name, value);
        Ok(self)
    }

    /// Rejects a payload larger than `max_bytes` (for stores or brokers with a tighter limit).
    pub fn check_payload_limit(&self, max_bytes: usize) -> Result<()> {
        check_payload_size(self.payload.get().len(), max_bytes)
    }

    /// The event id.
    pub fn id(&self) -> EventId {
        self.id
    }
    /// The aggregate type, e.g. `order`.
    pub fn aggregate_type(&self) -> &str {
        &self.aggregate_type
    }
    /// The aggregate id; events of one aggregate are published in enqueue order.
    pub fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }
    /// The stable event name, e.g. `order.placed`.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }
    /// The payload schema version.
    pub fn schema_version(&self) -> i32 {
        self.schema_version
    }
    /// The payload as JSON text.
    pub fn payload_json(&self) -> &str {
        self.payload.get()
    }
    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The headers, for the crate's own well-formed names (trace context).
    pub(crate) fn headers_mut(&mut self) -> &mut Headers {
        &mut self.headers
    }
}

/// Checks a name or key bound for a `VARCHAR(max)` column: not blank, at most `max` bytes, no control
/// characters; the error names `field`.
pub fn check_name(field: &'static str, value: &str, max: usize) -> Result<()> {
    if value.trim().is_empty() {
        return Err(Error::invalid_event(field, "is empty; give a non-blank name"));
    }
    if value.len() > max {
        return Err(Error::invalid_event(
            field,
            format!("is {} bytes long; the column holds at most {max}", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid_event(field, format!("contains control characters: {value:?}")));
    }
    Ok(())
}

/// Checks a header value: at most [`MAX_HEADER_VALUE_LEN`] bytes, no control characters but tab.
fn check_header_value(name: &str, value: &str) -> Result<()> {
    if value.len() > MAX_HEADER_VALUE_LEN {
        return Err(Error::invalid_event(
            "headers",
            format!("value of `{name}` is {} bytes long; the limit is {MAX_HEADER_VALUE_LEN}", value.len()),
        ));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(Error::invalid_event(
            "headers",
            format!("value of `{name}` contains control characters: {:?}", crate::text::truncate(value, 80)),
        ));
    }
    Ok(())
}

/// Checks valid JSON text for what some backends store and others reject: it must be an object (what a
/// `DomainEvent` serializes to, and what consumers and CDC tools expect), and no string may hold a
/// `\u0000` escape or a surrogate escape without its pair.
fn check_payload_text(json: &str) -> Result<()> {
    if !json.trim_start().starts_with('{') {
        let kind = match json.trim_start().bytes().next() {
            Some(b'[') => "an array",
            Some(b'"') => "a string",
            Some(b'n') => "null",
            Some(b't' | b'f') => "a boolean",
            _ => "a number",
        };
        return Err(Error::invalid_event(
            "payload",
            format!("is {kind}; an event payload must be a JSON object (a struct or map serializes to one)"),
        ));
    }
    let bytes = json.as_bytes();
    let unicode_escape = |at: usize| -> Option<u32> {
        let hex = json.get(at + 2..at + 6)?;
        (bytes.get(at + 1) == Some(&b'u')).then(|| u32::from_str_radix(hex, 16).ok()).flatten()
    };
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        // Valid JSON: a backslash only ever starts an escape inside a string.
        let Some(code) = unicode_escape(i) else {
            i += 2;
            continue;
        };
        match code {
            0 => {
                return Err(Error::invalid_event(
                    "payload",
                    "contains a \\u0000 escape (NUL), which PostgreSQL cannot store",
                ));
            }
            0xD800..=0xDBFF => match unicode_escape(i + 6) {
                Some(0xDC00..=0xDFFF) => i += 12,
                _ => {
                    return Err(Error::invalid_event(
                        "payload",
                        format!("contains an unpaired surrogate escape \\u{code:04x}"),
                    ));
                }
            },
            0xDC00..=0xDFFF => {
                return Err(Error::invalid_event(
                    "payload",
                    format!("contains an unpaired surrogate escape \\u{code:04x}"),
                ));
            }
            _ => i += 6,
        }
    }
    Ok(())
}

fn check_payload_size(len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::invalid_event("payload", format!("is {len} bytes of JSON; the limit is {max} bytes")));
    }
    Ok(())
}

/// One outbox row as the relay claimed it.
#[derive(Clone, Debug, PartialEq)]
pub struct OutboxEvent {
    /// The store's sequence number (unique across the outbox; diagnostics).
    pub seq: i64,
    /// The event's position in its aggregate: 1, 2, 3, … with no gaps, in commit order. Events of an
    /// aggregate are published in this order; a consumer that sees version `n + 2` after `n` knows `n + 1`
    /// is still on its way (or was set aside as dead). 0 when unknown (a message from an older producer).
    pub aggregate_version: i64,
    /// The event id (CloudEvents `id`).
    pub id: EventId,
    /// The aggregate type, e.g. `order`.
    pub aggregate_type: String,
    /// The aggregate id (CloudEvents `subject`).
    pub aggregate_id: String,
    /// The event name (CloudEvents `type`).
    pub event_type: String,
    /// The payload schema version.
    pub schema_version: i32,
    /// The payload as stored, JSON text (CloudEvents `data`, `datacontenttype: application/json`).
    pub payload: String,
    /// Trace context and user metadata.
    pub headers: Headers,
    /// When the event was enqueued (CloudEvents `time`).
    pub created_at: DateTime<Utc>,
    /// Failed publish attempts so far.
    pub attempts: i32,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
}

impl OutboxEvent {
    /// Decodes the payload into `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.payload).map_err(|source| Error::Deserialize {
            event_id: self.id.to_string(),
            event_type: self.event_type.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_empty_and_oversized_names_before_anything_is_written() {
        let empty = NewEvent::new("order", "", "order.placed", &1).unwrap_err();
        assert!(empty.to_string().contains("`aggregate_id` is empty"), "{empty}");
        let long = "x".repeat(MAX_EVENT_TYPE_LEN + 1);
        let err = NewEvent::new("order", "o1", long, &1).unwrap_err();
        assert!(err.to_string().contains("at most 128"), "{err}");
    }

    #[test]
    fn rejects_oversized_and_malformed_payloads() {
        let big = "a".repeat(DEFAULT_MAX_PAYLOAD_BYTES);
        let err = NewEvent::new("order", "o1", "t", &big).unwrap_err();
        assert!(err.to_string().contains("limit is"), "{err}");
        let err = NewEvent::from_json("order", "o1", "t", "{not json".into()).unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
    }

    #[test]
    fn payloads_must_be_objects_without_nul_or_unpaired_surrogates() {
        let field = |json: &str| match NewEvent::from_json("order", "o1", "t", json.to_owned()) {
            Err(Error::InvalidEvent { field, reason }) => format!("{field}: {reason}"),
            Err(other) => panic!("{json}: expected InvalidEvent, got {other}"),
            Ok(_) => "ok".to_owned(),
        };
        assert!(field(r#""just a string""#).contains("is a string; an event payload must be a JSON object"));
        assert!(field("[1]").contains("is an array"));
        assert!(field("42").contains("is a number"));
        assert!(field(r#"{"a":"x\u0000y"}"#).contains("\\u0000"));
        assert!(field(r#"{"a":"\ud800"}"#).contains("unpaired surrogate"));
        assert!(field(r#"{"a":"\ud800\u0041"}"#).contains("unpaired surrogate"));
        assert!(field(r#"{"a":"\udc00"}"#).contains("unpaired surrogate"));
        assert_eq!(field(r#"{"a":"\ud83d\ude00 \\u0000 \u00e9"}"#), "ok", "a pair, an escaped backslash, an é");
        let nul = NewEvent::new("order", "o1", "t", &serde_json::json!({"a": "x\0y"})).unwrap_err();
        assert!(nul.to_string().contains("`payload`"), "{nul}");
    }

    #[test]
    fn header_values_are_bounded_and_free_of_control_characters() {
        let event = || NewEvent::new("order", "o1", "t", &serde_json::json!({})).unwrap();
        let err = event().with_header("tenant", "a\0b").unwrap_err();
        assert!(err.to_string().contains("value of `tenant` contains control characters"), "{err}");
        let err = event().with_header("tenant", "a\r\nforged: yes").unwrap_err();
        assert!(err.to_string().contains("control characters"), "{err}");
        let err = event().with_header("big", "x".repeat(MAX_HEADER_VALUE_LEN + 1)).unwrap_err();
        assert!(err.to_string().contains("the limit is 8192"), "{err}");
        assert!(event().with_header("big", "x".repeat(MAX_HEADER_VALUE_LEN)).is_ok());
        assert!(event().with_header("with-tab", "a\tb").is_ok());
    }

    #[test]
    fn schema_versions_start_at_one() {
        let event = || NewEvent::new("order", "o1", "t", &serde_json::json!({})).unwrap();
        for version in [0, -1, i32::MIN] {
            let err = event().with_schema_version(version).unwrap_err();
            assert!(err.to_string().contains("`schema_version` is"), "{err}");
        }
        assert_eq!(event().with_schema_version(3).unwrap().schema_version(), 3);
    }

    #[test]
    fn rejects_payloads_that_do_not_serialize() {
        let mut map = std::collections::HashMap::new();
        map.insert((1, 2), "tuple keys are not JSON object keys");
        let err = NewEvent::new("order", "o1", "t", &map).unwrap_err();
        assert!(matches!(err, Error::Serialize { .. }), "{err}");
    }

    #[test]
    fn event_ids_round_trip_through_text() {
        let id = EventId::new();
        assert_eq!(id.to_string().parse::<EventId>().unwrap(), id);
        assert!("nope".parse::<EventId>().is_err());
    }
}

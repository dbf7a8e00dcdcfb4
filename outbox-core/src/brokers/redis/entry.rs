//! Reading Redis replies: stream entries, `XAUTOCLAIM` and `XPENDING` answers, entry fields as headers.

use std::collections::{BTreeMap, HashMap};

use ::redis::{RedisError, Value};

use crate::text::truncate;

use super::config::PAYLOAD_FIELD;

/// The fields of a stream entry as received.
pub(super) enum Fields {
    /// Field/value pairs in entry order.
    Present(Vec<(Vec<u8>, Vec<u8>)>),
    /// The entry was deleted (trimmed) while pending.
    Deleted,
    /// The reply could not be read as fields.
    Malformed(String),
}

pub(super) struct Entry {
    pub(super) id: String,
    pub(super) fields: Fields,
}

fn bytes_of(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes().to_vec()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

pub(super) fn string_of(value: &Value) -> Option<String> {
    bytes_of(value).and_then(|bytes| String::from_utf8(bytes).ok())
}

pub(super) fn items_of(value: &Value) -> Option<&[Value]> {
    match value {
        Value::Array(items) | Value::Set(items) => Some(items),
        _ => None,
    }
}

pub(super) fn unexpected(what: &str, value: &Value) -> RedisError {
    RedisError::from((
        ::redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{what}: {}", truncate(&format!("{value:?}"), 200)),
    ))
}

pub(super) fn parse_fields(value: &Value) -> Fields {
    let pairs: Vec<(&Value, &Value)> = match value {
        Value::Nil => return Fields::Deleted,
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        Value::Array(items) if items.len() % 2 == 0 => items.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
        other => {
            return Fields::Malformed(format!(
                "entry fields are not field/value pairs: {}",
                truncate(&format!("{other:?}"), 200)
            ));
        }
    };
    let mut fields = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        match (bytes_of(name), bytes_of(value)) {
            (Some(name), Some(value)) => fields.push((name, value)),
            _ => return Fields::Malformed("an entry field or value is not a string".to_owned()),
        }
    }
    Fields::Present(fields)
}

/// Entries of `[[id, fields], ...]`.
pub(super) fn parse_entries(value: &Value) -> Result<Vec<Entry>, RedisError> {
    let items = match value {
        Value::Nil => return Ok(Vec::new()),
        other => items_of(other).ok_or_else(|| unexpected("stream entries", other))?,
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        match items_of(item) {
            Some([id, fields]) => {
                let id = string_of(id).ok_or_else(|| unexpected("stream entry id", id))?;
                entries.push(Entry { id, fields: parse_fields(fields) });
            }
            // Redis 6.2 answers XAUTOCLAIM with nil for an entry deleted while pending; 7.0 drops it.
            _ if matches!(item, Value::Nil) => {}
            _ => return Err(unexpected("stream entry", item)),
        }
    }
    Ok(entries)
}

/// The entries of an `XREADGROUP` reply for one stream: nil on timeout, `[[key, entries]]` (RESP2) or
/// `{key: entries}` (RESP3).
pub(super) fn parse_read_reply(value: &Value) -> Result<Vec<Entry>, RedisError> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Map(streams) => {
            let mut entries = Vec::new();
            for (_, stream_entries) in streams {
                entries.extend(parse_entries(stream_entries)?);
            }
            Ok(entries)
        }
        other => {
            let streams = items_of(other).ok_or_else(|| unexpected("XREADGROUP reply", other))?;
            let mut entries = Vec::new();
            for stream in streams {
                match items_of(stream) {
                    Some([_, stream_entries]) => entries.extend(parse_entries(stream_entries)?),
                    _ => return Err(unexpected("XREADGROUP stream", stream)),
                }
            }
            Ok(entries)
        }
    }
}

/// `(next cursor, entries)` of an `XAUTOCLAIM` reply.
pub(super) fn parse_autoclaim_reply(value: &Value) -> Result<(String, Vec<Entry>), RedisError> {
    match items_of(value) {
        Some([cursor, entries, ..]) => {
            let cursor = string_of(cursor).ok_or_else(|| unexpected("XAUTOCLAIM cursor", cursor))?;
            Ok((cursor, parse_entries(entries)?))
        }
        _ => Err(unexpected("XAUTOCLAIM reply", value)),
    }
}

/// Delivery counts by entry id from an extended `XPENDING` reply: `[[id, consumer, idle, deliveries], ...]`.
pub(super) fn parse_pending_reply(value: &Value) -> HashMap<String, u64> {
    items_of(value)
        .unwrap_or_default()
        .iter()
        .filter_map(|item| match items_of(item) {
            Some([id, _, _, Value::Int(deliveries)]) => Some((string_of(id)?, u64::try_from(*deliveries).ok()?)),
            _ => None,
        })
        .collect()
}

/// An entry's fields as the driver sees them: headers, and the payload (the last [`PAYLOAD_FIELD`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Split {
    pub(super) headers: BTreeMap<String, String>,
    pub(super) payload: Option<Vec<u8>>,
}

/// Splits an entry into headers and payload; a field name or header value that is not UTF-8 cannot be
/// a header, and is the error.
pub(super) fn split_entry(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<Split, String> {
    let payload_at = fields.iter().rposition(|(name, _)| name.as_slice() == PAYLOAD_FIELD.as_bytes());
    let mut headers = BTreeMap::new();
    for (position, (name, value)) in fields.iter().enumerate() {
        if Some(position) == payload_at {
            continue;
        }
        let name = std::str::from_utf8(name).map_err(|e| format!("a stream entry field name is not UTF-8: {e}"))?;
        let value = std::str::from_utf8(value)
            .map_err(|e| format!("the value of field `{}` is not UTF-8: {e}", crate::text::one_line(name)))?;
        headers.insert(name.to_owned(), value.to_owned());
    }
    Ok(Split { headers, payload: payload_at.map(|at| fields[at].1.clone()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::{decode_message, envelope_headers};
    use crate::envelope::OutboxEvent;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn entries_round_trip_and_the_last_payload_field_wins() {
        let event = OutboxEvent {
            seq: 3,
            aggregate_version: 1,
            id: crate::EventId::new(),
            aggregate_type: "order".into(),
            aggregate_id: "o-1".into(),
            event_type: "order.placed".into(),
            schema_version: 1,
            payload: r#"{"n":1}"#.into(),
            headers: [("payload".to_owned(), "a user header".to_owned())].into(),
            created_at: chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap_or_default(),
            attempts: 0,
            last_error: None,
        };
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> =
            envelope_headers(&event).into_iter().map(|(k, v)| (k.into_bytes(), v.into_bytes())).collect();
        fields.push((PAYLOAD_FIELD.into(), event.payload.clone().into_bytes()));
        let split = split_entry(&fields).unwrap();
        assert_eq!(split.payload.as_deref(), Some(event.payload.as_bytes()));
        assert_eq!(decode_message(&split.headers, &split.payload.unwrap_or_default()).unwrap(), event);
        let error = split_entry(&[(b"ce_id".to_vec(), b"id".to_vec()), (b"x".to_vec(), vec![0xff])]).unwrap_err();
        assert!(error.contains("`x` is not UTF-8"), "{error}");
        assert_eq!(split_entry(&[(b"foo".to_vec(), b"bar".to_vec())]).unwrap().payload, None);
    }

    #[test]
    fn replies_are_parsed_without_panicking_on_odd_shapes() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("s"),
            Value::Array(vec![
                Value::Array(vec![bulk("1-0"), Value::Array(vec![bulk("a"), bulk("b")])]),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
                Value::Array(vec![bulk("3-0"), Value::Array(vec![bulk("odd")])]),
            ]),
        ])]);
        let entries = parse_read_reply(&reply).unwrap();
        assert_eq!(entries.len(), 3);
        assert!(matches!(entries[0].fields, Fields::Present(ref f) if f.len() == 1));
        assert!(matches!(entries[1].fields, Fields::Deleted));
        assert!(matches!(entries[2].fields, Fields::Malformed(_)));
        let resp3 = Value::Map(vec![(
            bulk("s"),
            Value::Array(vec![Value::Array(vec![bulk("4-0"), Value::Array(vec![bulk("a"), bulk("b")])])]),
        )]);
        assert_eq!(parse_read_reply(&resp3).unwrap()[0].id, "4-0");
        assert!(parse_read_reply(&Value::Nil).unwrap().is_empty());
        assert!(parse_read_reply(&Value::Int(3)).is_err());
        assert!(parse_autoclaim_reply(&Value::Array(vec![bulk("0-0")])).is_err());
        let pending = Value::Array(vec![Value::Array(vec![bulk("1-0"), bulk("c"), Value::Int(5), Value::Int(3)])]);
        assert_eq!(parse_pending_reply(&pending).get("1-0"), Some(&3));
    }
}

//! The two `pgoutput` messages the log relay reads (protocol version 1, text format): *Relation*, which
//! names a table's columns, and *Insert*, a new row's values in that order. Begin and Commit are decoded by
//! the replication client; every other message (update, delete, truncate, type, origin) is skipped: the
//! publication carries inserts only.

use std::collections::HashMap;

use chrono::DateTime;

use outbox_runtime::{EventId, Headers, OutboxEvent};

/// What one `pgoutput` message means to the relay.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// A table's columns, sent before its first change in a session and after it is altered.
    Relation(Relation),
    /// A row inserted into the table with this OID, its values in the relation's column order.
    Insert { relation: u32, values: Vec<Option<String>> },
    /// Anything else.
    Other,
}

/// A table as `pgoutput` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Relation {
    pub(crate) id: u32,
    pub(crate) schema: String,
    pub(crate) name: String,
    pub(crate) columns: Vec<String>,
}

/// Why a message did not decode: the stream is not what this relay understands.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("pgoutput message does not decode: {0}")]
pub(crate) struct Malformed(String);

/// Decodes one `pgoutput` message (the bytes of an XLogData).
pub(crate) fn decode(message: &[u8]) -> Result<Change, Malformed> {
    let mut input = Input(message);
    match input.u8()? {
        b'R' => {
            let id = input.u32()?;
            let schema = input.cstring()?;
            let name = input.cstring()?;
            let _replica_identity = input.u8()?;
            let count = input.u16()?;
            let mut columns = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let _flags = input.u8()?;
                columns.push(input.cstring()?);
                let _type_oid = input.u32()?;
                let _type_modifier = input.u32()?;
            }
            Ok(Change::Relation(Relation { id, schema, name, columns }))
        }
        b'I' => {
            let relation = input.u32()?;
            if input.u8()? != b'N' {
                return Err(Malformed("an insert without its new tuple".into()));
            }
            let count = input.u16()?;
            let mut values = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                values.push(match input.u8()? {
                    b'n' => None,
                    b't' => {
                        let len = input.u32()? as usize;
                        let bytes = input.take(len)?;
                        Some(
                            std::str::from_utf8(bytes)
                                .map_err(|e| Malformed(format!("a text value is not UTF-8: {e}")))?
                                .to_owned(),
                        )
                    }
                    b'u' => return Err(Malformed("an insert with an unchanged TOAST value".into())),
                    other => {
                        return Err(Malformed(format!(
                            "column kind {:?} (binary format is not asked for)",
                            other as char
                        )));
                    }
                });
            }
            Ok(Change::Insert { relation, values })
        }
        _ => Ok(Change::Other),
    }
}

struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.0.len() < n {
            return Err(Malformed(format!("truncated: {n} bytes expected, {} left", self.0.len())));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        let bytes = self.take(2)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        let bytes = self.take(4)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn cstring(&mut self) -> Result<String, Malformed> {
        let end = self.0.iter().position(|&b| b == 0).ok_or_else(|| Malformed("a name without its NUL".into()))?;
        let text = std::str::from_utf8(&self.0[..end]).map_err(|e| Malformed(format!("a name is not UTF-8: {e}")))?;
        let text = text.to_owned();
        self.0 = &self.0[end + 1..];
        Ok(text)
    }
}

/// Where each column the relay needs sits in an `outbox_events` relation.
#[derive(Clone, Debug)]
pub(crate) struct OutboxColumns {
    seq: usize,
    event_id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    aggregate_version: usize,
    event_type: usize,
    schema_version: usize,
    payload: usize,
    headers: usize,
    created_at_ms: usize,
}

impl OutboxColumns {
    /// The positions of the relay's columns in `relation`, or the first one missing.
    pub(crate) fn of(relation: &Relation) -> Result<Self, String> {
        let index: HashMap<&str, usize> = relation.columns.iter().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
        let at = |name: &str| {
            index.get(name).copied().ok_or_else(|| {
                format!(
                    "{}.{} has no column `{name}`: is it the outbox table, migrated?",
                    relation.schema, relation.name
                )
            })
        };
        Ok(OutboxColumns {
            seq: at("seq")?,
            event_id: at("event_id")?,
            aggregate_type: at("aggregate_type")?,
            aggregate_id: at("aggregate_id")?,
            aggregate_version: at("aggregate_version")?,
            event_type: at("event_type")?,
            schema_version: at("schema_version")?,
            payload: at("payload")?,
            headers: at("headers")?,
            created_at_ms: at("created_at_ms")?,
        })
    }

    /// The row's sequence number and aggregate, which every inserted row has whatever else it holds: the
    /// relay marks an undecodable row dead by them.
    pub(crate) fn key(&self, values: &[Option<String>]) -> Option<RowKey> {
        let get = |i: usize| values.get(i).cloned().flatten();
        Some(RowKey {
            seq: get(self.seq)?.parse().ok()?,
            aggregate_type: get(self.aggregate_type)?,
            aggregate_id: get(self.aggregate_id)?,
            aggregate_version: get(self.aggregate_version)?.parse().ok()?,
        })
    }

    /// The inserted row as an event, as the polling claim would read it; `Err` says what the row holds
    /// that the envelope cannot carry.
    pub(crate) fn event(&self, values: &[Option<String>]) -> Result<OutboxEvent, String> {
        let get = |i: usize, name: &str| {
            values.get(i).cloned().flatten().ok_or_else(|| format!("the row has no value for `{name}`"))
        };
        let number = |i: usize, name: &str| -> Result<i64, String> {
            let text = get(i, name)?;
            text.parse().map_err(|e| format!("`{name}` {text:?} is not a number: {e}"))
        };
        let id = get(self.event_id, "event_id")?;
        let headers = get(self.headers, "headers")?;
        Ok(OutboxEvent {
            seq: number(self.seq, "seq")?,
            aggregate_version: number(self.aggregate_version, "aggregate_version")?,
            id: id.parse::<EventId>().map_err(|e| format!("event_id {:?} is not a UUID: {e}", short(&id)))?,
            aggregate_type: get(self.aggregate_type, "aggregate_type")?,
            aggregate_id: get(self.aggregate_id, "aggregate_id")?,
            event_type: get(self.event_type, "event_type")?,
            schema_version: i32::try_from(number(self.schema_version, "schema_version")?)
                .map_err(|e| format!("`schema_version` does not fit a 32-bit number: {e}"))?,
            payload: get(self.payload, "payload")?,
            headers: serde_json::from_str::<Headers>(&headers)
                .map_err(|e| format!("the headers of event {} are not a JSON map of strings: {e}", short(&id)))?,
            created_at: DateTime::from_timestamp_millis(number(self.created_at_ms, "created_at_ms")?)
                .unwrap_or_default(),
            attempts: 0,
            last_error: None,
        })
    }
}

/// What identifies an inserted row even when the rest of it does not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RowKey {
    pub(crate) seq: i64,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_version: i64,
}

fn short(text: &str) -> String {
    outbox_runtime::text::one_line(&outbox_runtime::text::truncate(text, 80))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation_message(id: u32, columns: &[&str]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(id.to_be_bytes());
        m.extend(b"public\0outbox_events\0");
        m.push(b'd');
        m.extend((columns.len() as u16).to_be_bytes());
        for column in columns {
            m.push(0);
            m.extend(column.as_bytes());
            m.push(0);
            m.extend(25u32.to_be_bytes());
            m.extend(u32::MAX.to_be_bytes());
        }
        m
    }

    fn insert_message(id: u32, values: &[Option<&str>]) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(id.to_be_bytes());
        m.push(b'N');
        m.extend((values.len() as u16).to_be_bytes());
        for value in values {
            match value {
                None => m.push(b'n'),
                Some(text) => {
                    m.push(b't');
                    m.extend((text.len() as u32).to_be_bytes());
                    m.extend(text.as_bytes());
                }
            }
        }
        m
    }

    const COLUMNS: [&str; 11] = [
        "seq",
        "event_id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "schema_version",
        "payload",
        "headers",
        "created_at_ms",
        "last_error",
        "aggregate_version",
    ];

    #[test]
    fn an_insert_decodes_to_the_event_the_claim_would_read() {
        let Change::Relation(relation) = decode(&relation_message(16384, &COLUMNS)).expect("relation") else {
            panic!("not a relation");
        };
        assert_eq!((relation.schema.as_str(), relation.name.as_str()), ("public", "outbox_events"));
        let columns = OutboxColumns::of(&relation).expect("the outbox's columns");
        let id = "0190b7a6-8c1e-7d4e-9a51-3f2c6d9e8b10";
        let row = [
            Some("42"),
            Some(id),
            Some("order"),
            Some("o-1"),
            Some("order.placed"),
            Some("2"),
            Some(r#"{"total": 5}"#),
            Some(r#"{"traceparent": "00-x"}"#),
            Some("1700000000000"),
            None,
            Some("7"),
        ];
        let Change::Insert { relation: 16384, values } = decode(&insert_message(16384, &row)).expect("insert") else {
            panic!("not an insert of the relation");
        };
        let event = columns.event(&values).expect("decodes");
        assert_eq!((event.seq, event.aggregate_version, event.schema_version), (42, 7, 2));
        assert_eq!(event.id.to_string(), id);
        assert_eq!((event.aggregate_type.as_str(), event.aggregate_id.as_str()), ("order", "o-1"));
        assert_eq!(event.payload, r#"{"total": 5}"#);
        assert_eq!(event.headers.get("traceparent").map(String::as_str), Some("00-x"));
        assert_eq!(event.created_at.timestamp_millis(), 1_700_000_000_000);
    }

    #[test]
    fn a_row_the_envelope_cannot_carry_says_why_and_keeps_its_key() {
        let Change::Relation(relation) = decode(&relation_message(1, &COLUMNS)).expect("relation") else {
            panic!("not a relation");
        };
        let columns = OutboxColumns::of(&relation).expect("columns");
        let row = [
            Some("9"),
            Some("not-a-uuid"),
            Some("order"),
            Some("o-2"),
            Some("order.placed"),
            Some("1"),
            Some("{}"),
            Some("[1, 2]"),
            Some("1"),
            None,
            Some("3"),
        ];
        let Change::Insert { values, .. } = decode(&insert_message(1, &row)).expect("insert") else {
            panic!("not an insert");
        };
        let error = columns.event(&values).expect_err("not a UUID");
        assert!(error.contains("not a UUID"), "{error}");
        let key = columns.key(&values).expect("the key decodes");
        assert_eq!((key.seq, key.aggregate_id.as_str(), key.aggregate_version), (9, "o-2", 3));
    }

    #[test]
    fn a_table_without_the_outbox_columns_is_named_in_the_error() {
        let Change::Relation(relation) = decode(&relation_message(1, &["id", "name"])).expect("relation") else {
            panic!("not a relation");
        };
        let error = OutboxColumns::of(&relation).expect_err("not the outbox");
        assert!(error.contains("public.outbox_events has no column `seq`"), "{error}");
    }

    #[test]
    fn truncated_and_foreign_messages_are_errors_or_skipped() {
        let mut insert = insert_message(1, &[Some("12345")]);
        insert.truncate(insert.len() - 2);
        assert!(decode(&insert).expect_err("truncated").0.contains("truncated"));
        assert_eq!(decode(b"U\0\0\0\x01").expect("an update is skipped"), Change::Other);
        assert!(decode(&[]).is_err());
    }
}

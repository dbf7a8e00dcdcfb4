//! Typed domain events: what `#[derive(DomainEvent)]` implements.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::envelope::{NewEvent, OutboxEvent};
use crate::error::{Error, Result};
use crate::schema_lock::{LockFile, compare};

/// One field of an event's schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldSchema {
    /// The JSON field name (serde renames applied).
    pub name: &'static str,
    /// The Rust type, as written.
    pub ty: &'static str,
}

/// The schema of one event version, computed at compile time by the derive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventSchema {
    /// The stable event name.
    pub name: &'static str,
    /// The schema version.
    pub version: i32,
    /// The fields, in declaration order.
    pub fields: &'static [FieldSchema],
}

impl EventSchema {
    fn owned_fields(&self) -> Vec<(String, String)> {
        self.fields.iter().map(|f| (f.name.to_owned(), f.ty.to_owned())).collect()
    }
}

/// An event type with a stable name, a schema version and an aggregate.
///
/// Derive it: `#[derive(DomainEvent, Serialize, Deserialize)]` with
/// `#[domain_event(name = "order.placed", version = 2, aggregate = "order")]` and `#[aggregate_id]` on a field.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a domain event",
    label = "this type does not implement `DomainEvent`",
    note = "add `#[derive(DomainEvent, Serialize, Deserialize)]` and `#[domain_event(name = \"...\", version = N, aggregate = \"...\")]` to `{Self}`"
)]
pub trait DomainEvent: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stable event name, never a Rust path (e.g. `order.placed`).
    const NAME: &'static str;
    /// The current schema version.
    const VERSION: i32;
    /// The oldest stored version [`DomainEvent::decode_version`] can upcast from.
    const OLDEST_VERSION: i32;
    /// The aggregate type (e.g. `order`).
    const AGGREGATE_TYPE: &'static str;
    /// The schema of the current version.
    const SCHEMA: EventSchema;

    /// The id of the aggregate this event belongs to.
    fn aggregate_id(&self) -> String;

    /// Decodes a payload stored at `version`, upcasting older versions through their typed conversions.
    fn decode_version(version: i32, payload: &str) -> std::result::Result<Self, serde_json::Error>;

    /// The outbox envelope for this event.
    fn to_new_event(&self) -> Result<NewEvent> {
        Ok(NewEvent::new(Self::AGGREGATE_TYPE, self.aggregate_id(), Self::NAME, self)?
            .with_schema_version(Self::VERSION))
    }

    /// Decodes a claimed or received envelope: checks the name and version first, so an unknown event
    /// type or a version newer than this code is a typed error, never a panic.
    fn from_envelope(event: &OutboxEvent) -> Result<Self> {
        if event.event_type != Self::NAME {
            return Err(Error::UnknownEventType {
                event_id: event.id.to_string(),
                found: event.event_type.clone(),
                expected: Self::NAME,
            });
        }
        if event.schema_version > Self::VERSION || event.schema_version < Self::OLDEST_VERSION {
            return Err(Error::UnsupportedVersion {
                event_id: event.id.to_string(),
                event_type: Self::NAME,
                version: event.schema_version,
                oldest: Self::OLDEST_VERSION,
                newest: Self::VERSION,
            });
        }
        Self::decode_version(event.schema_version, &event.payload).map_err(|source| Error::Deserialize {
            event_id: event.id.to_string(),
            event_type: event.event_type.clone(),
            source,
        })
    }
}

/// Checks `schemas` against the lock file at `path`; with `OUTBOX_BLESS=1` in the environment, adds the
/// missing entries instead (a locked entry is never rewritten: a changed schema needs a new version).
///
/// Call it from a test with every event type of the crate:
/// ```no_run
/// # use outbox_runtime::{DomainEvent, EventSchema};
/// # fn schemas() -> Vec<EventSchema> { vec![] }
/// outbox_runtime::verify_events_lock(concat!(env!("CARGO_MANIFEST_DIR"), "/events.lock"), &schemas()).unwrap();
/// ```
pub fn verify_events_lock(path: impl AsRef<Path>, schemas: &[EventSchema]) -> std::result::Result<(), String> {
    let path = path.as_ref();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut lock = LockFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let bless = std::env::var("OUTBOX_BLESS").is_ok_and(|v| v == "1");
    let mut problems = Vec::new();
    let mut added = 0;
    for schema in schemas {
        let key = (schema.name.to_owned(), schema.version);
        match lock.entries.get(&key) {
            Some(locked) => {
                if let Some(change) = compare(locked, &schema.owned_fields()) {
                    problems.push(format!(
                        "`{} v{}` changed: {change}; bump the version and add an upcaster",
                        schema.name, schema.version
                    ));
                }
            }
            None if bless => {
                lock.entries.insert(key, schema.owned_fields());
                added += 1;
            }
            None => problems.push(format!(
                "`{} v{}` is not in {}; run `OUTBOX_BLESS=1 cargo test` to lock it",
                schema.name,
                schema.version,
                path.display()
            )),
        }
    }
    if added > 0 {
        std::fs::write(path, lock.render()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
}

/// The JSON Schema of event `E`'s payload, for other teams to consume the contract, annotated with the
/// event's stable name (`x-event-name`), version (`x-event-version`) and aggregate (`x-aggregate-type`).
///
/// Derive `schemars::JsonSchema` next to `DomainEvent` on the event type.
#[cfg(feature = "schemars")]
pub fn event_json_schema<E: DomainEvent + schemars::JsonSchema>() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(E)).unwrap_or_default();
    if let Some(object) = schema.as_object_mut() {
        object.insert("x-event-name".into(), E::NAME.into());
        object.insert("x-event-version".into(), E::VERSION.into());
        object.insert("x-aggregate-type".into(), E::AGGREGATE_TYPE.into());
    }
    schema
}

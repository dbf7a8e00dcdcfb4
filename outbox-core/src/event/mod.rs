//! Typed domain events: what `#[derive(DomainEvent)]` implements.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::envelope::{NewEvent, OutboxEvent};
use crate::error::{Error, Result};

mod check;
mod lock;
mod schema;
#[cfg(test)]
mod tests;

pub use check::{LockMismatch, UNCHECKED_FIELDS, lock_mismatch};
pub use lock::{RegisteredEvent, verify_events_lock, verify_events_lock_all};
pub use schema::{EventSchema, FieldSchema, PayloadSchema};

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
    /// The schema of the current version, with those of the `upcast_from` structs of older versions; what
    /// [`verify_events_lock`] checks against `events.lock`.
    const SCHEMA: EventSchema;

    /// The id of the aggregate this event belongs to.
    fn aggregate_id(&self) -> String;

    /// Decodes a payload stored at `version`, upcasting older versions through their typed conversions.
    fn decode_version(version: i32, payload: &str) -> std::result::Result<Self, serde_json::Error>;

    /// The outbox envelope for this event.
    fn to_new_event(&self) -> Result<NewEvent> {
        NewEvent::new(Self::AGGREGATE_TYPE, self.aggregate_id(), Self::NAME, self)?.with_schema_version(Self::VERSION)
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

//! The one error type of `outbox-core`.

use std::borrow::Cow;

/// A boxed error from a store or publisher implementation.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the outbox runtime, with enough context to act on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is out of range; nothing was started.
    #[error("invalid outbox configuration: `{field}` {reason}")]
    InvalidConfig {
        /// The offending setting, e.g. `batch_size`.
        field: &'static str,
        /// What is wrong with it and what is expected.
        reason: Cow<'static, str>,
    },
    /// An event was rejected before anything was written.
    #[error("invalid event: `{field}` {reason}")]
    InvalidEvent {
        /// The offending envelope field, e.g. `aggregate_id`.
        field: &'static str,
        /// What is wrong with it and what is expected.
        reason: Cow<'static, str>,
    },
    /// The payload of an event could not be serialized to JSON.
    #[error("payload of event type `{event_type}` does not serialize to JSON: {source}")]
    Serialize {
        /// The event type whose payload failed.
        event_type: String,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// A stored payload could not be decoded into the requested type.
    #[error("payload of event {event_id} (`{event_type}`) does not decode: {source}")]
    Deserialize {
        /// The event id.
        event_id: String,
        /// The event type.
        event_type: String,
        /// The deserializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// A message carries an event type this handler does not know.
    #[error("event {event_id} has type `{found}`; this handler expects `{expected}`")]
    UnknownEventType {
        /// The event id.
        event_id: String,
        /// The type on the message.
        found: String,
        /// The type the handler decodes.
        expected: &'static str,
    },
    /// A message carries a schema version this code cannot decode.
    #[error(
        "event {event_id} (`{event_type}`) has schema version {version}; this code decodes versions {oldest} to {newest}"
    )]
    UnsupportedVersion {
        /// The event id.
        event_id: String,
        /// The event type.
        event_type: &'static str,
        /// The version on the message.
        version: i32,
        /// The oldest version with an upcaster.
        oldest: i32,
        /// The current version.
        newest: i32,
    },
    /// A broker client failed (connect, declare, publish, consume).
    #[error("{broker} failed to {operation}: {source}")]
    Broker {
        /// The broker, e.g. `NATS JetStream`.
        broker: &'static str,
        /// What the adapter was doing, e.g. `connect to nats://127.0.0.1:4222`.
        operation: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The database did not answer, refused the connection, or the URL does not parse.
    #[error("cannot connect to {backend} at {url}: {source}")]
    Connect {
        /// The database backend, e.g. `PostgreSQL`.
        backend: &'static str,
        /// The URL, its password replaced by `***`.
        url: String,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The store (database) failed.
    #[error("outbox store failed to {operation} on `{table}` ({backend}): {source}")]
    Store {
        /// What the store was doing, e.g. `claim a batch`.
        operation: &'static str,
        /// The table involved.
        table: &'static str,
        /// The database backend, e.g. `PostgreSQL`.
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidConfig`].
    pub fn invalid_config(field: &'static str, reason: impl Into<Cow<'static, str>>) -> Self {
        Error::InvalidConfig { field, reason: reason.into() }
    }

    /// Shorthand for [`Error::Broker`].
    pub fn broker(broker: &'static str, operation: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Broker { broker, operation: operation.into(), source: source.into() }
    }

    /// Shorthand for [`Error::InvalidEvent`].
    pub fn invalid_event(field: &'static str, reason: impl Into<Cow<'static, str>>) -> Self {
        Error::InvalidEvent { field, reason: reason.into() }
    }
}

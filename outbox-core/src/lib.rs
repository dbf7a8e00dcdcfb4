//! # outbox-runtime
//!
//! The runtime of the transactional outbox, independent of any ORM.
//!
//! A service that commits a row and then publishes an event loses the event when it crashes in between
//! (the *dual write* problem). Instead, the event is written as an outbox row in the same transaction as
//! the business change; a [`Relay`] later publishes committed rows to a broker through a [`Publisher`]
//! (at-least-once), and consumers de-duplicate through an inbox ([`InboxOutcome`]), so each event's effect
//! happens exactly once.
//!
//! - [`NewEvent`] / [`OutboxEvent`]: the envelope, validated on construction.
//! - [`Relay`]: claim, publish, mark; retry with [`Backoff`]; dead letters; per-aggregate order.
//! - [`OutboxService`]: relay tasks, cleanup and a stats sampler behind one handle, with [`Health`] and a
//!   shutdown that leaves nothing claimed; [`wake_relays`] starts an idle relay at once after a commit.
//! - [`store`]: what a database must provide (`outbox-seaorm` implements it for SeaORM).
//! - [`Publisher`]: what a broker adapter must provide; [`InMemoryPublisher`] for tests.
//! - `testkit` (feature `testkit`): a fault-injecting publisher and a history checker, to prove an app's
//!   handlers apply every committed event once, in order per aggregate, while the broker misbehaves.
//!
//! ## Ordering
//! A store claims only the oldest unpublished event of each aggregate, so an event is never published while
//! an earlier event of its aggregate is unpublished, with one relay or many. A dead event blocks its
//! aggregate unless [`DeadLetterPolicy::SkipDead`] is chosen.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod broker;
pub mod brokers;
mod config;
pub mod consume;
mod envelope;
mod error;
mod event;
mod inbox;
mod memory;
pub mod metrics;
mod publisher;
mod relay;
pub mod service;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;
mod wake;
pub use outbox_schema_lock as schema_lock;

// Lets `#[derive(DomainEvent)]` name this crate `::outbox_runtime` from its own tests and doctests too.
extern crate self as outbox_runtime;

/// `#[derive(DomainEvent)]` for crates that depend on the runtime alone (no database driver): declare and
/// decode events in a consumer-only crate. Apps on SeaORM use `outbox_seaorm::DomainEvent`, the same derive.
///
/// ```
/// use outbox_runtime::DomainEvent;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(DomainEvent, Serialize, Deserialize)]
/// #[domain_event(name = "order.placed", version = 1, aggregate = "order")]
/// struct OrderPlaced {
///     #[aggregate_id]
///     order_id: String,
/// }
///
/// assert_eq!(<OrderPlaced as DomainEvent>::NAME, "order.placed");
/// let event = OrderPlaced { order_id: "o1".into() }.to_new_event().unwrap();
/// assert_eq!(event.aggregate_id(), "o1");
/// ```
pub use outbox_macros::DomainEvent;

/// `#[derive(PayloadSchema)]` for the types inside an event's payload (nested structs and enums) and for
/// the `upcast_from` structs of older versions: `events.lock` then locks their fields too.
///
/// ```
/// use outbox_runtime::{DomainEvent, PayloadSchema};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(PayloadSchema, Serialize, Deserialize)]
/// struct Address {
///     street: String,
/// }
///
/// #[derive(DomainEvent, Serialize, Deserialize)]
/// #[domain_event(name = "order.shipped", version = 1, aggregate = "order")]
/// struct OrderShipped {
///     #[aggregate_id]
///     order_id: String,
///     to: Address,
/// }
///
/// let lines = OrderShipped::SCHEMA.lock_lines();
/// assert_eq!(lines[2], ("to.street".to_owned(), "String".to_owned()));
/// ```
pub use outbox_macros::PayloadSchema;

/// Support for the code `#[derive(DomainEvent)]` and `#[derive(PayloadSchema)]` generate; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::event::{
        DomainEvent, EventSchema, FieldSchema, LockMismatch, PayloadSchema, RegisteredEvent, UNCHECKED_FIELDS,
        lock_mismatch,
    };
    pub use inventory;
    pub use serde;
    pub use serde_json;

    use std::marker::PhantomData;

    /// What `DomainEvent` needs of serde. `Missing` is what the probe below found missing; only `Nothing`
    /// is implemented, so a missing derive is one error on the event type (a bound `Serialize +
    /// DeserializeOwned` would give one error per missing trait).
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be a domain event: it must implement serde's `Serialize` and `Deserialize`",
        label = "add `#[derive(Serialize, Deserialize)]` (serde) next to `DomainEvent`",
        note = "the outbox stores the event as its JSON payload and consumers decode it from there"
    )]
    pub trait SerdeEvent<Missing> {}

    impl<T: ?Sized> SerdeEvent<Nothing> for T {}

    /// The probe found `Serialize` and `Deserialize`.
    pub struct Nothing;
    /// The probe found no `Serialize` (and did not look further).
    pub struct MissingSerialize;
    /// The probe found `Serialize` but no `Deserialize`.
    pub struct MissingDeserialize;

    /// Checks serde's traits on `T` one after the other, by method resolution: `(&&&probe).missing()` takes
    /// the first of [`SerdeOk`], [`SerializeOnly`], [`NoSerialize`] whose bounds hold (each is implemented
    /// one reference deeper than the next).
    pub struct SerdeProbe<T: ?Sized>(PhantomData<T>);

    /// The probe of `T`.
    pub const fn serde_probe<T: ?Sized>() -> SerdeProbe<T> {
        SerdeProbe(PhantomData)
    }

    /// What the probe found; [`Found::check`] is the one bound that can fail.
    pub struct Found<Missing>(PhantomData<Missing>);

    impl<Missing> Found<Missing> {
        /// Compile-time check, spanned at the event type.
        pub fn check<T: SerdeEvent<Missing> + ?Sized>(self) {}
    }

    /// Both traits.
    pub trait SerdeOk {
        /// Nothing missing.
        fn missing(&self) -> Found<Nothing> {
            Found(PhantomData)
        }
    }

    impl<T: serde::Serialize + serde::de::DeserializeOwned> SerdeOk for &&SerdeProbe<T> {}

    /// `Serialize` alone.
    pub trait SerializeOnly {
        /// `Deserialize` missing.
        fn missing(&self) -> Found<MissingDeserialize> {
            Found(PhantomData)
        }
    }

    impl<T: serde::Serialize + ?Sized> SerializeOnly for &SerdeProbe<T> {}

    /// No `Serialize`.
    pub trait NoSerialize {
        /// `Serialize` missing.
        fn missing(&self) -> Found<MissingSerialize> {
            Found(PhantomData)
        }
    }

    impl<T: ?Sized> NoSerialize for SerdeProbe<T> {}
}

/// The same module under a name that does not collide with `outbox_seaorm`'s own `__private`: outbox-seaorm
/// re-exports it, so the derives reach it as `outbox_seaorm::__derive` or `outbox_runtime::__derive` and the
/// generated code names only the crate the app depends on.
#[doc(hidden)]
pub use self::__private as __derive;

pub mod store;
mod telemetry;
pub mod text;
pub mod trace_context;

/// The bounds on what the outbox accepts: longer names and bigger payloads are refused with an error
/// naming the bound, and settings past a maximum are refused by [`RelayConfig::validate`].
pub mod limits {
    pub use crate::config::{MAX_BACKOFF, MAX_LEASE, MAX_RELAY_INTERVAL};
    pub use crate::envelope::{
        DEFAULT_MAX_PAYLOAD_BYTES, MAX_AGGREGATE_ID_LEN, MAX_AGGREGATE_TYPE_LEN, MAX_EVENT_TYPE_LEN,
        MAX_HEADER_NAME_LEN, MAX_HEADER_VALUE_LEN,
    };
    pub use crate::inbox::{MAX_CONSUMER_LEN, MAX_MESSAGE_ID_LEN};
}

/// The name checks `outbox-seaorm`'s inbox shares; not a public API.
#[doc(hidden)]
pub mod __support {
    pub use crate::envelope::check_name;
}

// Events.
pub use envelope::{EventId, Headers, NewEvent, OutboxEvent};
#[cfg(feature = "schemars")]
pub use event::event_json_schema;
pub use event::{DomainEvent, EventSchema, FieldSchema, PayloadSchema, verify_events_lock, verify_events_lock_all};
// Publishing.
pub use broker::Destination;
pub use config::{Backoff, ClaimMode, DeadLetterPolicy, RelayConfig};
pub use memory::InMemoryPublisher;
pub use publisher::{PublishError, Publisher};
pub use relay::{Relay, RelayPass};
pub use service::{
    CleanupConfig, Health, HealthProbe, OutboxService, OutboxServiceBuilder, PassReporter, ServiceConfig,
};
pub use wake::wake_relays;
// Consuming.
pub use consume::{Consumer, ConsumerConfig, ConsumerStats, DeadFilter, EventHandler, Handled, Received, Transport};
pub use inbox::InboxOutcome;
// Errors and shutdown.
pub use error::{BoxError, Error, Result};
#[cfg(feature = "testkit")]
#[doc(no_inline)]
pub use testkit::FaultyPublisher;
pub use tokio_util::sync::CancellationToken;

//! # outbox-seaorm
//!
//! The transactional outbox for SeaORM 2.x apps on PostgreSQL, MySQL/MariaDB and SQLite: the crate an app
//! depends on. It re-exports [`outbox_runtime`] (envelope, relay, publishers) and adds the store.
//!
//! ## Quick start
//! An event type, a service whose methods write their rows and events in one transaction, a handler
//! that applies each event once, and a relay (README.md has the whole app, with a broker; docs/ is the guide):
//! ```no_run
//! use outbox_seaorm::{
//!     Consumer, DomainEvent, InMemoryPublisher, Relay, RelayConfig, SeaOrmGroupCommit, SeaOrmStore, emit,
//!     idempotent_handler, transactional_outbox,
//! };
//! use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(DomainEvent, Clone, Debug, Serialize, Deserialize)]
//! #[domain_event(name = "order.placed", version = 1, aggregate = "order")]
//! struct OrderPlaced {
//!     #[aggregate_id]
//!     order_id: String,
//!     total_minor: i64,
//! }
//!
//! struct Orders {
//!     db: DatabaseConnection,
//! }
//!
//! #[transactional_outbox(conn = self.db)]
//! impl Orders {
//!     /// The row and its event commit together on `Ok`, or not at all.
//!     async fn place(&self, order_id: String, total_minor: i64) -> Result<(), DbErr> {
//!         self.db.execute_unprepared("INSERT INTO orders (id) VALUES ('o1')").await?;
//!         emit!(OrderPlaced { order_id, total_minor });
//!         Ok(())
//!     }
//! }
//!
//! /// Runs once per event, in one transaction with the inbox row that marks it handled.
//! #[idempotent_handler]
//! async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
//!     txn.execute_unprepared("INSERT INTO invoices (order_id) VALUES ('o1')").await?;
//!     Ok(())
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let db = outbox_seaorm::connect("sqlite://target/app.db?mode=rwc").await?;
//! outbox_seaorm::migrate(&db).await?;
//! Orders { db: db.clone() }.place("o1".into(), 4900).await?;
//!
//! // Elsewhere (`OutboxService` in an app, `outbox relay` as a process): publish, at least once.
//! let relay = Relay::new(SeaOrmStore::new(db.clone()), InMemoryPublisher::new(), RelayConfig::default())?;
//! relay.run_once().await?;
//!
//! // The consumer, named once, registers the handler as written; `run` it on a broker's transport.
//! let billing = Consumer::new("billing").with_group_commit(SeaOrmGroupCommit::new(db)).on(bill);
//! # let _ = billing;
//! # Ok(()) }
//! ```
//!
//! ## What holds on each backend
//! | | PostgreSQL | MySQL 8 / MariaDB 10.6+ | SQLite |
//! |---|---|---|---|
//! | several relays at once | yes, `SKIP LOCKED` | yes, `SKIP LOCKED` | they take turns (`BEGIN IMMEDIATE`) |
//! | enqueue while a relay publishes | never waits for the publish | same (no gap locks) | never waits with the default claim, a lease; an explicit `ClaimMode::Transaction` waits for the publish |
//! | inbox dedup | `ON CONFLICT DO NOTHING` | `INSERT IGNORE` | `ON CONFLICT DO NOTHING` |
//! | claim statements (`SeaOrmStore::claim_plans` explains them), then one hint update and, in lease mode, a lease stamp | 2 | 3 (a plain read of the runs' keys, then their lock by primary key) | 2 |
//! | concurrent writers of one aggregate | commit in order (row lock) | commit in order (row lock) | one writer at a time |
//!
//! ## Operating it
//! The `outbox` command (a relay process, `migrate`, `check`, `stats`, dead events, cleanup) and the
//! operations dashboard are crate `outbox-ops`, so an app that runs neither compiles no web framework;
//! [`maintenance`] is the upkeep both share with [`OutboxService`].
//!
//! ## Features
//! The app chooses its drivers, runtime and TLS, as with SeaORM itself; nothing but `migrations` and `metrics` is
//! on by default. A PostgreSQL-only app: `features = ["sqlx-postgres", "runtime-tokio-rustls"]`.
//!
//! | feature | what it adds |
//! |---|---|
//! | `migrations` (default) | `migrate`, `migrations()`, `Migrator` (sea-orm-migration) |
//! | `metrics` (default) | relay, stats and consumer metrics through the `metrics` facade ([`metrics`] names them); the app installs the recorder |
//! | `opentelemetry` | W3C `traceparent`/`tracestate` captured at `enqueue`/`emit!` and restored as the parent of the consumer's span ([`trace_context`]) |
//! | `sqlx-postgres`, `sqlx-mysql`, `sqlx-sqlite` | SeaORM's sqlx driver for that database; `connect` refuses a URL whose driver is not built |
//! | `runtime-tokio-rustls`, `runtime-tokio-native-tls`, `runtime-tokio` | SeaORM's runtime and TLS choice (pick one with a driver) |
//! | `nats` | NATS JetStream publisher and transport (`brokers::nats`) |
//! | `kafka` | Kafka idempotent producer and transport (`brokers::kafka`, vendored librdkafka) |
//! | `rabbitmq` | RabbitMQ publisher confirms and transport (`brokers::rabbitmq`) |
//! | `redis` | Redis Streams publisher and transport (`brokers::redis`) |
//! | `schemars` | `event_json_schema::<E>()`: an event's JSON Schema with its name and version |
//! | `testkit` | `testkit::FaultyPublisher` (drop, delay, duplicate, reorder, fail, lose acks) and `testkit::History` (lost, applied twice, order, rolled back published) for tests of an app's handlers |

#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
mod connection;
mod enqueue;
pub mod entity;
mod error;
mod inbox;
mod lock;
#[cfg(feature = "log-relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "log-relay")))]
pub mod log;
pub mod maintenance;
#[cfg(feature = "migrations")]
pub mod migration;
pub mod notify;
pub mod partition;
mod sql;
pub mod store;
mod transaction;
pub mod watch;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use connect::{DEFAULT_CONNECT_TIMEOUT, SUPPORTED_SCHEMES, connect, connect_with};
pub use connection::OutboxConnection;
pub use enqueue::{enqueue, enqueue_all};
pub use error::{InboxError, backend_name, store_error};
pub use inbox::{SeaOrmGroupCommit, deliver, handle_batch_once, handle_once};
#[cfg(feature = "migrations")]
pub use migration::{MIGRATE_LOCK_WAIT, Migrator, migrate, migrations};
pub use store::SeaOrmStore;
pub use transaction::{OutboxTransaction, begin, transaction};

pub use outbox_macros::{idempotent_handler, transactional_outbox};

// What the runtime provides, named one by one.
#[doc(hidden)]
pub use outbox_runtime::__derive;
#[cfg(feature = "schemars")]
#[cfg_attr(docsrs, doc(cfg(feature = "schemars")))]
pub use outbox_runtime::event_json_schema;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub use outbox_runtime::testkit;
/// Publishing: the relay, its settings, and the service that runs it with cleanup and health.
pub use outbox_runtime::{
    Backoff, CancellationToken, ClaimMode, CleanupConfig, DeadLetterPolicy, Health, HealthProbe, OutboxService,
    OutboxServiceBuilder, PassReporter, Relay, RelayConfig, RelayPass, ServiceConfig, wake_relays,
};
/// Errors.
pub use outbox_runtime::{BoxError, Error, Result};
/// Consuming: one driver for every broker, typed handlers, the inbox's outcome.
pub use outbox_runtime::{Consumer, ConsumerConfig, ConsumerStats, DeadFilter, Handled, InboxOutcome, Received};
/// Brokers: where an event goes, and what a publisher is.
pub use outbox_runtime::{Destination, InMemoryPublisher, PublishError, Publisher};
/// Events: declare them (`#[derive(DomainEvent)]`), write them, read them back.
pub use outbox_runtime::{DomainEvent, EventId, Headers, NewEvent, OutboxEvent, PayloadSchema, verify_events_lock_all};
/// The runtime's modules: broker adapters and their message format, the consume side, the bounds on
/// input, metric names, text redaction, the W3C trace context. (`store` is this crate's: the runtime's store contract and
/// its implementation here.)
pub use outbox_runtime::{broker, brokers, consume, limits, metrics, text, trace_context};

/// `postgres://user:secret@host/db` → `postgres://***@host/db`: a connection string fit for a log line.
pub fn redact_url(url: &str) -> String {
    outbox_runtime::text::redact_url(url)
}

/// Writes an event into the transaction of the enclosing `#[transactional_outbox]` method.
///
/// The attribute rewrites every `emit!(event)` in the method's body; anywhere else this macro is a compile
/// error, so an event can never bypass the outbox.
#[macro_export]
macro_rules! emit {
    // What `#[transactional_outbox]` leaves of a rewritten `emit!`: nothing (the import stays used).
    (@used) => {};
    ($event:expr $(, $($headers:tt)*)?) => {{
        ::std::compile_error!(
            "`emit!` can only be used in the body of an async method annotated with `#[transactional_outbox]` (or in an impl block carrying it), which provides the transaction the event is written to"
        );
        // The event stays named, so the error is the only diagnostic (no unused import).
        let _ = &$event;
    }};
    ($($tokens:tt)*) => {
        ::std::compile_error!(
            "`emit!` can only be used in the body of an async method annotated with `#[transactional_outbox]` (or in an impl block carrying it), which provides the transaction the event is written to"
        )
    };
}

/// The names most apps need: `use outbox_seaorm::prelude::*;`.
pub mod prelude {
    pub use crate::{
        Consumer, ConsumerConfig, DomainEvent, InboxOutcome, NewEvent, PayloadSchema, Received, Relay, RelayConfig,
        SeaOrmGroupCommit, SeaOrmStore, emit, idempotent_handler, transactional_outbox,
    };
}

//! # outbox-macros
//!
//! Procedural macros for the transactional outbox; use them through `outbox-seaorm`, which re-exports them
//! and which every path in the generated code points to (`::outbox_seaorm::__private`; the derives name the
//! runtime's support module, `__derive`, through `outbox_seaorm` or `outbox_runtime`, whichever the crate
//! depends on).
//!
//! - [`DomainEvent`](derive@DomainEvent): stable name, version, aggregate, upcasting, schema checked
//!   against `events.lock` at compile time.
//! - [`PayloadSchema`](derive@PayloadSchema): the schema of a type inside an event (or of an `upcast_from`
//!   struct), so `events.lock` locks its fields too.
//! - [`transactional_outbox`](macro@transactional_outbox): runs a service method in a transaction and writes
//!   the events it `emit!`s in that transaction.
//! - [`idempotent_handler`](macro@idempotent_handler): a consumer's handler, registered as written
//!   (`.on(bill)`), with inbox de-duplication in one transaction with its effect.
//!
//! Each macro parses, validates, then expands. On an error it still emits what keeps the rest of the
//! user's code compiling, so one mistake is one error: the derives a stub `DomainEvent` / `PayloadSchema`
//! impl (which the `events.lock` comparison accepts as it is), `#[idempotent_handler]` the handler's
//! signature around the user's function, `#[transactional_outbox]` the method with its `emit!`s
//! neutralised. Generated code names the crate the app depends on, under whatever name the app gave it
//! (`ob = { package = "outbox-seaorm", ... }`).

use proc_macro::TokenStream;

mod connection;
mod diagnostics;
mod domain_event;
mod emit;
mod handler;
mod paths;
use outbox_schema_lock as schema_lock;
mod signature;
mod transactional;

/// Implements `DomainEvent` for a struct with named fields.
///
/// ```ignore
/// #[derive(DomainEvent, Serialize, Deserialize)]
/// #[domain_event(name = "order.placed", version = 2, aggregate = "order", upcast_from(v1 = OrderPlacedV1))]
/// pub struct OrderPlaced {
///     #[aggregate_id]
///     pub order_id: String,
///     pub total_minor: i64,
/// }
/// ```
///
/// - `name`: the stable event name (lowercase letters, digits, `.`, `_`, `-`), never a Rust path.
/// - `version`: the schema version, 1 or more.
/// - `aggregate`: the aggregate type.
/// - `upcast_from(vN = Type, ...)`: older versions, each convertible (`From`) into the next and the last
///   into this type; every version from the oldest listed to `version - 1` must be there.
/// - `#[aggregate_id]` on exactly one field (any `Display` type).
///
/// The schema (JSON field names after serde renames, Rust types in their short form, and the fields of the
/// types inside, which must implement `PayloadSchema`) is compared with the entry for `(name, version)` in
/// the nearest `events.lock` (searched from the source file's directory up to the crate root), and each
/// `upcast_from` struct (which must implement `PayloadSchema` too) with the entry of its version: a locked
/// event whose fields changed does not compile. The error is on the changed field; for a change inside a
/// nested type, on the event's field that holds it (or the `upcast_from` type), naming the nested path
/// (`to.zip`). A locked entry is never rewritten: restore the fields, or add a version; an entry of a
/// version never released can be deleted and locked again with `OUTBOX_BLESS=1 cargo test`. The event is also registered for
/// `verify_events_lock_all`, the lock test that adds new entries with `OUTBOX_BLESS=1`.
///
/// A field `#[payload_schema(by_name)]` is locked by its type name only (for a type from another crate
/// without `PayloadSchema`); so is a field with serde's `with` or `serialize_with`.
#[proc_macro_derive(DomainEvent, attributes(domain_event, aggregate_id, payload_schema))]
pub fn derive_domain_event(input: TokenStream) -> TokenStream {
    domain_event::derive(input.into()).into()
}

/// Implements `PayloadSchema` for a struct or an enum held inside an event, or used as an `upcast_from`
/// struct: `events.lock` then locks its fields (variants), as serde names them, under the field that holds
/// it.
///
/// ```ignore
/// #[derive(PayloadSchema, Serialize, Deserialize)]
/// pub struct Address {
///     pub street: String,
///     #[payload_schema(by_name)]
///     pub geo: other_crate::Point,
/// }
/// ```
///
/// Reads serde's `rename`, `rename_all`, `rename_all_fields` and `skip`/`skip_serializing`; a field with
/// `with` or `serialize_with`, or marked `#[payload_schema(by_name)]`, is locked by its type name only.
/// Every other field's type must implement `PayloadSchema`.
#[proc_macro_derive(PayloadSchema, attributes(payload_schema))]
pub fn derive_payload_schema(input: TokenStream) -> TokenStream {
    domain_event::derive_payload_schema(input.into()).into()
}

/// Runs an async service method (or every such method of an inherent impl block) in a transaction and
/// inserts the events it emits with `emit!(event)` into the outbox, in emit order, with one multi-row
/// insert just before the outermost commit.
///
/// Where the connection comes from:
/// - `#[transactional_outbox(conn = self.db)]` (any expression: `state.db`, an `Arc<DatabaseConnection>`):
///   inside the body that expression (`&self.db`, `&*self.db`, `self.db.as_ref()`) names the transaction.
///   On an impl block, every `async fn` taking `self` runs in a transaction.
/// - a parameter: `db: &DatabaseConnection` (widened to `&impl OutboxConnection`, so the method also takes
///   a caller's `&DatabaseTransaction`), `&DatabaseTransaction`, or `&C` with `C: TransactionTrait` (the
///   macro adds `C: OutboxConnection`). Inside the body the parameter names the transaction.
///
/// Services compose. A call made while another annotated call (or an `outbox_seaorm::transaction` scope)
/// runs in the same task on the same pool joins its transaction with a savepoint, whatever service it
/// belongs to; otherwise it begins a transaction. `Ok` releases the savepoint and hands the events to the
/// enclosing call (or, outermost, writes them and commits); `Err`, a panic or cancellation rolls back this
/// call's statements and events only. A task started with `tokio::spawn` does not inherit the transaction
/// (its calls commit on their own), and a call on another pool never joins. Concurrent calls in one task
/// (`tokio::join!`) take turns. The error type must implement `From<DbErr>`.
///
/// `#[read_only]` on a method of the block: no transaction of its own (its connection names the pool, or
/// the enclosing call's transaction when there is one, as a `DatabaseExecutor`); it cannot `emit!`.
///
/// `emit!(event, headers = [("tenant", id)])` adds headers. `emit!` inside a closure or an `async` block
/// (which may run after the commit), or inside another macro's input, is a compile error on that `emit!`;
/// only this crate's `emit!` (`emit!` or `outbox_seaorm::emit!`) is rewritten. When the method itself is
/// wrong (not async, no connection, no `Result`), that is the only error: its `emit!`s are neutralised.
///
/// # What it does, written by hand
///
/// This method:
///
/// ```no_run
/// # use outbox_seaorm::{DomainEvent, emit, transactional_outbox};
/// # use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(DomainEvent, Clone, Debug, Serialize, Deserialize)]
/// # #[domain_event(name = "order.placed", version = 1, aggregate = "order")]
/// # struct OrderPlaced { #[aggregate_id] order_id: String }
/// struct Orders {
///     db: DatabaseConnection,
/// }
///
/// #[transactional_outbox(conn = self.db)]
/// impl Orders {
///     async fn place(&self, order_id: String) -> Result<(), DbErr> {
///         self.db.execute_unprepared("INSERT INTO orders (id) VALUES ('o1')").await?;
///         emit!(OrderPlaced { order_id });
///         Ok(())
///     }
/// }
/// ```
///
/// does what this hand-written one does, with the public API (the generated code also hands the events of
/// a nested call to the outermost one, which writes them all with one insert just before its commit):
///
/// ```no_run
/// # use outbox_seaorm::DomainEvent;
/// # use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(DomainEvent, Clone, Debug, Serialize, Deserialize)]
/// # #[domain_event(name = "order.placed", version = 1, aggregate = "order")]
/// # struct OrderPlaced { #[aggregate_id] order_id: String }
/// # struct Orders { db: DatabaseConnection }
/// impl Orders {
///     async fn place(&self, order_id: String) -> Result<(), DbErr> {
///         // The task's outbox transaction on this pool, joined with a savepoint, or a new one.
///         let txn = outbox_seaorm::begin(&self.db).await?;
///         // In the body, `self.db` names the transaction.
///         txn.execute_unprepared("INSERT INTO orders (id) VALUES ('o1')").await?;
///         // `emit!`: the event, checked, in the same transaction.
///         let event = OrderPlaced { order_id }.to_new_event().map_err(|e| DbErr::Custom(e.to_string()))?;
///         outbox_seaorm::enqueue(&txn, &event).await.map_err(|e| DbErr::Custom(e.to_string()))?;
///         // `Ok`: commit. An early `Err` (or a panic, or cancellation) drops `txn`: rows and events roll back.
///         txn.commit().await
///     }
/// }
/// ```
#[proc_macro_attribute]
pub fn transactional_outbox(args: TokenStream, item: TokenStream) -> TokenStream {
    transactional::expand(args.into(), item.into()).into()
}

/// Makes `async fn name(txn: &DatabaseTransaction, event: E) -> Result<T, Err>` the handler a consumer
/// registers as it is written, `Consumer::new("billing").on(name)`: for each message, the consumer hands
/// over the decoded (and upcast) event and its own name, and the handler records the message in the inbox
/// (keyed by consumer and event id) and runs the body, in one transaction on the consumer's database (the
/// pool of its `.with_group_commit(SeaOrmGroupCommit::new(db))`; inside a group, the group's transaction).
/// A duplicate returns `InboxOutcome::Duplicate` without running the body. The body runs as the task's
/// outbox transaction: a `#[transactional_outbox]` call it makes on the same pool joins it, so that
/// service's rows and events commit with the inbox row.
///
/// - An optional third parameter, `envelope: &OutboxEvent`, gives the body the event's id, time, headers
///   and aggregate version.
/// - `events: Vec<E>` (or `Vec<Received<E>>`, with each envelope) instead of `event: E` takes several at
///   once, for `.on_batch(name)`: the body gets the events the inbox had not seen, and writes their effects
///   in one statement if it likes; its `Ok` value is dropped.
/// - The attribute takes no arguments: the consumer is named once, by `Consumer::new`.
/// - Outside a consumer (a test, a hand-written loop), `outbox_seaorm::deliver(&db, "billing", &message,
///   name)` calls it for one message.
///
/// ```ignore
/// #[idempotent_handler]
/// async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
///     invoice::ActiveModel { order_id: Set(event.order_id), ..Default::default() }.insert(txn).await?;
///     Ok(())
/// }
///
/// let billing = Consumer::new("billing").with_group_commit(SeaOrmGroupCommit::new(db)).on(bill);
/// ```
///
/// What it expands to, written by hand:
///
/// ```ignore
/// async fn bill(received: Received<OrderPlaced>) -> Result<InboxOutcome<()>, InboxError<DbErr>> {
///     let Received { event, envelope, consumer, .. } = received;
///     // The consumer's database: set by its group commit around every handler call.
///     outbox_seaorm::handle_once(&consumer_db, &consumer, &envelope.id.to_string(), async |txn| {
///         /* the body, with `txn` and `event` */
///     })
///     .await
/// }
/// ```
///
/// A consumer given no database cannot record: its `run` stops at the first message with
/// `Error::InvalidConfig` saying what to add, and nothing is acked or dead-lettered.
///
/// The function as written stays inside the handler under its own name, with its attributes: an attribute
/// macro such as `#[tracing::instrument(skip(txn))]` sees the function's own parameters. Docs, `#[cfg]`,
/// `#[deprecated]`, `#[must_use]` and lint levels (`#[allow]`, `#[expect]`, ...) go on the handler itself,
/// which holds the function, so they reach its body too.
#[proc_macro_attribute]
pub fn idempotent_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::expand(args.into(), item.into()).into()
}

//! Support for the generated code of `outbox-macros`; not a public API.

use std::marker::PhantomData;

pub use outbox_runtime::{DomainEvent, EventSchema, FieldSchema, InboxOutcome, OutboxEvent, Received};
pub use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, TransactionTrait};
pub use serde_json;

pub use crate::OutboxConnection;
pub use crate::error::InboxError;
pub use crate::inbox::{handle_once, handle_received, handle_received_batch};
pub use crate::transaction::{Reader, Unit};

use crate::transaction::into_db_err;

/// Errors of a `#[transactional_outbox]` method must absorb database errors.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot absorb `sea_orm::DbErr`, so a `#[transactional_outbox]` method cannot return it",
    label = "this error type has no `From<sea_orm::DbErr>`",
    note = "add `impl From<sea_orm::DbErr> for {Self}` (or a `#[from] DbErr` variant with thiserror): beginning, writing events and committing can fail"
)]
pub trait AbsorbsDbErr: Sized {
    /// Converts the database error.
    fn absorb(error: DbErr) -> Self;
}

impl<E: From<DbErr>> AbsorbsDbErr for E {
    fn absorb(error: DbErr) -> Self {
        E::from(error)
    }
}

/// Compile-time check, spanned at the user's event type.
pub fn assert_domain_event<E: DomainEvent>() {}

/// Joins the task's current outbox transaction on the same database with a savepoint, or begins one
/// (a savepoint when `db` is a transaction).
pub async fn begin<C: OutboxConnection + ?Sized>(db: &C) -> Result<Unit, DbErr> {
    Unit::begin(db).await
}

/// The body's name for its connection: `value` (the transaction, or a `#[read_only]` method's executor),
/// typed through `conn`. When `conn` is not a connection (one error, at `conn = …`), the type is unknown
/// and the body reports nothing more.
pub fn stand_in<'t, C: OutboxConnection + ?Sized, T: ?Sized>(_conn: &C, value: &'t T) -> &'t <C as Same<T>>::Out {
    value
}

/// `T`, for every connection; see [`stand_in`].
pub trait Same<T: ?Sized> {
    /// `T`.
    type Out: ?Sized;
}

impl<C: OutboxConnection + ?Sized, T: ?Sized> Same<T> for C {
    type Out = T;
}

/// What a `#[read_only]` method's body runs on.
pub fn reader<C: OutboxConnection + ?Sized>(db: &C) -> Reader<'_> {
    Reader::new(db)
}

/// Where `#[transactional_outbox(conn = …)]` finds its connection: the expression itself, or through an
/// `Arc`, a `Box` or a reference.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a SeaORM connection",
    label = "`conn = …` must name a `DatabaseConnection` or a `DatabaseTransaction` (or an `Arc`, `Box` or reference to one)"
)]
pub trait AsConnection {
    /// The connection reached.
    type Connection: OutboxConnection + ?Sized;
    /// Reaches it.
    fn as_connection(&self) -> &Self::Connection;
}

impl AsConnection for sea_orm::DatabaseConnection {
    type Connection = Self;
    fn as_connection(&self) -> &Self {
        self
    }
}

impl AsConnection for DatabaseTransaction {
    type Connection = Self;
    fn as_connection(&self) -> &Self {
        self
    }
}

impl<T: AsConnection + ?Sized> AsConnection for &T {
    type Connection = T::Connection;
    fn as_connection(&self) -> &T::Connection {
        (**self).as_connection()
    }
}

impl<T: AsConnection + ?Sized> AsConnection for std::sync::Arc<T> {
    type Connection = T::Connection;
    fn as_connection(&self) -> &T::Connection {
        (**self).as_connection()
    }
}

impl<T: AsConnection + ?Sized> AsConnection for Box<T> {
    type Connection = T::Connection;
    fn as_connection(&self) -> &T::Connection {
        (**self).as_connection()
    }
}

/// Records one emitted event; the payload is serialised and checked now, so a bad event fails at its
/// `emit!`. All of a business transaction's events are written together before its commit, in one round
/// trip per 1000 events.
pub fn emit<E: DomainEvent>(unit: &Unit, event: &E) -> Result<(), outbox_runtime::Error> {
    // The trace context of the `emit!` itself (with the `opentelemetry` feature).
    unit.push(outbox_runtime::trace_context::with_current(event.to_new_event()?));
    Ok(())
}

/// [`emit`] with headers (`emit!(event, headers = [("tenant", id)])`); a header name or value that is
/// not valid fails at the `emit!`.
pub fn emit_with_headers<E, K, V>(
    unit: &Unit,
    event: &E,
    headers: impl IntoIterator<Item = (K, V)>,
) -> Result<(), outbox_runtime::Error>
where
    E: DomainEvent,
    K: Into<String>,
    V: Into<String>,
{
    let mut new_event = event.to_new_event()?;
    for (name, value) in headers {
        new_event = new_event.with_header(name, value)?;
    }
    unit.push(outbox_runtime::trace_context::with_current(new_event));
    Ok(())
}

/// A failed `emit!` as the method's error `E`, chosen by autoref (`(&&&Absorb::<E>::new()).absorb(error)`):
/// kept typed when `E: From<outbox_seaorm::Error>` ([`ViaOutboxError`]), else as a database error
/// ([`ViaDbErr`]: `DbErr::Custom` with its text).
pub struct Absorb<E>(PhantomData<E>);

impl<E> Absorb<E> {
    /// The chooser for `E`.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Absorb(PhantomData)
    }
}

/// `E` takes the outbox's own error: a bad event stays an [`outbox_runtime::Error`] the caller can match.
pub trait ViaOutboxError<E> {
    /// Converts the error.
    fn absorb(&self, error: outbox_runtime::Error) -> E;
}

impl<E: From<outbox_runtime::Error>> ViaOutboxError<E> for &&Absorb<E> {
    fn absorb(&self, error: outbox_runtime::Error) -> E {
        E::from(error)
    }
}

/// `E` takes database errors only: the error's text in a `DbErr::Custom`.
pub trait ViaDbErr<E> {
    /// Converts the error.
    fn absorb(&self, error: outbox_runtime::Error) -> E;
}

impl<E: AbsorbsDbErr> ViaDbErr<E> for &Absorb<E> {
    fn absorb(&self, error: outbox_runtime::Error) -> E {
        E::absorb(into_db_err(error))
    }
}

/// `E` takes neither: `begin` and `finish` report that (once, at the error type), so no program with this
/// candidate compiles; it only keeps the `emit!` from adding a second error.
pub trait ViaNothing<E> {
    /// Never runs (see the trait).
    fn absorb(&self, error: outbox_runtime::Error) -> E;
}

impl<E> ViaNothing<E> for Absorb<E> {
    fn absorb(&self, error: outbox_runtime::Error) -> E {
        unreachable!("an error type without From<DbErr> is refused at compile time: {error}")
    }
}

/// A failed `emit!` as a database error, for a method whose error type the macro cannot read (an alias such
/// as `Result<T>`).
pub fn db_err(error: outbox_runtime::Error) -> DbErr {
    into_db_err(error)
}

/// The event as a trait object-free reference; its bound is what reports a non-event at the user's
/// expression.
pub fn event_ref<E: DomainEvent>(event: &E) -> &E {
    event
}

/// On `Ok`, hands the events to the enclosing call or writes them, and commits (a savepoint: releases);
/// on `Err`, rolls back, events included.
///
/// Writing the events last also keeps the lock on their aggregates' rows (which orders concurrent
/// writers of one aggregate) as short as the commit.
pub async fn finish<T, E: AbsorbsDbErr>(unit: Unit, result: Result<T, E>) -> Result<T, E> {
    unit.finish(result, E::absorb).await
}

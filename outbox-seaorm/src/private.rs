//! Support for the generated code of `outbox-macros`; not a public API.

pub use outbox_runtime::{DomainEvent, EventSchema, FieldSchema, InboxOutcome, OutboxEvent};
pub use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, TransactionTrait};
pub use serde_json;

pub use crate::error::InboxError;
pub use crate::inbox::handle_once;

use sea_orm::TransactionSession;

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

/// Begins a transaction, or a savepoint when `db` already is one.
pub async fn begin<C: TransactionTrait>(db: &C) -> Result<C::Transaction, DbErr> {
    db.begin().await
}

/// Where `#[transactional_outbox(conn = …)]` finds its connection: the expression itself, or through an
/// `Arc`, a `Box` or a reference.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a SeaORM connection",
    label = "`conn = …` must name a `DatabaseConnection` or a `DatabaseTransaction` (or an `Arc`, `Box` or reference to one)"
)]
pub trait AsConnection {
    /// The connection reached.
    type Connection: TransactionTrait<Transaction = DatabaseTransaction> + ?Sized;
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

/// The events a `#[transactional_outbox]` method emitted so far, in emit order.
#[derive(Default)]
pub struct Emitted(std::sync::Mutex<Vec<outbox_runtime::NewEvent>>);

impl Emitted {
    fn take(self) -> Vec<outbox_runtime::NewEvent> {
        self.0.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Records one emitted event; the payload is serialised and checked now, so a bad event fails at its
/// `emit!`. All of them are written together by [`finish`], in one round trip per 1000 events.
pub fn emit<E: DomainEvent>(emitted: &Emitted, event: &E) -> Result<(), DbErr> {
    // The trace context of the `emit!` itself (with the `opentelemetry` feature).
    let new_event = outbox_runtime::trace_context::with_current(event.to_new_event().map_err(into_db_err)?);
    emitted.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(new_event);
    Ok(())
}

/// [`emit`] with headers (`emit!(event, headers = [("tenant", id)])`); a header name or value that is
/// not valid fails at the `emit!`.
pub fn emit_with_headers<E, K, V>(
    emitted: &Emitted,
    event: &E,
    headers: impl IntoIterator<Item = (K, V)>,
) -> Result<(), DbErr>
where
    E: DomainEvent,
    K: Into<String>,
    V: Into<String>,
{
    let mut new_event = event.to_new_event().map_err(into_db_err)?;
    for (name, value) in headers {
        new_event = new_event.with_header(name, value).map_err(into_db_err)?;
    }
    let new_event = outbox_runtime::trace_context::with_current(new_event);
    emitted.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(new_event);
    Ok(())
}

/// The event as a trait object-free reference; its bound is what reports a non-event at the user's
/// expression.
pub fn event_ref<E: DomainEvent>(event: &E) -> &E {
    event
}

fn into_db_err(error: outbox_runtime::Error) -> DbErr {
    match error {
        outbox_runtime::Error::Store { source, .. } => match source.downcast::<DbErr>() {
            Ok(db_err) => *db_err,
            Err(other) => DbErr::Custom(other.to_string()),
        },
        other => DbErr::Custom(other.to_string()),
    }
}

/// On `Ok`, writes the emitted events and commits; on `Err`, rolls back (no event was written).
///
/// Writing the events last also keeps the lock on their aggregates' rows (which orders concurrent
/// writers of one aggregate) as short as the commit.
pub async fn finish<Txn, T, E>(txn: Txn, emitted: Emitted, result: Result<T, E>) -> Result<T, E>
where
    Txn: TransactionSession + ConnectionTrait + TransactionTrait,
    E: AbsorbsDbErr,
{
    match result {
        Ok(value) => {
            let events = emitted.take();
            if !events.is_empty() {
                crate::enqueue_all(&txn, &events).await.map_err(|e| E::absorb(into_db_err(e)))?;
            }
            txn.commit().await.map_err(E::absorb)?;
            if !events.is_empty() {
                // Committed now (for a savepoint, the outer commit signals again): an idle relay of this
                // process publishes at once instead of at its next poll.
                crate::notify_committed();
            }
            Ok(value)
        }
        Err(error) => {
            if let Err(rollback) = txn.rollback().await {
                // The connection drops the transaction anyway; the caller's error matters more.
                tracing::warn!(%rollback, "rollback after a failed #[transactional_outbox] body failed");
            }
            Err(error)
        }
    }
}

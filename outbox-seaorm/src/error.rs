//! Errors: the runtime's [`Error`], plus [`InboxError`] for handlers that bring their own error type.

use sea_orm::{DbBackend, DbErr};

pub use outbox_runtime::{Error, Result};

/// A readable name for a backend, used in error messages: `PostgreSQL`, `MySQL`, `SQLite`.
pub fn backend_name(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "PostgreSQL",
        DbBackend::MySql => "MySQL",
        DbBackend::Sqlite => "SQLite",
        _ => "unknown backend",
    }
}

/// Wraps a database error with what was being done, on which table, on which backend: the
/// [`Error::Store`] this crate returns, for tools that query the outbox tables themselves (`outbox-ops`).
pub fn store_error(operation: &'static str, table: &'static str, backend: DbBackend, source: DbErr) -> Error {
    Error::Store { operation, table, backend: backend_name(backend), source: Box::new(source) }
}

/// Why [`handle_once`](crate::handle_once) did not process a message. Either way the effect and the inbox
/// row were rolled back together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError<E> {
    /// The effect returned an error.
    #[error("effect failed: {0}")]
    Effect(#[source] E),
    /// The inbox itself failed (invalid consumer or message id, database error, a handler with no
    /// database). The runtime's error is its source, so a consumer finds a configuration error in it.
    #[error("{0}")]
    Outbox(#[from] Error),
}

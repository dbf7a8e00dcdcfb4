//! Errors: the runtime's [`Error`], plus [`InboxError`] for handlers that bring their own error type.

use sea_orm::{DbBackend, DbErr};

pub use outbox_core::{Error, Result};

/// A readable name for a backend, used in error messages.
pub(crate) fn backend_name(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "PostgreSQL",
        DbBackend::MySql => "MySQL",
        DbBackend::Sqlite => "SQLite",
        _ => "unknown backend",
    }
}

/// Wraps a database error with what was being done, on which table, on which backend.
pub(crate) fn store_error(operation: &'static str, table: &'static str, backend: DbBackend, source: DbErr) -> Error {
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
    /// The inbox itself failed (invalid consumer or message id, database error).
    #[error(transparent)]
    Outbox(#[from] Error),
}

impl<E> InboxError<E> {
    /// What a broker consumer should do with the message: park it when it can never be processed
    /// (unknown event type or version, undecodable payload, invalid id), retry it otherwise.
    pub fn disposition(&self) -> outbox_core::Disposition {
        match self {
            InboxError::Outbox(
                Error::UnknownEventType { .. }
                | Error::UnsupportedVersion { .. }
                | Error::Deserialize { .. }
                | Error::InvalidEvent { .. },
            ) => outbox_core::Disposition::Park,
            _ => outbox_core::Disposition::Retry,
        }
    }
}

/// The [`Disposition`](outbox_core::Disposition) of a handler's result: ack processed messages and
/// duplicates, park the unprocessable, retry the rest.
pub fn disposition<T, E>(result: &Result<outbox_core::InboxOutcome<T>, InboxError<E>>) -> outbox_core::Disposition {
    match result {
        Ok(_) => outbox_core::Disposition::Ack,
        Err(error) => error.disposition(),
    }
}

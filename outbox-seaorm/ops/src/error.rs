//! Errors: this crate returns [`outbox_seaorm::Error`], whose `Store` variant says what was being done, on
//! which table and backend.

use sea_orm::{DbBackend, DbErr};

use outbox_seaorm::Error;

/// Wraps a database error with what was being done, on which table, on which backend.
pub(crate) fn store_error(operation: &'static str, table: &'static str, backend: DbBackend, source: DbErr) -> Error {
    Error::Store { operation, table, backend: backend_name(backend), source: Box::new(source) }
}

/// The backend's name in errors and reports.
pub(crate) fn backend_name(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "PostgreSQL",
        DbBackend::MySql => "MySQL",
        DbBackend::Sqlite => "SQLite",
        _ => "unknown backend",
    }
}

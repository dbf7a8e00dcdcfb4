//! SeaORM entities for the outbox and inbox tables, for applications that want to query them.
//!
//! Times are UTC epoch milliseconds (`BIGINT`) on every backend: exact and identically ordered on
//! PostgreSQL, MySQL (whose `TIMESTAMP` keeps whole seconds) and SQLite (which has no time type).

pub mod inbox_message;
pub mod outbox_aggregate;
pub mod outbox_event;

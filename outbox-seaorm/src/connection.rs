//! What a `#[transactional_outbox]` method runs on.

use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseExecutor, DatabaseTransaction, TransactionTrait};

/// A connection a `#[transactional_outbox]` method can run on: a [`DatabaseConnection`] (the method joins
/// the task's current outbox transaction on that pool, or begins one) or a [`DatabaseTransaction`] (the
/// method joins it with a savepoint, so its events commit or roll back with the caller's transaction).
///
/// A method declared with `db: &DatabaseConnection` is widened to `db: &impl OutboxConnection`, so a
/// caller can also pass its own transaction. The trait is sealed: SeaORM's connection, transaction and
/// `DatabaseExecutor` implement it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a SeaORM connection the outbox can begin or join a transaction on",
    label = "expected a `&DatabaseConnection` or a `&DatabaseTransaction`",
    note = "a generic connection parameter needs the bound `C: outbox_seaorm::OutboxConnection`; inside a `#[transactional_outbox]` method the connection parameter names its transaction: pass it on as it is"
)]
pub trait OutboxConnection: ConnectionTrait + TransactionTrait<Transaction = DatabaseTransaction> + Sync {
    /// Whether this is a pool or a transaction; not a public API.
    #[doc(hidden)]
    fn __outbox_source(&self) -> ConnectionSource<'_>;
}

/// A pool or a transaction, as [`OutboxConnection`] sees it; not a public API.
#[doc(hidden)]
#[derive(Clone, Copy)]
pub enum ConnectionSource<'a> {
    /// A pool: the method joins the task's outbox transaction on it, or begins one.
    Pool(&'a DatabaseConnection),
    /// A transaction: the method begins a savepoint of it.
    Transaction(&'a DatabaseTransaction),
}

impl OutboxConnection for DatabaseConnection {
    fn __outbox_source(&self) -> ConnectionSource<'_> {
        ConnectionSource::Pool(self)
    }
}

impl OutboxConnection for DatabaseTransaction {
    fn __outbox_source(&self) -> ConnectionSource<'_> {
        ConnectionSource::Transaction(self)
    }
}

impl OutboxConnection for DatabaseExecutor<'_> {
    fn __outbox_source(&self) -> ConnectionSource<'_> {
        match self {
            DatabaseExecutor::Connection(db) => ConnectionSource::Pool(db),
            DatabaseExecutor::Transaction(txn) => ConnectionSource::Transaction(txn),
            DatabaseExecutor::OwnedTransaction(txn) => ConnectionSource::Transaction(txn),
        }
    }
}

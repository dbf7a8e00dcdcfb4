//! What a `#[transactional_outbox]` method runs on.

use sea_orm::{DatabaseConnection, DatabaseTransaction, TransactionTrait};

/// A connection a `#[transactional_outbox]` method can run on: a [`DatabaseConnection`] (the method begins
/// a transaction) or a [`DatabaseTransaction`] (the method joins it with a savepoint, so its events commit
/// or roll back with the caller's transaction).
///
/// A method declared with `db: &DatabaseConnection` is widened to `db: &impl OutboxConnection`, so one
/// annotated method can call another, and a caller can pass its own transaction.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a SeaORM connection a `#[transactional_outbox]` method can run on",
    label = "expected a `&DatabaseConnection` or a `&DatabaseTransaction`",
    note = "inside a `#[transactional_outbox]` method the connection parameter names its transaction: pass it on as it is"
)]
pub trait OutboxConnection: TransactionTrait<Transaction = DatabaseTransaction> + Sync {}

impl OutboxConnection for DatabaseConnection {}
impl OutboxConnection for DatabaseTransaction {}

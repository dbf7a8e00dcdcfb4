//! [`begin`]: an outbox transaction begun and ended the way `db.begin()` is, which the task's
//! `#[transactional_outbox]` calls on the same pool join.
//!
//! [`transaction`](super::transaction) makes its transaction the task's current one for the duration of a
//! closure (a tokio task-local). `begin` has no closure to scope, so its transaction is registered under
//! the task that began it (the thread, outside any task) until it is committed, rolled back or dropped;
//! the annotated calls look there after the task-local (see [`innermost`]).

use std::collections::HashMap;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use sea_orm::{
    AccessMode, ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, ExecResult, IsolationLevel, QueryResult,
    Statement, TransactionError, TransactionOptions, TransactionSession, TransactionTrait,
};

use super::{Frame, Unit};
use crate::connection::{ConnectionSource, OutboxConnection};

/// Who began a transaction: a tokio task, or a thread outside any task (a `block_on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    fn current() -> Self {
        match tokio::task::try_id() {
            Some(id) => Owner::Task(id),
            None => Owner::Thread(std::thread::current().id()),
        }
    }
}

/// The open transactions begun with [`begin`], per owner, innermost last.
static BEGUN: LazyLock<Mutex<HashMap<Owner, Vec<Arc<Frame>>>>> = LazyLock::new(Mutex::default);
/// How many there are: while none is open, an annotated call does not take the lock.
static OPEN: AtomicUsize = AtomicUsize::new(0);

fn begun() -> std::sync::MutexGuard<'static, HashMap<Owner, Vec<Arc<Frame>>>> {
    BEGUN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The innermost transaction the running task began with [`begin`] and has not ended.
pub(super) fn innermost() -> Option<Arc<Frame>> {
    if OPEN.load(Ordering::Acquire) == 0 {
        return None;
    }
    begun().get(&Owner::current()).and_then(|frames| frames.last().cloned())
}

fn register(frame: &Arc<Frame>) -> Owner {
    let owner = Owner::current();
    begun().entry(owner).or_default().push(Arc::clone(frame));
    OPEN.fetch_add(1, Ordering::AcqRel);
    owner
}

fn unregister(owner: Owner, frame: &Arc<Frame>) {
    let mut begun = begun();
    if let Some(frames) = begun.get_mut(&owner)
        && let Some(position) = frames.iter().position(|f| Arc::ptr_eq(f, frame))
    {
        frames.remove(position);
        OPEN.fetch_sub(1, Ordering::AcqRel);
        if frames.is_empty() {
            begun.remove(&owner);
        }
    }
}

/// Begins an outbox transaction on `db`, to use as you would `db.begin()`: every `#[transactional_outbox]`
/// call the same task makes on the same pool until you commit or roll back joins it (with a savepoint),
/// so their rows and events commit or roll back with yours.
///
/// ```no_run
/// # use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
/// # struct Orders; impl Orders { async fn place(&self, id: &str) -> Result<(), DbErr> { Ok(()) } }
/// # struct Payments; impl Payments { async fn capture(&self, id: &str) -> Result<(), DbErr> { Ok(()) } }
/// # async fn demo(db: &DatabaseConnection, orders: &Orders, payments: &Payments) -> Result<(), DbErr> {
/// let txn = outbox_seaorm::begin(db).await?; // not `db.begin()`, which these calls cannot see
/// txn.execute_unprepared("UPDATE carts SET closed = true WHERE id = 'c1'").await?;
/// orders.place("o1").await?; // `conn = self.db` methods on the same pool: they join `txn`
/// payments.capture("o1").await?;
/// txn.commit().await?; // the orders, the payment and their events; dropped or rolled back: none of them
/// # Ok(()) }
/// ```
///
/// The transaction belongs to the task that began it: a task started with `tokio::spawn` does not join
/// it. Inside an annotated call (or [`transaction`](super::transaction)) on the same pool, it is a
/// savepoint of that transaction. Events are written just before the commit, as an annotated method's.
///
/// # Errors
/// A database error of `BEGIN`, or a `#[transactional_outbox]` transaction on this database that the
/// outbox cannot tell is the same pool (built without the app's driver feature).
pub async fn begin<C: OutboxConnection + ?Sized>(db: &C) -> Result<OutboxTransaction, DbErr> {
    let unit = Unit::begin(db).await?;
    let owner = register(&unit.frame);
    Ok(OutboxTransaction { unit: Some(unit), owner })
}

/// A transaction from [`begin`]: a SeaORM connection (`ConnectionTrait`, `TransactionTrait`, and a
/// `DatabaseTransaction` through `Deref`) that the task's annotated calls on its pool join. Commit it
/// with [`commit`](Self::commit); dropping it rolls back, events included.
pub struct OutboxTransaction {
    /// `None` once committed or rolled back.
    unit: Option<Unit>,
    owner: Owner,
}

impl std::fmt::Debug for OutboxTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxTransaction").field("owner", &self.owner).finish_non_exhaustive()
    }
}

impl OutboxTransaction {
    fn unit(&self) -> &Unit {
        self.unit.as_ref().expect("an OutboxTransaction is used only until it is committed or rolled back")
    }

    fn end(&mut self) -> Option<Unit> {
        let unit = self.unit.take()?;
        unregister(self.owner, &unit.frame);
        Some(unit)
    }

    /// Writes the events of the calls that joined it and commits (releases the savepoint, inside another
    /// outbox transaction); the relays of this process are woken.
    ///
    /// # Errors
    /// A database error of the event insert or `COMMIT`; the transaction is rolled back then.
    pub async fn commit(mut self) -> Result<(), DbErr> {
        match self.end() {
            Some(unit) => unit.commit().await,
            None => Ok(()),
        }
    }

    /// Rolls back, the events of the calls that joined it included.
    ///
    /// # Errors
    /// None today; a failed `ROLLBACK` is logged (the connection ends the transaction anyway).
    pub async fn rollback(mut self) -> Result<(), DbErr> {
        if let Some(unit) = self.end() {
            unit.roll_back().await;
        }
        Ok(())
    }
}

impl Drop for OutboxTransaction {
    fn drop(&mut self) {
        // Unregistered now; the transaction rolls back as a dropped `DatabaseTransaction` does.
        drop(self.end());
    }
}

impl Deref for OutboxTransaction {
    type Target = DatabaseTransaction;

    fn deref(&self) -> &DatabaseTransaction {
        self.unit().txn()
    }
}

impl OutboxConnection for OutboxTransaction {
    fn __outbox_source(&self) -> ConnectionSource<'_> {
        ConnectionSource::Transaction(self.unit().txn())
    }
}

#[async_trait::async_trait]
impl ConnectionTrait for OutboxTransaction {
    fn get_database_backend(&self) -> DbBackend {
        self.unit().txn().get_database_backend()
    }

    async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
        self.unit().txn().execute_raw(stmt).await
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        self.unit().txn().execute_unprepared(sql).await
    }

    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        self.unit().txn().query_one_raw(stmt).await
    }

    async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
        self.unit().txn().query_all_raw(stmt).await
    }

    fn support_returning(&self) -> bool {
        self.unit().txn().support_returning()
    }
}

#[async_trait::async_trait]
impl TransactionTrait for OutboxTransaction {
    type Transaction = DatabaseTransaction;

    async fn begin(&self) -> Result<DatabaseTransaction, DbErr> {
        self.unit().txn().begin().await
    }

    async fn begin_with_config(
        &self,
        isolation_level: Option<IsolationLevel>,
        access_mode: Option<AccessMode>,
    ) -> Result<DatabaseTransaction, DbErr> {
        self.unit().txn().begin_with_config(isolation_level, access_mode).await
    }

    async fn begin_with_options(&self, options: TransactionOptions) -> Result<DatabaseTransaction, DbErr> {
        self.unit().txn().begin_with_options(options).await
    }

    async fn transaction<F, T, E>(&self, callback: F) -> Result<T, TransactionError<E>>
    where
        F: for<'c> FnOnce(&'c DatabaseTransaction) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>> + Send,
        T: Send,
        E: std::fmt::Display + std::fmt::Debug + Send,
    {
        self.unit().txn().transaction(callback).await
    }

    async fn transaction_with_config<F, T, E>(
        &self,
        callback: F,
        isolation_level: Option<IsolationLevel>,
        access_mode: Option<AccessMode>,
    ) -> Result<T, TransactionError<E>>
    where
        F: for<'c> FnOnce(&'c DatabaseTransaction) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>> + Send,
        T: Send,
        E: std::fmt::Display + std::fmt::Debug + Send,
    {
        self.unit().txn().transaction_with_config(callback, isolation_level, access_mode).await
    }
}

#[async_trait::async_trait]
impl TransactionSession for OutboxTransaction {
    async fn commit(self) -> Result<(), DbErr> {
        OutboxTransaction::commit(self).await
    }

    async fn rollback(self) -> Result<(), DbErr> {
        OutboxTransaction::rollback(self).await
    }
}

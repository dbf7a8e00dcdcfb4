//! Which transaction a `#[transactional_outbox]` method runs in, so that services compose.
//!
//! The outermost annotated call (or [`transaction`]) begins a transaction and, while its body runs, makes
//! it the task's *current outbox transaction* (a tokio task-local). An annotated call made inside it on the
//! same database (the same pool: any clone of the same `DatabaseConnection`, whatever service holds it)
//! joins it with a savepoint instead of beginning a transaction of its own on the pool. When the inner call
//! returns `Ok`, its savepoint is released and its events are handed to the enclosing call; when it
//! returns `Err`, panics or is cancelled, its savepoint and its events are rolled back and the enclosing
//! call goes on. The outermost call writes every event, in emit order, just before its commit.
//!
//! - **Another task**: `tokio::spawn` does not inherit the current transaction. An annotated call in a
//!   spawned task begins its own transaction and commits on its own, whatever the spawning method does.
//! - **Another database**: a call on another pool never joins; it begins its own transaction.
//! - **Concurrent calls in one task** (`tokio::join!`) take turns: savepoints are a stack, and two open at
//!   once on one connection would release each other.
//! - **A transaction of your own**: begin it with [`begin`] (as you would `db.begin()`) or [`transaction`]
//!   and the calls join it. One begun with `db.begin()` is invisible to a `conn = self.db` call, which
//!   begins its own transaction and commits on its own; passed to a method that takes its connection as a
//!   parameter, it is joined with a savepoint.
//! - **A consumer's group commit** (`SeaOrmGroupCommit`): calls that join the group's transaction share it
//!   without savepoints. A call that would roll its savepoint back *spoils* the group instead: the group is
//!   rolled back whole and its messages run again alone, where savepoints apply. The outcome is the one of
//!   running them alone, two statements (`SAVEPOINT`, `RELEASE`) cheaper per call.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use outbox_runtime::NewEvent;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseExecutor, DatabaseTransaction, DbBackend, DbErr,
    SqliteTransactionMode, TransactionOptions, TransactionTrait,
};
use tokio::sync::OwnedMutexGuard;

use crate::connection::{ConnectionSource, OutboxConnection};

mod begun;

pub use begun::{OutboxTransaction, begin};

tokio::task_local! {
    /// The innermost outbox transaction of the running task.
    static CURRENT: Arc<Frame>;
}

/// Runs `body` in a transaction that every `#[transactional_outbox]` call inside it joins: `Ok` commits the
/// body's own statements and the events of the calls together, `Err` rolls all of them back.
///
/// ```no_run
/// # use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
/// # struct Orders; impl Orders { async fn place(&self, id: &str) -> Result<(), DbErr> { Ok(()) } }
/// # async fn demo(db: &DatabaseConnection, orders: &Orders) -> Result<(), DbErr> {
/// outbox_seaorm::transaction(db, async |txn| {
///     txn.execute_unprepared("UPDATE carts SET closed = true WHERE id = 'c1'").await?;
///     orders.place("o1").await?; // a `conn = self.db` method on the same pool: joins `txn`
///     Ok::<_, DbErr>(())
/// })
/// .await
/// # }
/// ```
///
/// On a pool it begins a transaction, or joins the task's current outbox transaction on that pool with a
/// savepoint (so it composes like an annotated method). Inside an annotated method, its transaction (the
/// body's `self.db`) may be passed too.
///
/// # Errors
/// The body's error, or a database error of `BEGIN`, the event insert or `COMMIT`. A transaction the outbox
/// did not begin (`db.begin()`) is refused: annotated calls could not join it.
pub async fn transaction<C, T, E, F>(db: &C, body: F) -> Result<T, E>
where
    C: OutboxConnection + ?Sized,
    F: for<'c> AsyncFnOnce(&'c DatabaseTransaction) -> Result<T, E>,
    E: From<DbErr>,
{
    if let ConnectionSource::Transaction(txn) = db.__outbox_source()
        && ours(txn).is_none()
    {
        return Err(E::from(DbErr::Custom(
            "outbox_seaorm::transaction was given a transaction begun outside the outbox (`db.begin()`): the annotated calls inside could not tell it is on their database and would commit on their own; pass the pool (`&db`) instead".to_owned(),
        )));
    }
    let unit = Unit::begin(db).await.map_err(E::from)?;
    let result = unit.scope(body(unit.txn())).await;
    unit.finish(result, E::from).await
}

/// Identifies a connection pool: the address of the state every clone of one `DatabaseConnection` shares.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct PoolId(usize);

impl PoolId {
    /// `None` for a connection whose driver this crate was built without (or a mock).
    fn of(db: &DatabaseConnection) -> Option<Self> {
        #[allow(unused_imports)]
        use sea_orm::DatabaseConnectionType as Inner;
        let options: Option<*const ()> = match &db.inner {
            #[cfg(feature = "sqlx-postgres")]
            Inner::SqlxPostgresPoolConnection(_) => {
                Some(std::ptr::from_ref(db.get_postgres_connection_pool().options()).cast())
            }
            #[cfg(feature = "sqlx-mysql")]
            Inner::SqlxMySqlPoolConnection(_) => {
                Some(std::ptr::from_ref(db.get_mysql_connection_pool().options()).cast())
            }
            #[cfg(feature = "sqlx-sqlite")]
            Inner::SqlxSqlitePoolConnection(_) => {
                Some(std::ptr::from_ref(db.get_sqlite_connection_pool().options()).cast())
            }
            #[allow(unreachable_patterns)]
            _ => None,
        };
        options.map(|options| Self(options.addr()))
    }
}

/// A frame's statements: its own transaction or savepoint, or its group's transaction.
enum Txn {
    /// A transaction, or a savepoint of the [`Frame::joined`] frame's.
    Own(DatabaseTransaction),
    /// The transaction of the frame it joined, inside a [`Group`].
    Shared(Arc<Frame>),
}

/// A consumer group commit's transaction, which the calls joining it share (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct Group {
    spoiled: AtomicBool,
    /// The inbox rows the group wrote before its handlers ran, which their inbox writes claim.
    inbox: Mutex<RecordedAhead>,
}

impl Group {
    fn spoil(&self) {
        self.spoiled.store(true, Ordering::Relaxed);
    }

    /// The inbox rows the group recorded ahead.
    pub(crate) fn inbox(&self) -> std::sync::MutexGuard<'_, RecordedAhead> {
        self.inbox.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Spoils its group when dropped armed: a shared call that failed, panicked or was cancelled.
struct SpoilGuard(Option<Arc<Group>>);

impl SpoilGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for SpoilGuard {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            group.spoil();
        }
    }
}

/// One outbox transaction (or savepoint) of a task.
struct Frame {
    txn: Txn,
    /// The pool it runs on, when known: `None` for a savepoint of a transaction begun elsewhere.
    pool: Option<PoolId>,
    /// Events emitted in this frame, and those handed up by the calls that joined it, in emit order.
    pending: Mutex<Vec<NewEvent>>,
    /// Taken by each call that joins this frame, for as long as its savepoint is open.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// The frame whose transaction this one is a savepoint of, when it is this task's: events go there.
    joined: Option<Arc<Frame>>,
    /// The task's innermost frame when this one began (searched for a frame on the same pool).
    enclosing: Option<Arc<Frame>>,
    /// The group commit this frame is (part of), if any.
    group: Option<Arc<Group>>,
}

impl Frame {
    fn new(txn: DatabaseTransaction, pool: Option<PoolId>, joined: Option<Arc<Frame>>) -> Self {
        Self::with(Txn::Own(txn), pool, joined, None)
    }

    /// A call that shares `outer`'s group transaction; its events go to `outer`.
    fn shared(outer: Arc<Frame>, group: Arc<Group>) -> Self {
        let pool = outer.pool;
        Self::with(Txn::Shared(outer), pool, None, Some(group))
    }

    fn with(txn: Txn, pool: Option<PoolId>, joined: Option<Arc<Frame>>, group: Option<Arc<Group>>) -> Self {
        Self { txn, pool, pending: Mutex::default(), turn: Arc::default(), joined, enclosing: current(), group }
    }

    /// The transaction this frame's statements run in.
    fn txn(&self) -> &DatabaseTransaction {
        match &self.txn {
            Txn::Own(txn) => txn,
            Txn::Shared(outer) => outer.txn(),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<NewEvent>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This frame and the ones enclosing it, innermost first.
    fn chain(self: &Arc<Self>) -> impl Iterator<Item = &Arc<Frame>> {
        std::iter::successors(Some(self), |frame| frame.enclosing.as_ref())
    }

    /// `Ok`: releases the savepoint and hands the events up, or writes them and commits.
    async fn complete(self) -> Result<(), DbErr> {
        let events = self.pending.into_inner().unwrap_or_else(PoisonError::into_inner);
        match (self.txn, self.joined) {
            (Txn::Shared(outer), _) => outer.pending().extend(events),
            (Txn::Own(savepoint), Some(outer)) => {
                savepoint.commit().await?;
                outer.pending().extend(events);
            }
            (Txn::Own(txn), None) => {
                if !events.is_empty() {
                    crate::enqueue_all(&txn, &events).await.map_err(into_db_err)?;
                }
                txn.commit().await?;
                if !events.is_empty() {
                    // An idle relay of this process publishes at once instead of at its next poll (for a
                    // savepoint of a transaction begun elsewhere, that transaction's commit is still to come).
                    outbox_runtime::wake_relays();
                }
            }
        }
        Ok(())
    }
}

/// The task's innermost outbox transaction: of the closure scope it runs in ([`transaction`], an annotated
/// call) and the transaction it began with [`begin`], the one begun inside the other.
fn current() -> Option<Arc<Frame>> {
    let scoped = CURRENT.try_with(Arc::clone).ok();
    match (scoped, begun::innermost()) {
        (Some(scoped), Some(begun)) if begun.chain().any(|frame| Arc::ptr_eq(frame, &scoped)) => Some(begun),
        (scoped, begun) => scoped.or(begun),
    }
}

/// The task's outbox transaction that `txn` is, if any.
fn ours(txn: &DatabaseTransaction) -> Option<Arc<Frame>> {
    // Innermost first: of the frames sharing a group's transaction, the innermost is the caller's.
    current().and_then(|c| c.chain().find(|f| std::ptr::eq(f.txn(), txn)).cloned())
}

/// Begins a transaction that will write. On SQLite that is `BEGIN IMMEDIATE`, which takes the write lock
/// (waiting up to the busy timeout) before the first statement: a deferred transaction that reads first
/// fails at its first write with `database is locked` when another connection wrote since it began, at
/// once, without waiting (SQLite's deadlock avoidance).
pub(crate) async fn begin_writer(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    if db.get_database_backend() == DbBackend::Sqlite {
        let immediate = TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..Default::default()
        };
        db.begin_with_options(immediate).await
    } else {
        db.begin().await
    }
}

/// The task's innermost outbox transaction on `pool`, if any.
fn enclosing_on(db: &DatabaseConnection) -> Result<(Option<PoolId>, Option<Arc<Frame>>), DbErr> {
    let pool = PoolId::of(db);
    let backend = db.get_database_backend();
    let Some(current) = current() else { return Ok((pool, None)) };
    let mut unknown = false;
    for frame in current.chain() {
        if frame.txn().get_database_backend() != backend {
            continue;
        }
        match (frame.pool, pool) {
            (Some(theirs), Some(ours)) if theirs == ours => return Ok((pool, Some(Arc::clone(frame)))),
            (None, _) | (_, None) => unknown = true,
            _ => {}
        }
    }
    match (unknown, pool) {
        (true, None) => Err(DbErr::Custom(format!(
            "a #[transactional_outbox] call on a {backend:?} connection runs inside another outbox transaction on {backend:?}, and outbox-seaorm cannot tell whether they are the same database: build outbox-seaorm with the driver feature the app connects with (`sqlx-postgres`, `sqlx-mysql` or `sqlx-sqlite`)"
        ))),
        (true, Some(_)) => {
            tracing::warn!(
                ?backend,
                "a #[transactional_outbox] call on a pool runs inside a transaction begun outside the outbox (`db.begin()`), which it cannot tell is the same database: it begins its own transaction and commits on its own; begin the outer transaction with `outbox_seaorm::transaction` so that it is joined"
            );
            Ok((pool, None))
        }
        (false, _) => Ok((pool, None)),
    }
}

/// The transaction a `#[transactional_outbox]` method runs in, and the events it emits.
#[doc(hidden)]
pub struct Unit {
    frame: Arc<Frame>,
    /// This call's turn on the frame it joined.
    _turn: Option<OwnedMutexGuard<()>>,
    /// Armed while this call shares a group's transaction and has not completed.
    spoil: SpoilGuard,
}

impl Unit {
    /// Joins the task's current outbox transaction on the same database with a savepoint, or begins one.
    pub(crate) async fn begin<C: OutboxConnection + ?Sized>(conn: &C) -> Result<Self, DbErr> {
        match conn.__outbox_source() {
            ConnectionSource::Pool(db) => match enclosing_on(db)? {
                (_, Some(outer)) => Self::join(outer).await,
                (pool, None) => Ok(Self::outermost(Frame::new(begin_writer(db).await?, pool, None))),
            },
            ConnectionSource::Transaction(txn) => {
                // A parameter naming one of this task's outbox transactions (the method's own, passed on).
                match ours(txn) {
                    Some(outer) => Self::join(outer).await,
                    None => Ok(Self::outermost(Frame::new(txn.begin().await?, None, None))),
                }
            }
        }
    }

    /// Begins a consumer group's transaction on `db`, which the calls inside share (see the module's docs),
    /// or joins the task's current outbox transaction on `db` as [`begin`](Self::begin) does.
    pub(crate) async fn begin_group(db: &DatabaseConnection) -> Result<Self, DbErr> {
        match enclosing_on(db)? {
            (_, Some(outer)) => Self::join(outer).await,
            (pool, None) => {
                let txn = Txn::Own(begin_writer(db).await?);
                Ok(Self::outermost(Frame::with(txn, pool, None, Some(Arc::default()))))
            }
        }
    }

    /// The group whose transaction this unit shares, or begun.
    pub(crate) fn group(&self) -> Option<&Group> {
        self.frame.group.as_deref()
    }

    /// The group this unit began (not one it joined).
    pub(crate) fn own_group(&self) -> Option<&Group> {
        self.frame.group.as_deref().filter(|_| matches!(self.frame.txn, Txn::Own(_)))
    }

    /// Whether a call that shared this group's transaction failed: the group must roll back.
    pub(crate) fn spoiled(&self) -> bool {
        self.frame.group.as_ref().is_some_and(|group| group.spoiled.load(Ordering::Relaxed))
    }

    fn outermost(frame: Frame) -> Self {
        Self { frame: Arc::new(frame), _turn: None, spoil: SpoilGuard(None) }
    }

    async fn join(outer: Arc<Frame>) -> Result<Self, DbErr> {
        let turn = Arc::clone(&outer.turn).lock_owned().await;
        if let Some(group) = outer.group.clone() {
            let spoil = SpoilGuard(Some(Arc::clone(&group)));
            return Ok(Self { frame: Arc::new(Frame::shared(outer, group)), _turn: Some(turn), spoil });
        }
        let savepoint = outer.txn().begin().await?;
        let frame = Frame::new(savepoint, outer.pool, Some(outer));
        Ok(Self { frame: Arc::new(frame), _turn: Some(turn), spoil: SpoilGuard(None) })
    }

    /// The transaction (or savepoint) the method's body runs in.
    pub fn txn(&self) -> &DatabaseTransaction {
        self.frame.txn()
    }

    /// Runs the body with this unit as the task's current outbox transaction.
    pub async fn scope<F: Future>(&self, body: F) -> F::Output {
        CURRENT.scope(Arc::clone(&self.frame), body).await
    }

    pub(crate) fn push(&self, event: NewEvent) {
        self.frame.pending().push(event);
    }

    /// On `Ok`, hands the events up to the enclosing call or writes them, and commits (or releases the
    /// savepoint); on `Err`, rolls back, events included, and returns the error.
    pub(crate) async fn finish<T, E>(self, result: Result<T, E>, absorb: impl FnOnce(DbErr) -> E) -> Result<T, E> {
        match result {
            Ok(value) => self.commit().await.map(|()| value).map_err(absorb),
            Err(error) => {
                self.roll_back().await;
                Err(error)
            }
        }
    }

    async fn commit(self) -> Result<(), DbErr> {
        // The turn is held until the savepoint is released.
        let Self { frame, _turn, spoil } = self;
        // Only a future that outlived the call it was created in can still hold the frame; whoever drops
        // it last rolls the transaction back.
        let frame = Arc::try_unwrap(frame).map_err(|_| {
            DbErr::Custom(
                "the #[transactional_outbox] transaction is still held by a future that outlived its call; it was rolled back".to_owned(),
            )
        })?;
        frame.complete().await?;
        spoil.disarm();
        Ok(())
    }

    /// Ends a unit that wrote nothing (a message the inbox already holds): rolls back, except that a call
    /// sharing a group's transaction just ends, without spoiling the group.
    pub(crate) async fn abandon(self) {
        if matches!(self.frame.txn, Txn::Shared(_)) {
            let Self { frame: _, _turn, spoil } = self;
            spoil.disarm();
        } else {
            self.roll_back().await;
        }
    }

    /// Rolls back (a savepoint: to its start), events included; a call sharing a group's transaction
    /// spoils the group instead.
    pub(crate) async fn roll_back(self) {
        let Self { frame, _turn, spoil } = self;
        drop(spoil);
        // A frame still held elsewhere rolls back when its last holder drops it.
        if let Ok(Frame { txn: Txn::Own(txn), .. }) = Arc::try_unwrap(frame)
            && let Err(rollback) = txn.rollback().await
        {
            // The connection drops the transaction anyway; the caller's error matters more.
            tracing::warn!(%rollback, "rollback of an outbox transaction failed");
        }
    }
}

/// What a `#[read_only]` method runs its statements on: the task's current outbox transaction on the same
/// database when there is one (so it sees the enclosing call's writes), the connection itself otherwise.
#[doc(hidden)]
pub struct Reader<'a> {
    conn: ConnectionSource<'a>,
    joined: Option<Arc<Frame>>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new<C: OutboxConnection + ?Sized>(conn: &'a C) -> Self {
        let conn = conn.__outbox_source();
        let joined = match conn {
            ConnectionSource::Pool(db) => enclosing_on(db).ok().and_then(|(_, frame)| frame),
            ConnectionSource::Transaction(_) => None,
        };
        Self { conn, joined }
    }

    /// The executor the body's connection names.
    pub fn executor(&self) -> DatabaseExecutor<'_> {
        match (&self.joined, self.conn) {
            (Some(frame), _) => DatabaseExecutor::Transaction(frame.txn()),
            (None, ConnectionSource::Pool(db)) => DatabaseExecutor::Connection(db),
            (None, ConnectionSource::Transaction(txn)) => DatabaseExecutor::Transaction(txn),
        }
    }
}

pub(crate) fn into_db_err(error: outbox_runtime::Error) -> DbErr {
    match error {
        outbox_runtime::Error::Store { source, .. } => match source.downcast::<DbErr>() {
            Ok(db_err) => *db_err,
            Err(other) => DbErr::Custom(other.to_string()),
        },
        other => DbErr::Custom(other.to_string()),
    }
}

/// The inbox rows a group wrote before its handlers ran, and which of them the handlers claimed.
#[derive(Debug, Default)]
pub(crate) struct RecordedAhead {
    consumer: String,
    keys: HashMap<String, Ahead>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ahead {
    /// Inserted by the group, not claimed yet.
    New,
    /// Inserted by the group and claimed by a handler.
    Claimed,
    /// There before the group (committed by an earlier delivery).
    Seen,
}

impl RecordedAhead {
    /// The rows of `consumer`'s group: each message id, and whether the group inserted it (`false`: the row
    /// was there before).
    pub(crate) fn new(consumer: &str, rows: impl IntoIterator<Item = (String, bool)>) -> Self {
        let keys =
            rows.into_iter().map(|(id, inserted)| (id, if inserted { Ahead::New } else { Ahead::Seen })).collect();
        RecordedAhead { consumer: consumer.to_owned(), keys }
    }

    /// What an inbox write of `(consumer, message_id)` inside the group finds: `Some(true)` the group wrote
    /// the row for it (run the effect), `Some(false)` a duplicate (the row was there before, or another
    /// call of the group claimed it), `None` not recorded ahead (insert as usual).
    pub(crate) fn claim(&mut self, consumer: &str, message_id: &str) -> Option<bool> {
        if consumer != self.consumer {
            return None;
        }
        let key = self.keys.get_mut(message_id)?;
        let new = *key == Ahead::New;
        if new {
            *key = Ahead::Claimed;
        }
        Some(new)
    }

    /// The rows the group wrote that no handler claimed, sorted.
    pub(crate) fn unclaimed(&self) -> Vec<String> {
        let mut ids: Vec<String> =
            self.keys.iter().filter(|(_, key)| **key == Ahead::New).map(|(id, _)| id.clone()).collect();
        ids.sort_unstable();
        ids
    }
}

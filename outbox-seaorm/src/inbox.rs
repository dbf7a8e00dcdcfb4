//! Consumer-side de-duplication in the consumer's own database.

use chrono::Utc;
use std::collections::HashSet;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, Statement};

use outbox_runtime::consume::{AloneCall, GroupCalls, GroupCommit, GroupKeys, GroupOutcome};
use outbox_runtime::limits::{MAX_CONSUMER_LEN, MAX_MESSAGE_ID_LEN};
use outbox_runtime::{DomainEvent, Error, InboxOutcome, OutboxEvent, Received};
use sea_orm::DatabaseConnection;

use crate::OutboxConnection;
use crate::error::{InboxError, store_error};
use crate::transaction::{RecordedAhead, Unit};

/// Runs `effect` at most once per `(consumer, message_id)`.
///
/// Inserts the inbox row and runs the effect in ONE transaction (a savepoint when `db` is already a
/// transaction): a duplicate returns [`InboxOutcome::Duplicate`] without running the effect; an effect
/// error rolls back both, so the message can be retried. Concurrent deliveries of one message wait on the
/// inbox row: one processes, the others see a duplicate.
///
/// The effect runs as the task's current outbox transaction: a `#[transactional_outbox]` call it makes on
/// the same pool joins it, so the service's rows and events commit with the inbox row, or not at all.
///
/// ```no_run
/// # async fn demo(db: &sea_orm::DatabaseConnection, id: &str) -> Result<(), Box<dyn std::error::Error>> {
/// use sea_orm::ConnectionTrait;
/// let outcome = outbox_seaorm::handle_once(db, "billing", id, async |txn| {
///     txn.execute_unprepared("INSERT INTO invoices (order_id) VALUES ('o1')").await
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn handle_once<C, F, T, E>(
    db: &C,
    consumer: &str,
    message_id: &str,
    effect: F,
) -> Result<InboxOutcome<T>, InboxError<E>>
where
    C: OutboxConnection + ?Sized,
    F: for<'t> AsyncFnOnce(&'t DatabaseTransaction) -> Result<T, E>,
{
    outbox_runtime::__support::check_name("consumer", consumer, MAX_CONSUMER_LEN)?;
    outbox_runtime::__support::check_name("message_id", message_id, MAX_MESSAGE_ID_LEN)?;
    let backend = db.get_database_backend();
    let unit = Unit::begin(db).await.map_err(|e| store_error("begin", "inbox_messages", backend, e))?;
    // Inside a group commit, the group may have written this row already (one statement for the group).
    let ahead = unit.group().and_then(|group| group.inbox().claim(consumer, message_id));
    let inserted = match ahead {
        Some(new) => u64::from(new),
        None => match unit.txn().execute_raw(record_statement(backend, consumer, message_id)).await {
            Ok(result) => result.rows_affected(),
            Err(e) => {
                unit.roll_back().await;
                return Err(store_error("record a message", "inbox_messages", backend, e).into());
            }
        },
    };
    if inserted == 0 {
        unit.abandon().await;
        tracing::debug!(consumer, message_id, "duplicate message dropped by the inbox");
        return Ok(InboxOutcome::Duplicate);
    }
    let outcome = unit.scope(effect(unit.txn())).await.map_err(InboxError::Effect);
    let value = unit.finish(outcome, |e| store_error("commit", "inbox_messages", backend, e).into()).await?;
    Ok(InboxOutcome::Processed(value))
}

/// Runs `effect` once for the messages of `batch` that `consumer` has not processed before: the batch
/// form of [`handle_once`], for a [`Consumer::on_batch`](outbox_runtime::Consumer::on_batch) handler, so
/// that a group's effects can be one statement instead of one per message.
///
/// Records every message's inbox row (keyed by event id, as `#[idempotent_handler]` does) and runs the
/// effect with the new ones (moved out of the batch), in batch order, in ONE transaction (a savepoint when
/// `db` is already a transaction; inside a [`SeaOrmGroupCommit`], the group's, whose rows the group wrote
/// ahead). Returns each message's outcome, in batch order: the messages seen before (or twice in the
/// batch) are `Duplicate` and are not handed to the effect; when every message is one, the effect does
/// not run. An effect error rolls back the effect and every inbox row of the batch.
///
/// ```no_run
/// # use outbox_seaorm::{DomainEvent, Received};
/// # async fn demo<E: DomainEvent>(db: &sea_orm::DatabaseConnection, batch: Vec<Received<E>>) -> Result<(), Box<dyn std::error::Error>> {
/// use sea_orm::ConnectionTrait;
/// let outcomes = outbox_seaorm::handle_batch_once(db, "billing", batch, async |txn, new| {
///     // One statement for the effects of every new message.
///     let rows = vec!["('o1')"; new.len()].join(", ");
///     txn.execute_unprepared(&format!("INSERT INTO invoices (order_id) VALUES {rows}")).await.map(|_| ())
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn handle_batch_once<C, E, F, Err>(
    db: &C,
    consumer: &str,
    batch: Vec<Received<E>>,
    effect: F,
) -> Result<Vec<InboxOutcome<()>>, InboxError<Err>>
where
    C: OutboxConnection + ?Sized,
    F: for<'t> AsyncFnOnce(&'t DatabaseTransaction, Vec<Received<E>>) -> Result<(), Err>,
{
    outbox_runtime::__support::check_name("consumer", consumer, MAX_CONSUMER_LEN)?;
    let ids: Vec<String> = batch.iter().map(|received| received.envelope.id.to_string()).collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let backend = db.get_database_backend();
    let unit = Unit::begin(db).await.map_err(|e| store_error("begin", "inbox_messages", backend, e))?;
    // Inside a group commit, the group wrote the rows of its messages already.
    let mut new: Vec<Option<bool>> = match unit.group() {
        Some(group) => {
            let mut inbox = group.inbox();
            ids.iter().map(|id| inbox.claim(consumer, id)).collect()
        }
        None => vec![None; ids.len()],
    };
    let unrecorded: Vec<&str> = ids.iter().zip(&new).filter(|(_, n)| n.is_none()).map(|(id, _)| id.as_str()).collect();
    if !unrecorded.is_empty() {
        let recorded = record_all(unit.txn(), consumer, &unrecorded).await.and_then(|inserted| {
            inserted.ok_or_else(|| {
                DbErr::Custom("another delivery recorded a message of the batch meanwhile; retry".into())
            })
        });
        let mut inserted = match recorded {
            Ok(inserted) => inserted,
            Err(e) => {
                unit.roll_back().await;
                return Err(store_error("record messages", "inbox_messages", backend, e).into());
            }
        };
        for (id, new) in ids.iter().zip(new.iter_mut()).filter(|(_, n)| n.is_none()) {
            // A message twice in the batch is new once.
            *new = Some(inserted.remove(id));
        }
    }
    let new: Vec<bool> = new.into_iter().map(|n| n == Some(true)).collect();
    if !new.contains(&true) {
        unit.abandon().await;
        tracing::debug!(consumer, messages = batch.len(), "every message of the batch was a duplicate");
        return Ok(vec![InboxOutcome::Duplicate; batch.len()]);
    }
    let fresh: Vec<Received<E>> = batch.into_iter().zip(&new).filter(|(_, new)| **new).map(|(r, _)| r).collect();
    let outcome = unit.scope(effect(unit.txn(), fresh)).await.map_err(InboxError::Effect);
    unit.finish(outcome, |e| store_error("commit", "inbox_messages", backend, e).into()).await?;
    Ok(new.into_iter().map(|new| if new { InboxOutcome::Processed(()) } else { InboxOutcome::Duplicate }).collect())
}

tokio::task_local! {
    /// The pool of the consumer whose handler runs in this task: where an `#[idempotent_handler]` records
    /// its message (set by [`SeaOrmGroupCommit`] around every handler call, and by [`deliver`]).
    static HANDLER_DB: DatabaseConnection;
}

/// Calls a handler the way a consumer calls it, for one message: decoded (and upcast) for `consumer`,
/// with `db` as the database of its inbox write. For tests and hand-written loops; a [`Consumer`] with a
/// [`SeaOrmGroupCommit`] does this itself for every message.
///
/// ```no_run
/// # use outbox_seaorm::prelude::*;
/// # use sea_orm::{DatabaseConnection, DatabaseTransaction, DbErr};
/// # #[derive(DomainEvent, Clone, Debug, serde::Serialize, serde::Deserialize)]
/// # #[domain_event(name = "order.placed", version = 1, aggregate = "order")]
/// # struct OrderPlaced { #[aggregate_id] order_id: String }
/// #[idempotent_handler]
/// async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
///     Ok(())
/// }
///
/// # async fn demo(db: &DatabaseConnection, message: &outbox_seaorm::OutboxEvent) -> Result<(), Box<dyn std::error::Error>> {
/// let outcome = outbox_seaorm::deliver(db, "billing", message, bill).await?;
/// assert_eq!(outcome, InboxOutcome::Processed(()));
/// # Ok(()) }
/// ```
///
/// [`Consumer`]: outbox_runtime::Consumer
pub async fn deliver<E, H, Fut, O, Err>(
    db: &DatabaseConnection,
    consumer: &str,
    message: &OutboxEvent,
    handler: H,
) -> Result<O, InboxError<Err>>
where
    E: DomainEvent,
    H: FnOnce(Received<E>) -> Fut,
    Fut: std::future::Future<Output = Result<O, InboxError<Err>>>,
{
    let received = Received::decode(consumer, message.clone(), 1)?;
    HANDLER_DB.scope(db.clone(), handler(received)).await
}

/// The pool the running handler records its message in; an error that stops the consumer when there is
/// none.
pub(crate) fn handler_db(consumer: &str, event_type: &str) -> Result<DatabaseConnection, Error> {
    HANDLER_DB.try_with(DatabaseConnection::clone).map_err(|_| {
        Error::invalid_config(
            "group_commit",
            format!(
                "the `#[idempotent_handler]` of `{event_type}` records its messages in its consumer's database, and consumer `{consumer}` was given none: build it with `.with_group_commit(SeaOrmGroupCommit::new(db))` (outside a consumer, call the handler through `outbox_seaorm::deliver`)"
            ),
        )
    })
}

/// What an `#[idempotent_handler]` runs for one message: [`handle_once`] on its consumer's database.
pub async fn handle_received<F, T, E>(
    consumer: &str,
    message: &OutboxEvent,
    effect: F,
) -> Result<InboxOutcome<T>, InboxError<E>>
where
    F: for<'t> AsyncFnOnce(&'t DatabaseTransaction) -> Result<T, E>,
{
    let db = handler_db(consumer, &message.event_type)?;
    handle_once(&db, consumer, &message.id.to_string(), effect).await
}

/// What an `#[idempotent_handler]` taking several events runs: [`handle_batch_once`] on its consumer's
/// database.
pub async fn handle_received_batch<E, F, Err>(
    batch: Vec<Received<E>>,
    effect: F,
) -> Result<Vec<InboxOutcome<()>>, InboxError<Err>>
where
    F: for<'t> AsyncFnOnce(&'t DatabaseTransaction, Vec<Received<E>>) -> Result<(), Err>,
{
    let Some(first) = batch.first() else { return Ok(Vec::new()) };
    let consumer = std::sync::Arc::clone(&first.consumer);
    let db = handler_db(&consumer, &first.envelope.event_type)?;
    handle_batch_once(&db, &consumer, batch, effect).await
}

/// Group commit on a SeaORM pool, for [`Consumer::with_group_commit`](outbox_runtime::Consumer::with_group_commit):
/// the handlers of a group run inside one transaction on `db`, and every [`handle_once`] (or
/// `#[idempotent_handler]`, `#[transactional_outbox]` call) they make on the same pool joins it. One
/// commit, one fsync, per group instead of per message.
///
/// The calls share the group's transaction without savepoints: a call that fails (or whose effect
/// fails) would roll its savepoint back, and instead makes the whole group roll back, after which each
/// message runs again alone, with its own transaction and savepoints. The outcome is the same as
/// running the messages alone, for two statements fewer per call.
///
/// The group also writes its messages' inbox rows (under the consumer's name, keyed by event id, as
/// `#[idempotent_handler]` does) in one statement before the handlers run: a `handle_once` call for one
/// of them then runs its effect without an insert of its own, or returns `Duplicate` for a row that was
/// there before, so a grouped message costs its effect's statements alone. A row no handler claimed
/// (a handler that records under another name, or none) is deleted before the commit: the inbox holds
/// what the handlers recorded, as without a group.
///
/// ```no_run
/// # use outbox_seaorm::{Consumer, SeaOrmGroupCommit};
/// # fn demo(db: sea_orm::DatabaseConnection) -> outbox_seaorm::Result<Consumer> {
/// let consumer = Consumer::new("billing").with_group_commit(SeaOrmGroupCommit::new(db.clone()));
/// # Ok(consumer) }
/// ```
///
/// A handler that writes through another pool or database commits on its own, as without a group.
#[derive(Clone, Debug)]
pub struct SeaOrmGroupCommit {
    db: DatabaseConnection,
    /// On MySQL/MariaDB, how the open transaction is probed (see [`still_open`]).
    mysql_probe: std::sync::Arc<std::sync::atomic::AtomicU8>,
}

impl SeaOrmGroupCommit {
    /// Groups on `db`, the pool the handlers' inbox writes use.
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db, mysql_probe: std::sync::Arc::default() }
    }
}

impl GroupCommit for SeaOrmGroupCommit {
    fn run<'a>(&'a self, keys: &'a GroupKeys, calls: GroupCalls<'a>) -> GroupOutcome<'a> {
        Box::pin(async move {
            let backend = self.db.get_database_backend();
            let unit =
                Unit::begin_group(&self.db).await.map_err(|e| store_error("begin", "inbox_messages", backend, e))?;
            if let Some(group) = unit.own_group() {
                match record_ahead(unit.txn(), keys).await {
                    Ok(Some(recorded)) => *group.inbox() = recorded,
                    Ok(None) => {
                        // Another delivery of one of the messages committed its row meanwhile (MySQL,
                        // which cannot say which): the messages run alone, where each insert tells.
                        tracing::debug!("an inbox row of the group was written concurrently; its messages run alone");
                        unit.roll_back().await;
                        return Ok(false);
                    }
                    Err(e) => {
                        unit.roll_back().await;
                        return Err(store_error("record messages", "inbox_messages", backend, e).into());
                    }
                }
            }
            let ran = unit.scope(HANDLER_DB.scope(self.db.clone(), calls)).await && !unit.spoiled();
            let unclaimed = unit.own_group().map(|group| group.inbox().unclaimed()).unwrap_or_default();
            if ran && !unclaimed.is_empty() {
                let forget = key_statement(backend, "DELETE FROM", &keys.consumer, &unclaimed);
                if let Err(e) = unit.txn().execute_raw(forget).await {
                    unit.roll_back().await;
                    return Err(store_error("delete unclaimed inbox rows", "inbox_messages", backend, e).into());
                }
            }
            if ran && still_open(unit.txn(), &self.mysql_probe).await {
                unit.finish(Ok(()), |e| store_error("commit", "inbox_messages", backend, e)).await?;
                Ok(true)
            } else {
                unit.roll_back().await;
                Ok(false)
            }
        })
    }
    fn run_alone<'a>(&'a self, call: AloneCall<'a>) -> AloneCall<'a> {
        Box::pin(HANDLER_DB.scope(self.db.clone(), call))
    }
}

/// Whether the group's transaction is still open and can commit what its handlers did. A handler that
/// swallowed a database error could have left it unable to: PostgreSQL aborts a transaction on an error
/// outside a savepoint (and its `COMMIT` then rolls back without an error), and MySQL/MariaDB roll the whole
/// transaction back on a deadlock and run later statements outside it. Committing then would ack messages
/// whose effects are gone; instead the group rolls back and its messages run alone. A group that wrote
/// nothing (every message a duplicate) reads as not open, and runs alone: slower, never wrong. SQLite ends
/// a transaction on its own only on I/O errors, a full disk or memory exhaustion, and is not probed.
async fn still_open(txn: &DatabaseTransaction, mysql_probe: &std::sync::atomic::AtomicU8) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    // MariaDB (10.3+) tells directly and cheaply; MySQL has no such variable, and is asked InnoDB (a query
    // over every open transaction, measured to halve a group's throughput on MariaDB: only as a fallback).
    const MARIADB: &str = "SELECT CAST(@@in_transaction AS SIGNED) AS open";
    const INNODB: &str =
        "SELECT COUNT(*) AS open FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = CONNECTION_ID()";
    const UNKNOWN: u8 = 0;
    const USE_INNODB: u8 = 2;
    let backend = txn.get_database_backend();
    let ask = async |sql: &str| match txn.query_one_raw(Statement::from_string(backend, sql)).await {
        Ok(Some(row)) => row.try_get::<i64>("", "open").map(|n| n > 0).map_err(|_| ()),
        Ok(None) | Err(_) => Err(()),
    };
    let open = match backend {
        // An open transaction that wrote has an id; an aborted one fails the statement; after the transaction
        // ended, the probe runs in a transaction of its own, without an id.
        DbBackend::Postgres => {
            ask("SELECT CAST(CASE WHEN txid_current_if_assigned() IS NULL THEN 0 ELSE 1 END AS BIGINT) AS open")
                .await
                .unwrap_or(false)
        }
        DbBackend::MySql if mysql_probe.load(Relaxed) == USE_INNODB => ask(INNODB).await.unwrap_or(false),
        DbBackend::MySql => match ask(MARIADB).await {
            Ok(open) => open,
            // MySQL: no `@@in_transaction` (a failed statement leaves its transaction as it was).
            Err(()) if mysql_probe.load(Relaxed) == UNKNOWN => match ask(INNODB).await {
                Ok(open) => {
                    mysql_probe.store(USE_INNODB, Relaxed);
                    open
                }
                Err(()) => false,
            },
            Err(()) => false,
        },
        _ => return true,
    };
    if !open {
        tracing::warn!(
            ?backend,
            "the group's transaction was aborted or rolled back under a handler that did not return the error; rolling the group back, its messages run alone"
        );
    }
    open
}

/// `INSERT` that affects 0 rows for a duplicate: `ON CONFLICT DO NOTHING` on PostgreSQL and SQLite,
/// `INSERT IGNORE` on MySQL (whose `ON DUPLICATE KEY UPDATE` would report 1 row).
fn record_statement(backend: DbBackend, consumer: &str, message_id: &str) -> Statement {
    let (verb, tail) = match backend {
        DbBackend::MySql => ("INSERT IGNORE INTO", ""),
        _ => ("INSERT INTO", " ON CONFLICT DO NOTHING"),
    };
    insert_statement(backend, verb, tail, consumer, &[message_id], Utc::now().timestamp_millis())
}

/// Writes the inbox rows of a group's messages in one statement (two on MySQL) and tells which were new.
/// `Ok(None)`: on MySQL, a row appeared between the read and the insert (it cannot say which).
async fn record_ahead(txn: &DatabaseTransaction, keys: &GroupKeys) -> Result<Option<RecordedAhead>, DbErr> {
    let consumer = keys.consumer.as_str();
    let mut ids: Vec<&str> = keys.message_ids.iter().map(String::as_str).collect();
    ids.retain(|id| outbox_runtime::__support::check_name("message_id", id, MAX_MESSAGE_ID_LEN).is_ok());
    if ids.is_empty() || outbox_runtime::__support::check_name("consumer", consumer, MAX_CONSUMER_LEN).is_err() {
        return Ok(Some(RecordedAhead::default()));
    }
    let Some(new) = record_all(txn, consumer, &ids).await? else { return Ok(None) };
    Ok(Some(RecordedAhead::new(consumer, ids.into_iter().map(|id| (id.to_owned(), new.contains(id))))))
}

/// Inserts the inbox rows of `ids` (valid names) that are not there yet, in one statement (two on MySQL),
/// and returns those it inserted. Keys are inserted in sorted order, so two writers sharing keys lock them
/// in the same order. `Ok(None)`: on MySQL, a row appeared between the read and the insert (it cannot say
/// which).
async fn record_all(txn: &DatabaseTransaction, consumer: &str, ids: &[&str]) -> Result<Option<HashSet<String>>, DbErr> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut inserted = HashSet::new();
    // Three bound values per row: chunks stay far below every backend's limit on bound values.
    for chunk in ids.chunks(RECORD_CHUNK) {
        match record_chunk(txn, consumer, chunk).await? {
            Some(rows) => inserted.extend(rows),
            None => return Ok(None),
        }
    }
    Ok(Some(inserted))
}

/// Most inbox rows one statement writes.
const RECORD_CHUNK: usize = 1000;

/// [`record_all`] for sorted, distinct ids, at most [`RECORD_CHUNK`] of them.
async fn record_chunk(
    txn: &DatabaseTransaction,
    consumer: &str,
    ids: &[&str],
) -> Result<Option<HashSet<String>>, DbErr> {
    let backend = txn.get_database_backend();
    let now = Utc::now().timestamp_millis();
    let message_ids = |rows: Vec<sea_orm::QueryResult>| -> Result<HashSet<String>, DbErr> {
        rows.iter().map(|row| row.try_get::<String>("", "message_id")).collect()
    };
    match backend {
        DbBackend::MySql => {
            // No `RETURNING`: read which rows are there, then insert the others; a count that differs
            // means a row was committed in between.
            let seen = key_statement(backend, "SELECT message_id FROM", consumer, ids);
            let seen = message_ids(txn.query_all_raw(seen).await?)?;
            let fresh: Vec<&str> = ids.iter().copied().filter(|id| !seen.contains(*id)).collect();
            if !fresh.is_empty() {
                let insert = insert_statement(backend, "INSERT IGNORE INTO", "", consumer, &fresh, now);
                if txn.execute_raw(insert).await?.rows_affected() != fresh.len() as u64 {
                    return Ok(None);
                }
            }
            Ok(Some(fresh.into_iter().map(str::to_owned).collect()))
        }
        _ => {
            let tail = " ON CONFLICT DO NOTHING RETURNING message_id";
            let insert = insert_statement(backend, "INSERT INTO", tail, consumer, ids, now);
            Ok(Some(message_ids(txn.query_all_raw(insert).await?)?))
        }
    }
}

/// `{verb} inbox_messages (…) VALUES (…), (…){tail}`, one row per id.
fn insert_statement(backend: DbBackend, verb: &str, tail: &str, consumer: &str, ids: &[&str], now: i64) -> Statement {
    let mut values = Vec::with_capacity(ids.len() * 3);
    let rows: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            values.extend([consumer.into(), (*id).into(), now.into()]);
            match backend {
                DbBackend::Postgres => format!("(${}, ${}, ${})", 3 * i + 1, 3 * i + 2, 3 * i + 3),
                _ => "(?, ?, ?)".to_owned(),
            }
        })
        .collect();
    let sql = format!("{verb} inbox_messages (consumer, message_id, processed_at_ms) VALUES {}{tail}", rows.join(", "));
    Statement::from_sql_and_values(backend, sql, values)
}

/// `{verb} inbox_messages WHERE consumer = … AND message_id IN (…)`.
fn key_statement<S: AsRef<str>>(backend: DbBackend, verb: &str, consumer: &str, ids: &[S]) -> Statement {
    let placeholders: Vec<String> = (0..ids.len())
        .map(|i| match backend {
            DbBackend::Postgres => format!("${}", i + 2),
            _ => "?".to_owned(),
        })
        .collect();
    let first = if backend == DbBackend::Postgres { "$1" } else { "?" };
    let sql = format!("{verb} inbox_messages WHERE consumer = {first} AND message_id IN ({})", placeholders.join(", "));
    let values = std::iter::once(consumer.into()).chain(ids.iter().map(|id| id.as_ref().into()));
    Statement::from_sql_and_values(backend, sql, values)
}

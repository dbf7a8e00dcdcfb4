//! Consumer-side de-duplication in the consumer's own database.

use chrono::Utc;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, Statement};

use outbox_runtime::consume::{GroupCalls, GroupCommit, GroupOutcome};
use outbox_runtime::{InboxOutcome, MAX_CONSUMER_LEN, MAX_MESSAGE_ID_LEN};
use sea_orm::DatabaseConnection;

use crate::OutboxConnection;
use crate::error::{InboxError, store_error};
use crate::transaction::Unit;

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
    outbox_runtime::check_name("consumer", consumer, MAX_CONSUMER_LEN)?;
    outbox_runtime::check_name("message_id", message_id, MAX_MESSAGE_ID_LEN)?;
    let backend = db.get_database_backend();
    let unit = Unit::begin(db).await.map_err(|e| store_error("begin", "inbox_messages", backend, e))?;
    let recorded = unit.txn().execute_raw(record_statement(backend, consumer, message_id)).await;
    let inserted = match recorded {
        Ok(result) => result.rows_affected(),
        Err(e) => {
            unit.roll_back().await;
            return Err(store_error("record a message", "inbox_messages", backend, e).into());
        }
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
/// ```no_run
/// # use outbox_seaorm::{Consumer, SeaOrmGroupCommit};
/// # fn demo(db: sea_orm::DatabaseConnection) -> outbox_seaorm::Result<Consumer> {
/// let consumer = Consumer::new("billing")?.with_group_commit(SeaOrmGroupCommit::new(db.clone()));
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
    fn run<'a>(&'a self, calls: GroupCalls<'a>) -> GroupOutcome<'a> {
        Box::pin(async move {
            let backend = self.db.get_database_backend();
            let unit =
                Unit::begin_group(&self.db).await.map_err(|e| store_error("begin", "inbox_messages", backend, e))?;
            if unit.scope(calls).await && !unit.spoiled() && still_open(unit.txn(), &self.mysql_probe).await {
                unit.finish(Ok(()), |e| store_error("commit", "inbox_messages", backend, e)).await?;
                Ok(true)
            } else {
                unit.roll_back().await;
                Ok(false)
            }
        })
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
    let sql = match backend {
        DbBackend::Postgres => {
            "INSERT INTO inbox_messages (consumer, message_id, processed_at_ms) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
        }
        DbBackend::MySql => {
            "INSERT IGNORE INTO inbox_messages (consumer, message_id, processed_at_ms) VALUES (?, ?, ?)"
        }
        _ => {
            "INSERT INTO inbox_messages (consumer, message_id, processed_at_ms) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
        }
    };
    Statement::from_sql_and_values(
        backend,
        sql,
        [consumer.into(), message_id.into(), Utc::now().timestamp_millis().into()],
    )
}

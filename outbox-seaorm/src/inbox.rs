//! Consumer-side de-duplication in the consumer's own database.

use chrono::Utc;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, Statement};

use outbox_runtime::{InboxOutcome, MAX_CONSUMER_LEN, MAX_MESSAGE_ID_LEN};

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
        unit.roll_back().await;
        tracing::debug!(consumer, message_id, "duplicate message dropped by the inbox");
        return Ok(InboxOutcome::Duplicate);
    }
    let outcome = unit.scope(effect(unit.txn())).await.map_err(InboxError::Effect);
    let value = unit.finish(outcome, |e| store_error("commit", "inbox_messages", backend, e).into()).await?;
    Ok(InboxOutcome::Processed(value))
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

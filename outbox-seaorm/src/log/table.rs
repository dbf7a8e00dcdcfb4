//! What the log relay writes back to `outbox_events`, so the table still knows what was published (stats,
//! dashboard, cleanup, the catch-up after a lost slot): published marks in bulk, dead rows, and rows
//! waiting behind a dead one.

use std::collections::HashMap;

use chrono::Utc;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait, Value};

use outbox_runtime::{EventId, Headers, OutboxEvent};

use crate::error::store_error;

use super::LogError;

/// The `last_error` of a row waiting behind a dead event of its aggregate: how a restarted relay finds
/// the aggregates it must not publish from the log until the dead event is replayed or discarded.
pub(super) const WAITING: &str = "waiting behind dead event";

/// An aggregate: `(aggregate_type, aggregate_id)`.
pub(super) type Aggregate = (String, String);

/// What one window left to record.
#[derive(Clone, Debug, Default)]
pub(super) struct Outcome {
    /// Confirmed by the broker.
    pub(super) published: Vec<i64>,
    /// Dead: `(seq, why)`.
    pub(super) dead: Vec<(i64, String)>,
    /// Not published because an earlier event of their aggregate is dead: `(seq, the dead event's id)`.
    pub(super) waiting: Vec<(i64, String)>,
    /// The transactions that wrote these rows (their 32-bit ids, from the log).
    pub(super) xids: Vec<u32>,
}

impl Outcome {
    pub(super) fn is_empty(&self) -> bool {
        self.published.is_empty() && self.dead.is_empty() && self.waiting.is_empty()
    }

    /// Rows to record.
    pub(super) fn rows(&self) -> usize {
        self.published.len() + self.dead.len() + self.waiting.len()
    }

    /// Adds `other`'s rows (a later window's) to these.
    pub(super) fn merge(&mut self, other: Outcome) {
        self.published.extend(other.published);
        self.dead.extend(other.dead);
        self.waiting.extend(other.waiting);
        for xid in other.xids {
            if !self.xids.contains(&xid) {
                self.xids.push(xid);
            }
        }
    }
}

/// Records `outcome`: one statement for the published rows (an `UPDATE`, or with `delete` a `DELETE`), one
/// per dead or waiting row (rare), in one transaction. A row already published keeps its first time.
///
/// The log hands over a transaction as soon as its commit record is flushed, a moment before the commit is
/// visible to other transactions' snapshots: a statement run at once may not see its rows (measured: a few
/// rows in 20,000 went unrecorded before this wait). So the record first waits until every transaction of
/// `outcome.xids` is visible (1 ms doubling to 100 ms between looks), then writes.
pub(super) async fn record(
    db: &DatabaseConnection,
    outcome: &Outcome,
    now_ms: i64,
    delete: bool,
) -> Result<(), LogError> {
    let mut wait = std::time::Duration::from_millis(1);
    while !visible(db, &outcome.xids).await? {
        tracing::trace!(?wait, "a transaction the log delivered is not visible yet");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(std::time::Duration::from_millis(100));
    }
    let error = db_error("record what the log relay published");
    let txn = db.begin().await.map_err(&error)?;
    if !outcome.published.is_empty() {
        let seqs = array(&outcome.published);
        if delete {
            let sql = "DELETE FROM outbox_events WHERE seq = ANY($1::bigint[]) AND published_at_ms IS NULL";
            txn.execute_raw(statement(sql, vec![seqs.into()])).await.map_err(&error)?;
        } else {
            let sql = "UPDATE outbox_events SET published_at_ms = $1, lease_token = NULL, lease_until_ms = NULL \
                       WHERE seq = ANY($2::bigint[]) AND published_at_ms IS NULL";
            txn.execute_raw(statement(sql, vec![now_ms.into(), seqs.into()])).await.map_err(&error)?;
        }
    }
    for (seq, why) in &outcome.dead {
        let sql = "UPDATE outbox_events SET dead_at_ms = $1, attempts = attempts + 1, last_error = $2 \
                   WHERE seq = $3 AND published_at_ms IS NULL";
        txn.execute_raw(statement(sql, vec![now_ms.into(), why.clone().into(), (*seq).into()]))
            .await
            .map_err(&error)?;
    }
    for (seq, dead_id) in &outcome.waiting {
        let sql = "UPDATE outbox_events SET last_error = $1 WHERE seq = $2 AND published_at_ms IS NULL \
                   AND dead_at_ms IS NULL";
        txn.execute_raw(statement(sql, vec![format!("{WAITING} {dead_id}").into(), (*seq).into()]))
            .await
            .map_err(&error)?;
    }
    txn.commit().await.map_err(&error)
}

/// Whether a snapshot taken now sees every transaction of `xids` (32-bit ids, widened to 64 bits with
/// the epoch of the snapshot's `xmax`; a transaction the log delivered is never older than one epoch).
async fn visible(db: &DatabaseConnection, xids: &[u32]) -> Result<bool, LogError> {
    if xids.is_empty() {
        return Ok(true);
    }
    let sql = "WITH now AS (SELECT pg_current_snapshot() AS snapshot, \
               pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax), \
               wide AS (SELECT snapshot, CASE WHEN ((xmax >> 32) << 32 | x) > xmax \
               THEN (((xmax >> 32) - 1) << 32 | x) ELSE ((xmax >> 32) << 32 | x) END AS xid \
               FROM now, unnest($1::bigint[]) AS x) \
               SELECT coalesce(bool_and(pg_visible_in_snapshot(xid::text::xid8, snapshot)), true) FROM wide";
    let row = db
        .query_one_raw(statement(sql, vec![array(xids).into()]))
        .await
        .map_err(db_error("wait until the log's transactions are visible"))?;
    row.map(|row| row.try_get_by_index::<bool>(0))
        .transpose()
        .map(|visible| visible.unwrap_or(true))
        .map_err(db_error("wait until the log's transactions are visible"))
}

/// The aggregates whose next event must not come from the log: those with an unpublished dead row or a
/// row waiting behind one.
/// Each with the id of its dead event (`an earlier event` when it was discarded).
pub(super) async fn parked_aggregates(db: &DatabaseConnection) -> Result<HashMap<Aggregate, String>, LogError> {
    let rows = db
        .query_all_raw(statement(
            "SELECT aggregate_type, aggregate_id, \
             coalesce(min(CASE WHEN dead_at_ms IS NOT NULL THEN event_id END), 'an earlier event') \
             FROM outbox_events WHERE published_at_ms IS NULL \
             AND (dead_at_ms IS NOT NULL OR last_error LIKE $1) GROUP BY aggregate_type, aggregate_id",
            vec![format!("{WAITING}%").into()],
        ))
        .await
        .map_err(db_error("find aggregates waiting behind a dead event"))?;
    rows.iter()
        .map(|row| Ok(((row.try_get_by_index(0)?, row.try_get_by_index(1)?), row.try_get_by_index(2)?)))
        .collect::<Result<_, DbErr>>()
        .map_err(db_error("find aggregates waiting behind a dead event"))
}

/// An aggregate's unpublished rows in version order (at most `limit`): `Err` for a dead head.
pub(super) enum Backlog {
    /// The first unpublished row is dead: the aggregate still waits.
    DeadHead,
    /// The rows to publish, in order (empty: the aggregate has nothing left).
    Rows(Vec<Result<OutboxEvent, (i64, String)>>),
}

/// The unpublished rows of `aggregate`, in version order.
pub(super) async fn backlog(db: &DatabaseConnection, aggregate: &Aggregate, limit: u32) -> Result<Backlog, LogError> {
    let rows = db
        .query_all_raw(statement(
            "SELECT seq, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, \
             payload::text AS payload, headers::text AS headers, created_at_ms, attempts, dead_at_ms \
             FROM outbox_events WHERE aggregate_type = $1 AND aggregate_id = $2 AND published_at_ms IS NULL \
             ORDER BY aggregate_version, seq LIMIT $3",
            vec![aggregate.0.clone().into(), aggregate.1.clone().into(), i64::from(limit).into()],
        ))
        .await
        .map_err(db_error("read an aggregate waiting behind a dead event"))?;
    let read = |row: &sea_orm::QueryResult| -> Result<Result<OutboxEvent, (i64, String)>, DbErr> {
        let seq: i64 = row.try_get("", "seq")?;
        let id: String = row.try_get("", "event_id")?;
        let headers: String = row.try_get("", "headers")?;
        let created_at_ms: i64 = row.try_get("", "created_at_ms")?;
        let Ok(id) = id.parse::<EventId>() else {
            return Ok(Err((seq, format!("event_id {id:?} is not a UUID"))));
        };
        let Ok(headers) = serde_json::from_str::<Headers>(&headers) else {
            return Ok(Err((seq, format!("the headers of event {id} are not a JSON map of strings"))));
        };
        Ok(Ok(OutboxEvent {
            seq,
            aggregate_version: row.try_get("", "aggregate_version")?,
            id,
            aggregate_type: row.try_get("", "aggregate_type")?,
            aggregate_id: row.try_get("", "aggregate_id")?,
            event_type: row.try_get("", "event_type")?,
            schema_version: row.try_get("", "schema_version")?,
            payload: row.try_get("", "payload")?,
            headers,
            created_at: chrono::DateTime::from_timestamp_millis(created_at_ms).unwrap_or_default(),
            attempts: row.try_get("", "attempts")?,
            last_error: None,
        }))
    };
    let error = db_error("read an aggregate waiting behind a dead event");
    if let Some(first) = rows.first() {
        let dead: Option<i64> = first.try_get("", "dead_at_ms").map_err(&error)?;
        if dead.is_some() {
            return Ok(Backlog::DeadHead);
        }
    }
    Ok(Backlog::Rows(rows.iter().map(read).collect::<Result<_, _>>().map_err(&error)?))
}

/// Makes every unpublished live row due now, so a catch-up drain does not stop at rows waiting for their
/// backoff (the log has passed them).
pub(super) async fn make_due(db: &DatabaseConnection, now_ms: i64) -> Result<u64, LogError> {
    db.execute_raw(statement(
        "UPDATE outbox_events SET next_attempt_at_ms = $1 WHERE published_at_ms IS NULL AND dead_at_ms IS NULL \
         AND next_attempt_at_ms > $1",
        vec![now_ms.into()],
    ))
    .await
    .map(|done| done.rows_affected())
    .map_err(db_error("make unpublished rows due for the catch-up"))
}

/// Unpublished live rows that no dead row of their aggregate holds back: what a catch-up must still
/// publish.
pub(super) async fn publishable(db: &DatabaseConnection) -> Result<i64, LogError> {
    let row = db
        .query_one_raw(statement(
            "SELECT count(*) FROM outbox_events e WHERE e.published_at_ms IS NULL AND e.dead_at_ms IS NULL \
             AND NOT EXISTS (SELECT 1 FROM outbox_events d WHERE d.aggregate_type = e.aggregate_type \
             AND d.aggregate_id = e.aggregate_id AND d.published_at_ms IS NULL AND d.dead_at_ms IS NOT NULL \
             AND d.aggregate_version < e.aggregate_version)",
            vec![],
        ))
        .await
        .map_err(db_error("count the rows a catch-up must publish"))?;
    Ok(row.map(|row| row.try_get_by_index::<i64>(0)).transpose().map_err(db_error("count rows"))?.unwrap_or(0))
}

/// `{1,2,3}`: PostgreSQL's text form of an array of numbers, bound as one value.
fn array<N: ToString>(numbers: &[N]) -> String {
    let items: Vec<String> = numbers.iter().map(N::to_string).collect();
    format!("{{{}}}", items.join(","))
}

fn statement(sql: &str, values: Vec<Value>) -> Statement {
    Statement::from_sql_and_values(DbBackend::Postgres, sql, values)
}

pub(super) fn db_error(operation: &'static str) -> impl Fn(DbErr) -> LogError {
    move |error| LogError::Outbox(store_error(operation, "outbox_events", DbBackend::Postgres, error))
}

/// Creates the relay's own record of each slot's catch-up (`outbox_log_slots`) unless it exists.
pub(super) async fn ensure_state_table(db: &DatabaseConnection) -> Result<(), LogError> {
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS outbox_log_slots (slot_name text PRIMARY KEY, caught_up boolean NOT NULL, \
         changed_at_ms bigint NOT NULL)",
    )
    .await
    .map(drop)
    .map_err(db_error("create outbox_log_slots"))
}

/// Whether every row committed before `slot` was created has been published (the catch-up is done).
pub(super) async fn caught_up(db: &DatabaseConnection, slot: &str) -> Result<bool, LogError> {
    let row = db
        .query_one_raw(statement("SELECT caught_up FROM outbox_log_slots WHERE slot_name = $1", vec![slot.into()]))
        .await
        .map_err(db_error("read outbox_log_slots"))?;
    // No record: a slot someone else created; catching up again costs duplicates at most.
    Ok(row
        .map(|row| row.try_get_by_index::<bool>(0))
        .transpose()
        .map_err(db_error("read outbox_log_slots"))?
        .unwrap_or(false))
}

/// Records whether `slot`'s catch-up is done.
pub(super) async fn set_caught_up(db: &DatabaseConnection, slot: &str, done: bool) -> Result<(), LogError> {
    db.execute_raw(statement(
        "INSERT INTO outbox_log_slots (slot_name, caught_up, changed_at_ms) VALUES ($1, $2, $3) \
         ON CONFLICT (slot_name) DO UPDATE SET caught_up = EXCLUDED.caught_up, changed_at_ms = EXCLUDED.changed_at_ms",
        vec![slot.into(), done.into(), Utc::now().timestamp_millis().into()],
    ))
    .await
    .map(drop)
    .map_err(db_error("write outbox_log_slots"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sea_orm::{ConnectionTrait, TransactionTrait};

    use super::{Outcome, record};

    /// A fresh, migrated schema on the PostgreSQL test server (any `wal_level`); `None` outside CI when it
    /// does not answer.
    async fn schema(name: &str) -> Option<sea_orm::DatabaseConnection> {
        let url = std::env::var("OUTBOX_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let admin = match crate::connect(&url).await {
            Ok(admin) => admin,
            Err(error) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("skipping: {error}");
                return None;
            }
            Err(error) => panic!("CI=true but {error}"),
        };
        let schema = format!("u_{name}_{}", std::process::id());
        let sql = format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}");
        admin.execute_unprepared(&sql).await.expect("schema");
        let db = crate::connect_with(&url, |o| {
            o.set_schema_search_path(schema.clone()).max_connections(4);
        })
        .await
        .expect("connect");
        crate::migrate(&db).await.expect("migrate");
        Some(db)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_delivered_before_its_commit_is_visible_is_recorded_once_it_is() {
        let Some(db) = schema("log_visible").await else { return };
        // The writer's transaction: its row exists, and nobody else can see it until it commits, as when
        // the log hands over a transaction a moment before its commit is visible.
        let writer = db.begin().await.expect("begin");
        let event =
            outbox_runtime::NewEvent::new("order", "o-1", "order.placed", &serde_json::json!({})).expect("event");
        crate::enqueue(&writer, &event).await.expect("enqueue");
        let row = writer
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                "SELECT max(seq) FROM outbox_events",
            ))
            .await
            .expect("seq")
            .expect("a row");
        let seq: i64 = row.try_get_by_index(0).expect("seq");
        let xid = writer
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                "SELECT txid_current() % 4294967296",
            ))
            .await
            .expect("xid")
            .expect("a row");
        let xid = u32::try_from(xid.try_get_by_index::<i64>(0).expect("xid")).expect("32 bits");
        let outcome = Outcome { published: vec![seq], xids: vec![xid], ..Outcome::default() };
        let recording = {
            let (db, outcome) = (db.clone(), outcome.clone());
            tokio::spawn(async move { record(&db, &outcome, 42, false).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!recording.is_finished(), "the record waits for the row to become visible");
        writer.commit().await.expect("commit");
        recording.await.expect("task").expect("recorded");
        let sql = format!("SELECT published_at_ms FROM outbox_events WHERE seq = {seq}");
        let row = db.query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, sql.clone())).await;
        let published: Option<i64> = row.expect("query").expect("row").try_get_by_index(0).expect("value");
        assert_eq!(published, Some(42), "marked once visible");

        // Recorded again (a duplicate from the log): the first time stays.
        record(&db, &outcome, 43, false).await.expect("recorded");
        let row = db.query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, sql)).await;
        let published: Option<i64> = row.expect("query").expect("row").try_get_by_index(0).expect("value");
        assert_eq!(published, Some(42), "the first time stays");
    }
}

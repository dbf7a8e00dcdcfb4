//! Deleting what is no longer needed: published outbox rows and inbox rows past their retention, one
//! batch per statement (each its own short transaction), oldest first.

use std::time::Duration;

use chrono::Utc;
use sea_orm::sea_query::{Cond, Expr, ExprTrait, Order, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr};
use serde::Serialize;

use outbox_runtime::CleanupConfig;
use outbox_runtime::service::CLEANUP_LOCK;

use crate::entity::{inbox_message, outbox_event};
use crate::error::{Error, Result, store_error};

/// Which table a [`CleanupProgress`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CleanupTable {
    /// `outbox_events`: published rows only.
    Outbox,
    /// `outbox_events` in CDC mode ([`CleanupConfig::delete_unpublished_after`]): rows created before the
    /// cutoff, published or not.
    OutboxByAge,
    /// `inbox_messages`.
    Inbox,
}

impl CleanupTable {
    /// The table's name.
    pub fn table_name(self) -> &'static str {
        match self {
            CleanupTable::Outbox | CleanupTable::OutboxByAge => "outbox_events",
            CleanupTable::Inbox => "inbox_messages",
        }
    }
}

/// Reported after each deleted batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CleanupProgress {
    /// The table the batch was deleted from.
    pub table: CleanupTable,
    /// Rows this batch deleted.
    pub deleted: u64,
    /// Rows deleted from this table so far in this cleanup.
    pub total: u64,
}

/// What a [`cleanup`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CleanupReport {
    /// Outbox rows deleted: published ones, plus in CDC mode the old unpublished ones.
    pub outbox_deleted: u64,
    /// Inbox rows deleted.
    pub inbox_deleted: u64,
    /// Whether nothing was done because another process held the cleanup lock.
    pub skipped: bool,
}

/// Deletes published outbox rows older than `config.outbox_retention` and, when set, inbox rows older
/// than `config.inbox_retention`, `config.batch_size` rows per statement, calling `progress` after each
/// batch. Unpublished rows (dead ones included) are never deleted, except in CDC mode: with
/// [`CleanupConfig::delete_unpublished_after`] set, rows created longer ago than that are deleted too,
/// published or not (for an outbox that Debezium reads from the write-ahead log, where no relay marks
/// rows published).
///
/// Runs under the same database lock as the [`OutboxService`](crate::OutboxService)'s cleanup: when
/// another process holds it, nothing is deleted and the report says `skipped`. Check the inbox retention
/// against your relay first with [`CleanupConfig::validate`] (the `outbox` CLI does).
pub async fn cleanup(
    db: &DatabaseConnection,
    config: &CleanupConfig,
    mut progress: impl FnMut(CleanupProgress) + Send,
) -> Result<CleanupReport> {
    if config.batch_size == 0 {
        return Err(Error::invalid_config("cleanup.batch_size", "is 0; expected at least 1"));
    }
    let backend = db.get_database_backend();
    let Some(lock) = crate::lock::try_lock(db, CLEANUP_LOCK)
        .await
        .map_err(|e| store_error("take the cleanup lock", "-", backend, e))?
    else {
        return Ok(CleanupReport { skipped: true, ..CleanupReport::default() });
    };
    let now_ms = Utc::now().timestamp_millis();
    let mut report = CleanupReport::default();
    let result = async {
        report.outbox_deleted = clean_outbox(db, now_ms, config.outbox_retention, config.batch_size, &mut progress)
            .await
            .map_err(|e| store_error("delete published rows", "outbox_events", backend, e))?;
        if let Some(age) = config.delete_unpublished_after {
            let cutoff = cutoff_ms(now_ms, age);
            report.outbox_deleted +=
                delete_in_batches(db, CleanupTable::OutboxByAge, cutoff, config.batch_size, &mut progress)
                    .await
                    .map_err(|e| store_error("delete old rows (CDC mode)", "outbox_events", backend, e))?;
        }
        if let Some(retention) = config.inbox_retention {
            let cutoff = cutoff_ms(now_ms, retention);
            report.inbox_deleted = delete_in_batches(db, CleanupTable::Inbox, cutoff, config.batch_size, &mut progress)
                .await
                .map_err(|e| store_error("delete old inbox rows", "inbox_messages", backend, e))?;
        }
        Ok::<_, Error>(())
    }
    .await;
    let released = lock.release().await;
    result?;
    released?;
    Ok(report)
}

/// Removes published rows older than `retention`: by dropping partitions on a partitioned outbox
/// ([`crate::partition`]), by `DELETE`s of `batch` rows otherwise.
pub(crate) async fn clean_outbox(
    db: &DatabaseConnection,
    now_ms: i64,
    retention: Duration,
    batch: u32,
    progress: &mut (dyn FnMut(CleanupProgress) + Send),
) -> std::result::Result<u64, DbErr> {
    let now = chrono::DateTime::<Utc>::from_timestamp_millis(now_ms).unwrap_or_default();
    match crate::partition::maintain(db, now, retention, batch).await? {
        Some(report) => {
            let mut total = 0;
            let removed = report.dropped.iter().map(|(_, rows)| *rows).chain([report.deleted_from_default]);
            for deleted in removed.filter(|&rows| rows > 0) {
                total += deleted;
                progress(CleanupProgress { table: CleanupTable::Outbox, deleted, total });
            }
            for (partition, why) in &report.kept {
                tracing::debug!(%partition, %why, "an outbox partition past the retention was kept");
            }
            Ok(total)
        }
        None => delete_in_batches(db, CleanupTable::Outbox, cutoff_ms(now_ms, retention), batch, progress).await,
    }
}

/// `now - retention` in epoch ms.
pub(crate) fn cutoff_ms(now_ms: i64, retention: Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX))
}

/// Deletes `table`'s rows older than `cutoff_ms`, `batch` per statement, until a statement deletes fewer.
pub(crate) async fn delete_in_batches<C: ConnectionTrait>(
    conn: &C,
    table: CleanupTable,
    cutoff_ms: i64,
    batch: u32,
    progress: &mut (dyn FnMut(CleanupProgress) + Send),
) -> std::result::Result<u64, DbErr> {
    let mut total = 0u64;
    loop {
        let deleted = delete_batch(conn, table, cutoff_ms, batch).await?;
        total += deleted;
        if deleted > 0 {
            progress(CleanupProgress { table, deleted, total });
        }
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// One statement deleting at most `batch` of the oldest rows of `table` older than `cutoff_ms`.
async fn delete_batch<C: ConnectionTrait>(
    conn: &C,
    table: CleanupTable,
    cutoff_ms: i64,
    batch: u32,
) -> std::result::Result<u64, DbErr> {
    let mysql = conn.get_database_backend() == DbBackend::MySql;
    if mysql && table != CleanupTable::Inbox {
        return delete_outbox_batch_by_key(conn, table, cutoff_ms, batch).await;
    }
    let mut delete = Query::delete();
    match table {
        CleanupTable::Outbox | CleanupTable::OutboxByAge => {
            use outbox_event::{Column, Entity};
            let old = || match table {
                // Rows are in `seq` order of creation, so the oldest-first scan by `seq` stops early.
                CleanupTable::OutboxByAge => Cond::all().add(Expr::col(Column::CreatedAtMs).lt(cutoff_ms)),
                _ => Cond::all()
                    .add(Expr::col(Column::PublishedAtMs).is_not_null())
                    .add(Expr::col(Column::PublishedAtMs).lt(cutoff_ms)),
            };
            delete.from_table(Entity);
            if mysql {
                // MySQL rejects LIMIT inside IN (subquery) but has DELETE … ORDER BY … LIMIT.
                delete.cond_where(old()).order_by(Column::Seq, Order::Asc).limit(u64::from(batch));
            } else {
                let mut oldest = Query::select();
                oldest.column(Column::Seq).from(Entity).cond_where(old()).order_by(Column::Seq, Order::Asc);
                oldest.limit(u64::from(batch));
                delete.and_where(Expr::col(Column::Seq).in_subquery(oldest));
            }
        }
        CleanupTable::Inbox => {
            use inbox_message::{Column, Entity};
            let old = || Expr::col(Column::ProcessedAtMs).lt(cutoff_ms);
            delete.from_table(Entity);
            if mysql {
                delete.and_where(old()).order_by(Column::ProcessedAtMs, Order::Asc).limit(u64::from(batch));
            } else {
                let mut oldest = Query::select();
                oldest
                    .columns([Column::Consumer, Column::MessageId])
                    .from(Entity)
                    .and_where(old())
                    .order_by(Column::ProcessedAtMs, Order::Asc)
                    .limit(u64::from(batch));
                delete.and_where(
                    Expr::tuple([Expr::col(Column::Consumer), Expr::col(Column::MessageId)]).in_subquery(oldest),
                );
            }
        }
    }
    Ok(conn.execute(&delete).await?.rows_affected())
}

/// MySQL: one batch of old outbox rows, found by a plain read (which locks nothing) and deleted by primary
/// key. A `DELETE … ORDER BY seq LIMIT n` reads the primary key from the start and, in REPEATABLE READ,
/// locks every row it passes: unpublished rows that relays hold (so the cleanup waited for their
/// publishes) and, on a small table, the end of the table, where every enqueue inserts.
async fn delete_outbox_batch_by_key<C: ConnectionTrait>(
    conn: &C,
    table: CleanupTable,
    cutoff_ms: i64,
    batch: u32,
) -> std::result::Result<u64, DbErr> {
    use crate::sql::Sql;
    use crate::store::keyed;
    let backend = conn.get_database_backend();
    let old = |sql: &mut Sql| {
        match table {
            CleanupTable::OutboxByAge => sql.push("created_at_ms < ").bind(cutoff_ms),
            _ => sql.push("published_at_ms IS NOT NULL AND published_at_ms < ").bind(cutoff_ms),
        };
    };
    let mut find = Sql::new(backend);
    find.push("SELECT seq FROM outbox_events WHERE ");
    old(&mut find);
    find.push(" ORDER BY seq LIMIT ").bind(i64::from(batch));
    let seqs: Vec<i64> = conn
        .query_all_raw(find.build())
        .await?
        .iter()
        .map(|row| row.try_get::<i64>("", "seq"))
        .collect::<std::result::Result<_, _>>()?;
    let mut deleted = 0;
    for chunk in keyed::chunks(backend, &seqs) {
        let mut delete = Sql::new(backend);
        keyed::write_delete(&mut delete, chunk, old);
        deleted += conn.execute_raw(delete.build()).await?.rows_affected();
    }
    // A full batch read means there may be more, whatever another cleanup took meanwhile.
    Ok(if seqs.len() == batch as usize { Ord::max(u64::from(batch), deleted) } else { deleted })
}

//! A partitioned outbox on PostgreSQL: `outbox_events` split by creation time into hourly or daily
//! partitions, so that cleanup drops whole partitions instead of deleting published rows one by one.
//!
//! A table that takes tens of thousands of inserts a second and keeps a week of published rows spends as
//! much on the `DELETE`s of its cleanup (and the vacuum after them) as on its writes. Partitioned, the
//! cleanup detaches and drops a partition once every row in it is published and past the retention: one
//! short catalog change, whatever the number of rows. Opt in with [`partition_outbox`] (or, in an app's
//! own `Migrator`, `migration::partitioned`) after [`migrate`](crate::migrate).
//!
//! What changes, and what does not:
//! - The relay's claim and mark behave as on one table. Each claim statement also says that the rows it
//!   wants were created between the oldest and the newest unpublished row (read in its own snapshot, so
//!   it is true of every row it could see), and each write by `seq` names its batch's creation times:
//!   PostgreSQL then skips the partitions with nothing unpublished instead of probing each one per key.
//!   The two ends come from one more index, `outbox_events_unpublished_created`, one probe per partition
//!   per statement.
//! - A partitioned table's unique indexes must hold the partition key, so the primary key becomes
//!   `(seq, created_at_ms)`, and `event_id` and `(aggregate_type, aggregate_id, aggregate_version)` are
//!   indexed but no longer unique: `seq` comes from its sequence, versions from `outbox_aggregates`'s row
//!   lock, event ids from UUIDs, so nothing this crate writes could collide.
//! - The service's cleanup ([`MaintenanceStore::cleanup`](outbox_runtime::store::MaintenanceStore::cleanup)
//!   and `maintenance::cleanup`) creates the next [`AHEAD`] partitions, drops the old ones and deletes published
//!   rows from the default partition. It never drops a partition that holds an unpublished row, pending
//!   or dead.
//! - A row whose creation time no partition covers (a writer whose clock is days off, a service that ran no
//!   cleanup for longer than [`AHEAD`] intervals) lands in the default partition `outbox_events_default`,
//!   and is published like any other; when its interval's partition is created, it moves there.
//!
//! MySQL/MariaDB and SQLite refuse the option: their outbox keeps the `DELETE` cleanup.

use std::fmt;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionSession, TransactionTrait};
use serde::Serialize;

use crate::error::{Error, Result, backend_name, store_error};

/// How many intervals past the current one have their partitions created ahead of time.
pub const AHEAD: i64 = 3;

/// The partition that takes rows no other partition's range covers.
pub const DEFAULT_PARTITION: &str = "outbox_events_default";

/// How long partition maintenance waits for a table lock before it gives up until the next cleanup:
/// writers queue behind a waiting `DETACH`, so the wait is short.
const LOCK_TIMEOUT: &str = "2s";

/// The width of each partition of a partitioned outbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionInterval {
    /// One partition per hour (UTC): for outboxes that keep published rows for hours, or write so much
    /// that a day's partition would be unwieldy.
    Hour,
    /// One partition per day (UTC): the usual choice with a retention of days.
    Day,
}

impl PartitionInterval {
    /// The interval in milliseconds.
    pub fn millis(self) -> i64 {
        match self {
            PartitionInterval::Hour => 3_600_000,
            PartitionInterval::Day => 86_400_000,
        }
    }

    fn from_millis(ms: i64) -> Option<Self> {
        [PartitionInterval::Hour, PartitionInterval::Day].into_iter().find(|i| i.millis() == ms)
    }
}

impl fmt::Display for PartitionInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PartitionInterval::Hour => "hour",
            PartitionInterval::Day => "day",
        })
    }
}

impl std::str::FromStr for PartitionInterval {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "hour" | "hourly" => Ok(PartitionInterval::Hour),
            "day" | "daily" => Ok(PartitionInterval::Day),
            other => Err(Error::invalid_config("partition interval", format!("{other:?}; expected `hour` or `day`"))),
        }
    }
}

/// One partition of `outbox_events`, as [`partitions`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// The table's name.
    pub name: String,
    /// The first `created_at_ms` it holds; `None` for the default partition and an unbounded first one.
    pub from_ms: Option<i64>,
    /// The first `created_at_ms` past it; `None` for the default partition.
    pub to_ms: Option<i64>,
    /// Whether this is the default partition.
    pub default: bool,
}

/// What one round of partition maintenance did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PartitionReport {
    /// Partitions created ahead of time.
    pub created: Vec<String>,
    /// Rows moved out of the default partition into a partition created for them.
    pub moved_from_default: u64,
    /// Partitions detached and dropped, with the rows they held.
    pub dropped: Vec<(String, u64)>,
    /// Partitions past the retention that were kept, with why.
    pub kept: Vec<(String, String)>,
    /// Published rows deleted from the default partition.
    pub deleted_from_default: u64,
}

impl PartitionReport {
    /// Rows removed: those of the dropped partitions and those deleted from the default partition.
    pub fn rows_removed(&self) -> u64 {
        self.dropped.iter().map(|(_, rows)| rows).sum::<u64>() + self.deleted_from_default
    }
}

/// Converts `outbox_events` into a table partitioned by `created_at_ms` in `interval`s, in one
/// transaction; does nothing but record `interval` (for partitions created from now on) when it already is.
/// Run [`migrate`](crate::migrate) first. PostgreSQL 13 or later only; MySQL/MariaDB and SQLite get an
/// error and keep their table.
///
/// The rows are copied into the new table under an `ACCESS EXCLUSIVE` lock, so writers and relays wait
/// for the copy: run it on a deploy with a small outbox (a cleanup first), or in a quiet hour. Rows
/// created before the current interval go into one partition that is dropped once all of them are
/// published and past the retention. Triggers on the table (the numbering trigger, the notify trigger)
/// are carried over; indexes an app added itself are not.
pub async fn partition_outbox(db: &DatabaseConnection, interval: PartitionInterval) -> Result<bool> {
    let backend = db.get_database_backend();
    refuse_unless_postgres(backend)?;
    let error = |operation| move |e| store_error(operation, "outbox_events", backend, e);
    let txn = db.begin().await.map_err(error("begin partitioning the outbox"))?;
    let converted =
        convert(&txn, interval, Utc::now().timestamp_millis()).await.map_err(error("partition the outbox"))?;
    txn.commit().await.map_err(error("commit partitioning the outbox"))?;
    if converted {
        tracing::info!(%interval, "outbox_events is now partitioned by creation time");
    }
    Ok(converted)
}

/// The error a backend without this option gets.
pub(crate) fn refuse_unless_postgres(backend: DbBackend) -> Result<()> {
    match backend {
        DbBackend::Postgres => Ok(()),
        other => Err(Error::invalid_config(
            "partitioned outbox",
            format!(
                "needs PostgreSQL (13 or later), not {}; this backend keeps the DELETE cleanup of published rows",
                backend_name(other)
            ),
        )),
    }
}

/// Whether `outbox_events` is partitioned, and how wide its partitions are; `None` when it is not (always
/// on MySQL/MariaDB and SQLite).
pub async fn partitioning<C: ConnectionTrait>(db: &C) -> std::result::Result<Option<PartitionInterval>, DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(None);
    }
    let kind = "SELECT c.relkind::text AS kind, to_regclass('outbox_partitioning') IS NOT NULL AS configured \
                FROM pg_class c WHERE c.oid = to_regclass('outbox_events')";
    let Some(row) = db.query_one_raw(Statement::from_string(DbBackend::Postgres, kind)).await? else {
        return Ok(None);
    };
    let (kind, configured): (String, bool) = (row.try_get("", "kind")?, row.try_get("", "configured")?);
    if kind != "p" {
        return Ok(None);
    }
    if !configured {
        return Err(DbErr::Custom(
            "outbox_events is partitioned but outbox_partitioning is missing; partition it with partition_outbox"
                .into(),
        ));
    }
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, "SELECT interval_ms FROM outbox_partitioning"))
        .await?
        .ok_or_else(|| DbErr::Custom("outbox_partitioning has no row".into()))?;
    let ms: i64 = row.try_get("", "interval_ms")?;
    PartitionInterval::from_millis(ms)
        .map(Some)
        .ok_or_else(|| DbErr::Custom(format!("outbox_partitioning.interval_ms is {ms}; expected an hour or a day")))
}

/// Whether `outbox_events` is a partitioned table (PostgreSQL).
async fn is_partitioned<C: ConnectionTrait>(db: &C) -> std::result::Result<bool, DbErr> {
    let sql = "SELECT 1 AS found FROM pg_class WHERE oid = to_regclass('outbox_events') AND relkind = 'p'";
    Ok(db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await?.is_some())
}

/// The partitions of `outbox_events`, oldest first, the default partition last.
pub async fn partitions<C: ConnectionTrait>(db: &C) -> std::result::Result<Vec<Partition>, DbErr> {
    let sql = "SELECT c.relname::text AS name, pg_get_expr(c.relpartbound, c.oid) AS bound \
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
               WHERE i.inhparent = to_regclass('outbox_events')";
    let rows = db.query_all_raw(Statement::from_string(DbBackend::Postgres, sql)).await?;
    let mut partitions = rows
        .iter()
        .map(|row| {
            let name: String = row.try_get("", "name")?;
            let bound: String = row.try_get("", "bound")?;
            parse_bound(&name, &bound)
        })
        .collect::<std::result::Result<Vec<_>, DbErr>>()?;
    partitions.sort_by_key(|p| (p.default, p.from_ms.unwrap_or(i64::MIN)));
    Ok(partitions)
}

/// `FOR VALUES FROM ('1764720000000') TO (MAXVALUE)` or `DEFAULT`, as `pg_get_expr` prints a range bound.
fn parse_bound(name: &str, bound: &str) -> std::result::Result<Partition, DbErr> {
    if bound.trim() == "DEFAULT" {
        return Ok(Partition { name: name.to_owned(), from_ms: None, to_ms: None, default: true });
    }
    let unexpected = || DbErr::Custom(format!("partition {name} has an unexpected bound: {bound}"));
    let value = |text: &str| -> std::result::Result<Option<i64>, DbErr> {
        let text = text.trim().trim_start_matches('(').trim_end_matches(')').trim().trim_matches('\'');
        match text {
            "MINVALUE" | "MAXVALUE" => Ok(None),
            number => number.parse().map(Some).map_err(|_| unexpected()),
        }
    };
    let rest = bound.strip_prefix("FOR VALUES FROM ").ok_or_else(unexpected)?;
    let (from, to) = rest.split_once(" TO ").ok_or_else(unexpected)?;
    Ok(Partition { name: name.to_owned(), from_ms: value(from)?, to_ms: value(to)?, default: false })
}

/// The conversion, inside the caller's transaction; `false` when the table was partitioned already.
pub(crate) async fn convert<C: ConnectionTrait>(
    conn: &C,
    interval: PartitionInterval,
    now_ms: i64,
) -> std::result::Result<bool, DbErr> {
    let run = |sql: String| async move { conn.execute_unprepared(&sql).await.map(|_| ()) };
    let configure = format!(
        "CREATE TABLE IF NOT EXISTS outbox_partitioning (interval_ms BIGINT NOT NULL); \
         DELETE FROM outbox_partitioning; INSERT INTO outbox_partitioning (interval_ms) VALUES ({})",
        interval.millis()
    );
    if is_partitioned(conn).await? {
        run(configure).await?;
        return Ok(false);
    }
    let version: i64 = scalar(conn, "SELECT current_setting('server_version_num')::bigint AS v").await?.unwrap_or(0);
    if version < 130_000 {
        return Err(DbErr::Custom(format!(
            "a partitioned outbox needs PostgreSQL 13 or later (row triggers on partitioned tables); this server is {version}"
        )));
    }
    // The triggers to carry over, as their definitions (they name the table, which keeps its name).
    let triggers: Vec<String> = conn
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT pg_get_triggerdef(oid) AS def FROM pg_trigger \
             WHERE tgrelid = to_regclass('outbox_events') AND NOT tgisinternal ORDER BY tgname",
        ))
        .await?
        .iter()
        .map(|row| row.try_get("", "def"))
        .collect::<std::result::Result<_, _>>()?;
    run("LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE".into()).await?;
    run("ALTER TABLE outbox_events RENAME TO outbox_events_unpartitioned".into()).await?;
    run("CREATE TABLE outbox_events (LIKE outbox_events_unpartitioned INCLUDING DEFAULTS) \
         PARTITION BY RANGE (created_at_ms)"
        .into())
    .await?;
    // `seq` is an identity column (or a serial), whose sequence belongs to the old table and goes with it,
    // and PostgreSQL before 17 allows no identity column on a partitioned table: the new `seq` takes its
    // values from a sequence of its own, starting past every value the old one handed out.
    let sequence = conn
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT pg_get_serial_sequence('outbox_events_unpartitioned', 'seq') AS s",
        ))
        .await?
        .and_then(|row| row.try_get::<Option<String>>("", "s").ok().flatten())
        .ok_or_else(|| DbErr::Custom("outbox_events.seq has no sequence".into()))?;
    let next: i64 = scalar(
        conn,
        &format!(
            "SELECT GREATEST(nextval('{sequence}'), (SELECT COALESCE(MAX(seq), 0) + 1 FROM outbox_events_unpartitioned)) AS v"
        ),
    )
    .await?
    .unwrap_or(1);
    run(format!("CREATE SEQUENCE outbox_events_seq_partitioned START WITH {next}")).await?;
    run("ALTER TABLE outbox_events ALTER COLUMN seq SET DEFAULT nextval('outbox_events_seq_partitioned')".into())
        .await?;
    run("ALTER SEQUENCE outbox_events_seq_partitioned OWNED BY outbox_events.seq".into()).await?;

    let current = floor(now_ms, interval);
    let oldest: Option<i64> = scalar(conn, "SELECT MIN(created_at_ms) AS v FROM outbox_events_unpartitioned").await?;
    if oldest.is_some_and(|oldest| oldest < current) {
        let name = format!("outbox_events_p_before_{}", suffix(current, interval));
        run(format!("CREATE TABLE {name} PARTITION OF outbox_events FOR VALUES FROM (MINVALUE) TO ({current})"))
            .await?;
    }
    for k in 0..=AHEAD {
        let from = current + k * interval.millis();
        let to = from + interval.millis();
        run(format!(
            "CREATE TABLE {} PARTITION OF outbox_events FOR VALUES FROM ({from}) TO ({to})",
            partition_name(from, interval)
        ))
        .await?;
    }
    run(format!("CREATE TABLE {DEFAULT_PARTITION} PARTITION OF outbox_events DEFAULT")).await?;
    run("INSERT INTO outbox_events SELECT * FROM outbox_events_unpartitioned".into()).await?;
    run("DROP TABLE outbox_events_unpartitioned".into()).await?;
    for sql in [
        "ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_pkey PRIMARY KEY (seq, created_at_ms)",
        "CREATE INDEX outbox_events_event_id ON outbox_events (event_id)",
        "CREATE INDEX outbox_events_version ON outbox_events (aggregate_type, aggregate_id, aggregate_version)",
        "CREATE INDEX outbox_events_runs ON outbox_events (aggregate_type, aggregate_id, aggregate_version) \
         WHERE published_at_ms IS NULL",
        "CREATE INDEX outbox_events_published ON outbox_events (published_at_ms) WHERE published_at_ms IS NOT NULL",
        "CREATE INDEX outbox_events_dead ON outbox_events (seq) WHERE dead_at_ms IS NOT NULL AND published_at_ms IS NULL",
        // The oldest and newest unpublished rows, one probe per partition: the claim skips the partitions
        // outside them (an expression, so that no claim statement can use it to find rows by key).
        "CREATE INDEX outbox_events_unpublished_created ON outbox_events ((created_at_ms + 0)) \
         WHERE published_at_ms IS NULL",
    ] {
        run(sql.into()).await?;
    }
    for def in triggers {
        run(def).await?;
    }
    run(configure).await?;
    Ok(true)
}

/// One round of maintenance of a partitioned outbox, as the cleanup runs it: creates the partitions of
/// the current interval and the next [`AHEAD`], drops the partitions whose rows are all published longer
/// than `retention` ago, and deletes such rows from the default partition, `batch` per statement.
/// `None` when `outbox_events` is not partitioned.
///
/// A partition is dropped only when its range ends before `now - retention`, no row in it is unpublished
/// (pending or dead) and its newest publication is older than `now - retention`; the last two are
/// checked again under the lock that the detach takes, so a row written into it meanwhile keeps it.
pub async fn maintain<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    now: DateTime<Utc>,
    retention: std::time::Duration,
    batch: u32,
) -> std::result::Result<Option<PartitionReport>, DbErr> {
    let Some(interval) = partitioning(db).await? else { return Ok(None) };
    let now_ms = now.timestamp_millis();
    let mut report = PartitionReport::default();
    create_ahead(db, interval, now_ms, &mut report).await?;
    let cutoff = crate::maintenance::cutoff_ms(now_ms, retention);
    for partition in partitions(db).await? {
        if partition.default || partition.to_ms.is_none_or(|to| to > cutoff) {
            continue;
        }
        if let Some(why) = keep_reason(db, &partition.name, cutoff).await? {
            report.kept.push((partition.name, why));
            continue;
        }
        let rows: i64 = scalar(db, &format!("SELECT COUNT(*) AS v FROM {}", partition.name)).await?.unwrap_or(0);
        match drop_partition(db, &partition.name, cutoff).await {
            Ok(None) => {
                tracing::info!(partition = %partition.name, rows, "dropped an outbox partition whose rows were all published");
                report.dropped.push((partition.name, u64::try_from(rows).unwrap_or(0)));
            }
            Ok(Some(why)) => report.kept.push((partition.name, why)),
            Err(error) => {
                // A lock wait past LOCK_TIMEOUT (a long transaction on the table): the next cleanup retries.
                tracing::warn!(partition = %partition.name, %error, "could not drop an outbox partition; the next cleanup tries again");
                report.kept.push((partition.name, format!("not dropped this time: {error}")));
            }
        }
    }
    let delete = format!(
        "DELETE FROM {DEFAULT_PARTITION} WHERE seq IN (SELECT seq FROM {DEFAULT_PARTITION} \
         WHERE published_at_ms IS NOT NULL AND published_at_ms < {cutoff} ORDER BY seq LIMIT {batch})"
    );
    loop {
        let deleted = db.execute_unprepared(&delete).await?.rows_affected();
        report.deleted_from_default += deleted;
        if deleted < u64::from(batch) {
            break;
        }
    }
    Ok(Some(report))
}

/// Detaches and drops partition `name` under the table's lock, after checking again that nothing keeps it;
/// `Some(why)` when something does.
async fn drop_partition<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    name: &str,
    cutoff: i64,
) -> std::result::Result<Option<String>, DbErr> {
    let txn = db.begin().await?;
    txn.execute_unprepared(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")).await?;
    // The parent first, as every statement on the table locks it, so no lock order can deadlock.
    txn.execute_unprepared("LOCK TABLE ONLY outbox_events IN ACCESS EXCLUSIVE MODE").await?;
    if let Some(why) = keep_reason(&txn, name, cutoff).await? {
        txn.rollback().await?;
        return Ok(Some(why));
    }
    txn.execute_unprepared(&format!("ALTER TABLE outbox_events DETACH PARTITION {name}")).await?;
    txn.execute_unprepared(&format!("DROP TABLE {name}")).await?;
    txn.commit().await?;
    Ok(None)
}

/// Why partition `name` must stay: an unpublished row, or a publication newer than `cutoff`.
async fn keep_reason<C: ConnectionTrait>(
    db: &C,
    name: &str,
    cutoff: i64,
) -> std::result::Result<Option<String>, DbErr> {
    // Both read partial indexes of the partition: instant however many rows it holds.
    let unpublished: i64 =
        scalar(db, &format!("SELECT COUNT(*) AS v FROM {name} WHERE published_at_ms IS NULL")).await?.unwrap_or(0);
    if unpublished > 0 {
        return Ok(Some(format!("{unpublished} unpublished row(s), pending or dead")));
    }
    let newest: Option<i64> = scalar(db, &format!("SELECT MAX(published_at_ms) AS v FROM {name}")).await?;
    Ok(newest.filter(|&newest| newest >= cutoff).map(|_| "a row published within the retention".to_owned()))
}

/// Creates the partitions of the current interval and the next [`AHEAD`] that no partition covers yet.
async fn create_ahead<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    interval: PartitionInterval,
    now_ms: i64,
    report: &mut PartitionReport,
) -> std::result::Result<(), DbErr> {
    let existing = partitions(db).await?;
    let current = floor(now_ms, interval);
    let end = current + (AHEAD + 1) * interval.millis();
    let mut from = current;
    while from < end {
        // Skip what a partition covers (one made with another interval, say), then fill up to the next.
        if let Some(covering) = existing
            .iter()
            .find(|p| !p.default && p.from_ms.is_none_or(|f| f <= from) && p.to_ms.is_none_or(|t| t > from))
        {
            match covering.to_ms {
                Some(to) => {
                    from = to;
                    continue;
                }
                None => break,
            }
        }
        let next_existing = existing.iter().filter_map(|p| p.from_ms).filter(|&f| f > from).min().unwrap_or(i64::MAX);
        let to = (floor(from, interval) + interval.millis()).min(next_existing);
        create_partition(db, &partition_name(from, interval), from, to, report).await?;
        report.created.push(partition_name(from, interval));
        from = to;
    }
    Ok(())
}

/// Creates partition `name` for `[from, to)`, moving into it the rows the default partition holds in that
/// range (PostgreSQL refuses a new partition whose range the default partition has rows in).
async fn create_partition<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    name: &str,
    from: i64,
    to: i64,
    report: &mut PartitionReport,
) -> std::result::Result<(), DbErr> {
    let txn = db.begin().await?;
    txn.execute_unprepared(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")).await?;
    let in_range = format!("created_at_ms >= {from} AND created_at_ms < {to}");
    let strays = scalar(&txn, &format!("SELECT COUNT(*) AS v FROM {DEFAULT_PARTITION} WHERE {in_range}")).await?;
    if strays.unwrap_or(0) == 0 {
        txn.execute_unprepared(&format!(
            "CREATE TABLE {name} PARTITION OF outbox_events FOR VALUES FROM ({from}) TO ({to})"
        ))
        .await?;
    } else {
        txn.execute_unprepared(&format!("CREATE TABLE {name} (LIKE outbox_events INCLUDING DEFAULTS)")).await?;
        let moved = txn
            .execute_unprepared(&format!(
                "WITH moved AS (DELETE FROM {DEFAULT_PARTITION} WHERE {in_range} RETURNING *) \
                 INSERT INTO {name} SELECT * FROM moved"
            ))
            .await?
            .rows_affected();
        txn.execute_unprepared(&format!(
            "ALTER TABLE outbox_events ATTACH PARTITION {name} FOR VALUES FROM ({from}) TO ({to})"
        ))
        .await?;
        tracing::info!(partition = name, moved, "moved rows from the default outbox partition into a new one");
        report.moved_from_default += moved;
    }
    txn.commit().await
}

async fn scalar<C: ConnectionTrait>(db: &C, sql: &str) -> std::result::Result<Option<i64>, DbErr> {
    let row = db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await?;
    Ok(match row {
        Some(row) => row.try_get::<Option<i64>>("", "v")?,
        None => None,
    })
}

/// The start of the interval `ms` falls in.
fn floor(ms: i64, interval: PartitionInterval) -> i64 {
    ms.div_euclid(interval.millis()) * interval.millis()
}

/// `outbox_events_p20261203` (a day), `outbox_events_p20261203_17` (an hour), or with minutes and seconds
/// for a partition that starts between interval boundaries.
fn partition_name(from: i64, interval: PartitionInterval) -> String {
    format!("outbox_events_p{}", suffix(from, interval))
}

fn suffix(from: i64, interval: PartitionInterval) -> String {
    let at = DateTime::<Utc>::from_timestamp_millis(from).unwrap_or_default();
    let format = if from % PartitionInterval::Day.millis() == 0 && interval == PartitionInterval::Day {
        "%Y%m%d"
    } else if from % PartitionInterval::Hour.millis() == 0 {
        "%Y%m%d_%H"
    } else {
        "%Y%m%d_%H%M%S%3f"
    };
    at.format(format).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_as_postgres_prints_them_are_read() {
        let p = parse_bound("p", "FOR VALUES FROM ('1764720000000') TO ('1764806400000')").unwrap();
        assert_eq!((p.from_ms, p.to_ms, p.default), (Some(1_764_720_000_000), Some(1_764_806_400_000), false));
        let p = parse_bound("p", "FOR VALUES FROM (MINVALUE) TO ('5')").unwrap();
        assert_eq!((p.from_ms, p.to_ms), (None, Some(5)));
        assert!(parse_bound("d", "DEFAULT").unwrap().default);
        assert!(parse_bound("x", "FOR VALUES IN (1)").is_err());
    }

    #[test]
    fn partitions_are_named_by_their_start_in_utc() {
        let day = 1_764_720_000_000; // 2025-12-03 00:00 UTC
        assert_eq!(partition_name(day, PartitionInterval::Day), "outbox_events_p20251203");
        assert_eq!(partition_name(day + 17 * 3_600_000, PartitionInterval::Hour), "outbox_events_p20251203_17");
        assert_eq!(floor(day + 17 * 3_600_000 + 5, PartitionInterval::Day), day);
        assert_eq!("daily".parse::<PartitionInterval>().unwrap(), PartitionInterval::Day);
        assert!("weekly".parse::<PartitionInterval>().is_err());
    }
}

//! The claim's keyed reads of `outbox_events`: rows by runs of versions of an aggregate, or by `seq`, in
//! statements of a bounded number of keys, locking or not.

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, QueryResult};

use super::{Candidate, PRUNE_PUBLISHED_PARTITIONS};
use crate::sql::Sql;

const CLAIM_COLUMNS: &str = "seq, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
    schema_version, created_at_ms, attempts, last_error";

fn payload_columns(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "payload::text AS payload, headers::text AS headers",
        DbBackend::MySql => "CAST(payload AS CHAR) AS payload, CAST(headers AS CHAR) AS headers",
        _ => "payload, headers",
    }
}

/// MariaDB's index for keyed reads (see `MYSQL_RUNS_INDEX` in the claim: statistics recomputed mid-drain
/// made it read every pending row per key).
const MYSQL_VERSION_INDEX: &str = "outbox_events FORCE INDEX (outbox_events_version)";

/// Most keys (or runs) in one statement: larger statements stalled over TLS on loopback (PostgreSQL), and
/// MySQL plans each key of a row-value `IN` list as its own index range.
pub(super) const KEYS_PER_STATEMENT: usize = 250;

/// Most primary keys in one `seq IN (…)` list (MySQL's locking reads; see `store/keyed.rs`).
pub(super) const SEQS_PER_STATEMENT: usize = crate::store::keyed::SEQS_PER_STATEMENT;

/// Which rows to fetch.
pub(super) enum Keys<'r> {
    /// Versions `from ..= to` of each aggregate: one range of the unique index per run, however long.
    Runs(Vec<(&'r Candidate, i64, i64)>),
    /// Runs `head ..= to` (PostgreSQL, locking): each head, and the rest of the run behind each head the
    /// same statement locked, in one round trip.
    HeldRuns(Vec<(&'r Candidate, i64, i64)>),
    /// Primary keys (MySQL locks by primary key only).
    Seqs(Vec<i64>),
}

/// Fetches unpublished rows by `keys`, in chunks. With `lock`, only rows claimable at that time and not
/// locked by another relay, each now locked (`FOR UPDATE SKIP LOCKED`; SQLite relies on `BEGIN IMMEDIATE`),
/// with every column the claim decodes; without, only their keys (MySQL's plain read before it locks).
pub(super) async fn fetch(
    txn: &DatabaseTransaction,
    keys: Keys<'_>,
    lock: Option<i64>,
    partitioned: bool,
) -> Result<Vec<QueryResult>, DbErr> {
    let backend = txn.get_database_backend();
    let chunks: Vec<Keys<'_>> = match keys {
        Keys::Runs(r) => r.chunks(KEYS_PER_STATEMENT).map(|c| Keys::Runs(c.to_vec())).collect(),
        Keys::HeldRuns(r) => r.chunks(KEYS_PER_STATEMENT).map(|c| Keys::HeldRuns(c.to_vec())).collect(),
        Keys::Seqs(s) => s.chunks(SEQS_PER_STATEMENT).map(|c| Keys::Seqs(c.to_vec())).collect(),
    };
    let mut rows = Vec::new();
    for chunk in chunks {
        let mut sql = Sql::new(backend);
        write_fetch(&mut sql, &chunk, lock, partitioned);
        rows.extend(txn.query_all_raw(sql.build()).await?);
    }
    Ok(rows)
}

/// The statement of [`fetch`] for one chunk of keys, appended to `sql`.
pub(super) fn write_fetch(sql: &mut Sql, chunk: &Keys<'_>, lock: Option<i64>, partitioned: bool) {
    let backend = sql.backend();
    let select = match lock {
        Some(_) => format!("{CLAIM_COLUMNS}, {}", payload_columns(backend)),
        None => "seq, aggregate_type, aggregate_id, aggregate_version".to_owned(),
    };
    let filter = |sql: &mut Sql| {
        sql.push("published_at_ms IS NULL");
        if partitioned {
            sql.push(" AND ").push(PRUNE_PUBLISHED_PARTITIONS);
        }
        if let Some(now_ms) = lock {
            sql.push(" AND dead_at_ms IS NULL AND next_attempt_at_ms <= ")
                .bind(now_ms)
                .push(" AND (lease_until_ms IS NULL OR lease_until_ms <= ")
                .bind(now_ms)
                .push(")");
        }
    };
    let suffix = if lock.is_some() && backend != DbBackend::Sqlite { " FOR UPDATE SKIP LOCKED" } else { "" };
    match chunk {
        Keys::Runs(runs) => write_runs(sql, &select, runs, filter, suffix),
        Keys::HeldRuns(runs) => write_held_runs(sql, &select, runs, filter, suffix),
        Keys::Seqs(seqs) => {
            // Point lookups by primary key lock only the claimed rows; through a secondary index MariaDB
            // would take next-key (gap) locks that make every enqueue wait for the claim.
            let hint = if backend == DbBackend::MySql { " FORCE INDEX (PRIMARY)" } else { "" };
            sql.push("SELECT ").push(&select).push(" FROM outbox_events").push(hint).push(" WHERE seq IN (");
            sql.join(seqs, ", ", |sql, seq| {
                sql.bind(*seq);
            });
            sql.push(") AND ");
            filter(sql);
            sql.push(suffix);
        }
    }
}

/// `SELECT {select}` of versions `from ..= to` of each run's aggregate `AND {filter} {suffix}`: one range
/// of `outbox_events_version` per run (a `LATERAL` join of the runs on PostgreSQL, which locks per run; a
/// `CROSS JOIN` on SQLite, which keeps the runs as the outer loop; `OR`ed ranges on MySQL).
fn write_runs(
    sql: &mut Sql,
    select: &str,
    runs: &[(&Candidate, i64, i64)],
    filter: impl FnOnce(&mut Sql),
    suffix: &str,
) {
    let tuple = |sql: &mut Sql| {
        sql.join(runs, ", ", |sql, (c, from, to)| {
            sql.push("(").bind(c.aggregate_type.as_str()).push(", ").bind(c.aggregate_id.as_str());
            sql.push(", ").bind(*from).push(", ").bind(*to).push(")");
        });
    };
    match sql.backend() {
        DbBackend::Postgres => {
            sql.push("SELECT x.* FROM (VALUES ");
            tuple(sql);
            sql.push(") AS k (t, i, f, l) CROSS JOIN LATERAL (SELECT ").push(select).push(
                " FROM outbox_events WHERE aggregate_type = k.t AND aggregate_id = k.i \
                 AND aggregate_version BETWEEN k.f AND k.l AND ",
            );
            filter(sql);
            sql.push(suffix).push(") x");
        }
        DbBackend::Sqlite => {
            sql.push("SELECT ").push(select).push(" FROM (VALUES ");
            tuple(sql);
            sql.push(
                ") AS k CROSS JOIN outbox_events ON aggregate_type = k.column1 AND aggregate_id = k.column2 \
                 AND aggregate_version BETWEEN k.column3 AND k.column4 WHERE ",
            );
            filter(sql);
            sql.push(suffix);
        }
        _ => {
            sql.push("SELECT ").push(select).push(" FROM ").push(MYSQL_VERSION_INDEX).push(" WHERE (");
            sql.join(runs, " OR ", |sql, (c, from, to)| {
                sql.push("(aggregate_type = ").bind(c.aggregate_type.as_str());
                sql.push(" AND aggregate_id = ").bind(c.aggregate_id.as_str());
                sql.push(" AND aggregate_version BETWEEN ").bind(*from).push(" AND ").bind(*to).push(")");
            });
            sql.push(") AND ");
            filter(sql);
            sql.push(suffix);
        }
    }
}

/// PostgreSQL: lock each run's head (`h`), then the rest of the run behind each head locked, in one
/// statement. The rest is looked up from `h`'s rows, so it is read only behind a head this statement
/// holds: never behind a head another relay holds.
fn write_held_runs(
    sql: &mut Sql,
    select: &str,
    runs: &[(&Candidate, i64, i64)],
    filter: impl Fn(&mut Sql),
    suffix: &str,
) {
    sql.push("WITH k (t, i, f, l) AS (VALUES ");
    sql.join(runs, ", ", |sql, (c, head, to)| {
        sql.push("(").bind(c.aggregate_type.as_str()).push(", ").bind(c.aggregate_id.as_str());
        sql.push(", ").bind(*head).push(", ").bind(*to).push(")");
    });
    sql.push("), h AS (SELECT x.* FROM k CROSS JOIN LATERAL (SELECT ")
        .push(select)
        .push(" FROM outbox_events WHERE aggregate_type = k.t AND aggregate_id = k.i AND aggregate_version = k.f AND ");
    filter(sql);
    sql.push(suffix).push(
        ") x) SELECT * FROM h UNION ALL SELECT y.* FROM h JOIN k ON k.t = h.aggregate_type \
         AND k.i = h.aggregate_id AND k.l > k.f CROSS JOIN LATERAL (SELECT ",
    );
    sql.push(select).push(
        " FROM outbox_events WHERE aggregate_type = h.aggregate_type AND aggregate_id = h.aggregate_id \
         AND aggregate_version BETWEEN h.aggregate_version + 1 AND k.l AND ",
    );
    filter(sql);
    sql.push(suffix).push(") y");
}

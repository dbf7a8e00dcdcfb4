//! `outbox_aggregates.due_at_ms` as a hint the relay keeps up to date: when to look at an aggregate next.
//!
//! A hint only steers the claim; correctness never depends on it. A stale "due" costs one cheap probe; it
//! can never hide work, because every enqueue sets `due_at_ms` (if empty) in the writer's transaction, a
//! replay sets it for what it revives, and the relay clears it only under the row lock and only while
//! `last_version` and `due_at_ms` are still what its claim read. The relay never waits for a writer: rows a
//! writer holds are skipped (`SKIP LOCKED`) and keep their old hint.

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait, DbBackend, DbErr};

use crate::sql::{KeyedSelect, Sql};

/// Aggregates per hint statement (4 bound values each).
pub(super) const HINTS_PER_STATEMENT: usize = 250;

/// What to set one aggregate's `due_at_ms` to, encoded for one upsert (`last_version`, `due_at_ms`):
/// `(-1, t)` sets `t`; `(v, -d - 1)` clears it if `last_version = v` and `due_at_ms = d` still (a
/// compare-and-set against what the claim read) and keeps it otherwise; `(v, t)` clears it if
/// `last_version = v` and otherwise sets the retry time of event `v + 1` (`t` if not visible).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Hint {
    aggregate_type: String,
    aggregate_id: String,
    version: i64,
    due: Option<i64>,
}

impl Hint {
    /// A claim saw nothing pending up to `last_version` while the hint read `due_at_ms`: clear it unless
    /// either changed since (a writer added events, a replay revived dead ones).
    pub(super) fn clear_if_still(aggregate_type: &str, aggregate_id: &str, last_version: i64, due_at_ms: i64) -> Hint {
        Hint {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            version: last_version,
            due: Some(-due_at_ms.max(0) - 1),
        }
    }

    /// Events up to `version` are published (or set aside); the next one, if any, is due `fallback` at the latest.
    pub(super) fn after(aggregate_type: &str, aggregate_id: &str, version: i64, fallback_ms: i64) -> Hint {
        Hint {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            version,
            due: Some(fallback_ms),
        }
    }

    /// Not before `due_ms` (a head retrying, or leased).
    pub(super) fn at(aggregate_type: &str, aggregate_id: &str, due_ms: i64) -> Hint {
        Hint {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            version: -1,
            due: Some(due_ms),
        }
    }

    /// A dead head blocks the aggregate until `replay_dead`.
    pub(super) fn blocked(aggregate_type: &str, aggregate_id: &str) -> Hint {
        Hint::at(aggregate_type, aggregate_id, BLOCKED)
    }
}

/// `due_at_ms` of an aggregate blocked by a dead head: never due, and an enqueue keeps it.
const BLOCKED: i64 = i64::MAX;

/// Writes `hints` (the last one per aggregate wins) to the rows no writer holds, inside `txn`.
///
/// `mark` writes an `UPDATE` of outbox rows (the mark of a batch's published rows), run in the same
/// round trip as the first hints on PostgreSQL (a data-modifying `WITH`), before them elsewhere; the
/// result is the number of rows it updated (0 without one).
pub(super) async fn write_hints<C: ConnectionTrait>(
    txn: &C,
    hints: Vec<Hint>,
    mut mark: Option<&(dyn Fn(&mut Sql) + Sync)>,
) -> Result<u64, DbErr> {
    let backend = txn.get_database_backend();
    let mut marked = 0;
    if (backend != DbBackend::Postgres || hints.is_empty())
        && let Some(mark) = mark.take()
    {
        let mut update = Sql::new(backend);
        mark(&mut update);
        marked = txn.execute_raw(update.build()).await?.rows_affected();
    }
    let mut latest: BTreeMap<(String, String), Hint> = BTreeMap::new();
    for hint in hints {
        latest.insert((hint.aggregate_type.clone(), hint.aggregate_id.clone()), hint);
    }
    let hints: Vec<Hint> = latest.into_values().collect();
    for chunk in hints.chunks(HINTS_PER_STATEMENT) {
        let values = |sql: &mut Sql, hints: &[&Hint]| {
            sql.join(hints, ", ", |sql, hint| {
                sql.push("(")
                    .bind(hint.aggregate_type.as_str())
                    .push(", ")
                    .bind(hint.aggregate_id.as_str())
                    .push(", ")
                    .bind(hint.version)
                    .push(", ")
                    .bind(hint.due)
                    .push(")");
            });
        };
        let mut upsert = Sql::new(backend);
        let mark_first = mark.take();
        if let Some(mark) = mark_first {
            upsert.push("WITH marked AS (");
            mark(&mut upsert);
            upsert.push(" RETURNING 1), hinted AS (");
        }
        upsert.push("INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) ");
        match backend {
            DbBackend::Postgres => {
                // Locking and writing in one statement: the LATERAL lock skips rows a writer holds, so they
                // never reach the upsert (which would wait for them). A hint "after version v" takes the
                // retry time of event v + 1 where the statement sees it (read before the lock: a v + 1
                // committed since also raised `last_version`, which the upsert checks under the lock).
                upsert.push(
                    "SELECT k.t, k.i, k.v, CASE WHEN k.v >= 0 AND k.d >= 0 THEN COALESCE((SELECT \
                     n.next_attempt_at_ms FROM outbox_events n WHERE n.aggregate_type = k.t AND \
                     n.aggregate_id = k.i AND n.aggregate_version = k.v + 1), k.d) ELSE k.d END FROM (VALUES ",
                );
                values(&mut upsert, &chunk.iter().collect::<Vec<_>>());
                upsert.push(
                    ") AS k (t, i, v, d) CROSS JOIN LATERAL (SELECT 1 FROM outbox_aggregates a \
                     WHERE a.aggregate_type = k.t AND a.aggregate_id = k.i FOR UPDATE SKIP LOCKED) l",
                );
            }
            DbBackend::MySql => {
                let chunk = next_due(txn, chunk.iter().collect()).await?;
                let free = lock_free_rows(txn, &chunk).await?;
                if free.is_empty() {
                    continue;
                }
                upsert.push("VALUES ");
                values(&mut upsert, &free);
            }
            _ => {
                let chunk = next_due(txn, chunk.iter().collect()).await?;
                upsert.push("VALUES ");
                values(&mut upsert, &chunk.iter().collect::<Vec<_>>());
            }
        }
        let (v, due) = match backend {
            DbBackend::MySql => ("VALUES(last_version)", "VALUES(due_at_ms)"),
            _ => ("excluded.last_version", "excluded.due_at_ms"),
        };
        upsert.push(match backend {
            DbBackend::MySql => " ON DUPLICATE KEY UPDATE ",
            _ => " ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET ",
        });
        upsert.push(&format!(
            "due_at_ms = CASE WHEN {v} < 0 THEN {due} \
             WHEN {due} < 0 THEN CASE WHEN outbox_aggregates.last_version = {v} \
             AND outbox_aggregates.due_at_ms = -{due} - 1 THEN NULL ELSE outbox_aggregates.due_at_ms END \
             WHEN outbox_aggregates.last_version = {v} THEN NULL ELSE {due} END"
        ));
        if mark_first.is_some() {
            upsert.push(") SELECT COUNT(*) AS marked FROM marked");
            let row = txn.query_one_raw(upsert.build()).await?;
            marked = row.map(|row| row.try_get::<i64>("", "marked")).transpose()?.unwrap_or(0) as u64;
        } else {
            txn.execute_raw(upsert.build()).await?;
        }
    }
    Ok(marked)
}

/// MySQL: the hints whose aggregate rows this transaction could lock (`SKIP LOCKED`: a writer's are left).
async fn lock_free_rows<'h, C: ConnectionTrait>(txn: &C, hints: &'h [Hint]) -> Result<Vec<&'h Hint>, DbErr> {
    let keys: Vec<(String, String)> =
        hints.iter().map(|h| (h.aggregate_type.clone(), h.aggregate_id.clone())).collect();
    let free: std::collections::HashSet<(String, String)> =
        lock_free_aggregates(txn, &keys, "1 = 1").await?.into_iter().collect();
    Ok(hints.iter().filter(|h| free.contains(&(h.aggregate_type.clone(), h.aggregate_id.clone()))).collect())
}

/// Locks the `outbox_aggregates` rows of `keys` that meet `filter` and no other transaction holds
/// (`FOR UPDATE SKIP LOCKED`; SQLite's `BEGIN IMMEDIATE` holds them all), and returns their keys.
pub(super) async fn lock_free_aggregates<C: ConnectionTrait>(
    txn: &C,
    keys: &[(String, String)],
    filter: &str,
) -> Result<Vec<(String, String)>, DbErr> {
    let mut lock = Sql::new(txn.get_database_backend());
    write_lock_free_aggregates(&mut lock, keys, filter);
    txn.query_all_raw(lock.build())
        .await?
        .iter()
        .map(|row| Ok((row.try_get::<String>("", "aggregate_type")?, row.try_get::<String>("", "aggregate_id")?)))
        .collect()
}

/// The statement of [`lock_free_aggregates`].
pub(super) fn write_lock_free_aggregates(lock: &mut Sql, keys: &[(String, String)], filter: &str) {
    let backend = lock.backend();
    // By primary key, and with a column outside it: otherwise MariaDB scans the whole key on a small table
    // and locks every aggregate (see `store/keyed.rs`).
    KeyedSelect {
        select: "aggregate_type, aggregate_id, last_version",
        table: if backend == DbBackend::MySql {
            "outbox_aggregates FORCE INDEX (PRIMARY)"
        } else {
            "outbox_aggregates"
        },
        key_columns: &["aggregate_type", "aggregate_id"],
        suffix: if backend == DbBackend::Sqlite { "" } else { " FOR UPDATE SKIP LOCKED" },
    }
    .write(
        lock,
        keys,
        |sql, (t, i)| {
            sql.bind(t.as_str()).push(", ").bind(i.as_str());
        },
        |sql| {
            sql.push(filter);
        },
    );
}

/// For hints "after version `v`" (`due` set, `v >= 0`): the retry time of event `v + 1` where this
/// transaction can see it, the fallback otherwise (read before the locks: a `v + 1` committed after this
/// read also raised `last_version`, which the upsert checks under the lock, so the worst a stale read
/// costs is the fallback time). PostgreSQL reads it inside the upsert instead.
async fn next_due<C: ConnectionTrait>(txn: &C, hints: Vec<&Hint>) -> Result<Vec<Hint>, DbErr> {
    let after: Vec<&Hint> = hints.iter().copied().filter(|h| h.version >= 0 && h.due.is_some_and(|d| d >= 0)).collect();
    let mut found = std::collections::HashMap::new();
    if !after.is_empty() {
        let mut read = Sql::new(txn.get_database_backend());
        KeyedSelect {
            select: "aggregate_type, aggregate_id, next_attempt_at_ms",
            table: "outbox_events",
            key_columns: &["aggregate_type", "aggregate_id", "aggregate_version"],
            suffix: "",
        }
        .write(
            &mut read,
            &after,
            |sql, hint| {
                sql.bind(hint.aggregate_type.as_str())
                    .push(", ")
                    .bind(hint.aggregate_id.as_str())
                    .push(", ")
                    .bind(hint.version + 1);
            },
            |sql| {
                sql.push("1 = 1");
            },
        );
        for row in txn.query_all_raw(read.build()).await? {
            found.insert(
                (row.try_get::<String>("", "aggregate_type")?, row.try_get::<String>("", "aggregate_id")?),
                row.try_get::<i64>("", "next_attempt_at_ms")?,
            );
        }
    }
    Ok(hints
        .into_iter()
        .map(|hint| {
            let mut hint = hint.clone();
            if hint.version >= 0 && hint.due.is_some_and(|d| d >= 0) {
                let key = (hint.aggregate_type.clone(), hint.aggregate_id.clone());
                if let Some(next) = found.get(&key) {
                    hint.due = Some(*next);
                }
            }
            hint
        })
        .collect())
}

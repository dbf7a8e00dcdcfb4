//! Statements that write or lock outbox rows by primary key (`seq`): the mark, the release, the lease
//! stamp, the lease's fence, rows set aside, the cleanup's delete. Each locks only the rows it names.
//!
//! PostgreSQL and SQLite lock what a statement writes, whatever its plan. MariaDB/MySQL in REPEATABLE
//! READ locks every row a statement *reads*, matching or not, and plans `seq IN (…)` on a small table (an
//! empty outbox, one just cleaned) as a scan of the primary key (`EXPLAIN`: `type=index` or `ALL`): the
//! mark of one relay then waited for rows another relay had claimed, and one of the two died at the
//! mark with a deadlock after it had published its batch. So on MySQL each such statement
//! - names `FORCE INDEX (PRIMARY)`, which forbids a table scan;
//! - selects a column outside the key, so that a full scan of `PRIMARY` is never the "covering" read
//!   `FORCE INDEX` still allows (a `SELECT seq … FOR UPDATE` was planned so on a small table);
//! - holds at most [`SEQS_PER_STATEMENT`] keys: at `in_predicate_conversion_threshold` (1000 by
//!   default) MariaDB turns the `IN` list into a join with a derived table and scans the whole table.
//!
//! `SeaOrmStore::lock_plans` explains each of these statements; `tests/tests/suite/lock_plans.rs` holds them
//! to range reads of the primary key on a small table.

use sea_orm::sea_query::{Expr, ExprTrait, UpdateStatement};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, Statement};

use super::ClaimPlan;
use crate::entity::outbox_event::Column;
use crate::sql::Sql;

/// Most keys one statement names (below MariaDB's `in_predicate_conversion_threshold`).
pub(crate) const SEQS_PER_STATEMENT: usize = 500;

/// The index hint written after `outbox_events` in a statement by `seq`.
pub(crate) fn primary_key_hint(backend: DbBackend) -> &'static str {
    if backend == DbBackend::MySql { " FORCE INDEX (PRIMARY)" } else { "" }
}

/// `seqs` in the groups one statement takes each: [`SEQS_PER_STATEMENT`] on MySQL, all at once elsewhere.
pub(crate) fn chunks(backend: DbBackend, seqs: &[i64]) -> std::slice::Chunks<'_, i64> {
    let size = if backend == DbBackend::MySql { SEQS_PER_STATEMENT } else { seqs.len().max(1) };
    seqs.chunks(size)
}

/// Builds an `UPDATE outbox_events …` made with sea-query for `backend`, with the primary key hint on MySQL.
pub(crate) fn update(backend: DbBackend, update: &UpdateStatement) -> Statement {
    let mut statement = backend.build(update);
    if backend == DbBackend::MySql {
        const TABLE: &str = "UPDATE `outbox_events` ";
        debug_assert!(statement.sql.starts_with(TABLE), "{}", statement.sql);
        statement.sql = statement.sql.replacen(TABLE, "UPDATE `outbox_events` FORCE INDEX (PRIMARY) ", 1);
    }
    statement
}

/// `UPDATE outbox_events [hint] SET published_at_ms = {now_ms}, lease_token = NULL, lease_until_ms = NULL
/// WHERE seq IN (…) [AND created_at_ms BETWEEN …]`: the mark of published rows.
pub(crate) fn write_mark_published(sql: &mut Sql, seqs: &[i64], now_ms: i64, created: Option<(i64, i64)>) {
    let hint = primary_key_hint(sql.backend());
    sql.push("UPDATE outbox_events")
        .push(hint)
        .push(" SET published_at_ms = ")
        .bind(now_ms)
        .push(", lease_token = NULL, lease_until_ms = NULL WHERE seq IN (")
        .join(seqs, ", ", |sql, seq| {
            sql.bind(*seq);
        })
        .push(")");
    if let Some((first, last)) = created {
        sql.push(" AND created_at_ms BETWEEN ").bind(first).push(" AND ").bind(last);
    }
}

/// `SELECT seq, lease_token FROM outbox_events [hint] WHERE seq IN (heads) AND lease_token = {token}
/// [AND created …] FOR UPDATE`: the heads a lease-mode mark still holds.
pub(crate) fn write_lock_held_heads(sql: &mut Sql, heads: &[i64], token: &str, created: Option<(i64, i64)>) {
    let backend = sql.backend();
    sql.push("SELECT seq, lease_token FROM outbox_events").push(primary_key_hint(backend)).push(" WHERE seq IN (");
    sql.join(heads, ", ", |sql, seq| {
        sql.bind(*seq);
    });
    sql.push(") AND lease_token = ").bind(token);
    if let Some((first, last)) = created {
        sql.push(" AND created_at_ms BETWEEN ").bind(first).push(" AND ").bind(last);
    }
    // SQLite's `BEGIN IMMEDIATE` holds the whole database.
    if backend != DbBackend::Sqlite {
        sql.push(" FOR UPDATE");
    }
}

/// `DELETE outbox_events FROM outbox_events [hint] WHERE seq IN (…) AND {condition}` (MySQL's multi-table
/// form, the one that takes an index hint): the cleanup's delete of the rows a plain read found.
pub(crate) fn write_delete(sql: &mut Sql, seqs: &[i64], condition: impl FnOnce(&mut Sql)) {
    let hint = primary_key_hint(sql.backend());
    sql.push("DELETE outbox_events FROM outbox_events").push(hint).push(" WHERE seq IN (");
    sql.join(seqs, ", ", |sql, seq| {
        sql.bind(*seq);
    });
    sql.push(") AND ");
    condition(sql);
}

/// `UPDATE outbox_aggregates [hint] SET due_at_ms = {now_ms} WHERE due_at_ms IS NULL AND (key) IN (…)`:
/// the cleanup's re-arm of aggregates it has locked.
pub(crate) fn write_rearm(sql: &mut Sql, keys: &[(String, String)], now_ms: i64) {
    let hint = primary_key_hint(sql.backend());
    sql.push("UPDATE outbox_aggregates").push(hint).push(" SET due_at_ms = ").bind(now_ms);
    sql.push(" WHERE due_at_ms IS NULL AND ");
    crate::sql::in_tuples(sql, "aggregate_type, aggregate_id", keys, |sql, (t, i)| {
        sql.bind(t.as_str()).push(", ").bind(i.as_str());
    });
}

/// The plans the database chooses now for each statement of this module, and for the hints' and the
/// re-arm's locks of aggregates, each with as many keys as one statement takes (the keys need not exist).
/// Only `EXPLAIN`s run.
pub(super) async fn explain(txn: &DatabaseTransaction) -> Result<Vec<ClaimPlan>, DbErr> {
    let backend = txn.get_database_backend();
    let seqs: Vec<i64> = (1..).take(if backend == DbBackend::MySql { SEQS_PER_STATEMENT } else { 1000 }).collect();
    let keys: Vec<(String, String)> =
        (0..super::hints::HINTS_PER_STATEMENT).map(|i| ("order".to_owned(), format!("o{i}"))).collect();
    let created = None;
    let mut statements: Vec<(&'static str, Statement)> = Vec::new();
    let mut sql = Sql::new(backend);
    write_mark_published(&mut sql, &seqs, 0, created);
    statements.push(("mark", sql.build()));
    let mut failed = super::mark::settle(seqs.clone(), created);
    failed.value(Column::Attempts, Expr::col(Column::Attempts).add(1));
    statements.push(("mark failed, release, lease, set aside", update(backend, &failed)));
    let mut sql = Sql::new(backend);
    write_lock_held_heads(&mut sql, &seqs, "token", created);
    statements.push(("fence", sql.build()));
    let mut sql = Sql::new(backend);
    super::hints::write_lock_free_aggregates(&mut sql, &keys, "1 = 1");
    statements.push(("hints", sql.build()));
    let mut sql = Sql::new(backend);
    write_rearm(&mut sql, &keys, 0);
    statements.push(("rearm", sql.build()));
    if backend == DbBackend::MySql {
        let mut sql = Sql::new(backend);
        write_delete(&mut sql, &seqs, |sql| {
            sql.push("published_at_ms IS NOT NULL AND published_at_ms < ").bind(0i64);
        });
        statements.push(("cleanup", sql.build()));
    }
    let mut plans = Vec::new();
    for (statement, mut explained) in statements {
        let sql = explained.sql.clone();
        explained.sql.insert_str(0, super::claim::explain_prefix(backend));
        plans.push(ClaimPlan { statement, sql, plan: super::claim::plan_lines(txn, explained).await? });
    }
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use sea_orm::sea_query::Query;

    use super::*;
    use crate::entity::outbox_event::Entity;

    #[test]
    fn mysql_updates_by_seq_name_the_primary_key() {
        let mut stamp = Query::update();
        stamp.table(Entity).value(Column::LeaseToken, "t").and_where(Expr::col(Column::Seq).is_in([1, 2]));
        let mysql = update(DbBackend::MySql, &stamp);
        assert!(mysql.sql.starts_with("UPDATE `outbox_events` FORCE INDEX (PRIMARY) SET"), "{}", mysql.sql);
        let postgres = update(DbBackend::Postgres, &stamp);
        assert!(!postgres.sql.contains("FORCE"), "{}", postgres.sql);
    }

    #[test]
    fn mysql_statements_name_fewer_keys_than_the_in_list_conversion_threshold() {
        let seqs: Vec<i64> = (0..10_000).collect();
        assert!(chunks(DbBackend::MySql, &seqs).all(|chunk| chunk.len() <= SEQS_PER_STATEMENT));
        assert_eq!(chunks(DbBackend::Postgres, &seqs).count(), 1);
        assert_eq!(chunks(DbBackend::MySql, &[]).count(), 0);
    }
}

//! The mark: what a relay records once the broker answered for its batch (published, failed, dead,
//! released), the hints it leaves for the next claim, and the fence a lease-mode mark passes first. A mark
//! that fails after the broker confirmed its rows is made again rather than the rows published again.

use std::time::Duration;

use chrono::Utc;
use sea_orm::sea_query::{CaseStatement, Expr, ExprTrait, Query, UpdateStatement};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr};

use outbox_runtime::store::{BatchOutcome, ClaimedBatch, MarkReport};
use outbox_runtime::{DeadLetterPolicy, OutboxEvent};

use super::hints::{self, Hint};
use super::{FAILURES_PER_UPDATE, Hold, SeaOrmBatch, TABLE, begin_writer, keyed, truncate, within};
use crate::entity::outbox_event::{Column, Entity};
use crate::error::{Result, store_error};
use crate::sql::Sql;

/// `UPDATE … WHERE seq IN (…)` that also ends the rows' lease, if any. In lease mode the caller has checked
/// that it still holds their runs ([`lock_held_heads`]).
pub(super) fn settle(seqs: Vec<i64>, created: Option<(i64, i64)>) -> UpdateStatement {
    let mut update = Query::update();
    update.table(Entity).and_where(Expr::col(Column::Seq).is_in(seqs));
    within(&mut update, created);
    update.value(Column::LeaseToken, Option::<String>::None).value(Column::LeaseUntilMs, Option::<i64>::None);
    update
}

/// Locks the heads in `heads` that still carry `token` (`FOR UPDATE`; SQLite's `BEGIN IMMEDIATE` holds the
/// whole database) and returns them: a relay that took a run over has stamped its own token on the head,
/// and cannot take it back until this transaction ends.
async fn lock_held_heads(
    txn: &DatabaseTransaction,
    heads: Vec<i64>,
    token: &str,
    created: Option<(i64, i64)>,
) -> std::result::Result<std::collections::HashSet<i64>, DbErr> {
    let backend = txn.get_database_backend();
    let mut held = std::collections::HashSet::new();
    for chunk in keyed::chunks(backend, &heads) {
        let mut select = Sql::new(backend);
        keyed::write_lock_held_heads(&mut select, chunk, token, created);
        for row in txn.query_all_raw(select.build()).await? {
            held.insert(row.try_get::<i64>("", "seq")?);
        }
    }
    Ok(held)
}

/// The part of `outcome` on runs whose head this relay still holds, and how many published or failed rows
/// it leaves out (fenced: another relay holds their run now).
fn keep_held(
    events: &[OutboxEvent],
    held: &std::collections::HashSet<i64>,
    outcome: BatchOutcome,
) -> (BatchOutcome, u64) {
    let held_runs: std::collections::HashSet<(&str, &str)> = events
        .iter()
        .filter(|e| held.contains(&e.seq))
        .map(|e| (e.aggregate_type.as_str(), e.aggregate_id.as_str()))
        .collect();
    let kept: std::collections::HashSet<i64> = events
        .iter()
        .filter(|e| held_runs.contains(&(e.aggregate_type.as_str(), e.aggregate_id.as_str())))
        .map(|e| e.seq)
        .collect();
    let BatchOutcome { now, published, failed, released } = outcome;
    let before = (published.len() + failed.len()) as u64;
    let outcome = BatchOutcome {
        now,
        published: published.into_iter().filter(|seq| kept.contains(seq)).collect(),
        failed: failed.into_iter().filter(|f| kept.contains(&f.seq)).collect(),
        released: released.into_iter().filter(|seq| kept.contains(seq)).collect(),
    };
    let fenced = before - (outcome.published.len() + outcome.failed.len()) as u64;
    (outcome, fenced)
}

async fn mark<C: ConnectionTrait>(
    conn: &C,
    outcome: BatchOutcome,
    created: Option<(i64, i64)>,
) -> std::result::Result<MarkReport, DbErr> {
    let now_ms = outcome.now.timestamp_millis();
    let mut report = MarkReport::default();
    let expected = (outcome.published.len() + outcome.failed.len()) as u64;
    let backend = conn.get_database_backend();
    for chunk in keyed::chunks(backend, &outcome.published) {
        let mut update = Sql::new(backend);
        keyed::write_mark_published(&mut update, chunk, now_ms, created);
        report.published += conn.execute_raw(update.build()).await?.rows_affected();
    }
    // Each failure binds up to 5 values (its seq in the IN list and in two CASEs, the error and the next
    // attempt). Backends cap the values of one statement (SQLite 32766, PostgreSQL and MySQL 65535), which a
    // full batch of 10000 failures would exceed, so failures are marked in groups. Dead rows and rows to
    // retry go in separate statements, so that the rows each one marks are counted apart.
    let (dead, retried): (Vec<_>, Vec<_>) = outcome.failed.into_iter().partition(|f| f.dead);
    for (is_dead, failures) in [(true, dead), (false, retried)] {
        for group in failures.chunks(FAILURES_PER_UPDATE) {
            let (mut error, mut next) = (CaseStatement::new(), CaseStatement::new());
            for failure in group {
                let this = || Expr::col(Column::Seq).eq(failure.seq);
                error = error.case(this(), Expr::val(truncate(&failure.error)));
                next = next.case(this(), Expr::val(failure.next_attempt_at.timestamp_millis()));
            }
            let mut update = settle(group.iter().map(|f| f.seq).collect(), created);
            update
                .value(Column::Attempts, Expr::col(Column::Attempts).add(1))
                .value(Column::LastError, error)
                .value(Column::NextAttemptAtMs, next);
            if is_dead {
                update.value(Column::DeadAtMs, now_ms);
            }
            let marked = conn.execute_raw(keyed::update(backend, &update)).await?.rows_affected();
            report.failed += marked;
            if is_dead {
                report.dead += marked;
            }
        }
    }
    report.fenced = expected - report.published - report.failed;
    Ok(report)
}

/// Marks `outcome` and writes `hints` inside `txn`: the published rows' mark and the first hints go in one
/// statement (one round trip on PostgreSQL, see [`hints::write_hints`]), failures before them.
async fn mark_and_hint(
    txn: &DatabaseTransaction,
    mut outcome: BatchOutcome,
    created: Option<(i64, i64)>,
    hints: Vec<Hint>,
) -> std::result::Result<MarkReport, DbErr> {
    if txn.get_database_backend() != DbBackend::Postgres {
        // MySQL and SQLite: the mark in its own statements (chunked on MySQL, see `keyed`), then the hints.
        let report = mark(txn, outcome, created).await?;
        hints::write_hints(txn, hints, None).await?;
        return Ok(report);
    }
    let published = std::mem::take(&mut outcome.published);
    let now_ms = outcome.now.timestamp_millis();
    let mut report = mark(txn, outcome, created).await?;
    if published.is_empty() {
        hints::write_hints(txn, hints, None).await?;
        return Ok(report);
    }
    let set = |sql: &mut Sql| keyed::write_mark_published(sql, &published, now_ms, created);
    report.published = hints::write_hints(txn, hints, Some(&set)).await?;
    report.fenced += (published.len() as u64).saturating_sub(report.published);
    Ok(report)
}

impl SeaOrmBatch {
    /// The hints this outcome implies for the claimed aggregates, after the claim's own.
    fn hints_after(&mut self, outcome: &BatchOutcome) -> Vec<Hint> {
        let fallback_ms = Ord::min(outcome.now, Utc::now()).timestamp_millis();
        let by_seq: std::collections::HashMap<i64, &OutboxEvent> = self.events.iter().map(|e| (e.seq, e)).collect();
        let mut hints = std::mem::take(&mut self.hints);
        let mut failed = std::collections::HashSet::new();
        for failure in &outcome.failed {
            let Some(event) = by_seq.get(&failure.seq) else { continue };
            let (t, i) = (event.aggregate_type.as_str(), event.aggregate_id.as_str());
            failed.insert((t, i));
            hints.push(match (failure.dead, self.dead_letters) {
                (true, DeadLetterPolicy::BlockAggregate) => Hint::blocked(t, i),
                (true, DeadLetterPolicy::SkipDead) => Hint::after(t, i, event.aggregate_version, fallback_ms),
                (false, _) => Hint::at(t, i, failure.next_attempt_at.timestamp_millis()),
            });
        }
        let mut published: std::collections::BTreeMap<(&str, &str), i64> = Default::default();
        for seq in &outcome.published {
            let Some(event) = by_seq.get(seq) else { continue };
            let key = (event.aggregate_type.as_str(), event.aggregate_id.as_str());
            if !failed.contains(&key) {
                let top = published.entry(key).or_insert(event.aggregate_version);
                *top = Ord::max(*top, event.aggregate_version);
            }
        }
        hints.extend(published.into_iter().map(|((t, i), version)| {
            // A run that reached the last version the claim saw drained the aggregate, unless a writer added
            // more since or a replay revived older ones, which the compare-and-set clear checks under the
            // lock; no need to look up the next event.
            match self.last_versions.get(&(t.to_owned(), i.to_owned())) {
                Some((last, due)) if *last <= version => Hint::clear_if_still(t, i, version, *due),
                _ => Hint::after(t, i, version, fallback_ms),
            }
        }));
        hints
    }
}

impl ClaimedBatch for SeaOrmBatch {
    fn events(&self) -> &[OutboxEvent] {
        &self.events
    }

    fn dead_on_claim(&self) -> u64 {
        self.dead_on_claim
    }

    async fn complete(mut self, outcome: BatchOutcome) -> Result<MarkReport> {
        let hints = self.hints_after(&outcome);
        match std::mem::replace(&mut self.hold, Hold::Nothing) {
            Hold::Nothing => Ok(MarkReport::default()),
            Hold::Transaction { txn, db } => {
                let backend = txn.get_database_backend();
                let published = outcome.published.clone();
                let now_ms = outcome.now.timestamp_millis();
                // Released rows hold only this transaction's row locks, which the commit lets go.
                let marked = match mark_and_hint(&txn, outcome, self.created, hints).await {
                    Ok(report) => txn.commit().await.map(|()| report).map_err(|e| ("commit a batch", e)),
                    Err(error) => {
                        // Let go of the rows now: the retry below writes them.
                        txn.rollback().await.ok();
                        Err(("mark a batch", error))
                    }
                };
                match marked {
                    Ok(report) => Ok(report),
                    // The broker has the published rows: record them again rather than publish them again.
                    Err((operation, error)) => mark_published_again(&db, &published, now_ms, self.created, error)
                        .await
                        .map_err(|e| store_error(operation, TABLE, backend, e)),
                }
            }
            Hold::Lease { db, token, heads } => {
                let backend = db.get_database_backend();
                let mut attempt = 1;
                loop {
                    // The lease still keeps other relays off these runs, so a failed mark is tried again
                    // whole (and fenced again, should the lease have passed meanwhile).
                    match self.mark_leased(&db, &token, heads.clone(), outcome.clone(), hints.clone()).await {
                        Ok(report) => return Ok(report),
                        Err((operation, error)) if attempt >= MARK_ATTEMPTS => {
                            return Err(store_error(operation, TABLE, backend, error));
                        }
                        Err((operation, error)) => {
                            tracing::warn!(%error, attempt, "{operation} failed after publishing; trying the mark again");
                            tokio::time::sleep(MARK_RETRY_WAIT * attempt).await;
                            attempt += 1;
                        }
                    }
                }
            }
        }
    }
}

/// How many times a mark that failed after the broker confirmed its rows is tried before the pass fails
/// (and the rows, still unpublished in the table, go out again).
const MARK_ATTEMPTS: u32 = 4;
/// The wait before the second attempt of a mark, growing by as much for each later one.
const MARK_RETRY_WAIT: Duration = Duration::from_millis(50);

impl SeaOrmBatch {
    /// One attempt at a lease-mode mark, in a transaction of its own: what failed, if it did.
    async fn mark_leased(
        &self,
        db: &DatabaseConnection,
        token: &str,
        heads: Vec<i64>,
        outcome: BatchOutcome,
        hints: Vec<Hint>,
    ) -> std::result::Result<MarkReport, (&'static str, DbErr)> {
        let txn = begin_writer(db).await.map_err(|e| ("begin a mark", e))?;
        match self.mark_leased_in(&txn, token, heads, outcome, hints).await {
            Ok(report) => {
                txn.commit().await.map_err(|e| ("commit a leased batch", e))?;
                if report.fenced > 0 {
                    tracing::warn!(
                        fenced = report.fenced,
                        "lease expired and another relay took over; outcome not recorded"
                    );
                }
                Ok(report)
            }
            Err(error) => {
                txn.rollback().await.ok();
                Err(error)
            }
        }
    }

    async fn mark_leased_in(
        &self,
        txn: &DatabaseTransaction,
        token: &str,
        heads: Vec<i64>,
        outcome: BatchOutcome,
        hints: Vec<Hint>,
    ) -> std::result::Result<MarkReport, (&'static str, DbErr)> {
        let backend = txn.get_database_backend();
        let held = lock_held_heads(txn, heads, token, self.created).await.map_err(|e| ("lock leased heads", e))?;
        let (mut outcome, fenced) = keep_held(&self.events, &held, outcome);
        let released = std::mem::take(&mut outcome.released);
        // Free the rest of a stopped run now rather than at lease expiry.
        for chunk in keyed::chunks(backend, &released) {
            let release = keyed::update(backend, &settle(chunk.to_vec(), self.created));
            txn.execute_raw(release).await.map_err(|e| ("release leased rows", e))?;
        }
        // With a run fenced, the relay that took it over writes the hints.
        let mut report = if fenced == 0 {
            mark_and_hint(txn, outcome, self.created, hints).await
        } else {
            mark(txn, outcome, self.created).await
        }
        .map_err(|e| ("mark a leased batch", e))?;
        report.fenced += fenced;
        Ok(report)
    }
}

/// After a transaction-mode mark failed (a deadlock, a lost connection at commit), with the claim's
/// transaction and its locks gone: marks the rows the broker confirmed published in transactions of
/// their own, up to [`MARK_ATTEMPTS`] times, so they are not published again. Only rows still unpublished
/// are written (another relay may have claimed, published and marked them meanwhile; it published them
/// again then, which only this narrow window allows). Failures are not recorded: those rows are tried
/// again at once, their attempt not counted. The aggregates keep their hints, which a claim clears.
async fn mark_published_again(
    db: &DatabaseConnection,
    published: &[i64],
    now_ms: i64,
    created: Option<(i64, i64)>,
    first_error: DbErr,
) -> std::result::Result<MarkReport, DbErr> {
    let backend = db.get_database_backend();
    tracing::warn!(error = %first_error, rows = published.len(), "a mark failed after publishing; marking the published rows again");
    if published.is_empty() {
        return Err(first_error);
    }
    for attempt in 1..MARK_ATTEMPTS {
        tokio::time::sleep(MARK_RETRY_WAIT * attempt).await;
        let marked = async {
            let txn = begin_writer(db).await?;
            let mut marked = 0;
            for chunk in keyed::chunks(backend, published) {
                let mut update = Sql::new(backend);
                keyed::write_mark_published(&mut update, chunk, now_ms, created);
                update.push(" AND published_at_ms IS NULL");
                marked += txn.execute_raw(update.build()).await?.rows_affected();
            }
            txn.commit().await?;
            Ok::<_, DbErr>(marked)
        }
        .await;
        match marked {
            Ok(marked) => {
                tracing::info!(marked, attempt, "published rows marked after a failed mark");
                return Ok(MarkReport { published: marked, ..MarkReport::default() });
            }
            Err(error) => tracing::warn!(%error, attempt, "marking published rows again failed"),
        }
    }
    Err(first_error)
}

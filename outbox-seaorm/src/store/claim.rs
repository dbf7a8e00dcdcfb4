//! The claim: find aggregates with work through `outbox_aggregates`, then take a *run* from each: its
//! head (oldest unpublished event) and the due events after it, consecutive in `aggregate_version`.
//!
//! Every step reads a number of rows bounded by the batch size, whatever the backlog:
//! 1. candidates: `outbox_aggregates` rows due now, soonest first (index `outbox_aggregates_due`), each
//!    with its head version, the first entry of `outbox_events_runs` for that aggregate;
//! 2. the heads, by `(aggregate, version)`, locked with `FOR UPDATE SKIP LOCKED` and only if claimable
//!    (due, not dead, not leased);
//! 3. the rest of each run whose head this relay now holds, versions `head + 1 ..` cut to the remaining
//!    budget, locked the same way. Locking heads first means a relay never locks rows behind a head
//!    another relay holds. On PostgreSQL steps 2 and 3 are one statement (the rest is read from the heads
//!    it locked); SQLite reads each run as one range.
//!
//! MySQL finds the rows' primary keys with a plain read first and locks by primary key, which takes no gap
//! locks, so enqueues never wait on a claim. SQLite has no row locks: the claim runs in `BEGIN IMMEDIATE`.
//!
//! A run is kept only from its head and up to its first gap, so an event is never claimed while an
//! earlier one of its aggregate is unpublished, with any number of relays. An aggregate the candidates
//! show with nothing pending becomes a [`Hint`] the mark writes back, so the next claim skips it.

use std::collections::{HashMap, HashSet};

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, QueryResult, Statement};

use outbox_runtime::store::ClaimRequest;
use outbox_runtime::{DeadLetterPolicy, EventId, Headers, OutboxEvent};

use super::hints::Hint;
use crate::sql::Sql;

mod fetch;

use fetch::{KEYS_PER_STATEMENT, Keys, SEQS_PER_STATEMENT, fetch, write_fetch};

/// Most candidate pages one claim reads before it settles for what it has (other relays hold the rest).
const MAX_ROUNDS: usize = 8;

/// A head row the claim could not decode: it is marked dead with `error` instead of failing the claim.
pub(super) struct Undecodable {
    pub(super) seq: i64,
    pub(super) error: String,
}

/// What a claim took, and what it learned about the aggregates it could not take.
pub(super) struct Claimed {
    pub(super) events: Vec<OutboxEvent>,
    /// Heads that do not decode; their aggregates' hints are in `hints` (blocked, or past them).
    pub(super) undecodable: Vec<Undecodable>,
    pub(super) hints: Vec<Hint>,
    /// `(last_version, due_at_ms)` of each claimed aggregate as the claim read them: a run that ends at that
    /// version drained the aggregate, unless the hint changed meanwhile (a replay).
    pub(super) last_versions: HashMap<(String, String), (i64, i64)>,
    /// How many candidates with pending events the claim gave budget to.
    pub(super) runs_tried: usize,
}

/// The size of a claim's first candidates page, for a relay whose last claim took `events` in `runs` runs:
/// as many aggregates as runs of that length fill `limit`, and a quarter more. Each candidate costs a probe
/// of its head, so a backlog of long runs (a few hundred aggregates with many events each) reads a page of
/// the aggregates it uses instead of `limit`; a page that falls short is followed by one of the budget
/// left.
pub(super) fn first_page(limit: u32, runs: usize, events: usize) -> usize {
    let limit = limit as usize;
    if runs == 0 || events <= runs {
        return limit;
    }
    let aggregates = limit.saturating_mul(runs).div_ceil(events);
    aggregates.saturating_add(aggregates / 4 + 4).min(limit)
}

/// `n` rounded up to one of 1 ..= 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, … (four sizes per doubling, at
/// most 25 % above `n`): PostgreSQL's page sizes are written into the candidates statement's text, and a
/// few texts keep a few prepared statements per connection.
fn few_texts(n: usize) -> usize {
    if n <= 8 {
        return n;
    }
    let step = (1usize << (usize::BITS - 1 - n.leading_zeros())) / 4;
    n.div_ceil(step).saturating_mul(step)
}

/// An aggregate with work, as step 1 found it.
struct Candidate {
    aggregate_type: String,
    aggregate_id: String,
    last_version: i64,
    due_at_ms: i64,
    head: Option<i64>,
}

/// A condition every unpublished row meets (its creation time lies between the oldest and the newest
/// unpublished row's), added to the claim's statements on a partitioned outbox: PostgreSQL then skips, at
/// run time, every partition that holds no unpublished row in that range, instead of probing each one for
/// every key. Both ends are read in the statement's own snapshot (so no row the statement could see is
/// ever left out) through `outbox_events_unpublished_created`, one probe per partition per statement.
/// That index is on `created_at_ms + 0`, an expression the condition does not use: the planner cannot
/// pick it to find the keyed rows, which statistics taken while nothing was pending would make it do
/// (a range scan of every pending row for each statement: 416 events/s instead of 14,000).
const PRUNE_PUBLISHED_PARTITIONS: &str = "created_at_ms BETWEEN (SELECT o.created_at_ms + 0 FROM outbox_events o \
    WHERE o.published_at_ms IS NULL ORDER BY o.created_at_ms + 0 LIMIT 1) AND (SELECT o.created_at_ms + 0 \
    FROM outbox_events o WHERE o.published_at_ms IS NULL ORDER BY o.created_at_ms + 0 DESC LIMIT 1)";

/// MariaDB's index hints for the claim's per-aggregate probes. With statistics that InnoDB recomputed while
/// few rows were pending, MariaDB probed each aggregate's head through `outbox_events_pending`
/// (`published_at_ms IS NULL` as a constant `ref`), filtering and sorting every pending row for each of the
/// 1000 candidates: two relays on 100k pending fell from 18k to 2.5k events/s for whole drains
/// (docs/scaling.md). The forced indexes are the ones each probe matches exactly.
const MYSQL_RUNS_INDEX: &str = " FORCE INDEX (outbox_events_runs)";

/// Claims up to `request.limit` events as runs inside `txn`; `partitioned` says that `outbox_events` is
/// partitioned (see [`PRUNE_PUBLISHED_PARTITIONS`]).
pub(super) async fn claim_runs(
    txn: &DatabaseTransaction,
    request: &ClaimRequest,
    partitioned: bool,
    first_page: usize,
) -> Result<Claimed, DbErr> {
    let now_ms = request.now.timestamp_millis();
    let limit = request.limit as usize;
    let mut claimed = Claimed {
        events: Vec::new(),
        undecodable: Vec::new(),
        hints: Vec::new(),
        last_versions: HashMap::new(),
        runs_tried: 0,
    };
    // The first page is sized from the last claim (see `first_page`); later pages are `limit` long.
    let mut page_size = first_page.clamp(1, limit.max(1));
    if txn.get_database_backend() == DbBackend::Postgres {
        page_size = few_texts(page_size).min(limit.max(1));
    }
    let mut after: Option<(i64, String, String)> = None;
    let mut pending_candidates: std::collections::VecDeque<Candidate> = Default::default();
    let mut exhausted = false;
    for _ in 0..MAX_ROUNDS {
        let budget = limit - claimed.events.len();
        if budget == 0 {
            break;
        }
        if pending_candidates.is_empty() {
            if exhausted {
                break;
            }
            let page = candidates(txn, request, after.as_ref(), page_size, partitioned).await?;
            exhausted = page.len() < page_size;
            page_size = limit;
            if let Some(last) = page.last() {
                after = Some((last.due_at_ms, last.aggregate_type.clone(), last.aggregate_id.clone()));
            }
            pending_candidates.extend(page);
            if pending_candidates.is_empty() {
                break;
            }
        }
        // Give the budget to candidates in due order, each as much as it has pending.
        let mut round: Vec<(Candidate, i64, i64)> = Vec::new();
        let mut left = budget as i64;
        while left > 0 {
            let Some(candidate) = pending_candidates.pop_front() else { break };
            match candidate.head {
                // Nothing pending (under SkipDead: nothing but dead rows, which a replay may revive, so the
                // clear is a compare-and-set on the hint the replay changes).
                None => claimed.hints.push(Hint::clear_if_still(
                    &candidate.aggregate_type,
                    &candidate.aggregate_id,
                    candidate.last_version,
                    candidate.due_at_ms,
                )),
                Some(head) => {
                    let take = (candidate.last_version - head + 1).clamp(1, left);
                    left -= take;
                    round.push((candidate, head, head + take - 1));
                    claimed.runs_tried += 1;
                }
            }
        }
        if round.is_empty() {
            continue;
        }
        take_runs(txn, now_ms, &round, request.dead_letters, partitioned, &mut claimed).await?;
    }
    Ok(claimed)
}

/// Step 1: due aggregates after `after` (keyset paging), soonest first, with their head versions.
async fn candidates(
    txn: &DatabaseTransaction,
    request: &ClaimRequest,
    after: Option<&(i64, String, String)>,
    limit: usize,
    partitioned: bool,
) -> Result<Vec<Candidate>, DbErr> {
    let mut sql = Sql::new(txn.get_database_backend());
    write_candidates(&mut sql, request, after, limit, partitioned);
    let rows = txn.query_all_raw(sql.build()).await?;
    rows.iter()
        .map(|row| {
            Ok(Candidate {
                aggregate_type: row.try_get("", "aggregate_type")?,
                aggregate_id: row.try_get("", "aggregate_id")?,
                last_version: row.try_get("", "last_version")?,
                due_at_ms: row.try_get("", "due_at_ms")?,
                head: row.try_get("", "head")?,
            })
        })
        .collect()
}

/// The statement of step 1, appended to `sql`.
fn write_candidates(
    sql: &mut Sql,
    request: &ClaimRequest,
    after: Option<&(i64, String, String)>,
    limit: usize,
    partitioned: bool,
) {
    sql.push(
        "SELECT a.aggregate_type, a.aggregate_id, a.last_version, a.due_at_ms, \
         (SELECT e.aggregate_version FROM outbox_events e",
    );
    if sql.backend() == DbBackend::MySql {
        sql.push(MYSQL_RUNS_INDEX);
    }
    sql.push(
        " WHERE e.aggregate_type = a.aggregate_type AND e.aggregate_id = a.aggregate_id \
         AND e.published_at_ms IS NULL",
    );
    if partitioned {
        sql.push(" AND e.").push(PRUNE_PUBLISHED_PARTITIONS);
    }
    if request.dead_letters == DeadLetterPolicy::SkipDead {
        sql.push(" AND e.dead_at_ms IS NULL");
    }
    // `ORDER BY … LIMIT 1`, not `MIN`: MariaDB reads every pending entry of the aggregate for a correlated
    // `MIN` (130 per candidate in a 300k backlog, 100k for a hot aggregate); this stops at the first.
    sql.push(" ORDER BY e.aggregate_version LIMIT 1) AS head FROM outbox_aggregates a WHERE a.due_at_ms <= ");
    sql.bind(request.now.timestamp_millis());
    if let Some((due, aggregate_type, aggregate_id)) = after {
        sql.push(" AND (a.due_at_ms > ")
            .bind(*due)
            .push(" OR (a.due_at_ms = ")
            .bind(*due)
            .push(" AND (a.aggregate_type > ")
            .bind(aggregate_type.as_str())
            .push(" OR (a.aggregate_type = ")
            .bind(aggregate_type.as_str())
            .push(" AND a.aggregate_id > ")
            .bind(aggregate_id.as_str())
            .push("))))");
    }
    sql.push(" ORDER BY a.due_at_ms, a.aggregate_type, a.aggregate_id LIMIT ");
    if sql.backend() == DbBackend::Postgres {
        // Written out, not bound: PostgreSQL estimates a bound `LIMIT` as 10 % of the table and so planned
        // the statement afresh at every execution (about 0.2 ms a pass, what a pass at batch 10 lost);
        // with the limit in the text it caches the plan after five executions. (SQLite ran 15 % slower at
        // batch 1000 with the limit written out and its page sizes rounded; MariaDB did not change.)
        sql.push(&limit.to_string());
    } else {
        sql.bind(limit as i64);
    }
}

/// One claim statement and the plan the database chose for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimPlan {
    /// `candidates` (step 1), `runs` (steps 2 and 3 for the first candidates: their heads and the rest
    /// of their runs, locked in one statement on PostgreSQL and SQLite, a plain read of their keys on
    /// MySQL) or `locks` (MySQL: the lock of those rows by primary key).
    pub statement: &'static str,
    /// The statement's SQL as the relay sends it, placeholders included (`$1` on PostgreSQL, `?`
    /// elsewhere): docs/how-it-works.md prints these.
    pub sql: String,
    /// The plan, one line per row of `EXPLAIN` (PostgreSQL), `EXPLAIN` (MySQL: table, access type, key,
    /// rows, extra) or `EXPLAIN QUERY PLAN` (SQLite).
    pub plan: Vec<String>,
}

/// The plans of the claim's statements as a relay would run them now, inside `txn` (nothing is executed
/// but the reads that find real keys for the later statements' plans: the candidates, and on MySQL the
/// plain read of the runs).
pub(super) async fn explain(
    txn: &DatabaseTransaction,
    request: &ClaimRequest,
    partitioned: bool,
) -> Result<Vec<ClaimPlan>, DbErr> {
    let backend = txn.get_database_backend();
    let limit = request.limit as usize;
    let mut plans = Vec::new();
    let mut sql = Sql::new(backend);
    sql.push(explain_prefix(backend));
    write_candidates(&mut sql, request, None, limit, partitioned);
    let text = sql.text()[explain_prefix(backend).len()..].to_owned();
    plans.push(ClaimPlan { statement: "candidates", sql: text, plan: plan_lines(txn, sql).await? });

    let found = candidates(txn, request, None, limit, partitioned).await?;
    let runs: Vec<(&Candidate, i64, i64)> = found
        .iter()
        .filter_map(|c| c.head.map(|head| (c, head, c.last_version.max(head))))
        .take(KEYS_PER_STATEMENT)
        .collect();
    if runs.is_empty() {
        return Ok(plans);
    }
    let now_ms = Some(request.now.timestamp_millis());
    // The statements `take_runs` runs for these runs, in its order.
    let statements: Vec<(&'static str, Keys<'_>, Option<i64>)> = match backend {
        DbBackend::Postgres => vec![("runs", Keys::HeldRuns(runs), now_ms)],
        DbBackend::MySql => {
            // The plain read is executed (it locks nothing) to find the primary keys the lock is planned for.
            let seqs = fetch(txn, Keys::Runs(runs.clone()), None, partitioned)
                .await?
                .iter()
                .map(|row| row.try_get::<i64>("", "seq"))
                .collect::<Result<Vec<_>, _>>()?;
            let seqs = seqs.into_iter().take(SEQS_PER_STATEMENT).collect();
            vec![("runs", Keys::Runs(runs), None), ("locks", Keys::Seqs(seqs), now_ms)]
        }
        _ => vec![("runs", Keys::Runs(runs), now_ms)],
    };
    for (statement, keys, lock) in statements {
        let mut sql = Sql::new(backend);
        sql.push(explain_prefix(backend));
        write_fetch(&mut sql, &keys, lock, partitioned);
        let text = sql.text()[explain_prefix(backend).len()..].to_owned();
        plans.push(ClaimPlan { statement, sql: text, plan: plan_lines(txn, sql).await? });
    }
    Ok(plans)
}

pub(super) fn explain_prefix(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Sqlite => "EXPLAIN QUERY PLAN ",
        _ => "EXPLAIN ",
    }
}

pub(super) async fn plan_lines(txn: &DatabaseTransaction, sql: impl Into<Statement>) -> Result<Vec<String>, DbErr> {
    let backend = txn.get_database_backend();
    let rows = txn.query_all_raw(sql.into()).await?;
    rows.iter()
        .map(|row| match backend {
            DbBackend::Postgres => row.try_get::<String>("", "QUERY PLAN"),
            DbBackend::MySql => {
                let text = |column: &str| -> Result<String, DbErr> {
                    Ok(row.try_get::<Option<String>>("", column)?.unwrap_or_default())
                };
                let rows = row.try_get::<Option<i64>>("", "rows").ok().flatten().unwrap_or_default();
                Ok(format!(
                    "{} table={} type={} key={} rows={rows} extra={}",
                    text("select_type")?,
                    text("table")?,
                    text("type")?,
                    text("key")?,
                    text("Extra")?
                ))
            }
            _ => row.try_get::<String>("", "detail"),
        })
        .collect()
}

/// Steps 2 and 3 for one round of candidates: lock the heads, then the rest of each run whose head this
/// relay now holds (never rows behind a head another relay holds), and keep the valid runs.
async fn take_runs(
    txn: &DatabaseTransaction,
    now_ms: i64,
    round: &[(Candidate, i64, i64)],
    dead_letters: DeadLetterPolicy,
    partitioned: bool,
    claimed: &mut Claimed,
) -> Result<(), DbErr> {
    let backend = txn.get_database_backend();
    let runs = || -> Vec<(&Candidate, i64, i64)> { round.iter().map(|(c, head, to)| (c, *head, *to)).collect() };
    // The rest of each run whose head this relay holds.
    let rests = |held: &HashSet<(String, String)>| -> Vec<(&Candidate, i64, i64)> {
        round
            .iter()
            .filter(|(c, head, to)| to > head && held.contains(&(c.aggregate_type.clone(), c.aggregate_id.clone())))
            .map(|(c, head, to)| (c, *head + 1, *to))
            .collect()
    };
    let rows: Vec<QueryResult> = match backend {
        DbBackend::MySql => {
            // A plain read finds the rows' primary keys; the locks are then taken by primary key.
            let mut seq_of: HashMap<(String, String, i64), i64> = HashMap::new();
            for row in fetch(txn, Keys::Runs(runs()), None, partitioned).await? {
                let key = (
                    row.try_get("", "aggregate_type")?,
                    row.try_get("", "aggregate_id")?,
                    row.try_get("", "aggregate_version")?,
                );
                seq_of.insert(key, row.try_get("", "seq")?);
            }
            let seqs = |runs: Vec<(&Candidate, i64, i64)>| -> Vec<i64> {
                runs.into_iter()
                    .flat_map(|(c, from, to)| (from..=to).map(move |v| (c, v)))
                    .filter_map(|(c, v)| seq_of.get(&(c.aggregate_type.clone(), c.aggregate_id.clone(), v)).copied())
                    .collect()
            };
            let heads = round.iter().map(|(c, head, _)| (c, *head, *head)).collect();
            let mut rows = fetch(txn, Keys::Seqs(seqs(heads)), Some(now_ms), partitioned).await?;
            let held = aggregates_of(&rows)?;
            rows.extend(fetch(txn, Keys::Seqs(seqs(rests(&held))), Some(now_ms), partitioned).await?);
            rows
        }
        DbBackend::Postgres => fetch(txn, Keys::HeldRuns(runs()), Some(now_ms), partitioned).await?,
        _ => fetch(txn, Keys::Runs(runs()), Some(now_ms), partitioned).await?,
    };

    let mut by_aggregate: HashMap<(String, String), Vec<(i64, &QueryResult)>> = HashMap::new();
    for row in &rows {
        let key: (String, String) = (row.try_get("", "aggregate_type")?, row.try_get("", "aggregate_id")?);
        by_aggregate.entry(key).or_default().push((row.try_get("", "aggregate_version")?, row));
    }
    for (candidate, head, _) in round {
        let key = (candidate.aggregate_type.clone(), candidate.aggregate_id.clone());
        let Some(mut found) = by_aggregate.remove(&key) else {
            continue; // the head is held by another relay, not due, dead, or just published
        };
        found.sort_by_key(|(version, _)| *version);
        // A run starts at the head and stops at the first version it could not take, or could not decode:
        // such a row waits until it is the head, and is then set aside as dead, alone.
        for (expected, (version, row)) in (*head..).zip(found) {
            if version != expected {
                break;
            }
            match decode_row(row, backend) {
                Ok(event) => claimed.events.push(event),
                Err(Undecoded::Store(error)) => return Err(error),
                Err(Undecoded::Content(error)) => {
                    if version == *head {
                        let seq: i64 = row.try_get("", "seq")?;
                        tracing::error!(
                            seq,
                            aggregate_type = %key.0,
                            aggregate_id = %key.1,
                            version,
                            %error,
                            "an outbox row cannot be decoded; it is marked dead"
                        );
                        claimed.hints.push(match dead_letters {
                            DeadLetterPolicy::BlockAggregate => Hint::blocked(&key.0, &key.1),
                            DeadLetterPolicy::SkipDead => Hint::after(&key.0, &key.1, version, now_ms),
                        });
                        claimed.undecodable.push(Undecodable { seq, error });
                    }
                    break;
                }
            }
        }
        claimed.last_versions.insert(key, (candidate.last_version, candidate.due_at_ms));
    }
    Ok(())
}

/// The aggregates of `rows`.
fn aggregates_of(rows: &[QueryResult]) -> Result<HashSet<(String, String)>, DbErr> {
    rows.iter().map(|row| Ok((row.try_get("", "aggregate_type")?, row.try_get("", "aggregate_id")?))).collect()
}

/// Why a claimed row did not become an [`OutboxEvent`].
enum Undecoded {
    /// Reading the row failed: the claim fails.
    Store(DbErr),
    /// The row holds something the envelope cannot carry: the row is set aside, the claim goes on.
    Content(String),
}

impl From<DbErr> for Undecoded {
    fn from(error: DbErr) -> Self {
        match error {
            // A value of the wrong type or out of range (a schema version beyond `i32`, ...) is the row's
            // fault, not the connection's.
            DbErr::Type(message) => Undecoded::Content(message),
            DbErr::TryIntoErr { from, into, source } => {
                Undecoded::Content(format!("a {from} value does not fit {into}: {source}"))
            }
            error => Undecoded::Store(error),
        }
    }
}

fn decode_row(row: &QueryResult, backend: DbBackend) -> Result<OutboxEvent, Undecoded> {
    let content = |what: String| Undecoded::Content(what);
    let id: String = row.try_get("", "event_id")?;
    let headers: String = row.try_get("", "headers")?;
    let payload: String = row.try_get("", "payload")?;
    let created_at_ms: i64 = row.try_get("", "created_at_ms")?;
    // PostgreSQL's `jsonb` and MySQL's `JSON` only hold valid JSON; SQLite's `TEXT` holds anything.
    if backend == DbBackend::Sqlite && serde_json::from_str::<&serde_json::value::RawValue>(&payload).is_err() {
        return Err(content(format!("the payload of event {} is not valid JSON", one_line(&id))));
    }
    Ok(OutboxEvent {
        seq: row.try_get("", "seq")?,
        aggregate_version: row.try_get("", "aggregate_version")?,
        id: id.parse::<EventId>().map_err(|e| content(format!("event_id {:?} is not a UUID: {e}", one_line(&id))))?,
        aggregate_type: row.try_get("", "aggregate_type")?,
        aggregate_id: row.try_get("", "aggregate_id")?,
        event_type: row.try_get("", "event_type")?,
        schema_version: row.try_get("", "schema_version")?,
        payload,
        headers: serde_json::from_str::<Headers>(&headers).map_err(|e| {
            content(format!("the headers of event {} are not a JSON map of strings: {e}", one_line(&id)))
        })?,
        created_at: chrono::DateTime::from_timestamp_millis(created_at_ms).unwrap_or_default(),
        attempts: row.try_get("", "attempts")?,
        last_error: row.try_get("", "last_error")?,
    })
}

/// `text` cut to fit a message, on one line.
fn one_line(text: &str) -> String {
    outbox_runtime::text::one_line(&outbox_runtime::text::truncate(text, 80))
}

#[cfg(test)]
mod tests {
    use super::first_page;

    #[test]
    fn the_first_page_holds_the_aggregates_the_last_claims_run_length_needs() {
        // Unknown, or runs of one event: a page as long as the batch.
        assert_eq!(first_page(1000, 0, 0), 1000);
        assert_eq!(first_page(1000, 1000, 1000), 1000);
        // Runs of 10: 100 aggregates fill the batch, plus a quarter and 4.
        assert_eq!(first_page(1000, 100, 1000), 129);
        // One hot aggregate: a handful.
        assert_eq!(first_page(1000, 1, 1000), 5);
        // Never more than the batch, never less than one.
        assert_eq!(first_page(3, 1, 2), 3);
        assert_eq!(first_page(1, 1, 50), 1);
    }

    #[test]
    fn page_sizes_take_few_values() {
        let sizes: std::collections::BTreeSet<usize> = (1..=40).map(super::few_texts).collect();
        assert_eq!(sizes.into_iter().collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40]);
        assert!((1..=100_000).all(|n| super::few_texts(n) >= n && super::few_texts(n) <= n + n / 4));
    }
}

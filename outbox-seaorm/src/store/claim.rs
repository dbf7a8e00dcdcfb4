//! The claim: find aggregates with work through `outbox_aggregates`, then take a *run* from each: its
//! head (oldest unpublished event) and the due events after it, consecutive in `aggregate_version`.
//!
//! Every step reads a number of rows bounded by the batch size, whatever the backlog:
//! 1. candidates: `outbox_aggregates` rows due now, soonest first (index `outbox_aggregates_due`), each
//!    with its head version, a `MIN` over `outbox_events_runs` that stops at the first pending entry;
//! 2. the runs: version ranges `[head, head + n)` of those aggregates, `n` cut to the remaining budget;
//! 3. row locks: `FOR UPDATE SKIP LOCKED` (PostgreSQL in step 2; MySQL by primary key, which takes no gap
//!    locks, so enqueues never wait on a claim). SQLite has no row locks: the claim runs in `BEGIN
//!    IMMEDIATE`.
//!
//! A run is kept only if its first locked row *is* the head and stops at the first gap, so an event is
//! never claimed while an earlier one of its aggregate is unpublished, with any number of relays. Whatever
//! the candidates showed about aggregates that could not be claimed (nothing pending, a dead or retrying
//! head) becomes a [`Hint`] the mark writes back, so the next claim does not look at them again.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, QueryResult};

use outbox_core::{ClaimRequest, DeadLetterPolicy, EventId, Headers, OutboxEvent};

use super::hints::Hint;
use crate::sql::Sql;

/// Most candidate pages one claim reads before it settles for what it has (other relays hold the rest).
const MAX_ROUNDS: usize = 8;

/// What a claim took, and what it learned about the aggregates it could not take.
pub(super) struct Claimed {
    pub(super) events: Vec<OutboxEvent>,
    pub(super) hints: Vec<Hint>,
}

/// An aggregate with work, as step 1 found it.
struct Candidate {
    aggregate_type: String,
    aggregate_id: String,
    last_version: i64,
    due_at_ms: i64,
    head: Option<i64>,
}

/// The relay-relevant state of one pending row.
struct RowState {
    seq: i64,
    version: i64,
    dead: bool,
    next_attempt_at_ms: i64,
    lease_until_ms: Option<i64>,
}

impl RowState {
    fn claimable(&self, now_ms: i64) -> bool {
        !self.dead && self.next_attempt_at_ms <= now_ms && self.lease_until_ms.is_none_or(|until| until <= now_ms)
    }
}

const CLAIM_COLUMNS: &str = "seq, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
    schema_version, created_at_ms, attempts, last_error, dead_at_ms, next_attempt_at_ms, lease_until_ms";

fn payload_columns(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "payload::text AS payload, headers::text AS headers",
        DbBackend::MySql => "CAST(payload AS CHAR) AS payload, CAST(headers AS CHAR) AS headers",
        _ => "payload, headers",
    }
}

/// Claims up to `request.limit` events as runs inside `txn`.
pub(super) async fn claim_runs(txn: &DatabaseTransaction, request: &ClaimRequest) -> Result<Claimed, DbErr> {
    let now_ms = request.now.timestamp_millis();
    let limit = request.limit as usize;
    let mut claimed = Claimed { events: Vec::new(), hints: Vec::new() };
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
            let page = candidates(txn, request, after.as_ref(), limit).await?;
            exhausted = page.len() < limit;
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
                None => claimed.hints.push(Hint::clear(&candidate, candidate.last_version)),
                Some(head) => {
                    let take = (candidate.last_version - head + 1).clamp(1, left);
                    left -= take;
                    round.push((candidate, head, head + take - 1));
                }
            }
        }
        if round.is_empty() {
            continue;
        }
        take_runs(txn, request, now_ms, &round, &mut claimed).await?;
    }
    Ok(claimed)
}

impl Hint {
    fn clear(candidate: &Candidate, last_version: i64) -> Hint {
        Hint::clear_if_unchanged(&candidate.aggregate_type, &candidate.aggregate_id, last_version)
    }
}

/// Step 1: due aggregates after `after` (keyset paging), soonest first, with their head versions.
async fn candidates(
    txn: &DatabaseTransaction,
    request: &ClaimRequest,
    after: Option<&(i64, String, String)>,
    limit: usize,
) -> Result<Vec<Candidate>, DbErr> {
    let backend = txn.get_database_backend();
    let mut sql = Sql::new(backend);
    sql.push(
        "SELECT a.aggregate_type, a.aggregate_id, a.last_version, a.due_at_ms, \
         (SELECT MIN(e.aggregate_version) FROM outbox_events e \
         WHERE e.aggregate_type = a.aggregate_type AND e.aggregate_id = a.aggregate_id \
         AND e.published_at_ms IS NULL",
    );
    if request.dead_letters == DeadLetterPolicy::SkipDead {
        sql.push(" AND e.dead_at_ms IS NULL");
    }
    sql.push(") AS head FROM outbox_aggregates a WHERE a.due_at_ms <= ").bind(request.now.timestamp_millis());
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
    sql.push(" ORDER BY a.due_at_ms, a.aggregate_type, a.aggregate_id LIMIT ").bind(limit as i64);
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

/// Steps 2 and 3 for one round of candidates: read and lock the version ranges, keep the valid runs.
async fn take_runs(
    txn: &DatabaseTransaction,
    request: &ClaimRequest,
    now_ms: i64,
    round: &[(Candidate, i64, i64)],
    claimed: &mut Claimed,
) -> Result<(), DbErr> {
    let backend = txn.get_database_backend();
    let ranges = |sql: &mut Sql| {
        sql.push("(");
        sql.join(round, " OR ", |sql, (candidate, from, to)| {
            sql.push("(aggregate_type = ")
                .bind(candidate.aggregate_type.as_str())
                .push(" AND aggregate_id = ")
                .bind(candidate.aggregate_id.as_str())
                .push(" AND aggregate_version BETWEEN ")
                .bind(*from)
                .push(" AND ")
                .bind(*to)
                .push(")");
        });
        sql.push(")");
    };
    let mut read = Sql::new(backend);
    read.push("SELECT ").push(CLAIM_COLUMNS);
    if backend != DbBackend::MySql {
        read.push(", ").push(payload_columns(backend));
    }
    read.push(" FROM outbox_events WHERE published_at_ms IS NULL AND ");
    ranges(&mut read);
    if backend == DbBackend::Postgres {
        read.push(" FOR UPDATE SKIP LOCKED");
    }
    let rows = txn.query_all_raw(read.build()).await?;
    let states = rows.iter().map(row_state).collect::<Result<Vec<_>, _>>()?;

    // What is claimable, per aggregate; on MySQL only now locked, by primary key.
    let mut by_aggregate: HashMap<(String, String), Vec<(RowState, usize)>> = HashMap::new();
    for (i, (state, row)) in states.into_iter().zip(&rows).enumerate() {
        let key: (String, String) = (row.try_get("", "aggregate_type")?, row.try_get("", "aggregate_id")?);
        by_aggregate.entry(key).or_default().push((state, i));
    }
    let mut locked_rows: Option<HashMap<i64, QueryResult>> = None;
    if backend == DbBackend::MySql {
        let seqs: Vec<i64> = round
            .iter()
            .filter_map(|(c, head, _)| {
                by_aggregate.get(&(c.aggregate_type.clone(), c.aggregate_id.clone())).map(|r| (r, *head))
            })
            .flat_map(|(rows, head)| {
                rows.iter().filter(move |(s, _)| s.version >= head && s.claimable(now_ms)).map(|(s, _)| s.seq)
            })
            .collect();
        let mut lock = Sql::new(backend);
        lock.push("SELECT ").push(CLAIM_COLUMNS).push(", ").push(payload_columns(backend));
        // Forcing the primary key makes these point lookups that lock only the claimed rows; through a
        // secondary index MariaDB would take next-key (gap) locks that make every enqueue wait.
        lock.push(" FROM outbox_events FORCE INDEX (PRIMARY) WHERE published_at_ms IS NULL AND dead_at_ms IS NULL AND seq IN (");
        lock.join(&seqs, ", ", |sql, seq| {
            sql.bind(*seq);
        });
        lock.push(") FOR UPDATE SKIP LOCKED");
        let locked = if seqs.is_empty() { Vec::new() } else { txn.query_all_raw(lock.build()).await? };
        let mut map = HashMap::new();
        for row in locked {
            map.insert(row.try_get::<i64>("", "seq")?, row);
        }
        locked_rows = Some(map);
    }

    for (candidate, head, _) in round {
        let key = (candidate.aggregate_type.clone(), candidate.aggregate_id.clone());
        let Some(mut found) = by_aggregate.remove(&key) else {
            continue; // the head is locked by another relay, or was just published
        };
        found.sort_by_key(|(s, _)| s.version);
        let Some((first, _)) = found.first() else { continue };
        if first.version != *head {
            continue; // another relay holds the head
        }
        if !first.claimable(now_ms) {
            if let Some(hint) = Hint::for_unclaimable_head(candidate, first, request, now_ms) {
                claimed.hints.push(hint);
            }
            continue;
        }
        let mut expected = *head;
        for (state, i) in &found {
            let row = match &locked_rows {
                Some(locked) => match locked.get(&state.seq) {
                    Some(row) => row,
                    None => break,
                },
                None => &rows[*i],
            };
            if state.version != expected || !state.claimable(now_ms) {
                break;
            }
            claimed.events.push(decode_row(row)?);
            expected += 1;
        }
    }
    Ok(())
}

impl Hint {
    /// What to write back for an aggregate whose head cannot be claimed now.
    fn for_unclaimable_head(
        candidate: &Candidate,
        head: &RowState,
        request: &ClaimRequest,
        now_ms: i64,
    ) -> Option<Hint> {
        let (t, i) = (candidate.aggregate_type.as_str(), candidate.aggregate_id.as_str());
        if head.dead {
            // Under SkipDead the head query skips dead rows, so a dead head means the aggregate is blocked.
            return (request.dead_letters == DeadLetterPolicy::BlockAggregate).then(|| Hint::blocked(t, i));
        }
        if head.next_attempt_at_ms > now_ms {
            return Some(Hint::at(t, i, head.next_attempt_at_ms));
        }
        head.lease_until_ms.filter(|until| *until > now_ms).map(|until| Hint::at(t, i, until))
    }
}

fn row_state(row: &QueryResult) -> Result<RowState, DbErr> {
    Ok(RowState {
        seq: row.try_get("", "seq")?,
        version: row.try_get("", "aggregate_version")?,
        dead: row.try_get::<Option<i64>>("", "dead_at_ms")?.is_some(),
        next_attempt_at_ms: row.try_get("", "next_attempt_at_ms")?,
        lease_until_ms: row.try_get("", "lease_until_ms")?,
    })
}

fn decode_row(row: &QueryResult) -> Result<OutboxEvent, DbErr> {
    let id: String = row.try_get("", "event_id")?;
    let headers: String = row.try_get("", "headers")?;
    let created_at_ms: i64 = row.try_get("", "created_at_ms")?;
    Ok(OutboxEvent {
        seq: row.try_get("", "seq")?,
        aggregate_version: row.try_get("", "aggregate_version")?,
        id: id.parse::<EventId>().map_err(|e| DbErr::Type(e.to_string()))?,
        aggregate_type: row.try_get("", "aggregate_type")?,
        aggregate_id: row.try_get("", "aggregate_id")?,
        event_type: row.try_get("", "event_type")?,
        schema_version: row.try_get("", "schema_version")?,
        payload: row.try_get("", "payload")?,
        headers: serde_json::from_str::<Headers>(&headers)
            .map_err(|e| DbErr::Type(format!("headers of event {id} are not a string map: {e}")))?,
        created_at: chrono::DateTime::from_timestamp_millis(created_at_ms).unwrap_or_default(),
        attempts: row.try_get("", "attempts")?,
        last_error: row.try_get("", "last_error")?,
    })
}

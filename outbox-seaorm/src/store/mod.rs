//! The store: the runtime's store contract ([`OutboxStore`], [`MaintenanceStore`] and their types) and its
//! implementation on SeaORM, [`SeaOrmStore`], for PostgreSQL, MySQL/MariaDB and SQLite: claim and mark for
//! the relay, backlog figures and cleanup for the service's maintenance tasks (through the same queries as
//! [`maintenance`](mod@crate::maintenance)).
//!
//! A claim takes *runs* (an aggregate's oldest unpublished event and the due events after it) through the
//! `outbox_aggregates` table, so its cost depends on the batch, not on the backlog (`store/claim.rs` has
//! the statements and why an event is never published while an earlier one of its aggregate is
//! unpublished). A mark (`store/mark.rs`) records each outcome with set-based statements and writes back
//! the aggregates' hints (`store/hints.rs`).

mod claim;
mod hints;
pub(crate) mod keyed;
mod mark;

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{CaseStatement, Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, TransactionTrait};
use uuid::Uuid;

use outbox_runtime::{ClaimMode, DeadLetterPolicy, OutboxEvent};

/// The store contract (the runtime's `store` module), beside its implementation on SeaORM.
pub use outbox_runtime::store::{
    BatchOutcome, ClaimRequest, ClaimedBatch, Failure, Heartbeat, MaintenanceStore, MarkReport, OutboxStats,
    OutboxStore, StoreLock,
};

use crate::maintenance::{self, CleanupTable};
use crate::transaction::begin_writer;

pub use claim::ClaimPlan;
use claim::Claimed;
use hints::Hint;

use crate::entity::outbox_event::{Column, Entity};
use crate::error::{Error, Result, store_error};
use crate::sql::Sql;

const TABLE: &str = "outbox_events";
/// `last_error` keeps at most this many bytes of a publisher's message.
const MAX_ERROR_BYTES: usize = 2000;
/// Most failed rows marked by one `UPDATE` (see [`mark`]; fewer than MySQL's limit of [`keyed`]).
const FAILURES_PER_UPDATE: usize = keyed::SEQS_PER_STATEMENT;

/// The outbox store over a SeaORM connection pool.
#[derive(Clone, Debug)]
pub struct SeaOrmStore {
    db: DatabaseConnection,
    /// Whether `outbox_events` is partitioned, read once (see [`crate::partition`]).
    partitioned: std::sync::Arc<tokio::sync::OnceCell<bool>>,
    /// The runs and events of the last claim that took any, which size the next claim's first page of
    /// candidates (see [`claim::first_page`]).
    last_claim: std::sync::Arc<std::sync::Mutex<(usize, usize)>>,
}

impl SeaOrmStore {
    /// A store over `db`; run [`migrate`](crate::migrate) (or add [`migrations`](crate::migrations) to your
    /// `Migrator`) first.
    pub fn new(db: DatabaseConnection) -> Self {
        SeaOrmStore { db, partitioned: Default::default(), last_claim: Default::default() }
    }

    /// Whether `outbox_events` is partitioned, read from the catalog at the first claim. A failed read
    /// counts as "not partitioned" (the claim is then only slower) and is tried again next time.
    async fn partitioned(&self) -> bool {
        if self.db.get_database_backend() != DbBackend::Postgres {
            return false;
        }
        let read = self.partitioned.get_or_try_init(|| async {
            crate::partition::partitioning(&self.db).await.map(|interval| interval.is_some())
        });
        match read.await {
            Ok(partitioned) => *partitioned,
            Err(error) => {
                tracing::debug!(%error, "could not read whether outbox_events is partitioned");
                false
            }
        }
    }

    /// The connection pool.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// A [`NotifyListener`](crate::notify::NotifyListener) on `channel` over this store's pool, which wakes
    /// this process's relays when another process commits outbox rows (with the notify trigger
    /// installed: see [`notify`](crate::notify)). PostgreSQL only.
    #[cfg(feature = "sqlx-postgres")]
    pub fn notify_listener(&self, channel: crate::notify::NotifyChannel) -> Result<crate::notify::NotifyListener> {
        crate::notify::NotifyListener::new(&self.db, channel)
    }

    /// A [`CommitWatch`](crate::watch::CommitWatch) over this store's pool, which wakes this process's
    /// relays within `interval` when another process commits outbox rows, on every backend and at no cost
    /// to the writers: see [`watch`](crate::watch).
    pub fn commit_watch(&self, interval: Duration) -> Result<crate::watch::CommitWatch> {
        crate::watch::CommitWatch::new(&self.db, interval)
    }

    /// The plans the database chooses now for the claim's statements (the due aggregates, then the runs
    /// of the first of them, and on MySQL their lock by primary key), for a relay that claims `limit`
    /// events: to see why a claim is slow, e.g. after an `ANALYZE` taken while nothing was pending. Runs
    /// in a transaction it rolls back; only reads that lock nothing are executed (to find real keys for
    /// the later statements' plans).
    pub async fn claim_plans(&self, limit: u32, dead_letters: DeadLetterPolicy) -> Result<Vec<ClaimPlan>> {
        let txn = self.db.begin().await.map_err(self.err("begin explaining the claim"))?;
        let request = ClaimRequest { now: chrono::Utc::now(), limit, mode: ClaimMode::Transaction, dead_letters };
        let plans =
            claim::explain(&txn, &request, self.partitioned().await).await.map_err(self.err("explain the claim"))?;
        txn.rollback().await.map_err(self.err("end explaining the claim"))?;
        Ok(plans)
    }

    /// The plans the database chooses now for the statements that write or lock outbox rows and aggregates
    /// by key outside the claim (the mark, the release, the lease stamp and fence, the hints, the
    /// cleanup's re-arm and, on MySQL, its delete), each with as many keys as one statement takes: on
    /// MySQL each must read its keys through the primary key (`type=range`), never scan it, since every
    /// row it reads is locked there. Only `EXPLAIN`s run, in a transaction rolled back.
    pub async fn lock_plans(&self) -> Result<Vec<ClaimPlan>> {
        let txn = self.db.begin().await.map_err(self.err("begin explaining the locks"))?;
        let plans = keyed::explain(&txn).await.map_err(self.err("explain the locks"))?;
        txn.rollback().await.map_err(self.err("end explaining the locks"))?;
        Ok(plans)
    }

    fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    fn err(&self, operation: &'static str) -> impl FnOnce(DbErr) -> Error + use<> {
        let backend = self.backend();
        move |e| store_error(operation, TABLE, backend, e)
    }

    async fn begin(&self) -> Result<DatabaseTransaction> {
        begin_writer(&self.db).await.map_err(self.err("begin a claim"))
    }
}

/// The `seq` of each run's head: the first event of each aggregate in a claim (runs are claimed whole,
/// in version order, from the aggregate's oldest unpublished event).
///
/// Lease mode stamps its lease on these rows only. That is enough to keep other relays off the whole run,
/// because a claim takes the rest of a run only behind a head it holds (see [`claim`]), and enough to
/// fence: the mark first locks the heads still carrying its token, and records the outcome of those
/// aggregates only. One write per run instead of one per event.
fn run_heads(events: &[OutboxEvent]) -> Vec<i64> {
    let mut seen = std::collections::HashSet::new();
    events.iter().filter(|e| seen.insert((&e.aggregate_type, &e.aggregate_id))).map(|e| e.seq).collect()
}

/// The claim a relay holds while it publishes.
pub struct SeaOrmBatch {
    events: Vec<OutboxEvent>,
    dead_on_claim: u64,
    /// What the claim learned about aggregates it could not take.
    hints: Vec<Hint>,
    /// `(last_version, due_at_ms)` of each claimed aggregate as the claim read them.
    last_versions: std::collections::HashMap<(String, String), (i64, i64)>,
    dead_letters: DeadLetterPolicy,
    hold: Hold,
    /// On a partitioned outbox, the creation times the batch's rows span: the statements that write them
    /// by `seq` say so, and PostgreSQL looks for them in those partitions only.
    created: Option<(i64, i64)>,
}

enum Hold {
    /// Rows locked by this open transaction of `db`'s.
    Transaction { txn: DatabaseTransaction, db: DatabaseConnection },
    /// Runs leased under this token: the lease is stamped on each run's head only (see [`run_heads`]).
    Lease { db: DatabaseConnection, token: String, heads: Vec<i64> },
    /// Nothing claimed.
    Nothing,
}

impl std::fmt::Debug for SeaOrmBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeaOrmBatch").field("events", &self.events.len()).finish_non_exhaustive()
    }
}

impl OutboxStore for SeaOrmStore {
    type Batch = SeaOrmBatch;

    async fn claim(&self, request: ClaimRequest) -> Result<SeaOrmBatch> {
        let partitioned = self.partitioned().await;
        let (runs, taken) = *self.last_claim.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let first_page = claim::first_page(request.limit, runs, taken);
        let txn = self.begin().await?;
        let Claimed { events, undecodable, hints, last_versions, runs_tried } =
            claim::claim_runs(&txn, &request, partitioned, first_page).await.map_err(self.err("claim a batch"))?;
        if runs_tried > 0 && !events.is_empty() {
            *self.last_claim.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = (runs_tried, events.len());
        }
        let dead_letters = request.dead_letters;
        let dead_on_claim =
            set_aside(&txn, &undecodable, request.now).await.map_err(self.err("mark undecodable rows dead"))?;
        if events.is_empty() {
            if hints.is_empty() {
                txn.rollback().await.map_err(self.err("release an empty claim"))?;
            } else {
                hints::write_hints(&txn, hints, None).await.map_err(self.err("update aggregate hints"))?;
                txn.commit().await.map_err(self.err("commit aggregate hints"))?;
            }
            return Ok(SeaOrmBatch {
                events,
                dead_on_claim,
                hints: Vec::new(),
                last_versions,
                dead_letters,
                hold: Hold::Nothing,
                created: None,
            });
        }
        let created = partitioned.then(|| created_range(&events));
        let hold = match request.mode {
            // A caller that did not go through `Relay::new` (which resolves `Auto`).
            ClaimMode::Transaction | ClaimMode::Auto => Hold::Transaction { txn, db: self.db.clone() },
            ClaimMode::Lease { duration } => {
                let token = Uuid::new_v4().to_string();
                let lease_ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
                let until_ms = request.now.timestamp_millis().saturating_add(lease_ms);
                let heads = run_heads(&events);
                let backend = self.backend();
                for chunk in keyed::chunks(backend, &heads) {
                    let mut lease = Query::update();
                    lease
                        .table(Entity)
                        .value(Column::LeaseToken, token.clone())
                        .value(Column::LeaseUntilMs, until_ms)
                        .and_where(Expr::col(Column::Seq).is_in(chunk.iter().copied()));
                    within(&mut lease, created);
                    txn.execute_raw(keyed::update(backend, &lease)).await.map_err(self.err("lease a batch"))?;
                }
                txn.commit().await.map_err(self.err("commit a lease"))?;
                Hold::Lease { db: self.db.clone(), token, heads }
            }
        };
        tracing::debug!(claimed = events.len(), "outbox batch claimed");
        Ok(SeaOrmBatch { events, dead_on_claim, hints, last_versions, dead_letters, hold, created })
    }

    fn claims_block_writers(&self) -> bool {
        self.backend() == DbBackend::Sqlite
    }
}

impl MaintenanceStore for SeaOrmStore {
    async fn stats(&self, now: DateTime<Utc>) -> Result<OutboxStats> {
        maintenance::totals(&self.db, now.timestamp_millis()).await.map_err(self.err("read stats"))
    }

    async fn record_heartbeat(&self, beat: &Heartbeat) -> Result<()> {
        let backend = self.backend();
        maintenance::record_heartbeat(&self.db, beat)
            .await
            .map_err(|e| store_error("record the relay's heartbeat", "outbox_relays", backend, e))
    }

    async fn cleanup(&self, now: DateTime<Utc>, retention: Duration, batch: u32) -> Result<u64> {
        if batch == 0 {
            return Err(Error::invalid_config("cleanup batch", "is 0; expected at least 1"));
        }
        let deleted = maintenance::clean_outbox(&self.db, now.timestamp_millis(), retention, batch, &mut |_| {})
            .await
            .map_err(self.err("delete published rows"))?;
        let rearmed = rearm(&self.db, now).await.map_err(self.err("re-arm aggregate hints"))?;
        if rearmed > 0 {
            tracing::info!(rearmed, "cleanup found aggregates with due events but no hint, and re-armed them");
        }
        tracing::debug!(deleted, "outbox cleanup done");
        Ok(deleted)
    }

    async fn cleanup_unpublished(&self, now: DateTime<Utc>, age: Duration, batch: u32) -> Result<u64> {
        if batch == 0 {
            return Err(Error::invalid_config("cleanup batch", "is 0; expected at least 1"));
        }
        let cutoff = maintenance::cutoff_ms(now.timestamp_millis(), age);
        let deleted = maintenance::delete_in_batches(&self.db, CleanupTable::OutboxByAge, cutoff, batch, &mut |_| {})
            .await
            .map_err(self.err("delete old rows (CDC mode)"))?;
        tracing::debug!(deleted, "outbox cleanup by age (CDC mode) done");
        Ok(deleted)
    }

    async fn cleanup_inbox(&self, now: DateTime<Utc>, retention: Duration, batch: u32) -> Result<u64> {
        if batch == 0 {
            return Err(Error::invalid_config("cleanup batch", "is 0; expected at least 1"));
        }
        let cutoff = maintenance::cutoff_ms(now.timestamp_millis(), retention);
        let backend = self.backend();
        maintenance::delete_in_batches(&self.db, CleanupTable::Inbox, cutoff, batch, &mut |_| {})
            .await
            .map_err(|e| store_error("delete old inbox rows", "inbox_messages", backend, e))
    }

    async fn try_lock(&self, name: &'static str) -> Result<Option<StoreLock>> {
        crate::lock::try_lock(&self.db, name).await.map_err(self.err("take a database lock"))
    }
}

/// Makes every aggregate with a claimable unpublished row due: the safety net under the hints, for a hint
/// lost to a race (see [`hints`]). Reads the pending rows once; setting a hint early is always safe.
/// Marks the heads the claim could not decode dead, with what is wrong as their `last_error`, inside the
/// claim's transaction (their hints are among the claim's).
async fn set_aside(
    txn: &DatabaseTransaction,
    rows: &[claim::Undecodable],
    now: DateTime<Utc>,
) -> std::result::Result<u64, DbErr> {
    if rows.is_empty() {
        return Ok(0);
    }
    let backend = txn.get_database_backend();
    let mut marked = 0;
    for rows in rows.chunks(keyed::SEQS_PER_STATEMENT) {
        let mut error = CaseStatement::new();
        for row in rows {
            error = error.case(
                Expr::col(Column::Seq).eq(row.seq),
                Expr::val(truncate(&format!("undecodable row: {}", row.error))),
            );
        }
        let mut update = Query::update();
        update
            .table(Entity)
            .value(Column::Attempts, Expr::col(Column::Attempts).add(1))
            .value(Column::LastError, error)
            .value(Column::DeadAtMs, now.timestamp_millis())
            .value(Column::LeaseToken, Option::<String>::None)
            .value(Column::LeaseUntilMs, Option::<i64>::None)
            .and_where(Expr::col(Column::Seq).is_in(rows.iter().map(|r| r.seq)));
        marked += txn.execute_raw(keyed::update(backend, &update)).await?.rows_affected();
    }
    Ok(marked)
}

async fn rearm(db: &DatabaseConnection, now: DateTime<Utc>) -> std::result::Result<u64, DbErr> {
    let backend = db.get_database_backend();
    let now_ms = now.timestamp_millis();
    let unhinted_with_work = format!(
        "due_at_ms IS NULL AND EXISTS (SELECT 1 FROM outbox_events e \
         WHERE e.aggregate_type = outbox_aggregates.aggregate_type AND e.aggregate_id = outbox_aggregates.aggregate_id \
         AND e.published_at_ms IS NULL AND e.dead_at_ms IS NULL AND e.next_attempt_at_ms <= {now_ms})"
    );
    if backend == DbBackend::Sqlite {
        // One writer at a time, no row locks: one statement.
        let sql = format!("UPDATE outbox_aggregates SET due_at_ms = {now_ms} WHERE {unhinted_with_work}");
        return Ok(db.execute_unprepared(&sql).await?.rows_affected());
    }
    // A plain read finds them (it locks nothing; an `UPDATE … WHERE EXISTS` would lock every aggregate and
    // outbox row it reads on MySQL, and wait for writers everywhere); each is then set by key, only if no
    // writer holds it (a writer's enqueue sets the hint itself) and if it is still unset.
    let find = format!("SELECT aggregate_type, aggregate_id FROM outbox_aggregates WHERE {unhinted_with_work}");
    let keys: Vec<(String, String)> = db
        .query_all_raw(sea_orm::Statement::from_string(backend, find))
        .await?
        .iter()
        .map(|row| Ok((row.try_get("", "aggregate_type")?, row.try_get("", "aggregate_id")?)))
        .collect::<std::result::Result<_, DbErr>>()?;
    let mut rearmed = 0;
    for chunk in keys.chunks(hints::HINTS_PER_STATEMENT) {
        let txn = db.begin().await?;
        let free = hints::lock_free_aggregates(&txn, chunk, "due_at_ms IS NULL").await?;
        if !free.is_empty() {
            let mut update = Sql::new(backend);
            keyed::write_rearm(&mut update, &free, now_ms);
            rearmed += txn.execute_raw(update.build()).await?.rows_affected();
        }
        txn.commit().await?;
    }
    Ok(rearmed)
}

/// The first and last creation time of `events` (not empty).
fn created_range(events: &[OutboxEvent]) -> (i64, i64) {
    let times = events.iter().map(|e| e.created_at.timestamp_millis());
    (times.clone().min().unwrap_or(i64::MIN), times.max().unwrap_or(i64::MAX))
}

/// Adds `created_at_ms BETWEEN first AND last` to a statement by `seq` on a partitioned outbox: true of
/// every row it targets, and what lets PostgreSQL skip the other partitions.
fn within<T: sea_orm::sea_query::ConditionalStatement>(statement: &mut T, created: Option<(i64, i64)>) {
    if let Some((first, last)) = created {
        statement.and_where(Expr::col(Column::CreatedAtMs).between(first, last));
    }
}

fn truncate(message: &str) -> String {
    outbox_runtime::text::truncate(message, MAX_ERROR_BYTES + '…'.len_utf8())
}

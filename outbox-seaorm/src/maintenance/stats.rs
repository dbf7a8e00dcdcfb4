//! Backlog figures broken down by aggregate type and event type, for dashboards and `outbox stats`.

use chrono::Utc;
use outbox_runtime::store::OutboxStats;
use std::collections::BTreeMap;

use sea_orm::sea_query::extension::mysql::{IndexHintScope, MySqlSelectStatementExt};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query, SelectStatement};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, QueryResult};
use serde::Serialize;

use crate::entity::outbox_event::{Column, Entity};
use crate::error::{Result, store_error};

/// The unpublished events of one aggregate type or event type.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GroupStats {
    /// The aggregate type or event type.
    pub name: String,
    /// Its figures (serialised inline, beside `name`).
    #[serde(flatten)]
    pub figures: OutboxStats,
}

/// Who publishes the outbox, which decides what "pending" means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatsMode {
    /// A relay publishes and marks rows (the default): unpublished rows are the backlog to alert on.
    #[default]
    Relay,
    /// A log-based reader (Debezium) publishes from the write-ahead log and never marks rows: every row
    /// stays unpublished until cleanup deletes it by age, so there is no backlog to read here (watch the
    /// connector's lag instead). [`Stats`] reports the rows kept and the oldest row's age, which shows
    /// whether the cleanup keeps up.
    Cdc,
}

/// The whole backlog, and the same figures per aggregate type and per event type (each sorted by name).
/// Serialises to JSON as `outbox stats --json` prints it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// How the figures were read.
    pub mode: StatsMode,
    /// CDC mode: rows in `outbox_events` (`None` in relay mode, which does not read published rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// CDC mode: age in whole seconds of the oldest row, 0 when none; it should stay near the cleanup's
    /// retention (`None` in relay mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_row_seconds: Option<u64>,
    /// The figures of the whole outbox (serialised inline): the same ones the relay's stats sampler
    /// reads ([`SeaOrmStore`](crate::SeaOrmStore)'s `MaintenanceStore::stats`), by the same query.
    #[serde(flatten)]
    pub totals: OutboxStats,
    /// Per aggregate type.
    pub by_aggregate_type: Vec<GroupStats>,
    /// Per event type.
    pub by_event_type: Vec<GroupStats>,
}

/// Reads the backlog figures now: one grouped read of the unpublished rows; published rows are not read.
///
/// ```no_run
/// # async fn demo(db: &sea_orm::DatabaseConnection) -> outbox_seaorm::Result<()> {
/// let stats = outbox_seaorm::maintenance::stats(db).await?;
/// println!("{} pending, oldest {} s", stats.totals.pending, stats.totals.oldest_pending_seconds);
/// println!("{}", serde_json::to_string(&stats).unwrap());
/// # Ok(()) }
/// ```
pub async fn stats<C: ConnectionTrait>(db: &C) -> Result<Stats> {
    stats_in(db, StatsMode::Relay).await
}

/// [`stats`] for `mode`: in [`StatsMode::Cdc`] one read of the row count and the oldest row, and no
/// pending or dead figures (nothing is ever marked, so they would only say "everything is late").
pub async fn stats_in<C: ConnectionTrait>(db: &C, mode: StatsMode) -> Result<Stats> {
    if mode == StatsMode::Cdc {
        return cdc_stats(db).await;
    }
    let backend = db.get_database_backend();
    let error = |e| store_error("read stats", "outbox_events", backend, e);
    let now_ms = Utc::now().timestamp_millis();
    // One pass over the unpublished rows, per (aggregate type, event type); each table folds it.
    let pairs = db.query_all(&figures_query(backend, true)).await.map_err(error)?;
    let mut by_aggregate_type = BTreeMap::<String, OutboxStats>::new();
    let mut by_event_type = BTreeMap::<String, OutboxStats>::new();
    let mut stats = Stats::default();
    for row in &pairs {
        let figures = figures(row, now_ms).map_err(error)?;
        let aggregate_type: String = row.try_get("", "aggregate_type").map_err(error)?;
        let event_type: String = row.try_get("", "event_type").map_err(error)?;
        for into in [
            by_aggregate_type.entry(aggregate_type).or_default(),
            by_event_type.entry(event_type).or_default(),
            &mut stats.totals,
        ] {
            add(into, &figures);
        }
    }
    let groups = |map: BTreeMap<String, OutboxStats>| {
        map.into_iter().map(|(name, figures)| GroupStats { name, figures }).collect()
    };
    stats.by_aggregate_type = groups(by_aggregate_type);
    stats.by_event_type = groups(by_event_type);
    Ok(stats)
}

/// Adds the figures of one group to a larger one.
fn add(into: &mut OutboxStats, figures: &OutboxStats) {
    into.pending += figures.pending;
    into.dead += figures.dead;
    into.oldest_pending_seconds = Ord::max(into.oldest_pending_seconds, figures.oldest_pending_seconds);
    into.max_attempts = Ord::max(into.max_attempts, figures.max_attempts);
}

async fn cdc_stats<C: ConnectionTrait>(db: &C) -> Result<Stats> {
    let backend = db.get_database_backend();
    let error = |e| store_error("read stats (CDC mode)", "outbox_events", backend, e);
    let now_ms = Utc::now().timestamp_millis();
    let mut query = Query::select();
    query
        .expr_as(Expr::cust("COUNT(*)"), Alias::new("total"))
        .expr_as(Expr::cust("MIN(created_at_ms)"), Alias::new("oldest"))
        .from(Entity);
    let row = db.query_one(&query).await.map_err(error)?;
    let (rows, oldest) = match row {
        Some(row) => (count(&row, "total").map_err(error)?, row.try_get::<Option<i64>>("", "oldest").map_err(error)?),
        None => (0, None),
    };
    Ok(Stats {
        mode: StatsMode::Cdc,
        rows: Some(rows),
        oldest_row_seconds: Some(oldest.map(|created| Ord::max(now_ms - created, 0) as u64 / 1000).unwrap_or(0)),
        ..Stats::default()
    })
}

/// The figures of the whole outbox: what `MaintenanceStore::stats` reads for the stats sampler.
pub(crate) async fn totals<C: ConnectionTrait>(db: &C, now_ms: i64) -> std::result::Result<OutboxStats, DbErr> {
    match db.query_one(&figures_query(db.get_database_backend(), false)).await? {
        Some(row) => figures(&row, now_ms),
        None => Ok(OutboxStats::default()),
    }
}

/// The one query of the backlog figures: over the unpublished rows, per (aggregate type, event type) or
/// in all.
///
/// MySQL/MariaDB read them through `outbox_events_pending` (`published_at_ms, seq`) by force: for a
/// `GROUP BY` the optimizer preferred walking the whole `outbox_events_version` index in group order, every
/// published row included (9 s with 1M published rows and 110k unpublished ones, against 0.3 s).
fn figures_query(backend: DbBackend, grouped: bool) -> SelectStatement {
    let mut query = Query::select();
    if grouped {
        query
            .columns([Column::AggregateType, Column::EventType])
            .group_by_col(Column::AggregateType)
            .group_by_col(Column::EventType);
    }
    query
        .expr_as(Expr::cust("COUNT(CASE WHEN dead_at_ms IS NULL THEN 1 END)"), Alias::new("pending"))
        .expr_as(Expr::cust("COUNT(CASE WHEN dead_at_ms IS NOT NULL THEN 1 END)"), Alias::new("dead"))
        .expr_as(Expr::cust("MIN(CASE WHEN dead_at_ms IS NULL THEN created_at_ms END)"), Alias::new("oldest"))
        .expr_as(Expr::cust("MAX(attempts)"), Alias::new("max_attempts"))
        .from(Entity)
        .and_where(Expr::col(Column::PublishedAtMs).is_null());
    if backend == DbBackend::MySql {
        query.force_index("outbox_events_pending", IndexHintScope::All);
    }
    query
}

fn figures(row: &QueryResult, now_ms: i64) -> std::result::Result<OutboxStats, DbErr> {
    let oldest: Option<i64> = row.try_get("", "oldest")?;
    Ok(OutboxStats {
        pending: count(row, "pending")?,
        dead: count(row, "dead")?,
        oldest_pending_seconds: oldest
            .map(|created| Ord::max(now_ms.saturating_sub(created), 0) as u64 / 1000)
            .unwrap_or(0),
        max_attempts: int(row, "max_attempts")?,
    })
}

/// A `COUNT` column as `u64` (`None` and negatives as 0).
fn count(row: &QueryResult, name: &str) -> std::result::Result<u64, DbErr> {
    Ok(Ord::max(row.try_get::<Option<i64>>("", name)?.unwrap_or_default(), 0) as u64)
}

/// `MAX` of an `INT` column: `int4` on PostgreSQL, a 64-bit integer elsewhere.
fn int(row: &QueryResult, name: &str) -> std::result::Result<i32, DbErr> {
    match row.try_get::<Option<i32>>("", name) {
        Ok(value) => Ok(value.unwrap_or_default()),
        Err(_) => Ok(row.try_get::<Option<i64>>("", name)?.unwrap_or_default().clamp(0, i64::from(i32::MAX)) as i32),
    }
}

//! What the pages read: every query bounded by an index and a `LIMIT`, or by the unpublished rows only.

use chrono::Utc;
use sea_orm::sea_query::{Alias, Cond, Expr, ExprTrait, Query};
use sea_orm::{ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::admin::{self, DeadEvent, DeadFilter, RelayProcess, Stats};
use outbox_seaorm::Result;
use outbox_seaorm::entity::outbox_aggregate;
use outbox_seaorm::entity::outbox_event::{self, Column, Entity};
use outbox_seaorm::store_error;

/// Most aggregates listed as "most behind".
pub(super) const BEHIND_LIMIT: u64 = 20;
/// Dead rows per page.
pub(super) const DEAD_PAGE: u64 = 50;

/// One aggregate with unpublished events, for the "most behind" table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Behind {
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub pending: u64,
    pub dead: u64,
    /// How long it has been due for the relay, whole seconds.
    pub due_seconds: u64,
    /// Age of its oldest unpublished event, whole seconds.
    pub oldest_seconds: u64,
}

/// The backlog figures, per type and for the aggregates most behind, and how long reading them took.
#[derive(Clone, Debug)]
pub(super) struct Backlog {
    pub stats: Stats,
    pub behind: Vec<Behind>,
    /// The relay processes' heartbeats, or why they could not be read.
    pub relays: std::result::Result<Vec<RelayProcess>, String>,
    pub read_at_ms: i64,
    pub took_ms: u64,
}

pub(super) async fn backlog<C: ConnectionTrait>(db: &C) -> Result<Backlog> {
    let started = std::time::Instant::now();
    let stats = admin::stats(db).await?;
    let behind = if stats.totals.pending + stats.totals.dead == 0 { Vec::new() } else { behind(db).await? };
    let relays = admin::relays(db).await.map_err(|e| e.to_string());
    Ok(Backlog {
        stats,
        behind,
        relays,
        read_at_ms: Utc::now().timestamp_millis(),
        took_ms: started.elapsed().as_millis() as u64,
    })
}

/// The aggregates due for the relay the longest (`outbox_aggregates_due`, soonest first; an aggregate
/// becomes due when its first pending event is written, and a retried or dead head moves it later), then
/// their unpublished rows, [`BEHIND_LIMIT`] keyed probes of `outbox_events_runs`.
async fn behind<C: ConnectionTrait>(db: &C) -> Result<Vec<Behind>> {
    let backend = db.get_database_backend();
    let error = |e| store_error("read the aggregates most behind", "outbox_aggregates", backend, e);
    let now_ms = Utc::now().timestamp_millis();
    let due: Vec<(String, String, i64)> = outbox_aggregate::Entity::find()
        .select_only()
        .column(outbox_aggregate::Column::AggregateType)
        .column(outbox_aggregate::Column::AggregateId)
        .column(outbox_aggregate::Column::DueAtMs)
        .filter(outbox_aggregate::Column::DueAtMs.is_not_null())
        .filter(outbox_aggregate::Column::DueAtMs.lt(i64::MAX))
        .order_by_asc(outbox_aggregate::Column::DueAtMs)
        .limit(BEHIND_LIMIT)
        .into_tuple()
        .all(db)
        .await
        .map_err(error)?;
    if due.is_empty() {
        return Ok(Vec::new());
    }
    let mut keys = Cond::any();
    for (aggregate_type, aggregate_id, _) in &due {
        keys = keys.add(
            Cond::all()
                .add(Column::AggregateType.eq(aggregate_type.as_str()))
                .add(Column::AggregateId.eq(aggregate_id.as_str())),
        );
    }
    let mut query = Query::select();
    query
        .column(Column::AggregateType)
        .column(Column::AggregateId)
        .expr_as(Expr::cust("COUNT(CASE WHEN dead_at_ms IS NULL THEN 1 END)"), Alias::new("pending"))
        .expr_as(Expr::cust("COUNT(CASE WHEN dead_at_ms IS NOT NULL THEN 1 END)"), Alias::new("dead"))
        .expr_as(Expr::cust("MIN(created_at_ms)"), Alias::new("oldest"))
        .from(Entity)
        .and_where(Expr::col(Column::PublishedAtMs).is_null())
        .cond_where(keys)
        .group_by_col(Column::AggregateType)
        .group_by_col(Column::AggregateId);
    let rows = db.query_all(&query).await.map_err(error)?;
    let mut found = std::collections::HashMap::new();
    for row in &rows {
        let key: (String, String) =
            (row.try_get("", "aggregate_type").map_err(error)?, row.try_get("", "aggregate_id").map_err(error)?);
        let oldest: Option<i64> = row.try_get("", "oldest").map_err(error)?;
        found.insert(
            key,
            (admin::count(row, "pending").map_err(error)?, admin::count(row, "dead").map_err(error)?, oldest),
        );
    }
    let age = |ms: i64| Ord::max(now_ms - ms, 0) as u64 / 1000;
    Ok(due
        .into_iter()
        .filter_map(|(aggregate_type, aggregate_id, due_at_ms)| {
            let (pending, dead, oldest) = found.remove(&(aggregate_type.clone(), aggregate_id.clone()))?;
            Some(Behind {
                aggregate_type,
                aggregate_id,
                pending,
                dead,
                due_seconds: age(due_at_ms),
                oldest_seconds: oldest.map(age).unwrap_or_default(),
            })
        })
        .collect())
}

/// Rows published from `from_ms` on, per bucket of `bucket_ms` (bucket start → rows): one grouped range
/// read of the published-time index (`outbox_events_published`; on MySQL/MariaDB `outbox_events_pending`,
/// whose first column it is).
pub(super) async fn published_per_bucket<C: ConnectionTrait>(
    db: &C,
    from_ms: i64,
    bucket_ms: i64,
) -> Result<Vec<(i64, u64)>> {
    let backend = db.get_database_backend();
    // Integer division: `/` of two integers on PostgreSQL and SQLite, `DIV` on MySQL (sea-query's
    // placeholders are `$n` on PostgreSQL, `?` elsewhere).
    let bucket = match backend {
        DbBackend::Postgres => "(published_at_ms - $1) / $2",
        DbBackend::MySql => "(published_at_ms - ?) DIV ?",
        _ => "(published_at_ms - ?) / ?",
    };
    let mut query = Query::select();
    query
        .expr_as(Expr::cust_with_values(bucket, [from_ms, bucket_ms]), Alias::new("bucket"))
        .expr_as(Expr::cust("COUNT(*)"), Alias::new("n"))
        .from(Entity)
        .and_where(Expr::col(Column::PublishedAtMs).gte(from_ms))
        .add_group_by([Expr::cust("1")]);
    let error = |e| store_error("count published rows", "outbox_events", backend, e);
    let rows = db.query_all(&query).await.map_err(error)?;
    rows.iter()
        .map(|row| Ok((from_ms + row.try_get::<i64>("", "bucket")? * bucket_ms, admin::count(row, "n")?)))
        .collect::<std::result::Result<_, sea_orm::DbErr>>()
        .map_err(error)
}

/// Most events the aggregate lookup lists.
pub(super) const AGGREGATE_LIMIT: u64 = 100;

/// One aggregate's latest [`AGGREGATE_LIMIT`] events, newest first, in any state: a backward range of
/// `outbox_events_version` (aggregate type, id, version), which holds every row.
pub(super) async fn aggregate_events<C: ConnectionTrait>(
    db: &C,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Vec<outbox_event::Model>> {
    let backend = db.get_database_backend();
    Entity::find()
        .filter(Column::AggregateType.eq(aggregate_type))
        .filter(Column::AggregateId.eq(aggregate_id))
        .order_by_desc(Column::AggregateVersion)
        .limit(AGGREGATE_LIMIT)
        .all(db)
        .await
        .map_err(|e| store_error("read an aggregate's events", "outbox_events", backend, e))
}

/// One page of the dead events `filter` selects, oldest first, after `after` (a `seq`), and whether
/// another page follows.
pub(super) async fn dead_page<C: ConnectionTrait>(
    db: &C,
    filter: &DeadFilter,
    after: Option<i64>,
) -> Result<(Vec<DeadEvent>, bool)> {
    let backend = db.get_database_backend();
    let mut select = admin::dead_rows(backend, filter)?;
    if let Some(after) = after {
        select = select.filter(Column::Seq.gt(after));
    }
    let mut rows = select
        .order_by_asc(Column::Seq)
        .limit(DEAD_PAGE + 1)
        .all(db)
        .await
        .map_err(|e| store_error("list dead events", "outbox_events", backend, e))?;
    let more = rows.len() as u64 > DEAD_PAGE;
    rows.truncate(DEAD_PAGE as usize);
    Ok((rows.into_iter().map(|model| DeadEvent::of(model, false)).collect(), more))
}

/// One outbox row by event id, in whatever state it is.
pub(super) async fn event<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<outbox_event::Model>> {
    let backend = db.get_database_backend();
    Entity::find()
        .filter(Column::EventId.eq(id))
        .one(db)
        .await
        .map_err(|e| store_error("read an outbox row", "outbox_events", backend, e))
}

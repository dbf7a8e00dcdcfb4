//! What the pages read: every query bounded by an index and a `LIMIT`, or by the pending rows only.

use chrono::Utc;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::admin::{self, DeadEvent, DeadFilter, Stats};
use crate::entity::outbox_event::{self, Column, Entity};
use crate::error::{Result, store_error};

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
    /// Age of its oldest unpublished event, whole seconds.
    pub oldest_seconds: u64,
}

/// The backlog figures, per type and for the aggregates most behind.
pub(super) struct Backlog {
    pub stats: Stats,
    pub behind: Vec<Behind>,
}

pub(super) async fn backlog<C: ConnectionTrait>(db: &C) -> Result<Backlog> {
    let stats = admin::stats(db).await?;
    let behind = if stats.totals.pending + stats.totals.dead == 0 { Vec::new() } else { behind(db).await? };
    Ok(Backlog { stats, behind })
}

/// The aggregates whose oldest unpublished event is oldest: one grouped read of the unpublished rows
/// (the partial `outbox_events_runs` index holds exactly those), cut to [`BEHIND_LIMIT`].
async fn behind<C: ConnectionTrait>(db: &C) -> Result<Vec<Behind>> {
    let backend = db.get_database_backend();
    let error = |e| store_error("read the aggregates most behind", "outbox_events", backend, e);
    let now_ms = Utc::now().timestamp_millis();
    let mut query = Query::select();
    query
        .column(Column::AggregateType)
        .column(Column::AggregateId)
        .expr_as(Expr::cust("COUNT(CASE WHEN dead_at_ms IS NULL THEN 1 END)"), Alias::new("pending"))
        .expr_as(Expr::cust("COUNT(CASE WHEN dead_at_ms IS NOT NULL THEN 1 END)"), Alias::new("dead"))
        .expr_as(Expr::cust("MIN(created_at_ms)"), Alias::new("oldest"))
        .from(Entity)
        .and_where(Expr::col(Column::PublishedAtMs).is_null())
        .group_by_col(Column::AggregateType)
        .group_by_col(Column::AggregateId)
        .order_by_expr(Expr::cust("MIN(created_at_ms)"), sea_orm::Order::Asc)
        .limit(BEHIND_LIMIT);
    let rows = db.query_all(&query).await.map_err(error)?;
    rows.iter()
        .map(|row| {
            let count = |name| row.try_get::<Option<i64>>("", name).map(|n| Ord::max(n.unwrap_or_default(), 0) as u64);
            let oldest: Option<i64> = row.try_get("", "oldest")?;
            Ok(Behind {
                aggregate_type: row.try_get("", "aggregate_type")?,
                aggregate_id: row.try_get("", "aggregate_id")?,
                pending: count("pending")?,
                dead: count("dead")?,
                oldest_seconds: oldest.map(|ms| Ord::max(now_ms - ms, 0) as u64 / 1000).unwrap_or_default(),
            })
        })
        .collect::<std::result::Result<_, DbErr>>()
        .map_err(error)
}

/// Rows published in `(from_ms, to_ms]`: a range of the published-time index.
pub(super) async fn published_between<C: ConnectionTrait>(db: &C, from_ms: i64, to_ms: i64) -> Result<u64> {
    let backend = db.get_database_backend();
    let mut query = Query::select();
    query
        .expr_as(Expr::cust("COUNT(*)"), Alias::new("n"))
        .from(Entity)
        .and_where(Expr::col(Column::PublishedAtMs).gt(from_ms))
        .and_where(Expr::col(Column::PublishedAtMs).lte(to_ms));
    let row =
        db.query_one(&query).await.map_err(|e| store_error("count published rows", "outbox_events", backend, e))?;
    let n = match row {
        Some(row) => row
            .try_get::<Option<i64>>("", "n")
            .map_err(|e| store_error("count published rows", "outbox_events", backend, e))?,
        None => None,
    };
    Ok(Ord::max(n.unwrap_or_default(), 0) as u64)
}

/// One page of the dead events `filter` selects, oldest first, after `after` (a `seq`), and whether
/// another page follows.
pub(super) async fn dead_page<C: ConnectionTrait>(
    db: &C,
    filter: &DeadFilter,
    after: Option<i64>,
) -> Result<(Vec<DeadEvent>, bool)> {
    let backend = db.get_database_backend();
    let mut select = Entity::find().filter(filter.condition(Utc::now()));
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

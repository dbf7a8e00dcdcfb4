//! Dead events: list, show, replay and discard them, all or a selection.
//!
//! A [`DeadFilter`] (the one filter of dead rows and dead letters) selects dead events by event type,
//! aggregate, error text, time of death and id; its criteria combine with AND (a list of event types or ids
//! matches any of them) and become sea-query conditions with bound values, never SQL text built from input.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::extension::mysql::{IndexHintScope, MySqlSelectStatementExt};
use sea_orm::sea_query::{Cond, Expr, ExprTrait, Func, LikeExpr, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use serde::Serialize;

use outbox_seaorm::{DeadFilter, Error, EventId, Result};

use outbox_seaorm::entity::outbox_aggregate;
use outbox_seaorm::entity::outbox_event::{self, Column, Entity};
use outbox_seaorm::store_error;

/// The condition on `outbox_events` of `filter`: dead, unpublished, and every criterion. A consumer
/// criterion is refused: dead outbox rows have none (it selects consumers' dead letters).
pub(crate) fn condition(filter: &DeadFilter, now: DateTime<Utc>) -> Result<Cond> {
    if !filter.consumers().is_empty() {
        return Err(Error::invalid_config(
            "dead filter",
            "selects a consumer, but dead outbox rows have none (the relay gave up on them before any consumer \
             saw them); the consumer criterion selects consumers' dead letters (`outbox dead-letters`)",
        ));
    }
    let now_ms = now.timestamp_millis();
    let mut cond = Cond::all().add(Column::DeadAtMs.is_not_null()).add(Column::PublishedAtMs.is_null());
    if !filter.event_types().is_empty() {
        cond = cond.add(Column::EventType.is_in(filter.event_types().iter().cloned()));
    }
    if let Some(aggregate_type) = filter.selected_aggregate_type() {
        cond = cond.add(Column::AggregateType.eq(aggregate_type));
    }
    if let Some(aggregate_id) = filter.selected_aggregate_id() {
        cond = cond.add(Column::AggregateId.eq(aggregate_id));
    }
    if let Some(text) = filter.error_text() {
        let pattern = format!("%{}%", escape_like(&text.to_ascii_lowercase()));
        cond = cond.add(Expr::expr(Func::lower(Expr::col(Column::LastError))).like(LikeExpr::new(pattern).escape('!')));
    }
    let (older_than, newer_than) = filter.age_bounds();
    if let Some(age) = older_than {
        cond = cond.add(Column::DeadAtMs.lte(super::cutoff_ms(now_ms, age)));
    }
    if let Some(age) = newer_than {
        cond = cond.add(Column::DeadAtMs.gt(super::cutoff_ms(now_ms, age)));
    }
    if !filter.selected_ids().is_empty() {
        cond = cond.add(Column::EventId.is_in(filter.selected_ids().iter().cloned()));
    }
    Ok(cond)
}

/// `text` with the LIKE wildcards and the escape character itself escaped by `!`.
fn escape_like(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '!' | '%' | '_') {
            out.push('!');
        }
        out.push(c);
    }
    out
}

/// One dead event as listed and shown. Times are RFC 3339 text, so printing or serialising it needs no
/// time library.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeadEvent {
    /// The row's sequence number.
    pub seq: i64,
    /// The event id.
    pub id: String,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The event's position in its aggregate.
    pub aggregate_version: i64,
    /// The event type.
    pub event_type: String,
    /// The payload schema version.
    pub schema_version: i32,
    /// Failed attempts.
    pub attempts: i32,
    /// The last publish error.
    pub last_error: Option<String>,
    /// When the event was enqueued.
    pub created_at: String,
    /// When it died.
    pub dead_at: String,
    /// The payload ([`show_dead`] only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// The headers ([`show_dead`] only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<serde_json::Value>,
}

pub(crate) fn rfc3339(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339()).unwrap_or_else(|| ms.to_string())
}

impl DeadEvent {
    pub(crate) fn of(model: outbox_event::Model, with_payload: bool) -> Self {
        DeadEvent {
            seq: model.seq,
            id: model.event_id,
            aggregate_type: model.aggregate_type,
            aggregate_id: model.aggregate_id,
            aggregate_version: model.aggregate_version,
            event_type: model.event_type,
            schema_version: model.schema_version,
            attempts: model.attempts,
            last_error: model.last_error,
            created_at: rfc3339(model.created_at_ms),
            dead_at: rfc3339(model.dead_at_ms.unwrap_or_default()),
            payload: with_payload.then_some(model.payload),
            headers: with_payload.then_some(model.headers),
        }
    }
}

/// The first `limit` dead events `filter` selects, oldest first (by sequence), without payloads.
pub async fn list_dead<C: ConnectionTrait>(db: &C, filter: &DeadFilter, limit: u64) -> Result<Vec<DeadEvent>> {
    let backend = db.get_database_backend();
    let rows = dead_rows(backend, filter)?
        .order_by_asc(Column::Seq)
        .limit(limit)
        .all(db)
        .await
        .map_err(|e| store_error("list dead events", "outbox_events", backend, e))?;
    Ok(rows.into_iter().map(|model| DeadEvent::of(model, false)).collect())
}

/// The dead rows `filter` selects, read through `outbox_events_dead`. MySQL/MariaDB get the index by
/// force: for `ORDER BY seq LIMIT n` the optimizer preferred walking the primary key past every published
/// row (1.2 s with 1M published rows and 10k dead ones, against 10 ms).
pub(crate) fn dead_rows(backend: DbBackend, filter: &DeadFilter) -> Result<sea_orm::Select<Entity>> {
    let mut select = Entity::find().filter(condition(filter, Utc::now())?);
    if backend == DbBackend::MySql {
        QuerySelect::query(&mut select).force_index("outbox_events_dead", IndexHintScope::All);
    }
    Ok(select)
}

/// How many dead events `filter` selects: what a replay or discard of it would change now.
pub async fn count_dead<C: ConnectionTrait>(db: &C, filter: &DeadFilter) -> Result<u64> {
    let backend = db.get_database_backend();
    dead_rows(backend, filter)?
        .count(db)
        .await
        .map_err(|e| store_error("count dead events", "outbox_events", backend, e))
}

/// One dead event with its payload and headers; `None` when no dead event has this id (it may be
/// pending, published, or unknown).
pub async fn show_dead<C: ConnectionTrait>(db: &C, id: EventId) -> Result<Option<DeadEvent>> {
    let backend = db.get_database_backend();
    let row = Entity::find()
        .filter(condition(&DeadFilter::default().id(id), Utc::now())?)
        .one(db)
        .await
        .map_err(|e| store_error("show a dead event", "outbox_events", backend, e))?;
    Ok(row.map(|model| DeadEvent::of(model, true)))
}

/// Makes the dead events `filter` selects due now, with attempts and backoff reset (their `last_error`
/// stays for the record); returns how many. The relays of this process are woken; others find them at
/// their next poll. In order: an aggregate blocked by a replayed event resumes with it.
pub async fn replay_dead(db: &DatabaseConnection, filter: &DeadFilter) -> Result<u64> {
    let now = Utc::now();
    let backend = db.get_database_backend();
    let error = |operation| move |e| store_error(operation, "outbox_events", backend, e);
    let txn = outbox_seaorm::begin(db).await.map_err(error("begin a replay"))?;
    let now_ms = now.timestamp_millis();
    let mut replay = Query::update();
    replay
        .table(Entity)
        .value(Column::DeadAtMs, Option::<i64>::None)
        .value(Column::Attempts, 0)
        .value(Column::NextAttemptAtMs, now_ms)
        .cond_where(condition(filter, now)?);
    let replayed = txn.execute(&replay).await.map_err(error("replay dead rows"))?.rows_affected();
    if replayed > 0 {
        // After the rows, and waiting for any relay that holds an aggregate's row, whatever its hint says:
        // a relay's clear is a compare-and-set on the hint, so changing it here is what stops a clear that
        // was decided before this replay could be seen.
        let replayed_now = Cond::all()
            .add(
                Expr::col((outbox_event::Entity, Column::AggregateType))
                    .equals((outbox_aggregate::Entity, outbox_aggregate::Column::AggregateType)),
            )
            .add(
                Expr::col((outbox_event::Entity, Column::AggregateId))
                    .equals((outbox_aggregate::Entity, outbox_aggregate::Column::AggregateId)),
            )
            .add(Expr::col((outbox_event::Entity, Column::PublishedAtMs)).is_null())
            .add(Expr::col((outbox_event::Entity, Column::DeadAtMs)).is_null())
            .add(Expr::col((outbox_event::Entity, Column::NextAttemptAtMs)).eq(now_ms));
        let mut exists = Query::select();
        exists.expr(Expr::val(1)).from(outbox_event::Entity).cond_where(replayed_now);
        let mut wake = Query::update();
        wake.table(outbox_aggregate::Entity)
            .value(outbox_aggregate::Column::DueAtMs, now_ms)
            .and_where(Expr::exists(exists));
        txn.execute(&wake).await.map_err(error("wake replayed aggregates"))?;
    }
    txn.commit().await.map_err(error("commit a replay"))?;
    if replayed > 0 {
        tracing::info!(replayed, "dead outbox events replayed");
        outbox_seaorm::wake_relays();
    }
    Ok(replayed)
}

/// Deletes the dead events `filter` selects, for good; returns how many. Their aggregates resume with
/// their next event, so consumers see a gap where each discarded event was.
///
/// An empty filter is refused unless it is [`DeadFilter::all`]: discarding every dead event loses data
/// and must be asked for by name.
pub async fn discard_dead(db: &DatabaseConnection, filter: &DeadFilter) -> Result<u64> {
    filter.require_selection("discarding")?;
    let backend = db.get_database_backend();
    let error = |operation| move |e| store_error(operation, "outbox_events", backend, e);
    let now = Utc::now();
    let txn = outbox_seaorm::begin(db).await.map_err(error("begin a discard"))?;
    let rows = Entity::find()
        .select_only()
        .column(Column::AggregateType)
        .column(Column::AggregateId)
        .filter(condition(filter, now)?)
        .into_tuple::<(String, String)>()
        .all(&txn)
        .await
        .map_err(error("find dead events to discard"))?;
    let aggregates: BTreeSet<(String, String)> = rows.into_iter().collect();
    let mut delete = Query::delete();
    delete.from_table(Entity).cond_where(condition(filter, now)?);
    let discarded = txn.execute(&delete).await.map_err(error("discard dead events"))?.rows_affected();
    let aggregates: Vec<(String, String)> = aggregates.into_iter().collect();
    for chunk in aggregates.chunks(200) {
        // Their heads are gone: let the next claim find the events after them (an early hint is safe; the
        // claim clears it when nothing is pending).
        let mut keys = Cond::any();
        for (aggregate_type, aggregate_id) in chunk {
            keys = keys.add(
                Cond::all()
                    .add(outbox_aggregate::Column::AggregateType.eq(aggregate_type.as_str()))
                    .add(outbox_aggregate::Column::AggregateId.eq(aggregate_id.as_str())),
            );
        }
        let mut wake = Query::update();
        wake.table(outbox_aggregate::Entity)
            .value(outbox_aggregate::Column::DueAtMs, now.timestamp_millis())
            .cond_where(keys);
        txn.execute(&wake).await.map_err(error("wake the aggregates of discarded events"))?;
    }
    txn.commit().await.map_err(|e: DbErr| store_error("commit a discard", "outbox_events", backend, e))?;
    if discarded > 0 {
        tracing::warn!(discarded, "dead outbox events discarded");
        outbox_seaorm::wake_relays();
    }
    Ok(discarded)
}

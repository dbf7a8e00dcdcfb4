//! Writing events: `enqueue` joins whatever transaction the caller holds.

use chrono::Utc;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, InsertStatement, Query, SimpleExpr};
use sea_orm::{ConnectionTrait, DbBackend};

use outbox_core::{EventId, NewEvent};

use crate::entity::outbox_event::{Column, Entity};
use crate::error::{Result, store_error};

/// Inserts `event` into the outbox through `conn`.
///
/// Pass the transaction that holds your business change: the event then commits or rolls back with it.
/// Passing a plain connection writes the event on its own, which is only right when there is no business
/// change to go with it.
pub async fn enqueue<C: ConnectionTrait>(conn: &C, event: &NewEvent) -> Result<EventId> {
    enqueue_all(conn, std::slice::from_ref(event)).await?;
    Ok(event.id())
}

/// Most rows per `INSERT`: each row binds 10 values, and every backend caps the values one statement may
/// bind (SQLite 32766, PostgreSQL and MySQL 65535), so a large `events` slice is split.
const ROWS_PER_INSERT: usize = 1000;

/// Inserts `events`, in order, with one multi-row `INSERT` per 1000 events.
///
/// More than 1000 events take several statements, in order; pass a transaction to make them all-or-nothing.
pub async fn enqueue_all<C: ConnectionTrait>(conn: &C, events: &[NewEvent]) -> Result<Vec<EventId>> {
    let backend = conn.get_database_backend();
    let now_ms = Utc::now().timestamp_millis();
    // Build every statement before writing any, so a bad event writes nothing.
    let inserts = events
        .chunks(ROWS_PER_INSERT)
        .map(|chunk| insert_statement(backend, chunk, now_ms))
        .collect::<Result<Vec<_>>>()?;
    for insert in &inserts {
        conn.execute(insert).await.map_err(|e| store_error("enqueue events", "outbox_events", backend, e))?;
    }
    Ok(events.iter().map(NewEvent::id).collect())
}

/// One multi-row `INSERT` of `events` (not empty).
fn insert_statement(backend: DbBackend, events: &[NewEvent], now_ms: i64) -> Result<InsertStatement> {
    let mut insert = Query::insert();
    insert.into_table(Entity).columns([
        Column::EventId,
        Column::AggregateType,
        Column::AggregateId,
        Column::EventType,
        Column::SchemaVersion,
        Column::Payload,
        Column::Headers,
        Column::CreatedAtMs,
        Column::Attempts,
        Column::NextAttemptAtMs,
    ]);
    for event in events {
        let headers = serde_json::to_string(event.headers())
            .map_err(|source| outbox_core::Error::Serialize { event_type: event.event_type().to_owned(), source })?;
        insert
            .values([
                event.id().to_string().into(),
                event.aggregate_type().into(),
                event.aggregate_id().into(),
                event.event_type().into(),
                event.schema_version().into(),
                json_text(backend, event.payload_json().to_owned()),
                json_text(backend, headers),
                now_ms.into(),
                0i32.into(),
                now_ms.into(),
            ])
            .map_err(|e| {
                store_error("build an insert", "outbox_events", backend, sea_orm::DbErr::Custom(e.to_string()))
            })?;
    }
    Ok(insert)
}

/// JSON text bound as a value of the column's JSON type: PostgreSQL needs an explicit `jsonb` cast; MySQL
/// and SQLite take the text as is. The payload is never parsed again.
fn json_text(backend: DbBackend, json: String) -> SimpleExpr {
    match backend {
        DbBackend::Postgres => Expr::val(json).cast_as(Alias::new("jsonb")),
        _ => Expr::val(json),
    }
}

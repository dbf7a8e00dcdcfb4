//! The `outbox_events` table: one row per event, written in the business transaction.

use sea_orm::entity::prelude::*;

/// One outbox row.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "outbox_events")]
pub struct Model {
    /// Unique row number, assigned by the database.
    #[sea_orm(primary_key)]
    pub seq: i64,
    /// The event id (UUID text); brokers' dedup id and consumers' inbox key.
    #[sea_orm(unique)]
    pub event_id: String,
    /// The aggregate type, e.g. `order`.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The event's gapless position in its aggregate (1, 2, 3, … in commit order), handed out by
    /// [`outbox_aggregate`](super::outbox_aggregate) in the enqueuing transaction.
    pub aggregate_version: i64,
    /// The stable event name, e.g. `order.placed`.
    pub event_type: String,
    /// The payload schema version.
    pub schema_version: i32,
    /// The payload snapshot.
    #[sea_orm(column_type = "JsonBinary")]
    pub payload: Json,
    /// String headers (trace context, user metadata).
    #[sea_orm(column_type = "JsonBinary")]
    pub headers: Json,
    /// Enqueue time, epoch ms.
    pub created_at_ms: i64,
    /// Failed publish attempts.
    pub attempts: i32,
    /// Not published before this time, epoch ms.
    pub next_attempt_at_ms: i64,
    /// The last publish error.
    #[sea_orm(column_type = "Text", nullable)]
    pub last_error: Option<String>,
    /// When the broker confirmed it, epoch ms; `NULL` while pending.
    pub published_at_ms: Option<i64>,
    /// When it reached `max_attempts`, epoch ms; `NULL` unless dead.
    pub dead_at_ms: Option<i64>,
    /// The lease holder's token (lease mode).
    pub lease_token: Option<String>,
    /// The lease expiry, epoch ms (lease mode).
    pub lease_until_ms: Option<i64>,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

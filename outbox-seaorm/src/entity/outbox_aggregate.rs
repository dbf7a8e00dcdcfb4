//! The `outbox_aggregates` table: one row per aggregate that ever had an event.
//!
//! The enqueuing transaction upserts its aggregates' rows: that hands out the next gapless
//! `aggregate_version` and, because the row stays locked until commit, makes concurrent writers of one
//! aggregate commit in version order. The relay reads `due_at_ms` to find aggregates with work without
//! walking the pending events, and keeps it up to date as a hint (never waiting on a writer's lock).

use sea_orm::entity::prelude::*;

/// One aggregate.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "outbox_aggregates")]
pub struct Model {
    /// The aggregate type, e.g. `order`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub aggregate_type: String,
    /// The aggregate id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub aggregate_id: String,
    /// The version of the aggregate's latest event.
    pub last_version: i64,
    /// When the relay should next look at this aggregate, epoch ms: `NULL` when nothing is pending, the
    /// head's retry time during a backoff, `i64::MAX` while a dead head blocks it.
    pub due_at_ms: Option<i64>,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

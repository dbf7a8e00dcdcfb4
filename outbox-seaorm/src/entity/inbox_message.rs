//! The `inbox_messages` table: one row per message a consumer has processed.

use sea_orm::entity::prelude::*;

/// One processed message.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "inbox_messages")]
pub struct Model {
    /// The consumer's name, e.g. `billing`.
    #[sea_orm(primary_key, auto_increment = false)]
    pub consumer: String,
    /// The message (event) id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub message_id: String,
    /// When the effect committed, epoch ms.
    pub processed_at_ms: i64,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

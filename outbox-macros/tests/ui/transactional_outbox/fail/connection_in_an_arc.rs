//! A connection parameter in an `Arc` cannot be widened: the error names the two forms that work.
use std::sync::Arc;

use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseConnection, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

#[transactional_outbox]
pub async fn place(db: Arc<DatabaseConnection>, id: String) -> Result<(), DbErr> {
    emit!(OrderPlaced { order_id: id });
    Ok(())
}

fn main() {}

use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseConnection, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

#[idempotent_handler]
pub async fn bill(db: &DatabaseConnection, event: OrderPlaced) -> Result<(), DbErr> {
    let _ = (db, event);
    Ok(())
}

fn main() {}

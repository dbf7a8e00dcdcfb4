use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

#[idempotent_handler]
pub async fn bill(txn: &DatabaseTransaction, event: OrderPlaced, envelope: String) -> Result<(), DbErr> {
    let _ = (txn, event, envelope);
    Ok(())
}

fn main() {}

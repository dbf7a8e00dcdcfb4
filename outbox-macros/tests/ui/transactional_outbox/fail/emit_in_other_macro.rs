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
pub async fn place(db: &DatabaseConnection) -> Result<(), DbErr> {
    let _ = vec![emit!(OrderPlaced { order_id: "o1".into() })];
    Ok(())
}

fn main() {}

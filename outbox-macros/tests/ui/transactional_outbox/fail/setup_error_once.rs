use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseConnection, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

/// Not async, and it emits: one error, not one more per `emit!`.
#[transactional_outbox]
pub fn place(db: &DatabaseConnection) -> Result<(), DbErr> {
    emit!(OrderPlaced { order_id: "o1".into() });
    emit!(OrderPlaced { order_id: "o2".into() });
    Ok(())
}

fn main() {}

use outbox_seaorm::prelude::*;
use sea_orm::DbErr;
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

pub struct OrderService;

#[transactional_outbox]
impl OrderService {
    pub async fn place(&self, id: String) -> Result<(), DbErr> {
        emit!(OrderPlaced { order_id: id });
        Ok(())
    }
}

fn main() {}

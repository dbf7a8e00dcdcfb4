use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseConnection, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

pub struct Orders {
    pub db: DatabaseConnection,
}

#[transactional_outbox(connection = self.db)]
impl Orders {
    pub async fn place(&self) -> Result<(), DbErr> {
        emit!(OrderPlaced { order_id: "o1".into() });
        Ok(())
    }
}

fn main() {}

//! A `#[read_only]` method has no transaction of its own, so it cannot emit.
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

#[transactional_outbox(conn = self.db)]
impl Orders {
    #[read_only]
    pub async fn touch(&self, id: String) -> Result<(), DbErr> {
        emit!(OrderPlaced { order_id: id });
        Ok(())
    }
}

fn main() {}

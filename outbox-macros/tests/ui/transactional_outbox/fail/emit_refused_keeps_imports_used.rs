//! A refused `emit!` is the only diagnostic: the imports of the event and of `emit` stay used (no "unused import" warning).
use outbox_seaorm::{emit, transactional_outbox};
use sea_orm::{DatabaseConnection, DbErr};

mod events {
    use outbox_seaorm::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(DomainEvent, Serialize, Deserialize)]
    #[domain_event(name = "order.placed", version = 1, aggregate = "order")]
    pub struct OrderPlaced {
        #[aggregate_id]
        pub order_id: String,
    }
}

use events::OrderPlaced;

#[transactional_outbox]
pub async fn place(db: &DatabaseConnection, ids: Vec<String>) -> Result<(), DbErr> {
    ids.into_iter().for_each(|id| emit!(OrderPlaced { order_id: id }));
    Ok(())
}

fn main() {}

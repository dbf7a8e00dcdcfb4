use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

#[idempotent_handler]
pub async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
    let _ = (txn, event);
    Ok(())
}

fn main() {}

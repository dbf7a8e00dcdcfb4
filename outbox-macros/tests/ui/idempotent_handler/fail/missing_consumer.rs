// A typo in the arguments is the only error: the handler is still generated, so its callers compile.
use outbox_seaorm::prelude::*;
use outbox_seaorm::OutboxEvent;
use sea_orm::{DatabaseConnection, DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

#[idempotent_handler(consumr = "billing")]
pub async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
    let _ = (txn, event);
    Ok(())
}

async fn consume(db: &DatabaseConnection, message: &OutboxEvent) -> bool {
    matches!(bill(db, message).await, Ok(InboxOutcome::Processed(())))
}

fn main() {
    let _ = consume;
}

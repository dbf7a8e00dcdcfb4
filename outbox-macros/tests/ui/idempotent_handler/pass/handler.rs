use outbox_seaorm::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
    pub total_minor: i64,
}

#[idempotent_handler(consumer = "billing")]
pub async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<i64, DbErr> {
    txn.execute_unprepared("SELECT 1").await?;
    Ok(event.total_minor)
}

async fn consume(db: &DatabaseConnection, message: &outbox_seaorm::OutboxEvent) {
    match bill(db, message).await {
        Ok(InboxOutcome::Processed(total)) => println!("billed {total}"),
        Ok(InboxOutcome::Duplicate) => println!("duplicate"),
        Err(error) => println!("{error}"),
    }
}

fn main() {
    let _ = consume;
}

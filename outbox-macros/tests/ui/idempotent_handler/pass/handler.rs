//! A handler is registered as it is written: `.on(bill)` for one event at a time, `.on_batch(bill_all)` for
//! several; called by hand, `outbox_seaorm::deliver` hands it one message.
use outbox_seaorm::prelude::*;
use outbox_seaorm::{OutboxEvent, Received, SeaOrmGroupCommit};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
    pub total_minor: i64,
}

#[idempotent_handler]
pub async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<i64, DbErr> {
    txn.execute_unprepared("SELECT 1").await?;
    Ok(event.total_minor)
}

#[idempotent_handler]
pub async fn audit(txn: &DatabaseTransaction, event: OrderPlaced, envelope: &OutboxEvent) -> Result<String, DbErr> {
    let _ = (txn, event);
    Ok(envelope.id.to_string())
}

#[idempotent_handler]
pub async fn bill_all(txn: &DatabaseTransaction, events: Vec<OrderPlaced>) -> Result<(), DbErr> {
    let _ = (txn, events.len());
    Ok(())
}

#[idempotent_handler]
pub async fn audit_all(txn: &DatabaseTransaction, received: Vec<Received<OrderPlaced>>) -> Result<(), DbErr> {
    let _ = (txn, received.iter().map(|r| r.envelope.id).count());
    Ok(())
}

fn consumers(db: &DatabaseConnection) -> [Consumer; 2] {
    let billing = Consumer::new("billing").with_group_commit(SeaOrmGroupCommit::new(db.clone())).on(bill).on(audit);
    let batched = Consumer::new("batched").with_group_commit(SeaOrmGroupCommit::new(db.clone())).on_batch(bill_all);
    [billing, batched.on_batch(audit_all)]
}

async fn by_hand(db: &DatabaseConnection, message: &OutboxEvent) {
    match outbox_seaorm::deliver(db, "billing", message, bill).await {
        Ok(InboxOutcome::Processed(total)) => println!("billed {total}"),
        Ok(InboxOutcome::Duplicate) => println!("duplicate"),
        Err(error) => println!("{error}"),
    }
}

fn main() {
    let _ = (consumers, by_hand);
}

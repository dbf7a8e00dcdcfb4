// A batch handler reads envelopes through `Vec<Received<E>>`, not a third parameter.
use outbox_seaorm::prelude::*;
use outbox_seaorm::OutboxEvent;
use sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

#[idempotent_handler]
pub async fn bill_all(txn: &DatabaseTransaction, events: Vec<OrderPlaced>, envelope: &OutboxEvent) -> Result<(), DbErr> {
    let _ = (txn, events, envelope);
    Ok(())
}

fn main() {
    let _ = Consumer::new("billing").on_batch(bill_all);
}

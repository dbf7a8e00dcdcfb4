// The consumer is named by `Consumer::new`; naming it again on the handler is the only error: the handler
// is still generated, so its registration compiles.
use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

#[idempotent_handler(consumer = "billing")]
pub async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
    let _ = (txn, event);
    Ok(())
}

fn main() {
    let _ = Consumer::new("billing").on(bill);
}

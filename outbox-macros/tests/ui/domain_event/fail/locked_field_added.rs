// `order.locked v1` is in events.lock (next to this file) with `order_id` and `total_minor` only.
use outbox_seaorm::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.locked", version = 1, aggregate = "order")]
pub struct OrderLocked {
    #[aggregate_id]
    pub order_id: String,
    pub total_minor: i64,
    pub currency: String,
}

fn main() {}

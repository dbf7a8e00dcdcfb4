// `order.shipped v1` is in events.lock (next to this file) with `to.street` only: `Address` gained `zip`.
use outbox_seaorm::{DomainEvent, PayloadSchema};
use serde::{Deserialize, Serialize};

#[derive(PayloadSchema, Serialize, Deserialize)]
pub struct Address {
    pub street: String,
    pub zip: String,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.shipped", version = 1, aggregate = "order")]
pub struct OrderShipped {
    #[aggregate_id]
    pub order_id: String,
    pub to: Option<Address>,
}

fn main() {}

use outbox_seaorm::{DomainEvent, PayloadSchema};
use serde::{Deserialize, Serialize};

#[derive(PayloadSchema, Serialize, Deserialize)]
pub struct OrderPlacedV1 {
    pub order_id: String,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 2, aggregate = "order", upcast_from(v1 = OrderPlacedV1))]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

fn main() {}

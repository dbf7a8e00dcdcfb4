// `order.renamed v1` is in events.lock (next to this file) with `order_id` and `total`; the struct that
// decodes stored v1 payloads renamed `total`, so every stored v1 event would fail to decode.
use outbox_seaorm::{DomainEvent, PayloadSchema};
use serde::{Deserialize, Serialize};

#[derive(PayloadSchema, Serialize, Deserialize)]
pub struct OrderRenamedV1 {
    pub order_id: String,
    pub total_major: i64,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.renamed", version = 2, aggregate = "order", upcast_from(v1 = OrderRenamedV1))]
pub struct OrderRenamed {
    #[aggregate_id]
    pub order_id: String,
    pub total_minor: i64,
}

impl From<OrderRenamedV1> for OrderRenamed {
    fn from(v1: OrderRenamedV1) -> Self {
        OrderRenamed { order_id: v1.order_id, total_minor: v1.total_major * 100 }
    }
}

fn main() {}

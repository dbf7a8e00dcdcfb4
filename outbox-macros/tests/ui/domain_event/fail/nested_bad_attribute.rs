// `order.shipped v1` is in events.lock (next to this file) with `to.street`. A typo in `Address`'s
// attribute is the only error: the event's lock check adds none about the fields `Address` could not
// describe.
use outbox_seaorm::{DomainEvent, PayloadSchema};
use serde::{Deserialize, Serialize};

#[derive(PayloadSchema, Serialize, Deserialize)]
pub struct Address {
    #[payload_schema(by_nam)]
    pub street: String,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.shipped", version = 1, aggregate = "order")]
pub struct OrderShipped {
    #[aggregate_id]
    pub order_id: String,
    pub to: Option<Address>,
}

fn main() {}

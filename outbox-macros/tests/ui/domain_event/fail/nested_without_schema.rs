// A type inside an event must describe its fields for events.lock (or be locked by name).
use outbox_seaorm::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Address {
    pub street: String,
}

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.moved", version = 1, aggregate = "order")]
pub struct OrderMoved {
    #[aggregate_id]
    pub order_id: String,
    pub to: Vec<Address>,
}

fn main() {}

use outbox_seaorm::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.changed", version = 1, aggregate = "order")]
pub enum OrderChanged {
    Placed { order_id: String },
}

fn main() {}

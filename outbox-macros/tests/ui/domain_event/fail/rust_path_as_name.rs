use outbox_seaorm::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "crate::events::OrderPlaced", version = 0, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
    #[aggregate_id]
    pub customer: String,
}

fn main() {}

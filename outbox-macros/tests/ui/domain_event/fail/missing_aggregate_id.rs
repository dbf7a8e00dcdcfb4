use outbox_seaorm::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    pub order_id: String,
}

fn name<E: DomainEvent>() -> &'static str {
    E::NAME
}

fn main() {
    let _ = name::<OrderPlaced>();
}

use outbox_seaorm::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

pub async fn place() {
    emit!(OrderPlaced { order_id: "o1".into() });
}

fn main() {}

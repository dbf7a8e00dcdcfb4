use outbox_seaorm::prelude::*;

/// Forgot `Serialize, Deserialize`: one error, on the type, saying what to add.
#[derive(DomainEvent)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

fn main() {}

//! `emit!` outside an annotated method: one error, and the event's import stays used.
use outbox_seaorm::prelude::*;

mod events {
    use outbox_seaorm::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(DomainEvent, Serialize, Deserialize)]
    #[domain_event(name = "order.placed", version = 1, aggregate = "order")]
    pub struct OrderPlaced {
        #[aggregate_id]
        pub order_id: String,
    }
}

use events::OrderPlaced;

pub async fn place(id: String) {
    emit!(OrderPlaced { order_id: id });
}

fn main() {}

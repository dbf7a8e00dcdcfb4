//! The attributes written on a handler stay with it: docs and lint levels on the handler callers see (so
//! `missing_docs` and `warnings` are satisfied), `cfg` on the whole of it, and an attribute macro such as
//! `#[tracing::instrument]` on the function with the user's own parameters (`skip(txn)` names one).
#![deny(missing_docs, warnings)]

use outbox_seaorm::prelude::*;
use outbox_seaorm::OutboxEvent;
use sea_orm::{DatabaseConnection, DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

/// An order was placed.
#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    /// The order.
    #[aggregate_id]
    pub order_id: String,
}

/// Bills an order once.
#[idempotent_handler]
#[allow(unused_variables)]
#[tracing::instrument(skip(txn, event), fields(order_id = %event.order_id))]
pub async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
    Ok(())
}

/// Never compiled: the `cfg` removes the handler and the body that does not compile.
#[idempotent_handler]
#[cfg(any())]
pub async fn ship(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
    does_not_exist(txn, event)
}

/// Kept: its `cfg` holds.
#[idempotent_handler]
#[cfg(all())]
pub async fn audit(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
    let _ = (txn, event);
    Ok(())
}

async fn consume(db: &DatabaseConnection, message: &OutboxEvent) -> (bool, bool) {
    let billed = outbox_seaorm::deliver(db, "billing", message, bill).await.is_ok();
    (billed, outbox_seaorm::deliver(db, "audit", message, audit).await.is_ok())
}

fn main() {
    let _ = consume;
}

//! An app that depends on outbox-seaorm under another name, `ob = { package = "outbox-seaorm", ... }`.
//!
//! `outbox_seaorm` is no name in this crate, so it compiles only if `#[derive(DomainEvent)]`,
//! `#[derive(PayloadSchema)]`, `#[idempotent_handler]` and `#[transactional_outbox]` find the dependency by
//! its package name (through the manifest) and name it `ob` in the code they generate.

use ob::{DomainEvent, PayloadSchema, idempotent_handler, transactional_outbox};
use sea_orm::{DatabaseConnection, DatabaseTransaction, DbErr};
use serde::{Deserialize, Serialize};

/// Where an order goes.
#[derive(PayloadSchema, Serialize, Deserialize)]
pub struct Address {
    /// The street.
    pub street: String,
}

/// An order left the warehouse.
#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.shipped", version = 1, aggregate = "order")]
pub struct OrderShipped {
    /// The order.
    #[aggregate_id]
    pub order_id: String,
    /// Where it goes.
    pub to: Address,
}

/// Ships an order: the event commits with the transaction.
#[transactional_outbox]
pub async fn ship(db: &DatabaseConnection, order_id: &str) -> Result<(), DbErr> {
    ob::emit!(OrderShipped { order_id: order_id.to_owned(), to: Address { street: "Main St".to_owned() } });
    Ok(())
}

/// Notifies the customer once per shipment.
#[idempotent_handler]
pub async fn notify(txn: &DatabaseTransaction, event: OrderShipped) -> Result<usize, DbErr> {
    let _ = txn;
    Ok(event.to.street.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_macros_follow_the_renamed_dependency() {
        assert_eq!(OrderShipped::NAME, "order.shipped");
        let lines = OrderShipped::SCHEMA.lock_lines();
        assert_eq!(lines.last(), Some(&("to.street".to_owned(), "String".to_owned())));
        // A consumer registers it as written: `Consumer::new("notifications").on(notify)`.
        let _ = ob::Consumer::new("notifications").on(notify);
    }
}

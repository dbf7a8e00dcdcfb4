use outbox_seaorm::prelude::*;
use sea_orm::{ActiveModelTrait, ActiveValue::Set, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait};
use serde::{Deserialize, Serialize};

use crate::entity::{invoice, order}; // the app's SeaORM entities

/// An order was placed: everything billing needs, so billing never reads `orders`.
#[derive(DomainEvent, Clone, Debug, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
    pub customer: String,
    pub total_minor: i64,
}

/// The body of `POST /orders`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlaceOrder {
    pub id: String,
    pub customer: String,
    pub total_minor: i64,
}

/// The orders service, holding its pool (it lives in the app's axum state).
#[derive(Clone, Debug)]
pub struct OrderService {
    pub db: DatabaseConnection,
}

#[transactional_outbox(conn = self.db)]
impl OrderService {
    /// Places an order: the row and its `OrderPlaced` event commit together, or not at all.
    pub async fn place(&self, cmd: PlaceOrder) -> Result<order::Model, DbErr> {
        let PlaceOrder { id, customer, total_minor } = cmd;
        let order = order::ActiveModel { id: Set(id), customer: Set(customer), total_minor: Set(total_minor) };
        let order = order.insert(&self.db).await?; // `self.db` is the method's transaction here
        emit!(OrderPlaced { order_id: order.id.clone(), customer: order.customer.clone(), total_minor });
        Ok(order) // Ok commits the order and its event; Err, a panic or cancellation rolls both back
    }

    /// Places a batch, all or nothing: each `place` joins this call's transaction, so one failed order
    /// takes back every order and event of the batch.
    pub async fn place_all(&self, cmds: Vec<PlaceOrder>) -> Result<Vec<order::Model>, DbErr> {
        let mut placed = Vec::with_capacity(cmds.len());
        for cmd in cmds {
            placed.push(self.place(cmd).await?);
        }
        Ok(placed)
    }

    /// Reads only, so no transaction of its own (inside another call, it reads in that one's).
    #[read_only]
    pub async fn get(&self, id: String) -> Result<Option<order::Model>, DbErr> {
        order::Entity::find_by_id(id).one(&self.db).await
    }
}

/// Billing: one invoice per `OrderPlaced`, however often the broker delivers it.
#[idempotent_handler]
pub async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
    // The effect, in one transaction with the inbox row that marks the event as handled.
    // (A third parameter, `envelope: &OutboxEvent`, gives the event's id, time and headers.)
    let OrderPlaced { order_id, total_minor, .. } = event;
    let invoice = invoice::ActiveModel { order_id: Set(order_id), total_minor: Set(total_minor), ..Default::default() };
    invoice.insert(txn).await?;
    Ok(())
}

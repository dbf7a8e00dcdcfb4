use std::sync::Arc;

use outbox_seaorm::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error(transparent)]
    Db(#[from] DbErr),
    #[error("rejected")]
    Rejected,
}

pub struct OrderService;

#[transactional_outbox]
impl OrderService {
    pub async fn place(&self, db: &DatabaseConnection, id: &str) -> Result<String, OrderError> {
        db.execute_unprepared("SELECT 1").await?;
        emit!(OrderPlaced { order_id: id.to_owned() });
        if id.is_empty() {
            return Err(OrderError::Rejected);
        }
        Ok(id.to_owned())
    }

    /// Nested services: on a transaction the method runs in a savepoint.
    pub async fn place_in(&self, txn: &DatabaseTransaction, id: &str) -> Result<(), OrderError> {
        emit!(OrderPlaced { order_id: id.to_owned() });
        Ok(())
    }

    /// Generic over any connection that can begin a transaction.
    pub async fn place_generic<C>(&self, conn: &C, id: String) -> Result<(), OrderError>
    where
        C: ConnectionTrait + TransactionTrait,
    {
        emit!(OrderPlaced { order_id: id });
        Ok(())
    }

    /// Methods without a connection are left alone.
    pub fn name(&self) -> &'static str {
        "orders"
    }

    /// Reads only: no transaction of its own; `db` names the pool, or the caller's transaction.
    #[read_only]
    pub async fn count(&self, db: &DatabaseConnection) -> Result<bool, DbErr> {
        Ok(db.is_transaction())
    }
}

/// The README's service shape, with a read-only method.
pub struct Orders {
    pub db: DatabaseConnection,
}

#[transactional_outbox(conn = self.db)]
impl Orders {
    pub async fn place(&self, id: String) -> Result<(), OrderError> {
        self.db.execute_unprepared("SELECT 1").await?;
        OrderService.place_in(&self.db, &id).await?;
        emit!(OrderPlaced { order_id: id });
        Ok(())
    }

    #[read_only]
    pub async fn ping(&self) -> Result<(), DbErr> {
        self.db.execute_unprepared("SELECT 1").await?;
        Ok(())
    }
}

/// A connection held in an `Arc` parameter, named with `conn = …`.
#[transactional_outbox(conn = db)]
pub async fn place_shared(db: Arc<DatabaseConnection>, id: String) -> Result<(), DbErr> {
    db.execute_unprepared("SELECT 1").await?;
    emit!(OrderPlaced { order_id: id });
    Ok(())
}

#[transactional_outbox]
pub async fn place_alone(db: &DatabaseConnection) -> Result<(), OrderError> {
    let service = OrderService;
    service.place_in(db, "nested").await?;
    emit!(OrderPlaced { order_id: "outer".into() });
    Ok(())
}

fn main() {}

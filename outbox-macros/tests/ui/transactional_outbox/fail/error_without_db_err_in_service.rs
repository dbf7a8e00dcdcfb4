//! A service whose error type cannot absorb `DbErr`: one error, at the error type, even though beginning,
//! `emit!` and committing all need the conversion.
use outbox_seaorm::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

#[derive(Debug)]
pub enum OrderError {
    Rejected,
}

pub struct Orders {
    pub db: DatabaseConnection,
}

#[transactional_outbox(conn = self.db)]
impl Orders {
    pub async fn place(&self, id: String) -> Result<(), OrderError> {
        let _ = self.db.get_database_backend();
        emit!(OrderPlaced { order_id: id });
        emit!(OrderPlaced { order_id: "again".into() }, headers = [("tenant", "t1")]);
        if false {
            return Err(OrderError::Rejected);
        }
        Ok(())
    }
}

fn main() {}

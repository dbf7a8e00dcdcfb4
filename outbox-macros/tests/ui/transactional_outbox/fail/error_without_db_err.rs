use outbox_seaorm::prelude::*;
use sea_orm::DatabaseConnection;

#[derive(Debug)]
pub enum OrderError {
    Rejected,
}

#[transactional_outbox]
pub async fn place(db: &DatabaseConnection) -> Result<(), OrderError> {
    Err(OrderError::Rejected)
}

fn main() {}

use outbox_seaorm::prelude::*;
use sea_orm::DatabaseConnection;

#[transactional_outbox]
pub async fn place(db: &DatabaseConnection) {}

fn main() {}

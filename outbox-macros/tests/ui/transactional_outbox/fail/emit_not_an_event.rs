use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseConnection, DbErr};

pub struct NotAnEvent {
    pub order_id: String,
}

#[transactional_outbox]
pub async fn place(db: &DatabaseConnection) -> Result<(), DbErr> {
    emit!(NotAnEvent { order_id: "o1".into() });
    Ok(())
}

fn main() {}

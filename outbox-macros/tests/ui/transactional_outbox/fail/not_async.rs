use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseConnection, DbErr};

#[transactional_outbox]
pub fn place(db: &DatabaseConnection) -> Result<(), DbErr> {
    Ok(())
}

fn main() {}

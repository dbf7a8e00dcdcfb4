// A typo in the attribute is the only error, also where the event is used: the derive still implements
// `DomainEvent` (with bodies that never run), so `emit!` and an `E: DomainEvent` bound accept the type.
use outbox_seaorm::prelude::*;
use sea_orm::{DatabaseConnection, DbErr};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", vesion = 2, aggregate = "order")]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: String,
}

fn aggregate<E: DomainEvent>(event: &E) -> String {
    event.aggregate_id()
}

#[transactional_outbox]
pub async fn place(db: &DatabaseConnection, id: &str) -> Result<(), DbErr> {
    emit!(OrderPlaced { order_id: id.to_owned() });
    Ok(())
}

async fn run(db: &DatabaseConnection) -> Result<(), DbErr> {
    place(db, "1").await
}

fn main() {
    let _ = aggregate(&OrderPlaced { order_id: "1".to_owned() });
    let _ = run;
}

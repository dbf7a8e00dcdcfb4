//! The lab's toy application: an `orders` table on the producer side, an `invoices` table and a billing
//! consumer on the other, on whichever database the lab opened.

use outbox_seaorm::{EventId, InboxOutcome, NewEvent, OutboxEvent};
use sea_orm::sea_query::{Alias, ColumnDef, InsertStatement, Query, Table};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, Statement, TransactionTrait};
use serde::{Deserialize, Serialize};

/// Any error the lab meets.
pub type BoxError = outbox_seaorm::BoxError;
/// The lab's result type.
pub type Result<T, E = BoxError> = std::result::Result<T, E>;

/// The name billing records in the inbox.
pub const BILLING: &str = "billing";

/// An order, and the payload of its `OrderPlaced` event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// The primary key.
    pub order_id: String,
    /// Who ordered.
    pub customer: String,
    /// The total in minor units (cents).
    pub total_minor: i32,
}

impl Order {
    /// An order.
    pub fn new(order_id: impl Into<String>, customer: impl Into<String>, total_minor: i32) -> Self {
        Order { order_id: order_id.into(), customer: customer.into(), total_minor }
    }

    /// Its `OrderPlaced` event.
    pub fn placed(&self) -> Result<NewEvent> {
        Ok(NewEvent::new("order", &self.order_id, "OrderPlaced", self)?)
    }

    /// `INSERT INTO orders …` for this order.
    pub fn insert(&self) -> Result<InsertStatement> {
        let mut insert = Query::insert();
        insert
            .into_table(Alias::new("orders"))
            .columns([Alias::new("id"), Alias::new("customer"), Alias::new("total_minor")])
            .values([self.order_id.clone().into(), self.customer.clone().into(), self.total_minor.into()])?;
        Ok(insert)
    }
}

/// Creates `orders` and `invoices` if they are missing. `invoices.order_id` has no unique constraint on
/// purpose: the inbox is what keeps an order from being billed twice.
pub async fn create_tables(db: &DatabaseConnection) -> Result<()> {
    let orders = Table::create()
        .table(Alias::new("orders"))
        .if_not_exists()
        .col(ColumnDef::new(Alias::new("id")).string_len(64).not_null().primary_key())
        .col(ColumnDef::new(Alias::new("customer")).string_len(64).not_null())
        .col(ColumnDef::new(Alias::new("total_minor")).integer().not_null())
        .to_owned();
    let invoices = Table::create()
        .table(Alias::new("invoices"))
        .if_not_exists()
        .col(ColumnDef::new(Alias::new("id")).big_integer().not_null().auto_increment().primary_key())
        .col(ColumnDef::new(Alias::new("order_id")).string_len(64).not_null())
        .col(ColumnDef::new(Alias::new("total_minor")).integer().not_null())
        .to_owned();
    db.execute(&orders).await?;
    db.execute(&invoices).await?;
    Ok(())
}

/// Empties the lab's tables and the outbox and inbox, so every scenario starts from nothing.
pub async fn reset(db: &DatabaseConnection) -> Result<()> {
    for table in ["orders", "invoices", "outbox_events", "inbox_messages"] {
        db.execute_unprepared(&format!("DELETE FROM {table}")).await?;
    }
    Ok(())
}

/// `SELECT COUNT(*) FROM {from_where}`, e.g. `count(db, "orders WHERE customer = 'sara'")`.
pub async fn count<C: ConnectionTrait>(db: &C, from_where: &str) -> Result<i64> {
    let sql = format!("SELECT COUNT(*) AS n FROM {from_where}");
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .ok_or("COUNT(*) returned no row")?;
    Ok(row.try_get::<i64>("", "n")?)
}

/// Runs `work` in a transaction: COMMIT when it succeeds, ROLLBACK when it fails (as the seed's
/// `withTransaction`; a process that really dies gets the same ROLLBACK from the database).
pub async fn with_transaction<T>(
    db: &DatabaseConnection,
    work: impl AsyncFnOnce(&DatabaseTransaction) -> Result<T>,
) -> Result<T> {
    let txn = db.begin().await?;
    match work(&txn).await {
        Ok(value) => {
            txn.commit().await?;
            Ok(value)
        }
        Err(error) => {
            txn.rollback().await?;
            Err(error)
        }
    }
}

/// The outbox way: the order and its `OrderPlaced` event commit together, or not at all.
pub async fn place_order(db: &DatabaseConnection, order: &Order) -> Result<EventId> {
    with_transaction(db, async |txn| {
        txn.execute(&order.insert()?).await?;
        Ok(outbox_seaorm::enqueue(txn, &order.placed()?).await?)
    })
    .await
}

/// The billing consumer: one invoice per `OrderPlaced` message, at most once per event id. The invoice
/// and the inbox row commit in one transaction.
pub async fn bill(db: &DatabaseConnection, message: &OutboxEvent) -> Result<InboxOutcome<()>> {
    let order: Order = message.decode()?;
    let mut invoice = Query::insert();
    invoice
        .into_table(Alias::new("invoices"))
        .columns([Alias::new("order_id"), Alias::new("total_minor")])
        .values([order.order_id.into(), order.total_minor.into()])?;
    let outcome =
        outbox_seaorm::handle_once(db, BILLING, &message.id.to_string(), async |txn: &DatabaseTransaction| {
            txn.execute(&invoice).await.map(drop)
        })
        .await?;
    Ok(outcome)
}

/// How many invoices there are, their total, and how many distinct orders they bill.
pub async fn invoices(db: &DatabaseConnection) -> Result<(usize, i64, usize)> {
    let sql = "SELECT order_id, total_minor FROM invoices";
    let rows = db.query_all_raw(Statement::from_string(db.get_database_backend(), sql)).await?;
    let mut total = 0i64;
    let mut orders = std::collections::BTreeSet::new();
    for row in &rows {
        total += i64::from(row.try_get::<i32>("", "total_minor")?);
        orders.insert(row.try_get::<String>("", "order_id")?);
    }
    Ok((rows.len(), total, orders.len()))
}

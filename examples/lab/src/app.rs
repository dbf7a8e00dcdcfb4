//! The lab's toy application: an `orders` table on the producer side, an `invoices` table and a billing
//! consumer on the other, on whichever database the lab opened.

use outbox_seaorm::prelude::*;
use sea_orm::sea_query::{Alias, ColumnDef, InsertStatement, Query, Table};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, Statement};
use serde::{Deserialize, Serialize};

/// Any error the lab meets.
pub type BoxError = outbox_seaorm::BoxError;
/// The lab's result type.
pub type Result<T, E = BoxError> = std::result::Result<T, E>;

/// An order (a row of `orders`).
#[derive(Clone, Debug, PartialEq, Eq)]
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

    /// Its `order.placed` event.
    pub fn placed(&self) -> OrderPlaced {
        OrderPlaced { order_id: self.order_id.clone(), customer: self.customer.clone(), total_minor: self.total_minor }
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

/// An order was placed: the snapshot billing needs.
#[derive(DomainEvent, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    /// The order.
    #[aggregate_id]
    pub order_id: String,
    /// Who ordered.
    pub customer: String,
    /// The total in minor units (cents).
    pub total_minor: i32,
}

/// An order was paid.
#[derive(DomainEvent, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[domain_event(name = "order.paid", version = 1, aggregate = "order")]
pub struct OrderPaid {
    /// The order.
    #[aggregate_id]
    pub order_id: String,
}

/// An order was shipped.
#[derive(DomainEvent, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[domain_event(name = "order.shipped", version = 1, aggregate = "order")]
pub struct OrderShipped {
    /// The order.
    #[aggregate_id]
    pub order_id: String,
}

/// An order changed (scenario ⑥'s steady stream).
#[derive(DomainEvent, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[domain_event(name = "order.updated", version = 1, aggregate = "order")]
pub struct OrderUpdated {
    /// The order.
    #[aggregate_id]
    pub order_id: String,
    /// Which update this is, from 1.
    pub step: u32,
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

/// The outbox way: the order and its `order.placed` event commit together, or not at all.
#[transactional_outbox]
pub async fn place_order(db: &DatabaseConnection, order: &Order) -> Result<()> {
    db.execute(&order.insert()?).await?;
    emit!(order.placed());
    Ok(())
}

/// As [`place_order`], but the process dies before COMMIT.
#[transactional_outbox]
pub async fn place_order_then_crash(db: &DatabaseConnection, order: &Order) -> Result<()> {
    db.execute(&order.insert()?).await?;
    emit!(order.placed());
    super::crash()
}

/// Places an order that is paid and shipped at once: three events of one aggregate, in this order.
#[transactional_outbox]
pub async fn place_pay_ship(db: &DatabaseConnection, order: &Order) -> Result<()> {
    db.execute(&order.insert()?).await?;
    emit!(order.placed());
    emit!(OrderPaid { order_id: order.order_id.clone() });
    emit!(OrderShipped { order_id: order.order_id.clone() });
    Ok(())
}

/// Update number `step` of orders `c01` … `c{orders}`, in one transaction.
#[transactional_outbox]
pub async fn update_orders(db: &DatabaseConnection, orders: usize, step: u32) -> Result<()> {
    for o in 1..=orders {
        emit!(OrderUpdated { order_id: format!("c{o:02}"), step });
    }
    Ok(())
}

/// The billing consumer: one invoice per `order.placed` message, at most once per event id. The invoice
/// and the inbox row commit in one transaction.
#[idempotent_handler]
pub async fn bill(txn: &DatabaseTransaction, event: OrderPlaced) -> Result<(), DbErr> {
    let mut invoice = Query::insert();
    invoice
        .into_table(Alias::new("invoices"))
        .columns([Alias::new("order_id"), Alias::new("total_minor")])
        .values([event.order_id.into(), event.total_minor.into()])
        .map_err(|e| DbErr::Custom(e.to_string()))?;
    txn.execute(&invoice).await.map(drop)
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

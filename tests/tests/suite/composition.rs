//! `#[transactional_outbox]` services in the shapes real apps have: a method written with
//! `db: &DatabaseConnection` joins a caller's transaction (savepoint) and composes with other annotated
//! methods; a service holding its pool in `self` (plain or in an `Arc`) names it with `conn = self.db`;
//! `emit!` carries headers; every emitted event commits or rolls back with the outermost transaction.

use crate::common;

use std::sync::Arc;

use common::{count_outbox, count_table, create_shop_tables, outbox_rows};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, TransactionTrait};
use serde::{Deserialize, Serialize};

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "shop.ordered", version = 1, aggregate = "order")]
struct Ordered {
    #[aggregate_id]
    order_id: String,
    line: u32,
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error(transparent)]
    Db(#[from] DbErr),
    #[error("order {0} rejected")]
    Rejected(String),
}

/// A module with a macro of the same name as ours, as a metrics crate might have.
mod metrics {
    macro_rules! emit {
        ($value:expr) => {
            $value
        };
    }
    pub(crate) use emit;
}

fn insert_order_sql(id: &str) -> String {
    format!("INSERT INTO orders (id, customer, total_minor) VALUES ('{id}', 'c', 1)")
}

/// A service without state: its methods take the connection as `db: &DatabaseConnection`, the way the
/// README writes them, and call each other with it.
struct Shop;

#[transactional_outbox]
impl Shop {
    /// Saves an order and emits `lines` events; a zero-line order is rejected after emitting.
    async fn order(&self, db: &DatabaseConnection, id: &str, lines: u32) -> Result<(), ShopError> {
        db.execute_unprepared(&insert_order_sql(id)).await?;
        for line in 0..lines.max(1) {
            emit!(Ordered { order_id: id.to_owned(), line });
        }
        if lines == 0 {
            return Err(ShopError::Rejected(id.to_owned()));
        }
        Ok(())
    }

    /// Two orders through the method above, in this method's transaction; fails at the end on request.
    async fn two_orders(&self, db: &DatabaseConnection, fail_at_end: bool) -> Result<(), ShopError> {
        self.order(db, "a", 1).await?;
        self.order(db, "b", 2).await?;
        if fail_at_end {
            return Err(ShopError::Rejected("both".into()));
        }
        Ok(())
    }

    /// A rejected inner order (its savepoint rolls back) followed by a good one.
    async fn retry(&self, db: &DatabaseConnection) -> Result<(), ShopError> {
        assert!(self.order(db, "bad", 0).await.is_err());
        self.order(db, "good", 1).await
    }

    /// Another crate's `emit!` is not this crate's: it is left alone.
    async fn counted(&self, db: &DatabaseConnection) -> Result<u32, ShopError> {
        Ok(metrics::emit!(41 + 1))
    }

    /// An event with headers.
    async fn tagged(&self, db: &DatabaseConnection, id: &str, tenant: &str) -> Result<(), ShopError> {
        emit!(Ordered { order_id: id.to_owned(), line: 0 }, headers = [("tenant", tenant), ("source", "test")]);
        Ok(())
    }
}

async fn orders_and_lines(t: &TestDb) -> Vec<(String, u32)> {
    outbox_rows(t)
        .await
        .into_iter()
        .map(|row| {
            let line = row.payload["line"].as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(u32::MAX);
            (row.aggregate_id, line)
        })
        .collect()
}

async fn a_pool_method_composes_with_another_in_one_transaction(t: TestDb) {
    create_shop_tables(&t).await;
    Shop.two_orders(&t.db, false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let expected = [("a".to_owned(), 0), ("b".to_owned(), 0), ("b".to_owned(), 1)];
    assert_eq!(orders_and_lines(&t).await, expected, "{t}: in emit order");

    assert!(Shop.two_orders(&t.db, true).await.is_err(), "{t}");
    assert_eq!(count_outbox(&t).await, 3, "{t}: the failed outer call took its inner events back");
    assert_eq!(count_table(&t, "orders").await, 2, "{t}: and its inner orders");
}
per_backend!(a_pool_method_composes_with_another_in_one_transaction, "cmp_nested");

async fn a_failed_inner_call_rolls_back_only_its_savepoint(t: TestDb) {
    create_shop_tables(&t).await;
    Shop.retry(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(orders_and_lines(&t).await, [("good".to_owned(), 0)], "{t}");
    assert_eq!(count_table(&t, "orders").await, 1, "{t}: the bad order was rolled back with its event");
}
per_backend!(a_failed_inner_call_rolls_back_only_its_savepoint, "cmp_inner");

async fn a_pool_method_joins_the_callers_transaction(t: TestDb) {
    create_shop_tables(&t).await;
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    Shop.order(&txn, "rolled", 1).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.rollback().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(count_outbox(&t).await, 0, "{t}: the caller rolled back, the event with it");
    assert_eq!(count_table(&t, "orders").await, 0, "{t}");

    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    Shop.order(&txn, "kept", 2).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(orders_and_lines(&t).await, [("kept".to_owned(), 0), ("kept".to_owned(), 1)], "{t}");
}
per_backend!(a_pool_method_joins_the_callers_transaction, "cmp_caller");

async fn emit_carries_headers(t: TestDb) {
    Shop.tagged(&t.db, "o1", "acme").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let rows = outbox_rows(&t).await;
    assert_eq!(rows.len(), 1, "{t}");
    assert_eq!(rows[0].headers["tenant"], "acme", "{t}: {}", rows[0].headers);
    assert_eq!(rows[0].headers["source"], "test", "{t}");
}
per_backend!(emit_carries_headers, "cmp_headers");

async fn only_this_crates_emit_is_rewritten(t: TestDb) {
    assert_eq!(Shop.counted(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}")), 42, "{t}");
    assert_eq!(count_outbox(&t).await, 0, "{t}");
}
per_backend!(only_this_crates_emit_is_rewritten, "cmp_other_emit");

/// The usual axum shape: a service that holds its pool.
struct Orders {
    db: DatabaseConnection,
}

#[transactional_outbox(conn = self.db)]
impl Orders {
    /// Saves an order through `self.db` (the transaction, inside this method) and emits its event; a
    /// rejection after both must take both back.
    async fn place(&self, id: &str, reject: bool) -> Result<(), ShopError> {
        self.db.execute_unprepared(&insert_order_sql(id)).await?;
        emit!(Ordered { order_id: id.to_owned(), line: 0 });
        if reject {
            return Err(ShopError::Rejected(id.to_owned()));
        }
        Ok(())
    }

    /// Not async: left alone.
    fn name(&self) -> &'static str {
        "orders"
    }
}

async fn a_service_holding_its_pool_names_it_with_conn(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = Orders { db: t.db.clone() };
    assert_eq!(orders.name(), "orders");
    assert!(orders.place("no", true).await.is_err(), "{t}");
    assert_eq!((count_outbox(&t).await, count_table(&t, "orders").await), (0, 0), "{t}: both rolled back");
    orders.place("yes", false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((count_outbox(&t).await, count_table(&t, "orders").await), (1, 1), "{t}");
}
per_backend!(a_service_holding_its_pool_names_it_with_conn, "cmp_self");

/// A service sharing its pool through an `Arc`; the body reaches it as `&*self.db` and `self.db.as_ref()`.
struct SharedOrders {
    db: Arc<DatabaseConnection>,
}

#[transactional_outbox(conn = self.db)]
impl SharedOrders {
    async fn place(&self, id: &str, reject: bool) -> Result<(), ShopError> {
        (*self.db).execute_unprepared(&insert_order_sql(id)).await?;
        let backend = self.db.as_ref().get_database_backend();
        emit!(Ordered { order_id: id.to_owned(), line: 0 }, headers = [("backend", format!("{backend:?}"))]);
        if reject {
            return Err(ShopError::Rejected(id.to_owned()));
        }
        Ok(())
    }
}

async fn a_service_sharing_its_pool_in_an_arc_names_it_with_conn(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = SharedOrders { db: Arc::new(t.db.clone()) };
    assert!(orders.place("no", true).await.is_err(), "{t}");
    assert_eq!((count_outbox(&t).await, count_table(&t, "orders").await), (0, 0), "{t}: both rolled back");
    orders.place("yes", false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((count_outbox(&t).await, count_table(&t, "orders").await), (1, 1), "{t}");
}
per_backend!(a_service_sharing_its_pool_in_an_arc_names_it_with_conn, "cmp_arc");

/// A free function whose connection is a field of an argument, as with axum's `State(app)`.
#[derive(Clone)]
struct AppState {
    db: DatabaseConnection,
}

#[transactional_outbox(conn = app.db)]
async fn place_from_state(app: AppState, id: String) -> Result<(), ShopError> {
    app.db.execute_unprepared(&insert_order_sql(&id)).await?;
    emit!(Ordered { order_id: id, line: 0 });
    Ok(())
}

async fn a_handler_names_the_connection_in_its_state(t: TestDb) {
    create_shop_tables(&t).await;
    place_from_state(AppState { db: t.db.clone() }, "s1".into()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((count_outbox(&t).await, count_table(&t, "orders").await), (1, 1), "{t}");
}
per_backend!(a_handler_names_the_connection_in_its_state, "cmp_state");

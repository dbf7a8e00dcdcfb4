//! Services in the README's shape (`struct Orders { db }` with `#[transactional_outbox(conn = self.db)]`)
//! compose: a method that calls other annotated methods (of its own service or another one on the same
//! pool), or runs inside a caller's `outbox_seaorm::transaction`, is one business transaction. Its rows and
//! events commit together or not at all; a failed inner call takes back only its own savepoint; a spawned
//! task and another database are never joined. Every test counts rows and events.

use crate::common;

use common::{count_outbox, count_table, create_shop_tables, outbox_rows};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

/// One step of an order's life; `step` tells the events of one order apart.
#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "compose.step", version = 1, aggregate = "order")]
struct Step {
    #[aggregate_id]
    order_id: String,
    step: String,
}

fn step(order_id: &str, step: &str) -> Step {
    Step { order_id: order_id.to_owned(), step: step.to_owned() }
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error(transparent)]
    Db(#[from] DbErr),
    #[error("{0} rejected")]
    Rejected(String),
}

fn rejected(what: &str) -> ShopError {
    ShopError::Rejected(what.to_owned())
}

/// The orders service, holding its pool as the README's does.
#[derive(Clone)]
struct Orders {
    db: DatabaseConnection,
    billing: Billing,
}

#[transactional_outbox(conn = self.db)]
impl Orders {
    /// Saves an order and emits `placed`; `reject` fails after both.
    async fn place(&self, id: &str, reject: bool) -> Result<(), ShopError> {
        let sql = format!("INSERT INTO orders (id, customer, total_minor) VALUES ('{id}', 'c', 1)");
        self.db.execute_unprepared(&sql).await?;
        emit!(step(id, "placed"));
        if reject {
            return Err(rejected(id));
        }
        Ok(())
    }

    /// Two orders through `place`, then fails on request.
    async fn place_two(&self, fail: bool) -> Result<(), ShopError> {
        self.place("a", false).await?;
        self.place("b", false).await?;
        if fail {
            return Err(rejected("both"));
        }
        Ok(())
    }

    /// An event of its own before and after an inner call.
    async fn bracketed(&self, id: &str) -> Result<(), ShopError> {
        emit!(step(id, "opened"));
        self.place(id, false).await?;
        emit!(step(id, "closed"));
        Ok(())
    }

    /// A rejected order (its error handled here), then a good one: this call commits.
    async fn place_after_a_rejection(&self) -> Result<(), ShopError> {
        let first = self.place("bad", true).await;
        assert!(matches!(first, Err(ShopError::Rejected(_))), "the inner call failed: {first:?}");
        self.place("good", false).await
    }

    /// `n` orders in one call.
    async fn place_many(&self, n: usize, fail: bool) -> Result<(), ShopError> {
        for i in 0..n {
            self.place(&format!("m{i:03}"), false).await?;
        }
        if fail {
            return Err(rejected("many"));
        }
        Ok(())
    }

    /// An order and its invoice, through the billing service.
    async fn place_and_bill(&self, id: &str, fail: bool) -> Result<(), ShopError> {
        self.place(id, false).await?;
        self.billing.invoice(id).await?;
        if fail {
            return Err(rejected(id));
        }
        Ok(())
    }

    /// Two orders placed concurrently in one task: they take turns on the one transaction.
    async fn place_concurrently(&self, fail: bool) -> Result<(), ShopError> {
        let (a, b) = tokio::join!(self.place("x", false), self.place("y", false));
        a?;
        b?;
        if fail {
            return Err(rejected("concurrent"));
        }
        Ok(())
    }

    /// Places `id` in a spawned task (which does not inherit this call's transaction) and `id`-here in
    /// this call, then fails.
    async fn spawn_then_fail(
        &self,
        id: &str,
        spawned: &mut Vec<JoinHandle<Result<(), ShopError>>>,
    ) -> Result<(), ShopError> {
        let orders = self.clone();
        let id_there = id.to_owned();
        spawned.push(tokio::spawn(async move { orders.place(&id_there, false).await }));
        self.place(&format!("{id}-here"), false).await?;
        Err(rejected(id))
    }

    /// Reads only: no transaction of its own.
    #[read_only]
    async fn runs_in_a_transaction(&self) -> bool {
        self.db.is_transaction()
    }

    /// Reads only, and sees the enclosing call's uncommitted order.
    #[read_only]
    async fn order_count(&self) -> Result<i64, DbErr> {
        let backend = self.db.get_database_backend();
        let statement = sea_orm::Statement::from_string(backend, "SELECT COUNT(*) AS n FROM orders");
        let row = self.db.query_one_raw(statement).await?.ok_or_else(|| DbErr::Custom("no row".into()))?;
        row.try_get::<i64>("", "n")
    }

    /// An order, and what a read-only method sees of it before the commit.
    async fn place_and_look(&self, id: &str) -> Result<(bool, i64), ShopError> {
        self.place(id, false).await?;
        Ok((self.runs_in_a_transaction().await, self.order_count().await?))
    }
}

/// A second service on the same pool (a clone of the same `DatabaseConnection`), or on another database.
#[derive(Clone)]
struct Billing {
    db: DatabaseConnection,
}

#[transactional_outbox(conn = self.db)]
impl Billing {
    async fn invoice(&self, order_id: &str) -> Result<(), ShopError> {
        let sql = format!("INSERT INTO invoices (order_id, total_minor) VALUES ('{order_id}', 1)");
        self.db.execute_unprepared(&sql).await?;
        emit!(step(order_id, "invoiced"));
        Ok(())
    }

    /// Calls back into the orders service: an invoice, then a replacement order, then fails on request.
    async fn invoice_and_reorder(&self, orders: &Orders, id: &str, fail: bool) -> Result<(), ShopError> {
        self.invoice(id).await?;
        orders.place(&format!("{id}-again"), false).await?;
        if fail {
            return Err(rejected(id));
        }
        Ok(())
    }
}

fn services(t: &TestDb) -> Orders {
    Orders { db: t.db.clone(), billing: Billing { db: t.db.clone() } }
}

/// `(order id, step)` of every outbox row, in the order the relay publishes them.
async fn steps(t: &TestDb) -> Vec<(String, String)> {
    outbox_rows(t)
        .await
        .into_iter()
        .map(|row| (row.aggregate_id, row.payload["step"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

/// (orders, invoices, outbox rows)
async fn counts(t: &TestDb) -> (i64, i64, u64) {
    (count_table(t, "orders").await, count_table(t, "invoices").await, count_outbox(t).await)
}

async fn an_outer_error_after_two_inner_calls_takes_everything_back(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = services(&t);
    assert!(orders.place_two(true).await.is_err(), "{t}");
    assert_eq!(counts(&t).await, (0, 0, 0), "{t}: the failed outer call took back both inner orders and events");

    orders.place_two(false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(counts(&t).await, (2, 0, 2), "{t}");
    assert_eq!(steps(&t).await, pairs(&[("a", "placed"), ("b", "placed")]), "{t}: in emit order");
}
per_backend!(an_outer_error_after_two_inner_calls_takes_everything_back, "svc_outer_err");

async fn events_of_inner_calls_keep_emit_order(t: TestDb) {
    create_shop_tables(&t).await;
    services(&t).bracketed("o1").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let expected = pairs(&[("o1", "opened"), ("o1", "placed"), ("o1", "closed")]);
    assert_eq!(steps(&t).await, expected, "{t}: the inner call's event sits between the outer's two");
}
per_backend!(events_of_inner_calls_keep_emit_order, "svc_order");

async fn a_callers_transaction_takes_the_calls_with_it(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = services(&t);
    let rolled_back = outbox_seaorm::transaction(&t.db, async |txn| {
        txn.execute_unprepared("INSERT INTO invoices (order_id, total_minor) VALUES ('caller', 1)").await?;
        orders.place("c1", false).await?;
        orders.place_two(false).await?;
        Err::<(), _>(rejected("caller"))
    })
    .await;
    assert!(matches!(rolled_back, Err(ShopError::Rejected(_))), "{t}: {rolled_back:?}");
    assert_eq!(counts(&t).await, (0, 0, 0), "{t}: the caller rolled back its row, the calls' rows and their events");

    outbox_seaorm::transaction(&t.db, async |txn| {
        txn.execute_unprepared("INSERT INTO invoices (order_id, total_minor) VALUES ('caller', 1)").await?;
        orders.place("c1", false).await?;
        orders.place_two(false).await
    })
    .await
    .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(counts(&t).await, (3, 1, 3), "{t}: committed together");
}
per_backend!(a_callers_transaction_takes_the_calls_with_it, "svc_caller");

async fn a_failed_inner_call_handled_by_the_outer_rolls_back_only_its_savepoint(t: TestDb) {
    create_shop_tables(&t).await;
    services(&t).place_after_a_rejection().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(counts(&t).await, (1, 0, 1), "{t}");
    assert_eq!(steps(&t).await, pairs(&[("good", "placed")]), "{t}: the rejected order's event is gone with it");
}
per_backend!(a_failed_inner_call_handled_by_the_outer_rolls_back_only_its_savepoint, "svc_inner_err");

async fn a_hundred_inner_calls_are_one_transaction(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = services(&t);
    assert!(orders.place_many(100, true).await.is_err(), "{t}");
    assert_eq!(counts(&t).await, (0, 0, 0), "{t}: all 100 rolled back");
    orders.place_many(100, false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(counts(&t).await, (100, 0, 100), "{t}");
    let ids: Vec<String> = steps(&t).await.into_iter().map(|(id, _)| id).collect();
    let expected: Vec<String> = (0..100).map(|i| format!("m{i:03}")).collect();
    assert_eq!(ids, expected, "{t}: in emit order");
}
per_backend!(a_hundred_inner_calls_are_one_transaction, "svc_hundred");

async fn two_services_on_one_pool_calling_each_other_are_one_transaction(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = services(&t);
    assert!(orders.place_and_bill("o1", true).await.is_err(), "{t}");
    assert!(orders.billing.invoice_and_reorder(&orders, "o2", true).await.is_err(), "{t}");
    assert_eq!(counts(&t).await, (0, 0, 0), "{t}: neither service's rows nor events survived the failure");

    orders.place_and_bill("o1", false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    orders.billing.invoice_and_reorder(&orders, "o2", false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(counts(&t).await, (2, 2, 4), "{t}");
}
per_backend!(two_services_on_one_pool_calling_each_other_are_one_transaction, "svc_two");

async fn concurrent_inner_calls_in_one_task_take_turns(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = services(&t);
    assert!(orders.place_concurrently(true).await.is_err(), "{t}");
    assert_eq!(counts(&t).await, (0, 0, 0), "{t}");
    orders.place_concurrently(false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(counts(&t).await, (2, 0, 2), "{t}");
}
per_backend!(concurrent_inner_calls_in_one_task_take_turns, "svc_join");

async fn a_spawned_task_commits_on_its_own(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = services(&t);
    let mut spawned = Vec::new();
    assert!(orders.spawn_then_fail("s1", &mut spawned).await.is_err(), "{t}");
    for handle in spawned {
        handle.await.unwrap_or_else(|e| panic!("{t}: {e}")).unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    assert_eq!(counts(&t).await, (1, 0, 1), "{t}: the spawned call committed, the failed call's own order did not");
    assert_eq!(steps(&t).await, pairs(&[("s1", "placed")]), "{t}");
}
per_backend!(a_spawned_task_commits_on_its_own, "svc_spawn");

async fn another_database_is_never_joined(t: TestDb) {
    create_shop_tables(&t).await;
    let other = t.another("svc_other_db").await;
    create_shop_tables(&other).await;
    let orders = Orders { db: t.db.clone(), billing: Billing { db: other.db.clone() } };
    assert!(orders.place_and_bill("o1", true).await.is_err(), "{t}");
    assert_eq!(counts(&t).await, (0, 0, 0), "{t}: the failed call's own database rolled back");
    assert_eq!(counts(&other).await, (0, 1, 1), "{t}: the other database's call committed on its own");
}
per_backend!(another_database_is_never_joined, "svc_two_dbs");

async fn a_read_only_method_opens_no_transaction_and_sees_the_callers(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = services(&t);
    assert!(!orders.runs_in_a_transaction().await, "{t}: alone, it runs on the pool");
    assert_eq!(orders.order_count().await.unwrap_or_else(|e| panic!("{t}: {e}")), 0, "{t}");
    let seen = orders.place_and_look("o1").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(seen, (true, 1), "{t}: inside a call, it reads in that call's transaction");
}
per_backend!(a_read_only_method_opens_no_transaction_and_sees_the_callers, "svc_read_only");

/// The futures of annotated methods and of `transaction` are `Send`: they run in `tokio::spawn` (and axum).
async fn composed_calls_run_in_a_spawned_task(t: TestDb) {
    create_shop_tables(&t).await;
    let orders = services(&t);
    let db = t.db.clone();
    let task = tokio::spawn(async move {
        outbox_seaorm::transaction(&db, async |_txn| orders.place_and_bill("o1", false).await).await
    });
    task.await.unwrap_or_else(|e| panic!("{t}: {e}")).unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(counts(&t).await, (1, 1, 2), "{t}");
}
per_backend!(composed_calls_run_in_a_spawned_task, "svc_send");

/// A consumer's effect that calls a service: the service's rows and events commit with the inbox row.
async fn bill_through_the_service(
    billing: &Billing,
    t: &TestDb,
    message_id: &str,
    fail: bool,
) -> Result<InboxOutcome<()>, outbox_seaorm::InboxError<ShopError>> {
    outbox_seaorm::handle_once(&t.db, "billing", message_id, async |_txn| {
        billing.invoice("o1").await?;
        if fail {
            return Err(rejected("effect"));
        }
        Ok(())
    })
    .await
}

async fn a_service_called_by_a_consumer_commits_with_the_inbox_row(t: TestDb) {
    create_shop_tables(&t).await;
    let billing = Billing { db: t.db.clone() };
    let inbox = async || common::count_inbox(&t, "billing").await;
    assert!(bill_through_the_service(&billing, &t, "m1", true).await.is_err(), "{t}");
    assert_eq!(
        (counts(&t).await, inbox().await),
        ((0, 0, 0), 0),
        "{t}: the effect failed: no invoice, event or inbox row"
    );

    let outcome = bill_through_the_service(&billing, &t, "m1", false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(matches!(outcome, InboxOutcome::Processed(())), "{t}: {outcome:?}");
    assert_eq!((counts(&t).await, inbox().await), ((0, 1, 1), 1), "{t}");

    let again = bill_through_the_service(&billing, &t, "m1", false).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(matches!(again, InboxOutcome::Duplicate), "{t}: {again:?}");
    assert_eq!((counts(&t).await, inbox().await), ((0, 1, 1), 1), "{t}: a redelivery changes nothing");
}
per_backend!(a_service_called_by_a_consumer_commits_with_the_inbox_row, "svc_consumer");

async fn a_transaction_begun_elsewhere_is_refused_by_the_scope(t: TestDb) {
    use sea_orm::TransactionTrait;
    create_shop_tables(&t).await;
    let orders = services(&t);
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let refused = outbox_seaorm::transaction(&txn, async |_inner| orders.place("o1", false).await).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("pass the pool"), "{t}: {message}");
    txn.rollback().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(counts(&t).await, (0, 0, 0), "{t}: nothing ran");
}
per_backend!(a_transaction_begun_elsewhere_is_refused_by_the_scope, "svc_foreign");

/// `outbox_seaorm::begin` is used as `db.begin()` is, and the annotated calls of the task join it: rolled
/// back or dropped, neither the caller's row nor the calls' rows and events stay; committed, all of them
/// do. The same calls inside a `db.begin()` commit on their own, which is why the README shows `begin`.
async fn a_transaction_from_begin_takes_the_calls_with_it(t: TestDb) {
    use sea_orm::TransactionTrait;
    create_shop_tables(&t).await;
    let orders = services(&t);
    let caller_row = "INSERT INTO invoices (order_id, total_minor) VALUES ('caller', 1)";
    let fail = |e: &dyn std::fmt::Display| -> ! { panic!("{t}: {e}") };

    let txn = outbox_seaorm::begin(&t.db).await.unwrap_or_else(|e| fail(&e));
    txn.execute_unprepared(caller_row).await.unwrap_or_else(|e| fail(&e));
    orders.place("c1", false).await.unwrap_or_else(|e| fail(&e));
    orders.place_two(false).await.unwrap_or_else(|e| fail(&e));
    txn.rollback().await.unwrap_or_else(|e| fail(&e));
    assert_eq!(counts(&t).await, (0, 0, 0), "{t}: rolled back: the caller's row, the calls' rows, their events");

    {
        let _txn = outbox_seaorm::begin(&t.db).await.unwrap_or_else(|e| fail(&e));
        orders.place("c1", false).await.unwrap_or_else(|e| fail(&e));
    }
    assert_eq!(counts(&t).await, (0, 0, 0), "{t}: dropped without a commit: nothing");

    let txn = outbox_seaorm::begin(&t.db).await.unwrap_or_else(|e| fail(&e));
    txn.execute_unprepared(caller_row).await.unwrap_or_else(|e| fail(&e));
    orders.place("c1", false).await.unwrap_or_else(|e| fail(&e));
    orders.place_two(false).await.unwrap_or_else(|e| fail(&e));
    txn.commit().await.unwrap_or_else(|e| fail(&e));
    assert_eq!(counts(&t).await, (3, 1, 3), "{t}: committed together");

    // The pitfall: a `db.begin()` of SeaORM's does not hold the calls; its rollback leaves them committed.
    // (On SQLite the call would wait for the test pool's only connection, which `db.begin()` holds.)
    if t.backend == sea_orm::DbBackend::Sqlite {
        return;
    }
    let txn = t.db.begin().await.unwrap_or_else(|e| fail(&e));
    orders.place("d1", false).await.unwrap_or_else(|e| fail(&e));
    txn.rollback().await.unwrap_or_else(|e| fail(&e));
    assert_eq!(counts(&t).await, (4, 1, 4), "{t}: the call committed on its own");
}
per_backend!(a_transaction_from_begin_takes_the_calls_with_it, "svc_begin");

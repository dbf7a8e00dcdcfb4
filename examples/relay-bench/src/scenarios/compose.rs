//! What composing services costs: a business operation of 10 orders written by hand in one transaction,
//! by one `#[transactional_outbox(conn = self.db)]` call whose 10 inner `place` calls join its transaction
//! (a savepoint each), and by 10 separate calls (10 transactions); and a read by primary key on the pool,
//! through a `#[read_only]` method, and through a method that runs in a transaction.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::{Context, Result};
use outbox_seaorm::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait};

use super::Ctx;
use super::enqueue_tax::{OrderPlaced, ShopError};
use crate::report::{RATE_HEADER, Run, Table};

/// Orders per business operation.
const BATCH: usize = 10;
/// Orders the reads pick from.
const STOCK: u64 = 1000;

/// The README's service shape.
#[derive(Clone)]
struct Orders {
    db: DatabaseConnection,
}

#[transactional_outbox(conn = self.db)]
impl Orders {
    async fn place(&self, id: &str) -> Result<(), ShopError> {
        self.db.execute_raw(insert(self.db.get_database_backend(), id)).await?;
        emit!(placed(id));
        Ok(())
    }

    async fn place_all(&self, ids: &[String]) -> Result<(), ShopError> {
        for id in ids {
            self.place(id).await?;
        }
        Ok(())
    }

    #[read_only]
    async fn total(&self, id: &str) -> Result<Option<i64>, DbErr> {
        total(&self.db, id).await
    }

    async fn total_in_a_transaction(&self, id: &str) -> Result<Option<i64>, DbErr> {
        total(&self.db, id).await
    }
}

fn placed(id: &str) -> OrderPlaced {
    OrderPlaced { order_id: id.to_owned(), customer: "bench".into(), total_minor: 4900, lines: vec![1, 2, 3] }
}

fn insert(backend: DbBackend, id: &str) -> Statement {
    let sql = if backend == DbBackend::Postgres {
        "INSERT INTO bench_orders (id, customer, total_minor) VALUES ($1, 'bench', 4900)"
    } else {
        "INSERT INTO bench_orders (id, customer, total_minor) VALUES (?, 'bench', 4900)"
    };
    Statement::from_sql_and_values(backend, sql, [id.into()])
}

async fn total<C: ConnectionTrait>(db: &C, id: &str) -> Result<Option<i64>, DbErr> {
    let backend = db.get_database_backend();
    let sql = if backend == DbBackend::Postgres {
        "SELECT total_minor FROM bench_orders WHERE id = $1"
    } else {
        "SELECT total_minor FROM bench_orders WHERE id = ?"
    };
    let row = db.query_one_raw(Statement::from_sql_and_values(backend, sql, [id.into()])).await?;
    row.map(|row| row.try_get::<i64>("", "total_minor")).transpose()
}

/// One way of doing the operation a cell measures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    /// `BATCH` inserts and `enqueue_all` in one hand-written transaction.
    ByHand,
    /// One `place_all` call: `BATCH` `place` calls joining its transaction.
    Composed,
    /// `BATCH` separate `place` calls, a transaction each.
    Separate,
    /// `SELECT … WHERE id = ?` on the pool.
    ReadOnPool,
    /// The same through a `#[read_only]` method.
    ReadOnly,
    /// The same through a method that runs in a transaction.
    ReadInTransaction,
}

impl Way {
    fn name(self) -> String {
        match self {
            Way::ByHand => format!("one transaction by hand ({BATCH} inserts + enqueue_all)"),
            Way::Composed => format!("place_all: one call, {BATCH} joined place calls"),
            Way::Separate => format!("{BATCH} separate place calls ({BATCH} transactions)"),
            Way::ReadOnPool => "query on the pool".to_owned(),
            Way::ReadOnly => "#[read_only] method".to_owned(),
            Way::ReadInTransaction => "method in a transaction".to_owned(),
        }
    }

    fn is_write(self) -> bool {
        matches!(self, Way::ByHand | Way::Composed | Way::Separate)
    }
}

/// One operation; returns the orders written or read.
async fn operation(orders: &Orders, way: Way, n: u64) -> Result<u64> {
    let ids: Vec<String> = (0..BATCH).map(|k| format!("w{n}_{k}")).collect();
    let read = format!("r{}", n % STOCK);
    match way {
        Way::ByHand => {
            let txn = orders.db.begin().await?;
            let backend = txn.get_database_backend();
            for id in &ids {
                txn.execute_raw(insert(backend, id)).await?;
            }
            let events = ids.iter().map(|id| placed(id).to_new_event()).collect::<Result<Vec<_>, _>>()?;
            outbox_seaorm::enqueue_all(&txn, &events).await?;
            txn.commit().await?;
        }
        Way::Composed => orders.place_all(&ids).await?,
        Way::Separate => {
            for id in &ids {
                orders.place(id).await?;
            }
        }
        Way::ReadOnPool => anyhow::ensure!(total(&orders.db, &read).await?.is_some(), "{read} is missing"),
        Way::ReadOnly => anyhow::ensure!(orders.total(&read).await?.is_some(), "{read} is missing"),
        Way::ReadInTransaction => {
            anyhow::ensure!(orders.total_in_a_transaction(&read).await?.is_some(), "{read} is missing");
        }
    }
    Ok(if way.is_write() { BATCH as u64 } else { 1 })
}

async fn cell(orders: &Orders, way: Way, clients: usize, duration: Duration, ids: &Arc<AtomicU64>) -> Result<Run> {
    super::load(
        clients,
        duration,
        ids,
        orders.clone(),
        move |orders, n| async move { operation(&orders, way, n).await },
    )
    .await
}

/// Runs the scenario.
pub async fn run(ctx: &Ctx) -> Result<()> {
    let duration = Duration::from_secs(ctx.size(10, 1) as u64);
    let db = ctx.target.fresh().await?;
    let ddl = "CREATE TABLE bench_orders (id VARCHAR(64) PRIMARY KEY, customer VARCHAR(64) NOT NULL, total_minor BIGINT NOT NULL)";
    db.execute_unprepared(ddl).await.context("compose: create bench_orders")?;
    let txn = db.begin().await?;
    for n in 0..STOCK {
        txn.execute_raw(insert(txn.get_database_backend(), &format!("r{n}"))).await?;
    }
    txn.commit().await?;
    let orders = Orders { db: db.clone() };
    let ids = Arc::new(AtomicU64::new(0));
    let ways = [Way::ByHand, Way::Composed, Way::Separate, Way::ReadOnPool, Way::ReadOnly, Way::ReadInTransaction];
    // SQLite has one writer at a time: more clients measure the lock, not the library.
    let client_counts: &[usize] = if db.get_database_backend() == DbBackend::Sqlite { &[1] } else { &[1, 8] };
    let cells: Vec<(Way, usize)> = client_counts.iter().flat_map(|&c| ways.iter().map(move |&w| (w, c))).collect();
    let mut runs = vec![Vec::new(); cells.len()];
    for round in 0..ctx.rounds {
        for (i, (way, clients)) in cells.iter().enumerate() {
            let run = cell(&orders, *way, *clients, duration, &ids)
                .await
                .with_context(|| format!("{} with {clients} client(s), round {}", way.name(), round + 1))?;
            runs[i].push(run);
        }
    }
    let mut table =
        Table::new(ctx.title(&format!("compose: orders/s, {} s per cell", duration.as_secs())), &RATE_HEADER);
    let mut baseline: &[crate::report::Run] = &[];
    for ((way, clients), runs) in cells.iter().zip(&runs) {
        let case = format!("{clients} client(s), {}", if way.is_write() { "writes" } else { "reads" });
        if matches!(way, Way::ByHand | Way::ReadOnPool) {
            baseline = runs.as_slice();
            table.rate_row(&case, &way.name(), runs, None, "orders/s");
        } else {
            table.rate_row(&case, &way.name(), runs, Some(baseline), "orders/s");
        }
    }
    table.note(format!(
        "Writes: orders/s of operations of {BATCH} orders, each with its event. Reads: one order by primary key per call."
    ));
    table.emit(ctx.out.as_deref())?;
    db.close().await.context("close")?;
    Ok(())
}

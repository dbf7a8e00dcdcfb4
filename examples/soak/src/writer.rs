//! Writers: each order is one transaction holding its business rows and its events (`enqueue_all`);
//! some roll back on purpose after the enqueue.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_seaorm::{CancellationToken, DomainEvent, NewEvent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait, Value};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::SoakError;
use crate::db::{placeholders, statement};

/// The one event type of a soak: a line of an order, on the order's account.
#[derive(DomainEvent, Clone, Debug, Serialize, Deserialize)]
#[domain_event(name = "soak.line_added", version = 1, aggregate = "account")]
pub struct SoakEvent {
    /// The account (the aggregate).
    #[aggregate_id]
    pub account: String,
    /// The order.
    pub order_no: i64,
    /// The line within the order.
    pub line: u32,
}

/// What the writers share.
pub struct Plan {
    /// Orders to write; 0 for no limit.
    pub orders: u64,
    /// Accounts (aggregates).
    pub aggregates: u64,
    /// Events per order.
    pub events_per_order: u32,
    /// Consecutive orders that go to one aggregate, so that as many writers write it at once.
    pub per_aggregate: u64,
    /// Probability of an on-purpose rollback.
    pub rollback_rate: f64,
    /// Target events per second.
    pub rate: Option<f64>,
    /// When writers stop.
    pub deadline: Option<Instant>,
    /// When writing started.
    pub started: Instant,
    /// Seed of the rollback choices.
    pub seed: u64,
    /// The next order number.
    pub next: AtomicU64,
    /// Orders committed and rolled back.
    pub committed: AtomicU64,
    /// Orders rolled back on purpose.
    pub rolled_back: AtomicU64,
}

impl Plan {
    /// The aggregate of order `n`.
    fn aggregate(&self, n: u64) -> String {
        format!("acct-{}", (n / self.per_aggregate.max(1)) % self.aggregates.max(1))
    }
}

/// One writer: takes order numbers until the plan is done or `stop` is cancelled.
pub async fn write(db: DatabaseConnection, plan: Arc<Plan>, stop: CancellationToken) -> Result<(), SoakError> {
    loop {
        let n = plan.next.fetch_add(1, Ordering::SeqCst);
        if (plan.orders > 0 && n >= plan.orders) || stop.is_cancelled() {
            return Ok(());
        }
        if let Some(rate) = plan.rate {
            let due = plan.started + Duration::from_secs_f64(n as f64 * f64::from(plan.events_per_order) / rate);
            if plan.deadline.is_some_and(|deadline| due >= deadline || Instant::now() >= deadline) {
                return Ok(());
            }
            tokio::time::sleep_until(due).await;
        } else if plan.deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Ok(());
        }
        let rollback =
            StdRng::seed_from_u64(plan.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).random_bool(plan.rollback_rate);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match write_order(&db, &plan, n, rollback).await {
                Ok(()) => break,
                // SQLite under many writers, a deadlock victim on a server: the transaction rolled back,
                // nothing of it committed; try the order again.
                Err(e) if attempt < 5 => {
                    tracing::warn!(order = n, attempt, error = %e, "soak writer: order rolled back by the database; retrying");
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
        if rollback {
            plan.rolled_back.fetch_add(1, Ordering::Relaxed);
        } else {
            plan.committed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Order `n`: its row, its event ids and its events in one transaction; committed unless `rollback`.
async fn write_order(db: &DatabaseConnection, plan: &Plan, n: u64, rollback: bool) -> Result<(), SoakError> {
    let account = plan.aggregate(n);
    let order_no = i64::try_from(n).map_err(|_| SoakError::Usage(format!("order number {n} is out of range")))?;
    let events: Vec<NewEvent> = (0..plan.events_per_order)
        .map(|line| SoakEvent { account: account.clone(), order_no, line }.to_new_event())
        .collect::<Result<_, _>>()?;
    let backend = db.get_database_backend();
    let txn = db.begin().await.map_err(SoakError::db(format!("order {n}: begin")))?;
    let order = statement(
        backend,
        "INSERT INTO soak_orders (order_no, aggregate_id, line_count) VALUES (?, ?, ?)",
        vec![order_no.into(), account.clone().into(), i64::from(plan.events_per_order).into()],
    );
    txn.execute_raw(order).await.map_err(SoakError::db(format!("order {n}: insert soak_orders")))?;
    if !events.is_empty() {
        let mut values: Vec<Value> = Vec::with_capacity(events.len() * 3);
        for event in &events {
            values.push(event.id().to_string().into());
            values.push(order_no.into());
            values.push(account.clone().into());
        }
        let sql = format!(
            "INSERT INTO soak_events (event_id, order_no, aggregate_id) VALUES {}",
            placeholders(events.len(), 3)
        );
        txn.execute_raw(statement(backend, &sql, values))
            .await
            .map_err(SoakError::db(format!("order {n}: insert soak_events")))?;
    }
    outbox_seaorm::enqueue_all(&txn, &events).await?;
    if rollback {
        txn.rollback().await.map_err(SoakError::db(format!("order {n}: rollback")))?;
    } else {
        txn.commit().await.map_err(SoakError::db(format!("order {n}: commit")))?;
    }
    Ok(())
}

//! The enqueue tax: business transactions per second with and without events, three ways of writing the
//! events (raw SQL into a plain table shaped like `outbox_events`, `enqueue`/`enqueue_all`, and a
//! `#[transactional_outbox]` method using `emit!`), 1 and 8 clients, 1 and 5 events per transaction.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::{Context, Result};
use outbox_seaorm::prelude::*;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait, Value};
use serde::{Deserialize, Serialize};

use super::Ctx;
use crate::report::{RATE_HEADER, Run, Table};

/// The event the service emits (same payload shape as the relay scenarios).
#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    /// The order.
    #[aggregate_id]
    pub order_id: String,
    /// Who ordered.
    pub customer: String,
    /// Total in minor units.
    pub total_minor: i64,
    /// Line numbers.
    pub lines: Vec<i32>,
}

/// The service's error: only database errors.
#[derive(Debug)]
pub struct ShopError(DbErr);

impl From<DbErr> for ShopError {
    fn from(e: DbErr) -> Self {
        ShopError(e)
    }
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shop: {}", self.0)
    }
}

impl std::error::Error for ShopError {}

/// A service shaped like an app's: insert the order, emit its events.
pub struct Shop;

#[transactional_outbox]
impl Shop {
    /// Saves an order and emits `events` `order.placed` events in the same transaction.
    pub async fn place(&self, db: &DatabaseConnection, id: &str, events: usize) -> Result<(), ShopError> {
        db.execute_raw(order_insert(db.get_database_backend(), id)).await?;
        for _ in 0..events {
            emit!(OrderPlaced {
                order_id: id.to_owned(),
                customer: "bench".into(),
                total_minor: 4900,
                lines: vec![1, 2, 3]
            });
        }
        Ok(())
    }
}

fn order_insert(backend: DbBackend, id: &str) -> Statement {
    let sql = if backend == DbBackend::Postgres {
        "INSERT INTO bench_orders (id, customer, total_minor) VALUES ($1, $2, $3)"
    } else {
        "INSERT INTO bench_orders (id, customer, total_minor) VALUES (?, ?, ?)"
    };
    Statement::from_sql_and_values(backend, sql, [id.into(), "bench".into(), 4900i64.into()])
}

/// How a cell writes its events.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    /// No events: the business transaction alone.
    Without,
    /// A multi-row insert into `raw_events`.
    Raw,
    /// `outbox_seaorm::enqueue` (1 event) or `enqueue_all`.
    Enqueue,
    /// The `#[transactional_outbox]` service.
    Macro,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Without => "without events",
            Way::Raw => "raw SQL",
            Way::Enqueue => "enqueue/enqueue_all",
            Way::Macro => "#[transactional_outbox] + emit!",
        }
    }
}

async fn create_tables(db: &DatabaseConnection) -> Result<()> {
    let backend = db.get_database_backend();
    let (json, serial) = match backend {
        DbBackend::Postgres => ("jsonb", "bigserial PRIMARY KEY"),
        DbBackend::MySql => ("json", "BIGINT AUTO_INCREMENT PRIMARY KEY"),
        _ => ("text", "INTEGER PRIMARY KEY AUTOINCREMENT"),
    };
    let ddl = [
        "CREATE TABLE bench_orders (id VARCHAR(64) PRIMARY KEY, customer VARCHAR(64) NOT NULL, total_minor BIGINT NOT NULL)"
            .to_owned(),
        format!(
            "CREATE TABLE raw_events (seq {serial}, event_id VARCHAR(36) NOT NULL UNIQUE, aggregate_type VARCHAR(64) NOT NULL, \
             aggregate_id VARCHAR(128) NOT NULL, event_type VARCHAR(128) NOT NULL, schema_version INT NOT NULL, \
             payload {json} NOT NULL, headers {json} NOT NULL, created_at_ms BIGINT NOT NULL, attempts INT NOT NULL, \
             next_attempt_at_ms BIGINT NOT NULL, last_error TEXT, published_at_ms BIGINT, dead_at_ms BIGINT, \
             lease_token VARCHAR(36), lease_until_ms BIGINT)"
        ),
        "CREATE INDEX raw_events_pending ON raw_events (published_at_ms, seq)".to_owned(),
    ];
    for sql in ddl {
        db.execute_unprepared(&sql).await.with_context(|| format!("enqueue-tax: {sql}"))?;
    }
    Ok(())
}

/// One multi-row insert of `n` events into `raw_events`, with bound values like `enqueue_all`'s.
fn raw_insert(backend: DbBackend, id: &str, n: usize, seq: u64) -> Statement {
    let pg = backend == DbBackend::Postgres;
    let now = chrono::Utc::now().timestamp_millis();
    let mut values: Vec<Value> = Vec::new();
    let mut rows = Vec::new();
    for k in 0..n {
        let base = values.len();
        let p = |i: usize| if pg { format!("${}", base + i + 1) } else { "?".to_owned() };
        let j = |i: usize| if pg { format!("CAST({} AS jsonb)", p(i)) } else { p(i) };
        rows.push(format!(
            "({}, {}, {}, {}, {}, {}, {}, {}, {}, {})",
            p(0),
            p(1),
            p(2),
            p(3),
            p(4),
            j(5),
            j(6),
            p(7),
            p(8),
            p(9)
        ));
        values.extend([
            format!("00000000-{k:04x}-4000-8000-{seq:012x}").into(),
            "order".into(),
            id.into(),
            "order.placed".into(),
            1i32.into(),
            crate::baselines::PAYLOAD.into(),
            "{}".into(),
            now.into(),
            0i32.into(),
            now.into(),
        ]);
    }
    let sql = format!(
        "INSERT INTO raw_events (event_id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers, \
         created_at_ms, attempts, next_attempt_at_ms) VALUES {}",
        rows.join(", ")
    );
    Statement::from_sql_and_values(backend, sql, values)
}

/// One business transaction of `way` with `events` events.
async fn transaction(db: &DatabaseConnection, way: Way, events: usize, n: u64) -> Result<()> {
    let backend = db.get_database_backend();
    let id = format!("b{n}");
    if way == Way::Macro {
        return Shop.place(db, &id, events).await.context("service call");
    }
    let txn = db.begin().await?;
    txn.execute_raw(order_insert(backend, &id)).await?;
    match way {
        Way::Raw => {
            txn.execute_raw(raw_insert(backend, &id, events, n)).await?;
        }
        Way::Enqueue => {
            let payload = serde_json::json!({"customer": "bench", "total_minor": 4900, "lines": [1, 2, 3]});
            let list = (0..events)
                .map(|_| NewEvent::new("order", id.clone(), "order.placed", &payload))
                .collect::<Result<Vec<_>, _>>()?;
            if events == 1 {
                outbox_seaorm::enqueue(&txn, &list[0]).await?;
            } else {
                outbox_seaorm::enqueue_all(&txn, &list).await?;
            }
        }
        Way::Without | Way::Macro => {}
    }
    txn.commit().await?;
    Ok(())
}

/// `clients` tasks each running transactions back to back for `duration`.
async fn cell(
    db: &DatabaseConnection,
    way: Way,
    events: usize,
    clients: usize,
    duration: Duration,
    ids: &Arc<AtomicU64>,
) -> Result<Run> {
    super::load(clients, duration, ids, db.clone(), move |db, n| async move {
        transaction(&db, way, events, n).await?;
        Ok(1)
    })
    .await
}

/// Runs the scenario.
pub async fn run(ctx: &Ctx) -> Result<()> {
    let duration = Duration::from_secs(ctx.size(10, 1) as u64);
    let db = ctx.target.fresh().await?;
    create_tables(&db).await?;
    let ids = Arc::new(AtomicU64::new(0));
    let mut cells = Vec::new();
    for clients in [1usize, 8] {
        cells.push((Way::Without, 0usize, clients));
        for events in [1usize, 5] {
            for way in [Way::Raw, Way::Enqueue, Way::Macro] {
                cells.push((way, events, clients));
            }
        }
    }
    let mut runs = vec![Vec::new(); cells.len()];
    for round in 0..ctx.rounds {
        for (i, (way, events, clients)) in cells.iter().enumerate() {
            let run = cell(&db, *way, *events, *clients, duration, &ids)
                .await
                .with_context(|| format!("{} x{events} with {clients} client(s), round {}", way.name(), round + 1))?;
            runs[i].push(run);
        }
    }
    let mut table = Table::new(
        ctx.title(&format!("enqueue-tax: business transactions/s, {} s per cell", duration.as_secs())),
        &RATE_HEADER,
    );
    let mut baseline: &[crate::report::Run] = &[];
    for ((way, events, clients), runs) in cells.iter().zip(&runs) {
        if *way == Way::Without {
            baseline = runs.as_slice();
            table.rate_row(&format!("{clients} client(s)"), way.name(), runs, None, "tps");
        } else {
            let variant = format!("{} ({events} event(s))", way.name());
            table.rate_row(&format!("{clients} client(s)"), &variant, runs, Some(baseline), "tps");
        }
    }
    table.note("vs baseline = tps with the events / tps of the same business transaction without them, same clients.");
    table.emit(ctx.out.as_deref())?;
    db.close().await.context("close")?;
    Ok(())
}

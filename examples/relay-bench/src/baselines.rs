//! Plain-SQL relays on their own tables in the bench schema, each draining the same backlog shape through
//! a publisher that confirms at once:
//!
//! - `raw-ceiling`: one statement per batch claims, marks and returns the rows (PostgreSQL and SQLite:
//!   `UPDATE ... WHERE id IN (SELECT ... LIMIT n [FOR UPDATE SKIP LOCKED]) RETURNING ...`; MySQL, which has
//!   neither `RETURNING` nor `LIMIT` in `IN (subquery)`: select then update by ids in one transaction). It
//!   keeps no per-aggregate order and marks before publishing: a ceiling, not a correct relay.
//! - `seed000`: the Node.js lab's `relayOnce`, as written: in one transaction, `SELECT ... WHERE
//!   published_at IS NULL AND attempts < $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED`, then per row
//!   publish + `UPDATE outbox SET published_at = now() WHERE id = $1`.
//! - `seed001`: the blog article's polling relay, as written: no transaction and no lock, `SELECT * ...
//!   WHERE published_at IS NULL ORDER BY created_at LIMIT 100`, then per row publish + an autocommitted
//!   `UPDATE ... SET published_at = now() WHERE id = ?`; UUID ids, a partial index on `created_at`. Its
//!   batch is the article's 100 whatever the scenario's batch.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sea_orm::prelude::Uuid;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, QueryResult, Statement, TransactionTrait, Value};

/// The payload every event of every variant carries.
pub const PAYLOAD: &str = r#"{"customer":"bench","total_minor":4900,"lines":[1,2,3]}"#;

/// A plain-SQL relay to compare against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// One claim-and-mark statement per batch.
    RawCeiling,
    /// The Node.js lab's `relayOnce` statements, driven from Rust (several times faster than the lab's
    /// own Node relay, which also pays for JSON and a driver round trip per row).
    Seed000,
    /// The blog article's polling relay statements, driven from Rust.
    Seed001,
}

impl Baseline {
    /// The name printed in tables.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::RawCeiling => "raw-ceiling",
            Baseline::Seed000 => "seed000 SQL, from Rust",
            Baseline::Seed001 => "seed001 SQL, from Rust",
        }
    }

    fn table(self) -> &'static str {
        match self {
            Baseline::RawCeiling => "raw_outbox",
            Baseline::Seed000 => "seed000_outbox",
            Baseline::Seed001 => "seed001_outbox",
        }
    }

    /// Creates this baseline's table (in a fresh bench schema).
    pub async fn create(self, db: &DatabaseConnection) -> Result<()> {
        let backend = db.get_database_backend();
        let (pg, my, lite) =
            (backend == DbBackend::Postgres, backend == DbBackend::MySql, backend == DbBackend::Sqlite);
        let serial = if pg {
            "bigserial PRIMARY KEY"
        } else if my {
            "BIGINT AUTO_INCREMENT PRIMARY KEY"
        } else {
            "INTEGER PRIMARY KEY AUTOINCREMENT"
        };
        let json = if pg {
            "jsonb"
        } else if my {
            "json"
        } else {
            "text"
        };
        let ts = if pg {
            "timestamptz"
        } else if my {
            "DATETIME(6)"
        } else {
            "text"
        };
        let now_default = if pg {
            "DEFAULT now()"
        } else if my {
            "DEFAULT CURRENT_TIMESTAMP(6)"
        } else {
            "DEFAULT (strftime('%Y-%m-%d %H:%M:%f','now'))"
        };
        let text = if my { "VARCHAR(128)" } else { "text" };
        let t = self.table();
        // MySQL has no partial index: the closest is an index that starts with published_at.
        let partial = |col: &str| {
            if my {
                format!("CREATE INDEX {t}_pending ON {t} (published_at, {col})")
            } else {
                format!("CREATE INDEX {t}_pending ON {t} ({col}) WHERE published_at IS NULL")
            }
        };
        let ddl = match self {
            Baseline::RawCeiling => vec![
                format!(
                    "CREATE TABLE {t} (id {serial}, aggregate_id {text} NOT NULL, event_type {text} NOT NULL, \
                     payload {json} NOT NULL, published_at {ts})"
                ),
                partial("id"),
            ],
            Baseline::Seed000 => vec![
                format!(
                    "CREATE TABLE {t} (id {serial}, aggregate_id {text} NOT NULL, type {text} NOT NULL, \
                     payload {json} NOT NULL, created_at {ts} NOT NULL {now_default}, published_at {ts}, \
                     attempts int NOT NULL DEFAULT 0, last_error text)"
                ),
                partial("id"),
            ],
            Baseline::Seed001 => {
                let id = if pg {
                    "UUID PRIMARY KEY DEFAULT gen_random_uuid()"
                } else if lite {
                    "TEXT PRIMARY KEY DEFAULT (lower(hex(randomblob(16))))"
                } else {
                    "CHAR(36) PRIMARY KEY"
                };
                vec![
                    format!(
                        "CREATE TABLE {t} (id {id}, aggregate_type {text} NOT NULL, aggregate_id {text} NOT NULL, \
                         event_type {text} NOT NULL, payload {json} NOT NULL, created_at {ts} NOT NULL {now_default}, \
                         published_at {ts})"
                    ),
                    partial("created_at"),
                ]
            }
        };
        for sql in ddl {
            db.execute_unprepared(&sql).await.with_context(|| format!("{}: {sql}", self.name()))?;
        }
        Ok(())
    }

    /// Inserts `events` rows spread round-robin over `aggregates` aggregates, 1000 rows per statement.
    pub async fn fill(self, db: &DatabaseConnection, events: usize, aggregates: usize) -> Result<()> {
        let my = db.get_database_backend() == DbBackend::MySql;
        let t = self.table();
        let mut start = 0;
        while start < events {
            let end = (start + 1000).min(events);
            let rows: Vec<String> = (start..end)
                .map(|i| {
                    let agg = i % aggregates.max(1);
                    match self {
                        Baseline::RawCeiling => format!("('o{agg}', 'order.placed', '{PAYLOAD}')"),
                        Baseline::Seed000 => format!("('o{agg}', 'order.placed', '{PAYLOAD}')"),
                        Baseline::Seed001 if my => format!("(UUID(), 'order', 'o{agg}', 'order.placed', '{PAYLOAD}')"),
                        Baseline::Seed001 => format!("('order', 'o{agg}', 'order.placed', '{PAYLOAD}')"),
                    }
                })
                .collect();
            let columns = match self {
                Baseline::RawCeiling => "aggregate_id, event_type, payload",
                Baseline::Seed000 => "aggregate_id, type, payload",
                Baseline::Seed001 if my => "id, aggregate_type, aggregate_id, event_type, payload",
                Baseline::Seed001 => "aggregate_type, aggregate_id, event_type, payload",
            };
            let sql = format!("INSERT INTO {t} ({columns}) VALUES {}", rows.join(", "));
            db.execute_unprepared(&sql).await.with_context(|| format!("{}: fill rows {start}..{end}", self.name()))?;
            start = end;
        }
        Ok(())
    }

    /// Drains the table until a batch comes back empty or `budget` runs out.
    pub async fn drain(self, db: &DatabaseConnection, batch: u32, budget: Duration) -> Result<crate::report::Run> {
        let started = Instant::now();
        let mut done = 0u64;
        let mut timed_out = false;
        loop {
            if started.elapsed() > budget {
                timed_out = true;
                break;
            }
            let n = match self {
                Baseline::RawCeiling => raw_ceiling_once(db, batch).await,
                Baseline::Seed000 => seed000_relay_once(db, batch, 5).await,
                Baseline::Seed001 => seed001_loop_once(db).await,
            }
            .with_context(|| format!("{} relay pass", self.name()))?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(crate::report::Run { done, secs: started.elapsed().as_secs_f64(), timed_out })
    }
}

/// The publisher every baseline uses: reads what a real one would send and confirms at once.
fn publish(row: &QueryResult, type_column: &str) -> Result<()> {
    let aggregate: String = row.try_get("", "aggregate_id").context("read aggregate_id")?;
    let event_type: String = row.try_get("", type_column).context("read the event type")?;
    let payload = match row.try_get::<serde_json::Value>("", "payload") {
        Ok(value) => value.to_string(),
        Err(_) => row.try_get::<String>("", "payload").context("read payload")?,
    };
    std::hint::black_box((aggregate, event_type, payload));
    Ok(())
}

fn ids(rows: &[QueryResult]) -> Result<Vec<i64>> {
    rows.iter().map(|r| r.try_get::<i64>("", "id").context("read id")).collect()
}

async fn raw_ceiling_once(db: &DatabaseConnection, batch: u32) -> Result<u64> {
    let backend = db.get_database_backend();
    if backend == DbBackend::MySql {
        let txn = db.begin().await?;
        let sql = format!(
            "SELECT id, aggregate_id, event_type, payload FROM raw_outbox WHERE published_at IS NULL \
             ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED"
        );
        let rows = txn.query_all_raw(Statement::from_string(backend, sql)).await?;
        for row in &rows {
            publish(row, "event_type")?;
        }
        let ids = ids(&rows)?;
        if !ids.is_empty() {
            let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
            txn.execute_unprepared(&format!("UPDATE raw_outbox SET published_at = NOW(6) WHERE id IN ({list})"))
                .await?;
        }
        txn.commit().await?;
        return Ok(rows.len() as u64);
    }
    let (now, lock) =
        if backend == DbBackend::Postgres { ("now()", " FOR UPDATE SKIP LOCKED") } else { ("CURRENT_TIMESTAMP", "") };
    let sql = format!(
        "UPDATE raw_outbox SET published_at = {now} WHERE id IN (SELECT id FROM raw_outbox WHERE published_at IS NULL \
         ORDER BY id LIMIT {batch}{lock}) RETURNING id, aggregate_id, event_type, payload"
    );
    let rows = db.query_all_raw(Statement::from_string(backend, sql)).await?;
    for row in &rows {
        publish(row, "event_type")?;
    }
    Ok(rows.len() as u64)
}

/// Seed 000's `relayOnce` (the failure branch never runs: the publisher always confirms).
async fn seed000_relay_once(db: &DatabaseConnection, batch: u32, max_attempts: i32) -> Result<u64> {
    let backend = db.get_database_backend();
    let (select, update) = match backend {
        DbBackend::Postgres => (
            "SELECT id, aggregate_id, type, payload FROM seed000_outbox WHERE published_at IS NULL AND attempts < $1 \
             ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
            "UPDATE seed000_outbox SET published_at = now() WHERE id = $1",
        ),
        DbBackend::MySql => (
            "SELECT id, aggregate_id, type, payload FROM seed000_outbox WHERE published_at IS NULL AND attempts < ? \
             ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
            "UPDATE seed000_outbox SET published_at = NOW(6) WHERE id = ?",
        ),
        _ => (
            "SELECT id, aggregate_id, type, payload FROM seed000_outbox WHERE published_at IS NULL AND attempts < ? \
             ORDER BY id LIMIT ?",
            "UPDATE seed000_outbox SET published_at = CURRENT_TIMESTAMP WHERE id = ?",
        ),
    };
    let txn = db.begin().await?;
    let values: [Value; 2] = [max_attempts.into(), i64::from(batch).into()];
    let rows = txn.query_all_raw(Statement::from_sql_and_values(backend, select, values)).await?;
    for row in &rows {
        publish(row, "type")?;
        let id: i64 = row.try_get("", "id").context("read id")?;
        txn.execute_raw(Statement::from_sql_and_values(backend, update, [id.into()])).await?;
    }
    txn.commit().await?;
    Ok(rows.len() as u64)
}

/// One turn of seed 001's `relayLoop` (without the `sleep(500)` on an empty result: the drain stops there).
async fn seed001_loop_once(db: &DatabaseConnection) -> Result<u64> {
    let backend = db.get_database_backend();
    let select = "SELECT * FROM seed001_outbox WHERE published_at IS NULL ORDER BY created_at LIMIT 100";
    let update = match backend {
        DbBackend::Postgres => "UPDATE seed001_outbox SET published_at = now() WHERE id = $1",
        DbBackend::MySql => "UPDATE seed001_outbox SET published_at = NOW(6) WHERE id = ?",
        _ => "UPDATE seed001_outbox SET published_at = strftime('%Y-%m-%d %H:%M:%f','now') WHERE id = ?",
    };
    let rows = db.query_all_raw(Statement::from_string(backend, select)).await?;
    for row in &rows {
        publish(row, "event_type")?;
        let id: Value = if backend == DbBackend::Postgres {
            row.try_get::<Uuid>("", "id").context("read id")?.into()
        } else {
            row.try_get::<String>("", "id").context("read id")?.into()
        };
        db.execute_raw(Statement::from_sql_and_values(backend, update, [id])).await?;
    }
    Ok(rows.len() as u64)
}

//! Plain-SQL relays on their own tables in the bench schema, each draining the same backlog shape through
//! a publisher that confirms at once:
//!
//! - `raw-ceiling`: one statement per batch claims, marks and returns the rows (PostgreSQL and SQLite:
//!   `UPDATE ... WHERE id IN (SELECT ... LIMIT n [FOR UPDATE SKIP LOCKED]) RETURNING ...`; MySQL, which has
//!   neither `RETURNING` nor `LIMIT` in `IN (subquery)`: select then update by ids in one transaction). It
//!   keeps no per-aggregate order and marks before publishing: a ceiling, not a correct relay.
//! - `ceiling, our table`: the same one statement on the project's own `outbox_events` (its columns, its
//!   indexes, its `jsonb` payload, filled by the same `enqueue_all` as ours), reading the columns our relay
//!   reads, in the order of its index of pending rows. Its plan is pinned: forced on MySQL (`FORCE INDEX`)
//!   and SQLite (`INDEXED BY`), on PostgreSQL by sessions with `enable_seqscan` and `enable_sort` off
//!   (`Target::connect_pinned`) after an `ANALYZE`; and the run fails unless
//!   `EXPLAIN` shows that index walked with no sort, so a plan that drifts cannot move the baseline. This is the ceiling the relay's
//!   per-pass targets are measured against.
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
    /// The same statement on the project's own table, with a pinned plan.
    OwnTableCeiling,
    /// The Node.js lab's `relayOnce` statements, driven from Rust (several times faster than the lab's
    /// own Node relay, which also pays for JSON and a driver round trip per row).
    Seed000,
    /// The blog article's polling relay statements, driven from Rust.
    Seed001,
    /// Seed 000's `relayOnce` itself, run by Node.js (`node/seed-relays.mjs`; PostgreSQL).
    Seed000Node,
    /// Seed 001's `relayLoop` itself, on knex, run by Node.js (PostgreSQL).
    Seed001Node,
}

impl Baseline {
    /// The name printed in tables.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::RawCeiling => "raw-ceiling",
            Baseline::OwnTableCeiling => "ceiling, our table",
            Baseline::Seed000 => "seed000 SQL, from Rust",
            Baseline::Seed001 => "seed001 SQL, from Rust",
            Baseline::Seed000Node => "seed000 relay (Node, as written)",
            Baseline::Seed001Node => "seed001 relay (Node, as written)",
        }
    }

    /// The baseline whose table and rows this one uses: a Node relay drains its SQL twin's table.
    fn twin(self) -> Baseline {
        match self {
            Baseline::Seed000Node => Baseline::Seed000,
            Baseline::Seed001Node => Baseline::Seed001,
            other => other,
        }
    }

    /// A Node relay, run as a child process rather than from this process.
    pub fn is_node(self) -> bool {
        self != self.twin()
    }

    fn table(self) -> &'static str {
        match self.twin() {
            Baseline::RawCeiling => "raw_outbox",
            Baseline::OwnTableCeiling => "outbox_events",
            Baseline::Seed000 => "seed000_outbox",
            Baseline::Seed001 => "seed001_outbox",
            Baseline::Seed000Node | Baseline::Seed001Node => unreachable!("a twin is never a Node relay"),
        }
    }

    /// Creates this baseline's table (in a fresh bench schema).
    pub async fn create(self, db: &DatabaseConnection) -> Result<()> {
        if self.is_node() {
            return Box::pin(self.twin().create(db)).await;
        }
        if self == Baseline::OwnTableCeiling {
            return Ok(()); // the bench schema's migrations made it
        }
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
            Baseline::OwnTableCeiling | Baseline::Seed000Node | Baseline::Seed001Node => Vec::new(),
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
        if self.is_node() {
            return Box::pin(self.twin().fill(db, events, aggregates)).await;
        }
        if self == Baseline::OwnTableCeiling {
            // The same rows as ours, through `enqueue_all`; statistics that know them (unanalyzed, PostgreSQL
            // sorts a walk of `outbox_events_runs` instead), then the plan is checked.
            crate::scenarios::fill_ours(db, crate::scenarios::Shape { events, aggregates }, "o").await?;
            let analyze = match db.get_database_backend() {
                DbBackend::Postgres => "ANALYZE outbox_events",
                DbBackend::MySql => "ANALYZE TABLE outbox_events",
                _ => "ANALYZE",
            };
            db.execute_unprepared(analyze).await.context("analyze outbox_events for the ceiling")?;
            return Ok(());
        }
        let my = db.get_database_backend() == DbBackend::MySql;
        let t = self.table();
        let mut start = 0;
        while start < events {
            let end = (start + 1000).min(events);
            let rows: Vec<String> = (start..end)
                .map(|i| {
                    let agg = i % aggregates.max(1);
                    match self {
                        Baseline::RawCeiling | Baseline::OwnTableCeiling => {
                            format!("('o{agg}', 'order.placed', '{PAYLOAD}')")
                        }
                        Baseline::Seed000 => format!("('o{agg}', 'order.placed', '{PAYLOAD}')"),
                        Baseline::Seed001 if my => format!("(UUID(), 'order', 'o{agg}', 'order.placed', '{PAYLOAD}')"),
                        Baseline::Seed001 => format!("('order', 'o{agg}', 'order.placed', '{PAYLOAD}')"),
                        Baseline::Seed000Node | Baseline::Seed001Node => unreachable!("filled through its twin"),
                    }
                })
                .collect();
            let columns = match self {
                Baseline::RawCeiling | Baseline::OwnTableCeiling => "aggregate_id, event_type, payload",
                Baseline::Seed000 => "aggregate_id, type, payload",
                Baseline::Seed001 if my => "id, aggregate_type, aggregate_id, event_type, payload",
                Baseline::Seed001 => "aggregate_type, aggregate_id, event_type, payload",
                Baseline::Seed000Node | Baseline::Seed001Node => unreachable!("filled through its twin"),
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
                Baseline::OwnTableCeiling => own_table_ceiling_once(db, batch).await,
                Baseline::Seed000 => seed000_relay_once(db, batch, 5).await,
                Baseline::Seed001 => seed001_loop_once(db).await,
                Baseline::Seed000Node | Baseline::Seed001Node => anyhow::bail!("{} runs in Node.js", self.name()),
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

/// Where the Node relays live (`npm ci` there installs their two dependencies, `pg` and `knex`).
pub const NODE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/node");

/// Why the Node relays cannot run here, if they cannot: they need PostgreSQL, `node` on the `PATH` and
/// their packages installed.
pub fn node_unavailable(backend: DbBackend) -> Option<String> {
    if backend != DbBackend::Postgres {
        return Some("the seeds' Node relays are written for PostgreSQL".into());
    }
    match std::process::Command::new("node").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        _ => return Some("`node` is not on the PATH".into()),
    }
    for package in ["pg", "knex"] {
        if !std::path::Path::new(NODE_DIR).join("node_modules").join(package).is_dir() {
            return Some(format!("the Node package {package} is not installed (run `npm ci` in {NODE_DIR})"));
        }
    }
    None
}

/// Drains `schema` of the PostgreSQL server at `url` with a seed's relay in a Node.js process.
pub async fn drain_in_node(
    base: Baseline,
    url: &str,
    schema: &str,
    batch: u32,
    budget: Duration,
) -> Result<crate::report::Run> {
    let which = match base {
        Baseline::Seed000Node => "seed000",
        Baseline::Seed001Node => "seed001",
        other => anyhow::bail!("{} is not a Node relay", other.name()),
    };
    let server = url.split_once('?').map_or(url, |(server, _)| server);
    let output = tokio::process::Command::new("node")
        .arg(format!("{NODE_DIR}/seed-relays.mjs"))
        .args([which.to_owned(), batch.to_string(), budget.as_secs().to_string()])
        .env("DATABASE_URL", server)
        .env("OUTBOX_BENCH_SCHEMA", schema)
        .output()
        .await
        .context("start node")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "{} failed ({}): {}{}",
        base.name(),
        output.status,
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(stdout.trim()).with_context(|| format!("read what {} printed: {stdout}", base.name()))?;
    Ok(crate::report::Run {
        done: report["done"].as_u64().context("done")?,
        secs: report["secs"].as_f64().context("secs")?,
        timed_out: report["timed_out"].as_bool().unwrap_or(false),
    })
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

/// The columns our relay's claim reads.
const OWN_COLUMNS: &str = "seq, event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
    schema_version, created_at_ms, attempts, last_error";

/// The ceiling's statement on `outbox_events` (PostgreSQL and SQLite; MySQL selects, then updates).
fn own_table_ceiling_sql(backend: DbBackend) -> String {
    match backend {
        DbBackend::Postgres => format!(
            "UPDATE outbox_events SET published_at_ms = $1 WHERE seq = ANY(ARRAY(SELECT seq FROM outbox_events \
             WHERE published_at_ms IS NULL ORDER BY aggregate_type, aggregate_id, aggregate_version \
             LIMIT $2 FOR UPDATE SKIP LOCKED)) \
             RETURNING {OWN_COLUMNS}, payload::text AS payload, headers::text AS headers"
        ),
        DbBackend::MySql => format!(
            "SELECT {OWN_COLUMNS}, CAST(payload AS CHAR) AS payload, CAST(headers AS CHAR) AS headers \
             FROM outbox_events FORCE INDEX (outbox_events_pending) WHERE published_at_ms IS NULL \
             ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED"
        ),
        _ => format!(
            "UPDATE outbox_events SET published_at_ms = ? WHERE seq IN (SELECT seq FROM outbox_events \
             INDEXED BY outbox_events_runs WHERE published_at_ms IS NULL ORDER BY aggregate_type, aggregate_id, aggregate_version LIMIT ?) \
             RETURNING {OWN_COLUMNS}, payload, headers"
        ),
    }
}

/// The plan the ceiling on our table was last checked to run (for the tables' notes).
pub static PINNED_PLAN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Checks the ceiling's plan on `db` (see [`pin_own_table_ceiling`]) and keeps it in [`PINNED_PLAN`].
pub async fn pin_and_keep(db: &DatabaseConnection, batch: u32) -> Result<()> {
    let plan = pin_own_table_ceiling(db, batch).await?;
    *PINNED_PLAN.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = plan;
    Ok(())
}

/// Checks that the ceiling on our table reads the pending rows through the table's index of pending rows,
/// in that index's order, without sorting them (PostgreSQL and SQLite: the partial `outbox_events_runs`;
/// MySQL: `outbox_events_pending`, whose `published_at_ms` prefix holds them in `seq` order) and returns
/// its plan, one line per row; fails with the plan otherwise.
pub async fn pin_own_table_ceiling(db: &DatabaseConnection, batch: u32) -> Result<Vec<String>> {
    let backend = db.get_database_backend();
    let explain = match backend {
        DbBackend::Sqlite => "EXPLAIN QUERY PLAN ",
        _ => "EXPLAIN ",
    };
    let values: Vec<Value> = match backend {
        DbBackend::MySql => vec![i64::from(batch).into()],
        _ => vec![0i64.into(), i64::from(batch).into()],
    };
    let sql = format!("{explain}{}", own_table_ceiling_sql(backend));
    let rows = db.query_all_raw(Statement::from_sql_and_values(backend, sql, values)).await?;
    let plan: Vec<String> = rows
        .iter()
        .map(|row| match backend {
            DbBackend::Postgres => row.try_get::<String>("", "QUERY PLAN").context("read the plan"),
            DbBackend::MySql => {
                let text = |c: &str| row.try_get::<Option<String>>("", c).ok().flatten().unwrap_or_default();
                Ok(format!("table={} type={} key={} extra={}", text("table"), text("type"), text("key"), text("Extra")))
            }
            _ => row.try_get::<String>("", "detail").context("read the plan"),
        })
        .collect::<Result<_>>()?;
    let text = plan.join("\n");
    let walks = text.contains(if backend == DbBackend::MySql { "outbox_events_pending" } else { "outbox_events_runs" });
    // PostgreSQL: `seq = ANY(ARRAY(…))` makes the update a primary-key lookup per claimed row, never a scan
    // of the table joined to the claimed ids.
    let sorts = ["Sort Key", "filesort", "TEMP B-TREE", "Seq Scan"].iter().any(|s| text.contains(s));
    anyhow::ensure!(
        walks && !sorts,
        "the ceiling on our table is not on its pinned plan (pending rows walked in seq order, no sort):\n{text}"
    );
    Ok(plan)
}

async fn own_table_ceiling_once(db: &DatabaseConnection, batch: u32) -> Result<u64> {
    let backend = db.get_database_backend();
    let now = chrono::Utc::now().timestamp_millis();
    let sql = own_table_ceiling_sql(backend);
    if backend == DbBackend::MySql {
        let txn = db.begin().await?;
        let rows = txn.query_all_raw(Statement::from_sql_and_values(backend, sql, [i64::from(batch).into()])).await?;
        for row in &rows {
            publish(row, "event_type")?;
        }
        let seqs = rows.iter().map(|r| r.try_get::<i64>("", "seq").context("read seq")).collect::<Result<Vec<_>>>()?;
        if !seqs.is_empty() {
            let list = seqs.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
            let update = format!("UPDATE outbox_events SET published_at_ms = {now} WHERE seq IN ({list})");
            txn.execute_unprepared(&update).await?;
        }
        txn.commit().await?;
        return Ok(rows.len() as u64);
    }
    let values: [Value; 2] = [now.into(), i64::from(batch).into()];
    let rows = db.query_all_raw(Statement::from_sql_and_values(backend, sql, values)).await?;
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

//! The run's own database (a fresh SQLite file, PostgreSQL schema or MariaDB database), its tables, and
//! reading the history back.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use outbox_seaorm::testkit::Recorded;
use outbox_seaorm::{EventId, redact_url};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, Value};

use crate::SoakError;

/// Where a run writes: connect with [`Target::connect`]; the relays get `url` and `schema` too.
#[derive(Clone, Debug)]
pub struct Target {
    /// The URL the run connects to (for MariaDB, the run's own database).
    pub url: String,
    /// PostgreSQL: the run's schema (the connections' search path).
    pub schema: Option<String>,
    /// What to remove at the end.
    cleanup: Cleanup,
}

#[derive(Clone, Debug)]
enum Cleanup {
    Directory(PathBuf),
    Nothing,
    Schema { admin_url: String, schema: String },
    Database { admin_url: String, database: String },
}

/// Connects to `url` (schema `schema` on PostgreSQL) with room for `connections`.
pub async fn connect(url: &str, schema: Option<&str>, connections: u32) -> Result<DatabaseConnection, SoakError> {
    let schema = schema.map(str::to_owned);
    let db = outbox_seaorm::connect_with(url, |options| {
        options
            .max_connections(connections)
            .min_connections(1)
            .connect_timeout(Duration::from_secs(5))
            .acquire_timeout(Duration::from_secs(30));
        if let Some(schema) = schema {
            options.set_schema_search_path(schema);
        }
    })
    .await?;
    Ok(db)
}

impl Target {
    /// A fresh place for run `run_id`: a temp SQLite file without a URL; a new schema or database on a
    /// server. An SQLite URL must name a file that does not exist yet (the tool never mixes histories).
    pub async fn create(url: Option<&str>, run_id: &str) -> Result<Target, SoakError> {
        let Some(url) = url.filter(|url| !url.is_empty()) else {
            let dir = std::env::temp_dir().join(format!("outbox-soak-{run_id}"));
            std::fs::create_dir_all(&dir)?;
            let url = format!("sqlite://{}?mode=rwc", dir.join("soak.db").display());
            return Ok(Target { url, schema: None, cleanup: Cleanup::Directory(dir) });
        };
        let scheme = url.split_once(':').map(|(scheme, _)| scheme.to_ascii_lowercase()).unwrap_or_default();
        match scheme.as_str() {
            "sqlite" => {
                let path = url.trim_start_matches("sqlite:").trim_start_matches("//");
                let path = path.split('?').next().unwrap_or(path);
                if std::path::Path::new(path).exists() {
                    return Err(SoakError::Usage(format!(
                        "--database-url {url}: {path} exists; the soak writes a fresh database, name a new file"
                    )));
                }
                let url = if url.contains('?') { url.to_owned() } else { format!("{url}?mode=rwc") };
                Ok(Target { url, schema: None, cleanup: Cleanup::Nothing })
            }
            "postgres" | "postgresql" => {
                let schema = format!("soak_{run_id}");
                let admin = connect(url, None, 1).await?;
                admin
                    .execute_unprepared(&format!("CREATE SCHEMA {schema}"))
                    .await
                    .map_err(SoakError::db(format!("create schema {schema} on {}", redact_url(url))))?;
                admin.close().await.ok();
                let cleanup = Cleanup::Schema { admin_url: url.to_owned(), schema: schema.clone() };
                Ok(Target { url: url.to_owned(), schema: Some(schema), cleanup })
            }
            "mysql" | "mariadb" => {
                let database = format!("soak_{run_id}");
                let admin = connect(url, None, 1).await?;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {database}"))
                    .await
                    .map_err(SoakError::db(format!("create database {database} on {}", redact_url(url))))?;
                admin.close().await.ok();
                let cleanup = Cleanup::Database { admin_url: url.to_owned(), database: database.clone() };
                Ok(Target { url: with_database(url, &database), schema: None, cleanup })
            }
            other => Err(SoakError::Usage(format!(
                "--database-url has scheme {other:?}; expected postgres, mysql, mariadb or sqlite"
            ))),
        }
    }

    /// Drops what [`create`](Self::create) made.
    pub async fn remove(&self) -> Result<(), SoakError> {
        match &self.cleanup {
            Cleanup::Nothing => {}
            Cleanup::Directory(dir) => std::fs::remove_dir_all(dir)?,
            Cleanup::Schema { admin_url, schema } => {
                let admin = connect(admin_url, None, 1).await?;
                admin
                    .execute_unprepared(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .await
                    .map_err(SoakError::db(format!("drop schema {schema}")))?;
            }
            Cleanup::Database { admin_url, database } => {
                let admin = connect(admin_url, None, 1).await?;
                admin
                    .execute_unprepared(&format!("DROP DATABASE IF EXISTS {database}"))
                    .await
                    .map_err(SoakError::db(format!("drop database {database}")))?;
            }
        }
        Ok(())
    }

    /// Where the run wrote, for the log (credentials redacted).
    pub fn describe(&self) -> String {
        match &self.cleanup {
            Cleanup::Schema { schema, .. } => format!("{} schema {schema}", redact_url(&self.url)),
            _ => redact_url(&self.url),
        }
    }
}

/// `url` with its database (path) replaced by `database`, query kept.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(base, query)| (base, Some(query)));
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..].find('/').map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{database}", &base[..path_start]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// The outbox tables and the soak's own: orders and their event ids (the business rows, committed with
/// the events), the broker log, deliveries, and applied effects (written with the inbox row).
pub async fn create_tables(db: &DatabaseConnection) -> Result<(), SoakError> {
    outbox_seaorm::migrate(db).await?;
    let backend = db.get_database_backend();
    let serial = match backend {
        DbBackend::Postgres => "BIGSERIAL PRIMARY KEY",
        DbBackend::MySql => "BIGINT AUTO_INCREMENT PRIMARY KEY",
        _ => "INTEGER PRIMARY KEY AUTOINCREMENT",
    };
    if backend == DbBackend::Sqlite {
        db.execute_unprepared("PRAGMA journal_mode=WAL").await.map_err(SoakError::db("switch SQLite to WAL"))?;
    }
    let tables = [
        "CREATE TABLE soak_orders (order_no BIGINT PRIMARY KEY, aggregate_id VARCHAR(64) NOT NULL, line_count INT NOT NULL)"
            .to_owned(),
        "CREATE TABLE soak_events (event_id VARCHAR(36) PRIMARY KEY, order_no BIGINT NOT NULL, aggregate_id VARCHAR(64) NOT NULL)"
            .to_owned(),
        format!(
            "CREATE TABLE soak_broker (id {serial}, event_id VARCHAR(36) NOT NULL, aggregate_id VARCHAR(64) NOT NULL, \
             aggregate_version BIGINT NOT NULL, lane INT NOT NULL, consumed INT NOT NULL DEFAULT 0)"
        ),
        "CREATE INDEX soak_broker_unconsumed ON soak_broker (consumed, lane, id)".to_owned(),
        format!("CREATE TABLE soak_deliveries (id {serial}, event_id VARCHAR(36) NOT NULL)"),
        format!(
            "CREATE TABLE soak_applied (id {serial}, event_id VARCHAR(36) NOT NULL, aggregate_id VARCHAR(64) NOT NULL, \
             aggregate_version BIGINT NOT NULL)"
        ),
    ];
    for sql in tables {
        db.execute_unprepared(&sql).await.map_err(SoakError::db(format!("create the soak tables: {sql}")))?;
    }
    Ok(())
}

/// One row count.
pub async fn count(db: &DatabaseConnection, sql: &str) -> Result<u64, SoakError> {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql.to_owned()))
        .await
        .map_err(SoakError::db(sql.to_owned()))?;
    let n: i64 = match row {
        Some(row) => row.try_get_by_index(0).map_err(SoakError::db(sql.to_owned()))?,
        None => 0,
    };
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Counts shown in progress lines and used to decide the drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Events committed.
    pub committed: u64,
    /// Effects applied.
    pub applied: u64,
    /// Outbox rows not yet published and not dead.
    pub unpublished: u64,
    /// Broker log rows not yet consumed (table broker).
    pub unconsumed: u64,
}

/// The counts of [`Progress`].
pub async fn progress(db: &DatabaseConnection) -> Result<Progress, SoakError> {
    Ok(Progress {
        committed: count(db, "SELECT COUNT(*) FROM soak_events").await?,
        applied: count(db, "SELECT COUNT(*) FROM soak_applied").await?,
        unpublished: count(
            db,
            "SELECT COUNT(*) FROM outbox_events WHERE published_at_ms IS NULL AND dead_at_ms IS NULL",
        )
        .await?,
        unconsumed: count(db, "SELECT COUNT(*) FROM soak_broker WHERE consumed = 0").await?,
    })
}

/// The whole history: committed events (with the version the outbox gave them), every delivery, and
/// every applied effect in the order they committed.
pub async fn read_history(db: &DatabaseConnection) -> Result<(Vec<Recorded>, Vec<EventId>, Vec<Recorded>), SoakError> {
    let backend = db.get_database_backend();
    let rows = |sql: &'static str| async move {
        db.query_all_raw(Statement::from_string(backend, sql)).await.map_err(SoakError::db(sql))
    };
    let id = |text: String| -> Result<EventId, SoakError> {
        text.parse().map_err(|e| SoakError::Usage(format!("a soak table holds a bad event id {text:?}: {e}")))
    };

    let mut versions: HashMap<String, i64> = HashMap::new();
    for row in rows("SELECT event_id, aggregate_version FROM outbox_events").await? {
        let event_id: String = row.try_get_by_index(0).map_err(SoakError::db("read outbox_events"))?;
        let version: i64 = row.try_get_by_index(1).map_err(SoakError::db("read outbox_events"))?;
        versions.insert(event_id, version);
    }
    let mut committed = Vec::new();
    for row in rows("SELECT event_id, aggregate_id FROM soak_events").await? {
        let event_id: String = row.try_get_by_index(0).map_err(SoakError::db("read soak_events"))?;
        let aggregate: String = row.try_get_by_index(1).map_err(SoakError::db("read soak_events"))?;
        let version = versions.get(&event_id).copied().unwrap_or(0);
        committed.push(Recorded { id: id(event_id)?, aggregate, version });
    }
    let mut delivered = Vec::new();
    for row in rows("SELECT event_id FROM soak_deliveries ORDER BY id").await? {
        let event_id: String = row.try_get_by_index(0).map_err(SoakError::db("read soak_deliveries"))?;
        delivered.push(id(event_id)?);
    }
    let mut applied = Vec::new();
    for row in rows("SELECT event_id, aggregate_id, aggregate_version FROM soak_applied ORDER BY id").await? {
        let event_id: String = row.try_get_by_index(0).map_err(SoakError::db("read soak_applied"))?;
        let aggregate: String = row.try_get_by_index(1).map_err(SoakError::db("read soak_applied"))?;
        let version: i64 = row.try_get_by_index(2).map_err(SoakError::db("read soak_applied"))?;
        applied.push(Recorded { id: id(event_id)?, aggregate, version });
    }
    Ok((committed, delivered, applied))
}

/// A statement with values bound, in the backend's placeholder style.
pub fn statement(backend: DbBackend, sql: &str, values: Vec<Value>) -> Statement {
    let sql = if backend == DbBackend::Postgres {
        let mut out = String::with_capacity(sql.len() + 8);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                out.push_str(&format!("${n}"));
            } else {
                out.push(c);
            }
        }
        out
    } else {
        sql.to_owned()
    };
    Statement::from_sql_and_values(backend, sql, values)
}

/// `(?, ?, …), (?, ?, …)`: `rows` groups of `columns` placeholders.
pub fn placeholders(rows: usize, columns: usize) -> String {
    let group = format!("({})", vec!["?"; columns].join(", "));
    vec![group; rows].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mysql_url_gets_the_runs_database_and_keeps_its_query() {
        assert_eq!(with_database("mysql://root@127.0.0.1:3306/test", "soak_1"), "mysql://root@127.0.0.1:3306/soak_1");
        assert_eq!(with_database("mysql://root@h/test?ssl-mode=disabled", "s"), "mysql://root@h/s?ssl-mode=disabled");
        assert_eq!(with_database("mysql://root@h", "s"), "mysql://root@h/s");
    }

    #[test]
    fn postgres_placeholders_are_numbered() {
        let sql = statement(DbBackend::Postgres, "INSERT INTO t VALUES (?, ?)", vec![1.into(), 2.into()]).sql;
        assert_eq!(sql, "INSERT INTO t VALUES ($1, $2)");
        assert_eq!(placeholders(2, 2), "(?, ?), (?, ?)");
    }
}

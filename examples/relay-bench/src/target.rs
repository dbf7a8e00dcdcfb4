//! Which database the bench may touch, and how it gets a clean one.
//!
//! The bench drops and recreates its schema (PostgreSQL) or database (MySQL/MariaDB, SQLite file) before
//! every run, so it refuses any target whose name does not contain `bench`: an app's data is never one
//! typo away.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend};

/// The variable that names the bench database (never `DATABASE_URL`, which apps use).
pub const URL_VAR: &str = "OUTBOX_BENCH_URL";

/// The default PostgreSQL target: database `test`, schema `outbox_bench`.
pub const DEFAULT_PG: &str = "postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3Doutbox_bench";
/// The default MySQL/MariaDB target: database `outbox_bench`.
pub const DEFAULT_MYSQL: &str = "mysql://root@127.0.0.1:3306/outbox_bench";

/// A checked bench target.
#[derive(Clone, Debug)]
pub struct Target {
    /// The URL the outbox and the baselines connect to.
    pub url: String,
    /// Which database engine.
    pub backend: DbBackend,
    /// The schema (PostgreSQL), database (MySQL) or file (SQLite) that is dropped and recreated.
    name: String,
}

impl Target {
    /// Checks `url` and returns the target, or a refusal that says why.
    pub fn parse(url: &str) -> Result<Target> {
        let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
        let (backend, name) = match scheme.as_str() {
            "postgres" | "postgresql" => (DbBackend::Postgres, pg_schema(url)?),
            "mysql" | "mariadb" => (DbBackend::MySql, mysql_database(url)?),
            "sqlite" => (DbBackend::Sqlite, sqlite_file(url)?),
            other => bail!("{URL_VAR}: unsupported scheme {other:?}; expected postgres, mysql, mariadb or sqlite"),
        };
        let leaf = name.rsplit('/').next().unwrap_or(&name);
        if !leaf.to_ascii_lowercase().contains("bench") {
            bail!(
                "refusing {}: the bench drops and recreates its {} {leaf:?}, whose name does not contain \
                 \"bench\"; point {URL_VAR} at a bench {}",
                redact(url),
                kind(backend),
                kind(backend)
            );
        }
        Ok(Target { url: url.to_owned(), backend, name })
    }

    /// The default target of `backend` (`pg`, `mysql` or `sqlite`).
    pub fn default_for(backend: &str) -> Result<Target> {
        match backend {
            "pg" => Target::parse(DEFAULT_PG),
            "mysql" => Target::parse(DEFAULT_MYSQL),
            "sqlite" => {
                let file = target_dir()?.join("outbox_bench.sqlite");
                Target::parse(&format!("sqlite://{}?mode=rwc", file.display()))
            }
            other => bail!("unknown backend {other:?}; expected pg, mysql, sqlite or all"),
        }
    }

    /// The bench schema (PostgreSQL), database (MySQL) or file (SQLite).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A short label for tables: `PostgreSQL`, `MySQL` or `SQLite`.
    pub fn label(&self) -> &'static str {
        match self.backend {
            DbBackend::Postgres => "PostgreSQL",
            DbBackend::MySql => "MySQL",
            _ => "SQLite",
        }
    }

    /// Drops and recreates the bench schema/database, runs the outbox migrations there, and returns a new
    /// connection to it.
    pub async fn fresh(&self) -> Result<DatabaseConnection> {
        match self.backend {
            DbBackend::Postgres => {
                let admin = self.connect().await?;
                let sql = format!("DROP SCHEMA IF EXISTS {0} CASCADE; CREATE SCHEMA {0}", self.name);
                admin.execute_unprepared(&sql).await.with_context(|| format!("recreate schema {}", self.name))?;
                admin.close().await.context("close the admin connection")?;
            }
            DbBackend::MySql => {
                let server = self.url.split_once('?').map_or(self.url.as_str(), |(u, _)| u);
                let server = &server[..server.len() - self.name.len()];
                let admin = outbox_seaorm::connect(server)
                    .await
                    .with_context(|| format!("connect to the MySQL server {}", redact(server)))?;
                let sql = format!("DROP DATABASE IF EXISTS {0}", self.name);
                admin.execute_unprepared(&sql).await.with_context(|| format!("drop database {}", self.name))?;
                let sql = format!("CREATE DATABASE {0}", self.name);
                admin.execute_unprepared(&sql).await.with_context(|| format!("create database {}", self.name))?;
                admin.close().await.context("close the admin connection")?;
            }
            _ => {
                for suffix in ["", "-wal", "-shm"] {
                    let file = format!("{}{suffix}", self.name);
                    match std::fs::remove_file(&file) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e).with_context(|| format!("remove {file}")),
                    }
                }
            }
        }
        let db = self.connect().await?;
        outbox_seaorm::migrate(&db).await.with_context(|| format!("migrate the {} bench", self.label()))?;
        if let Ok(statements) = std::env::var("OUTBOX_BENCH_AFTER_MIGRATE") {
            // A/B of a schema change against the same binary: e.g. the schema without a migration's work.
            for sql in statements.split(';').map(str::trim).filter(|sql| !sql.is_empty()) {
                db.execute_unprepared(sql).await.with_context(|| format!("OUTBOX_BENCH_AFTER_MIGRATE: {sql}"))?;
            }
        }
        Ok(db)
    }

    /// A new pool on the target (no reset).
    pub async fn connect(&self) -> Result<DatabaseConnection> {
        outbox_seaorm::connect(&self.url).await.with_context(|| format!("connect to {}", redact(&self.url)))
    }

    /// A connection whose plans avoid table scans and sorts where an index serves (PostgreSQL, which has
    /// no index hints: `enable_seqscan` and `enable_sort` off for its sessions): for the ceiling whose plan
    /// is pinned, which a small table would otherwise plan as a scan and a sort.
    pub async fn connect_pinned(&self) -> Result<DatabaseConnection> {
        if self.backend != DbBackend::Postgres {
            return self.connect().await;
        }
        let settings = "-c%20enable_seqscan%3Doff%20-c%20enable_sort%3Doff";
        let url = if self.url.contains("options=") {
            self.url.replacen("options=", &format!("options={settings}%20"), 1)
        } else {
            format!("{}{}options={settings}", self.url, if self.url.contains('?') { '&' } else { '?' })
        };
        outbox_seaorm::connect(&url).await.with_context(|| format!("connect to {}", redact(&url)))
    }

    /// Runs `ANALYZE` over every table of the bench schema/database (PostgreSQL: `VACUUM ANALYZE`), naming
    /// the tables from the catalog so the bench never hard-codes the store's tables.
    pub async fn vacuum_analyze(&self, db: &DatabaseConnection) -> Result<()> {
        let (list, each): (String, fn(&str) -> String) = match self.backend {
            DbBackend::Postgres => {
                (format!("SELECT tablename AS t FROM pg_tables WHERE schemaname = '{}'", self.name), |t| {
                    format!("VACUUM ANALYZE {t}")
                })
            }
            DbBackend::MySql => (
                format!("SELECT table_name AS t FROM information_schema.tables WHERE table_schema = '{}'", self.name),
                |t| format!("ANALYZE TABLE {t}"),
            ),
            _ => ("SELECT 'all' AS t".to_owned(), |_| "ANALYZE".to_owned()),
        };
        let rows =
            db.query_all_raw(sea_orm::Statement::from_string(self.backend, list)).await.context("list tables")?;
        for row in rows {
            let table: String = row.try_get("", "t").context("read a table name")?;
            db.execute_unprepared(&each(&table)).await.with_context(|| format!("analyze {table}"))?;
        }
        Ok(())
    }
}

fn kind(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "schema (search_path)",
        DbBackend::MySql => "database",
        _ => "database file",
    }
}

/// The first schema of the `search_path` in the URL's `options`; every listed schema must be a bench one.
fn pg_schema(url: &str) -> Result<String> {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
    let options = query.split('&').find_map(|kv| kv.strip_prefix("options=")).map(percent_decode).unwrap_or_default();
    let Some(path) = options.split("search_path=").nth(1) else {
        bail!(
            "refusing {}: no search_path in the URL, so the bench would work in `public`; add \
             ?options=-c%20search_path%3Doutbox_bench",
            redact(url)
        );
    };
    let path = path.split_whitespace().next().unwrap_or("");
    let schemas: Vec<&str> = path.split(',').map(str::trim).collect();
    for schema in &schemas {
        ident(schema, url)?;
        if !schema.to_ascii_lowercase().contains("bench") {
            bail!("refusing {}: search_path schema {schema:?} does not contain \"bench\"", redact(url));
        }
    }
    Ok(schemas[0].to_owned())
}

fn mysql_database(url: &str) -> Result<String> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or("");
    let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
    let db = rest.split_once('/').map(|(_, d)| d).unwrap_or("");
    if db.is_empty() {
        bail!("refusing {}: no database in the URL; use mysql://root@127.0.0.1:3306/outbox_bench", redact(url));
    }
    ident(db, url)?;
    Ok(db.to_owned())
}

fn sqlite_file(url: &str) -> Result<String> {
    let rest = url.strip_prefix("sqlite:").unwrap_or(url);
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let file = rest.split_once('?').map_or(rest, |(f, _)| f);
    if file.is_empty() || file.contains(":memory:") {
        bail!("refusing {}: the SQLite bench needs a file whose name contains \"bench\"", redact(url));
    }
    Ok(file.to_owned())
}

/// A schema or database name that can be spliced into DDL.
fn ident<'a>(name: &'a str, url: &str) -> Result<&'a str> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        bail!("refusing {}: {name:?} is not a plain identifier ([A-Za-z0-9_]+)", redact(url));
    }
    Ok(name)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The URL without its password.
pub fn redact(url: &str) -> String {
    outbox_seaorm::broker::redact_url(url)
}

/// `CARGO_TARGET_DIR` if set, else the directory two levels above the running binary (`target/release/x`).
fn target_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("locate the bench binary")?;
    exe.parent().and_then(|p| p.parent()).map(PathBuf::from).context("the bench binary has no target dir")
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn refuses_targets_without_bench() {
        assert!(Target::parse("postgres://postgres@127.0.0.1:5432/test").is_err());
        assert!(Target::parse("postgres://p@h/test?options=-c%20search_path%3Dpublic").is_err());
        assert!(Target::parse("postgres://p@h/test?options=-c%20search_path%3Doutbox_bench,public").is_err());
        assert!(Target::parse("mysql://root@h:3306/test").is_err());
        assert!(Target::parse("sqlite://target/app.db?mode=rwc").is_err());
        assert!(Target::parse(super::DEFAULT_PG).is_ok());
        assert!(Target::parse(super::DEFAULT_MYSQL).is_ok());
        assert!(Target::parse("sqlite://target/outbox_bench.sqlite?mode=rwc").is_ok());
    }
}

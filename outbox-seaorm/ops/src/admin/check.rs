//! Pre-flight checks for a relay or a deploy: the database answers, the outbox migrations are applied,
//! it is a writable primary, and its clock agrees with this host's.

use std::time::{Duration, Instant};

use chrono::Utc;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};
use serde::Serialize;

use outbox_seaorm::Result;
use outbox_seaorm::{backend_name, store_error};

/// What [`check`] compares against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckOptions {
    /// The largest difference between this host's clock and the database's that passes (default 2 s).
    /// The relay stamps retry times and leases with its host's clock, and several relay hosts must agree.
    pub max_clock_skew: Duration,
    /// The migration bookkeeping table; `None` (the default) looks in `outbox_seaorm_migrations` (what
    /// [`migrate`](outbox_seaorm::migrate) keeps), then in `seaql_migrations` (an app's own `Migrator`).
    pub migration_table: Option<String>,
    /// The log relay's slot (`outbox_seaorm::log`, PostgreSQL): when set, the checks also report
    /// `wal_level`, whether the slot exists, whether a relay reads it, its lag in bytes and how long the
    /// server has waited for its confirmation (feature `log-relay`).
    pub log_slot: Option<String>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { max_clock_skew: Duration::from_secs(2), migration_table: None, log_slot: None }
    }
}

/// One check's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `connection`, `migrations`, `primary` or `clock`.
    pub name: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// What was found, or what is wrong and what to do.
    pub detail: String,
}

/// Every check's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// `PostgreSQL`, `MySQL` or `SQLite`.
    pub backend: &'static str,
    /// Whether every check passed.
    pub ok: bool,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl CheckReport {
    /// The first failed check.
    pub fn first_failure(&self) -> Option<&Check> {
        self.checks.iter().find(|check| !check.ok)
    }
}

/// Runs every check; a failure is reported in the [`CheckReport`], not as an error. Once the connection
/// fails, nothing else is tried.
pub async fn check(db: &DatabaseConnection, options: &CheckOptions) -> CheckReport {
    let backend = db.get_database_backend();
    let mut checks = Vec::new();
    let started = Instant::now();
    let ping = db.ping().await;
    checks.push(match &ping {
        Ok(()) => Check { name: "connection", ok: true, detail: format!("answered in {:?}", started.elapsed()) },
        Err(e) => Check { name: "connection", ok: false, detail: format!("no answer: {e}") },
    });
    if ping.is_ok() {
        checks.push(match pending_migrations(db, options.migration_table.as_deref()).await {
            Ok(pending) if pending.is_empty() => {
                Check { name: "migrations", ok: true, detail: "every outbox migration is applied".to_owned() }
            }
            Ok(pending) => Check {
                name: "migrations",
                ok: false,
                detail: format!("{} not applied: {}; run `outbox migrate`", pending.len(), pending.join(", ")),
            },
            Err(e) => Check { name: "migrations", ok: false, detail: e.to_string() },
        });
        checks.push(match read_only_reason(db).await {
            Ok(None) => Check { name: "primary", ok: true, detail: "writable".to_owned() },
            Ok(Some(reason)) => Check {
                name: "primary",
                ok: false,
                detail: format!("the database is read-only ({reason}); the relay must write: point it at the primary"),
            },
            Err(e) => Check { name: "primary", ok: false, detail: e.to_string() },
        });
        checks.push(match clock_skew(db).await {
            Ok((skew_ms, uncertainty_ms)) => {
                let ok = skew_ms.unsigned_abs() <= options.max_clock_skew.as_millis() as u64;
                let mut detail =
                    format!("the database's clock is {skew_ms:+} ms from this host's (±{uncertainty_ms} ms)");
                if !ok {
                    detail.push_str(&format!(
                        ", more than {:?}: retry times and leases would be off; sync both clocks (NTP)",
                        options.max_clock_skew
                    ));
                }
                Check { name: "clock", ok, detail }
            }
            Err(e) => Check { name: "clock", ok: false, detail: e.to_string() },
        });
        if let Some(slot) = &options.log_slot {
            checks.extend(log_slot_checks(db, slot).await);
        }
    }
    let ok = checks.iter().all(|check| check.ok);
    CheckReport { backend: backend_name(backend), ok, checks }
}

/// The outbox migrations not recorded as applied, by name (empty when all are). Reads the bookkeeping
/// table `table`, or by default `outbox_seaorm_migrations`, then `seaql_migrations`.
pub async fn pending_migrations(db: &DatabaseConnection, table: Option<&str>) -> Result<Vec<String>> {
    let wanted: Vec<String> = super::MIGRATION_NAMES.iter().map(|name| (*name).to_owned()).collect();
    let tables: Vec<&str> = match table {
        Some(table) => vec![table],
        None => vec!["outbox_seaorm_migrations", "seaql_migrations"],
    };
    let mut best: Option<Vec<String>> = None;
    for table in tables {
        let Some(applied) = applied_versions(db, table).await? else { continue };
        let pending: Vec<String> = wanted.iter().filter(|name| !applied.contains(*name)).cloned().collect();
        if pending.is_empty() {
            return Ok(pending);
        }
        if best.as_ref().is_none_or(|best| pending.len() < best.len()) {
            best = Some(pending);
        }
    }
    Ok(best.unwrap_or(wanted))
}

/// The versions recorded in `table`; `None` when the table does not exist.
async fn applied_versions(db: &DatabaseConnection, table: &str) -> Result<Option<Vec<String>>> {
    use sea_orm::sea_query::{Alias, Query};
    let backend = db.get_database_backend();
    if !table_exists(db, table).await.map_err(|e| store_error("look for the migration table", "-", backend, e))? {
        return Ok(None);
    }
    let mut query = Query::select();
    query.column(Alias::new("version")).from(Alias::new(table));
    let rows = db.query_all(&query).await.map_err(|e| store_error("read applied migrations", "-", backend, e))?;
    let versions = rows
        .iter()
        .map(|row| row.try_get::<String>("", "version"))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| store_error("read applied migrations", "-", backend, e))?;
    Ok(Some(versions))
}

async fn table_exists(db: &DatabaseConnection, table: &str) -> std::result::Result<bool, DbErr> {
    let backend = db.get_database_backend();
    let (sql, values): (&str, Vec<sea_orm::Value>) = match backend {
        DbBackend::Postgres => ("SELECT to_regclass($1) IS NOT NULL AS found", vec![table.into()]),
        DbBackend::MySql => (
            "SELECT COUNT(*) > 0 AS found FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
            vec![table.into()],
        ),
        _ => ("SELECT COUNT(*) > 0 AS found FROM sqlite_master WHERE type = 'table' AND name = ?", vec![table.into()]),
    };
    let row = db.query_one_raw(Statement::from_sql_and_values(backend, sql, values)).await?;
    let Some(row) = row else { return Ok(false) };
    row.try_get::<bool>("", "found").or_else(|_| row.try_get::<i64>("", "found").map(|n| n > 0))
}

/// Why the database refuses writes, or `None` when it accepts them.
pub async fn read_only_reason(db: &DatabaseConnection) -> Result<Option<String>> {
    let backend = db.get_database_backend();
    let error = |e| store_error("check whether the database is read-only", "-", backend, e);
    match backend {
        DbBackend::Postgres => {
            let sql = "SELECT pg_is_in_recovery() AS recovery, current_setting('transaction_read_only') AS read_only, \
                       current_setting('default_transaction_read_only') AS default_read_only";
            let row = db.query_one_raw(Statement::from_string(backend, sql)).await.map_err(error)?;
            let Some(row) = row else { return Ok(None) };
            let recovery: bool = row.try_get("", "recovery").map_err(error)?;
            let read_only: String = row.try_get("", "read_only").map_err(error)?;
            let default_read_only: String = row.try_get("", "default_read_only").map_err(error)?;
            Ok(if recovery {
                Some("pg_is_in_recovery() is true: a standby replica".to_owned())
            } else if default_read_only == "on" {
                Some("default_transaction_read_only is on".to_owned())
            } else if read_only == "on" {
                Some("transaction_read_only is on".to_owned())
            } else {
                None
            })
        }
        DbBackend::MySql => {
            let sql = "SELECT CAST(@@global.read_only AS SIGNED) AS read_only";
            let row = db.query_one_raw(Statement::from_string(backend, sql)).await.map_err(error)?;
            let read_only = match row {
                Some(row) => row.try_get::<i64>("", "read_only").map_err(error)?,
                None => 0,
            };
            if read_only != 0 {
                return Ok(Some("@@read_only is on: a replica".to_owned()));
            }
            // `tx_read_only` on MariaDB, `transaction_read_only` on MySQL 8.
            for variable in ["transaction_read_only", "tx_read_only"] {
                let sql = format!("SELECT CAST(@@session.{variable} AS SIGNED) AS read_only");
                if let Ok(Some(row)) = db.query_one_raw(Statement::from_string(backend, sql)).await {
                    if row.try_get::<i64>("", "read_only").map_err(error)? != 0 {
                        return Ok(Some(format!("@@{variable} is on")));
                    }
                    break;
                }
            }
            Ok(None)
        }
        _ => {
            let row = db.query_one_raw(Statement::from_string(backend, "PRAGMA query_only")).await.map_err(error)?;
            let query_only = match row {
                Some(row) => row.try_get_by_index::<i64>(0).map_err(error)?,
                None => 0,
            };
            Ok((query_only != 0).then(|| "PRAGMA query_only is on".to_owned()))
        }
    }
}

/// The database's clock minus this host's, in ms, and the measurement's uncertainty (half the round trip).
pub async fn clock_skew(db: &DatabaseConnection) -> Result<(i64, i64)> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) AS now_ms",
        DbBackend::MySql => "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) AS now_ms",
        _ => "SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) AS now_ms",
    };
    let error = |e| store_error("read the database's clock", "-", backend, e);
    let before = Utc::now().timestamp_millis();
    let row = db.query_one_raw(Statement::from_string(backend, sql)).await.map_err(error)?;
    let after = Utc::now().timestamp_millis();
    let db_ms: i64 = match row {
        Some(row) => row.try_get("", "now_ms").map_err(error)?,
        None => return Ok((0, 0)),
    };
    let local = before + (after - before) / 2;
    Ok((db_ms - local, (after - before + 1) / 2))
}

/// `wal_level` and the log relay's slot.
#[cfg(feature = "log-relay")]
async fn log_slot_checks(db: &DatabaseConnection, slot: &str) -> Vec<Check> {
    if db.get_database_backend() != DbBackend::Postgres {
        return vec![Check { name: "log slot", ok: false, detail: "the log relay reads PostgreSQL's log only".into() }];
    }
    let wal_level = match db.query_one_raw(Statement::from_string(DbBackend::Postgres, "SHOW wal_level")).await {
        Ok(Some(row)) => row.try_get_by_index::<String>(0).unwrap_or_default(),
        Ok(None) => String::new(),
        Err(e) => return vec![Check { name: "wal_level", ok: false, detail: e.to_string() }],
    };
    let mut checks = vec![if wal_level == "logical" {
        Check { name: "wal_level", ok: true, detail: "logical".into() }
    } else {
        Check {
            name: "wal_level",
            ok: false,
            detail: format!("{wal_level}, not logical: ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL"),
        }
    }];
    checks.push(match outbox_seaorm::log::slot_state(db, slot).await {
        Ok(None) => Check {
            name: "log slot",
            ok: true,
            detail: format!("{slot}: none yet (`outbox relay --source log` creates it at its first start)"),
        },
        Ok(Some(state)) if state.is_lost() => Check {
            name: "log slot",
            ok: false,
            detail: format!(
                "{slot} is lost (the server removed WAL it needed); the next log relay recreates it and catches up \
                 from the table"
            ),
        },
        Ok(Some(state)) => {
            let waited = confirmation_wait(db, slot).await;
            Check {
                name: "log slot",
                ok: true,
                detail: format!(
                    "{slot}: {}, {} bytes behind, {} bytes of WAL held, confirmed position {}{}",
                    if state.streaming {
                        "read by a relay"
                    } else if state.active {
                        "held (being created)"
                    } else {
                        "no relay reads it"
                    },
                    state.lag_bytes.unwrap_or(0),
                    state.retained_bytes.unwrap_or(0),
                    state.confirmed_flush_lsn.as_deref().unwrap_or("-"),
                    waited.map(|w| format!(", the server waited {w} for it")).unwrap_or_default()
                ),
            }
        }
        Err(e) => Check { name: "log slot", ok: false, detail: e.to_string() },
    });
    checks
}

/// How long the server waited for the relay's last confirmation (`pg_stat_replication.flush_lag`), while
/// a relay reads the slot and lags.
#[cfg(feature = "log-relay")]
async fn confirmation_wait(db: &DatabaseConnection, slot: &str) -> Option<String> {
    let sql = "SELECT flush_lag::text FROM pg_stat_replication r JOIN pg_replication_slots s \
               ON s.active_pid = r.pid WHERE s.slot_name = $1";
    let row = db
        .query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, [slot.into()]))
        .await
        .ok()
        .flatten()?;
    row.try_get_by_index::<Option<String>>(0).ok().flatten()
}

#[cfg(not(feature = "log-relay"))]
async fn log_slot_checks(_db: &DatabaseConnection, slot: &str) -> Vec<Check> {
    vec![Check {
        name: "log slot",
        ok: false,
        detail: format!("{slot}: outbox-ops was built without its `log-relay` feature"),
    }]
}

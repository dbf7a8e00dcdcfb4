//! Shared helpers for the integration tests: each test gets its own database on every backend.
//!
//! - PostgreSQL: a schema named after the test (`OUTBOX_TEST_POSTGRES_URL`, default
//!   `postgres://postgres@127.0.0.1:5432/test`).
//! - MySQL/MariaDB: a database named after the test (`OUTBOX_TEST_MYSQL_URL`, default
//!   `mysql://root@127.0.0.1:3306/test`).
//! - SQLite: a file named after the test under the system temp directory.
//!
//! A server that does not answer is skipped with a printed reason, except under `CI=true`, where the test
//! fails.

pub mod contract;
pub mod proxy;

use std::fmt;

use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend};

/// One backend's database, fresh for one test.
pub struct TestDb {
    /// The connection, migrated.
    pub db: DatabaseConnection,
    /// Which backend.
    pub backend: DbBackend,
    /// The URL the connection was opened with (for a second pool).
    pub url: String,
}

impl fmt::Display for TestDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.backend {
            DbBackend::Postgres => "PostgreSQL",
            DbBackend::MySql => "MySQL",
            _ => "SQLite",
        })
    }
}

impl TestDb {
    /// Opens the database of a [`TestDb`] whose [`TestDb::url`] another process handed over (a child
    /// process in a crash test).
    pub async fn open(url: &str) -> TestDb {
        let backend = match url.split(':').next() {
            Some("postgres" | "postgresql") => DbBackend::Postgres,
            Some("mysql" | "mariadb") => DbBackend::MySql,
            _ => DbBackend::Sqlite,
        };
        let schema = url.rsplit('#').next().unwrap_or_default().to_owned();
        let db = connect(url, backend, &schema).await.expect("open the test database");
        TestDb { db, backend, url: url.to_owned() }
    }

    /// Opens another pool on the same database (a second relay process, say).
    pub async fn reconnect(&self) -> DatabaseConnection {
        connect(&self.url, self.backend, &self.schema()).await.expect("reconnect")
    }

    /// A second fresh, migrated database on the same server (another schema, database or file): for tests
    /// of what must never cross from one database to another.
    pub async fn another(&self, tag: &str) -> TestDb {
        let t = self.empty(tag).await;
        outbox_seaorm::migrate(&t.db).await.unwrap_or_else(|e| panic!("migrate {t}: {e}"));
        t
    }

    /// A second fresh database on the same server, not migrated: for tests of the migrations themselves.
    pub async fn empty(&self, tag: &str) -> TestDb {
        match self.backend {
            DbBackend::Postgres => postgres(tag).await.unwrap_or_else(|e| panic!("{e}")),
            DbBackend::MySql => mysql(tag).await.unwrap_or_else(|e| panic!("{e}")),
            _ => sqlite(tag).await,
        }
    }

    fn schema(&self) -> String {
        self.url.rsplit('#').next().unwrap_or_default().to_owned()
    }
}

/// A suffix unique to this test process, so two runs on one machine never drop each other's schemas,
/// databases or files: the process id and the start time in seconds (leftovers of runs older than a day
/// are dropped by [`sweep_postgres`]).
pub fn run_suffix() -> &'static str {
    static SUFFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SUFFIX.get_or_init(|| {
        let secs =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
        format!("{secs}_{}", std::process::id())
    })
}

/// The one database of tests that are about something else (brokers): PostgreSQL when it answers (always
/// under `CI=true`), SQLite otherwise; migrated.
pub async fn primary_backend(test: &str) -> TestDb {
    let t = match postgres(test).await {
        Ok(t) => t,
        Err(reason) if in_ci() => panic!("CI=true but {reason}"),
        Err(reason) => {
            eprintln!("using SQLite: {reason}");
            sqlite(test).await
        }
    };
    outbox_seaorm::migrate(&t.db).await.unwrap_or_else(|e| panic!("migrate {t}: {e}"));
    t
}

/// Rows in `inbox_messages` for `consumer`.
pub async fn count_inbox(t: &TestDb, consumer: &str) -> u64 {
    use outbox_seaorm::entity::inbox_message;
    use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
    inbox_message::Entity::find()
        .filter(inbox_message::Column::Consumer.eq(consumer))
        .count(&t.db)
        .await
        .unwrap_or_else(|e| panic!("{t}: count inbox rows: {e}"))
}

/// The outbox row of event `id`.
pub async fn outbox_row(t: &TestDb, id: outbox_seaorm::EventId) -> outbox_seaorm::entity::outbox_event::Model {
    use outbox_seaorm::entity::outbox_event;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    outbox_event::Entity::find()
        .filter(outbox_event::Column::EventId.eq(id.to_string()))
        .one(&t.db)
        .await
        .unwrap_or_else(|e| panic!("{t}: read outbox row {id}: {e}"))
        .unwrap_or_else(|| panic!("{t}: no outbox row for {id}"))
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

async fn connect(url: &str, backend: DbBackend, schema: &str) -> Result<DatabaseConnection, sea_orm::DbErr> {
    let base = url.split('#').next().unwrap_or(url).to_owned();
    let mut options = ConnectOptions::new(base);
    // An unreachable server fails within 2 s instead of sqlx's 30 s default.
    options
        .sqlx_logging(false)
        .max_connections(8)
        .connect_timeout(std::time::Duration::from_secs(2))
        .acquire_timeout(std::time::Duration::from_secs(10));
    if backend == DbBackend::Postgres {
        options.set_schema_search_path(schema.to_owned());
    }
    Database::connect(options).await
}

/// A database backend a generated test runs on (see [`per_backend!`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// An SQLite file under the system temp directory.
    Sqlite,
    /// A schema on the PostgreSQL server.
    Postgres,
    /// A database on the MySQL/MariaDB server.
    MySql,
}

/// Runs `test` on a fresh, migrated database of `backend` named after `tag`; when the server does not
/// answer, prints why and returns (under `CI=true` it panics instead).
pub async fn run_on<F, Fut>(backend: Backend, tag: &str, test: F)
where
    F: FnOnce(TestDb) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let t = match backend {
        Backend::Sqlite => Ok(sqlite(tag).await),
        Backend::Postgres => postgres(tag).await,
        Backend::MySql => mysql(tag).await,
    };
    let t = match t {
        Ok(t) => t,
        Err(reason) if in_ci() => panic!("CI=true but {reason}"),
        Err(reason) => {
            eprintln!("skipping: {reason}");
            return;
        }
    };
    outbox_seaorm::migrate(&t.db).await.unwrap_or_else(|e| panic!("migrate {t}: {e}"));
    test(t).await;
}

/// One `#[tokio::test]` per backend for `async fn $name(t: TestDb)`: `$name::sqlite`, `$name::postgres` and
/// `$name::mysql`, so a failure on one backend never hides the result of another. `$tag` names the
/// test's schema, database or file (plus a per-run suffix).
#[macro_export]
macro_rules! per_backend {
    ($name:ident, $tag:literal) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                $crate::run_on($crate::Backend::Sqlite, $tag, super::$name).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $crate::run_on($crate::Backend::Postgres, $tag, super::$name).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                $crate::run_on($crate::Backend::MySql, $tag, super::$name).await;
            }
        }
    };
}

/// A fresh, migrated database for `test` on every reachable backend.
pub async fn all_backends(test: &str) -> Vec<TestDb> {
    let mut dbs = vec![sqlite(test).await];
    for result in [postgres(test).await, mysql(test).await] {
        match result {
            Ok(db) => dbs.push(db),
            Err(reason) if in_ci() => panic!("CI=true but {reason}"),
            Err(reason) => eprintln!("skipping: {reason}"),
        }
    }
    for t in &dbs {
        outbox_seaorm::migrate(&t.db).await.unwrap_or_else(|e| panic!("migrate {t}: {e}"));
    }
    dbs
}

/// Panics when a test of this process already made the database at `place`: the integration tests share one
/// process (`tests/tests/suite`), so two tests naming their database alike would otherwise share it and
/// read each other's rows.
fn claim(place: String) {
    static MADE: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut made = MADE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    assert!(
        made.insert(place.clone()),
        "two tests of this process name their database alike: {place}; give one another tag"
    );
}

/// `t_<test>_<run suffix>`, at most 63 bytes: PostgreSQL cuts longer identifiers silently (and MariaDB
/// refuses names over 64), which would give two long tags one schema; a long tag keeps its first bytes and a
/// hash of the whole.
fn database_name(test: &str) -> String {
    use std::hash::{Hash, Hasher};
    const MAX: usize = 63;
    let name = format!("t_{test}_{}", run_suffix());
    if name.len() <= MAX {
        return name;
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    test.hash(&mut hasher);
    let keep = MAX.saturating_sub("t_".len() + 8 + "_".len() + run_suffix().len());
    let start = test.get(..keep).unwrap_or(test);
    format!("t_{start}{:08x}_{}", hasher.finish() as u32, run_suffix())
}

async fn sqlite(test: &str) -> TestDb {
    let dir = std::env::temp_dir().join("outbox-tests");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{test}_{}.db", run_suffix()));
    claim(path.display().to_string());
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let db = outbox_seaorm::connect(&url).await.expect("sqlite");
    TestDb { db, backend: DbBackend::Sqlite, url }
}

async fn postgres(test: &str) -> Result<TestDb, String> {
    let url = std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    postgres_at(&url, test).await
}

async fn postgres_at(url: &str, test: &str) -> Result<TestDb, String> {
    let url = url.to_owned();
    let admin = connect(&url, DbBackend::Postgres, "public")
        .await
        .map_err(|e| format!("PostgreSQL at {url} is unreachable: {e}"))?;
    sweep_postgres(&admin).await;
    let schema = database_name(test);
    claim(format!("{url}#{schema}"));
    admin
        .execute_unprepared(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))
        .await
        .map_err(|e| format!("PostgreSQL: cannot create schema {schema}: {e}"))?;
    admin.close().await.ok();
    let url = format!("{url}#{schema}");
    let db = connect(&url, DbBackend::Postgres, &schema).await.map_err(|e| e.to_string())?;
    Ok(TestDb { db, backend: DbBackend::Postgres, url })
}

/// Drops the schemas of test runs that started more than a day ago (`t_<test>_<secs>_<pid>`).
async fn sweep_postgres(admin: &DatabaseConnection) {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
    let sql = "SELECT nspname FROM pg_namespace WHERE nspname LIKE 't\\_%'";
    let Ok(rows) = admin.query_all_raw(sea_orm::Statement::from_string(DbBackend::Postgres, sql)).await else { return };
    for row in rows {
        let Ok(name) = row.try_get::<String>("", "nspname") else { continue };
        let mut parts = name.rsplitn(3, '_');
        let (_pid, secs) = (parts.next(), parts.next().and_then(|s| s.parse::<u64>().ok()));
        if secs.is_some_and(|secs| secs + 86_400 < now) {
            let _ = admin.execute_unprepared(&format!("DROP SCHEMA IF EXISTS {name} CASCADE")).await;
        }
    }
}

/// A fresh, migrated schema for `test` on the PostgreSQL cluster with `wal_level = logical` that the log
/// relay's tests read (`OUTBOX_TEST_LOGICAL_URL`, default `postgres://postgres@127.0.0.1:5433/test`,
/// started by `.ci/pg-logical.sh`); `None`, with the reason printed, when it does not answer outside CI.
pub async fn logical(test: &str) -> Option<TestDb> {
    let url = std::env::var("OUTBOX_TEST_LOGICAL_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5433/test".to_owned());
    let t = match postgres_at(&url, test).await {
        Ok(t) => t,
        Err(reason) if in_ci() => panic!("CI=true but {reason} (start it with `bash .ci/pg-logical.sh start`)"),
        Err(reason) => {
            eprintln!("skipping: {reason} (start it with `bash .ci/pg-logical.sh start`)");
            return None;
        }
    };
    outbox_seaorm::migrate(&t.db).await.unwrap_or_else(|e| panic!("migrate {t}: {e}"));
    Some(t)
}

async fn mysql(test: &str) -> Result<TestDb, String> {
    let url = std::env::var("OUTBOX_TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let admin = connect(&url, DbBackend::MySql, "").await.map_err(|e| format!("MySQL at {url} is unreachable: {e}"))?;
    let database = database_name(test);
    claim(format!("{url}/{database}"));
    for sql in [format!("DROP DATABASE IF EXISTS {database}"), format!("CREATE DATABASE {database}")] {
        admin.execute_unprepared(&sql).await.map_err(|e| format!("MySQL: {sql}: {e}"))?;
    }
    admin.close().await.ok();
    let base = url.rsplit_once('/').map(|(base, _)| base).unwrap_or(&url);
    let url = format!("{base}/{database}");
    let db = connect(&url, DbBackend::MySql, "").await.map_err(|e| e.to_string())?;
    Ok(TestDb { db, backend: DbBackend::MySql, url })
}

/// Sends the library's logs to the test output when `OUTBOX_TEST_LOG` holds a filter
/// (`OUTBOX_TEST_LOG=outbox_runtime=debug cargo test ...`); does nothing otherwise.
pub fn log_to_test_output() {
    if let Ok(filter) = std::env::var("OUTBOX_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// Two tests of one process that name their database alike are stopped at the second.
#[cfg(test)]
#[test]
fn a_second_database_of_one_name_in_one_process_is_refused() {
    claim("postgres://example/test#t_twice".to_owned());
    let second = std::panic::catch_unwind(|| claim("postgres://example/test#t_twice".to_owned()));
    assert!(second.is_err(), "the second claim of one name is refused");
    claim("postgres://example/test#t_once".to_owned());
}

/// Long tags get names the servers keep whole (63 bytes at most), and two long tags that start alike get
/// two names.
#[cfg(test)]
#[test]
fn long_tags_get_distinct_names_within_63_bytes() {
    let a = database_name("ct_rabbitmq_lag_counts_what_the_consumer_has_not_acknowledged");
    let b = database_name("ct_rabbitmq_lag_counts_what_the_consumer_has_not_acknowledged_twice");
    assert!(a.len() <= 63 && b.len() <= 63, "{a} / {b}");
    assert_ne!(a, b);
    assert!(a.ends_with(run_suffix()) && a.starts_with("t_ct_rabbitmq_lag"), "{a}");
    assert_eq!(database_name("relay"), format!("t_relay_{}", run_suffix()), "a short tag is kept as it is");
}

/// The library's own events (`contract`) are locked in `tests/events.lock` by its unit test, which links
/// all of them; a test binary links them only when it uses them.
#[cfg(test)]
#[test]
fn events_lock_matches_the_library_events() {
    outbox_seaorm::verify_events_lock_all(concat!(env!("CARGO_MANIFEST_DIR"), "/events.lock")).unwrap();
}

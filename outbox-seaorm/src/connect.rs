//! Opening a database for the outbox from a URL.

use std::time::Duration;

use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

use crate::error::{Error, Result};

/// How long [`connect`] waits for a connection before failing: a refused port or an unreachable host fails
/// in this time instead of sqlx's 30 s. SeaORM applies it as the pool's acquire timeout, so it also bounds
/// how long a query waits for a free pooled connection; raise it with [`connect_with`]
/// (`options.connect_timeout(..)`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The URL schemes this crate supports.
pub const SUPPORTED_SCHEMES: [&str; 5] = ["postgres", "postgresql", "mysql", "mariadb", "sqlite"];

/// Connects to `url` (`postgres://`, `mysql://`, `mariadb://` or `sqlite:`), rejecting other schemes with
/// a typed error before any connection is attempted. SQLite connections wait up to 10 s for the write lock
/// instead of failing with `database is locked`. A server that does not answer fails after
/// [`DEFAULT_CONNECT_TIMEOUT`].
///
/// The password never appears in an error or a log: it is handed to the driver apart from the URL (SeaORM
/// records the URL it is given in a trace-level span), and an error that repeats the URL shows it as
/// `***@host`.
pub async fn connect(url: &str) -> Result<DatabaseConnection> {
    connect_with(url, |_| {}).await
}

/// Like [`connect`], with SeaORM's pool options adjusted by `configure` before connecting (timeouts, pool
/// size, PostgreSQL schema). If `configure` maps the driver options itself
/// (`map_sqlx_postgres_opts`, `map_sqlx_mysql_opts`), it replaces the mapping that carries the URL's
/// password: set the password there too.
///
/// ```no_run
/// # async fn demo() -> outbox_seaorm::Result<()> {
/// use std::time::Duration;
/// let db = outbox_seaorm::connect_with("postgres://outbox@db/app", |options| {
///     options.acquire_timeout(Duration::from_secs(5)).set_schema_search_path("billing");
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn connect_with(url: &str, configure: impl FnOnce(&mut ConnectOptions)) -> Result<DatabaseConnection> {
    let scheme = url.split_once(':').map(|(scheme, _)| scheme.to_ascii_lowercase()).unwrap_or_default();
    if !SUPPORTED_SCHEMES.contains(&scheme.as_str()) {
        return Err(Error::invalid_config(
            "database_url",
            format!("has scheme {scheme:?}; expected one of {}", SUPPORTED_SCHEMES.join(", ")),
        ));
    }
    if let Some(feature) = missing_driver(&scheme) {
        return Err(Error::invalid_config(
            "database_url",
            format!("has scheme {scheme:?}, but outbox-seaorm was built without its `{feature}` feature; enable it"),
        ));
    }
    let raw = url;
    let url = if scheme == "mariadb" { format!("mysql{}", &url["mariadb".len()..]) } else { url.to_owned() };
    let (url_without_password, password) = split_password(&url);
    let mut options = ConnectOptions::new(url_without_password);
    options.sqlx_logging(false).connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    if let Some(password) = password {
        pass_password(&mut options, &scheme, password);
    }
    #[cfg(feature = "sqlx-sqlite")]
    if scheme == "sqlite" {
        options.map_sqlx_sqlite_opts(|opts| opts.busy_timeout(Duration::from_secs(10)));
    }
    configure(&mut options);
    Database::connect(options).await.map_err(|e| Error::Connect {
        url: outbox_runtime::text::redact_url(raw),
        backend: match scheme.as_str() {
            "postgres" | "postgresql" => "PostgreSQL",
            "sqlite" => "SQLite",
            _ => "MySQL",
        },
        source: Box::new(without_credentials(e, &[raw, &url])),
    })
}

/// `url` without the password of its user info, and the password, decoded.
fn split_password(url: &str) -> (String, Option<String>) {
    let (_, Some((_, Some(password)))) = outbox_runtime::text::split_credentials(url) else {
        return (url.to_owned(), None);
    };
    // `scheme://user:secret@host…` → `scheme://user@host…`; the user name keeps its own encoding.
    let Some((scheme, rest)) = url.split_once("://") else { return (url.to_owned(), None) };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let (Some(at), Some(colon)) = (authority.rfind('@'), authority.find(':')) else { return (url.to_owned(), None) };
    if colon > at {
        return (url.to_owned(), None);
    }
    (format!("{scheme}://{}{}", &rest[..colon], &rest[at..]), Some(password))
}

/// Gives the driver `password` through its own options, where no span or error shows it.
#[allow(unused_variables)]
fn pass_password(options: &mut ConnectOptions, scheme: &str, password: String) {
    match scheme {
        #[cfg(feature = "sqlx-postgres")]
        "postgres" | "postgresql" => {
            options.map_sqlx_postgres_opts(move |opts| opts.password(&password));
        }
        #[cfg(feature = "sqlx-mysql")]
        "mysql" | "mariadb" => {
            options.map_sqlx_mysql_opts(move |opts| opts.password(&password));
        }
        _ => {}
    }
}

/// `error` with any of `urls` in its text replaced by the URL without its credentials: SeaORM repeats a
/// connection string it cannot parse, password and all.
fn without_credentials(error: DbErr, urls: &[&str]) -> DbErr {
    let redact =
        |text: String| urls.iter().fold(text, |text, url| text.replace(url, &outbox_runtime::text::redact_url(url)));
    let leaks = |text: &str| urls.iter().any(|url| text.contains(url));
    match error {
        DbErr::Conn(inner) if leaks(&inner.to_string()) => {
            DbErr::Conn(sea_orm::RuntimeErr::Internal(redact(inner.to_string())))
        }
        error if leaks(&error.to_string()) => DbErr::Custom(redact(error.to_string())),
        error => error,
    }
}

/// The cargo feature `scheme` needs, when this build lacks it.
fn missing_driver(scheme: &str) -> Option<&'static str> {
    match scheme {
        "postgres" | "postgresql" if !cfg!(feature = "sqlx-postgres") => Some("sqlx-postgres"),
        "mysql" | "mariadb" if !cfg!(feature = "sqlx-mysql") => Some("sqlx-mysql"),
        "sqlite" if !cfg!(feature = "sqlx-sqlite") => Some("sqlx-sqlite"),
        _ => None,
    }
}

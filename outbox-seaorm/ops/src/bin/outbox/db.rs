//! Where the outbox lives: the database flags every subcommand shares, the connection, and the refusals
//! of a database that is not migrated or not writable.

use std::time::Duration;

use clap::Args;
use outbox_ops::admin;
use sea_orm::DatabaseConnection;

use crate::{CliError, duration};

/// Where the outbox lives.
#[derive(Args)]
pub struct DbArgs {
    /// The database: postgres://, mysql://, mariadb:// or sqlite: (never printed with its password).
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub url: Option<String>,
    /// PostgreSQL: the schema that holds the outbox tables (the connection's search_path).
    #[arg(long, env = "OUTBOX_SCHEMA", global = true, value_parser = parse_schema)]
    schema: Option<String>,
    /// How long to wait for a database connection.
    #[arg(long, env = "OUTBOX_CONNECT_TIMEOUT", default_value = "10s", value_parser = duration::parse, value_name = "DURATION", global = true)]
    connect_timeout: Duration,
}

/// A PostgreSQL schema name as the connection's `search_path` takes it: a plain identifier.
fn parse_schema(schema: &str) -> Result<String, String> {
    let plain = schema.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    match schema {
        "" => Err("is empty: name the schema that holds the outbox tables, or unset OUTBOX_SCHEMA to use the \
                   connection's default search_path"
            .to_owned()),
        _ if schema.len() > 63 => Err(format!("{schema:?} is longer than PostgreSQL's 63-byte identifiers")),
        _ if !plain => Err(format!(
            "{schema:?} is not a plain identifier (letters, digits, `_` or `$`, not starting with a digit)"
        )),
        _ => Ok(schema.to_owned()),
    }
}

pub async fn open(args: &DbArgs, pool_size: u32) -> Result<DatabaseConnection, CliError> {
    let Some(url) = &args.url else {
        return Err(CliError::Refused("no database: set DATABASE_URL or pass --database-url".to_owned()));
    };
    let (timeout, schema) = (args.connect_timeout, args.schema.clone());
    let db = outbox_seaorm::connect_with(url, move |options| {
        options.connect_timeout(timeout).acquire_timeout(timeout).max_connections(pool_size);
        if let Some(schema) = schema {
            options.set_schema_search_path(schema);
        }
    })
    .await?;
    Ok(db)
}

/// Refuses a database the outbox tables are not migrated in.
pub async fn migrated(db: &DatabaseConnection) -> Result<(), CliError> {
    let pending = admin::pending_migrations(db, None).await?;
    if pending.is_empty() {
        return Ok(());
    }
    Err(CliError::Refused(format!(
        "the outbox is not migrated in this database: {} migration(s) not applied ({}); run `outbox migrate`",
        pending.len(),
        pending.join(", ")
    )))
}

/// Refuses a read-only database (a replica) for a command that writes.
pub async fn ready_to_write_unmigrated(db: &DatabaseConnection) -> Result<(), CliError> {
    if let Some(reason) = admin::read_only_reason(db).await? {
        return Err(CliError::Refused(format!(
            "the database is read-only ({reason}): point DATABASE_URL at the primary"
        )));
    }
    Ok(())
}

pub async fn ready_to_write(db: &DatabaseConnection) -> Result<(), CliError> {
    ready_to_write_unmigrated(db).await?;
    migrated(db).await
}

//! What the log relay needs of the server before it reads a byte of the log, checked over an ordinary
//! connection: `wal_level = logical`, a role allowed to replicate, a publication of the outbox's inserts
//! (through the partition root when the outbox is partitioned), and a free slot. Each missing piece is a
//! [`SetupProblem`] that says what to run.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, Value};

use super::table::db_error;
use super::{LogError, LogRelayConfig};

/// One thing the server lacks for the log relay, with what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SetupProblem {
    /// The server does not write what logical decoding reads.
    #[error(
        "wal_level is `{found}`, not `logical`: run `ALTER SYSTEM SET wal_level = logical` and restart PostgreSQL \
         (managed services: the logical replication parameter, e.g. `rds.logical_replication = 1`)"
    )]
    WalLevel {
        /// The server's `wal_level`.
        found: String,
    },
    /// The relay's role may not open a replication connection.
    #[error("role `{role}` lacks the REPLICATION attribute: run `ALTER ROLE \"{role}\" WITH REPLICATION`")]
    NoReplicationRole {
        /// The connecting role.
        role: String,
    },
    /// Every replication slot is taken.
    #[error(
        "no free replication slot (max_replication_slots = {max}, all in use): drop an abandoned slot \
         (`SELECT slot_name, active FROM pg_replication_slots`) or raise max_replication_slots and restart"
    )]
    NoFreeSlot {
        /// The server's `max_replication_slots`.
        max: i64,
    },
    /// The publication the relay reads does not exist.
    #[error("publication `{name}` does not exist: run `{sql}` (or `outbox_seaorm::log::create_publication`)")]
    PublicationMissing {
        /// The publication's name.
        name: String,
        /// The statement that creates it.
        sql: String,
    },
    /// The publication exists but does not carry the outbox's inserts.
    #[error("publication `{name}` does not publish inserts into `{table}`: run `{sql}`")]
    PublicationDoesNotCover {
        /// The publication's name.
        name: String,
        /// The outbox table, schema-qualified.
        table: String,
        /// The statement that fixes it.
        sql: String,
    },
    /// The outbox is partitioned and the publication would name each partition instead of the outbox.
    #[error(
        "`{table}` is partitioned and publication `{name}` publishes each partition under its own name: run \
         `ALTER PUBLICATION \"{name}\" SET (publish_via_partition_root = true)`"
    )]
    PartitionsNotViaRoot {
        /// The publication's name.
        name: String,
        /// The outbox table, schema-qualified.
        table: String,
    },
    /// The slot exists for another plugin or database.
    #[error("replication slot `{slot}` is not a pgoutput slot of this database ({found}): pick another slot name")]
    ForeignSlot {
        /// The slot's name.
        slot: String,
        /// Its plugin and database.
        found: String,
    },
}

/// A slot as `pg_replication_slots` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SlotState {
    /// The slot's name.
    pub name: String,
    /// Whether a connection holds it now (a relay reading it, or the one creating it).
    pub active: bool,
    /// Whether a relay streams from it now (the holder is a replication connection): it has caught up
    /// and reads the log.
    pub streaming: bool,
    /// `reserved`, `extended`, `unreserved` or `lost` (`lost`: the server removed WAL it still needed).
    pub wal_status: Option<String>,
    /// Everything before this position is confirmed by the relay.
    pub confirmed_flush_lsn: Option<String>,
    /// WAL bytes the server keeps for the slot: the current position minus `restart_lsn`.
    pub retained_bytes: Option<i64>,
    /// Bytes between the current position and the confirmed one: what the relay has not confirmed yet.
    pub lag_bytes: Option<i64>,
}

impl SlotState {
    /// Whether the server can no longer stream from the slot.
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }
}

/// `CREATE PUBLICATION` for the outbox's inserts, through the partition root.
pub(super) fn create_publication_sql(name: &str) -> String {
    format!(
        "CREATE PUBLICATION \"{name}\" FOR TABLE outbox_events WITH (publish = 'insert', publish_via_partition_root = true)"
    )
}

/// Creates `config`'s publication of the outbox's inserts unless it exists. Needs a role that owns
/// `outbox_events` (or a superuser); run it from a migration or once by hand.
pub async fn create_publication(db: &DatabaseConnection, config: &LogRelayConfig) -> Result<(), LogError> {
    let name = config.publication();
    if publication(db, name).await?.is_some() {
        return Ok(());
    }
    execute(db, &create_publication_sql(name), "create the log relay's publication").await
}

/// Checks everything the relay needs that an ordinary connection can see; the slot itself is checked
/// (and created) when the relay starts.
pub async fn check(db: &DatabaseConnection, config: &LogRelayConfig) -> Result<(), LogError> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Err(LogError::Outbox(crate::Error::invalid_config(
            "database_url",
            "the log relay reads PostgreSQL's log; this database is not PostgreSQL",
        )));
    }
    let wal_level = text(db, "SHOW wal_level", vec![]).await?.unwrap_or_default();
    if wal_level != "logical" {
        return Err(SetupProblem::WalLevel { found: wal_level }.into());
    }
    let role = text(db, "SELECT current_user::text", vec![]).await?.unwrap_or_default();
    let may_replicate =
        text(db, "SELECT (rolreplication OR rolsuper)::text FROM pg_roles WHERE rolname = current_user", vec![])
            .await?;
    if may_replicate.as_deref() != Some("true") {
        return Err(SetupProblem::NoReplicationRole { role }.into());
    }
    let name = config.publication();
    let Some((inserts, via_root)) = publication(db, name).await? else {
        return Err(
            SetupProblem::PublicationMissing { name: name.to_owned(), sql: create_publication_sql(name) }.into()
        );
    };
    let schema = text(db, "SELECT current_schema()::text", vec![]).await?.unwrap_or_else(|| "public".into());
    let table = format!("{schema}.outbox_events");
    let covered = text(
        db,
        "SELECT 'yes' FROM pg_publication_tables WHERE pubname = $1 AND schemaname = current_schema() \
         AND tablename = 'outbox_events'",
        vec![name.into()],
    )
    .await?;
    let partitioned =
        text(db, "SELECT (c.relkind = 'p')::text FROM pg_class c WHERE c.oid = to_regclass('outbox_events')", vec![])
            .await?;
    if partitioned.as_deref() == Some("true") && !via_root {
        return Err(SetupProblem::PartitionsNotViaRoot { name: name.to_owned(), table }.into());
    }
    if covered.is_none() || !inserts {
        let sql = if covered.is_none() {
            format!("ALTER PUBLICATION \"{name}\" ADD TABLE outbox_events")
        } else {
            format!("ALTER PUBLICATION \"{name}\" SET (publish = 'insert')")
        };
        return Err(SetupProblem::PublicationDoesNotCover { name: name.to_owned(), table, sql }.into());
    }
    Ok(())
}

/// Whether `name` exists: `(publishes inserts, publishes via the partition root)`.
async fn publication(db: &DatabaseConnection, name: &str) -> Result<Option<(bool, bool)>, LogError> {
    let row = text(
        db,
        "SELECT pubinsert::text || ',' || pubviaroot::text FROM pg_publication WHERE pubname = $1",
        vec![name.into()],
    )
    .await?;
    Ok(row.map(|flags| (flags.starts_with("true"), flags.ends_with("true"))))
}

/// The slot's state, `None` when this database has no slot of that name.
pub async fn slot_state(db: &DatabaseConnection, slot: &str) -> Result<Option<SlotState>, LogError> {
    let sql = "SELECT slot_name::text AS name, active, wal_status::text AS wal_status, plugin::text AS plugin, \
               EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.active_pid \
               AND a.backend_type = 'walsender') AS streaming, \
               database::text AS database, current_database()::text AS here, \
               confirmed_flush_lsn::text AS confirmed, \
               pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained, \
               pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS lag \
               FROM pg_replication_slots s WHERE slot_name = $1";
    let row = db
        .query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, [Value::from(slot)]))
        .await
        .map_err(db_error("read the log relay's slot"))?;
    let Some(row) = row else { return Ok(None) };
    let get = |row: &sea_orm::QueryResult| -> Result<(SlotState, String, String, String), DbErr> {
        let plugin: Option<String> = row.try_get("", "plugin")?;
        let database: Option<String> = row.try_get("", "database")?;
        let here: String = row.try_get("", "here")?;
        Ok((
            SlotState {
                name: row.try_get("", "name")?,
                active: row.try_get("", "active")?,
                streaming: row.try_get("", "streaming")?,
                wal_status: row.try_get("", "wal_status")?,
                confirmed_flush_lsn: row.try_get("", "confirmed")?,
                retained_bytes: row.try_get("", "retained")?,
                lag_bytes: row.try_get("", "lag")?,
            },
            plugin.unwrap_or_default(),
            database.unwrap_or_default(),
            here,
        ))
    };
    let (state, plugin, database, here) = get(&row).map_err(db_error("read the log relay's slot"))?;
    if plugin != "pgoutput" || database != here {
        return Err(SetupProblem::ForeignSlot {
            slot: slot.to_owned(),
            found: format!("plugin `{plugin}`, database `{database}`"),
        }
        .into());
    }
    Ok(Some(state))
}

/// Creates the slot; the log holds everything committed after the position it returns.
pub(super) async fn create_slot(db: &DatabaseConnection, slot: &str) -> Result<(), LogError> {
    let sql = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
        [Value::from(slot)],
    );
    match db.query_one_raw(sql).await {
        Ok(_) => Ok(()),
        Err(error) if error.to_string().contains("already exists") => Ok(()),
        Err(error) if error.to_string().contains("all replication slots are in use") => {
            let max = text(db, "SELECT setting FROM pg_settings WHERE name = 'max_replication_slots'", vec![])
                .await?
                .and_then(|max| max.parse().ok())
                .unwrap_or_default();
            Err(SetupProblem::NoFreeSlot { max }.into())
        }
        Err(error) => Err(db_error("create the log relay's slot")(error)),
    }
}

/// Drops the slot (the server frees the WAL it kept); `false` when there was none.
pub async fn drop_slot(db: &DatabaseConnection, slot: &str) -> Result<bool, LogError> {
    if slot_state(db, slot).await?.is_none() {
        return Ok(false);
    }
    let sql =
        Statement::from_sql_and_values(DbBackend::Postgres, "SELECT pg_drop_replication_slot($1)", [Value::from(slot)]);
    db.execute_raw(sql).await.map_err(db_error("drop the log relay's slot"))?;
    Ok(true)
}

async fn text(db: &DatabaseConnection, sql: &str, values: Vec<Value>) -> Result<Option<String>, LogError> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values))
        .await
        .map_err(db_error("check the log relay's setup"))?;
    row.map(|row| row.try_get_by_index::<Option<String>>(0))
        .transpose()
        .map(Option::flatten)
        .map_err(db_error("check the log relay's setup"))
}

async fn execute(db: &DatabaseConnection, sql: &str, operation: &'static str) -> Result<(), LogError> {
    db.execute_unprepared(sql).await.map(drop).map_err(db_error(operation))
}

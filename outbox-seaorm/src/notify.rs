//! Cross-process wake-ups on PostgreSQL: LISTEN/NOTIFY, optional, with polling always behind it.
//!
//! The in-process wake-up ([`wake_relays`](outbox_runtime::wake_relays)) only reaches relays of the process that
//! committed. For relays in other processes (an `outbox relay` daemon, other replicas), PostgreSQL can
//! send a notification when outbox rows commit:
//!
//! - **The notify side is a trigger**, installed with [`install_notify_trigger`] (or the
//!   [`NotifyTriggerMigration`] in your own `Migrator`): `AFTER INSERT ON outbox_events FOR EACH
//!   STATEMENT` it calls `pg_notify(channel, '')`. A notification is delivered only when the inserting
//!   transaction commits, and PostgreSQL folds identical notifications of one transaction into one. The
//!   trigger needs no code in the app, no setting to forget in one of its services, and covers writers
//!   in other languages and hand-written `INSERT`s; removing it ([`remove_notify_trigger`]) turns the
//!   feature off for every writer at once. Nothing is notified unless you install it.
//! - **The listen side** is [`NotifyListener`] (feature `sqlx-postgres`): one connection of SeaORM's
//!   pool held in `LISTEN channel`, calling [`wake_relays`](outbox_runtime::wake_relays) on each notification.
//!   When the connection dies it reconnects with backoff (100 ms doubling to 30 s), and wakes the relays
//!   once after every reconnect, since notifications sent while it was away are lost.
//!
//! ## The cost
//! At commit, PostgreSQL queues the notification under one database-wide lock, held until the commit is
//! durable: transactions that notify commit one at a time and lose group commit. Measure with
//! `relay-bench --scenario commit_rate` before turning it on for a write-heavy app (BENCHMARKS.md has
//! the figures of this machine class). Relays in the writing process are woken without it, and a
//! [`CommitWatch`](crate::watch::CommitWatch) wakes relays in other processes without touching the
//! writers' commits, on every backend, for one cheap read every few milliseconds.
//!
//! ```no_run
//! # #[cfg(feature = "sqlx-postgres")]
//! # async fn demo(db: sea_orm::DatabaseConnection, publisher: outbox_seaorm::InMemoryPublisher) -> outbox_seaorm::Result<()> {
//! use outbox_seaorm::notify::{self, NotifyChannel};
//! use outbox_seaorm::{OutboxService, SeaOrmStore};
//!
//! let channel = NotifyChannel::default(); // `outbox_events`
//! notify::install_notify_trigger(&db, &channel).await?; // once, e.g. after `migrate`
//!
//! let store = SeaOrmStore::new(db);
//! let listener = store.notify_listener(channel)?;
//! let service = OutboxService::builder(store, publisher).with_task(move |stop| listener.run(stop)).start()?;
//! # Ok(()) }
//! ```

use std::fmt;

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionSession, TransactionTrait};

use crate::error::{Error, Result, store_error};

/// The channel used when none is given: `outbox_events`.
pub const DEFAULT_CHANNEL: &str = "outbox_events";

/// The trigger's name on `outbox_events`, and the name of the function it runs.
pub const TRIGGER_NAME: &str = "outbox_events_notify";

/// A NOTIFY channel name, checked to be a plain lower-case SQL identifier: `[a-z_][a-z0-9_]*`, at most 63
/// bytes (PostgreSQL's identifier length), so `LISTEN`, `pg_notify` and a trigger argument all name the
/// same channel without quoting surprises.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NotifyChannel(String);

impl NotifyChannel {
    /// Checks `name`; the error says what is wrong with it.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let bad = |why: &str| Err(Error::invalid_config("notify channel", format!("{name:?} {why}")));
        let mut chars = name.chars();
        match chars.next() {
            None => return bad("is empty"),
            Some(c) if !(c.is_ascii_lowercase() || c == '_') => {
                return bad("must start with a lower-case ASCII letter or `_`");
            }
            Some(_) => {}
        }
        if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            return bad("may hold only lower-case ASCII letters, digits and `_`");
        }
        if name.len() > 63 {
            return bad("is longer than PostgreSQL's 63-byte identifier limit");
        }
        Ok(NotifyChannel(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for NotifyChannel {
    fn default() -> Self {
        NotifyChannel(DEFAULT_CHANNEL.to_owned())
    }
}

impl fmt::Display for NotifyChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for NotifyChannel {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        NotifyChannel::new(s)
    }
}

fn require_postgres<C: ConnectionTrait>(db: &C, what: &'static str) -> Result<()> {
    match db.get_database_backend() {
        DbBackend::Postgres => Ok(()),
        other => Err(Error::invalid_config(
            what,
            format!("LISTEN/NOTIFY needs PostgreSQL, not {}", crate::error::backend_name(other)),
        )),
    }
}

/// The statements that install the trigger (the function is created in the first schema of the
/// connection's `search_path`, next to `outbox_events`).
pub(crate) fn install_statements(channel: &NotifyChannel) -> [String; 3] {
    [
        format!(
            "CREATE OR REPLACE FUNCTION {TRIGGER_NAME}() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN PERFORM pg_notify(TG_ARGV[0], ''); RETURN NULL; END $$"
        ),
        format!("DROP TRIGGER IF EXISTS {TRIGGER_NAME} ON outbox_events"),
        // The channel is a checked identifier, so quoting it as a literal is exact.
        format!(
            "CREATE TRIGGER {TRIGGER_NAME} AFTER INSERT ON outbox_events FOR EACH STATEMENT \
             EXECUTE FUNCTION {TRIGGER_NAME}('{channel}')"
        ),
    ]
}

/// The statements that remove it.
pub(crate) fn remove_statements() -> [String; 2] {
    [
        format!("DROP TRIGGER IF EXISTS {TRIGGER_NAME} ON outbox_events"),
        format!("DROP FUNCTION IF EXISTS {TRIGGER_NAME}()"),
    ]
}

/// Installs (or re-points) the statement-level trigger that notifies `channel` after each `INSERT` into
/// `outbox_events`, in one transaction. Idempotent; PostgreSQL only. Run [`migrate`](crate::migrate)
/// first.
pub async fn install_notify_trigger<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    channel: &NotifyChannel,
) -> Result<()> {
    require_postgres(db, "notify trigger")?;
    let error = |e| store_error("install the notify trigger", "outbox_events", DbBackend::Postgres, e);
    let txn = db.begin().await.map_err(error)?;
    for sql in install_statements(channel) {
        txn.execute_unprepared(&sql).await.map_err(error)?;
    }
    txn.commit().await.map_err(error)?;
    tracing::info!(%channel, "outbox notify trigger installed");
    Ok(())
}

/// Removes the trigger and its function: no writer notifies any more (relays still poll). Idempotent;
/// PostgreSQL only.
pub async fn remove_notify_trigger<C: ConnectionTrait + TransactionTrait>(db: &C) -> Result<()> {
    require_postgres(db, "notify trigger")?;
    let error = |e| store_error("remove the notify trigger", "outbox_events", DbBackend::Postgres, e);
    let txn = db.begin().await.map_err(error)?;
    for sql in remove_statements() {
        txn.execute_unprepared(&sql).await.map_err(error)?;
    }
    txn.commit().await.map_err(error)?;
    tracing::info!("outbox notify trigger removed");
    Ok(())
}

/// The channel the installed trigger notifies, or `None` when no trigger is installed on the
/// `outbox_events` the connection sees (always `None` on other backends).
pub async fn notify_trigger_channel<C: ConnectionTrait>(db: &C) -> Result<Option<String>> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(None);
    }
    let sql = format!(
        "SELECT replace(encode(tgargs, 'escape'), '\\000', '') AS args FROM pg_trigger \
         WHERE tgname = '{TRIGGER_NAME}' AND tgrelid = to_regclass('outbox_events')"
    );
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .map_err(|e| store_error("look for the notify trigger", "outbox_events", DbBackend::Postgres, e))?;
    let Some(row) = row else { return Ok(None) };
    let args: String = row
        .try_get("", "args")
        .map_err(|e| store_error("read the notify trigger", "outbox_events", DbBackend::Postgres, e))?;
    // `tgargs` holds each argument followed by a NUL byte (`\000` in the escape encoding).
    Ok(Some(args))
}

/// The notify trigger as a migration, for an app that adds the outbox migrations to its own `Migrator`:
/// `migrations.push(Box::new(NotifyTriggerMigration::default()))` after [`migrations()`](crate::migrations).
/// On other backends it does nothing.
#[cfg(feature = "migrations")]
#[derive(Clone, Debug, Default)]
pub struct NotifyTriggerMigration {
    /// The channel the trigger notifies.
    pub channel: NotifyChannel,
}

#[cfg(feature = "migrations")]
impl sea_orm_migration::MigrationName for NotifyTriggerMigration {
    fn name(&self) -> &str {
        "m20261220_000001_outbox_notify_trigger"
    }
}

#[cfg(feature = "migrations")]
#[sea_orm_migration::async_trait::async_trait]
impl sea_orm_migration::MigrationTrait for NotifyTriggerMigration {
    async fn up(&self, manager: &sea_orm_migration::SchemaManager) -> std::result::Result<(), sea_orm::DbErr> {
        let db = manager.get_connection();
        if db.get_database_backend() == DbBackend::Postgres {
            for sql in install_statements(&self.channel) {
                db.execute_unprepared(&sql).await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &sea_orm_migration::SchemaManager) -> std::result::Result<(), sea_orm::DbErr> {
        let db = manager.get_connection();
        if db.get_database_backend() == DbBackend::Postgres {
            for sql in remove_statements() {
                db.execute_unprepared(&sql).await?;
            }
        }
        Ok(())
    }
}

#[cfg(feature = "sqlx-postgres")]
pub use listener::{ListenerStats, ListenerStatsHandle, NotifyListener};

#[cfg(feature = "sqlx-postgres")]
mod listener {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    use sea_orm::DatabaseConnection;
    use sea_orm::sqlx::postgres::{PgListener, PgPool};

    use outbox_runtime::CancellationToken;

    use super::{NotifyChannel, require_postgres};
    use crate::error::Result;

    const FIRST_RETRY: Duration = Duration::from_millis(100);
    const MAX_RETRY: Duration = Duration::from_secs(30);

    #[derive(Debug, Default)]
    struct Counters {
        connected: AtomicBool,
        notifications: AtomicU64,
        connects: AtomicU64,
        lost: AtomicU64,
    }

    /// What a [`NotifyListener`] has seen so far (a snapshot from [`NotifyListener::stats`]'s handle).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct ListenerStats {
        /// Whether the `LISTEN` connection is up now.
        pub connected: bool,
        /// Notifications received (each wakes the relays of this process).
        pub notifications: u64,
        /// Successful `LISTEN`s: 1 after the start, one more per reconnect.
        pub connects: u64,
        /// Times the connection was lost or a connect failed.
        pub lost: u64,
    }

    /// Listens on a channel and wakes this process's relays on each notification (see the [module
    /// docs](super)). Build it with [`SeaOrmStore::notify_listener`](crate::SeaOrmStore::notify_listener)
    /// or [`NotifyListener::new`]; run it with [`NotifyListener::run`], e.g. as an
    /// [`OutboxService`](crate::OutboxService) task.
    #[derive(Debug)]
    pub struct NotifyListener {
        pool: PgPool,
        channel: NotifyChannel,
        counters: Arc<Counters>,
    }

    /// A handle that reads a [`NotifyListener`]'s figures while it runs.
    #[derive(Clone, Debug)]
    pub struct ListenerStatsHandle(Arc<Counters>);

    impl ListenerStatsHandle {
        /// The figures now.
        pub fn get(&self) -> ListenerStats {
            let c = &self.0;
            ListenerStats {
                connected: c.connected.load(Ordering::Relaxed),
                notifications: c.notifications.load(Ordering::Relaxed),
                connects: c.connects.load(Ordering::Relaxed),
                lost: c.lost.load(Ordering::Relaxed),
            }
        }
    }

    impl NotifyListener {
        /// A listener on `channel` over `db`'s pool (it holds one of the pool's connections while it
        /// runs: size the pool for it). Fails unless `db` is PostgreSQL.
        pub fn new(db: &DatabaseConnection, channel: NotifyChannel) -> Result<Self> {
            require_postgres(db, "notify listener")?;
            Ok(NotifyListener { pool: db.get_postgres_connection_pool().clone(), channel, counters: Arc::default() })
        }

        /// The channel.
        pub fn channel(&self) -> &NotifyChannel {
            &self.channel
        }

        /// A handle on the listener's figures, to keep before [`NotifyListener::run`] consumes it.
        pub fn stats(&self) -> ListenerStatsHandle {
            ListenerStatsHandle(self.counters.clone())
        }

        /// Listens until `shutdown` is cancelled. Never fails: a lost connection or a failed connect is
        /// logged and retried with backoff (100 ms doubling to 30 s) while the relays go on polling, and
        /// after each reconnect the relays are woken once for what was missed.
        pub async fn run(self, shutdown: CancellationToken) {
            let mut retry = FIRST_RETRY;
            loop {
                let connected = tokio::select! {
                    () = shutdown.cancelled() => break,
                    connected = self.connect() => connected,
                };
                match connected {
                    Ok(mut listener) => {
                        retry = FIRST_RETRY;
                        let connects = self.counters.connects.fetch_add(1, Ordering::Relaxed) + 1;
                        self.counters.connected.store(true, Ordering::Relaxed);
                        if connects == 1 {
                            tracing::info!(channel = %self.channel, "outbox notify listener listening");
                        } else {
                            tracing::info!(channel = %self.channel, connects, "outbox notify listener reconnected");
                        }
                        // Anything committed while no one listened: one pass finds it.
                        outbox_runtime::wake_relays();
                        let stopped = self.listen(&mut listener, &shutdown).await;
                        self.counters.connected.store(false, Ordering::Relaxed);
                        if stopped {
                            break;
                        }
                    }
                    Err(error) => {
                        self.counters.lost.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(channel = %self.channel, %error, retry_in = ?retry,
                            "outbox notify listener cannot LISTEN; relays keep polling");
                    }
                }
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(MAX_RETRY);
            }
            self.counters.connected.store(false, Ordering::Relaxed);
            tracing::debug!(channel = %self.channel, "outbox notify listener stopped");
        }

        async fn connect(&self) -> std::result::Result<PgListener, sea_orm::sqlx::Error> {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            // We reconnect ourselves, so that every reconnect is counted, logged and followed by a wake-up.
            listener.eager_reconnect(false);
            listener.listen(self.channel.as_str()).await?;
            Ok(listener)
        }

        /// Receives until the connection is lost (`false`) or `shutdown` is cancelled (`true`).
        async fn listen(&self, listener: &mut PgListener, shutdown: &CancellationToken) -> bool {
            loop {
                let received = tokio::select! {
                    () = shutdown.cancelled() => return true,
                    received = listener.try_recv() => received,
                };
                let reason = match received {
                    Ok(Some(_)) => {
                        self.counters.notifications.fetch_add(1, Ordering::Relaxed);
                        tracing::trace!(channel = %self.channel, "outbox notification; waking the relays");
                        outbox_runtime::wake_relays();
                        continue;
                    }
                    Ok(None) => "connection closed".to_owned(),
                    Err(error) => error.to_string(),
                };
                self.counters.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(channel = %self.channel, %reason,
                    "outbox notify listener lost its connection; reconnecting, relays keep polling");
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_is_a_plain_lower_case_identifier() {
        for good in ["outbox_events", "_x", "a1", &"a".repeat(63)] {
            NotifyChannel::new(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for (bad, why) in [
            ("", "is empty"),
            ("1a", "must start"),
            ("Outbox", "must start"),
            ("a-b", "may hold only"),
            ("a'; DROP TABLE x; --", "may hold only"),
            (&"a".repeat(64), "63-byte"),
        ] {
            let err = NotifyChannel::new(bad).expect_err(bad).to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}

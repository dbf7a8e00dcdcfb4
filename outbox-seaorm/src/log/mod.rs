//! The log relay: publishes the outbox's rows as PostgreSQL's logical replication delivers them, in
//! commit order, with no claim, no polling and no per-event round trip to the database. PostgreSQL only
//! (feature `log-relay`).
//!
//! The table stays the source of truth: writers insert rows as they do for the polling relay (plain-SQL
//! writers included), a publication carries those inserts to a replication slot, and the relay
//!
//! 1. reads each committed transaction whole, in commit order (`pgoutput`);
//! 2. publishes its events through the same [`Publisher`] as the polling relay
//!    (same envelope, headers, dedup id and trace context), a window of events per publish call, never two
//!    events of one aggregate in one call;
//! 3. records them published in the table in bulk, off the stream's path (one `UPDATE` per window);
//! 4. confirms to the server only the end of a transaction whose every event the broker confirmed and the
//!    table recorded. A restart resumes at a transaction boundary, never inside one: events after the
//!    last confirmed commit are published again (the inbox absorbs them), none is skipped.
//!
//! What can go wrong, and what the relay does:
//!
//! | failure | what happens |
//! |---|---|
//! | the relay is killed | the next relay resumes after the last confirmed commit: duplicates, no loss |
//! | the broker is down or loses acks | the window is retried with backoff; the slot does not advance |
//! | an event the broker refuses, a row that does not decode | the row is dead with its reason; its aggregate's later events wait (marked *waiting behind*) and go out in order after `outbox dead replay` or `discard`; other aggregates and the slot go on |
//! | no slot yet, or the slot was dropped or invalidated | a new slot is created, then every unpublished row of the table is published with the polling claim, then the relay reads the log: duplicates, no loss |
//! | another relay reads the slot | this one waits as a standby and takes over when the slot is free |
//! | an idle outbox beside a busy database | server keep-alives are confirmed, so the slot's WAL is freed |
//!
//! Set-up (once, by a role that owns `outbox_events`): `wal_level = logical`, a role with `REPLICATION`,
//! and the publication ([`create_publication`]); [`check`] reports what is missing as a [`SetupProblem`]
//! that says what to run. See `docs/log-relay.md`.
//!
//! ```no_run
//! # async fn demo(publisher: outbox_runtime::InMemoryPublisher) -> Result<(), outbox_seaorm::log::LogError> {
//! use outbox_seaorm::log::{LogRelay, LogRelayConfig};
//! let url = "postgres://outbox@db/app";
//! let db = outbox_seaorm::connect(url).await?;
//! let config = LogRelayConfig::default();
//! outbox_seaorm::log::create_publication(&db, &config).await?;
//! let relay = LogRelay::new(db, url, publisher, config)?;
//! relay.run(outbox_seaorm::CancellationToken::new()).await?; // until cancelled
//! # Ok(()) }
//! ```

mod pgoutput;
mod relay;
mod session;
mod setup;
mod stream;
mod table;

use std::time::Duration;

use sea_orm::DatabaseConnection;

use outbox_runtime::{Publisher, RelayConfig};

pub use relay::LogPass;
pub use setup::{SetupProblem, SlotState, check, create_publication, drop_slot, slot_state};

/// Why the log relay stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The server lacks something the relay needs; the message says what to run.
    #[error("the log relay cannot start: {0}")]
    Setup(#[from] SetupProblem),
    /// A database statement or a setting failed.
    #[error(transparent)]
    Outbox(#[from] crate::Error),
    /// The replication connection failed.
    #[error("the replication stream failed: {0}")]
    Replication(String),
}

impl LogError {
    fn replication(error: impl std::fmt::Display) -> Self {
        LogError::Replication(error.to_string())
    }
}

/// The log relay's settings.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LogRelayConfig {
    slot: String,
    publication: String,
    /// Most events per publish window (default 1,000): what is in memory at once, whatever the size of a
    /// transaction.
    pub window: usize,
    /// Attempts, backoff and publish timeout for the log's events; the batch size and claim settings of the
    /// polling claim that catches up after a lost slot.
    pub relay: RelayConfig,
    /// How often a standby tries to take the slot over (default 1 s).
    pub standby_retry: Duration,
    /// How often the server hears the confirmed position, also on an idle stream (default 1 s).
    pub status_interval: Duration,
    /// How often aggregates waiting behind a dead event are looked at for a replay or discard (default 1 s).
    pub parked_check: Duration,
    /// How often the slot's lag and retained WAL are sampled into the metrics and the service's health
    /// (default 10 s).
    pub slot_sample: Duration,
    /// Delete each row once the broker confirmed it, instead of recording it published (default `false`).
    /// Halves the WAL an event costs over its life (no mark, no later cleanup: see BENCHMARKS.md), at the
    /// price of the table's record of what went out: the dashboard's history and lookups by aggregate see
    /// only unpublished rows, and `outbox dead replay` of a published event has nothing to replay.
    pub delete_published: bool,
}

impl Default for LogRelayConfig {
    fn default() -> Self {
        LogRelayConfig {
            slot: "outbox_relay".into(),
            publication: "outbox_events_pub".into(),
            window: 1000,
            relay: RelayConfig::default().with_batch_size(1000),
            standby_retry: Duration::from_secs(1),
            status_interval: Duration::from_secs(1),
            parked_check: Duration::from_secs(1),
            slot_sample: Duration::from_secs(10),
            delete_published: false,
        }
    }
}

impl LogRelayConfig {
    /// The replication slot (default `outbox_relay`): one relay reads it at a time, others stand by.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// The publication of the outbox's inserts (default `outbox_events_pub`).
    pub fn publication(&self) -> &str {
        &self.publication
    }

    /// Sets the slot's name: lower-case letters, digits and `_`, at most 63 bytes (PostgreSQL's rule).
    pub fn with_slot(mut self, slot: impl Into<String>) -> Result<Self, LogError> {
        self.slot = identifier("slot", slot.into())?;
        Ok(self)
    }

    /// Sets the publication's name (same rule as the slot's).
    pub fn with_publication(mut self, publication: impl Into<String>) -> Result<Self, LogError> {
        self.publication = identifier("publication", publication.into())?;
        Ok(self)
    }

    /// Sets [`LogRelayConfig::window`].
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }

    /// Sets [`LogRelayConfig::delete_published`].
    pub fn with_delete_published(mut self, delete: bool) -> Self {
        self.delete_published = delete;
        self
    }

    /// Sets [`LogRelayConfig::relay`].
    pub fn with_relay(mut self, relay: RelayConfig) -> Self {
        self.relay = relay;
        self
    }

    fn validate(&self) -> Result<(), LogError> {
        if !(1..=100_000).contains(&self.window) {
            return Err(
                crate::Error::invalid_config("window", format!("is {}; expected 1 to 100000", self.window)).into()
            );
        }
        for (field, value) in [
            ("standby_retry", self.standby_retry),
            ("status_interval", self.status_interval),
            ("parked_check", self.parked_check),
        ] {
            if value.is_zero() || value > Duration::from_secs(3600) {
                return Err(crate::Error::invalid_config(
                    field,
                    format!("is {value:?}; expected more than 0, at most 1 h"),
                )
                .into());
            }
        }
        self.relay.validate()?;
        Ok(())
    }
}

fn identifier(field: &'static str, name: String) -> Result<String, LogError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(name)
    } else {
        Err(crate::Error::invalid_config(
            field,
            format!(
                "is {:?}; expected lower-case letters, digits and `_`, 1 to 63 bytes",
                outbox_runtime::text::one_line(&name)
            ),
        )
        .into())
    }
}

/// Publishes the outbox's rows as PostgreSQL's log delivers them (see the [module](self)).
pub struct LogRelay<P> {
    db: DatabaseConnection,
    url: String,
    publisher: P,
    config: LogRelayConfig,
}

impl<P: Publisher> LogRelay<P> {
    /// A relay reading the log of the database at `url` (the replication connection opens its own
    /// connection with the URL's credentials) and writing to the table through `db`; fails if `config`
    /// is invalid.
    pub fn new(db: DatabaseConnection, url: &str, publisher: P, config: LogRelayConfig) -> Result<Self, LogError> {
        config.validate()?;
        outbox_runtime::metrics::describe();
        Ok(LogRelay { db, url: url.to_owned(), publisher, config })
    }

    /// The settings.
    pub fn config(&self) -> &LogRelayConfig {
        &self.config
    }

    /// Checks the server's set-up (see [`check`]).
    pub async fn check(&self) -> Result<(), LogError> {
        check(&self.db, &self.config).await
    }

    /// The slot's state now; `None` before the relay first ran.
    pub async fn slot(&self) -> Result<Option<SlotState>, LogError> {
        slot_state(&self.db, self.config.slot()).await
    }
}

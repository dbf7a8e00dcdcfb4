//! PostgreSQL's log relay: `outbox relay --source log` (the flags here) and `outbox log setup|status|drop-slot`.

use clap::{Args, Subcommand, ValueEnum};
use outbox_seaorm::RelayConfig;
use outbox_seaorm::log::{self, LogError, LogRelayConfig, SlotState};
use sea_orm::DatabaseConnection;

use crate::{CliError, JsonArgs};

/// Where the relay finds committed events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Source {
    /// Claim due rows from the table (every database).
    #[default]
    Polling,
    /// Read PostgreSQL's log through a logical replication slot (commit order, no claim).
    Log,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Polling => "polling",
            Source::Log => "log",
        }
    }
}

/// The log relay's flags on `outbox relay`.
#[derive(Args, Clone)]
pub struct LogArgs {
    /// Where the relay finds committed events: `polling` claims rows from the table (every database),
    /// `log` reads PostgreSQL's log through a replication slot (needs wal_level=logical and `outbox log
    /// setup`).
    #[arg(long, env = "OUTBOX_SOURCE", value_enum, default_value_t = Source::Polling)]
    pub source: Source,
    #[command(flatten)]
    pub names: SlotArgs,
    /// With --source log: /health/ready answers 503 once the slot holds this many WAL bytes the relay has
    /// not confirmed (a number of bytes, or with KiB, MiB or GiB).
    #[arg(long, env = "OUTBOX_READY_MAX_SLOT_LAG", default_value = "256MiB", value_parser = parse_bytes, value_name = "BYTES")]
    pub ready_max_slot_lag: u64,
    /// With --source log: delete each row once the broker confirmed it, instead of marking it published
    /// (half the WAL per event; the table keeps no record of what went out).
    #[arg(long, env = "OUTBOX_DELETE_PUBLISHED")]
    pub delete_published: bool,
}

/// The slot and publication names.
#[derive(Args, Clone)]
pub struct SlotArgs {
    /// The replication slot the log relay reads (one reader at a time; other relays stand by).
    #[arg(long, env = "OUTBOX_LOG_SLOT", default_value = "outbox_relay")]
    pub slot: String,
    /// The publication of the outbox's inserts.
    #[arg(long, env = "OUTBOX_LOG_PUBLICATION", default_value = "outbox_events_pub")]
    pub publication: String,
}

impl SlotArgs {
    fn config(&self) -> Result<LogRelayConfig, CliError> {
        LogRelayConfig::default().with_slot(&self.slot)?.with_publication(&self.publication).map_err(refused)
    }
}

impl LogArgs {
    /// The log relay's settings, with the polling relay's retry settings.
    pub fn config(&self, relay: RelayConfig) -> Result<LogRelayConfig, CliError> {
        Ok(self.names.config()?.with_relay(relay).with_delete_published(self.delete_published))
    }
}

impl From<LogError> for CliError {
    fn from(error: LogError) -> Self {
        refused(error)
    }
}

/// A log relay error as the command reports it.
pub fn refused(error: LogError) -> CliError {
    match error {
        LogError::Outbox(error) => CliError::Outbox(error),
        other => CliError::Refused(other.to_string()),
    }
}

/// `123`, `64KiB`, `256MiB`, `1GiB`.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, unit) = text.find(|c: char| !c.is_ascii_digit()).map_or((text, ""), |at| text.split_at(at));
    let number: u64 = number.parse().map_err(|_| format!("{text:?} is not a number of bytes, e.g. 256MiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit {other:?}; expected KiB, MiB or GiB")),
    };
    number.checked_mul(scale).ok_or_else(|| format!("{text:?} is too large"))
}

#[derive(Subcommand)]
pub enum LogCommand {
    /// Check the server's set-up and create the publication of the outbox's inserts if it is missing
    /// (needs a role that owns outbox_events).
    Setup(SlotArgs),
    /// The set-up and the slot: whether a relay reads it, its lag and the WAL it holds.
    Status {
        #[command(flatten)]
        names: SlotArgs,
        #[command(flatten)]
        output: JsonArgs,
    },
    /// Drop the slot when decommissioning the log relay: the server frees the WAL it holds. Refused while a
    /// relay reads it, and without --yes.
    DropSlot {
        #[command(flatten)]
        names: SlotArgs,
        /// Really drop it: events committed after this and before a new slot exists are published only by
        /// the next log relay's catch-up from the table.
        #[arg(long)]
        yes: bool,
    },
}

pub async fn run(db: &DatabaseConnection, command: LogCommand) -> Result<(), CliError> {
    match command {
        LogCommand::Setup(names) => {
            let config = names.config()?;
            log::create_publication(db, &config).await?;
            log::check(db, &config).await?;
            println!(
                "ok: wal_level is logical, the role may replicate, publication {} carries the outbox's inserts; \
                 `outbox relay --source log` creates slot {} at its first start",
                config.publication(),
                config.slot()
            );
        }
        LogCommand::Status { names, output } => {
            let config = names.config()?;
            let setup = log::check(db, &config).await.err().map(|e| e.to_string());
            let slot = log::slot_state(db, config.slot()).await?;
            if output.json {
                let report = serde_json::json!({ "setup_problem": setup, "slot": slot });
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("setup: {}", setup.as_deref().unwrap_or("ok"));
                println!("slot:  {}", describe(config.slot(), slot.as_ref()));
            }
        }
        LogCommand::DropSlot { names, yes } => {
            let config = names.config()?;
            let Some(slot) = log::slot_state(db, config.slot()).await? else {
                println!("no slot {}: nothing to drop", config.slot());
                return Ok(());
            };
            if slot.active {
                return Err(CliError::Refused(format!(
                    "a relay reads slot {} now; stop every `outbox relay --source log` first",
                    config.slot()
                )));
            }
            if !yes {
                return Err(CliError::Refused(format!(
                    "dropping slot {} frees its WAL for good ({}); add --yes to drop it",
                    config.slot(),
                    describe(config.slot(), Some(&slot))
                )));
            }
            log::drop_slot(db, config.slot()).await?;
            println!("dropped slot {}", config.slot());
        }
    }
    Ok(())
}

/// One line about the slot.
pub fn describe(name: &str, slot: Option<&SlotState>) -> String {
    match slot {
        None => format!("{name}: none yet (the log relay creates it at its first start)"),
        Some(slot) => format!(
            "{name}: {}, wal_status {}, confirmed {}, {} bytes behind, {} bytes of WAL held",
            if slot.streaming {
                "read by a relay"
            } else if slot.active {
                "held (being created)"
            } else {
                "no relay reads it"
            },
            slot.wal_status.as_deref().unwrap_or("-"),
            slot.confirmed_flush_lsn.as_deref().unwrap_or("-"),
            slot.lag_bytes.unwrap_or(0),
            slot.retained_bytes.unwrap_or(0),
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(super::parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(super::parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(super::parse_bytes("4096"), Ok(4096));
        assert!(super::parse_bytes("12MB").is_err());
        assert!(super::parse_bytes("lots").is_err());
    }
}

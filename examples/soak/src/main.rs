//! Run with: cargo run --release -p outbox-soak -- --duration 20s --kill-relay-every 3
//!
//! A soak run of the outbox. Writers commit orders (business rows and their events, some transactions
//! rolled back on purpose after the enqueue), relays run as child processes of this binary (killed with
//! SIGKILL and restarted with `--kill-relay-every`), publish through a fault-injecting publisher, and
//! consumers apply each event through the inbox, recording the effect in the same transaction. At the end
//! the tool waits for the drain, reads the whole history back from the tables, checks it with
//! `outbox_seaorm::testkit::check`, and prints one JSON line on stdout:
//!
//! `{"committed":..,"delivered":..,"applied":..,"duplicates_absorbed":..,"lost":0,"applied_twice":0,"order_violations":0,"rolled_back_published":0}`
//!
//! It exits 1 when any of the last four is not 0, and 2 when the run itself failed.
//!
//! The database: an SQLite file in a fresh temp directory by default; with `--database-url` a schema
//! (PostgreSQL) or a database (MariaDB) of its own, created for the run and dropped after it (`--keep`
//! keeps it). The broker: by default a table in that database (`soak_broker`), because relays are other
//! processes and need a broker they share with the consumers; with `--broker` a real one (nats://,
//! amqp://, redis://, kafka://), on a stream, queue or topic named for the run.

mod broker;
mod db;
mod relay;
mod run;
mod writer;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// What can stop a soak run before it has a verdict.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// The outbox library failed (database, broker, configuration).
    #[error(transparent)]
    Outbox(#[from] outbox_seaorm::Error),
    /// A statement of the soak's own tables failed.
    #[error("{context}: {source}")]
    Db {
        /// What the tool was doing.
        context: String,
        /// The database's error.
        source: sea_orm::DbErr,
    },
    /// A relay process could not be started or watched.
    #[error("relay process: {0}")]
    Process(#[from] std::io::Error),
    /// The command line asked for something the tool cannot do.
    #[error("{0}")]
    Usage(String),
    /// The broker's topology could not be set up.
    #[error("{0}")]
    Setup(String),
}

impl SoakError {
    /// A database error with what the tool was doing.
    pub fn db(context: impl Into<String>) -> impl FnOnce(sea_orm::DbErr) -> SoakError {
        let context = context.into();
        move |source| SoakError::Db { context, source }
    }
}

/// The soak's flags.
#[derive(Parser, Debug)]
#[command(about = "Soak the outbox: kill relays, break the broker, check nothing is lost, applied twice or reordered.")]
struct Cli {
    /// The hidden relay process, started by the tool itself.
    #[command(subcommand)]
    command: Option<Command>,
    /// What to run.
    #[command(flatten)]
    soak: SoakArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One relay, as a child process of a soak run (not for direct use).
    #[command(hide = true)]
    Relay(relay::RelayArgs),
}

/// The flags of a soak run.
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// postgres://, mysql:// or sqlite: (default: an SQLite file in a fresh temp directory). The run gets
    /// its own schema (PostgreSQL) or database (MariaDB), dropped afterwards.
    #[arg(long)]
    pub database_url: Option<String>,
    /// nats://, amqp://, redis:// or kafka:// (default: the `soak_broker` table in the database).
    #[arg(long)]
    pub broker: Option<String>,
    /// Orders to write; 0 writes until `--duration` ends.
    #[arg(long, default_value_t = 2000)]
    pub orders: u64,
    /// Aggregates the orders are spread over.
    #[arg(long, default_value_t = 50)]
    pub aggregates: u64,
    /// Events each order's transaction enqueues.
    #[arg(long, default_value_t = 3)]
    pub events_per_order: u32,
    /// Relay processes.
    #[arg(long, default_value_t = 2)]
    pub relays: u32,
    /// Consumers (table broker: one task per lane of aggregates; real broker: the consume driver's
    /// concurrency).
    #[arg(long, default_value_t = 2)]
    pub consumers: u32,
    /// With a real broker: messages the consumer applies per transaction (group commit; 1 applies each
    /// alone). SQLite always uses 1.
    #[arg(long, default_value_t = 64)]
    pub group_size: usize,
    /// With a real broker: apply with a batch handler (`Consumer::on_batch` + `handle_batch_once`, one
    /// effect statement per call) instead of a handler per message.
    #[arg(long)]
    pub batch_handler: bool,
    /// Probability that the broker rejects an event (the relay retries it).
    #[arg(long, default_value_t = 0.0)]
    pub publish_fail_rate: f64,
    /// Probability that the broker takes an event but its ack is lost (the relay publishes it again).
    #[arg(long, default_value_t = 0.0)]
    pub lost_ack_rate: f64,
    /// Writers stop after this long (`20s`, `10m`), or after `--orders`, whichever comes first.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Kill one relay (round robin) with SIGKILL every this many seconds, and restart it.
    #[arg(long, value_name = "SECONDS")]
    pub kill_relay_every: Option<f64>,
    /// Writers that write one aggregate at the same time.
    #[arg(long, default_value_t = 1)]
    pub concurrent_writers_per_aggregate: u32,
    /// Seed of every random choice (faults, rollbacks).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Target events per second over all writers (default: as fast as the database takes them).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Writer tasks (default: 4, at least 2 per concurrent writer of an aggregate).
    #[arg(long)]
    pub writers: Option<u32>,
    /// Probability that an order's transaction rolls back after its events were enqueued.
    #[arg(long, default_value_t = 0.05)]
    pub rollback_rate: f64,
    /// Claim in lease mode with this lease (default: lease of 5 s on SQLite, transaction mode elsewhere).
    #[arg(long, value_parser = parse_duration)]
    pub lease: Option<Duration>,
    /// Give up waiting for the drain after this long.
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub drain_timeout: Duration,
    /// Keep the run's schema, database or file.
    #[arg(long)]
    pub keep: bool,
    /// A broker that confirms this share of events without sending them: a loss the check must report.
    #[arg(long, hide = true, default_value_t = 0.0)]
    pub inject_loss: f64,
}

/// `250ms`, `30s`, `5m`, `2h` (a bare number is seconds).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration; expected e.g. 500ms, 30s, 5m"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown unit {other:?} in {text:?}; expected one of ms, s, m, h")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let relay_process = cli.command.is_some();
    // Relays log only errors (their publish failures are the point); the run logs progress itself.
    let default = if relay_process { "error" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("soak: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Some(Command::Relay(args)) => relay::run(args).await.map(|()| true),
            None => run::soak(cli.soak).await,
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_their_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("20"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("5 parsecs").is_err());
    }
}

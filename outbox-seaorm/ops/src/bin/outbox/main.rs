//! # outbox
//!
//! Run with: `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --bin outbox -- check`
//!
//! The operator's command for the transactional outbox of a SeaORM app: run the relay as a service
//! (`relay`), apply the migrations (`migrate`), inspect or repair the outbox (`stats`, `dead`,
//! `cleanup`, `check`), and the consumers' dead letters at the broker (`dead-letters`). Every flag can also be set from an `OUTBOX_*` environment variable (shown in
//! `--help`); the database URL comes from `DATABASE_URL`. No message ever shows a password.
//!
//! Exit status: 0 on success, 1 when the command failed or a check did not pass, 2 for a usage error.

mod broker;
mod check;
mod cleanup;
mod dashboard;
mod db;
mod dead;
mod dead_letters;
mod duration;
mod http;
mod log;
mod migrate;
mod notify;
mod relay;
mod selection;
mod stats;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::db::DbArgs;

/// What can go wrong in the `outbox` command.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// The outbox library failed (database, broker, configuration).
    #[error(transparent)]
    Outbox(#[from] outbox_seaorm::Error),
    /// The command refuses to go on, and says what to do instead.
    #[error("{0}")]
    Refused(String),
    /// The output could not be written or encoded.
    #[error("cannot write the output: {0}")]
    Output(String),
}

impl From<serde_json::Error> for CliError {
    fn from(error: serde_json::Error) -> Self {
        CliError::Output(error.to_string())
    }
}

#[derive(Parser)]
#[command(
    name = "outbox",
    version,
    about = "Run and operate the transactional outbox of a SeaORM app",
    after_help = "Every flag can also be set from the OUTBOX_* variable shown with it; the database URL comes \
                  from DATABASE_URL. A DURATION is a number and a unit: 500ms, 10s, 5m, 2h, 7d."
)]
struct Cli {
    #[command(flatten)]
    db: DbArgs,
    /// Log filter (tracing's EnvFilter syntax), e.g. `info` or `outbox_runtime=debug`.
    #[arg(
        long,
        env = "OUTBOX_LOG",
        default_value = "warn,outbox=info,outbox_runtime=info,outbox_seaorm=info",
        global = true
    )]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the relay (relay tasks, cleanup, stats sampler) until SIGTERM or SIGINT.
    Relay(Box<relay::RelayArgs>),
    /// Apply the outbox migrations; safe when several replicas start at once.
    Migrate(migrate::MigrateArgs),
    /// Print the backlog: pending, dead, oldest pending age, per aggregate type and event type.
    Stats(stats::StatsArgs),
    /// List, show, replay or discard dead events: outbox rows the relay gave up on (in the database).
    #[command(subcommand)]
    Dead(dead::DeadCommand),
    /// List, show, replay, discard or count consumer dead letters: messages a consumer gave up on (at the
    /// broker: NATS JetStream, Kafka, RabbitMQ, Redis Streams). Needs no database.
    #[command(subcommand)]
    DeadLetters(Box<dead_letters::DeadLettersCommand>),
    /// Delete published outbox rows (and, if asked, inbox rows) past their retention, in batches.
    Cleanup(cleanup::CleanupArgs),
    /// Check the connection, the migrations, that the database is a writable primary, and clock skew.
    Check(check::CheckArgs),
    /// Serve the operations dashboard (backlog, dead events, replay and discard; a consumer's dead letters
    /// with --broker) without a relay.
    Dashboard(dashboard::ServeArgs),
    /// PostgreSQL LISTEN/NOTIFY wake-ups: install, remove or show the notify trigger on `outbox_events`.
    #[command(subcommand)]
    Notify(notify::NotifyCommand),
    /// PostgreSQL's log relay (`outbox relay --source log`): set it up, show its slot, drop the slot.
    #[command(subcommand)]
    Log(log::LogCommand),
}

/// `--json` for a command that prints.
#[derive(Args)]
struct JsonArgs {
    /// Print JSON instead of text.
    #[arg(long, env = "OUTBOX_JSON")]
    json: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let secrets = secrets(&cli);
    match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            let urls: Vec<&str> = secrets.urls.iter().map(String::as_str).collect();
            let mut message = outbox_seaorm::text::redact_passwords_of(&error.to_string(), &urls);
            for token in &secrets.tokens {
                message = message.replace(token.as_str(), "***");
            }
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// What this run was given that no message may show: URLs with passwords, and the admin token.
struct Secrets {
    urls: Vec<String>,
    tokens: Vec<String>,
}

/// The URLs and tokens this run was given, to keep out of every message.
fn secrets(cli: &Cli) -> Secrets {
    let mut urls = vec![cli.db.url.clone()];
    if let Command::Relay(args) = &cli.command {
        urls.push(Some(args.broker.broker.clone()));
    }
    if let Command::DeadLetters(command) = &cli.command {
        urls.push(Some(command.broker().to_owned()));
    }
    if let Command::Dashboard(args) = &cli.command {
        urls.push(args.broker().map(str::to_owned));
    }
    let token = match &cli.command {
        Command::Relay(args) => args.dashboard.admin_token.clone(),
        Command::Dashboard(args) => args.admin_token().map(str::to_owned),
        _ => None,
    };
    Secrets {
        urls: urls.into_iter().flatten().collect(),
        tokens: token.into_iter().filter(|t| !t.is_empty()).collect(),
    }
}

async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let command = match cli.command {
        Command::DeadLetters(command) => {
            dead_letters::run(*command).await?;
            return Ok(ExitCode::SUCCESS);
        }
        command => command,
    };
    let cli = Cli { command, ..cli };
    let pool_size = match &cli.command {
        Command::Relay(args) => args.relays + 4 + u32::from(args.listen),
        _ => 4,
    };
    let db = db::open(&cli.db, pool_size).await?;
    match cli.command {
        Command::Relay(args) => relay::run(db, cli.db.url.as_deref().unwrap_or_default(), *args).await?,
        Command::Log(command) => log::run(&db, command).await?,
        Command::Migrate(args) => migrate::run(&db, args).await?,
        Command::Stats(args) => stats::run(&db, args).await?,
        Command::Dead(command) => dead::run(&db, command).await?,
        Command::DeadLetters(command) => dead_letters::run(*command).await?,
        Command::Cleanup(args) => cleanup::run(&db, args).await?,
        Command::Notify(command) => notify::run(&db, command).await?,
        Command::Dashboard(args) => dashboard::run(db, args).await?,
        Command::Check(args) => return check::run(&db, args).await,
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

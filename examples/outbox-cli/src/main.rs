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
mod dead_letters;
mod duration;
mod http;
mod relay;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use outbox_seaorm::admin::{self, CheckOptions, CleanupConfig, DeadFilter};
use outbox_seaorm::{Backoff, ClaimMode, EventId, RelayConfig};
use sea_orm::DatabaseConnection;

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

/// Where the outbox lives.
#[derive(Args)]
struct DbArgs {
    /// The database: postgres://, mysql://, mariadb:// or sqlite: (never printed with its password).
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true, global = true)]
    url: Option<String>,
    /// PostgreSQL: the schema that holds the outbox tables (the connection's search_path).
    #[arg(long, env = "OUTBOX_SCHEMA", global = true, value_parser = parse_schema)]
    schema: Option<String>,
    /// How long to wait for a database connection.
    #[arg(long, env = "OUTBOX_CONNECT_TIMEOUT", default_value = "10s", value_parser = duration::parse, value_name = "DURATION", global = true)]
    connect_timeout: Duration,
}

#[derive(Subcommand)]
enum Command {
    /// Run the relay (relay tasks, cleanup, stats sampler) until SIGTERM or SIGINT.
    Relay(Box<RelayArgs>),
    /// Apply the outbox migrations; safe when several replicas start at once.
    Migrate,
    /// Print the backlog: pending, dead, oldest pending age, per aggregate type and event type.
    Stats(StatsArgs),
    /// List, show, replay or discard dead events: outbox rows the relay gave up on (in the database).
    #[command(subcommand)]
    Dead(DeadCommand),
    /// List, show, replay, discard or count consumer dead letters: messages a consumer gave up on (at the
    /// broker: NATS JetStream, Kafka, RabbitMQ, Redis Streams). Needs no database.
    #[command(subcommand)]
    DeadLetters(Box<dead_letters::DeadLettersCommand>),
    /// Delete published outbox rows (and, if asked, inbox rows) past their retention, in batches.
    Cleanup(CleanupArgs),
    /// Check the connection, the migrations, that the database is a writable primary, and clock skew.
    Check(CheckArgs),
    /// PostgreSQL LISTEN/NOTIFY wake-ups: install, remove or show the notify trigger on `outbox_events`.
    #[command(subcommand)]
    Notify(NotifyCommand),
}

#[derive(Subcommand)]
enum NotifyCommand {
    /// Install (or re-point) the trigger that notifies the channel after each insert into the outbox.
    Install(ChannelArgs),
    /// Remove the trigger: no writer notifies any more (relays still poll).
    Remove,
    /// Print the channel the installed trigger notifies, or that none is installed.
    Status,
}

#[derive(Args)]
struct ChannelArgs {
    /// The NOTIFY channel (a lower-case identifier).
    #[arg(long, env = "OUTBOX_NOTIFY_CHANNEL", default_value = outbox_seaorm::notify::DEFAULT_CHANNEL)]
    notify_channel: outbox_seaorm::notify::NotifyChannel,
}

#[derive(Args)]
struct StatsArgs {
    #[command(flatten)]
    output: JsonArgs,
    /// CDC mode: Debezium publishes from the write-ahead log and no row is ever marked published, so print
    /// the rows kept and the oldest row's age instead of a backlog.
    #[arg(long, env = "OUTBOX_CDC")]
    cdc: bool,
}

#[derive(Args)]
struct JsonArgs {
    /// Print JSON instead of text.
    #[arg(long, env = "OUTBOX_JSON")]
    json: bool,
}

/// The relay settings that decide how long an event may be retried (the cleanup checks its inbox
/// retention against them).
#[derive(Args, Clone)]
struct RelayShape {
    /// Failed attempts after which an event is dead.
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = 10)]
    max_attempts: i32,
    /// The first retry delay; it doubles per attempt up to --backoff-max.
    #[arg(long, env = "OUTBOX_BACKOFF_INITIAL", default_value = "1s", value_parser = duration::parse, value_name = "DURATION")]
    backoff_initial: Duration,
    /// The longest retry delay.
    #[arg(long, env = "OUTBOX_BACKOFF_MAX", default_value = "5m", value_parser = duration::parse, value_name = "DURATION")]
    backoff_max: Duration,
    /// A publish that takes longer fails.
    #[arg(long, env = "OUTBOX_PUBLISH_TIMEOUT", default_value = "10s", value_parser = duration::parse, value_name = "DURATION")]
    publish_timeout: Duration,
    /// Lease mode: claim rows for this long and publish outside any transaction (for slow brokers).
    #[arg(long, env = "OUTBOX_LEASE", value_parser = duration::parse, value_name = "DURATION")]
    lease: Option<Duration>,
}

impl RelayShape {
    fn config(&self) -> RelayConfig {
        let mut config = RelayConfig::default()
            .with_max_attempts(self.max_attempts)
            .with_backoff(Backoff { initial: self.backoff_initial, max: self.backoff_max, multiplier: 2 })
            .with_publish_timeout(self.publish_timeout);
        if let Some(duration) = self.lease {
            config = config.with_claim_mode(ClaimMode::Lease { duration });
        }
        config
    }
}

/// The broker a relay publishes to.
#[derive(Args)]
struct BrokerArgs {
    /// The broker: nats://, kafka://, amqp:// (RabbitMQ) or redis:// (never printed with its password).
    #[arg(long, env = "OUTBOX_BROKER", hide_env_values = true)]
    broker: String,
    /// Where each event goes: a template over {aggregate_type}, {aggregate_id}, {event_type}, {version}.
    #[arg(long, env = "OUTBOX_DESTINATION", default_value = "{aggregate_type}.{event_type}")]
    destination: String,
    /// RabbitMQ: the exchange to publish to.
    #[arg(long, env = "OUTBOX_EXCHANGE", default_value = "outbox")]
    exchange: String,
    /// RabbitMQ: declare the exchange (a durable topic exchange) at start.
    #[arg(long, env = "OUTBOX_DECLARE_EXCHANGE")]
    declare_exchange: bool,
    /// NATS: create this JetStream stream at start unless it exists.
    #[arg(long, env = "OUTBOX_NATS_STREAM")]
    nats_stream: Option<String>,
    /// NATS: the subjects of --nats-stream, comma-separated.
    #[arg(long, env = "OUTBOX_NATS_SUBJECTS", value_delimiter = ',', default_value = ">")]
    nats_subjects: Vec<String>,
}

#[derive(Args)]
struct RelayArgs {
    #[command(flatten)]
    broker: BrokerArgs,
    #[command(flatten)]
    shape: RelayShape,
    /// Most rows claimed per pass.
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = 100)]
    batch_size: u32,
    /// Sleep between passes when nothing was due.
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", default_value = "500ms", value_parser = duration::parse, value_name = "DURATION")]
    poll_interval: Duration,
    /// Relay tasks in this process.
    #[arg(long, env = "OUTBOX_RELAYS", default_value_t = 1)]
    relays: u32,
    /// Let later events of an aggregate go on past a dead one (consumers see a gap).
    #[arg(long, env = "OUTBOX_SKIP_DEAD")]
    skip_dead: bool,
    /// Delete published outbox rows older than this.
    #[arg(long, env = "OUTBOX_OUTBOX_RETENTION", default_value = "7d", value_parser = duration::parse, value_name = "DURATION")]
    outbox_retention: Duration,
    /// Delete inbox rows older than this (default: keep them); must exceed the redelivery horizon.
    #[arg(long, env = "OUTBOX_INBOX_RETENTION", value_parser = duration::parse, value_name = "DURATION")]
    inbox_retention: Option<Duration>,
    /// Time between cleanups.
    #[arg(long, env = "OUTBOX_CLEANUP_INTERVAL", default_value = "5m", value_parser = duration::parse, value_name = "DURATION")]
    cleanup_interval: Duration,
    /// Most rows per cleanup statement.
    #[arg(long, env = "OUTBOX_CLEANUP_BATCH_SIZE", default_value_t = 1000)]
    cleanup_batch_size: u32,
    /// Run no cleanup in this process.
    #[arg(long, env = "OUTBOX_NO_CLEANUP")]
    no_cleanup: bool,
    /// Time between backlog samples.
    #[arg(long, env = "OUTBOX_STATS_INTERVAL", default_value = "15s", value_parser = duration::parse, value_name = "DURATION")]
    stats_interval: Duration,
    /// Time between status lines in the log.
    #[arg(long, env = "OUTBOX_STATUS_INTERVAL", default_value = "60s", value_parser = duration::parse, value_name = "DURATION")]
    status_interval: Duration,
    /// Serve /metrics (Prometheus text), /health/live and /health/ready on this address, e.g. 0.0.0.0:9090.
    #[arg(long, env = "OUTBOX_HTTP")]
    http: Option<std::net::SocketAddr>,
    /// /health/ready answers 503 once the oldest pending event is this old.
    #[arg(long, env = "OUTBOX_READY_MAX_PENDING_AGE", default_value = "60s", value_parser = duration::parse, value_name = "DURATION")]
    ready_max_pending_age: Duration,
    /// /health/ready answers 503 when no relay pass succeeded for this long.
    #[arg(long, env = "OUTBOX_READY_MAX_PASS_AGE", default_value = "30s", value_parser = duration::parse, value_name = "DURATION")]
    ready_max_pass_age: Duration,
    /// PostgreSQL: LISTEN on the notify channel and pass as soon as another process commits outbox rows
    /// (install the trigger with `outbox notify install`); the poll stays the fallback.
    #[arg(long, env = "OUTBOX_LISTEN")]
    listen: bool,
    #[command(flatten)]
    channel: ChannelArgs,
}

#[derive(Subcommand)]
enum DeadCommand {
    /// List dead events, oldest first (without payloads).
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Most events to list.
        #[arg(long, env = "OUTBOX_LIMIT", default_value_t = 50)]
        limit: u64,
        #[command(flatten)]
        output: JsonArgs,
    },
    /// Show one dead event with its payload and headers, as JSON.
    Show {
        /// The event id, as `dead list` shows it.
        #[arg(long = "id", env = "OUTBOX_ID")]
        id: String,
    },
    /// Make dead events due again, with attempts and backoff reset; prints how many.
    Replay {
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Delete dead events for good (their aggregates go on without them); prints how many.
    Discard {
        #[command(flatten)]
        filter: FilterArgs,
    },
}

/// Which dead events; criteria combine with AND.
#[derive(Args)]
struct FilterArgs {
    /// Only these event types (repeat, or comma-separate).
    #[arg(long = "event-type", env = "OUTBOX_EVENT_TYPE", value_delimiter = ',', value_name = "TYPE")]
    event_types: Vec<String>,
    /// Only this aggregate type.
    #[arg(long, env = "OUTBOX_AGGREGATE_TYPE")]
    aggregate_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long, env = "OUTBOX_AGGREGATE_ID")]
    aggregate_id: Option<String>,
    /// Only events whose last error contains this text (ignoring case).
    #[arg(long, env = "OUTBOX_ERROR_CONTAINS")]
    error_contains: Option<String>,
    /// Only events that died longer ago than this.
    #[arg(long, env = "OUTBOX_OLDER_THAN", value_parser = duration::parse, value_name = "DURATION")]
    older_than: Option<Duration>,
    /// Only events that died less long ago than this.
    #[arg(long, env = "OUTBOX_NEWER_THAN", value_parser = duration::parse, value_name = "DURATION")]
    newer_than: Option<Duration>,
    /// Only these event ids (repeat, or comma-separate).
    #[arg(long = "id", env = "OUTBOX_ID", value_delimiter = ',', value_name = "ID")]
    ids: Vec<String>,
    /// Every dead event: `replay` and `discard` need a filter or this.
    #[arg(long, env = "OUTBOX_DEAD_ALL")]
    all: bool,
}

impl FilterArgs {
    fn filter(&self) -> Result<DeadFilter, CliError> {
        let mut filter = if self.all { DeadFilter::all() } else { DeadFilter::default() };
        for event_type in &self.event_types {
            filter = filter.event_type(event_type);
        }
        if let Some(aggregate_type) = &self.aggregate_type {
            filter = filter.aggregate_type(aggregate_type);
        }
        if let Some(aggregate_id) = &self.aggregate_id {
            filter = filter.aggregate_id(aggregate_id);
        }
        if let Some(text) = &self.error_contains {
            filter = filter.error_contains(text);
        }
        if let Some(age) = self.older_than {
            filter = filter.older_than(age);
        }
        if let Some(age) = self.newer_than {
            filter = filter.newer_than(age);
        }
        for id in &self.ids {
            filter = filter.id(parse_id(id)?);
        }
        Ok(filter)
    }

    /// The filter of a command that changes rows: at least one criterion, or `--all`.
    fn selective(&self, verb: &str) -> Result<DeadFilter, CliError> {
        let filter = self.filter()?;
        if filter.is_empty() && !self.all {
            return Err(CliError::Refused(format!(
                "`dead {verb}` needs a filter (--event-type, --aggregate-type, --aggregate-id, --error-contains, \
                 --older-than, --newer-than, --id) or --all"
            )));
        }
        Ok(filter)
    }
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

fn parse_id(id: &str) -> Result<EventId, CliError> {
    id.parse().map_err(|_| CliError::Refused(format!("{:?} is not an event id (a UUID)", outbox_seaorm::one_line(id))))
}

#[derive(Args)]
struct CleanupArgs {
    /// Delete published outbox rows older than this.
    #[arg(long, env = "OUTBOX_OUTBOX_RETENTION", default_value = "7d", value_parser = duration::parse, value_name = "DURATION")]
    outbox_retention: Duration,
    /// Delete inbox rows older than this (default: keep them); must exceed the redelivery horizon.
    #[arg(long, env = "OUTBOX_INBOX_RETENTION", value_parser = duration::parse, value_name = "DURATION")]
    inbox_retention: Option<Duration>,
    /// Most rows per statement.
    #[arg(long, env = "OUTBOX_CLEANUP_BATCH_SIZE", default_value_t = 1000)]
    cleanup_batch_size: u32,
    /// CDC mode: Debezium publishes from the write-ahead log and no row is ever marked published, so
    /// delete every outbox row older than --outbox-retention, published or not. Never with a relay running.
    #[arg(long, env = "OUTBOX_CDC")]
    cdc: bool,
    /// The relay's settings, to check --inbox-retention against the redelivery horizon they give.
    #[command(flatten, next_help_heading = "Relay settings (for the --inbox-retention check)")]
    shape: RelayShape,
}

#[derive(Args)]
struct CheckArgs {
    #[command(flatten)]
    output: JsonArgs,
    /// The largest clock difference between this host and the database that passes.
    #[arg(long, env = "OUTBOX_MAX_CLOCK_SKEW", default_value = "2s", value_parser = duration::parse, value_name = "DURATION")]
    max_clock_skew: Duration,
    /// The migration bookkeeping table (default: outbox_seaorm_migrations, then seaql_migrations).
    #[arg(long, env = "OUTBOX_MIGRATION_TABLE")]
    migration_table: Option<String>,
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
            eprintln!("error: {}", scrub(&error.to_string(), &secrets));
            ExitCode::FAILURE
        }
    }
}

/// The passwords in the URLs this run was given, to keep out of every message.
fn secrets(cli: &Cli) -> Vec<String> {
    let mut urls = vec![cli.db.url.clone()];
    if let Command::Relay(args) = &cli.command {
        urls.push(Some(args.broker.broker.clone()));
    }
    if let Command::DeadLetters(command) = &cli.command {
        urls.push(Some(command.broker().to_owned()));
    }
    urls.into_iter().flatten().filter_map(|url| password_of(&url)).collect()
}

/// The password in `scheme://user:password@host…`, if any.
fn password_of(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let (user_info, _) = authority.rsplit_once('@')?;
    let (_, password) = user_info.split_once(':')?;
    (!password.is_empty()).then(|| password.to_owned())
}

/// `message` with every secret (and its percent-decoded form) replaced by `***`.
fn scrub(message: &str, secrets: &[String]) -> String {
    let mut message = message.to_owned();
    for secret in secrets {
        for form in [secret.clone(), percent_decode(secret)] {
            if !form.is_empty() {
                message = message.replace(&form, "***");
            }
        }
    }
    message
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
    let db = open(&cli.db, pool_size).await?;
    match cli.command {
        Command::Relay(args) => {
            ready_to_write(&db).await?;
            relay::run(db, *args).await?;
        }
        Command::Migrate => {
            ready_to_write_unmigrated(&db).await?;
            let pending = admin::pending_migrations(&db, None).await?;
            outbox_seaorm::migrate(&db).await?;
            match pending.len() {
                0 => println!("outbox migrations: all applied already"),
                n => println!("outbox migrations: applied {n} ({})", pending.join(", ")),
            }
        }
        Command::Stats(args) => {
            migrated(&db).await?;
            let mode = if args.cdc { admin::StatsMode::Cdc } else { admin::StatsMode::Relay };
            let stats = admin::stats_in(&db, mode).await?;
            if args.output.json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
            } else {
                print_stats(&stats);
            }
        }
        Command::Dead(command) => dead(&db, command).await?,
        Command::DeadLetters(command) => dead_letters::run(*command).await?,
        Command::Cleanup(args) => cleanup(&db, args).await?,
        Command::Notify(command) => notify(&db, command).await?,
        Command::Check(args) => {
            let options = CheckOptions { max_clock_skew: args.max_clock_skew, migration_table: args.migration_table };
            let report = admin::check(&db, &options).await;
            if args.output.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                for check in &report.checks {
                    println!("{:<4}  {:<10}  {}", if check.ok { "ok" } else { "FAIL" }, check.name, check.detail);
                }
            }
            if !report.ok {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn open(args: &DbArgs, pool_size: u32) -> Result<DatabaseConnection, CliError> {
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
async fn migrated(db: &DatabaseConnection) -> Result<(), CliError> {
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
async fn ready_to_write_unmigrated(db: &DatabaseConnection) -> Result<(), CliError> {
    if let Some(reason) = admin::read_only_reason(db).await? {
        return Err(CliError::Refused(format!(
            "the database is read-only ({reason}): point DATABASE_URL at the primary"
        )));
    }
    Ok(())
}

async fn ready_to_write(db: &DatabaseConnection) -> Result<(), CliError> {
    ready_to_write_unmigrated(db).await?;
    migrated(db).await
}

fn print_stats(stats: &admin::Stats) {
    if let (Some(rows), Some(oldest)) = (stats.rows, stats.oldest_row_seconds) {
        println!("CDC mode: {rows} row(s) kept, oldest {oldest} s (no backlog here: watch the connector's lag)");
        return;
    }
    println!(
        "pending {}, dead {}, oldest pending {} s, most attempts {}",
        stats.pending, stats.dead, stats.oldest_pending_seconds, stats.max_attempts
    );
    for (title, groups) in [("aggregate type", &stats.by_aggregate_type), ("event type", &stats.by_event_type)] {
        if groups.is_empty() {
            continue;
        }
        println!();
        println!("{title:<32} {:>9} {:>9} {:>12} {:>9}", "pending", "dead", "oldest (s)", "attempts");
        for group in groups {
            println!(
                "{:<32} {:>9} {:>9} {:>12} {:>9}",
                group.name, group.pending, group.dead, group.oldest_pending_seconds, group.max_attempts
            );
        }
    }
}

async fn dead(db: &DatabaseConnection, command: DeadCommand) -> Result<(), CliError> {
    migrated(db).await?;
    match command {
        DeadCommand::List { filter, limit, output } => {
            let events = admin::list_dead(db, &filter.filter()?, limit).await?;
            if output.json {
                println!("{}", serde_json::to_string_pretty(&events)?);
                return Ok(());
            }
            for event in &events {
                println!(
                    "{}  {} (schema v{})  {}/{} event #{} of the aggregate  seq {}  attempts {}  died {}  {}",
                    event.id,
                    event.event_type,
                    event.schema_version,
                    event.aggregate_type,
                    event.aggregate_id,
                    event.aggregate_version,
                    event.seq,
                    event.attempts,
                    event.dead_at,
                    outbox_seaorm::one_line(event.last_error.as_deref().unwrap_or("-")),
                );
            }
            println!("{} dead event(s) listed (at most {limit})", events.len());
        }
        DeadCommand::Show { id } => match admin::show_dead(db, parse_id(&id)?).await? {
            Some(event) => println!("{}", serde_json::to_string_pretty(&event)?),
            None => {
                return Err(CliError::Refused(format!(
                    "no dead event has id {id} (`outbox dead list` shows the dead ones; a pending or published event is not dead)"
                )));
            }
        },
        DeadCommand::Replay { filter } => {
            ready_to_write(db).await?;
            let replayed = admin::replay_dead(db, &filter.selective("replay")?).await?;
            println!("replayed {replayed} dead event(s)");
        }
        DeadCommand::Discard { filter } => {
            ready_to_write(db).await?;
            let discarded = admin::discard_dead(db, &filter.selective("discard")?).await?;
            println!("discarded {discarded} dead event(s)");
        }
    }
    Ok(())
}

async fn cleanup(db: &DatabaseConnection, args: CleanupArgs) -> Result<(), CliError> {
    ready_to_write(db).await?;
    let mut config =
        CleanupConfig::default().with_outbox_retention(args.outbox_retention).with_batch_size(args.cleanup_batch_size);
    if let Some(retention) = args.inbox_retention {
        config = config.with_inbox_retention(retention);
    }
    if args.cdc {
        config = config.with_delete_unpublished_after(args.outbox_retention);
    }
    config.validate(&args.shape.config())?;
    // A spinner with running totals on a terminal; one plain line per batch otherwise (logs, CI).
    let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let report = admin::cleanup(db, &config, |progress| {
        let line = format!("{}: deleted {} (total {})", progress.table.table_name(), progress.deleted, progress.total);
        match &bar {
            Some(bar) => bar.set_message(line),
            None => println!("{line}"),
        }
    })
    .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let report = report?;
    if report.skipped {
        println!("skipped: another process holds the cleanup lock");
    } else {
        println!("done: {} outbox row(s), {} inbox row(s) deleted", report.outbox_deleted, report.inbox_deleted);
    }
    Ok(())
}

async fn notify(db: &DatabaseConnection, command: NotifyCommand) -> Result<(), CliError> {
    use outbox_seaorm::notify;
    migrated(db).await?;
    match command {
        NotifyCommand::Install(args) => {
            ready_to_write(db).await?;
            notify::install_notify_trigger(db, &args.notify_channel).await?;
            println!("notify trigger installed: inserts into outbox_events notify {}", args.notify_channel);
        }
        NotifyCommand::Remove => {
            ready_to_write(db).await?;
            notify::remove_notify_trigger(db).await?;
            println!("notify trigger removed");
        }
        NotifyCommand::Status => match notify::notify_trigger_channel(db).await? {
            Some(channel) => println!("notify trigger installed: channel {channel}"),
            None => println!("no notify trigger installed (relays wake by polling and in-process commits)"),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_in_urls_and_scrubbed_in_both_spellings() {
        assert_eq!(password_of("postgres://app:s3cr%40t@db:5432/x").as_deref(), Some("s3cr%40t"));
        assert_eq!(password_of("postgres://app@db/x"), None);
        assert_eq!(password_of("sqlite://data/app.db"), None);
        let secrets = vec!["s3cr%40t".to_owned()];
        assert_eq!(scrub("bad s3cr@t and s3cr%40t", &secrets), "bad *** and ***");
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

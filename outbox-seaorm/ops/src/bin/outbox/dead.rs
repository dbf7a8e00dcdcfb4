//! `outbox dead`: dead events, the outbox rows the relay gave up on (in the database): list, show, replay
//! or discard them.

use std::time::Duration;

use clap::{Args, Subcommand};
use outbox_ops::admin::{self, DeadFilter};
use outbox_seaorm::EventId;
use sea_orm::DatabaseConnection;

use crate::db::{migrated, ready_to_write};
use crate::{CliError, JsonArgs, duration};

#[derive(Subcommand)]
pub enum DeadCommand {
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
pub struct FilterArgs {
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

fn parse_id(id: &str) -> Result<EventId, CliError> {
    id.parse()
        .map_err(|_| CliError::Refused(format!("{:?} is not an event id (a UUID)", outbox_seaorm::text::one_line(id))))
}

/// Lists, shows, replays or discards dead events.
pub async fn run(db: &DatabaseConnection, command: DeadCommand) -> Result<(), CliError> {
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
                    outbox_seaorm::text::one_line(event.last_error.as_deref().unwrap_or("-")),
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

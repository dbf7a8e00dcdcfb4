//! `outbox dead`: dead events, the outbox rows the relay gave up on (in the database): list, show, replay
//! or discard them.

use clap::Subcommand;
use outbox_ops::admin;
use outbox_seaorm::EventId;
use sea_orm::DatabaseConnection;

use crate::db::{migrated, ready_to_write};
use crate::selection::SelectionArgs;
use crate::{CliError, JsonArgs};

#[derive(Subcommand)]
pub enum DeadCommand {
    /// List dead events, oldest first (without payloads).
    List {
        #[command(flatten)]
        filter: SelectionArgs,
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
        filter: SelectionArgs,
    },
    /// Delete dead events for good (their aggregates go on without them); prints how many.
    Discard {
        #[command(flatten)]
        filter: SelectionArgs,
    },
}

/// `id` when it is an event id (a UUID), as the selection of dead events needs it.
fn event_id(id: &str) -> Result<String, CliError> {
    parse_id(id).map(|id| id.to_string())
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
            let events = admin::list_dead(db, &filter.filter(event_id)?, limit).await?;
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
            let replayed = admin::replay_dead(db, &filter.selective("dead replay", event_id)?).await?;
            println!("replayed {replayed} dead event(s)");
        }
        DeadCommand::Discard { filter } => {
            ready_to_write(db).await?;
            let discarded = admin::discard_dead(db, &filter.selective("dead discard", event_id)?).await?;
            println!("discarded {discarded} dead event(s)");
        }
    }
    Ok(())
}

//! `outbox notify`: the PostgreSQL trigger that wakes relays (LISTEN/NOTIFY) on each insert into the outbox.

use clap::{Args, Subcommand};
use sea_orm::DatabaseConnection;

use crate::CliError;
use crate::db::{migrated, ready_to_write};

#[derive(Subcommand)]
pub enum NotifyCommand {
    /// Install (or re-point) the trigger that notifies the channel after each insert into the outbox.
    Install(ChannelArgs),
    /// Remove the trigger: no writer notifies any more (relays still poll).
    Remove,
    /// Print the channel the installed trigger notifies, or that none is installed.
    Status,
}

#[derive(Args)]
pub struct ChannelArgs {
    /// The NOTIFY channel (a lower-case identifier).
    #[arg(long, env = "OUTBOX_NOTIFY_CHANNEL", default_value = outbox_seaorm::notify::DEFAULT_CHANNEL)]
    pub notify_channel: outbox_seaorm::notify::NotifyChannel,
}

/// Installs, removes or shows the trigger.
pub async fn run(db: &DatabaseConnection, command: NotifyCommand) -> Result<(), CliError> {
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

//! `outbox migrate`: the outbox migrations, safe when several replicas start at once; with `--partition`,
//! the opt-in partitioned outbox (PostgreSQL).

use clap::Args;
use outbox_ops::admin;
use outbox_seaorm::partition::{self, PartitionInterval};
use sea_orm::DatabaseConnection;

use crate::CliError;
use crate::db::ready_to_write_unmigrated;

#[derive(Args)]
pub struct MigrateArgs {
    /// Then partition `outbox_events` by creation time, one partition per `hour` or `day` (PostgreSQL 13+;
    /// copies the table's rows under a lock, so run it with a small outbox). Cleanup then drops partitions
    /// instead of deleting rows. Given again with another width, it changes the width of new partitions.
    #[arg(long, value_name = "hour|day")]
    partition: Option<PartitionInterval>,
}

/// Applies the pending migrations and says which.
pub async fn run(db: &DatabaseConnection, args: MigrateArgs) -> Result<(), CliError> {
    ready_to_write_unmigrated(db).await?;
    let pending = admin::pending_migrations(db, None).await?;
    outbox_seaorm::migrate(db).await?;
    match pending.len() {
        0 => println!("outbox migrations: all applied already"),
        n => println!("outbox migrations: applied {n} ({})", pending.join(", ")),
    }
    if let Some(interval) = args.partition {
        match partition::partition_outbox(db, interval).await? {
            true => println!("outbox_events: partitioned by creation time, one partition per {interval}"),
            false => println!("outbox_events: partitioned already; new partitions are one {interval} wide"),
        }
    }
    Ok(())
}

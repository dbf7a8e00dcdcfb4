//! `outbox stats`: the backlog, per aggregate type and event type.

use clap::Args;
use outbox_ops::admin;
use sea_orm::DatabaseConnection;

use crate::db::migrated;
use crate::{CliError, JsonArgs};

#[derive(Args)]
pub struct StatsArgs {
    #[command(flatten)]
    output: JsonArgs,
    /// CDC mode: Debezium publishes from the write-ahead log and no row is ever marked published, so print
    /// the rows kept and the oldest row's age instead of a backlog.
    #[arg(long, env = "OUTBOX_CDC")]
    cdc: bool,
}

/// Prints the backlog (refuses an unmigrated database).
pub async fn run(db: &DatabaseConnection, args: StatsArgs) -> Result<(), CliError> {
    migrated(db).await?;
    let mode = if args.cdc { admin::StatsMode::Cdc } else { admin::StatsMode::Relay };
    let stats = admin::stats_in(db, mode).await?;
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
    } else {
        print_stats(&stats);
    }
    Ok(())
}

fn print_stats(stats: &admin::Stats) {
    if let (Some(rows), Some(oldest)) = (stats.rows, stats.oldest_row_seconds) {
        println!("CDC mode: {rows} row(s) kept, oldest {oldest} s (no backlog here: watch the connector's lag)");
        return;
    }
    println!(
        "pending {}, dead {}, oldest pending {} s, most attempts {}",
        stats.totals.pending, stats.totals.dead, stats.totals.oldest_pending_seconds, stats.totals.max_attempts
    );
    for (title, groups) in [("aggregate type", &stats.by_aggregate_type), ("event type", &stats.by_event_type)] {
        if groups.is_empty() {
            continue;
        }
        println!();
        println!("{title:<32} {:>9} {:>9} {:>12} {:>9}", "pending", "dead", "oldest (s)", "attempts");
        for group in groups {
            let figures = &group.figures;
            println!(
                "{:<32} {:>9} {:>9} {:>12} {:>9}",
                group.name, figures.pending, figures.dead, figures.oldest_pending_seconds, figures.max_attempts
            );
        }
    }
}

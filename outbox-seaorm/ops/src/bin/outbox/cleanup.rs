//! `outbox cleanup`: published outbox rows (and, if asked, inbox rows) past their retention, in batches.

use std::time::Duration;

use clap::Args;
use outbox_ops::admin::{self, CleanupConfig};
use sea_orm::DatabaseConnection;

use crate::db::ready_to_write;
use crate::relay::RelayShape;
use crate::{CliError, duration};

#[derive(Args)]
pub struct CleanupArgs {
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

/// Deletes in batches, with progress on a terminal or one line per batch otherwise.
pub async fn run(db: &DatabaseConnection, args: CleanupArgs) -> Result<(), CliError> {
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

//! `outbox check`: the connection, the migrations, a writable primary, clock skew, and with `--log-slot`
//! the log relay's slot.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use outbox_ops::admin::{self, CheckOptions};
use sea_orm::DatabaseConnection;

use crate::{CliError, JsonArgs, duration};

#[derive(Args)]
pub struct CheckArgs {
    #[command(flatten)]
    output: JsonArgs,
    /// The largest clock difference between this host and the database that passes.
    #[arg(long, env = "OUTBOX_MAX_CLOCK_SKEW", default_value = "2s", value_parser = duration::parse, value_name = "DURATION")]
    max_clock_skew: Duration,
    /// The migration bookkeeping table (default: outbox_seaorm_migrations, then seaql_migrations).
    #[arg(long, env = "OUTBOX_MIGRATION_TABLE")]
    migration_table: Option<String>,
    /// Also check PostgreSQL's log relay: wal_level, its slot, the slot's lag and the WAL it holds.
    #[arg(long, value_name = "SLOT")]
    log_slot: Option<String>,
}

/// Runs the checks and prints them; failure when one did not pass.
pub async fn run(db: &DatabaseConnection, args: CheckArgs) -> Result<ExitCode, CliError> {
    let options = CheckOptions {
        max_clock_skew: args.max_clock_skew,
        migration_table: args.migration_table,
        log_slot: args.log_slot,
    };
    let report = admin::check(db, &options).await;
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for check in &report.checks {
            println!("{:<4}  {:<10}  {}", if check.ok { "ok" } else { "FAIL" }, check.name, check.detail);
        }
    }
    Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

//! Run with: cargo run --release -p outbox-relay-bench -- --quick
//!
//! The relay benchmark suite. Each scenario drains (or writes) a backlog on a real database, on a schema
//! or database it drops and recreates, and prints a markdown table per scenario: median, min and max over
//! rounds (variants alternate: A B A B ...), and the ratio against the baseline measured in the same
//! invocation. Baselines are plain SQL relays on their own tables (see `baselines.rs`).
//!
//! `OUTBOX_BENCH_URL` picks the database (default: PostgreSQL `test`, schema `outbox_bench`); the bench
//! refuses any target whose schema/database/file name does not contain `bench`. `--backend all` runs the
//! default PostgreSQL, MariaDB/MySQL and SQLite targets in turn.
//!
//! ```text
//! cargo run --release -p outbox-relay-bench -- --quick                      # every scenario, small, 1 round
//! cargo run --release -p outbox-relay-bench -- --scenario aggregates --out bench.md --plots plots
//! OUTBOX_BENCH_URL=mysql://root@127.0.0.1:3306/outbox_bench cargo run --release -p outbox-relay-bench
//! ```

mod baselines;
mod report;
mod scenarios;
mod target;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};

use crate::scenarios::Ctx;
use crate::target::{Target, URL_VAR};

/// Command line.
#[derive(Parser)]
#[command(about = "Relay and enqueue benchmarks against plain-SQL baselines")]
struct Args {
    /// Small sizes, every scenario, 1 round (whole run under 2 minutes per backend).
    #[arg(long)]
    quick: bool,
    /// Rounds per figure (default: 3, or 1 with --quick).
    #[arg(long)]
    rounds: Option<usize>,
    /// Scenarios to run (repeat or comma-separate); default all.
    #[arg(long, value_delimiter = ',')]
    scenario: Vec<String>,
    /// pg, mysql, sqlite or all (default: the backend of OUTBOX_BENCH_URL, else pg).
    #[arg(long)]
    backend: Option<String>,
    /// Append the markdown tables to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write SVG plots into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Time budget of one drain in seconds (default 120, or 2 with --quick).
    #[arg(long)]
    max_seconds: Option<u64>,
    /// latency: measure a writer in another process, woken by LISTEN/NOTIFY against the poll (PostgreSQL).
    #[arg(long)]
    notify: bool,
    /// Fail when a guarded ratio (hot/spread, burst/steady, lease/transaction, consumer/relay) is below
    /// its floor.
    #[arg(long)]
    floors: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Hidden helper commands.
#[derive(Subcommand)]
enum Command {
    /// Drain what the parent filled and print VmHWM (used by the rss scenario).
    #[command(hide = true)]
    DrainOnly {
        /// `ours` or `raw-ceiling`.
        #[arg(long)]
        what: String,
        /// Events to wait for.
        #[arg(long)]
        events: u64,
        /// Time budget in seconds.
        #[arg(long, default_value_t = 120)]
        max_seconds: u64,
    },
    /// Enqueue at a steady rate into the target the parent prepared (used by `latency --notify`).
    #[command(hide = true)]
    WriteSteady {
        /// Events per second.
        #[arg(long)]
        rate: u32,
        /// How long.
        #[arg(long)]
        seconds: u64,
    },
}

/// The targets this invocation benches.
fn targets(backend: Option<&str>) -> Result<Vec<Target>> {
    let env = std::env::var(URL_VAR).ok().filter(|u| !u.is_empty());
    match (backend, env) {
        (Some("all"), Some(_)) => bail!("--backend all uses the default targets; unset {URL_VAR} or pick one backend"),
        (Some("all"), None) => ["pg", "mysql", "sqlite"].iter().map(|b| Target::default_for(b)).collect(),
        (Some(b), Some(url)) => {
            let target = Target::parse(&url)?;
            let wanted = Target::default_for(b)?;
            if wanted.backend != target.backend {
                bail!("--backend {b} does not match {URL_VAR} ({})", target.label());
            }
            Ok(vec![target])
        }
        (Some(b), None) => Ok(vec![Target::default_for(b)?]),
        (None, Some(url)) => Ok(vec![Target::parse(&url)?]),
        (None, None) => Ok(vec![Target::default_for("pg")?]),
    }
}

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("relay-bench: error: {error:#}");
        std::process::exit(1);
    }
}

async fn run() -> Result<()> {
    let args = Args::parse();
    if let Ok(filter) = std::env::var("OUTBOX_BENCH_LOG") {
        // The library's own logs, for finding where a figure's time goes (`OUTBOX_BENCH_LOG=outbox_seaorm=debug`).
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    if let Some(Command::DrainOnly { what, events, max_seconds }) = &args.command {
        let target = targets(None)?.remove(0);
        return scenarios::rss::drain_only(target, what, *events, Duration::from_secs(*max_seconds)).await;
    }
    if let Some(Command::WriteSteady { rate, seconds }) = &args.command {
        let target = targets(None)?.remove(0);
        return scenarios::latency::write_steady_child(target, *rate, *seconds).await;
    }
    let names: Vec<String> = if args.scenario.is_empty() {
        scenarios::ALL.iter().map(|s| (*s).to_owned()).collect()
    } else {
        args.scenario.clone()
    };
    for name in &names {
        if !scenarios::ALL.contains(&name.as_str()) {
            bail!("unknown scenario {name:?}; expected one of {}", scenarios::ALL.join(", "));
        }
    }
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let budget = Duration::from_secs(args.max_seconds.unwrap_or(if args.quick { 2 } else { 120 }));
    let mut below = Vec::new();
    for target in targets(args.backend.as_deref())? {
        let started = Instant::now();
        eprintln!("relay-bench: {} at {}", target.label(), target::redact(&target.url));
        let ctx = Ctx {
            target,
            quick: args.quick,
            rounds,
            budget,
            out: args.out.clone(),
            plots: args.plots.clone(),
            notify: args.notify,
            floors: args.floors,
            below: std::sync::Mutex::default(),
        };
        for name in &names {
            scenarios::run(&ctx, name).await?;
        }
        eprintln!("relay-bench: {} done in {:.1?}", ctx.target.label(), started.elapsed());
        below.extend(ctx.below.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner));
    }
    if !below.is_empty() {
        bail!("ratios below their floors:\n  {}", below.join("\n  "));
    }
    Ok(())
}

//! Peak resident memory of a relay process draining a large backlog: the bench spawns itself with the
//! hidden `drain-only` subcommand (which drains what the parent filled) and reads the child's `VmHWM`.

use anyhow::{Context, Result, bail};
use sea_orm::DatabaseConnection;

use super::{Ctx, NullPublisher, Shape, config, drain_ours, fill_ours};
use crate::baselines::Baseline;
use crate::report::{Table, fmt, summary};
use crate::target::{Target, URL_VAR};

/// What one child reported.
struct ChildReport {
    published: u64,
    secs: f64,
    hwm_kb: u64,
}

/// Runs the scenario.
pub async fn run(ctx: &Ctx) -> Result<()> {
    let shape = Shape { events: ctx.size(1_000_000, 100_000), aggregates: 10_000 };
    let whats = ["raw-ceiling", "ours"];
    let mut reports: Vec<Vec<ChildReport>> = vec![Vec::new(), Vec::new()];
    for round in 0..ctx.rounds {
        for (i, what) in whats.iter().enumerate() {
            let db = ctx.target.fresh().await?;
            if i == 0 {
                Baseline::RawCeiling.create(&db).await?;
                Baseline::RawCeiling.fill(&db, shape.events, shape.aggregates).await?;
            } else {
                fill_ours(&db, shape, "o").await?;
            }
            db.close().await.context("close")?;
            let report = child(ctx, what, shape.events).await.with_context(|| format!("{what} round {}", round + 1))?;
            reports[i].push(report);
        }
    }
    let header = ["relay", "peak RSS MiB (median)", "min", "max", "vs baseline", "note"];
    let mut table =
        Table::new(ctx.title(&format!("rss: relay process VmHWM draining {} events", shape.events)), &header);
    let base = summary(&reports[0].iter().map(|r| r.hwm_kb as f64 / 1024.0).collect::<Vec<_>>()).0;
    for (i, (what, reports)) in whats.iter().zip(&reports).enumerate() {
        let (m, lo, hi) = summary(&reports.iter().map(|r| r.hwm_kb as f64 / 1024.0).collect::<Vec<_>>());
        let ratio = if i == 0 { "baseline".to_owned() } else { format!("{:.2}x", m / base) };
        let note = reports
            .iter()
            .find(|r| r.published < shape.events as u64)
            .map(|r| format!("timed out after {:.0} s at {:.0} events/s", r.secs, r.published as f64 / r.secs))
            .unwrap_or_default();
        table.row(vec![(*what).to_owned(), fmt(m), fmt(lo), fmt(hi), ratio, note]);
    }
    table.note(
        "The child is this binary (`drain-only`): tokio runtime, one pool, one relay; the parent fills the backlog.",
    );
    table.emit(ctx.out.as_deref())
}

async fn child(ctx: &Ctx, what: &str, events: usize) -> Result<ChildReport> {
    let exe = std::env::current_exe().context("locate the bench binary")?;
    let output = tokio::process::Command::new(exe)
        .env(URL_VAR, &ctx.target.url)
        .args(["drain-only", "--what", what, "--events", &events.to_string()])
        // Memory, not speed: a drain cut short would under-report the peak, so the child gets at least 30 s.
        .args(["--max-seconds", &ctx.budget.max(std::time::Duration::from_secs(30)).as_secs().to_string()])
        .output()
        .await
        .context("spawn the drain-only child")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!("drain-only child failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    let line =
        stdout.lines().find_map(|l| l.strip_prefix("drain-only:")).context("no drain-only line from the child")?;
    let field = |name: &str| -> Result<String> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")).map(str::to_owned))
            .with_context(|| format!("child line without {name}: {line}"))
    };
    Ok(ChildReport {
        published: field("published")?.parse().context("published")?,
        secs: field("secs")?.parse().context("secs")?,
        hwm_kb: field("vmhwm_kb")?.parse().context("vmhwm_kb")?,
    })
}

/// The child side: drain the backlog the parent left (never resets anything), then print one line.
pub async fn drain_only(target: Target, what: &str, events: u64, budget: std::time::Duration) -> Result<()> {
    let ctx = Ctx {
        target,
        quick: false,
        rounds: 1,
        budget,
        out: None,
        plots: None,
        notify: false,
        floors: false,
        below: std::sync::Mutex::default(),
    };
    let run = match what {
        "ours" => drain_ours(&ctx, &config(1000), 1, NullPublisher, events).await?,
        "raw-ceiling" => {
            let db: DatabaseConnection = ctx.target.connect().await?;
            Baseline::RawCeiling.drain(&db, 1000, budget).await?
        }
        other => bail!("drain-only: unknown --what {other:?}; expected ours or raw-ceiling"),
    };
    let status = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .context("no VmHWM in /proc/self/status")?;
    println!("drain-only: published={} secs={:.3} timed_out={} vmhwm_kb={hwm}", run.done, run.secs, run.timed_out);
    Ok(())
}

//! Commit → publish latency of `Relay::run` (polling, and woken by each `enqueue_all` commit), while a
//! writer enqueues at a steady rate.
//!
//! With `--notify`, the writer is another process (this binary's hidden `write-steady` command), so the
//! in-process wake-up cannot reach the relay: the cells compare the poll alone with a `CommitWatch` in the
//! relay's process (every backend) and the LISTEN/NOTIFY wake-up (the notify trigger and a
//! `NotifyListener`; PostgreSQL).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_seaorm::notify::{self, NotifyChannel};
use outbox_seaorm::{CancellationToken, NewEvent, OutboxEvent, PublishError, Publisher, Relay, SeaOrmStore};
use sea_orm::DatabaseConnection;

use super::{Ctx, config};
use crate::report::{Series, Table, fmt, plot, quantile, summary};
use crate::target::{Target, URL_VAR};

/// Who writes, and what wakes the relay.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// The writer shares the relay's process: `enqueue_all` wakes it after each commit.
    InProcess,
    /// The writer is another process; the relay polls.
    OtherProcessPoll,
    /// The writer is another process; the notify trigger and a listener wake the relay.
    OtherProcessNotify,
    /// The writer is another process; a commit watch (every 5 ms) wakes the relay.
    OtherProcessWatch,
}

/// The commit watch's interval in the watch cells.
const WATCH_INTERVAL: Duration = Duration::from_millis(5);

impl Wake {
    fn name(self) -> &'static str {
        match self {
            Wake::InProcess => "in-process",
            Wake::OtherProcessPoll => "other process, poll only",
            Wake::OtherProcessNotify => "other process, LISTEN/NOTIFY",
            Wake::OtherProcessWatch => "other process, commit watch 5 ms",
        }
    }
}

/// Enqueues at `rate` events/s for `duration`: 100 ticks a second, rate/100 events per tick (carrying
/// the remainder); returns how many.
async fn write_steady(db: &DatabaseConnection, rate: u32, duration: Duration) -> Result<u64> {
    let payload = serde_json::json!({"customer": "bench", "total_minor": 4900, "lines": [1, 2, 3]});
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let (mut written, mut owed) = (0u64, 0.0f64);
    while started.elapsed() < duration {
        tick.tick().await;
        owed += f64::from(rate) / 100.0;
        let n = owed.floor() as u64;
        owed -= n as f64;
        let events = (written..written + n)
            .map(|i| NewEvent::new("order", format!("o{}", i % 10_000), "order.placed", &payload))
            .collect::<Result<Vec<_>, _>>()?;
        if !events.is_empty() {
            outbox_seaorm::enqueue_all(db, &events).await.context("enqueue")?;
        }
        written += n;
    }
    Ok(written)
}

/// The child side of `--notify`: write steadily into the target the parent prepared, print one line.
pub async fn write_steady_child(target: Target, rate: u32, seconds: u64) -> Result<()> {
    let db = target.connect().await?;
    let written = write_steady(&db, rate, Duration::from_secs(seconds)).await?;
    db.close().await.context("close")?;
    println!("write-steady: written={written}");
    Ok(())
}

/// Runs the writer as a child process; returns what it wrote.
pub(super) async fn write_in_child(ctx: &Ctx, rate: u32, duration: Duration) -> Result<u64> {
    let exe = std::env::current_exe().context("locate the bench binary")?;
    let output = tokio::process::Command::new(exe)
        .env(URL_VAR, &ctx.target.url)
        .args(["write-steady", "--rate", &rate.to_string(), "--seconds", &duration.as_secs().to_string()])
        .output()
        .await
        .context("spawn the write-steady child")?;
    if !output.status.success() {
        anyhow::bail!("write-steady child failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("write-steady: written="))
        .context("no write-steady line from the child")?
        .trim()
        .parse()
        .context("written")
}

/// Confirms at once and records `now - created_at` (ms) of every event.
#[derive(Clone, Default)]
pub(super) struct Recorder(pub(super) Arc<Mutex<Vec<f64>>>);

impl Publisher for Recorder {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let now = chrono::Utc::now();
        if let Ok(mut seen) = self.0.lock() {
            seen.extend(
                events.iter().map(|e| (now - e.created_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0),
            );
        }
        vec![Ok(()); events.len()]
    }
}

/// One cell: writer at `rate` events/s for `duration` while a relay polls every `poll`; latencies in ms.
async fn cell(ctx: &Ctx, rate: u32, poll: Duration, duration: Duration, wake: Wake) -> Result<Vec<f64>> {
    let db = ctx.target.fresh().await?;
    let stop_listener = CancellationToken::new();
    let mut listener_task = None;
    if wake == Wake::OtherProcessNotify {
        let channel = NotifyChannel::default();
        notify::install_notify_trigger(&db, &channel).await.context("install the notify trigger")?;
        let listener = SeaOrmStore::new(ctx.target.connect().await?).notify_listener(channel)?;
        let stats = listener.stats();
        listener_task = Some(tokio::spawn(listener.run(stop_listener.clone())));
        let since = Instant::now();
        while !stats.get().connected && since.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    if wake == Wake::OtherProcessWatch {
        let watch = SeaOrmStore::new(ctx.target.connect().await?).commit_watch(WATCH_INTERVAL)?;
        listener_task = Some(tokio::spawn(watch.run(stop_listener.clone())));
    }
    let recorder = Recorder::default();
    let relay = Relay::new(
        SeaOrmStore::new(ctx.target.connect().await?),
        recorder.clone(),
        config(1000).with_poll_interval(poll),
    )
    .context("build a relay")?;
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let relay_task = tokio::spawn(async move { relay.run(token).await });

    let written = match wake {
        Wake::InProcess => write_steady(&db, rate, duration).await?,
        _ => write_in_child(ctx, rate, duration).await?,
    };
    let wait = Instant::now();
    while (recorder.0.lock().map(|v| v.len()).unwrap_or(0) as u64) < written && wait.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    relay_task.await.context("relay task panicked")?;
    stop_listener.cancel();
    if let Some(task) = listener_task {
        task.await.context("listener task panicked")?;
    }
    db.close().await.context("close")?;
    let mut seen = recorder.0.lock().map(|v| v.clone()).unwrap_or_default();
    if (seen.len() as u64) < written {
        anyhow::bail!("only {} of {written} events published within 10 s of the writer stopping", seen.len());
    }
    seen.sort_by(f64::total_cmp);
    Ok(seen)
}

/// Runs the scenario.
pub async fn run(ctx: &Ctx) -> Result<()> {
    let duration = Duration::from_secs(ctx.size(10, 3) as u64);
    // The last cell polls at the default 500 ms: with the in-process wake-up (enqueue signals the relay
    // after each commit) its latency no longer follows the poll interval.
    let cells: Vec<(u32, u64, Wake)> = if ctx.notify {
        let mut cells = vec![(1000, 500, Wake::OtherProcessPoll)];
        if ctx.target.backend == sea_orm::DbBackend::Postgres {
            cells.extend([(1000, 500, Wake::OtherProcessNotify), (200, 500, Wake::OtherProcessNotify)]);
        }
        cells.extend([(1000, 500, Wake::OtherProcessWatch), (200, 500, Wake::OtherProcessWatch)]);
        cells.push((1000, 500, Wake::InProcess));
        cells
    } else {
        [(200, 10), (200, 100), (1000, 10), (1000, 100), (1000, 500)]
            .into_iter()
            .map(|(rate, poll)| (rate, poll, Wake::InProcess))
            .collect()
    };
    let mut results: Vec<Vec<Vec<f64>>> = vec![Vec::new(); cells.len()];
    for round in 0..ctx.rounds {
        for (i, (rate, poll, wake)) in cells.iter().enumerate() {
            let lat = cell(ctx, *rate, Duration::from_millis(*poll), duration, *wake)
                .await
                .with_context(|| format!("{rate} events/s, poll {poll} ms, {}, round {}", wake.name(), round + 1))?;
            results[i].push(lat);
        }
    }
    let header = ["rate", "poll", "writer / wake-up", "p50 ms", "p90 ms", "p99 ms", "max ms", "p99 vs baseline"];
    let mut table =
        Table::new(ctx.title(&format!("latency: commit → publish, writer for {} s", duration.as_secs())), &header);
    let stat = |rounds: &[Vec<f64>], q: f64| summary(&rounds.iter().map(|v| quantile(v, q)).collect::<Vec<_>>());
    let cellfmt = |(m, lo, hi): (f64, f64, f64)| format!("{} ({}–{})", fmt(m), fmt(lo), fmt(hi));
    let base_p99 = stat(&results[0], 0.99).0;
    for (i, ((rate, poll, wake), rounds)) in cells.iter().zip(&results).enumerate() {
        let p99 = stat(rounds, 0.99);
        let ratio = if i == 0 {
            "baseline".to_owned()
        } else if base_p99 > 0.0 {
            format!("{:.2}x", p99.0 / base_p99)
        } else {
            "-".into()
        };
        table.row(vec![
            format!("{rate}/s"),
            format!("{poll} ms"),
            wake.name().to_owned(),
            cellfmt(stat(rounds, 0.5)),
            cellfmt(stat(rounds, 0.9)),
            cellfmt(p99),
            cellfmt(stat(rounds, 1.0)),
            ratio,
        ]);
    }
    table.note(
        "Each figure: median (min–max) over rounds of that percentile. created_at is the enqueue time (ms precision).",
    );
    table.emit(ctx.out.as_deref())?;
    if let Some(dir) = &ctx.plots {
        let series: Vec<Series> = cells
            .iter()
            .zip(&results)
            .map(|((rate, poll, wake), rounds)| {
                let v = rounds.last().cloned().unwrap_or_default();
                let points = (0..=100).map(|p| (quantile(&v, f64::from(p) / 100.0), f64::from(p))).collect();
                Series { label: format!("{rate}/s, poll {poll} ms, {}", wake.name()), points }
            })
            .collect();
        let suffix = if ctx.notify { "-notify" } else { "" };
        let file = format!("latency{suffix}-{}.svg", ctx.target.label().to_lowercase());
        let title = format!("commit → publish latency CDF ({})", ctx.target.label());
        let path = plot(dir, &file, &title, "latency ms", "percentile", &series, false)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

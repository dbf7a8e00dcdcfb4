//! Commit → publish latency of `Relay::run` (polling, and woken by each `enqueue_all` commit), while a
//! writer enqueues at a steady rate.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_seaorm::{CancellationToken, NewEvent, OutboxEvent, PublishError, Publisher, Relay, SeaOrmStore};

use super::{Ctx, config};
use crate::report::{Series, Table, fmt, plot, quantile, summary};

/// Confirms at once and records `now - created_at` (ms) of every event.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<f64>>>);

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
async fn cell(ctx: &Ctx, rate: u32, poll: Duration, duration: Duration) -> Result<Vec<f64>> {
    let db = ctx.target.fresh().await?;
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

    // 100 ticks a second, rate/100 events per tick (carrying the remainder).
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
            outbox_seaorm::enqueue_all(&db, &events).await.context("enqueue")?;
        }
        written += n;
    }
    let wait = Instant::now();
    while (recorder.0.lock().map(|v| v.len()).unwrap_or(0) as u64) < written && wait.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    relay_task.await.context("relay task panicked")?;
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
    let cells: Vec<(u32, u64)> = vec![(200, 10), (200, 100), (1000, 10), (1000, 100), (1000, 500)];
    let mut results: Vec<Vec<Vec<f64>>> = vec![Vec::new(); cells.len()];
    for round in 0..ctx.rounds {
        for (i, (rate, poll)) in cells.iter().enumerate() {
            let lat = cell(ctx, *rate, Duration::from_millis(*poll), duration)
                .await
                .with_context(|| format!("{rate} events/s, poll {poll} ms, round {}", round + 1))?;
            results[i].push(lat);
        }
    }
    let header = ["rate", "poll", "p50 ms", "p90 ms", "p99 ms", "max ms", "p99 vs baseline"];
    let mut table =
        Table::new(ctx.title(&format!("latency: commit → publish, writer for {} s", duration.as_secs())), &header);
    let stat = |rounds: &[Vec<f64>], q: f64| summary(&rounds.iter().map(|v| quantile(v, q)).collect::<Vec<_>>());
    let cellfmt = |(m, lo, hi): (f64, f64, f64)| format!("{} ({}–{})", fmt(m), fmt(lo), fmt(hi));
    let base_p99 = stat(&results[0], 0.99).0;
    for (i, ((rate, poll), rounds)) in cells.iter().zip(&results).enumerate() {
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
            .map(|((rate, poll), rounds)| {
                let v = rounds.last().cloned().unwrap_or_default();
                let points = (0..=100).map(|p| (quantile(&v, f64::from(p) / 100.0), f64::from(p))).collect();
                Series { label: format!("{rate}/s, poll {poll} ms"), points }
            })
            .collect();
        let file = format!("latency-{}.svg", ctx.target.label().to_lowercase());
        let title = format!("commit → publish latency CDF ({})", ctx.target.label());
        let path = plot(dir, &file, &title, "latency ms", "percentile", &series, false)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

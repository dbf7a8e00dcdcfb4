//! One soak run: set up, write while relays are killed, drain, check.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_seaorm::CancellationToken;
use outbox_seaorm::testkit::check;
use sea_orm::DbBackend;
use tokio::process::{Child, Command};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::broker::{Lags, connect_publisher, consume_broker, consume_table, remove_topology};
use crate::db::{Progress, Target, connect, count, create_tables, progress, read_history};
use crate::writer::{Plan, write};
use crate::{SoakArgs, SoakError};

/// The lease of SQLite runs: its transaction claim holds the write lock while publishing, and the table
/// broker's insert needs that lock from another connection.
const SQLITE_LEASE: Duration = Duration::from_secs(5);

/// Runs the soak; `Ok(true)` when the history checks out.
pub async fn soak(args: SoakArgs) -> Result<bool, SoakError> {
    validate(&args)?;
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    let run_id = format!("{started}_{}", std::process::id());
    let target = Target::create(args.database_url.as_deref(), &run_id).await?;
    eprintln!("soak: run {run_id} on {}", target.describe());
    let result = soak_in(&args, &target, &run_id).await;
    if args.keep {
        eprintln!("soak: kept {}", target.describe());
    } else {
        if let Err(e) = target.remove().await {
            eprintln!("soak: could not remove the run's database: {e}");
        }
        if let Some(url) = &args.broker
            && let Err(e) = remove_topology(url, &run_id).await
        {
            eprintln!("soak: could not remove the run's broker topology: {e}");
        }
    }
    result
}

fn validate(args: &SoakArgs) -> Result<(), SoakError> {
    let usage = |text: &str| Err(SoakError::Usage(text.to_owned()));
    for (name, rate) in [
        ("--publish-fail-rate", args.publish_fail_rate),
        ("--lost-ack-rate", args.lost_ack_rate),
        ("--rollback-rate", args.rollback_rate),
        ("--inject-loss", args.inject_loss),
    ] {
        if !(0.0..=1.0).contains(&rate) {
            return Err(SoakError::Usage(format!("{name} {rate}: expected a probability in 0..=1")));
        }
    }
    if args.publish_fail_rate + args.lost_ack_rate >= 0.5 {
        return usage("--publish-fail-rate plus --lost-ack-rate must stay below 0.5, or events die of max attempts");
    }
    if args.orders == 0 && args.duration.is_none() {
        return usage("--orders 0 writes until --duration ends: give a --duration");
    }
    if args.aggregates == 0 || args.relays == 0 || args.consumers == 0 || args.concurrent_writers_per_aggregate == 0 {
        return usage("--aggregates, --relays, --consumers and --concurrent-writers-per-aggregate must be at least 1");
    }
    if args.kill_relay_every.is_some_and(|every| !(every.is_finite() && every >= 0.1)) {
        return usage("--kill-relay-every takes seconds, at least 0.1");
    }
    if args.rate.is_some_and(|rate| !(rate.is_finite() && rate > 0.0)) {
        return usage("--rate takes events per second, more than 0");
    }
    Ok(())
}

/// The relay processes of a run.
struct Relays<'a> {
    args: &'a SoakArgs,
    target: &'a Target,
    run_id: &'a str,
    lease: Option<Duration>,
    children: Vec<Child>,
    incarnations: u64,
    kills: u64,
    unexpected_exits: u64,
}

impl<'a> Relays<'a> {
    fn start(
        args: &'a SoakArgs,
        target: &'a Target,
        run_id: &'a str,
        lease: Option<Duration>,
    ) -> Result<Self, SoakError> {
        let mut relays = Relays {
            args,
            target,
            run_id,
            lease,
            children: Vec::new(),
            incarnations: 0,
            kills: 0,
            unexpected_exits: 0,
        };
        for _ in 0..args.relays {
            let child = relays.spawn()?;
            relays.children.push(child);
        }
        Ok(relays)
    }

    fn spawn(&mut self) -> Result<Child, SoakError> {
        self.incarnations += 1;
        let seed = self.args.seed.wrapping_mul(1_000_003).wrapping_add(self.incarnations);
        let mut command = Command::new(std::env::current_exe()?);
        command
            .arg("relay")
            .env("OUTBOX_SOAK_DATABASE_URL", &self.target.url)
            .args(["--run-id", self.run_id])
            .args(["--consumers", &self.args.consumers.to_string()])
            .args(["--seed", &seed.to_string()])
            .args(["--publish-fail-rate", &self.args.publish_fail_rate.to_string()])
            .args(["--lost-ack-rate", &self.args.lost_ack_rate.to_string()])
            .args(["--inject-loss", &self.args.inject_loss.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(schema) = &self.target.schema {
            command.args(["--schema", schema]);
        }
        if let Some(broker) = &self.args.broker {
            command.env("OUTBOX_SOAK_BROKER", broker);
        }
        if let Some(lease) = self.lease {
            command.args(["--lease", &format!("{}ms", lease.as_millis())]);
        }
        Ok(command.spawn()?)
    }

    /// SIGKILLs relay `index` and starts a new one in its place.
    async fn kill_and_restart(&mut self, index: usize) -> Result<(), SoakError> {
        let child = &mut self.children[index];
        child.start_kill()?; // SIGKILL on Unix
        child.wait().await?;
        self.kills += 1;
        self.children[index] = self.spawn()?;
        Ok(())
    }

    /// Restarts relays that exited by themselves (they should not); fails after 20 such exits.
    fn restart_exited(&mut self) -> Result<(), SoakError> {
        for index in 0..self.children.len() {
            if let Some(status) = self.children[index].try_wait()? {
                self.unexpected_exits += 1;
                eprintln!("soak: relay {index} exited by itself ({status}); restarting it");
                if self.unexpected_exits > 20 {
                    return Err(SoakError::Usage(
                        "relays exited by themselves 20 times; see their errors above".into(),
                    ));
                }
                self.children[index] = self.spawn()?;
            }
        }
        Ok(())
    }

    async fn kill_all(&mut self) {
        for child in &mut self.children {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

async fn soak_in(args: &SoakArgs, target: &Target, run_id: &str) -> Result<bool, SoakError> {
    let writers = args.writers.unwrap_or_else(|| 4.max(2 * args.concurrent_writers_per_aggregate));
    let db = connect(&target.url, target.schema.as_deref(), writers + args.consumers + 4).await?;
    create_tables(&db).await?;
    let lease = args.lease.or((db.get_database_backend() == DbBackend::Sqlite).then_some(SQLITE_LEASE));
    if let Some(url) = &args.broker {
        // The stream, exchange and queue exist before any relay publishes or the consumer binds.
        connect_publisher(url, run_id, true).await?;
    }

    let stop_consumers = CancellationToken::new();
    let lags = Lags::default();
    let mut consumers: JoinSet<Result<(), SoakError>> = JoinSet::new();
    match &args.broker {
        None => {
            for lane in 0..args.consumers {
                let lane = i32::try_from(lane).map_err(|_| SoakError::Usage("too many consumers".into()))?;
                consumers.spawn(consume_table(db.clone(), lane, stop_consumers.clone()));
            }
        }
        Some(url) => {
            let (db, url, run_id, stop) = (db.clone(), url.clone(), run_id.to_owned(), stop_consumers.clone());
            let handling = (args.consumers, args.group_size, args.batch_handler);
            let lags = lags.clone();
            consumers.spawn(async move { consume_broker(db, &url, &run_id, handling, lags, stop).await });
        }
    }

    let mut relays = Relays::start(args, target, run_id, lease)?;
    let started = Instant::now();
    let plan = Arc::new(Plan {
        orders: args.orders,
        aggregates: args.aggregates,
        events_per_order: args.events_per_order,
        per_aggregate: u64::from(args.concurrent_writers_per_aggregate),
        rollback_rate: args.rollback_rate,
        rate: args.rate,
        deadline: args.duration.map(|duration| started + duration),
        started,
        seed: args.seed,
        next: AtomicU64::new(0),
        committed: AtomicU64::new(0),
        rolled_back: AtomicU64::new(0),
    });
    eprintln!(
        "soak: {} writers ({} per aggregate) over {} aggregates, {} relay processes{}, {} consumers, broker {}",
        writers,
        args.concurrent_writers_per_aggregate,
        args.aggregates,
        args.relays,
        lease.map_or(String::new(), |lease| format!(" (lease {lease:?})")),
        args.consumers,
        args.broker.as_deref().map_or("soak_broker table".to_owned(), outbox_seaorm::redact_url),
    );
    let stop_writers = CancellationToken::new();
    let mut writer_tasks: JoinSet<Result<(), SoakError>> = JoinSet::new();
    for _ in 0..writers {
        writer_tasks.spawn(write(db.clone(), plan.clone(), stop_writers.clone()));
    }

    let kill_every = args.kill_relay_every.map(Duration::from_secs_f64);
    let mut next_kill = kill_every.map(|every| Instant::now() + every);
    let mut next_victim = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut last_report = Instant::now();
    let mut last_progress = Instant::now();
    let mut writing_ended: Option<Instant> = None;
    let mut last_change = (Instant::now(), Progress::default());
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);

    let outcome: Result<(), SoakError> = loop {
        tokio::select! {
            joined = writer_tasks.join_next(), if writing_ended.is_none() => match joined {
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => break Err(e),
                Some(Err(e)) => break Err(SoakError::Usage(format!("a writer panicked: {e}"))),
                None => {
                    writing_ended = Some(Instant::now());
                    eprintln!("soak: writers done after {:.1}s; draining", started.elapsed().as_secs_f64());
                }
            },
            joined = consumers.join_next() => match joined {
                Some(Ok(Err(e))) => break Err(e),
                Some(Err(e)) => break Err(SoakError::Usage(format!("a consumer panicked: {e}"))),
                _ => break Err(SoakError::Usage("a consumer stopped before the run ended".into())),
            },
            _ = &mut interrupted, if !stop_writers.is_cancelled() => {
                eprintln!("soak: interrupted; stopping the writers, then draining");
                stop_writers.cancel();
            }
            _ = tick.tick() => {
                if let Err(e) = relays.restart_exited() {
                    break Err(e);
                }
                if let (Some(at), Some(every)) = (next_kill, kill_every)
                    && Instant::now() >= at
                {
                    if let Err(e) = relays.kill_and_restart(next_victim % relays.children.len()).await {
                        break Err(e);
                    }
                    next_victim += 1;
                    next_kill = Some(at + every);
                }
                // Counting is not free on a large run: every 5 s while writing, every second while draining.
                let due = if writing_ended.is_some() { Duration::from_secs(1) } else { Duration::from_secs(5) };
                if last_progress.elapsed() < due {
                    continue;
                }
                last_progress = Instant::now();
                let now = match progress(&db).await {
                    Ok(now) => now,
                    Err(e) => {
                        tracing::warn!(error = %e, "soak: progress query failed");
                        continue;
                    }
                };
                if last_report.elapsed() >= Duration::from_millis(4900) {
                    last_report = Instant::now();
                    eprintln!(
                        "soak: {:>5.0}s committed {} applied {} unpublished {} unconsumed {} relays killed {}",
                        started.elapsed().as_secs_f64(), now.committed, now.applied, now.unpublished, now.unconsumed, relays.kills
                    );
                }
                if now != last_change.1 {
                    last_change = (Instant::now(), now);
                }
                let Some(ended) = writing_ended else { continue };
                if now.applied >= now.committed && now.unpublished == 0 && now.unconsumed == 0 {
                    eprintln!("soak: drained {:.1}s after the writers", ended.elapsed().as_secs_f64());
                    break Ok(());
                }
                if now.unpublished == 0 && now.unconsumed == 0 && last_change.0.elapsed() >= Duration::from_secs(5) {
                    eprintln!("soak: nothing left to publish or consume, {} events not applied; checking", now.committed - now.applied.min(now.committed));
                    break Ok(());
                }
                if ended.elapsed() >= args.drain_timeout {
                    eprintln!("soak: not drained {:?} after the writers; checking what there is", args.drain_timeout);
                    break Ok(());
                }
            }
        }
    };
    stop_writers.cancel();
    relays.kill_all().await;
    stop_consumers.cancel();
    while consumers.join_next().await.is_some() {}
    outcome?;

    let dead = count(&db, "SELECT COUNT(*) FROM outbox_events WHERE dead_at_ms IS NOT NULL").await?;
    let (committed, delivered, applied) = read_history(&db).await?;
    let report = check(&committed, &delivered, &applied);
    let writing = writing_ended.map_or(started.elapsed(), |ended| ended - started).as_secs_f64();
    eprintln!(
        "soak: {} orders committed, {} rolled back on purpose; {:.0} events/s committed over {:.1}s; relays killed {} times ({} exited by themselves); {} dead events",
        plan.committed.load(Ordering::Relaxed),
        plan.rolled_back.load(Ordering::Relaxed),
        report.committed as f64 / writing.max(0.001),
        writing,
        relays.kills,
        relays.unexpected_exits,
        dead,
    );
    let mut lags = std::mem::take(&mut *lags.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    if !lags.is_empty() {
        lags.sort_unstable();
        let at = |q: f64| lags[((lags.len() - 1) as f64 * q).round() as usize];
        eprintln!(
            "soak: consumer lag, enqueue → applied, over {} events: p50 {} ms, p99 {} ms, max {} ms",
            lags.len(),
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
    for example in &report.examples {
        eprintln!("soak: {example}");
    }
    eprintln!("soak: {}", if report.is_ok() { "history holds" } else { "HISTORY BROKEN" });
    println!("{}", report.to_json());
    Ok(report.is_ok())
}

//! The stats sampler and the heartbeats: what a running service says about itself, for its metrics and
//! for every other process (the dashboard, `outbox_ops::admin::relays`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::{Health, SharedHealth};
use crate::store::{Heartbeat, MaintenanceStore};

/// Who this service is, for its heartbeats.
pub(super) struct Beacon {
    process: String,
    host: String,
    pid: u32,
    relays: u32,
    started_at: DateTime<Utc>,
    every: Duration,
}

impl Beacon {
    pub(super) fn new(relays: u32, every: Duration) -> Self {
        let host = host_name();
        let (pid, started_at) = (std::process::id(), Utc::now());
        let process = crate::text::truncate(&format!("{host}:{pid}:{}", started_at.timestamp_millis()), 100);
        Beacon { process, host, pid, relays, started_at, every }
    }

    fn beat(&self, health: &Health, stopped: bool) -> Heartbeat {
        Heartbeat {
            process: self.process.clone(),
            host: self.host.clone(),
            pid: self.pid,
            relays: self.relays,
            started_at: self.started_at,
            at: Utc::now(),
            every: self.every,
            last_success_at: health.last_success_at,
            consecutive_failures: health.consecutive_failures,
            last_error: health.last_error.clone(),
            published_events: health.published_events,
            stopped,
        }
    }
}

/// The machine's name, from the kernel or the environment; `unknown` when neither says.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|name| crate::text::one_line(name.trim()))
        .filter(|name| !name.is_empty());
    crate::text::truncate(name.as_deref().unwrap_or("unknown"), 100)
}

/// Samples the backlog and writes this service's heartbeat every interval (and each second in which it
/// published, between samples); at shutdown, one last heartbeat that says it stopped (given 2 s, so a dead database cannot hold the shutdown).
pub(super) async fn sample_loop<S: MaintenanceStore>(
    store: Arc<S>,
    beacon: Beacon,
    shutdown: CancellationToken,
    health: SharedHealth,
) {
    loop {
        let sample = tokio::select! {
            () = shutdown.cancelled() => break,
            sample = store.stats(Utc::now()) => sample,
        };
        match sample {
            Ok(stats) => {
                crate::metrics::stats_sample(&stats);
                let mut health = health.lock();
                health.stats = Some(stats);
                health.sampled_at = Some(Utc::now());
            }
            Err(error) => tracing::warn!(%error, "outbox stats sample failed"),
        }
        let beat = beacon.beat(&health.lock(), false);
        let recorded = tokio::select! {
            () = shutdown.cancelled() => break,
            recorded = store.record_heartbeat(&beat) => recorded,
        };
        // What the database holds now; after a failed write, whatever count the next second has differs.
        let told = match recorded {
            Ok(()) => beat.published_events,
            Err(error) => {
                tracing::warn!(%error, "outbox heartbeat not recorded");
                u64::MAX
            }
        };
        if progress_beats(&*store, &beacon, told, &shutdown, &health).await.is_break() {
            break;
        }
    }
    let last = beacon.beat(&health.lock(), true);
    match tokio::time::timeout(Duration::from_secs(2), store.record_heartbeat(&last)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%error, "outbox: the last heartbeat was not recorded"),
        Err(_) => tracing::debug!("outbox: the last heartbeat took over 2 s; given up"),
    }
}

/// How often, between two stats samples, a service that published since its last heartbeat writes one.
const PROGRESS_BEAT: Duration = Duration::from_secs(1);

/// Waits until the next stats sample, writing a heartbeat each [`PROGRESS_BEAT`] in which the relays
/// published something: a process killed between two samples shows what it published up to its last
/// second, not up to its last sample. An idle service writes nothing more. `told`: the count the last
/// heartbeat carried. `Break` on shutdown.
async fn progress_beats<S: MaintenanceStore>(
    store: &S,
    beacon: &Beacon,
    mut told: u64,
    shutdown: &CancellationToken,
    health: &SharedHealth,
) -> std::ops::ControlFlow<()> {
    let next_sample = tokio::time::Instant::now() + beacon.every;
    loop {
        let now = tokio::time::Instant::now();
        if now >= next_sample {
            return std::ops::ControlFlow::Continue(());
        }
        tokio::select! {
            () = shutdown.cancelled() => return std::ops::ControlFlow::Break(()),
            () = tokio::time::sleep(Ord::min(PROGRESS_BEAT, next_sample - now)) => {}
        }
        let beat = {
            let health = health.lock();
            if health.published_events == told {
                continue;
            }
            told = health.published_events;
            beacon.beat(&health, false)
        };
        let recorded = tokio::select! {
            () = shutdown.cancelled() => return std::ops::ControlFlow::Break(()),
            recorded = store.record_heartbeat(&beat) => recorded,
        };
        if let Err(error) = recorded {
            tracing::debug!(%error, "outbox progress heartbeat not recorded");
        }
    }
}

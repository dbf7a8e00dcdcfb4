//! What the relay's instrumentation costs: the same backlog drained with no metrics recorder and no
//! subscriber (every `metrics` and `tracing` call a no-op), with a metrics recorder (metrics-util's atomic
//! registry, the storage the Prometheus exporter uses), and with that recorder plus a `tracing` subscriber at
//! `info` that formats every span (the relay's publish span per wave) into a sink.
//!
//! The recorder and the subscriber are installed once for the process and switched per variant, so the
//! variants alternate within one run.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::reload;
use tracing_subscriber::util::SubscriberInitExt as _;

use super::{Ctx, NullPublisher, Shape, alternate_with, config, drain_ours, fill_ours};
use crate::report::{RATE_HEADER, Table};

/// Whether [`Switch`] records.
static RECORDING: AtomicBool = AtomicBool::new(false);

/// A recorder that hands out real handles while [`RECORDING`] is set and no-op handles otherwise.
struct Switch(Registry<Key, AtomicStorage>);

impl Recorder for Switch {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        if !RECORDING.load(Ordering::Relaxed) {
            return Counter::noop();
        }
        self.0.get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        if !RECORDING.load(Ordering::Relaxed) {
            return Gauge::noop();
        }
        self.0.get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if !RECORDING.load(Ordering::Relaxed) {
            return Histogram::noop();
        }
        self.0.get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

type FilterHandle = reload::Handle<LevelFilter, tracing_subscriber::Registry>;

/// Installs the switchable recorder and subscriber once; the handle that switches the subscriber's level.
fn install() -> Result<&'static FilterHandle> {
    static HANDLE: OnceLock<FilterHandle> = OnceLock::new();
    if let Some(handle) = HANDLE.get() {
        return Ok(handle);
    }
    metrics::set_global_recorder(Switch(Registry::atomic()))
        .map_err(|e| anyhow::anyhow!("install the metrics recorder: {e}"))?;
    let (filter, handle) = reload::Layer::new(LevelFilter::OFF);
    tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink))
        .try_init()
        .map_err(|e| anyhow::anyhow!("install the tracing subscriber: {e}"))?;
    Ok(HANDLE.get_or_init(|| handle))
}

/// Runs the scenario.
pub async fn run(ctx: &Ctx) -> Result<()> {
    let filter = install()?;
    let shape = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let runs = alternate_with(ctx, 3, async |i| {
        RECORDING.store(i >= 1, Ordering::Relaxed);
        let level = if i == 2 { LevelFilter::INFO } else { LevelFilter::OFF };
        filter.modify(|f| *f = level).map_err(|e| anyhow::anyhow!("switch the subscriber: {e}"))?;
        let db = ctx.target.fresh().await?;
        fill_ours(&db, shape, "o").await?;
        let run = drain_ours(ctx, &config(1000), 1, NullPublisher, shape.events as u64).await;
        db.close().await.map_err(|e| anyhow::anyhow!("close: {e}"))?;
        run
    })
    .await;
    RECORDING.store(false, Ordering::Relaxed);
    filter.modify(|f| *f = LevelFilter::OFF).map_err(|e| anyhow::anyhow!("switch the subscriber: {e}"))?;
    let runs = runs?;
    let mut table = Table::new(
        ctx.title(&format!(
            "telemetry: {} events over 10,000 aggregates, batch 1000, 1 relay, confirm-at-once publisher, events/s",
            shape.events
        )),
        &RATE_HEADER,
    );
    let base = Some(runs[0].as_slice());
    table.rate_row("instrumentation", "no recorder, no subscriber", &runs[0], None, "events/s");
    table.rate_row("instrumentation", "metrics recorder (atomic registry)", &runs[1], base, "events/s");
    table.rate_row("instrumentation", "metrics recorder + fmt subscriber at info", &runs[2], base, "events/s");
    table.emit(ctx.out.as_deref())
}

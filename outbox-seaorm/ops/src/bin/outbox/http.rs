//! `outbox relay --http ADDR`: `/metrics` (Prometheus text) and the health probes (with `--dashboard`,
//! the operations pages at `/` too: [`crate::dashboard`]).
//!
//! - `GET /metrics`: every `outbox_*` metric ([`outbox_seaorm::metrics`]) in the Prometheus text format,
//!   from the recorder this binary installs (the library never installs one).
//! - `GET /health/live`: 200 while the process runs (a liveness probe: restart only when it stops
//!   answering).
//! - `GET /health/ready` (and `GET /health`): 200 when the relay is connected to the broker, its last
//!   successful pass is recent, the oldest pending event is younger than `--ready-max-pending-age` and
//!   (`--source log`) the slot's unconfirmed WAL is below `--ready-max-slot-lag`; 503 otherwise. The body is JSON: `ready`, the `reasons` it is not, the service's `health`, and
//!   `stats_age_seconds`: how old `health.stats` (the stats sampler's last reading) is.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox_seaorm::{CancellationToken, Health, OutboxService};

use crate::CliError;

/// Buckets of the `_seconds` histograms: 1 ms to 1 minute.
const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Buckets of the batch size histogram.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0];

/// When the relay counts as ready.
#[derive(Clone, Copy, Debug)]
pub struct Readiness {
    /// The oldest pending event must be younger than this.
    pub max_pending_age: Duration,
    /// The last successful relay pass must be more recent than this.
    pub max_pass_age: Duration,
    /// The log relay's slot must hold fewer unconfirmed WAL bytes than this (`--source log`).
    pub max_slot_lag: Option<u64>,
}

impl Readiness {
    /// Why `health` (or its absence: the broker is not connected yet) is not ready, at `now`; empty when
    /// it is.
    pub fn reasons(&self, health: Option<&Health>, now: chrono::DateTime<chrono::Utc>) -> Vec<String> {
        let Some(health) = health else {
            return vec!["the broker is not connected yet; events wait in the outbox".to_owned()];
        };
        let mut reasons = Vec::new();
        if health.stopped {
            reasons.push("the relay is stopping".to_owned());
        }
        match health.last_success_at {
            None => reasons.push("no relay pass has succeeded yet".to_owned()),
            Some(at) => {
                let age = (now - at).to_std().unwrap_or(Duration::ZERO);
                if age > self.max_pass_age {
                    reasons.push(format!(
                        "the last successful relay pass was {}s ago (max {}s); {} failed since",
                        age.as_secs(),
                        self.max_pass_age.as_secs(),
                        health.consecutive_failures
                    ));
                }
            }
        }
        if let (Some(max), Some(lag)) = (self.max_slot_lag, health.replication_lag_bytes)
            && lag >= max
        {
            reasons
                .push(format!("the replication slot holds {lag} bytes of WAL the relay has not confirmed (max {max})"));
        }
        match health.oldest_pending_age() {
            None => reasons.push("no backlog sample yet".to_owned()),
            Some(age) if age >= self.max_pending_age => reasons.push(format!(
                "the oldest pending event is {}s old (max {}s)",
                age.as_secs(),
                self.max_pending_age.as_secs()
            )),
            Some(_) => {}
        }
        reasons
    }
}

/// What the handlers read: the service once it started, and the recorder's handle.
#[derive(Clone)]
pub struct Shared {
    /// Set once the broker answered and the service started.
    pub service: Arc<OnceLock<OutboxService>>,
    metrics: PrometheusHandle,
    readiness: Readiness,
}

/// Installs the Prometheus recorder for the whole process; call it once, before the service starts.
pub fn install_recorder(readiness: Readiness) -> Result<Shared, CliError> {
    let metrics = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(outbox_seaorm::metrics::RELAY_BATCH_SIZE.to_owned()), BATCH_BUCKETS)
        })
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| CliError::Refused(format!("cannot install the metrics recorder: {e}")))?;
    outbox_seaorm::metrics::describe();
    Ok(Shared { service: Arc::new(OnceLock::new()), metrics, readiness })
}

/// Binds `addr` (a failure is fatal at once) and serves until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    shared: Shared,
    dashboard: Option<Router>,
    shutdown: CancellationToken,
) -> Result<(), CliError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::Refused(format!("--http {addr}: cannot listen: {e}")))?;
    tracing::info!(%addr, "serving /metrics, /health/live and /health/ready");
    let upkeep = shared.metrics.clone();
    let upkeep_stop = shutdown.clone();
    tokio::spawn(async move {
        // Histograms' storage is drained into the exporter's buckets here.
        loop {
            tokio::select! {
                () = upkeep_stop.cancelled() => break,
                () = tokio::time::sleep(Duration::from_secs(5)) => upkeep.run_upkeep(),
            }
        }
    });
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/health", get(ready))
        .with_state(shared);
    let app = match dashboard {
        Some(pages) => app.merge(pages),
        None => app,
    };
    tokio::spawn(async move {
        let server = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned());
        if let Err(error) = server.await {
            tracing::error!(%error, "the HTTP endpoint failed; the relay goes on");
        }
    });
    Ok(())
}

async fn metrics(State(shared): State<Shared>) -> Response {
    let text = shared.metrics.render();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn live() -> Response {
    axum::Json(serde_json::json!({ "live": true })).into_response()
}

async fn ready(State(shared): State<Shared>) -> Response {
    let health = shared.service.get().map(OutboxService::health);
    let now = chrono::Utc::now();
    let reasons = shared.readiness.reasons(health.as_ref(), now);
    let status = if reasons.is_empty() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    // `health.stats` is the sampler's last reading, not the outbox now: say how old it is.
    let stats_age_seconds =
        health.as_ref().and_then(|h| h.sampled_at).map(|at| (now - at).num_milliseconds().max(0) as f64 / 1000.0);
    let body = serde_json::json!({
        "ready": reasons.is_empty(),
        "reasons": reasons,
        "stats_age_seconds": stats_age_seconds,
        "health": health,
    });
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy(now: chrono::DateTime<chrono::Utc>, oldest_pending_seconds: u64) -> Health {
        let mut health = Health::default();
        health.last_success_at = Some(now);
        health.stats = Some(outbox_seaorm::store::OutboxStats { oldest_pending_seconds, ..Default::default() });
        health
    }

    const READINESS: Readiness = Readiness {
        max_pending_age: Duration::from_secs(60),
        max_pass_age: Duration::from_secs(30),
        max_slot_lag: None,
    };

    #[test]
    fn ready_needs_a_connected_broker_a_recent_pass_and_a_young_backlog() {
        let now = chrono::Utc::now();
        assert!(READINESS.reasons(Some(&healthy(now, 59)), now).is_empty());
        let old = READINESS.reasons(Some(&healthy(now, 60)), now);
        assert_eq!(old, ["the oldest pending event is 60s old (max 60s)"]);
        let later = now + chrono::Duration::seconds(31);
        assert!(READINESS.reasons(Some(&healthy(now, 0)), later)[0].contains("31s ago (max 30s)"));
        assert!(READINESS.reasons(None, now)[0].contains("not connected"));
    }

    #[test]
    fn a_log_relay_is_not_ready_once_its_slot_lags_past_the_bound() {
        let now = chrono::Utc::now();
        let log = Readiness { max_slot_lag: Some(1 << 20), ..READINESS };
        let mut health = healthy(now, 0);
        health.replication_lag_bytes = Some((1 << 20) - 1);
        assert!(log.reasons(Some(&health), now).is_empty());
        health.replication_lag_bytes = Some(1 << 20);
        assert_eq!(
            log.reasons(Some(&health), now),
            ["the replication slot holds 1048576 bytes of WAL the relay has not confirmed (max 1048576)"]
        );
        assert!(READINESS.reasons(Some(&health), now).is_empty(), "the polling relay has no slot bound");
    }
}

//! `outbox relay`: the [`OutboxService`] until SIGTERM or SIGINT, with `--http` serving `/metrics` and the
//! health probes ([`http`]). A broker that is down at start is retried (with the backlog in
//! the log) until it answers; a bad URL or setting is fatal at once.

use std::time::Duration;

use clap::Args;
use outbox_ops::admin;
use outbox_seaorm::brokers::{ConnectRetry, connect_with_retry};
use outbox_seaorm::notify;
use outbox_seaorm::{
    Backoff, CancellationToken, ClaimMode, CleanupConfig, DeadLetterPolicy, Health, OutboxService, RelayConfig,
    SeaOrmStore, ServiceConfig, redact_url,
};
use sea_orm::DatabaseConnection;

use crate::broker::BrokerArgs;
use crate::db::ready_to_write;
use crate::notify::ChannelArgs;
use crate::{CliError, broker, duration, http};

/// The relay settings that decide how long an event may be retried (the cleanup checks its inbox
/// retention against them).
#[derive(Args, Clone)]
pub struct RelayShape {
    /// Failed attempts after which an event is dead.
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = 10)]
    max_attempts: i32,
    /// The first retry delay; it doubles per attempt up to --backoff-max.
    #[arg(long, env = "OUTBOX_BACKOFF_INITIAL", default_value = "1s", value_parser = duration::parse, value_name = "DURATION")]
    backoff_initial: Duration,
    /// The longest retry delay.
    #[arg(long, env = "OUTBOX_BACKOFF_MAX", default_value = "5m", value_parser = duration::parse, value_name = "DURATION")]
    backoff_max: Duration,
    /// A publish that takes longer fails.
    #[arg(long, env = "OUTBOX_PUBLISH_TIMEOUT", default_value = "10s", value_parser = duration::parse, value_name = "DURATION")]
    publish_timeout: Duration,
    /// Lease mode: claim rows for this long and publish outside any transaction (for slow brokers).
    #[arg(long, env = "OUTBOX_LEASE", value_parser = duration::parse, value_name = "DURATION")]
    lease: Option<Duration>,
}

impl RelayShape {
    pub fn config(&self) -> RelayConfig {
        let mut config = RelayConfig::default()
            .with_max_attempts(self.max_attempts)
            .with_backoff(Backoff { initial: self.backoff_initial, max: self.backoff_max, multiplier: 2 })
            .with_publish_timeout(self.publish_timeout);
        if let Some(duration) = self.lease {
            config = config.with_claim_mode(ClaimMode::Lease { duration });
        }
        config
    }
}

#[derive(Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    shape: RelayShape,
    /// Most rows claimed per pass.
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = 100)]
    batch_size: u32,
    /// Sleep between passes when nothing was due.
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", default_value = "500ms", value_parser = duration::parse, value_name = "DURATION")]
    poll_interval: Duration,
    /// Relay tasks in this process.
    #[arg(long, env = "OUTBOX_RELAYS", default_value_t = 1)]
    pub relays: u32,
    /// Let later events of an aggregate go on past a dead one (consumers see a gap).
    #[arg(long, env = "OUTBOX_SKIP_DEAD")]
    skip_dead: bool,
    /// Delete published outbox rows older than this.
    #[arg(long, env = "OUTBOX_OUTBOX_RETENTION", default_value = "7d", value_parser = duration::parse, value_name = "DURATION")]
    outbox_retention: Duration,
    /// Delete inbox rows older than this (default: keep them); must exceed the redelivery horizon.
    #[arg(long, env = "OUTBOX_INBOX_RETENTION", value_parser = duration::parse, value_name = "DURATION")]
    inbox_retention: Option<Duration>,
    /// Time between cleanups.
    #[arg(long, env = "OUTBOX_CLEANUP_INTERVAL", default_value = "5m", value_parser = duration::parse, value_name = "DURATION")]
    cleanup_interval: Duration,
    /// Most rows per cleanup statement.
    #[arg(long, env = "OUTBOX_CLEANUP_BATCH_SIZE", default_value_t = 1000)]
    cleanup_batch_size: u32,
    /// Run no cleanup in this process.
    #[arg(long, env = "OUTBOX_NO_CLEANUP")]
    no_cleanup: bool,
    /// Time between backlog samples and heartbeats (the dashboard shows a relay as gone after three).
    #[arg(long, env = "OUTBOX_STATS_INTERVAL", default_value = "15s", value_parser = duration::parse, value_name = "DURATION")]
    stats_interval: Duration,
    /// Time between status lines in the log.
    #[arg(long, env = "OUTBOX_STATUS_INTERVAL", default_value = "60s", value_parser = duration::parse, value_name = "DURATION")]
    status_interval: Duration,
    /// Serve /metrics (Prometheus text), /health/live and /health/ready on this address, e.g. 0.0.0.0:9090.
    #[arg(long, env = "OUTBOX_HTTP")]
    http: Option<std::net::SocketAddr>,
    /// /health/ready answers 503 once the oldest pending event is this old.
    #[arg(long, env = "OUTBOX_READY_MAX_PENDING_AGE", default_value = "60s", value_parser = duration::parse, value_name = "DURATION")]
    ready_max_pending_age: Duration,
    /// /health/ready answers 503 when no relay pass succeeded for this long.
    #[arg(long, env = "OUTBOX_READY_MAX_PASS_AGE", default_value = "30s", value_parser = duration::parse, value_name = "DURATION")]
    ready_max_pass_age: Duration,
    /// PostgreSQL: LISTEN on the notify channel and pass as soon as another process commits outbox rows
    /// (install the trigger with `outbox notify install`); the poll stays the fallback.
    #[arg(long, env = "OUTBOX_LISTEN")]
    pub listen: bool,
    /// Any database: read the highest outbox `seq` this often and pass as soon as it grew (rows committed
    /// by other processes), e.g. 5ms; costs the writers nothing, the database one cheap read per interval.
    #[arg(long, env = "OUTBOX_WATCH", value_parser = duration::parse, value_name = "DURATION")]
    watch: Option<Duration>,
    /// With --http: also serve the operations dashboard at `/` (read-only without --admin-token).
    #[arg(long = "dashboard", env = "OUTBOX_DASHBOARD", requires = "http")]
    dashboard_pages: bool,
    #[command(flatten)]
    pub dashboard: crate::dashboard::DashboardArgs,
    #[command(flatten)]
    channel: ChannelArgs,
    #[command(flatten)]
    pub log: crate::log::LogArgs,
}

/// Runs the relay until a signal (refuses a database that is read-only or not migrated, and with
/// `--source log` a server not set up for logical replication). `url` is the database's, for the log
/// relay's replication connection.
pub async fn run(db: DatabaseConnection, url: &str, args: RelayArgs) -> Result<(), CliError> {
    let kind = broker::kind(&args.broker)?;
    ready_to_write(&db).await?;
    let log_relay = match args.log.source {
        crate::log::Source::Polling => None,
        crate::log::Source::Log => {
            let config = args.log.config(args.shape.config().with_batch_size(args.batch_size))?;
            outbox_seaorm::log::check(&db, &config).await.map_err(crate::log::refused)?;
            Some(config)
        }
    };
    let mut relay = args.shape.config().with_batch_size(args.batch_size).with_poll_interval(args.poll_interval);
    if args.skip_dead {
        relay = relay.with_dead_letters(DeadLetterPolicy::SkipDead);
    }
    let cleanup = (!args.no_cleanup).then(|| {
        let config = CleanupConfig::default()
            .with_interval(args.cleanup_interval)
            .with_outbox_retention(args.outbox_retention)
            .with_batch_size(args.cleanup_batch_size);
        match args.inbox_retention {
            Some(retention) => config.with_inbox_retention(retention),
            None => config,
        }
    });
    let config = ServiceConfig {
        relay,
        relays: args.relays,
        stats_interval: args.stats_interval,
        cleanup,
        ..ServiceConfig::default()
    };
    config.validate()?;
    if args.status_interval.is_zero() {
        return Err(CliError::Refused("--status-interval is zero; expected e.g. 60s".to_owned()));
    }

    if args.dashboard.admin_token.is_some() && !args.dashboard_pages {
        tracing::warn!("an admin token was given but no dashboard is served: add --http ADDR --dashboard to use it");
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let http = match args.http {
        Some(addr) => {
            let readiness = http::Readiness {
                max_pending_age: args.ready_max_pending_age,
                max_pass_age: args.ready_max_pass_age,
                max_slot_lag: log_relay.as_ref().map(|_| args.log.ready_max_slot_lag),
            };
            let shared = http::install_recorder(readiness)?;
            let pages = match args.dashboard_pages {
                true => Some(dashboard_router(&db, &args, &shared)?),
                false => None,
            };
            http::serve(addr, shared.clone(), pages, shutdown.clone()).await?;
            Some(shared)
        }
        None => None,
    };
    let shown = redact_url(&args.broker.broker);
    let Some(publisher) = connect_broker(&db, &args, &shown, &shutdown).await? else {
        tracing::info!("stopped before the broker answered");
        return Ok(());
    };
    let publisher = std::sync::Arc::new(publisher);
    let store = SeaOrmStore::new(db.clone());
    let mut builder = match &log_relay {
        None => OutboxService::builder(store.clone(), publisher).config(config.clone()),
        Some(log_config) => {
            let relay = outbox_seaorm::log::LogRelay::new(db.clone(), url, publisher.clone(), log_config.clone())
                .map_err(crate::log::refused)?;
            let stop_all = shutdown.clone();
            OutboxService::builder(store.clone(), publisher).config(config.clone()).with_relay(
                move |stop, reporter| async move {
                    if let Err(error) = relay.run_reporting(stop, Some(reporter)).await {
                        tracing::error!(%error, "the log relay stopped");
                        stop_all.cancel();
                    }
                },
            )
        }
    }
    .shutdown_on(&shutdown);
    if args.listen {
        let channel = args.channel.notify_channel.clone();
        match notify::notify_trigger_channel(&db).await? {
            Some(installed) if installed == channel.as_str() => {}
            Some(installed) => tracing::warn!(%channel, %installed,
                "the notify trigger notifies another channel: this relay will only wake by polling"),
            None => tracing::warn!(%channel,
                "--listen without a notify trigger: nothing notifies; run `outbox notify install`"),
        }
        let listener = store.notify_listener(channel)?;
        builder = builder.with_task(move |stop| listener.run(stop));
    }
    if let Some(interval) = args.watch {
        let watch = store.commit_watch(interval)?;
        builder = builder.with_task(move |stop| watch.run(stop));
    }
    let service = builder.start()?;
    // With --http, the probes read the service from here on.
    let slot = http.map(|shared| shared.service).unwrap_or_default();
    let service = slot.get_or_init(move || service);
    tracing::info!(
        broker = %shown,
        kind = kind.name(),
        source = args.log.source.name(),
        relays = config.relays,
        poll = ?config.relay.poll_interval,
        cleanup = config.cleanup.is_some(),
        listen = args.listen,
        watch = ?args.watch,
        "outbox relay running; stop it with SIGTERM or SIGINT"
    );
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(args.status_interval) => log_status(&service.health()),
        }
    }
    tracing::info!("stopping: finishing the batch in flight");
    service.shutdown().await;
    log_status(&service.health());
    Ok(())
}

/// Connects to the broker, retrying for ever (1 s doubling to 30 s, `connect_with_retry`) while it is
/// unreachable; `None` when a signal came first, an error only for a configuration the broker refuses.
async fn connect_broker(
    db: &DatabaseConnection,
    args: &RelayArgs,
    shown: &str,
    shutdown: &CancellationToken,
) -> Result<Option<broker::AnyPublisher>, CliError> {
    let attempt = || async {
        let attempt = broker::connect(&args.broker).await;
        if attempt.is_err() {
            let waiting = admin::stats(db).await.map(|s| s.totals.pending).unwrap_or_default();
            tracing::info!(events_waiting = waiting, "events wait in the outbox until the broker answers");
        }
        attempt
    };
    tokio::select! {
        () = shutdown.cancelled() => Ok(None),
        connected = connect_with_retry(shown, ConnectRetry::forever(), attempt) => Ok(Some(connected?)),
    }
}

fn log_status(health: &Health) {
    let stats = health.stats.unwrap_or_default();
    tracing::info!(
        published = health.published_events,
        pending = stats.pending,
        dead = stats.dead,
        oldest_pending_seconds = stats.oldest_pending_seconds,
        consecutive_failures = health.consecutive_failures,
        last_error = health.last_error.as_deref().unwrap_or("-"),
        cleaned = health.cleaned_outbox_rows,
        "outbox relay status"
    );
}

/// The dashboard beside `/metrics`, showing this process's relays once the service started.
fn dashboard_router(
    db: &DatabaseConnection,
    args: &RelayArgs,
    shared: &http::Shared,
) -> Result<axum::Router, CliError> {
    let wake = match (args.listen, args.watch) {
        (true, Some(every)) => {
            format!("LISTEN {} and a seq watch every {every:?}, then polling", args.channel.notify_channel)
        }
        (true, None) => format!("LISTEN {}, then polling", args.channel.notify_channel),
        (false, Some(every)) => format!("a seq watch every {every:?}, then polling"),
        (false, None) => format!("polling every {:?}", args.poll_interval),
    };
    let config = args
        .dashboard
        .config()?
        .with_detail("broker", redact_url(&args.broker.broker))
        .with_detail("relay tasks", args.relays.to_string())
        .with_detail("wake-up", wake)
        .with_destination(crate::broker::relay_destination(&args.broker)?);
    let config = match args.log.source {
        crate::log::Source::Log => config.with_log_slot(&args.log.names.slot),
        crate::log::Source::Polling => config,
    };
    let service = shared.service.clone();
    Ok(outbox_ops::dashboard::Dashboard::new(db.clone(), config)
        .with_health(move || service.get().map(OutboxService::health))
        .router())
}

pub async fn cancel_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => tracing::info!("SIGTERM"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; SIGINT still stops the relay");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    shutdown.cancel();
}

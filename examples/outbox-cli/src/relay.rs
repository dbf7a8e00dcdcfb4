//! `outbox relay`: the [`OutboxService`] until SIGTERM or SIGINT, with `--http` serving `/metrics` and the
//! health probes ([`http`](crate::http)). A broker that is down at start is retried (with the backlog in
//! the log) until it answers; a bad URL or setting is fatal at once.

use outbox_seaorm::brokers::{ConnectRetry, connect_with_retry};
use outbox_seaorm::{
    CancellationToken, CleanupConfig, DeadLetterPolicy, Health, OutboxService, SeaOrmStore, ServiceConfig, redact_url,
};
use outbox_seaorm::{admin, notify};
use sea_orm::DatabaseConnection;

use crate::{CliError, RelayArgs, broker, http};

/// Runs the relay until a signal.
pub async fn run(db: DatabaseConnection, args: RelayArgs) -> Result<(), CliError> {
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
    let kind = broker::kind(&args.broker)?;
    if args.status_interval.is_zero() {
        return Err(CliError::Refused("--status-interval is zero; expected e.g. 60s".to_owned()));
    }

    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let http = match args.http {
        Some(addr) => {
            let readiness =
                http::Readiness { max_pending_age: args.ready_max_pending_age, max_pass_age: args.ready_max_pass_age };
            let shared = http::install_recorder(readiness)?;
            http::serve(addr, shared.clone(), shutdown.clone()).await?;
            Some(shared)
        }
        None => None,
    };
    let shown = redact_url(&args.broker.broker);
    let Some(publisher) = connect_broker(&db, &args, &shown, &shutdown).await? else {
        tracing::info!("stopped before the broker answered");
        return Ok(());
    };
    let store = SeaOrmStore::new(db.clone());
    let mut builder = OutboxService::builder(store.clone(), publisher).config(config.clone()).shutdown_on(&shutdown);
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
    let service = builder.start()?;
    // With --http, the probes read the service from here on.
    let slot = http.map(|shared| shared.service).unwrap_or_default();
    let service = slot.get_or_init(move || service);
    tracing::info!(
        broker = %shown,
        kind = kind.name(),
        relays = config.relays,
        poll = ?config.relay.poll_interval,
        cleanup = config.cleanup.is_some(),
        listen = args.listen,
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
            let waiting = admin::stats(db).await.map(|s| s.pending).unwrap_or_default();
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

async fn cancel_on_signal(shutdown: CancellationToken) {
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

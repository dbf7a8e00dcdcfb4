//! The operations dashboard in a browser: `outbox dashboard` (the pages alone) and
//! `outbox relay --http ADDR --dashboard` (beside `/metrics` and the health probes).
//! Read-only unless an admin token is given; see [`outbox_ops::dashboard`].

use std::net::SocketAddr;

use clap::Args;
use outbox_ops::dashboard::{Dashboard, DashboardConfig};
use outbox_seaorm::Destination;
use outbox_seaorm::brokers::BrokerKind;
use sea_orm::DatabaseConnection;

use crate::CliError;
use crate::dead_letters::{self, PlaceArgs};

/// The dashboard's flags, shared by `outbox dashboard` and `outbox relay --dashboard`.
#[derive(Args, Clone)]
pub struct DashboardArgs {
    /// Allow replay and discard to whoever signs in with this token (at least 16 bytes; e.g.
    /// `openssl rand -hex 32`). Without it the dashboard is read-only.
    #[arg(long, env = "OUTBOX_ADMIN_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub admin_token: Option<String>,
}

/// `outbox dashboard`'s view of the relay: where it publishes, to show each event's destination.
#[derive(Args, Clone)]
pub struct RelayDestination {
    /// The relay's destination template (`outbox relay --destination`), to show where each event went.
    #[arg(long, env = "OUTBOX_DESTINATION")]
    destination: Option<String>,
}

impl DashboardArgs {
    /// The configuration these flags ask for.
    pub fn config(&self) -> Result<DashboardConfig, CliError> {
        let config = DashboardConfig::read_only();
        Ok(match &self.admin_token {
            Some(token) => config.with_admin_token(token.as_str())?,
            None => config,
        })
    }
}

/// `outbox dashboard`.
#[derive(Args)]
pub struct ServeArgs {
    /// Where to serve the pages; only this machine can reach the default. Bind 0.0.0.0:PORT only behind
    /// an authenticating proxy.
    #[arg(long, env = "OUTBOX_HTTP", default_value = "127.0.0.1:9090")]
    http: SocketAddr,
    #[command(flatten)]
    dashboard: DashboardArgs,
    #[command(flatten)]
    relay: RelayDestination,
    /// Show a consumer's dead letters too, at this broker (nats://, kafka://, amqp://, redis://), with the
    /// flags of `outbox dead-letters` that say where, e.g. `--broker redis://… --stream orders --group
    /// billing`. Not read from `OUTBOX_BROKER`, which names the relay's broker.
    #[arg(long, env = "OUTBOX_DEAD_LETTERS_BROKER", hide_env_values = true)]
    broker: Option<String>,
    #[command(flatten)]
    place: PlaceArgs,
}

impl ServeArgs {
    /// The admin token, to keep out of every message.
    pub fn admin_token(&self) -> Option<&str> {
        self.dashboard.admin_token.as_deref()
    }

    /// The broker of the consumer dead letters shown, to keep its password out of every message.
    pub fn broker(&self) -> Option<&str> {
        self.broker.as_deref()
    }
}

/// Serves the dashboard until SIGTERM or SIGINT.
pub async fn run(db: DatabaseConnection, args: ServeArgs) -> Result<(), CliError> {
    crate::db::migrated(&db).await?;
    let mut config = args.dashboard.config()?.with_detail("relay", "not in this process (`outbox dashboard`)");
    if let Some(template) = &args.relay.destination {
        config = config.with_destination(Destination::parse(template)?);
    }
    let shutdown = outbox_seaorm::CancellationToken::new();
    tokio::spawn(crate::relay::cancel_on_signal(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind(args.http)
        .await
        .map_err(|e| CliError::Refused(format!("--http {}: cannot listen: {e}", args.http)))?;
    let mut dashboard = Dashboard::new(db, config);
    if let Some(broker) = &args.broker {
        let kind = BrokerKind::from_url(broker)?;
        dashboard = dashboard.with_dead_letters(dead_letters::open(broker, &args.place, kind).await?);
    }
    let router = dashboard.router();
    tracing::info!(addr = %args.http, read_only = args.dashboard.admin_token.is_none(), "serving the dashboard");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(|e| CliError::Refused(format!("the dashboard's HTTP server failed: {e}")))
}

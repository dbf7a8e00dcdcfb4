//! The operations dashboard in a browser: `outbox dashboard` (the pages alone) and
//! `outbox relay --http ADDR --dashboard` (beside `/metrics` and the health probes).
//! Read-only unless an admin token is given; see [`outbox_seaorm::dashboard`].

use std::net::SocketAddr;

use clap::Args;
use outbox_seaorm::dashboard::{Dashboard, DashboardConfig};
use sea_orm::DatabaseConnection;

use crate::CliError;

/// The dashboard's flags, shared by `outbox dashboard` and `outbox relay --dashboard`.
#[derive(Args, Clone)]
pub struct DashboardArgs {
    /// Allow replay and discard to whoever signs in with this token (at least 16 bytes; e.g.
    /// `openssl rand -hex 32`). Without it the dashboard is read-only.
    #[arg(long, env = "OUTBOX_ADMIN_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub admin_token: Option<String>,
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
}

impl ServeArgs {
    /// The admin token, to keep out of every message.
    pub fn admin_token(&self) -> Option<&str> {
        self.dashboard.admin_token.as_deref()
    }
}

/// Serves the dashboard until SIGTERM or SIGINT.
pub async fn run(db: DatabaseConnection, args: ServeArgs) -> Result<(), CliError> {
    crate::db::migrated(&db).await?;
    let config = args.dashboard.config()?.with_detail("relay", "not in this process (`outbox dashboard`)");
    let shutdown = outbox_seaorm::CancellationToken::new();
    tokio::spawn(crate::relay::cancel_on_signal(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind(args.http)
        .await
        .map_err(|e| CliError::Refused(format!("--http {}: cannot listen: {e}", args.http)))?;
    let router = Dashboard::new(db, config).router();
    tracing::info!(addr = %args.http, read_only = args.dashboard.admin_token.is_none(), "serving the dashboard");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(|e| CliError::Refused(format!("the dashboard's HTTP server failed: {e}")))
}

//! Run with: cargo run -p outbox-example-axum
//!
//! Then place an order and watch billing invoice it once:
//!
//! ```sh
//! curl -i localhost:3000/orders -H 'content-type: application/json' -d '{"id":"o1","customer":"ada","total_minor":4900}'
//! curl localhost:3000/orders/o1
//! curl localhost:3000/invoices
//! ```
//!
//! Defaults: an SQLite file in the temp directory and the in-memory broker. `DATABASE_URL` picks a server
//! (`postgres://…` or `mysql://…`, a database of its own: the migrations create `orders`, `invoices` and
//! the outbox tables) and `--broker nats://127.0.0.1:4222` publishes and consumes through NATS JetStream.
//! Ctrl-C (or SIGTERM) stops the server gracefully, then the relay and billing. Logs: `RUST_LOG`.

use std::net::SocketAddr;

use clap::Parser;
use outbox_example_axum::memory::InMemoryTransport;
use outbox_example_axum::migration::Migrator;
use outbox_seaorm::brokers::nats::{NatsPublisher, NatsTransport};
use outbox_seaorm::brokers::{ConnectRetry, connect_with_retry};
use outbox_seaorm::{BoxError, CancellationToken, Destination, InMemoryPublisher, redact_url};
use sea_orm_migration::MigratorTrait;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// The JetStream stream the orders' events go to, and the subjects it captures.
const STREAM: &str = "ORDERS";

#[derive(Parser)]
#[command(about = "An axum order service with the transactional outbox, a relay and a billing consumer.")]
struct Args {
    /// The database URL: postgres://, mysql:// or sqlite: (default: an SQLite file in the temp directory).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Publish and consume through NATS JetStream at this URL (e.g. nats://127.0.0.1:4222) instead of the
    /// in-memory broker.
    #[arg(long)]
    broker: Option<String>,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let args = Args::parse();

    let url = match args.database_url {
        Some(url) if !url.is_empty() => url,
        _ => format!("sqlite://{}?mode=rwc", std::env::temp_dir().join("outbox-axum-orders.db").display()),
    };
    let db = outbox_seaorm::connect(&url).await?;
    Migrator::up(&db, None).await?;

    let listener = TcpListener::bind(args.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, database = %redact_url(&url), "listening");
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));

    match args.broker.as_deref() {
        None => {
            let broker = InMemoryPublisher::new();
            let transport = InMemoryTransport::new(broker.clone());
            outbox_example_axum::serve(listener, db, broker, transport, shutdown).await
        }
        Some(url) if url.starts_with("nats://") => {
            // The broker may start after the app (one deploy brings both up): retry, within a bound.
            let shown = redact_url(url);
            let publisher = connect_with_retry(&shown, ConnectRetry::default(), || async {
                let publisher = NatsPublisher::connect(url, Destination::parse("orders.{event_type}")?).await?;
                publisher.ensure_stream(STREAM, &["orders.>"]).await?;
                Ok(publisher)
            })
            .await?;
            let transport = connect_with_retry(&shown, ConnectRetry::default(), || {
                NatsTransport::connect(url, STREAM, "billing", None)
            })
            .await?;
            outbox_example_axum::serve(listener, db, publisher, transport, shutdown).await
        }
        Some(url) => Err(format!("--broker {}: expected a nats:// URL", redact_url(url)).into()),
    }
}

/// Cancels `shutdown` at Ctrl-C or SIGTERM (what a container runtime sends).
async fn cancel_on_signal(shutdown: CancellationToken) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => drop(signal.recv().await),
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: finishing requests, then stopping the relay and billing");
    shutdown.cancel();
}

//! The relay process: `outbox-soak relay`, started (and killed) by a soak run. It publishes through a
//! [`FaultyPublisher`] around the run's broker, and exits when its parent's pipe on stdin closes.

use std::time::Duration;

use clap::Args;
use outbox_seaorm::testkit::FaultyPublisher;
use outbox_seaorm::{Backoff, CancellationToken, ClaimMode, Publisher, Relay, RelayConfig, SeaOrmStore};
use tokio::io::AsyncReadExt;

use crate::SoakError;
use crate::broker::{TableBroker, connect_publisher};
use crate::db::connect;
use crate::parse_duration;

/// What the run hands its relays (URLs through the environment, so they do not show in `ps`).
#[derive(Args, Debug, Clone)]
pub struct RelayArgs {
    /// The run's database.
    #[arg(long, env = "OUTBOX_SOAK_DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// The run's PostgreSQL schema.
    #[arg(long)]
    pub schema: Option<String>,
    /// The run's broker (default: the `soak_broker` table).
    #[arg(long, env = "OUTBOX_SOAK_BROKER", hide_env_values = true)]
    pub broker: Option<String>,
    /// The run's id (names the stream, queue or topic).
    #[arg(long)]
    pub run_id: String,
    /// Lanes of the table broker.
    #[arg(long)]
    pub consumers: u32,
    /// Seed of this incarnation's faults.
    #[arg(long)]
    pub seed: u64,
    /// See the run's flag.
    #[arg(long)]
    pub publish_fail_rate: f64,
    /// See the run's flag.
    #[arg(long)]
    pub lost_ack_rate: f64,
    /// See the run's flag.
    #[arg(long)]
    pub inject_loss: f64,
    /// Lease mode with this lease.
    #[arg(long, value_parser = parse_duration)]
    pub lease: Option<Duration>,
}

/// Runs one relay until stdin closes (or until it is killed, which is the point).
pub async fn run(args: RelayArgs) -> Result<(), SoakError> {
    let db = connect(&args.database_url, args.schema.as_deref(), 4).await?;
    let stop = CancellationToken::new();
    let parent_gone = stop.clone();
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while let Ok(n) = stdin.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        parent_gone.cancel();
    });

    let mut config = RelayConfig::default()
        .with_poll_interval(Duration::from_millis(50))
        .with_batch_size(200)
        .with_backoff(Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(2), multiplier: 2 });
    if let Some(lease) = args.lease {
        config = config.with_claim_mode(ClaimMode::Lease { duration: lease }).with_publish_timeout(lease / 2);
    }
    match &args.broker {
        None => {
            let broker = TableBroker::new(db.clone(), args.consumers);
            relay(db, faulty(broker, &args), config, stop).await
        }
        Some(url) => {
            let publisher = connect_publisher(url, &args.run_id, false).await?;
            relay(db, faulty(publisher, &args), config, stop).await
        }
    }
}

/// `publisher` with the run's faults, seeded for this incarnation.
fn faulty<P: Publisher>(publisher: P, args: &RelayArgs) -> FaultyPublisher<P> {
    let faulty = FaultyPublisher::new(publisher).with_seed(args.seed);
    faulty.set_fail_rate(args.publish_fail_rate);
    faulty.set_lost_ack_rate(args.lost_ack_rate);
    faulty.set_drop_rate(args.inject_loss);
    faulty
}

async fn relay<P: Publisher>(
    db: sea_orm::DatabaseConnection,
    publisher: P,
    config: RelayConfig,
    stop: CancellationToken,
) -> Result<(), SoakError> {
    let relay = Relay::new(SeaOrmStore::new(db), publisher, config)?;
    relay.run(stop).await;
    Ok(())
}

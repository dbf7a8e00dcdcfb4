//! The broker a relay publishes to, chosen by its URL's scheme (`outbox_runtime::brokers`).

use clap::Args;
use outbox_seaorm::Destination;
pub use outbox_seaorm::brokers::AnyPublisher;
use outbox_seaorm::brokers::BrokerKind;

/// The broker a relay publishes to.
#[derive(Args)]
pub struct BrokerArgs {
    /// The broker: nats://, kafka://, amqp:// (RabbitMQ) or redis:// (never printed with its password).
    #[arg(long, env = "OUTBOX_BROKER", hide_env_values = true)]
    pub broker: String,
    /// Where each event goes: a template over {aggregate_type}, {aggregate_id}, {event_type}, {version}.
    #[arg(long, env = "OUTBOX_DESTINATION", default_value = outbox_seaorm::broker::DEFAULT_DESTINATION)]
    destination: String,
    /// RabbitMQ: the exchange to publish to.
    #[arg(long, env = "OUTBOX_EXCHANGE", default_value = "outbox")]
    exchange: String,
    /// RabbitMQ: declare the exchange (a durable topic exchange) at start.
    #[arg(long, env = "OUTBOX_DECLARE_EXCHANGE")]
    declare_exchange: bool,
    /// NATS: create this JetStream stream at start unless it exists.
    #[arg(long, env = "OUTBOX_NATS_STREAM")]
    nats_stream: Option<String>,
    /// NATS: the subjects of --nats-stream, comma-separated.
    #[arg(long, env = "OUTBOX_NATS_SUBJECTS", value_delimiter = ',', default_value = ">")]
    nats_subjects: Vec<String>,
}

/// The broker's kind, checked before anything connects (a bad URL is fatal; an unreachable broker is not).
pub fn kind(args: &BrokerArgs) -> outbox_seaorm::Result<BrokerKind> {
    let kind = BrokerKind::from_url(&args.broker)?;
    Destination::parse(&args.destination)?;
    Ok(kind)
}

/// Connects once; the caller retries while the broker is down.
pub async fn connect(args: &BrokerArgs) -> outbox_seaorm::Result<AnyPublisher> {
    let destination = Destination::parse(&args.destination)?;
    kind(args)?;
    let publisher = AnyPublisher::connect_to_exchange(&args.broker, &args.exchange, destination).await?;
    match &publisher {
        AnyPublisher::Nats(publisher) => {
            if let Some(stream) = &args.nats_stream {
                let subjects: Vec<&str> = args.nats_subjects.iter().map(String::as_str).collect();
                publisher.ensure_stream(stream, &subjects).await?;
            }
        }
        AnyPublisher::Rabbit(publisher) if args.declare_exchange => publisher.declare_exchange(&args.exchange).await?,
        _ => {}
    }
    Ok(publisher)
}

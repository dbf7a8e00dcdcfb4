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
    /// Where each event goes: a template over {aggregate_type}, {aggregate_id}, {event_type}, {version}
    /// (the subject, routing key or topic; the stream key on Redis). Default {event_type}; required with a
    /// Redis broker, where it names the stream your consumers read.
    #[arg(long, env = "OUTBOX_DESTINATION")]
    destination: Option<String>,
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

/// The broker's kind, checked before anything connects (a bad URL or destination is fatal; an unreachable
/// broker is not).
pub fn kind(args: &BrokerArgs) -> outbox_seaorm::Result<BrokerKind> {
    let kind = BrokerKind::from_url(&args.broker)?;
    destination(args, kind)?;
    Ok(kind)
}

/// The destination template: `--destination`, or the default where the broker refuses an event it cannot
/// route (NATS without a stream, RabbitMQ without a bound queue, a Kafka topic). Redis creates any stream an
/// `XADD` names, so there the default would send events where no consumer reads (the publisher appends only
/// to existing streams, and events would wait): the command asks for the stream instead.
fn destination(args: &BrokerArgs, kind: BrokerKind) -> outbox_seaorm::Result<Destination> {
    match (&args.destination, kind) {
        (Some(template), _) => Destination::parse(template),
        (None, BrokerKind::Redis) => Err(outbox_seaorm::Error::invalid_config(
            "--destination (OUTBOX_DESTINATION)",
            "is required with a Redis broker: name the stream your consumers read, e.g. --destination \
             'orders' or 'outbox:{aggregate_type}'",
        )),
        (None, _) => Destination::parse(outbox_seaorm::broker::DEFAULT_DESTINATION),
    }
}

/// Where this relay publishes (checked by [`kind`] first).
pub fn relay_destination(args: &BrokerArgs) -> outbox_seaorm::Result<Destination> {
    destination(args, kind(args)?)
}

/// Connects once; the caller retries while the broker is down.
pub async fn connect(args: &BrokerArgs) -> outbox_seaorm::Result<AnyPublisher> {
    let destination = destination(args, kind(args)?)?;
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

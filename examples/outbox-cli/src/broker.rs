//! The broker a relay publishes to, chosen by its URL's scheme (`outbox_runtime::brokers`).

use clap::Args;
use outbox_seaorm::brokers::BrokerKind;
use outbox_seaorm::brokers::kafka::KafkaPublisher;
use outbox_seaorm::brokers::nats::NatsPublisher;
use outbox_seaorm::brokers::rabbitmq::RabbitPublisher;
use outbox_seaorm::brokers::redis::RedisPublisher;
use outbox_seaorm::{Destination, OutboxEvent, PublishError, Publisher};

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

/// Any of the four adapters (boxed: one is built per process, and their sizes differ a lot).
pub enum AnyPublisher {
    /// NATS JetStream.
    Nats(Box<NatsPublisher>),
    /// Kafka.
    Kafka(Box<KafkaPublisher>),
    /// RabbitMQ.
    Rabbit(Box<RabbitPublisher>),
    /// Redis Streams.
    Redis(Box<RedisPublisher>),
}

impl Publisher for AnyPublisher {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        match self {
            AnyPublisher::Nats(p) => p.publish(events).await,
            AnyPublisher::Kafka(p) => p.publish(events).await,
            AnyPublisher::Rabbit(p) => p.publish(events).await,
            AnyPublisher::Redis(p) => p.publish(events).await,
        }
    }

    fn system(&self) -> &'static str {
        match self {
            AnyPublisher::Nats(p) => p.system(),
            AnyPublisher::Kafka(p) => p.system(),
            AnyPublisher::Rabbit(p) => p.system(),
            AnyPublisher::Redis(p) => p.system(),
        }
    }

    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        match self {
            AnyPublisher::Nats(p) => p.destination_name(event),
            AnyPublisher::Kafka(p) => p.destination_name(event),
            AnyPublisher::Rabbit(p) => p.destination_name(event),
            AnyPublisher::Redis(p) => p.destination_name(event),
        }
    }
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
    Ok(match kind(args)? {
        BrokerKind::Nats => {
            let publisher = NatsPublisher::connect(&args.broker, destination).await?;
            if let Some(stream) = &args.nats_stream {
                let subjects: Vec<&str> = args.nats_subjects.iter().map(String::as_str).collect();
                publisher.ensure_stream(stream, &subjects).await?;
            }
            AnyPublisher::Nats(Box::new(publisher))
        }
        BrokerKind::Kafka => AnyPublisher::Kafka(Box::new(KafkaPublisher::connect(&args.broker, destination, &[])?)),
        BrokerKind::RabbitMq => {
            let publisher = RabbitPublisher::connect(&args.broker, &args.exchange, destination).await?;
            if args.declare_exchange {
                publisher.declare_exchange(&args.exchange).await?;
            }
            AnyPublisher::Rabbit(Box::new(publisher))
        }
        BrokerKind::Redis => AnyPublisher::Redis(Box::new(RedisPublisher::connect(&args.broker, destination).await?)),
    })
}

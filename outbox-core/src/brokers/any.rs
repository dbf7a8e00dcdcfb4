//! One publisher for whichever broker a URL names, for tools that take the broker from configuration.

use super::BrokerKind;
use crate::broker::Destination;
use crate::envelope::OutboxEvent;
use crate::error::{Error, Result};
use crate::publisher::{PublishError, Publisher};

/// The RabbitMQ exchange [`AnyPublisher::connect`] publishes to.
pub const DEFAULT_EXCHANGE: &str = "outbox";

/// The publisher of any broker this build has a feature for, chosen by the URL's scheme (boxed: one is
/// built per process, and their sizes differ a lot). Match on it for a broker's own setup calls
/// (`ensure_stream`, `declare_exchange`, ...).
///
/// ```no_run
/// # async fn demo() -> outbox_runtime::Result<()> {
/// use outbox_runtime::{Destination, brokers::AnyPublisher};
/// let publisher = AnyPublisher::connect("nats://127.0.0.1:4222", Destination::parse("{event_type}")?).await?;
/// # Ok(()) }
/// ```
#[non_exhaustive]
pub enum AnyPublisher {
    /// NATS JetStream (`nats://`).
    #[cfg(feature = "nats")]
    Nats(Box<super::nats::NatsPublisher>),
    /// Kafka (`kafka://`).
    #[cfg(feature = "kafka")]
    Kafka(Box<super::kafka::KafkaPublisher>),
    /// RabbitMQ (`amqp://`, `amqps://`).
    #[cfg(feature = "rabbitmq")]
    Rabbit(Box<super::rabbitmq::RabbitPublisher>),
    /// Redis Streams (`redis://`, `rediss://`).
    #[cfg(feature = "redis")]
    Redis(Box<super::redis::RedisPublisher>),
}

impl std::fmt::Debug for AnyPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AnyPublisher({})", Publisher::system(self))
    }
}

impl AnyPublisher {
    /// Connects to the broker `url` names, publishing each event to `destination` (RabbitMQ: as the
    /// routing key on the [`DEFAULT_EXCHANGE`]). Connects once: wrap it in
    /// [`connect_with_retry`](super::connect_with_retry) for a broker that may come up later.
    ///
    /// # Errors
    /// A URL that is not a broker URL, or names a broker this build has no feature for, is an
    /// [`Error::InvalidConfig`]; a broker that does not answer is the adapter's connect error.
    pub async fn connect(url: &str, destination: Destination) -> Result<Self> {
        Self::connect_to_exchange(url, DEFAULT_EXCHANGE, destination).await
    }

    /// [`connect`](Self::connect), publishing to the RabbitMQ exchange `exchange` (ignored by the other
    /// brokers).
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    #[allow(unused_variables)]
    pub async fn connect_to_exchange(url: &str, exchange: &str, destination: Destination) -> Result<Self> {
        let kind = BrokerKind::from_url(url)?;
        match kind {
            #[cfg(feature = "nats")]
            BrokerKind::Nats => Ok(Self::Nats(Box::new(super::nats::NatsPublisher::connect(url, destination).await?))),
            #[cfg(feature = "kafka")]
            BrokerKind::Kafka => {
                Ok(Self::Kafka(Box::new(super::kafka::KafkaPublisher::connect(url, destination, &[])?)))
            }
            #[cfg(feature = "rabbitmq")]
            BrokerKind::RabbitMq => {
                Ok(Self::Rabbit(Box::new(super::rabbitmq::RabbitPublisher::connect(url, exchange, destination).await?)))
            }
            #[cfg(feature = "redis")]
            BrokerKind::Redis => {
                Ok(Self::Redis(Box::new(super::redis::RedisPublisher::connect(url, destination).await?)))
            }
            #[allow(unreachable_patterns)]
            other => Err(Error::invalid_config(
                "broker_url",
                format!(
                    "names {}, but this build has no `{}` feature",
                    other.name(),
                    match other {
                        BrokerKind::Nats => "nats",
                        BrokerKind::Kafka => "kafka",
                        BrokerKind::RabbitMq => "rabbitmq",
                        BrokerKind::Redis => "redis",
                    }
                ),
            )),
        }
    }
}

/// Calls `$call` on whichever adapter `$any` holds.
macro_rules! dispatch {
    ($any:expr, $p:ident => $call:expr) => {
        match $any {
            #[cfg(feature = "nats")]
            AnyPublisher::Nats($p) => $call,
            #[cfg(feature = "kafka")]
            AnyPublisher::Kafka($p) => $call,
            #[cfg(feature = "rabbitmq")]
            AnyPublisher::Rabbit($p) => $call,
            #[cfg(feature = "redis")]
            AnyPublisher::Redis($p) => $call,
        }
    };
}

impl Publisher for AnyPublisher {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<std::result::Result<(), PublishError>> {
        dispatch!(self, p => p.publish(events).await)
    }

    fn system(&self) -> &'static str {
        dispatch!(self, p => p.system())
    }

    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        dispatch!(self, p => p.destination_name(event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_url_that_names_no_broker_is_refused_before_connecting() {
        let destination = Destination::parse("{event_type}").unwrap();
        let error = AnyPublisher::connect("http://user:secret@host:80", destination).await.unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, Error::InvalidConfig { .. }), "{text}");
        assert!(text.contains("scheme") && !text.contains("secret"), "{text}");
    }
}

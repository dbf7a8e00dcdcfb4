//! Broker adapters, one cargo feature each. Every adapter:
//!
//! - publishes with the broker's acknowledgement before reporting success, using the event id as the
//!   broker's dedup id where the broker has one, and the [`envelope_headers`](crate::broker::envelope_headers);
//! - consumes with the same contract: decode → [`MessageHandler`](crate::MessageHandler) (inbox dedup →
//!   effect → commit) → ack, retry on [`Disposition::Retry`](crate::Disposition), set aside on `Park`.
//!
//! | feature | URL | publisher | consumer |
//! |---|---|---|---|
//! | `nats` | `nats://host:4222` | `nats::NatsPublisher` | `nats::NatsTransport` |
//! | `kafka` | `kafka://host:9092` | `kafka::KafkaPublisher` | `kafka::KafkaConsumer` |
//! | `rabbitmq` | `amqp://user:pass@host:5672/%2f` | `rabbitmq::RabbitPublisher` | `rabbitmq::RabbitConsumer` |
//! | `redis` | `redis://host:6379` | `redis::RedisPublisher` | `redis::RedisTransport` |

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;

use crate::error::{Error, Result};

/// The broker named by a URL's scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerKind {
    /// `nats://`
    Nats,
    /// `kafka://`
    Kafka,
    /// `amqp://` or `amqps://`
    RabbitMq,
    /// `redis://` or `rediss://`
    Redis,
}

impl BrokerKind {
    /// Reads the scheme of `url`; an unknown scheme or a URL without a host is an [`Error::InvalidConfig`].
    pub fn from_url(url: &str) -> Result<BrokerKind> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            Error::invalid_config("broker_url", format!("{url:?} is not a URL; expected e.g. nats://127.0.0.1:4222"))
        })?;
        let kind = match scheme.to_ascii_lowercase().as_str() {
            "nats" => BrokerKind::Nats,
            "kafka" => BrokerKind::Kafka,
            "amqp" | "amqps" => BrokerKind::RabbitMq,
            "redis" | "rediss" => BrokerKind::Redis,
            other => {
                return Err(Error::invalid_config(
                    "broker_url",
                    format!("has scheme {other:?}; expected one of nats, kafka, amqp, amqps, redis, rediss"),
                ));
            }
        };
        let host = rest.rsplit('@').next().unwrap_or_default();
        if host.is_empty() || host.starts_with(['/', ':']) {
            return Err(Error::invalid_config("broker_url", format!("{url:?} has no host")));
        }
        Ok(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_urls_are_checked_before_connecting() {
        assert_eq!(BrokerKind::from_url("nats://127.0.0.1:4222").unwrap(), BrokerKind::Nats);
        assert_eq!(BrokerKind::from_url("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap(), BrokerKind::RabbitMq);
        assert!(BrokerKind::from_url("mqtt://127.0.0.1").unwrap_err().to_string().contains("scheme \"mqtt\""));
        assert!(BrokerKind::from_url("127.0.0.1:4222").is_err());
        assert!(BrokerKind::from_url("kafka://").is_err());
    }
}

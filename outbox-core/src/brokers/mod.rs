//! Broker adapters, one cargo feature each. Every adapter:
//!
//! - publishes with the broker's acknowledgement before reporting success, using the event id as the
//!   broker's dedup id where the broker has one, and the [`envelope_headers`](crate::broker::envelope_headers);
//! - consumes through a [`Transport`](crate::consume::Transport) driven by the one consume driver,
//!   [`Consumer::run`](crate::Consumer::run), with dead letters on by default and a
//!   [`DeadLetters`](crate::consume::DeadLetters) API (list, show, replay, discard);
//! - parses its URL with [`BrokerUrl`], so no error ever shows a password;
//! - connects once in its constructor: wrap it in [`connect_with_retry`] for a broker that may come up
//!   after the app (the `outbox relay` command does, with [`ConnectRetry::forever`]).
//!
//! | feature | URL | publisher | transport |
//! |---|---|---|---|
//! | `nats` | `nats://host:4222` | `nats::NatsPublisher` | `nats::NatsTransport` |
//! | `kafka` | `kafka://host:9092` | `kafka::KafkaPublisher` | `kafka::KafkaTransport` |
//! | `rabbitmq` | `amqp://user:pass@host:5672/%2f` | `rabbitmq::RabbitPublisher` | `rabbitmq::RabbitTransport` |
//! | `redis` | `redis://host:6379` | `redis::RedisPublisher` | `redis::RedisTransport` |
//!
//! [`AnyPublisher::connect`] connects the publisher of whichever of them a URL names.

#[cfg(any(feature = "nats", feature = "kafka", feature = "rabbitmq", feature = "redis"))]
mod any;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;

mod retry;
mod url;

#[cfg(any(feature = "nats", feature = "kafka", feature = "rabbitmq", feature = "redis"))]
pub use any::{AnyPublisher, DEFAULT_EXCHANGE};
pub use retry::{ConnectRetry, connect_with_retry};
pub use url::BrokerUrl;

use crate::error::Result;

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
    /// Reads the scheme of `url`; an unknown scheme or a URL without a host is an [`crate::Error::InvalidConfig`]
    /// (showing the URL with its credentials redacted). See [`BrokerUrl`] for the rest of the URL.
    pub fn from_url(url: &str) -> Result<BrokerKind> {
        BrokerUrl::parse(url).map(|url| url.kind())
    }

    /// The broker's name in messages: `NATS`, `Kafka`, `RabbitMQ`, `Redis`.
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Nats => "NATS",
            BrokerKind::Kafka => "Kafka",
            BrokerKind::RabbitMq => "RabbitMQ",
            BrokerKind::Redis => "Redis",
        }
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

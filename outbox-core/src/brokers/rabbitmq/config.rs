//! Names, limits, URLs and header conversions of the RabbitMQ adapter, checked before anything connects.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::brokers::{BrokerKind, BrokerUrl};
use crate::error::{Error, Result};
use crate::text::{redact_url, truncate};

pub(super) const BROKER: &str = "RabbitMQ";

/// The default routing-key template: [`DEFAULT_DESTINATION`](crate::broker::DEFAULT_DESTINATION),
/// `{event_type}`, e.g. `order.placed`, which a topic binding such as `order.#` matches.
pub const DEFAULT_ROUTING_KEY: &str = crate::broker::DEFAULT_DESTINATION;

/// The longest routing key, exchange or queue name AMQP 0-9-1 can carry (a short string), in bytes.
pub const MAX_ROUTING_KEY_LEN: usize = 255;

/// The default largest payload the publisher sends: 16 MiB. RabbitMQ's own limit (`max_message_size`) is
/// 128 MiB in recent versions; messages that large hurt a broker long before that.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The default prefetch window of a [`RabbitTransport`](super::RabbitTransport): how many unacked messages
/// RabbitMQ sends ahead. It equals the default
/// [`ConsumerConfig::max_in_flight`](crate::ConsumerConfig::max_in_flight) (512), so the driver can hold
/// as many messages as it is allowed to without the window running dry.
pub const DEFAULT_PREFETCH: u16 = 512;

/// The suffix of the default dead-letter queue: `<queue>.dead`.
pub const DEFAULT_DEAD_LETTER_SUFFIX: &str = ".dead";

/// The header a quorum queue adds to a redelivered message: how many earlier deliveries were returned.
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

pub(super) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub(super) const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// A parsed broker URL and its printable form (without credentials).
#[derive(Clone)]
pub(super) struct Endpoint {
    pub(super) uri: AMQPUri,
    pub(super) display: String,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

impl Endpoint {
    /// Checks `url` before any connection attempt: an AMQP scheme, a host, a valid port and vhost.
    pub(super) fn parse(url: &str) -> Result<Self> {
        BrokerUrl::parse(url)?.expect(BrokerKind::RabbitMq, "amqp://user:pass@host:5672/%2f")?;
        let mut uri: AMQPUri = url.parse().map_err(|e: String| {
            Error::invalid_config("broker_url", format!("{} is not a valid AMQP URL: {e}", redact_url(url)))
        })?;
        if uri.scheme == AMQPScheme::AMQPS {
            return Err(Error::invalid_config(
                "broker_url",
                format!(
                    "{} uses amqps://, but this build of the RabbitMQ adapter has no TLS support (lapin without a TLS feature); use amqp:// or add a lapin TLS feature",
                    redact_url(url)
                ),
            ));
        }
        // amq-protocol-uri only keeps *domain* hosts and turns an IP literal into `localhost`: keep the IP.
        if let Some(ip) = literal_ip_host(url) {
            uri.authority.host = ip;
        }
        let display = format!("amqp://{}:{}/{}", uri.authority.host, uri.authority.port, encode_vhost(&uri.vhost));
        Ok(Endpoint { uri, display })
    }

    /// Opens a connection, bounded by `timeout`.
    pub(super) async fn open(&self, name: &str, timeout: Duration) -> Result<Connection> {
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        match tokio::time::timeout(timeout, Connection::connect_uri(self.uri.clone(), properties)).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(Error::broker(BROKER, format!("connect to {}", self.display), e)),
            Err(_) => Err(Error::broker(
                BROKER,
                format!("connect to {}", self.display),
                format!("no connection within {timeout:?}"),
            )),
        }
    }
}

/// The host of `url` when it is an IPv4 or IPv6 literal.
fn literal_ip_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?;
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => host_port.split(':').next()?,
    };
    host.parse::<std::net::IpAddr>().ok().map(|ip| ip.to_string())
}

fn encode_vhost(vhost: &str) -> String {
    vhost.replace('%', "%25").replace('/', "%2f")
}

/// Checks an exchange, queue or consumer-tag name: at most 255 bytes, no control characters.
pub(super) fn check_name(field: &'static str, name: &str, allow_empty: bool) -> Result<()> {
    if name.is_empty() && !allow_empty {
        return Err(Error::invalid_config(field, "is empty"));
    }
    if name.len() > MAX_ROUTING_KEY_LEN {
        return Err(Error::invalid_config(
            field,
            format!("is {} bytes; AMQP allows at most {MAX_ROUTING_KEY_LEN}", name.len()),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::invalid_config(
            field,
            format!("{:?} contains a control character", crate::text::one_line(name)),
        ));
    }
    Ok(())
}

/// Checks a dead-letter queue name: a valid queue name, not `queue` itself, and not in the `amq.`
/// namespace RabbitMQ reserves.
pub(super) fn check_dead_letter_queue(queue: &str, dead: &str) -> Result<()> {
    check_name("dead_letter_queue", dead, false)?;
    if dead == queue {
        return Err(Error::invalid_config(
            "dead_letter_queue",
            format!("{dead:?} is the consumed queue itself; dead letters would come straight back"),
        ));
    }
    if dead.starts_with("amq.") {
        return Err(Error::invalid_config(
            "dead_letter_queue",
            format!("{dead:?} starts with `amq.`, a prefix RabbitMQ reserves for itself"),
        ));
    }
    Ok(())
}

/// A name already checked by [`check_name`] (or the first bytes of one that was not, which never happens).
pub(super) fn short(name: &str) -> ShortString {
    ShortString::try_new(name).unwrap_or_else(|_| ShortString::from(truncate(name, MAX_ROUTING_KEY_LEN)))
}

pub(super) fn exchange_label(exchange: &str) -> String {
    if exchange.is_empty() { "\"\" (the default exchange)".to_owned() } else { format!("{exchange:?}") }
}

/// The [`Delivery::origin`](crate::consume::Delivery::origin) of a message published to `exchange` with
/// `routing_key`: `<exchange>/<routing key>`, the exchange with `%` and `/` percent-encoded (`%25`,
/// `%2F`) and the default exchange as the empty string, e.g. `orders/order.placed` or `/billing` (the
/// default exchange routing to queue `billing`). [`parse_origin`] reads it back.
pub fn encode_origin(exchange: &str, routing_key: &str) -> String {
    format!("{}/{routing_key}", exchange.replace('%', "%25").replace('/', "%2F"))
}

/// The exchange and routing key of an origin written by [`encode_origin`]; `None` when `origin` has no
/// `/` or names are too long for AMQP.
pub fn parse_origin(origin: &str) -> Option<(String, String)> {
    let (exchange, routing_key) = origin.split_once('/')?;
    let exchange = exchange.replace("%2F", "/").replace("%2f", "/").replace("%25", "%");
    (exchange.len() <= MAX_ROUTING_KEY_LEN && routing_key.len() <= MAX_ROUTING_KEY_LEN)
        .then(|| (exchange, routing_key.to_owned()))
}

pub(super) fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() }
}

pub(super) async fn close_quietly(channel: &Channel) {
    let _ = tokio::time::timeout(Duration::from_secs(1), channel.close(200, "OK".into())).await;
}

/// AMQP headers as strings; values that are not strings or numbers (tables, arrays, bytes) are skipped.
pub(super) fn headers_of(properties: &BasicProperties) -> BTreeMap<String, String> {
    let Some(table) = properties.headers() else { return BTreeMap::new() };
    table.inner().iter().filter_map(|(name, value)| Some((name.to_string(), header_text(value)?))).collect()
}

/// One AMQP header value as text, for the values an envelope can hold.
pub(super) fn header_text(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.to_string(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::FieldTable;

    #[test]
    fn urls_are_checked_and_redacted_before_connecting() {
        let endpoint = Endpoint::parse("amqp://guest:secret@127.0.0.1:5673/%2f").unwrap();
        assert_eq!(endpoint.uri.authority.host, "127.0.0.1");
        assert_eq!(endpoint.uri.authority.port, 5673);
        assert_eq!(endpoint.display, "amqp://127.0.0.1:5673/%2f");
        assert_eq!(Endpoint::parse("amqp://[::1]:5672/vh").unwrap().uri.authority.host, "::1");
        assert_eq!(Endpoint::parse("amqp://rabbit.internal/%2f").unwrap().uri.authority.host, "rabbit.internal");
        for bad in ["nats://127.0.0.1:4222", "http://x", "amqp://", "amqp://u:p@h:notaport/%2f", "amqps://h/%2f"] {
            let err = Endpoint::parse(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidConfig { field: "broker_url", .. }), "{bad}: {err}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
        let err = Endpoint::parse("amqp://guest:secret@h:bad/%2f").unwrap_err().to_string();
        assert!(err.contains("***@h:bad") && !err.contains("secret"), "{err}");
    }

    #[test]
    fn amqp_headers_decode_to_strings() {
        let mut table = FieldTable::default();
        table.insert("ce_id".into(), AMQPValue::LongString("abc".into()));
        table.insert("n".into(), AMQPValue::LongLongInt(7));
        table.insert("nested".into(), AMQPValue::FieldTable(FieldTable::default()));
        let headers = headers_of(&BasicProperties::default().with_headers(table));
        assert_eq!(headers.get("ce_id").map(String::as_str), Some("abc"));
        assert_eq!(headers.get("n").map(String::as_str), Some("7"));
        assert!(!headers.contains_key("nested"));
    }

    #[test]
    fn origins_round_trip_through_their_encoding() {
        for (exchange, key) in [("orders", "order.placed"), ("", "billing"), ("a/b%c", "x/y"), ("", "")] {
            let origin = encode_origin(exchange, key);
            assert_eq!(parse_origin(&origin), Some((exchange.to_owned(), key.to_owned())), "{origin}");
        }
        assert_eq!(encode_origin("", "billing"), "/billing");
        assert_eq!(parse_origin("no-slash"), None);
    }

    #[test]
    fn dead_letter_queue_names_are_checked() {
        assert!(check_dead_letter_queue("q", "q.dead").is_ok());
        for bad in ["", "q", "amq.dead", "a\nb"] {
            let err = check_dead_letter_queue("q", bad).unwrap_err();
            assert!(matches!(err, Error::InvalidConfig { field: "dead_letter_queue", .. }), "{bad:?}: {err}");
        }
        assert!(check_dead_letter_queue("q", &"d".repeat(256)).is_err());
    }
}

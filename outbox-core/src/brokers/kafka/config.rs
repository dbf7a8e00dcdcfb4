//! Names, limits, URLs and client settings of the Kafka adapter, checked before anything connects.

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};

use crate::broker::Destination;
use crate::error::{Error, Result};

pub(super) const BROKER: &str = "Kafka";

/// The default topic template: one topic per aggregate type, e.g. `order.events`.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "{aggregate_type}.events";

/// The longest topic name Kafka accepts.
pub const MAX_TOPIC_LEN: usize = 249;

/// librdkafka's default `message.max.bytes`, used in error messages when the config does not set it.
pub(super) const DEFAULT_MESSAGE_MAX_BYTES: &str = "1000000";

/// The default `message.timeout.ms` of the publisher: below the relay's default `publish_timeout` (10 s), so a
/// batch the broker never acknowledges comes back as per-event failures rather than a relay timeout.
pub const DEFAULT_MESSAGE_TIMEOUT_MS: u64 = 8_000;

/// [`DEFAULT_TOPIC_TEMPLATE`] as a [`Destination`].
pub fn default_destination() -> Destination {
    Destination::parse(DEFAULT_TOPIC_TEMPLATE).unwrap_or_else(|_| unreachable!("the default template is valid"))
}

/// Checks `name` against Kafka's topic rules: 1 to [`MAX_TOPIC_LEN`] characters of `[a-zA-Z0-9._-]`, and
/// neither `.` nor `..`. The error says what is wrong.
pub fn validate_topic(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("is empty".to_owned());
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} is reserved"));
    }
    if name.len() > MAX_TOPIC_LEN {
        return Err(format!("is {} characters long; Kafka allows at most {MAX_TOPIC_LEN}", name.len()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!("contains {c:?}; Kafka topic names allow only ASCII letters, digits, '.', '_' and '-'"));
    }
    Ok(())
}

/// Checks at configuration time that `destination` can render a valid topic: its literal parts must be
/// valid topic characters and short enough (placeholders are checked per event when rendered).
pub(super) fn validate_destination(destination: &Destination) -> Result<()> {
    validate_topic(&destination.render_sample()).map_err(|reason| {
        Error::invalid_config(
            "destination",
            format!("template {:?} cannot make a valid Kafka topic name: it {reason}", destination.template()),
        )
    })
}

/// Turns `kafka://host:port[,host:port...]` or `host:port[,...]` into librdkafka's `bootstrap.servers`,
/// parsed by [`BrokerUrl`](crate::brokers::BrokerUrl) like every other broker URL. A missing port is
/// left to librdkafka (9092). Another scheme, an empty host, a path, a query, credentials (set SASL/TLS
/// through the config overrides) or a port that is not a number in 1..=65535 are an
/// [`Error::InvalidConfig`].
pub fn bootstrap_servers(url: &str) -> Result<String> {
    use crate::brokers::{BrokerKind, BrokerUrl};
    const EXAMPLE: &str = "kafka://host:9092";
    let trimmed = url.trim();
    let parsed = if trimmed.contains("://") {
        BrokerUrl::parse(trimmed)?.expect(BrokerKind::Kafka, EXAMPLE)?
    } else {
        BrokerUrl::parse(&format!("kafka://{trimmed}"))?
    };
    let invalid = |reason: &str| {
        Error::invalid_config("broker_url", format!("{} {reason}; expected e.g. {EXAMPLE}", parsed.redacted()))
    };
    let after_scheme = parsed.expose().split_once("://").map_or("", |(_, rest)| rest);
    if after_scheme.split(['/', '?', '#']).next().is_some_and(|authority| authority.contains('@')) {
        return Err(invalid(
            "has credentials, which Kafka URLs do not carry (set sasl.* through the config overrides)",
        ));
    }
    if !matches!(parsed.path(), "" | "/") {
        return Err(invalid("has a path or query, which Kafka URLs do not carry (paths are not supported)"));
    }
    let mut servers = Vec::new();
    for (host, port) in parsed.hosts() {
        let name = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        let valid = match name {
            Some(v6) => !v6.is_empty() && v6.chars().all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.')),
            None => host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')),
        };
        if !valid {
            return Err(invalid(&format!("has host {:?}, not a host name or address", crate::text::one_line(host))));
        }
        servers.push(port.map_or_else(|| host.clone(), |port| format!("{host}:{port}")));
    }
    Ok(servers.join(","))
}

/// Routes librdkafka's logs and errors to `tracing` and reports failed offset commits.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct KafkaContext;

impl ClientContext for KafkaContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(messaging.system = "kafka", %error, "librdkafka: {reason}");
    }
}

/// librdkafka's log lines as `tracing` events.
pub(super) fn log(level: RDKafkaLogLevel, fac: &str, log_message: &str) {
    match level {
        RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
            tracing::error!(messaging.system = "kafka", facility = fac, "librdkafka: {log_message}");
        }
        RDKafkaLogLevel::Warning => {
            tracing::warn!(messaging.system = "kafka", facility = fac, "librdkafka: {log_message}");
        }
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(messaging.system = "kafka", facility = fac, "librdkafka: {log_message}");
        }
        RDKafkaLogLevel::Debug => {
            tracing::debug!(messaging.system = "kafka", facility = fac, "librdkafka: {log_message}");
        }
    }
}

impl ConsumerContext for KafkaContext {
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::trace!(messaging.system = "kafka", ?offsets, "offsets committed"),
            // Nothing is lost: the messages after the last committed offset are delivered again.
            Err(error) => tracing::warn!(messaging.system = "kafka", %error, ?offsets, "offset commit failed"),
        }
    }
}

pub(super) fn create<T>(config: &ClientConfig, what: &str) -> Result<T>
where
    T: rdkafka::config::FromClientConfigAndContext<KafkaContext>,
{
    create_with(config, KafkaContext, what)
}

/// Creates a librdkafka client with `context`; a setting librdkafka rejects is an [`Error::InvalidConfig`].
pub(super) fn create_with<C: ClientContext, T>(config: &ClientConfig, context: C, what: &str) -> Result<T>
where
    T: rdkafka::config::FromClientConfigAndContext<C>,
{
    config.create_with_context(context).map_err(|error| match error {
        KafkaError::ClientConfig(_, ref description, ref key, ref value) => {
            Error::invalid_config("kafka config", format!("{key} = {value:?} is rejected by librdkafka: {description}"))
        }
        other => Error::broker(BROKER, format!("create the {what}"), other),
    })
}

pub(super) fn set_default(config: &mut ClientConfig, key: &str, value: &str) {
    if config.get(key).is_none() {
        config.set(key, value);
    }
}

/// The default suffix of a dead-letter topic: `<origin topic>.dlq`.
pub const DEFAULT_DEAD_LETTER_SUFFIX: &str = ".dlq";

/// The suffix of the consumer group a replay reads the dead-letter topics with: `<group>.replay`.
pub const REPLAY_GROUP_SUFFIX: &str = ".replay";

/// Which partitions a [`KafkaTransport`](super::KafkaTransport) reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subscription {
    /// Join the consumer group and let it balance these topics' partitions over its members.
    Topics(Vec<String>),
    /// Read exactly these `(topic, partition)`s, without a group join (faster to start; no rebalancing).
    /// Reading starts at the group's committed offset, or at `auto.offset.reset` without one.
    Partitions(Vec<(String, i32)>),
}

impl Subscription {
    /// The topics read, each once, in first-mention order.
    pub fn topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = Vec::new();
        let names: Vec<&String> = match self {
            Subscription::Topics(topics) => topics.iter().collect(),
            Subscription::Partitions(partitions) => partitions.iter().map(|(t, _)| t).collect(),
        };
        for name in names {
            if !topics.contains(name) {
                topics.push(name.clone());
            }
        }
        topics
    }

    /// Checks the topic names and that something is named.
    pub(super) fn validate(&self) -> Result<()> {
        let empty = match self {
            Subscription::Topics(topics) => topics.is_empty(),
            Subscription::Partitions(partitions) => partitions.is_empty(),
        };
        if empty {
            return Err(Error::invalid_config("subscription", "names no topic"));
        }
        if let Subscription::Partitions(partitions) = self
            && let Some((topic, partition)) = partitions.iter().find(|(_, p)| *p < 0)
        {
            return Err(Error::invalid_config(
                "subscription",
                format!("partition {partition} of {topic:?} is negative"),
            ));
        }
        for topic in self.topics() {
            validate_topic(&topic)
                .map_err(|reason| Error::invalid_config("subscription", format!("topic {topic:?} {reason}")))?;
        }
        Ok(())
    }
}

/// Checks a dead-letter suffix against every subscribed topic: not empty, and `<topic><suffix>` a valid
/// topic name for each.
pub(super) fn check_dead_letter_suffix(suffix: &str, topics: &[String]) -> Result<()> {
    if suffix.is_empty() {
        return Err(Error::invalid_config(
            "dead_letter_suffix",
            "is empty; dead letters would go back to the topic they came from",
        ));
    }
    for topic in topics {
        let dead = format!("{topic}{suffix}");
        validate_topic(&dead).map_err(|reason| {
            Error::invalid_config(
                "dead_letter_suffix",
                format!(
                    "{:?} makes dead-letter topic {:?} for {topic:?}, which {reason}",
                    crate::text::one_line(suffix),
                    crate::text::one_line(&dead)
                ),
            )
        })?;
    }
    Ok(())
}

/// Settings a producer or admin client may share with the consumer it works for.
pub(super) const SHARED_SETTINGS: [&str; 9] =
    ["bootstrap.servers", "security.", "sasl.", "ssl.", "client.", "broker.", "socket.", "test.mock.", "api.version"];

/// The settings of `config` a side client (dead-letter producer, admin, replay consumer) shares.
pub(super) fn shared(config: &ClientConfig) -> ClientConfig {
    let mut out = ClientConfig::new();
    for (key, value) in config.config_map() {
        if SHARED_SETTINGS.iter().any(|shared| key.starts_with(shared)) {
            out.set(key, value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_urls_are_checked() {
        assert_eq!(bootstrap_servers("kafka://127.0.0.1:9092").unwrap(), "127.0.0.1:9092");
        assert_eq!(bootstrap_servers("KAFKA://a:1,b:2/").unwrap(), "a:1,b:2");
        assert_eq!(bootstrap_servers("broker-1.local").unwrap(), "broker-1.local");
        assert_eq!(bootstrap_servers("[::1]:9092").unwrap(), "[::1]:9092");
        for (url, expected) in [
            ("nats://127.0.0.1:4222", "not a Kafka URL"),
            ("kafka://", "no host"),
            ("kafka://:9092", "no host"),
            ("kafka://host:port", "port \"port\""),
            ("kafka://host:0", "port \"0\""),
            ("kafka://user:pw@host:9092", "credentials"),
            ("kafka://host:9092/topic", "paths"),
            ("kafka://a:1,,b:2", "empty host"),
            ("kafka://ho st:1", "whitespace"),
            ("kafka://h*st:1", "not a host name"),
            ("[zz]:1", "not a host name"),
        ] {
            let error = bootstrap_servers(url).unwrap_err().to_string();
            assert!(error.contains(expected), "{url}: {error}");
        }
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic("order.events").is_ok());
        assert!(validate_topic("a-B_9.x").is_ok());
        assert!(validate_topic(&"x".repeat(249)).is_ok());
        assert!(validate_topic(&"x".repeat(250)).unwrap_err().contains("at most 249"));
        assert!(validate_topic("").is_err());
        assert!(validate_topic(".").is_err());
        assert!(validate_topic("..").is_err());
        assert!(validate_topic("order/events").unwrap_err().contains("'/'"));
    }

    #[test]
    fn dead_letter_suffixes_make_valid_topics() {
        let topics = vec!["order.events".to_owned()];
        assert!(check_dead_letter_suffix(".dlq", &topics).is_ok());
        for bad in ["", "/dlq", ".dl q", "\n"] {
            let error = check_dead_letter_suffix(bad, &topics).unwrap_err();
            assert!(matches!(error, Error::InvalidConfig { field: "dead_letter_suffix", .. }), "{bad:?}: {error}");
        }
        let long = vec!["t".repeat(246)];
        assert!(check_dead_letter_suffix(".dlq", &long).unwrap_err().to_string().contains("at most 249"));
        let subscription = Subscription::Partitions(vec![("a".into(), 0), ("a".into(), 1), ("b".into(), 0)]);
        assert_eq!(subscription.topics(), ["a", "b"]);
        assert!(Subscription::Topics(vec![]).validate().is_err());
        assert!(Subscription::Partitions(vec![("a".into(), -1)]).validate().is_err());
        assert!(Subscription::Topics(vec!["a/b".into()]).validate().is_err());
    }

    #[test]
    fn destination_literals_are_checked_at_config_time() {
        assert!(validate_destination(&default_destination()).is_ok());
        let bad = Destination::parse("events/{aggregate_type}").unwrap();
        let error = validate_destination(&bad).unwrap_err().to_string();
        assert!(error.contains("events/{aggregate_type}") && error.contains("'/'"), "{error}");
        assert!(validate_destination(&Destination::fixed("..").unwrap()).is_err());
        assert!(
            validate_destination(&Destination::parse(&format!("{}{{version}}", "x".repeat(249))).unwrap()).is_err()
        );
    }
}

//! Kafka adapter (feature `kafka`, [`rdkafka`] over a vendored librdkafka).
//!
//! - [`KafkaPublisher`]: an idempotent producer (`enable.idempotence=true`, `acks=all`). Each event is a
//!   record keyed by its aggregate id, so the events of one aggregate land in one partition in order; the
//!   topic comes from a [`Destination`] template (default [`DEFAULT_TOPIC_TEMPLATE`]); the headers carry the
//!   [`envelope_headers`]. An event is reported published only once its delivery report says the broker
//!   acknowledged it. A topic name Kafka would refuse and a message over `message.max.bytes` are permanent
//!   failures (the row goes to the dead letters with the reason); everything else is retried by the relay.
//! - [`KafkaConsumer`]: a consumer with `enable.auto.commit=false` that decodes each message
//!   ([`decode_message`]), hands it to a [`MessageHandler`] and commits past it only once the handler
//!   returned [`Disposition::Ack`] (the handler acks after its database commit) or the message was parked.
//!   On [`Disposition::Retry`] it seeks back to the message and delivers it again after a delay.
//!
//! ```no_run
//! # async fn demo() -> outbox_core::Result<()> {
//! use outbox_core::brokers::kafka::{KafkaConsumer, KafkaPublisher, Subscription, default_destination};
//! use outbox_core::{CancellationToken, Disposition, OutboxEvent};
//!
//! let publisher = KafkaPublisher::connect("kafka://127.0.0.1:9092", default_destination(), &[])?;
//! let consumer = KafkaConsumer::connect(
//!     "kafka://127.0.0.1:9092",
//!     "billing",
//!     Subscription::Topics(vec!["order.events".into()]),
//!     &[],
//! )?;
//! let shutdown = CancellationToken::new();
//! consumer.run(|event: OutboxEvent| async move { Disposition::Ack }, shutdown).await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers as _, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// The `rdkafka` crate this adapter is built on, for [`ClientConfig`], the admin client and the mock cluster.
pub use rdkafka;

use crate::broker::{Destination, Disposition, MessageHandler, decode_message, envelope_headers};
use crate::envelope::OutboxEvent;
use crate::error::{Error, Result};
use crate::publisher::{PublishError, Publisher};

const BROKER: &str = "Kafka";

/// The default topic template: one topic per aggregate type, e.g. `order.events`.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "{aggregate_type}.events";

/// The longest topic name Kafka accepts.
pub const MAX_TOPIC_LEN: usize = 249;

/// librdkafka's default `message.max.bytes`, used in error messages when the config does not set it.
const DEFAULT_MESSAGE_MAX_BYTES: &str = "1000000";

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
fn validate_destination(destination: &Destination) -> Result<()> {
    validate_topic(&destination.render_sample()).map_err(|reason| {
        Error::invalid_config(
            "destination",
            format!("template {:?} cannot make a valid Kafka topic name: it {reason}", destination.template()),
        )
    })
}

/// Turns `kafka://host:port[,host:port...]` or `host:port[,...]` into librdkafka's `bootstrap.servers`. A
/// missing port means 9092. An unknown scheme, an empty host, a path, a query, credentials or a port that
/// is not a number in 1..=65535 are an [`Error::InvalidConfig`] (set SASL/TLS through the config overrides).
pub fn bootstrap_servers(url: &str) -> Result<String> {
    let invalid = |reason: String| {
        Error::invalid_config("bootstrap", format!("{url:?} {reason}; expected kafka://host:port or host:port"))
    };
    let trimmed = url.trim();
    let rest = match trimmed.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("kafka") => rest,
        Some((scheme, _)) => return Err(invalid(format!("has scheme {scheme:?}, not kafka"))),
        None => trimmed,
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err(invalid("has no host".to_owned()));
    }
    let mut servers = Vec::new();
    for server in rest.split(',') {
        let server = server.trim();
        check_server(server).map_err(invalid)?;
        servers.push(server);
    }
    Ok(servers.join(","))
}

fn check_server(server: &str) -> std::result::Result<(), String> {
    if server.is_empty() {
        return Err("has an empty server in its list".to_owned());
    }
    if let Some(c) = server.chars().find(|c| matches!(c, '/' | '?' | '#' | '@') || c.is_whitespace()) {
        return Err(format!("has {c:?} in {server:?} (paths, queries and credentials are not supported)"));
    }
    let (host, port) = if let Some(inner) = server.strip_prefix('[') {
        let (host, after) = inner.split_once(']').ok_or_else(|| format!("has an unclosed `[` in {server:?}"))?;
        if host.is_empty() || !host.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.') {
            return Err(format!("has an invalid IPv6 address in {server:?}"));
        }
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(|| format!("has junk after `]` in {server:?}"))?)),
        }
    } else {
        let (host, port) = match server.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (server, None),
        };
        if host.is_empty() {
            return Err(format!("has no host in {server:?}"));
        }
        if let Some(c) = host.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))) {
            return Err(format!("has {c:?} in host {host:?}"));
        }
        (host, port)
    };
    if host.is_empty() {
        return Err(format!("has no host in {server:?}"));
    }
    if let Some(port) = port
        && !port.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err(format!("has port {port:?}, not a number in 1..=65535"));
    }
    Ok(())
}

/// Routes librdkafka's logs and errors to `tracing` and reports failed offset commits.
#[derive(Clone, Copy, Debug, Default)]
struct KafkaContext;

impl ClientContext for KafkaContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
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

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(messaging.system = "kafka", %error, "librdkafka: {reason}");
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

fn create<T>(config: &ClientConfig, what: &str) -> Result<T>
where
    T: rdkafka::config::FromClientConfigAndContext<KafkaContext>,
{
    config.create_with_context(KafkaContext).map_err(|error| match error {
        KafkaError::ClientConfig(_, ref description, ref key, ref value) => {
            Error::invalid_config("kafka config", format!("{key} = {value:?} is rejected by librdkafka: {description}"))
        }
        other => Error::broker(BROKER, format!("create the {what}"), other),
    })
}

fn set_default(config: &mut ClientConfig, key: &str, value: &str) {
    if config.get(key).is_none() {
        config.set(key, value);
    }
}

/// Publishes outbox events to Kafka with an idempotent producer; see the [module docs](self).
pub struct KafkaPublisher {
    producer: Mutex<FutureProducer<KafkaContext>>,
    config: ClientConfig,
    destination: Destination,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("bootstrap.servers", &self.config.get("bootstrap.servers"))
            .field("destination", &self.destination.template())
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// A publisher to the cluster at `bootstrap` (`kafka://host:port` or `host:port`, comma-separated for
    /// several), routing each event by `destination`; `extra` are librdkafka producer settings applied
    /// last (e.g. `("message.max.bytes", "2000000")`, SASL/TLS settings).
    ///
    /// Defaults: `enable.idempotence=true`, `acks=all`, `message.timeout.ms` = [`DEFAULT_MESSAGE_TIMEOUT_MS`]
    /// (keep it below the relay's `publish_timeout`), `client.id=outbox-relay`. Nothing is sent until the
    /// first publish: an unreachable cluster shows up as failed (retried) events, not as an error here.
    /// An invalid `bootstrap`, a destination whose literal parts are not valid topic characters, or a
    /// setting librdkafka rejects is an [`Error::InvalidConfig`].
    pub fn connect(bootstrap: &str, destination: Destination, extra: &[(&str, &str)]) -> Result<Self> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers(bootstrap)?);
        for (key, value) in extra {
            config.set(*key, *value);
        }
        Self::from_config(config, destination)
    }

    /// A publisher from a complete librdkafka `config` (e.g. pointing at a
    /// [`MockCluster`](rdkafka::mocking::MockCluster)). The defaults of [`connect`](Self::connect) are
    /// added where `config` does not set them.
    pub fn from_config(mut config: ClientConfig, destination: Destination) -> Result<Self> {
        validate_destination(&destination)?;
        if config.get("bootstrap.servers").is_none() && config.get("test.mock.num.brokers").is_none() {
            return Err(Error::invalid_config("bootstrap", "is not set (`bootstrap.servers`)"));
        }
        set_default(&mut config, "enable.idempotence", "true");
        set_default(&mut config, "acks", "all");
        set_default(&mut config, "message.timeout.ms", &DEFAULT_MESSAGE_TIMEOUT_MS.to_string());
        set_default(&mut config, "client.id", "outbox-relay");
        let producer = create(&config, "producer")?;
        Ok(KafkaPublisher { producer: Mutex::new(producer), config, destination })
    }

    /// Where events go.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    /// The librdkafka settings in use.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Waits up to `timeout` for every message handed to the producer to be delivered or failed (call it
    /// before shutting down if publishes may have been abandoned by a relay timeout). Blocks the calling
    /// thread: from async code, call it in `spawn_blocking`.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.producer().flush(timeout).map_err(|e| Error::broker(BROKER, "flush the producer", e))
    }

    fn producer(&self) -> FutureProducer<KafkaContext> {
        self.producer.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// After a fatal error (possible with the idempotent producer) the producer refuses everything:
    /// replace it so the relay's next pass can publish again.
    fn replace_if_fatal(&self, producer: &FutureProducer<KafkaContext>) {
        let Some((code, reason)) = producer.client().fatal_error() else { return };
        tracing::error!(messaging.system = "kafka", ?code, reason, "Kafka producer hit a fatal error; recreating it");
        match create::<FutureProducer<KafkaContext>>(&self.config, "producer") {
            Ok(fresh) => *self.producer.lock().unwrap_or_else(PoisonError::into_inner) = fresh,
            Err(error) => tracing::error!(messaging.system = "kafka", %error, "could not recreate the Kafka producer"),
        }
    }

    fn topic_of(&self, event: &OutboxEvent) -> std::result::Result<String, PublishError> {
        let topic = self.destination.render(event);
        validate_topic(&topic).map_err(|reason| {
            PublishError::permanent(format!(
                "invalid Kafka topic {topic:?} (from template {:?}) for event {}: the name {reason}",
                self.destination.template(),
                event.id
            ))
        })?;
        Ok(topic)
    }

    fn failure(&self, error: &KafkaError, event: &OutboxEvent, topic: &str) -> PublishError {
        match error.rdkafka_error_code() {
            Some(code) if is_too_large(code) => {
                let limit = self.config.get("message.max.bytes").unwrap_or(DEFAULT_MESSAGE_MAX_BYTES);
                PublishError::permanent(format!(
                    "Kafka rejected event {} for topic {topic:?}: the message (payload {} bytes plus key and headers) \
                     is over message.max.bytes ({limit} bytes here; the broker and topic have their own limit): {error}",
                    event.id,
                    event.payload.len()
                ))
            }
            Some(code) if is_permanent(code) => PublishError::permanent(format!(
                "Kafka rejected event {} for topic {topic:?} ({code:?}): {error}",
                event.id
            )),
            Some(RDKafkaErrorCode::QueueFull) => PublishError::transient(format!(
                "the Kafka producer queue is full (queue.buffering.max.messages/kbytes); event {} will be retried",
                event.id
            )),
            _ => PublishError::transient(format!(
                "Kafka did not acknowledge event {} on topic {topic:?}: {error}",
                event.id
            )),
        }
    }
}

/// The message is over a size limit of the producer, broker or topic.
fn is_too_large(code: RDKafkaErrorCode) -> bool {
    matches!(code, RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
}

/// No retry of the same message to the same topic can succeed.
fn is_permanent(code: RDKafkaErrorCode) -> bool {
    is_too_large(code)
        || matches!(
            code,
            RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidRecord
        )
}

fn record_headers(event: &OutboxEvent) -> OwnedHeaders {
    let headers = envelope_headers(event);
    headers.iter().fold(OwnedHeaders::new_with_capacity(headers.len()), |acc, (key, value)| {
        acc.insert(Header { key, value: Some(value.as_str()) })
    })
}

impl Publisher for KafkaPublisher {
    /// Sends every record of the batch, then awaits every delivery report: `Ok` only for records the
    /// broker acknowledged (`acks=all`).
    #[tracing::instrument(
        name = "outbox.kafka.publish",
        level = "debug",
        skip_all,
        fields(messaging.system = "kafka", messaging.batch.message_count = events.len())
    )]
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<std::result::Result<(), PublishError>> {
        let producer = self.producer();
        let mut pending = Vec::with_capacity(events.len());
        for event in events {
            let topic = match self.topic_of(event) {
                Ok(topic) => topic,
                Err(error) => {
                    tracing::warn!(
                        messaging.system = "kafka",
                        event_id = %event.id,
                        error = error.message(),
                        "event has no valid Kafka topic"
                    );
                    pending.push((String::new(), Err(error)));
                    continue;
                }
            };
            let record = FutureRecord::to(&topic)
                .key(event.aggregate_id.as_str())
                .payload(event.payload.as_str())
                .headers(record_headers(event));
            let sent = producer.send_result(record).map_err(|(error, _)| self.failure(&error, event, &topic));
            pending.push((topic, sent));
        }
        let mut results = Vec::with_capacity(events.len());
        for (event, (topic, sent)) in events.iter().zip(pending) {
            let result = match sent {
                Err(error) => Err(error),
                Ok(delivery) => match delivery.await {
                    Ok(Ok(delivery)) => {
                        tracing::trace!(
                            messaging.system = "kafka",
                            messaging.destination.name = %topic,
                            messaging.kafka.destination.partition = delivery.partition,
                            messaging.kafka.message.offset = delivery.offset,
                            event_id = %event.id,
                            "acknowledged"
                        );
                        Ok(())
                    }
                    Ok(Err((error, _))) => Err(self.failure(&error, event, &topic)),
                    Err(_) => Err(PublishError::transient(format!(
                        "the Kafka producer went away before event {} was acknowledged",
                        event.id
                    ))),
                },
            };
            if let Err(error) = &result {
                tracing::debug!(
                    messaging.system = "kafka",
                    messaging.destination.name = %topic,
                    event_id = %event.id,
                    permanent = error.is_permanent(),
                    error = error.message(),
                    "publish failed"
                );
            }
            results.push(result);
        }
        self.replace_if_fatal(&producer);
        results
    }
}

/// Which partitions a [`KafkaConsumer`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subscription {
    /// Join the consumer group and let it balance these topics' partitions over its members.
    Topics(Vec<String>),
    /// Read exactly these `(topic, partition)`s, without a group join (faster to start; no rebalancing).
    /// Reading starts at the group's committed offset, or at `auto.offset.reset` without one.
    Partitions(Vec<(String, i32)>),
}

/// Consumes outbox events from Kafka, committing offsets only after the handler is done with a message;
/// see the [module docs](self).
pub struct KafkaConsumer {
    consumer: Arc<StreamConsumer<KafkaContext>>,
    config: ClientConfig,
    subscription: Subscription,
    retry_delay: Duration,
    dead_letters: Option<(String, FutureProducer<KafkaContext>)>,
    /// The next offset to commit per partition: everything before it was acked or parked.
    done: Mutex<HashMap<(String, i32), i64>>,
}

impl std::fmt::Debug for KafkaConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConsumer")
            .field("bootstrap.servers", &self.config.get("bootstrap.servers"))
            .field("group.id", &self.config.get("group.id"))
            .field("subscription", &self.subscription)
            .field("retry_delay", &self.retry_delay)
            .finish_non_exhaustive()
    }
}

/// Settings a dead-letter producer may share with its consumer.
const SHARED_SETTINGS: [&str; 9] =
    ["bootstrap.servers", "security.", "sasl.", "ssl.", "client.", "broker.", "socket.", "test.mock.", "api.version"];

impl KafkaConsumer {
    /// A consumer of `subscription` in consumer group `group_id` on the cluster at `bootstrap`
    /// (`kafka://host:port` or `host:port`); `extra` are librdkafka consumer settings applied last (e.g.
    /// `("session.timeout.ms", "6000")`).
    ///
    /// Defaults: `auto.offset.reset=earliest`. Always: `enable.auto.commit=false`,
    /// `enable.auto.offset.store=false` (offsets are committed by [`run`](Self::run) after the handler).
    /// Must be called inside a Tokio runtime.
    pub fn connect(
        bootstrap: &str,
        group_id: &str,
        subscription: Subscription,
        extra: &[(&str, &str)],
    ) -> Result<Self> {
        if group_id.trim().is_empty() {
            return Err(Error::invalid_config("group_id", "is empty; offsets are committed per consumer group"));
        }
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers(bootstrap)?).set("group.id", group_id);
        for (key, value) in extra {
            config.set(*key, *value);
        }
        Self::from_config(config, subscription)
    }

    /// A consumer from a complete librdkafka `config` (it must set `group.id`), e.g. pointing at a
    /// [`MockCluster`](rdkafka::mocking::MockCluster). Auto-commit is switched off whatever `config` says.
    /// Must be called inside a Tokio runtime.
    pub fn from_config(mut config: ClientConfig, subscription: Subscription) -> Result<Self> {
        if config.get("group.id").is_none_or(|g| g.trim().is_empty()) {
            return Err(Error::invalid_config("group.id", "is not set; offsets are committed per consumer group"));
        }
        if config.get("bootstrap.servers").is_none() && config.get("test.mock.num.brokers").is_none() {
            return Err(Error::invalid_config("bootstrap", "is not set (`bootstrap.servers`)"));
        }
        set_default(&mut config, "auto.offset.reset", "earliest");
        config.set("enable.auto.commit", "false").set("enable.auto.offset.store", "false");
        let consumer: StreamConsumer<KafkaContext> = create(&config, "consumer")?;
        match &subscription {
            Subscription::Topics(topics) => {
                if topics.is_empty() {
                    return Err(Error::invalid_config("subscription", "names no topic"));
                }
                for topic in topics {
                    validate_topic(topic)
                        .map_err(|reason| Error::invalid_config("subscription", format!("topic {topic:?} {reason}")))?;
                }
                let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
                consumer
                    .subscribe(&topics)
                    .map_err(|e| Error::broker(BROKER, format!("subscribe to {topics:?}"), e))?;
            }
            Subscription::Partitions(partitions) => {
                if partitions.is_empty() {
                    return Err(Error::invalid_config("subscription", "names no partition"));
                }
                let mut list = TopicPartitionList::new();
                for (topic, partition) in partitions {
                    validate_topic(topic)
                        .map_err(|reason| Error::invalid_config("subscription", format!("topic {topic:?} {reason}")))?;
                    list.add_partition_offset(topic, *partition, Offset::Stored)
                        .map_err(|e| Error::broker(BROKER, format!("assign {topic}/{partition}"), e))?;
                }
                consumer.assign(&list).map_err(|e| Error::broker(BROKER, format!("assign {partitions:?}"), e))?;
            }
        }
        Ok(KafkaConsumer {
            consumer: Arc::new(consumer),
            config,
            subscription,
            retry_delay: Duration::from_secs(1),
            dead_letters: None,
            done: Mutex::new(HashMap::new()),
        })
    }

    /// How long to wait before delivering a message again after [`Disposition::Retry`] (default 1 s).
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// Also produces each parked message (unchanged, plus an `outbox_park_reason` header) to
    /// `<its topic><suffix>`, e.g. `order.events.dlq` for suffix `.dlq`, before committing past it. The
    /// dead-letter topic must exist (or the cluster must auto-create it); a dead-letter publish that fails
    /// is retried, so nothing is committed past a message that was neither handled nor set aside.
    pub fn with_dead_letter_suffix(mut self, suffix: &str) -> Result<Self> {
        if suffix.is_empty() {
            return Err(Error::invalid_config("dead_letter_suffix", "is empty; it would republish to the same topic"));
        }
        validate_topic(suffix)
            .map_err(|reason| Error::invalid_config("dead_letter_suffix", format!("{suffix:?} {reason}")))?;
        let mut config = ClientConfig::new();
        for (key, value) in self.config.config_map() {
            if SHARED_SETTINGS.iter().any(|shared| key.starts_with(shared)) {
                config.set(key, value);
            }
        }
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "30000")
            .set("client.id", "outbox-dead-letters");
        let producer = create(&config, "dead-letter producer")?;
        self.dead_letters = Some((suffix.to_owned(), producer));
        Ok(self)
    }

    /// What this consumer reads.
    pub fn subscription(&self) -> &Subscription {
        &self.subscription
    }

    /// The group's committed offsets of the consumer's current assignment (the next offset to read per
    /// `(topic, partition)`; partitions without a commit are left out).
    pub async fn committed(&self, timeout: Duration) -> Result<Vec<(String, i32, i64)>> {
        let consumer = self.consumer.clone();
        let list = tokio::task::spawn_blocking(move || consumer.committed(timeout))
            .await
            .map_err(|e| Error::broker(BROKER, "read committed offsets", e))?
            .map_err(|e| Error::broker(BROKER, "read committed offsets", e))?;
        Ok(list
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(offset) => Some((e.topic().to_owned(), e.partition(), offset)),
                _ => None,
            })
            .collect())
    }

    /// Consumes until `shutdown` is cancelled: for each message, decode it, call `handler`, then
    /// - [`Disposition::Ack`]: commit past it;
    /// - [`Disposition::Retry`]: commit nothing, wait the retry delay, seek back to it and deliver it again;
    /// - [`Disposition::Park`] (also for a message without a valid envelope, which never reaches the
    ///   handler): log a warning, dead-letter it if configured, commit past it.
    ///
    /// A message being handled when `shutdown` fires is finished first; the offsets of handled messages
    /// are committed synchronously before returning. Transient consume errors (broker down) are logged and
    /// waited out; a fatal consumer error is returned.
    pub async fn run<H: MessageHandler>(&self, handler: H, shutdown: CancellationToken) -> Result<()> {
        loop {
            let received = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                received = self.consumer.recv() => received.map(|message| message.detach()),
            };
            match received {
                Ok(message) => self.process(&handler, message, &shutdown).await,
                Err(KafkaError::MessageConsumptionFatal(code)) => {
                    self.commit_done().await;
                    return Err(Error::broker(BROKER, "consume", KafkaError::MessageConsumptionFatal(code)));
                }
                Err(KafkaError::PartitionEOF(_)) => {}
                Err(error) => {
                    tracing::warn!(messaging.system = "kafka", %error, "Kafka consume error; retrying");
                    if !sleep_unless(&shutdown, self.retry_delay).await {
                        break;
                    }
                }
            }
        }
        self.commit_done().await;
        Ok(())
    }

    async fn process<H: MessageHandler>(&self, handler: &H, message: OwnedMessage, shutdown: &CancellationToken) {
        let (topic, partition, offset) = (message.topic(), message.partition(), message.offset());
        let span = tracing::info_span!(
            "outbox.kafka.consume",
            messaging.system = "kafka",
            messaging.destination.name = topic,
            messaging.kafka.destination.partition = partition,
            messaging.kafka.message.offset = offset,
            messaging.message.id = tracing::field::Empty,
        );
        loop {
            let (disposition, reason) = match decode_message(&headers_of(&message), message.payload().unwrap_or(&[])) {
                Ok(event) => {
                    span.record("messaging.message.id", tracing::field::display(event.id));
                    (
                        crate::broker::handle_guarded(handler, event).instrument(span.clone()).await,
                        "the handler parked it".to_owned(),
                    )
                }
                Err(error) => (Disposition::Park, format!("no valid outbox envelope: {error}")),
            };
            match disposition {
                Disposition::Ack => {
                    tracing::debug!(parent: &span, "handled; committing");
                    self.commit_past(topic, partition, offset);
                    return;
                }
                Disposition::Park => {
                    tracing::warn!(parent: &span, reason, "parking a message that cannot be processed");
                    if self.dead_letter(&message, &reason, shutdown).await {
                        self.commit_past(topic, partition, offset);
                    }
                    return;
                }
                Disposition::Retry => {
                    tracing::debug!(parent: &span, delay = ?self.retry_delay, "handler asked for a retry");
                    if !sleep_unless(shutdown, self.retry_delay).await {
                        return;
                    }
                    match self.seek_back(topic, partition, offset).await {
                        Ok(()) => return,
                        Err(error) => {
                            tracing::warn!(parent: &span, %error, "could not seek back; retrying the message in place");
                        }
                    }
                }
            }
        }
    }

    /// Produces `message` to its dead-letter topic, if configured; `false` if shutdown came first.
    async fn dead_letter(&self, message: &OwnedMessage, reason: &str, shutdown: &CancellationToken) -> bool {
        let Some((suffix, producer)) = &self.dead_letters else { return true };
        let topic = format!("{}{suffix}", message.topic());
        if let Err(why) = validate_topic(&topic) {
            tracing::error!(topic, why, "dead-letter topic name is invalid; the message is only logged");
            return true;
        }
        let mut headers = OwnedHeaders::new();
        if let Some(original) = message.headers() {
            for header in original.iter() {
                headers = headers.insert(Header { key: header.key, value: header.value });
            }
        }
        let headers = headers.insert(Header { key: "outbox_park_reason", value: Some(reason) });
        loop {
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic).headers(headers.clone());
            if let Some(key) = message.key() {
                record = record.key(key);
            }
            if let Some(payload) = message.payload() {
                record = record.payload(payload);
            }
            match producer.send(record, Duration::from_secs(5)).await {
                Ok(_) => {
                    tracing::info!(messaging.system = "kafka", dead_letter_topic = topic, "message dead-lettered");
                    return true;
                }
                Err((error, _)) if error.rdkafka_error_code().is_some_and(is_permanent) => {
                    tracing::error!(
                        messaging.system = "kafka",
                        dead_letter_topic = topic,
                        %error,
                        "the dead-letter topic refuses the message; it is only logged"
                    );
                    return true;
                }
                Err((error, _)) => {
                    tracing::warn!(messaging.system = "kafka", dead_letter_topic = topic, %error, "dead-lettering failed; retrying");
                    if !sleep_unless(shutdown, self.retry_delay).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Records that everything up to `offset` is done and commits it asynchronously (the final commit in
    /// [`run`](Self::run) is synchronous).
    fn commit_past(&self, topic: &str, partition: i32, offset: i64) {
        let next = offset.saturating_add(1);
        self.done.lock().unwrap_or_else(PoisonError::into_inner).insert((topic.to_owned(), partition), next);
        let mut list = TopicPartitionList::new();
        let added = list.add_partition_offset(topic, partition, Offset::Offset(next));
        if let Err(error) = added.and_then(|()| self.consumer.commit(&list, CommitMode::Async)) {
            // The synchronous commit at shutdown, or a redelivery the inbox absorbs, covers it.
            tracing::warn!(messaging.system = "kafka", messaging.destination.name = topic, %error, "offset commit failed");
        }
    }

    async fn commit_done(&self) {
        let mut done = std::mem::take(&mut *self.done.lock().unwrap_or_else(PoisonError::into_inner));
        // After a rebalance, partitions handed to another member are theirs to commit.
        if let Ok(assignment) = self.consumer.assignment() {
            done.retain(|(topic, partition), _| assignment.find_partition(topic, *partition).is_some());
        }
        if done.is_empty() {
            return;
        }
        let mut list = TopicPartitionList::new();
        for ((topic, partition), next) in &done {
            if let Err(error) = list.add_partition_offset(topic, *partition, Offset::Offset(*next)) {
                tracing::warn!(messaging.system = "kafka", %error, "offset commit skipped");
            }
        }
        let consumer = self.consumer.clone();
        match tokio::task::spawn_blocking(move || consumer.commit(&list, CommitMode::Sync)).await {
            Ok(Ok(())) => {
                tracing::debug!(messaging.system = "kafka", partitions = done.len(), "final offsets committed")
            }
            Ok(Err(error)) => tracing::warn!(messaging.system = "kafka", %error, "final offset commit failed"),
            Err(error) => tracing::warn!(messaging.system = "kafka", %error, "final offset commit did not run"),
        }
    }

    /// Seeks `topic/partition` back to `offset` and waits until librdkafka dropped what it had prefetched
    /// past it, so nothing after the message is handled (and committed) before it.
    async fn seek_back(&self, topic: &str, partition: i32, offset: i64) -> Result<()> {
        let consumer = self.consumer.clone();
        let owned_topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            consumer.seek(&owned_topic, partition, Offset::Offset(offset), Duration::from_secs(10))
        })
        .await
        .map_err(|e| Error::broker(BROKER, format!("seek {topic}/{partition} to {offset}"), e))?
        .map_err(|e| Error::broker(BROKER, format!("seek {topic}/{partition} to {offset}"), e))
    }
}

/// The message's headers with UTF-8 values (others cannot be envelope fields and are dropped).
fn headers_of(message: &OwnedMessage) -> BTreeMap<String, String> {
    let Some(headers) = message.headers() else { return BTreeMap::new() };
    headers.iter().filter_map(|h| Some((h.key.to_owned(), std::str::from_utf8(h.value?).ok()?.to_owned()))).collect()
}

/// Sleeps `delay`; `false` if `shutdown` fired first.
async fn sleep_unless(shutdown: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
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
            ("nats://127.0.0.1:4222", "scheme \"nats\""),
            ("kafka://", "no host"),
            ("kafka://:9092", "no host"),
            ("kafka://host:port", "port \"port\""),
            ("kafka://host:0", "port \"0\""),
            ("kafka://user:pw@host:9092", "credentials"),
            ("kafka://host:9092/topic", "paths"),
            ("kafka://a:1,,b:2", "empty server"),
            ("kafka://ho st:1", "' '"),
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

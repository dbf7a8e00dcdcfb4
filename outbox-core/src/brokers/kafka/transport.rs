//! [`KafkaTransport`]: the consume side, a [`Transport`] over a subscription with contiguous commits per
//! partition (see the [module docs](super)).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::Mutex as AsyncMutex;

use super::commits::{Commits, KafkaCommitStats, TransportContext};
use super::config::{
    BROKER, DEFAULT_DEAD_LETTER_SUFFIX, KafkaContext, Subscription, bootstrap_servers, check_dead_letter_suffix,
    create, create_with, set_default, shared,
};
use crate::consume::{DeadLetter, Delivery, Lag, Transport, dead_header};
use crate::error::{Error, Result};

/// How long a dead letter (or a replayed message) may wait for its delivery report.
const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`KafkaTransport::with_commit_interval`]: acked offsets reach the broker within about this
/// long (plus a fetch wait), in one commit per interval rather than one per message.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_millis(500);

/// The default [`KafkaTransport::with_commit_timeout`]: a commit unanswered this long is counted and logged,
/// and the final commit at shutdown waits at most this long. Below the 10 s a shutdown is commonly given.
pub const DEFAULT_COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`KafkaTransport`] needs to settle one message: where it is, and its key and raw headers (kept
/// on a dead letter).
#[derive(Debug)]
pub struct KafkaReceipt {
    topic: String,
    partition: i32,
    offset: i64,
    /// The partition's assignment generation when the message was fetched.
    generation: u64,
    pub(super) key: Option<Vec<u8>>,
    pub(super) headers: Vec<(String, Option<Vec<u8>>)>,
}

impl KafkaReceipt {
    /// The topic, partition and offset of the message.
    pub fn position(&self) -> (&str, i32, i64) {
        (&self.topic, self.partition, self.offset)
    }
}

/// Consumes a Kafka [`Subscription`] for the [`Consumer`](crate::Consumer) driver: manual commits of the
/// contiguous acked prefix per partition, dead letters to `<topic>.dlq`; see the [module docs](super).
pub struct KafkaTransport {
    consumer: Arc<StreamConsumer<TransportContext>>,
    pub(super) config: ClientConfig,
    pub(super) subscription: Subscription,
    pub(super) group: String,
    pub(super) dead_letter_suffix: String,
    pub(super) producer: FutureProducer<KafkaContext>,
    admin: AdminClient<KafkaContext>,
    pub(super) delivery_timeout: Duration,
    commits: Commits,
    /// Dead-letter topics known to exist; held while one is created, so two dead letters never create
    /// the same topic at once (a broker that handles concurrent creates badly could lose the first
    /// letter).
    dead_topics: AsyncMutex<HashSet<String>>,
    /// Held while a dead letter is produced and confirmed.
    dead_letters: AsyncMutex<()>,
}

impl std::fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("bootstrap.servers", &self.config.get("bootstrap.servers"))
            .field("group.id", &self.group)
            .field("subscription", &self.subscription)
            .field("dead_letter_suffix", &self.dead_letter_suffix)
            .finish_non_exhaustive()
    }
}

impl KafkaTransport {
    /// A transport of `subscription` in consumer group `group` on the cluster at `bootstrap`
    /// (`kafka://host:port` or `host:port`); `extra` are librdkafka consumer settings applied last (e.g.
    /// `("session.timeout.ms", "6000")`). Dead letters go to `<topic>.dlq` ([`DEFAULT_DEAD_LETTER_SUFFIX`];
    /// see [`with_dead_letter_suffix`](Self::with_dead_letter_suffix)).
    ///
    /// Defaults: `auto.offset.reset=earliest`. Always: `enable.auto.commit=false`,
    /// `enable.auto.offset.store=false` (the transport commits the acked prefix itself, see
    /// [`with_commit_interval`](Self::with_commit_interval)). An invalid
    /// bootstrap, an empty group, a subscription naming no topic or an invalid topic, a dead-letter topic
    /// name Kafka would refuse, or a setting librdkafka rejects is an [`Error::InvalidConfig`]. Nothing is
    /// contacted here. Must be called inside a Tokio runtime.
    pub fn connect(bootstrap: &str, group: &str, subscription: Subscription, extra: &[(&str, &str)]) -> Result<Self> {
        if group.trim().is_empty() {
            return Err(Error::invalid_config("group", "is empty; offsets are committed per consumer group"));
        }
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers(bootstrap)?).set("group.id", group);
        for (key, value) in extra {
            config.set(*key, *value);
        }
        Self::from_config(config, subscription)
    }

    /// A transport from a complete librdkafka `config` (it must set `group.id`), e.g. pointing at a
    /// [`MockCluster`](rdkafka::mocking::MockCluster). Auto-commit is switched off whatever `config` says.
    pub fn from_config(mut config: ClientConfig, subscription: Subscription) -> Result<Self> {
        let group = config.get("group.id").unwrap_or_default().to_owned();
        if group.trim().is_empty() {
            return Err(Error::invalid_config(
                "group",
                "is not set (`group.id`); offsets are committed per consumer group",
            ));
        }
        if config.get("bootstrap.servers").is_none() && config.get("test.mock.num.brokers").is_none() {
            return Err(Error::invalid_config("bootstrap", "is not set (`bootstrap.servers`)"));
        }
        subscription.validate()?;
        check_dead_letter_suffix(DEFAULT_DEAD_LETTER_SUFFIX, &subscription.topics())?;
        set_default(&mut config, "auto.offset.reset", "earliest");
        config.set("enable.auto.commit", "false").set("enable.auto.offset.store", "false");
        let consumer: StreamConsumer<TransportContext> = create_with(&config, TransportContext::new(), "consumer")?;
        match &subscription {
            Subscription::Topics(topics) => {
                let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
                consumer
                    .subscribe(&topics)
                    .map_err(|e| Error::broker(BROKER, format!("subscribe to {topics:?}"), e))?;
            }
            Subscription::Partitions(partitions) => {
                let mut list = TopicPartitionList::new();
                for (topic, partition) in partitions {
                    list.add_partition_offset(topic, *partition, Offset::Stored)
                        .map_err(|e| Error::broker(BROKER, format!("assign {topic}/{partition}"), e))?;
                }
                consumer.assign(&list).map_err(|e| Error::broker(BROKER, format!("assign {partitions:?}"), e))?;
            }
        }
        let mut side = shared(&config);
        side.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", DEFAULT_DELIVERY_TIMEOUT.as_millis().to_string())
            .set("client.id", "outbox-dead-letters");
        let producer = create(&side, "dead-letter producer")?;
        let admin = create(&shared(&config), "admin client")?;
        let consumer = Arc::new(consumer);
        Ok(KafkaTransport {
            commits: Commits::new(consumer.clone(), DEFAULT_COMMIT_INTERVAL, DEFAULT_COMMIT_TIMEOUT),
            consumer,
            config,
            subscription,
            group,
            dead_letter_suffix: DEFAULT_DEAD_LETTER_SUFFIX.to_owned(),
            producer,
            admin,
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
            dead_topics: AsyncMutex::new(HashSet::new()),
            dead_letters: AsyncMutex::new(()),
        })
    }

    /// Dead letters go to `<topic><suffix>` (default `.dlq`). An empty suffix, or one that makes an invalid
    /// topic name for any subscribed topic, is an [`Error::InvalidConfig`].
    pub fn with_dead_letter_suffix(mut self, suffix: &str) -> Result<Self> {
        check_dead_letter_suffix(suffix, &self.subscription.topics())?;
        self.dead_letter_suffix = suffix.to_owned();
        Ok(self)
    }

    /// Acked offsets are committed at most once per `interval` (default [`DEFAULT_COMMIT_INTERVAL`]), by a
    /// commit started from an ack or a fetch that runs beside them, one at a time, so neither waits for the
    /// broker: a slow or hung group coordinator delays commits, never consumption. A smaller interval means fewer redeliveries after a
    /// crash, a larger one fewer commit requests. A zero interval is an [`Error::InvalidConfig`].
    pub fn with_commit_interval(mut self, interval: Duration) -> Result<Self> {
        if interval.is_zero() {
            return Err(Error::invalid_config("commit_interval", "is zero; it would send a commit per ack"));
        }
        self.commits.interval = interval;
        Ok(self)
    }

    /// How long a commit may go unanswered before it is counted in [`KafkaCommitStats::timed_out`] and
    /// logged, and how long the final commit at shutdown ([`Transport::flush`]) waits (default
    /// [`DEFAULT_COMMIT_TIMEOUT`]). librdkafka itself ends an unanswered request after `socket.timeout.ms`
    /// (60 s by default); the next commit then carries its offsets. A zero timeout is an
    /// [`Error::InvalidConfig`].
    pub fn with_commit_timeout(mut self, timeout: Duration) -> Result<Self> {
        if timeout.is_zero() {
            return Err(Error::invalid_config("commit_timeout", "is zero; no commit could be answered in time"));
        }
        self.commits.timeout = timeout;
        Ok(self)
    }

    /// What the offset commits did so far.
    pub fn commit_stats(&self) -> KafkaCommitStats {
        self.commits.stats()
    }

    /// What this transport reads.
    pub fn subscription(&self) -> &Subscription {
        &self.subscription
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The dead-letter topic of `topic`: `<topic><suffix>`.
    pub fn dead_letter_topic(&self, topic: &str) -> String {
        format!("{topic}{}", self.dead_letter_suffix)
    }

    /// The group's committed offsets of the current assignment (the next offset to read per
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

    fn delivery(&self, message: OwnedMessage) -> Delivery<KafkaReceipt> {
        let (topic, partition, offset) = (message.topic().to_owned(), message.partition(), message.offset());
        let raw: Vec<(String, Option<Vec<u8>>)> = message
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        // Values that are not UTF-8 cannot be envelope fields: the driver does not see them (a dead letter
        // keeps them).
        let headers: BTreeMap<String, String> =
            raw.iter().filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.clone()?).ok()?))).collect();
        let generation = self.commits.handed_out(&topic, partition, offset);
        Delivery {
            headers,
            payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            origin: topic.clone(),
            deliveries: 1,
            receipt: KafkaReceipt {
                topic,
                partition,
                offset,
                generation,
                key: message.key().map(<[u8]>::to_vec),
                headers: raw,
            },
        }
    }

    /// Creates `topic` unless it is known to exist, with as many partitions as `origin` (replication: the
    /// broker's default).
    async fn ensure_topic(&self, topic: &str, origin: &str) -> Result<()> {
        let mut known = self.dead_topics.lock().await;
        if known.contains(topic) {
            return Ok(());
        }
        let consumer = self.consumer.clone();
        let origin_name = origin.to_owned();
        let partitions = tokio::task::spawn_blocking(move || {
            let metadata = consumer.fetch_metadata(Some(&origin_name), Duration::from_secs(10)).ok()?;
            let count = metadata.topics().first()?.partitions().len();
            i32::try_from(count).ok().filter(|n| *n > 0)
        })
        .await
        .ok()
        .flatten()
        .unwrap_or(1);
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = self
            .admin
            .create_topics([&new], &options)
            .await
            .map_err(|e| Error::broker(BROKER, format!("create dead-letter topic {topic:?}"), e))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => {
                    return Err(Error::broker(
                        BROKER,
                        format!("create dead-letter topic {topic:?}"),
                        KafkaError::AdminOp(code),
                    ));
                }
            }
        }
        tracing::info!(messaging.system = "kafka", dead_letter_topic = topic, partitions, "dead-letter topic ready");
        known.insert(topic.to_owned());
        Ok(())
    }
}

/// `raw` headers minus those `strip` matches, plus `extra`.
pub(super) fn rebuild_headers(
    raw: &[(String, Option<Vec<u8>>)],
    strip: impl Fn(&str) -> bool,
    extra: &[(String, String)],
) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(raw.len() + extra.len());
    for (key, value) in raw.iter().filter(|(k, _)| !strip(k)) {
        headers = headers.insert(Header { key, value: value.as_deref() });
    }
    for (key, value) in extra {
        headers = headers.insert(Header { key, value: Some(value.as_bytes()) });
    }
    headers
}

impl Transport for KafkaTransport {
    type Receipt = KafkaReceipt;

    fn broker(&self) -> &'static str {
        BROKER
    }

    fn source(&self) -> String {
        self.subscription.topics().join(",")
    }

    /// Sends a commit when one is due ([`with_commit_interval`](KafkaTransport::with_commit_interval)), waits
    /// up to `wait` for the first message, then takes what librdkafka has ready, up to `max`.
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery<KafkaReceipt>>> {
        // Acks that came after the last commit go out here at the latest (a fetch also serves the commit
        // callbacks).
        self.commits.commit_due();
        let first = match tokio::time::timeout(wait, self.consumer.recv()).await {
            Err(_) | Ok(Err(KafkaError::PartitionEOF(_))) => return Ok(Vec::new()),
            Ok(Err(error)) => return Err(Error::broker(BROKER, format!("receive from {}", self.source()), error)),
            Ok(Ok(message)) => message.detach(),
        };
        let mut batch = vec![self.delivery(first)];
        while batch.len() < max {
            match self.consumer.recv().now_or_never() {
                Some(Ok(message)) => batch.push(self.delivery(message.detach())),
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(error)) => {
                    tracing::debug!(messaging.system = "kafka", %error, "consume error after a message; returning the batch");
                    break;
                }
                None => break,
            }
        }
        Ok(batch)
    }

    /// Marks the offset done; the contiguous done prefix of its partition is committed in the background
    /// ([`with_commit_interval`](KafkaTransport::with_commit_interval)): an ack of offset 7 while 5 is held
    /// commits nothing past 5. Never waits for the broker, so a hung commit cannot hold up consumption.
    async fn ack(&self, receipt: &KafkaReceipt) -> Result<()> {
        if !self.commits.acked(&receipt.topic, receipt.partition, receipt.offset, receipt.generation) {
            return Err(Error::broker(
                BROKER,
                format!("ack {}/{} offset {}", receipt.topic, receipt.partition, receipt.offset),
                "the partition was revoked since (rebalance): its new owner redelivers the message from the last commit",
            ));
        }
        self.commits.commit_due();
        Ok(())
    }

    /// Commits the acked prefix of every partition that moved since the last confirmed commit and waits
    /// for the broker's answer, at most the commit timeout
    /// ([`with_commit_timeout`](KafkaTransport::with_commit_timeout)). On a timeout or a failure the
    /// messages after the last commit are delivered again after the restart (the inbox absorbs them).
    async fn flush(&self) -> Result<()> {
        self.commits.flush().await
    }

    /// Leaves the offset uncommitted: nothing past it is committed, so it is delivered again after a
    /// restart or a rebalance, from the last commit (with the acked messages after it, which the inbox
    /// absorbs).
    async fn release(&self, receipt: &KafkaReceipt) -> Result<()> {
        tracing::debug!(messaging.system = "kafka", topic = %receipt.topic, partition = receipt.partition, offset = receipt.offset, "released: left uncommitted");
        Ok(())
    }

    /// Produces the original key, payload and headers (earlier dead-letter headers stripped) plus the
    /// [`DeadLetter::headers`] to `<origin topic><suffix>`, creating that topic first if needed, and waits
    /// for the delivery report (`acks=all`).
    async fn dead_letter(&self, delivery: &Delivery<KafkaReceipt>, letter: &DeadLetter) -> Result<()> {
        let topic = self.dead_letter_topic(&delivery.origin);
        self.ensure_topic(&topic, &delivery.origin).await?;
        let receipt = &delivery.receipt;
        let headers = rebuild_headers(
            &receipt.headers,
            |k| k.starts_with(dead_header::PREFIX),
            &letter.headers(&BTreeMap::new()),
        );
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&topic).payload(delivery.payload.as_slice()).headers(headers);
        if let Some(key) = &receipt.key {
            record = record.key(key.as_slice());
        }
        // One dead letter at a time: each is confirmed before the next is sent.
        let _one = self.dead_letters.lock().await;
        match self.producer.send(record, self.delivery_timeout).await {
            Ok(_) => Ok(()),
            Err((error, _)) => Err(Error::broker(
                BROKER,
                format!("dead-letter {}/{} offset {} to {topic:?}", receipt.topic, receipt.partition, receipt.offset),
                error,
            )),
        }
    }

    /// Per partition of the subscription, the high watermark minus the group's committed offset (the low
    /// watermark where none is committed), summed. Kafka does not track delivered, unacknowledged messages
    /// apart from the committed offset, so `unacked` is `None`.
    async fn lag(&self) -> Result<Option<Lag>> {
        let consumer = Arc::clone(&self.consumer);
        let subscription = self.subscription.clone();
        let timeout = self.delivery_timeout;
        let read = tokio::task::spawn_blocking(move || -> std::result::Result<u64, rdkafka::error::KafkaError> {
            let mut partitions = rdkafka::TopicPartitionList::new();
            match &subscription {
                Subscription::Partitions(list) => {
                    for (topic, partition) in list {
                        partitions.add_partition(topic, *partition);
                    }
                }
                Subscription::Topics(topics) => {
                    for topic in topics {
                        let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
                        for found in metadata.topics() {
                            for partition in found.partitions() {
                                partitions.add_partition(topic, partition.id());
                            }
                        }
                    }
                }
            }
            let committed = consumer.committed_offsets(partitions, timeout)?;
            let mut lag = 0u64;
            for element in committed.elements() {
                let (low, high) = consumer.fetch_watermarks(element.topic(), element.partition(), timeout)?;
                let from = match element.offset() {
                    rdkafka::Offset::Offset(offset) => offset,
                    _ => low,
                };
                lag += u64::try_from(high.saturating_sub(from)).unwrap_or(0);
            }
            Ok(lag)
        });
        let what = || format!("read the lag of group {:?} on {:?}", self.group, self.subscription.topics());
        let lag =
            read.await.map_err(|e| Error::broker(BROKER, what(), e))?.map_err(|e| Error::broker(BROKER, what(), e))?;
        Ok(Some(Lag::new(None, Some(lag))))
    }
}

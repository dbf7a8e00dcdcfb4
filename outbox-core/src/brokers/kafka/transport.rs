//! [`KafkaTransport`]: the consume side, a [`Transport`] over a subscription with contiguous commits per
//! partition (see the [module docs](super)).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::Mutex as AsyncMutex;

use super::config::{
    BROKER, DEFAULT_DEAD_LETTER_SUFFIX, KafkaContext, Subscription, bootstrap_servers, check_dead_letter_suffix,
    create, create_with, set_default, shared,
};
use crate::consume::{DeadLetter, Delivery, Transport, dead_header};
use crate::error::{Error, Result};

/// How long a dead letter (or a replayed message) may wait for its delivery report.
const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

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

/// One assigned partition: the offsets handed to the driver and not acked yet, the highest offset handed
/// out, and the offset committed last.
#[derive(Debug)]
struct Partition {
    generation: u64,
    outstanding: BTreeSet<i64>,
    highest: Option<i64>,
    committed: Option<i64>,
}

impl Partition {
    /// The next offset to commit: everything before it was acked. The lowest offset not acked yet, or one
    /// past the highest handed out when all were acked.
    fn commit_point(&self) -> Option<i64> {
        match self.outstanding.first() {
            Some(&lowest) => Some(lowest),
            None => self.highest.map(|h| h + 1),
        }
    }
}

#[derive(Debug, Default)]
struct Progress {
    partitions: HashMap<(String, i32), Partition>,
    generations: u64,
}

impl Progress {
    fn partition(&mut self, topic: &str, partition: i32) -> &mut Partition {
        let next = self.generations + 1;
        let entry = self.partitions.entry((topic.to_owned(), partition)).or_insert_with(|| Partition {
            generation: next,
            outstanding: BTreeSet::new(),
            highest: None,
            committed: None,
        });
        if entry.generation == next {
            self.generations = next;
        }
        entry
    }
}

/// The consumer's context: logs through `tracing`, and on a revocation drops the progress of the revoked
/// partitions (their new owner starts from the last commit).
struct TransportContext {
    progress: Arc<Mutex<Progress>>,
}

impl ClientContext for TransportContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        super::config::log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(messaging.system = "kafka", %error, "librdkafka: {reason}");
    }
}

impl ConsumerContext for TransportContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(revoked) = rebalance {
            let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
            for element in revoked.elements() {
                progress.partitions.remove(&(element.topic().to_owned(), element.partition()));
            }
            tracing::info!(
                messaging.system = "kafka",
                partitions = revoked.count(),
                "partitions revoked; their held messages are redelivered to the new owner"
            );
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(assigned) => {
                tracing::info!(messaging.system = "kafka", partitions = assigned.count(), "partitions assigned");
            }
            Rebalance::Error(error) => tracing::warn!(messaging.system = "kafka", %error, "rebalance failed"),
            Rebalance::Revoke(_) => {}
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(error) = result {
            tracing::warn!(messaging.system = "kafka", %error, ?offsets, "offset commit failed");
        }
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
    progress: Arc<Mutex<Progress>>,
    /// Held while a commit is computed and sent, so commits of one partition never go backwards.
    commits: AsyncMutex<()>,
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
    /// `enable.auto.offset.store=false` (offsets are committed by [`ack`](Transport::ack)). An invalid
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
        let progress = Arc::new(Mutex::new(Progress::default()));
        let consumer: StreamConsumer<TransportContext> =
            create_with(&config, TransportContext { progress: progress.clone() }, "consumer")?;
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
        Ok(KafkaTransport {
            consumer: Arc::new(consumer),
            config,
            subscription,
            group,
            dead_letter_suffix: DEFAULT_DEAD_LETTER_SUFFIX.to_owned(),
            producer,
            admin,
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
            progress,
            commits: AsyncMutex::new(()),
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
        let generation = {
            let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
            let state = progress.partition(&topic, partition);
            state.outstanding.insert(offset);
            state.highest = Some(state.highest.map_or(offset, |h| h.max(offset)));
            state.generation
        };
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

    /// Waits up to `wait` for the first message, then takes what librdkafka has ready, up to `max`.
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery<KafkaReceipt>>> {
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

    /// Marks the offset done and commits (synchronously) the contiguous done prefix of its partition: an
    /// ack of offset 7 while 5 is held commits nothing past 5.
    async fn ack(&self, receipt: &KafkaReceipt) -> Result<()> {
        let what = || format!("commit past {}/{} offset {}", receipt.topic, receipt.partition, receipt.offset);
        {
            let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
            match progress.partitions.get_mut(&(receipt.topic.clone(), receipt.partition)) {
                Some(state) if state.generation == receipt.generation => {
                    state.outstanding.remove(&receipt.offset);
                }
                _ => {
                    return Err(Error::broker(
                        BROKER,
                        what(),
                        "the partition was revoked since (rebalance): its new owner redelivers the message from the last commit",
                    ));
                }
            }
        }
        let _serial = self.commits.lock().await;
        let point = {
            let progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(state) = progress.partitions.get(&(receipt.topic.clone(), receipt.partition)) else {
                return Ok(());
            };
            match state.commit_point() {
                Some(point) if state.committed.is_none_or(|c| point > c) => point,
                _ => return Ok(()),
            }
        };
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&receipt.topic, receipt.partition, Offset::Offset(point))
            .map_err(|e| Error::broker(BROKER, what(), e))?;
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || consumer.commit(&list, CommitMode::Sync))
            .await
            .map_err(|e| Error::broker(BROKER, what(), e))?
            .map_err(|e| Error::broker(BROKER, what(), e))?;
        let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = progress.partitions.get_mut(&(receipt.topic.clone(), receipt.partition))
            && state.generation == receipt.generation
        {
            state.committed = Some(state.committed.map_or(point, |c| c.max(point)));
        }
        Ok(())
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_stop_at_the_lowest_offset_not_acked() {
        let mut progress = Progress::default();
        let state = progress.partition("t", 0);
        for offset in [5, 6, 7] {
            state.outstanding.insert(offset);
            state.highest = Some(offset);
        }
        state.outstanding.remove(&7);
        assert_eq!(state.commit_point(), Some(5), "an ack of 7 while 5 is held commits nothing past 5");
        state.outstanding.remove(&5);
        assert_eq!(state.commit_point(), Some(6));
        state.outstanding.remove(&6);
        assert_eq!(state.commit_point(), Some(8));
        let generation = state.generation;
        progress.partitions.clear();
        assert!(progress.partition("t", 0).generation > generation, "a reassigned partition is a new generation");
    }
}

//! [`KafkaTransport`]: the consume side, a [`Transport`] over a subscription with contiguous commits per
//! partition (see the [module docs](super)).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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

/// One assigned partition: the offsets handed to the driver and not acked yet, the highest offset handed
/// out, and the highest offset the broker confirmed a commit of.
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

/// What the commits did so far, for [`KafkaTransport::commit_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KafkaCommitStats {
    /// Commits the broker confirmed.
    pub committed: u64,
    /// Commits that failed (the broker refused, the coordinator was unreachable, the final commit failed).
    /// Nothing is lost: a later commit carries the same offsets, or they are delivered again.
    pub failed: u64,
    /// Commits left unanswered for the commit timeout (librdkafka ends them later, and they count as failed
    /// then), including a final commit at shutdown that was given up on.
    pub timed_out: u64,
}

#[derive(Debug, Default)]
struct Progress {
    partitions: HashMap<(String, i32), Partition>,
    generations: u64,
    /// When the last background commit was sent.
    last_sent: Option<Instant>,
    /// Whether that commit is still unanswered.
    awaiting: bool,
    /// Whether it was counted as timed out already.
    overdue: bool,
    stats: KafkaCommitStats,
}

impl Progress {
    /// The partitions whose commit point moved past what the broker confirmed, with those points.
    fn due(&self) -> Vec<(String, i32, i64)> {
        self.partitions
            .iter()
            .filter_map(|((topic, partition), state)| {
                let point = state.commit_point()?;
                state.committed.is_none_or(|c| point > c).then(|| (topic.clone(), *partition, point))
            })
            .collect()
    }

    /// Records what the broker confirmed: per partition, the offset of a successful commit (never lowering
    /// what is known).
    fn confirmed(&mut self, offsets: &TopicPartitionList) {
        for element in offsets.elements() {
            if let (Offset::Offset(offset), Ok(())) = (element.offset(), element.error())
                && let Some(state) = self.partitions.get_mut(&(element.topic().to_owned(), element.partition()))
            {
                state.committed = Some(state.committed.map_or(offset, |c| c.max(offset)));
            }
        }
    }

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

/// The consumer's context: logs through `tracing`, and on a revocation commits what was acked of the
/// revoked partitions and drops their progress (their new owner starts from the last commit).
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
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(revoked) = rebalance {
            let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
            // Commit what was acked before the partitions go, so their new owner redelivers less. Sent
            // asynchronously: a hung coordinator must not stall the rebalance; if it fails, the new owner
            // redelivers from the last commit (the inbox absorbs the copies).
            let due: Vec<(String, i32, i64)> = progress
                .due()
                .into_iter()
                .filter(|(topic, partition, _)| {
                    revoked.elements().iter().any(|e| e.topic() == topic && e.partition() == *partition)
                })
                .collect();
            if let Some(list) = offsets_list(&due)
                && let Err(error) = consumer.commit(&list, CommitMode::Async)
            {
                progress.stats.failed += 1;
                tracing::warn!(messaging.system = "kafka", %error, ?due, "commit of revoked partitions not sent; their new owner redelivers from the last commit");
            }
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

    /// Only logs: the transport's own commits report their outcome where they are sent (librdkafka does
    /// not deliver this callback for them); this sees the revocation commit's answer, when there is one.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => tracing::trace!(messaging.system = "kafka", ?offsets, "offsets committed"),
            Err(error) => tracing::warn!(messaging.system = "kafka", %error, ?offsets, "offset commit failed"),
        }
    }
}

/// `(topic, partition, offset)`s as a list to commit; `None` when there is nothing to commit.
fn offsets_list(offsets: &[(String, i32, i64)]) -> Option<TopicPartitionList> {
    let mut list = TopicPartitionList::with_capacity(offsets.len());
    for (topic, partition, offset) in offsets {
        if let Err(error) = list.add_partition_offset(topic, *partition, Offset::Offset(*offset)) {
            // Only an invalid offset is refused here, which a commit point never is.
            tracing::warn!(messaging.system = "kafka", %error, topic, partition, offset, "offset left out of a commit");
        }
    }
    (list.count() > 0).then_some(list)
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
    commit_interval: Duration,
    commit_timeout: Duration,
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
            commit_interval: DEFAULT_COMMIT_INTERVAL,
            commit_timeout: DEFAULT_COMMIT_TIMEOUT,
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
        self.commit_interval = interval;
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
        self.commit_timeout = timeout;
        Ok(self)
    }

    /// What the offset commits did so far.
    pub fn commit_stats(&self) -> KafkaCommitStats {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner).stats
    }

    /// Starts a commit of the acked prefix of every partition that moved, unless one went out less than
    /// the commit interval ago or one is still unanswered. Never waits for the broker: the commit runs on a
    /// thread of its own (a synchronous librdkafka commit, so its outcome is known: librdkafka does not
    /// report asynchronous ones to this client), which records the outcome. An unanswered commit is counted
    /// as timed out after the commit timeout; librdkafka ends it after `socket.timeout.ms` (60 s by
    /// default), and the next commit carries the offsets it had, and later ones.
    fn commit_due(&self) {
        let (list, due) = {
            let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if let Some(sent) = progress.last_sent {
                let since = now.saturating_duration_since(sent);
                if progress.awaiting {
                    if since >= self.commit_timeout && !progress.overdue {
                        progress.overdue = true;
                        progress.stats.timed_out += 1;
                        tracing::warn!(
                            messaging.system = "kafka",
                            timeout = ?self.commit_timeout,
                            "offset commit unanswered; consuming goes on, and the next commit carries its offsets"
                        );
                    }
                    return;
                }
                if since < self.commit_interval {
                    return;
                }
            }
            let due = progress.due();
            let Some(list) = offsets_list(&due) else { return };
            progress.last_sent = Some(now);
            progress.awaiting = true;
            progress.overdue = false;
            (list, due)
        };
        let (consumer, progress) = (self.consumer.clone(), self.progress.clone());
        let spawned = std::thread::Builder::new().name("outbox-kafka-commit".to_owned()).spawn(move || {
            let result = consumer.commit(&list, CommitMode::Sync);
            let mut progress = progress.lock().unwrap_or_else(PoisonError::into_inner);
            progress.awaiting = false;
            match result {
                Ok(()) => {
                    progress.stats.committed += 1;
                    progress.confirmed(&list);
                    tracing::trace!(messaging.system = "kafka", ?due, "offsets committed");
                }
                Err(error) => {
                    progress.stats.failed += 1;
                    tracing::warn!(messaging.system = "kafka", %error, ?due, "offset commit failed; the next one carries these offsets");
                }
            }
        });
        if let Err(error) = spawned {
            let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
            progress.awaiting = false;
            progress.stats.failed += 1;
            tracing::warn!(messaging.system = "kafka", %error, "offset commit not started (no thread); the next one carries its offsets");
        }
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

    /// Sends a commit when one is due ([`with_commit_interval`](KafkaTransport::with_commit_interval)), waits
    /// up to `wait` for the first message, then takes what librdkafka has ready, up to `max`.
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery<KafkaReceipt>>> {
        // Acks that came after the last commit go out here at the latest (a fetch also serves the commit
        // callbacks).
        self.commit_due();
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
        {
            let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
            match progress.partitions.get_mut(&(receipt.topic.clone(), receipt.partition)) {
                Some(state) if state.generation == receipt.generation => {
                    state.outstanding.remove(&receipt.offset);
                }
                _ => {
                    return Err(Error::broker(
                        BROKER,
                        format!("ack {}/{} offset {}", receipt.topic, receipt.partition, receipt.offset),
                        "the partition was revoked since (rebalance): its new owner redelivers the message from the last commit",
                    ));
                }
            }
        }
        self.commit_due();
        Ok(())
    }

    /// Commits the acked prefix of every partition that moved since the last confirmed commit and waits
    /// for the broker's answer, at most the commit timeout
    /// ([`with_commit_timeout`](KafkaTransport::with_commit_timeout)). On a timeout or a failure the
    /// messages after the last commit are delivered again after the restart (the inbox absorbs them).
    async fn flush(&self) -> Result<()> {
        let due = self.progress.lock().unwrap_or_else(PoisonError::into_inner).due();
        let Some(list) = offsets_list(&due) else { return Ok(()) };
        let what = || format!("final offset commit of {due:?}");
        // A thread of its own rather than the blocking pool: librdkafka may keep it until its own request
        // timeout, and a runtime shutting down waits for its blocking tasks.
        let (sender, answer) = tokio::sync::oneshot::channel();
        let consumer = self.consumer.clone();
        let committing = list.clone();
        std::thread::Builder::new()
            .name("outbox-kafka-commit".to_owned())
            .spawn(move || {
                let _ = sender.send(consumer.commit(&committing, CommitMode::Sync));
            })
            .map_err(|e| Error::broker(BROKER, what(), e))?;
        let outcome = tokio::time::timeout(self.commit_timeout, answer).await;
        let mut progress = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(Ok(Ok(()))) => {
                progress.stats.committed += 1;
                progress.confirmed(&list);
                tracing::debug!(messaging.system = "kafka", ?due, "final offsets committed");
                Ok(())
            }
            Ok(Ok(Err(error))) => {
                progress.stats.failed += 1;
                Err(Error::broker(BROKER, what(), error))
            }
            Ok(Err(_)) => {
                progress.stats.failed += 1;
                Err(Error::broker(BROKER, what(), "the commit thread ended without an answer"))
            }
            Err(_) => {
                progress.stats.timed_out += 1;
                Err(Error::broker(
                    BROKER,
                    what(),
                    format!("no answer within {:?} (commit_timeout)", self.commit_timeout),
                ))
            }
        }
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

    #[test]
    fn only_partitions_past_their_confirmed_commit_are_due_and_confirmations_never_go_back() {
        let mut progress = Progress::default();
        for (partition, offsets) in [(0, [3, 4]), (1, [10, 11])] {
            let state = progress.partition("t", partition);
            state.outstanding.extend(offsets);
            state.highest = offsets.iter().max().copied();
        }
        progress.partition("t", 0).outstanding.remove(&3);
        let mut due = progress.due();
        due.sort();
        assert_eq!(due, [("t".to_owned(), 0, 4), ("t".to_owned(), 1, 10)]);

        let mut list = TopicPartitionList::new();
        list.add_partition_offset("t", 0, Offset::Offset(4)).unwrap();
        progress.confirmed(&list);
        assert_eq!(progress.due(), [("t".to_owned(), 1, 10)], "partition 0 is confirmed at its point");
        let mut older = TopicPartitionList::new();
        older.add_partition_offset("t", 0, Offset::Offset(2)).unwrap();
        progress.confirmed(&older);
        assert_eq!(progress.partition("t", 0).committed, Some(4), "a late, older answer does not lower it");
        progress.partition("t", 0).outstanding.remove(&4);
        assert!(progress.due().contains(&("t".to_owned(), 0, 5)), "all acked: one past the highest");
    }
}

//! The dead letters of the subscribed topics: list, show, replay (back to the topic each was consumed
//! from) and discard them ([`DeadLetters`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use super::KafkaTransport;
use super::config::{BROKER, KafkaContext, REPLAY_GROUP_SUFFIX, create, shared, validate_topic};
use super::transport::rebuild_headers;
use crate::consume::{DeadFilter, DeadLetterAction, DeadLetterEntry, DeadLetterOutcome, DeadLetters, dead_header};
use crate::error::{Error, Result};

/// How long a replay waits for the next dead letter it knows is there.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

impl KafkaTransport {
    /// Produces `record` to `topic` (and `partition`, when given) with its key and payload, its dead-letter
    /// headers stripped when `strip` (a replay) and kept otherwise, and awaits the delivery report.
    async fn produce(
        &self,
        topic: &str,
        partition: Option<i32>,
        record: &DeadRecord,
        strip: bool,
    ) -> std::result::Result<(), rdkafka::error::KafkaError> {
        let headers = rebuild_headers(&record.headers, |k| strip && k.starts_with(dead_header::PREFIX), &[]);
        let mut message: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).payload(record.payload.as_slice()).headers(headers);
        if let Some(key) = &record.key {
            message = message.key(key.as_slice());
        }
        if let Some(partition) = partition {
            message = message.partition(partition);
        }
        self.producer.send(message, self.delivery_timeout).await.map(|_| ()).map_err(|(error, _)| error)
    }

    /// The replay group's reader and every dead letter past its commit, up to the end seen at the start.
    async fn read_dead_letters(&self) -> Result<(Arc<StreamConsumer<KafkaContext>>, Vec<DeadRecord>)> {
        let mut config = shared(&self.config);
        config
            .set("group.id", format!("{}{REPLAY_GROUP_SUFFIX}", self.group))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("client.id", "outbox-replay");
        let reader: Arc<StreamConsumer<KafkaContext>> = Arc::new(create(&config, "replay consumer")?);
        let topics: Vec<String> = self.subscription.topics().iter().map(|t| self.dead_letter_topic(t)).collect();
        let probe = reader.clone();
        let mut ends = tokio::task::spawn_blocking(move || pending_partitions(&probe, &topics))
            .await
            .map_err(|e| Error::broker(BROKER, "find dead letters", e))??;
        let mut records = Vec::new();
        if ends.is_empty() {
            return Ok((reader, records));
        }
        let mut list = TopicPartitionList::new();
        for (topic, partition) in ends.keys() {
            list.add_partition_offset(topic, *partition, Offset::Stored)
                .map_err(|e| Error::broker(BROKER, format!("assign {topic}/{partition}"), e))?;
        }
        reader.assign(&list).map_err(|e| Error::broker(BROKER, "assign the dead-letter topics", e))?;
        while !ends.is_empty() {
            let message = match tokio::time::timeout(READ_TIMEOUT, reader.recv()).await {
                Err(_) => {
                    // Offsets can have gaps (compaction, transaction markers): act on what was read.
                    tracing::warn!(
                        messaging.system = "kafka",
                        left = ends.len(),
                        "no dead letter within {READ_TIMEOUT:?}; going on with those read"
                    );
                    break;
                }
                Ok(Err(error)) => return Err(Error::broker(BROKER, "read dead letters", error)),
                Ok(Ok(message)) => message.detach(),
            };
            let (topic, partition, offset) = (message.topic().to_owned(), message.partition(), message.offset());
            let key = (topic.clone(), partition);
            let Some(&end) = ends.get(&key) else { continue };
            if offset + 1 >= end {
                ends.remove(&key);
            }
            if offset >= end {
                continue;
            }
            let headers: Vec<(String, Option<Vec<u8>>)> = message
                .headers()
                .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
                .unwrap_or_default();
            records.push(DeadRecord {
                topic,
                partition,
                offset,
                key: message.key().map(<[u8]>::to_vec),
                payload: message.payload().unwrap_or_default().to_vec(),
                headers,
            });
        }
        records.sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));
        Ok((reader, records))
    }
}

/// A record of a walk, its entry, and whether the filter selected it.
type Walked = (DeadRecord, DeadLetterEntry, bool);

/// One record of a dead-letter topic.
struct DeadRecord {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

/// The partitions of `topics` holding records past the replay group's commit, with their end offset.
/// Topics that do not exist (nothing was ever dead-lettered there) are left out.
fn pending_partitions(reader: &StreamConsumer<KafkaContext>, topics: &[String]) -> Result<HashMap<(String, i32), i64>> {
    let timeout = Duration::from_secs(10);
    let mut ends = HashMap::new();
    let mut list = TopicPartitionList::new();
    for topic in topics {
        let metadata = reader
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| Error::broker(BROKER, format!("read metadata of {topic:?}"), e))?;
        for found in metadata.topics() {
            if found.error().is_some() {
                continue;
            }
            for partition in found.partitions() {
                let (low, high) = reader
                    .fetch_watermarks(topic, partition.id(), timeout)
                    .map_err(|e| Error::broker(BROKER, format!("read the end of {topic}/{}", partition.id()), e))?;
                if high > low {
                    ends.insert((topic.clone(), partition.id()), (low, high));
                    list.add_partition(topic, partition.id());
                }
            }
        }
    }
    if ends.is_empty() {
        return Ok(HashMap::new());
    }
    let committed = reader
        .committed_offsets(list, timeout)
        .map_err(|e| Error::broker(BROKER, "read the replay group's offsets", e))?;
    let mut pending = HashMap::new();
    for element in committed.elements() {
        let key = (element.topic().to_owned(), element.partition());
        let Some(&(low, high)) = ends.get(&key) else { continue };
        let from = match element.offset() {
            Offset::Offset(offset) => offset.max(low),
            _ => low,
        };
        if from < high {
            pending.insert(key, high);
        }
    }
    Ok(pending)
}

/// [`DeadLetters::replay_dead_letters`] moves up to `max` dead letters back to their origin topic (the
/// `outbox_dead_origin` header) with their original key, payload and headers (dead-letter headers stripped), and
/// returns how many moved.
///
/// It reads the dead-letter topic of every subscribed topic as consumer group `<group>.replay`
/// ([`REPLAY_GROUP_SUFFIX`]), from that group's committed offset up to the end seen when it started;
/// each letter is produced to its origin and the replay group's offset is committed past it only after
/// the delivery report (per partition, once its letters are handled). Kafka never deletes a record:
/// "removed from the dead-letter topic" means past the replay group's commit; the record stays readable
/// by other groups until retention drops it. A letter without a valid origin is appended again to its
/// dead-letter topic (logged) and so stays. A broker failure is an `Err`; the partitions handled before
/// it stay handled, the letters of the one in hand are replayed again by the next replay (the inbox
/// absorbs the copies). The same walk, with a filter, is [`DeadLetters`].
impl DeadLetters for KafkaTransport {
    fn dead_letter_broker(&self) -> &'static str {
        BROKER
    }

    fn dead_letter_location(&self) -> String {
        let topics: Vec<String> = self.subscription.topics().iter().map(|t| self.dead_letter_topic(t)).collect();
        format!("topics {topics:?} past the commit of group {:?}", format!("{}{REPLAY_GROUP_SUFFIX}", self.group))
    }

    /// The [`DeadLetters`] walk. Kafka cannot delete one record, so a letter leaves the dead-letter topic
    /// when the replay group `<group>.replay` commits past it: the records past the group's commit are read
    /// (up to the end seen at the start), then, per partition, every record up to the last selected one is
    /// handled in order: a selected one is replayed (produced to its origin, delivery report awaited) or
    /// discarded; one not selected (or that cannot be replayed) is appended again to the end of its
    /// dead-letter topic (delivery report awaited) so that it stays; only then is the commit moved past
    /// them. Such a kept letter gets a new offset, hence a new id. A failure before the commit leaves every
    /// record where it was (a letter replayed already is replayed again by the next walk, and the inbox
    /// absorbs it; a kept one appended already is then there twice).
    async fn dead_letters(
        &self,
        filter: &DeadFilter,
        action: DeadLetterAction,
        max: usize,
    ) -> Result<DeadLetterOutcome> {
        let now = chrono::Utc::now();
        let content = action == DeadLetterAction::Show;
        let (reader, records) = self.read_dead_letters().await?;
        let mut outcome = DeadLetterOutcome::default();
        let mut selected = 0usize;
        // Per partition, in offset order: (record, entry, selected).
        let mut partitions: BTreeMap<(String, i32), Vec<Walked>> = BTreeMap::new();
        for record in records {
            let text: BTreeMap<String, String> = record
                .headers
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.clone()?).ok()?)))
                .collect();
            let id = format!("{}/{}/{}", record.topic, record.partition, record.offset);
            let entry = DeadLetterEntry::from_headers(id, &text, &record.payload, content);
            let chosen = selected < max && filter.matches(&entry, now);
            if chosen {
                selected += 1;
            }
            partitions.entry((record.topic.clone(), record.partition)).or_default().push((record, entry, chosen));
        }
        if matches!(action, DeadLetterAction::List | DeadLetterAction::Show) {
            outcome.letters =
                partitions.into_values().flatten().filter(|(_, _, chosen)| *chosen).map(|(_, e, _)| e).collect();
            return Ok(outcome);
        }
        for ((topic, partition), mut records) in partitions {
            let Some(last) = records.iter().rposition(|(_, _, chosen)| *chosen) else { continue };
            records.truncate(last + 1);
            let offset = records[last].0.offset + 1;
            let mut done = Vec::new();
            for (record, entry, chosen) in records {
                let what = format!("dead letter {} (after handling {})", entry.id, outcome.letters.len() + done.len());
                let replayed = chosen && action == DeadLetterAction::Replay;
                let origin = entry.origin.clone().filter(|o| validate_topic(o).is_ok());
                match (chosen, replayed, origin) {
                    (true, true, Some(origin)) => {
                        self.produce(&origin, None, &record, true)
                            .await
                            .map_err(|e| Error::broker(BROKER, format!("replay {what} to {origin:?}"), e))?;
                        done.push(entry);
                    }
                    (true, false, _) => done.push(entry),
                    (chosen, _, _) => {
                        if chosen {
                            outcome.kept += 1;
                            tracing::warn!(messaging.system = "kafka", dead_letter = %entry.id, "dead letter has no valid origin topic; kept (appended again to its dead-letter topic)");
                        }
                        self.produce(&topic, Some(partition), &record, false).await.map_err(|e| {
                            Error::broker(BROKER, format!("keep {what}: append it again to {topic:?}"), e)
                        })?;
                    }
                }
            }
            let mut past = TopicPartitionList::new();
            past.add_partition_offset(&topic, partition, Offset::Offset(offset))
                .map_err(|e| Error::broker(BROKER, format!("commit {topic}/{partition}"), e))?;
            let committer = reader.clone();
            tokio::task::spawn_blocking(move || committer.commit(&past, CommitMode::Sync))
                .await
                .map_err(|e| Error::broker(BROKER, format!("commit {topic}/{partition} up to offset {offset}"), e))?
                .map_err(|e| Error::broker(BROKER, format!("commit {topic}/{partition} up to offset {offset}"), e))?;
            outcome.letters.extend(done);
        }
        tracing::info!(
            messaging.system = "kafka",
            done = outcome.letters.len(),
            kept = outcome.kept,
            ?action,
            "dead letters handled"
        );
        Ok(outcome)
    }

    /// [`Transport::lag`](crate::consume::Transport::lag).
    async fn consumer_lag(&self) -> Result<Option<crate::consume::Lag>> {
        crate::consume::Transport::lag(self).await
    }
}

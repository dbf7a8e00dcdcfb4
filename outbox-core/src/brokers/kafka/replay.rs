//! [`KafkaTransport::replay_dead_letters`]: dead letters back to the topic they were consumed from.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use super::KafkaTransport;
use super::config::{BROKER, KafkaContext, REPLAY_GROUP_SUFFIX, create, shared, validate_topic};
use super::transport::rebuild_headers;
use crate::consume::{dead_header, replayable};
use crate::error::{Error, Result};
use crate::text::one_line;

/// How long a replay waits for the next dead letter it knows is there.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

impl KafkaTransport {
    /// Moves up to `max` dead letters back to their origin topic (the `outbox_dead_origin` header) with
    /// their original key, payload and headers (dead-letter headers stripped), and returns how many moved.
    ///
    /// It reads the dead-letter topic of every subscribed topic as consumer group `<group>.replay`
    /// ([`REPLAY_GROUP_SUFFIX`]), from that group's committed offset up to the end seen when it started;
    /// each letter is produced to its origin and the replay group's offset is committed past it only after
    /// the delivery report. Kafka never deletes a record: "removed from the dead-letter topic" means past
    /// the replay group's commit; the record stays readable by other groups until retention drops it. A
    /// letter without a valid origin is skipped (committed past, logged). A broker failure is an `Err`;
    /// the letters moved before it stay moved, the one in hand is moved by the next replay.
    pub async fn replay_dead_letters(&self, max: usize) -> Result<u64> {
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
            .map_err(|e| Error::broker(BROKER, "find dead letters to replay", e))??;
        if ends.is_empty() {
            return Ok(0);
        }
        let mut list = TopicPartitionList::new();
        for (topic, partition) in ends.keys() {
            list.add_partition_offset(topic, *partition, Offset::Stored)
                .map_err(|e| Error::broker(BROKER, format!("assign {topic}/{partition}"), e))?;
        }
        reader.assign(&list).map_err(|e| Error::broker(BROKER, "assign the dead-letter topics", e))?;
        let mut moved = 0u64;
        let mut skipped = 0u64;
        while usize::try_from(moved).unwrap_or(usize::MAX) < max && !ends.is_empty() {
            let message = match tokio::time::timeout(READ_TIMEOUT, reader.recv()).await {
                Err(_) => {
                    tracing::warn!(
                        messaging.system = "kafka",
                        left = ends.len(),
                        "replay: no dead letter within {READ_TIMEOUT:?}; stopping"
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
            let raw: Vec<(String, Option<Vec<u8>>)> = message
                .headers()
                .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
                .unwrap_or_default();
            let text = raw.iter().filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.clone()?).ok()?))).collect();
            match replayable(&text).filter(|r| validate_topic(&r.origin).is_ok()) {
                Some(letter) => {
                    let headers = rebuild_headers(&raw, |k| k.starts_with(dead_header::PREFIX), &[]);
                    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&letter.origin)
                        .payload(message.payload().unwrap_or_default())
                        .headers(headers);
                    if let Some(k) = message.key() {
                        record = record.key(k);
                    }
                    self.producer.send(record, self.delivery_timeout).await.map_err(|(error, _)| {
                        Error::broker(
                            BROKER,
                            format!("replay {topic}/{partition} offset {offset} to {:?}", letter.origin),
                            error,
                        )
                    })?;
                    moved += 1;
                }
                None => {
                    skipped += 1;
                    tracing::warn!(
                        messaging.system = "kafka",
                        dead_letter_topic = %topic,
                        partition,
                        offset,
                        origin = ?text.get(dead_header::ORIGIN).map(|o| one_line(o)),
                        "dead letter has no valid origin topic; skipped (it stays in the topic)"
                    );
                }
            }
            let mut done = TopicPartitionList::new();
            done.add_partition_offset(&topic, partition, Offset::Offset(offset + 1))
                .map_err(|e| Error::broker(BROKER, format!("commit {topic}/{partition}"), e))?;
            let committer = reader.clone();
            tokio::task::spawn_blocking(move || committer.commit(&done, CommitMode::Sync))
                .await
                .map_err(|e| Error::broker(BROKER, format!("commit {topic}/{partition} past {offset}"), e))?
                .map_err(|e| Error::broker(BROKER, format!("commit {topic}/{partition} past {offset}"), e))?;
        }
        tracing::info!(messaging.system = "kafka", moved, skipped, "dead letters replayed");
        Ok(moved)
    }
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

impl crate::consume::ReplayDeadLetters for KafkaTransport {
    async fn replay_dead_letters(&self, max: usize) -> Result<u64> {
        KafkaTransport::replay_dead_letters(self, max).await
    }
}

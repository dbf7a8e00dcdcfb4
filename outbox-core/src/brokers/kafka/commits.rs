//! The offset commits of [`KafkaTransport`](super::KafkaTransport): per assigned partition, the offsets
//! handed to the driver and not acked yet; the contiguous acked prefix is committed in the background, at
//! most once per commit interval, and once more, waited for, at shutdown. A revoked partition's progress
//! is dropped (its new owner starts from the last commit).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::config::{BROKER, log};
use crate::error::{Error, Result};

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

/// What the commits did so far, for [`KafkaTransport::commit_stats`](super::KafkaTransport::commit_stats).
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
pub(super) struct TransportContext {
    progress: Arc<Mutex<Progress>>,
}

impl TransportContext {
    pub(super) fn new() -> Self {
        TransportContext { progress: Arc::default() }
    }
}

impl ClientContext for TransportContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        log(level, fac, log_message);
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

/// The commit side of a transport: the progress its consumer context shares, and the commits.
pub(super) struct Commits {
    consumer: Arc<StreamConsumer<TransportContext>>,
    progress: Arc<Mutex<Progress>>,
    /// At most one background commit per interval.
    pub(super) interval: Duration,
    /// How long a commit may go unanswered (and the final commit may take).
    pub(super) timeout: Duration,
}

impl Commits {
    /// The commits of `consumer`, sharing its context's progress.
    pub(super) fn new(consumer: Arc<StreamConsumer<TransportContext>>, interval: Duration, timeout: Duration) -> Self {
        let progress = consumer.context().progress.clone();
        Commits { consumer, progress, interval, timeout }
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the commits did so far.
    pub(super) fn stats(&self) -> KafkaCommitStats {
        self.lock().stats
    }

    /// Records `offset` of `topic`/`partition` as handed to the driver; returns the partition's
    /// assignment generation, which its ack must match.
    pub(super) fn handed_out(&self, topic: &str, partition: i32, offset: i64) -> u64 {
        let mut progress = self.lock();
        let state = progress.partition(topic, partition);
        state.outstanding.insert(offset);
        state.highest = Some(state.highest.map_or(offset, |h| h.max(offset)));
        state.generation
    }

    /// Marks `offset` done; `false` when its partition was revoked since it was handed out (its
    /// generation is gone).
    pub(super) fn acked(&self, topic: &str, partition: i32, offset: i64, generation: u64) -> bool {
        match self.lock().partitions.get_mut(&(topic.to_owned(), partition)) {
            Some(state) if state.generation == generation => {
                state.outstanding.remove(&offset);
                true
            }
            _ => false,
        }
    }

    /// Starts a commit of the acked prefix of every partition that moved, unless one went out less than
    /// the commit interval ago or one is still unanswered. Never waits for the broker: the commit runs on a
    /// thread of its own (a synchronous librdkafka commit, so its outcome is known: librdkafka does not
    /// report asynchronous ones to this client), which records the outcome. An unanswered commit is counted
    /// as timed out after the commit timeout; librdkafka ends it after `socket.timeout.ms` (60 s by
    /// default), and the next commit carries the offsets it had, and later ones.
    pub(super) fn commit_due(&self) {
        let (list, due) = {
            let mut progress = self.lock();
            let now = Instant::now();
            if let Some(sent) = progress.last_sent {
                let since = now.saturating_duration_since(sent);
                if progress.awaiting {
                    if since >= self.timeout && !progress.overdue {
                        progress.overdue = true;
                        progress.stats.timed_out += 1;
                        tracing::warn!(
                            messaging.system = "kafka",
                            timeout = ?self.timeout,
                            "offset commit unanswered; consuming goes on, and the next commit carries its offsets"
                        );
                    }
                    return;
                }
                if since < self.interval {
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
            let mut progress = self.lock();
            progress.awaiting = false;
            progress.stats.failed += 1;
            tracing::warn!(messaging.system = "kafka", %error, "offset commit not started (no thread); the next one carries its offsets");
        }
    }

    /// Commits the acked prefix of every partition that moved since the last confirmed commit and waits
    /// for the broker's answer, at most the commit timeout.
    pub(super) async fn flush(&self) -> Result<()> {
        let due = self.lock().due();
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
        let outcome = tokio::time::timeout(self.timeout, answer).await;
        let mut progress = self.lock();
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
                Err(Error::broker(BROKER, what(), format!("no answer within {:?} (commit_timeout)", self.timeout)))
            }
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

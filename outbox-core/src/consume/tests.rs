//! The driver's logic against an in-memory transport (each broker runs the contract suite for real).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::*;
use crate::broker::envelope_headers;
use crate::envelope::{EventId, OutboxEvent};
use crate::error::Error;

mod batches;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Tick {
    item: String,
    n: u64,
}

impl DomainEvent for Tick {
    const NAME: &'static str = "tick";
    const VERSION: i32 = 2;
    const OLDEST_VERSION: i32 = 2;
    const AGGREGATE_TYPE: &'static str = "item";
    const SCHEMA: crate::event::EventSchema =
        crate::event::EventSchema { name: "tick", version: 2, type_name: "Tick", fields: &[], upcast_from: &[] };

    fn aggregate_id(&self) -> String {
        self.item.clone()
    }

    fn decode_version(_: i32, payload: &str) -> std::result::Result<Self, serde_json::Error> {
        serde_json::from_str(payload)
    }
}

/// Headers and payload of one queued message.
type Raw = (BTreeMap<String, String>, Vec<u8>);

fn message(event_type: &str, version: i32, item: &str, n: u64) -> Raw {
    let event = OutboxEvent {
        seq: 1,
        aggregate_version: n as i64 + 1,
        id: EventId::new(),
        aggregate_type: "item".into(),
        aggregate_id: item.into(),
        event_type: event_type.into(),
        schema_version: version,
        payload: format!(r#"{{"item":"{item}","n":{n}}}"#),
        headers: Default::default(),
        created_at: chrono::Utc::now(),
        attempts: 0,
        last_error: None,
    };
    (envelope_headers(&event).into_iter().collect(), event.payload.into_bytes())
}

/// Messages in a queue; acks, releases and dead letters recorded; `dead_letter` can be made to fail.
#[derive(Default)]
struct Memory {
    queue: Mutex<VecDeque<Raw>>,
    acked: Mutex<Vec<u64>>,
    released: Mutex<Vec<u64>>,
    dead: Mutex<Vec<(u64, DeadLetter)>>,
    dead_letter_failures: Mutex<u32>,
    ack_failures: Mutex<u32>,
    next: Mutex<u64>,
}

impl Memory {
    fn with(messages: Vec<Raw>) -> Self {
        Memory { queue: Mutex::new(messages.into()), ..Memory::default() }
    }
}

impl Transport for Memory {
    type Receipt = u64;

    fn broker(&self) -> &'static str {
        "memory"
    }

    fn source(&self) -> String {
        "queue".into()
    }

    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery<u64>>> {
        let batch: Vec<_> = {
            let mut queue = self.queue.lock().unwrap();
            let n = max.min(queue.len());
            queue.drain(..n).collect()
        };
        if batch.is_empty() {
            tokio::time::sleep(wait).await;
        }
        Ok(batch
            .into_iter()
            .map(|(headers, payload)| {
                let mut next = self.next.lock().unwrap();
                *next += 1;
                Delivery { headers, payload, origin: "queue".into(), deliveries: 1, receipt: *next }
            })
            .collect())
    }

    async fn ack(&self, receipt: &u64) -> Result<()> {
        let mut failures = self.ack_failures.lock().unwrap();
        if *failures > 0 {
            *failures -= 1;
            return Err(Error::broker("memory", "ack", "connection reset"));
        }
        self.acked.lock().unwrap().push(*receipt);
        Ok(())
    }

    async fn release(&self, receipt: &u64) -> Result<()> {
        self.released.lock().unwrap().push(*receipt);
        Ok(())
    }

    async fn dead_letter(&self, delivery: &Delivery<u64>, letter: &DeadLetter) -> Result<()> {
        let mut failures = self.dead_letter_failures.lock().unwrap();
        if *failures > 0 {
            *failures -= 1;
            return Err(Error::broker("memory", "dead-letter", "refused"));
        }
        self.dead.lock().unwrap().push((delivery.receipt, letter.clone()));
        Ok(())
    }
}

fn fast() -> ConsumerConfig {
    ConsumerConfig::default()
        .with_backoff(crate::Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(5),
            multiplier: 2,
        })
        .with_fetch_wait(Duration::from_millis(20))
        .with_max_deliveries(3)
}

/// Runs `consumer` until `done` holds (or 30 s pass, which fails the test), then shuts it down.
/// Tests wait for a state, never for a fixed time, so a loaded machine cannot fail them.
async fn run_until(consumer: &Consumer, transport: &Memory, done: impl Fn(&ConsumerStats) -> bool) {
    let shutdown = crate::CancellationToken::new();
    let run = consumer.run(transport, shutdown.clone());
    let watch = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done(&consumer.stats()) {
            assert!(tokio::time::Instant::now() < deadline, "not reached in 30 s: {:?}", consumer.stats());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
    };
    let (ran, ()) = tokio::join!(run, watch);
    ran.unwrap();
}

#[tokio::test]
async fn every_outcome_acks_only_after_apply_skip_or_confirmed_dead_letter() {
    let applied = std::sync::Arc::new(Mutex::new(Vec::new()));
    let seen = applied.clone();
    let consumer = Consumer::new("c").with_config(fast()).on::<Tick>(move |r: Received<Tick>| {
        let seen = seen.clone();
        async move {
            if r.event.n == 7 {
                return Err("always fails".to_owned());
            }
            seen.lock().unwrap().push((r.event.item.clone(), r.event.n));
            Ok(())
        }
    });
    let transport = Memory::with(vec![
        message("tick", 2, "a", 0),
        message("tick", 2, "a", 7),          // fails 3 times: dead letter
        message("tick", 2, "a", 1),          // waits behind it, then applied
        message("other", 1, "b", 0),         // skipped
        message("tick", 3, "c", 0),          // newer: held, released at shutdown
        (BTreeMap::new(), b"junk".to_vec()), // poison
    ]);
    *transport.dead_letter_failures.lock().unwrap() = 2; // the first two dead-letter publishes fail
    run_until(&consumer, &transport, |s| {
        s.processed == 2 && s.skipped == 1 && s.dead_lettered == 2 && s.newer_version >= 2
    })
    .await;
    let stats = consumer.stats();
    assert_eq!(applied.lock().unwrap().clone(), vec![("a".to_owned(), 0), ("a".to_owned(), 1)]);
    assert_eq!(stats.processed, 2, "{stats:?}");
    assert_eq!(stats.skipped, 1, "{stats:?}");
    assert_eq!(stats.dead_lettered, 2, "{stats:?}");
    assert_eq!(stats.retried, 2, "{stats:?}");
    assert!(stats.newer_version >= 2, "{stats:?}");
    assert_eq!(stats.released, 1, "the newer message is handed back, not acked: {stats:?}");
    let acked = transport.acked.lock().unwrap().clone();
    assert_eq!(acked.len(), 5, "{acked:?}");
    let released = transport.released.lock().unwrap().clone();
    assert_eq!(released, vec![5]);
    assert!(!acked.contains(&5));
    let dead = transport.dead.lock().unwrap().clone();
    assert_eq!(dead.len(), 2);
    let (receipt, letter) = dead.iter().find(|(r, _)| *r == 2).unwrap();
    assert_eq!((*receipt, letter.attempts, letter.reason.as_str()), (2, 3, "always fails"));
    assert!(dead.iter().any(|(r, l)| *r == 6 && l.reason.contains("ce_id")));
}

#[tokio::test]
async fn a_panicking_handler_is_retried_then_dead_lettered_and_the_consumer_goes_on() {
    let consumer = Consumer::new("c").with_config(fast()).on::<Tick>(|r: Received<Tick>| async move {
        assert!(r.event.n != 1, "bug");
        Ok::<_, std::io::Error>(())
    });
    let transport = Memory::with(vec![message("tick", 2, "a", 1), message("tick", 2, "b", 2)]);
    run_until(&consumer, &transport, |s| s.processed == 1 && s.dead_lettered == 1).await;
    let stats = consumer.stats();
    assert_eq!((stats.processed, stats.dead_lettered, stats.retried), (1, 1, 2), "{stats:?}");
    assert!(transport.dead.lock().unwrap()[0].1.reason.contains("panicked: bug"));
}

#[tokio::test]
async fn bad_settings_are_typed_errors_before_anything_is_fetched() {
    // The builder keeps its chain; `run` checks the name and the settings before its first fetch.
    let transport = Memory::with(vec![message(Tick::NAME, 1, "a", 1)]);
    for name in ["", "a\nb", &"x".repeat(129)] {
        let err = Consumer::new(name).run(&transport, crate::CancellationToken::new()).await.unwrap_err();
        assert!(matches!(&err, Error::InvalidConfig { field: "consumer", .. }), "{name:?}: {err}");
    }
    for (config, field) in [
        (ConsumerConfig::default().with_max_deliveries(0), "max_deliveries"),
        (ConsumerConfig::default().with_batch_size(0), "batch_size"),
        (ConsumerConfig::default().with_handler_timeout(Duration::ZERO), "handler_timeout"),
        (ConsumerConfig::default().with_group_size(0), "group_size"),
        (ConsumerConfig::default().with_lag_interval(Duration::ZERO), "lag_interval"),
    ] {
        let consumer = Consumer::new("c").with_config(config);
        let err = consumer.run(&transport, crate::CancellationToken::new()).await.unwrap_err();
        assert!(matches!(&err, Error::InvalidConfig { field: f, .. } if *f == field), "{field}: {err}");
    }
    assert_eq!(transport.queue.lock().unwrap().len(), 1, "nothing fetched");
}

#[tokio::test]
async fn malformed_messages_are_dead_lettered_with_a_reason_never_a_panic() {
    let consumer = Consumer::new("c")
        .with_config(fast().with_max_deliveries(10))
        .on::<Tick>(|_: Received<Tick>| async { Ok::<_, std::io::Error>(()) });
    let with = |name: &str, value: &str| {
        let (mut headers, payload) = message("tick", 2, "a", 1);
        headers.insert(name.to_owned(), value.to_owned());
        (headers, payload)
    };
    let mut oversized = message("tick", 2, "big", 1);
    oversized.1 = vec![b' '; crate::envelope::DEFAULT_MAX_PAYLOAD_BYTES + 1];
    let mut undecodable = message("tick", 2, "u", 1);
    undecodable.1 = br#"{"item":"u"}"#.to_vec();
    let transport = Memory::with(vec![
        (BTreeMap::new(), b"{}".to_vec()),
        with("ce_time", "not a time"),
        with("ce_id", "not-a-uuid"),
        with("traceparent", "line\nbreak"),
        oversized,
        undecodable,
        message("tick", 1, "old", 1), // older than any upcaster
        message("tick", 2, "fine", 1),
    ]);
    run_until(&consumer, &transport, |s| s.dead_lettered == 7 && s.processed == 1).await;
    let stats = consumer.stats();
    assert_eq!((stats.dead_lettered, stats.processed, stats.retried), (7, 1, 0), "{stats:?}");
    let reasons: Vec<String> = transport.dead.lock().unwrap().iter().map(|(_, l)| l.reason.clone()).collect();
    for expected in [
        "`ce_id`",
        "`ce_time`",
        "is not a UUID",
        "control characters",
        "max_payload_bytes",
        "missing field `n`",
        "versions 2 to 2",
    ] {
        assert!(reasons.iter().any(|r| r.contains(expected)), "no reason mentions {expected:?}: {reasons:#?}");
    }
    assert!(reasons.iter().all(|r| !r.contains('\n')), "control characters escaped: {reasons:#?}");
}

#[tokio::test]
async fn a_failed_ack_is_tried_again_before_the_message_is_left_to_redelivery() {
    let consumer =
        Consumer::new("c").with_config(fast()).on::<Tick>(|_: Received<Tick>| async { Ok::<_, std::io::Error>(()) });
    let transport = Memory::with(vec![message("tick", 2, "a", 1), message("tick", 2, "b", 1)]);
    *transport.ack_failures.lock().unwrap() = 2; // the first message's first two acks fail
    // Wait for the acks themselves: a shutdown during the retry pause would end the retries early.
    run_until(&consumer, &transport, |_| transport.acked.lock().unwrap().len() == 2).await;
    assert_eq!(transport.acked.lock().unwrap().len(), 2);
    assert_eq!(consumer.stats().ack_failures, 0, "{:?}", consumer.stats());
    *transport.ack_failures.lock().unwrap() = 5;
    transport.queue.lock().unwrap().push_back(message("tick", 2, "c", 1));
    run_until(&consumer, &transport, |s| s.ack_failures == 1).await;
    assert_eq!(consumer.stats().ack_failures, 1, "three attempts, then left to the broker: {:?}", consumer.stats());
}

#[tokio::test]
async fn a_hung_handler_is_abandoned_after_its_timeout_and_the_message_retried() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = calls.clone();
    let config = fast().with_handler_timeout(Duration::from_millis(50));
    let consumer = Consumer::new("c").with_config(config).on::<Tick>(move |_: Received<Tick>| {
        let first = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        async move {
            if first {
                std::future::pending::<()>().await; // hangs for ever
            }
            Ok::<_, std::io::Error>(())
        }
    });
    let transport = Memory::with(vec![message("tick", 2, "a", 1)]);
    run_until(&consumer, &transport, |stats| stats.processed == 1).await;
    let stats = consumer.stats();
    assert_eq!((stats.timed_out, stats.retried, stats.processed), (1, 1, 1), "{stats:?}");
    assert_eq!(transport.acked.lock().unwrap().len(), 1, "acked once, after the second call applied it");
}

#[tokio::test]
async fn shutdown_ends_while_a_handler_hangs() {
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let notify = started.clone();
    let config = fast().with_handler_timeout(Duration::from_millis(100)).with_max_deliveries(1000);
    let consumer = Consumer::new("c").with_config(config).on::<Tick>(move |_: Received<Tick>| {
        notify.notify_one();
        async {
            std::future::pending::<()>().await;
            Ok::<_, std::io::Error>(())
        }
    });
    let transport = Memory::with(vec![message("tick", 2, "a", 1)]);
    let shutdown = crate::CancellationToken::new();
    let run = consumer.run(&transport, shutdown.clone());
    let stop = async {
        started.notified().await;
        shutdown.cancel();
    };
    // Without a handler timeout this would wait for the hung handler for ever.
    let (ran, ()) = tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(run, stop) })
        .await
        .expect("shutdown finished although the handler never returns");
    ran.unwrap();
    let stats = consumer.stats();
    assert_eq!((stats.processed, stats.released), (0, 1), "handed back to the broker for redelivery: {stats:?}");
    assert!(stats.timed_out >= 1, "{stats:?}");
}

tokio::task_local! {
    /// What the handlers of the running group wrote, applied only when the group commits.
    static STAGED: std::cell::RefCell<Vec<(String, u64)>>;
}

/// A group commit over an in-memory "database": writes made inside a group are staged and become applied
/// on commit, dropped on rollback; outside a group they apply at once.
#[derive(Clone, Default)]
struct StagedDb {
    applied: std::sync::Arc<Mutex<Vec<(String, u64)>>>,
    commits: std::sync::Arc<Mutex<Vec<usize>>>,
    /// The keys each committed group was given.
    keys: std::sync::Arc<Mutex<Vec<GroupKeys>>>,
    rollbacks: std::sync::Arc<Mutex<u32>>,
}

impl StagedDb {
    fn write(&self, item: &str, n: u64) {
        let staged = STAGED.try_with(|s| s.borrow_mut().push((item.to_owned(), n)));
        if staged.is_err() {
            self.applied.lock().unwrap().push((item.to_owned(), n));
        }
    }

    fn applied(&self) -> Vec<(String, u64)> {
        self.applied.lock().unwrap().clone()
    }
}

impl GroupCommit for StagedDb {
    fn run<'a>(&'a self, keys: &'a GroupKeys, calls: GroupCalls<'a>) -> GroupOutcome<'a> {
        Box::pin(async move {
            let (commit, staged) = STAGED
                .scope(std::cell::RefCell::new(Vec::new()), async {
                    let commit = calls.await;
                    (commit, STAGED.with(|s| s.take()))
                })
                .await;
            if commit {
                self.commits.lock().unwrap().push(staged.len());
                self.keys.lock().unwrap().push(keys.clone());
                self.applied.lock().unwrap().extend(staged);
            } else {
                *self.rollbacks.lock().unwrap() += 1;
            }
            Ok(commit)
        })
    }
}

/// Each item's `n` in the order applied, and no `(item, n)` twice.
fn assert_once_in_order(applied: &[(String, u64)], items: usize, per_item: u64) {
    assert_eq!(applied.len(), items * per_item as usize, "{applied:?}");
    for i in 0..items {
        let item = format!("i{i}");
        let ns: Vec<u64> = applied.iter().filter(|(it, _)| *it == item).map(|(_, n)| *n).collect();
        assert_eq!(ns, (0..per_item).collect::<Vec<_>>(), "aggregate {item}");
    }
}

fn ticks(items: usize, per_item: u64) -> Vec<Raw> {
    (0..per_item).flat_map(|n| (0..items).map(move |i| message("tick", 2, &format!("i{i}"), n))).collect()
}

#[tokio::test]
async fn a_group_applies_many_messages_in_one_commit_in_order_and_acks_after_it() {
    let db = StagedDb::default();
    let writes = db.clone();
    let consumer = Consumer::new("c")
        .with_config(fast().with_batch_size(64).with_group_size(32))
        .with_group_commit(db.clone())
        .on::<Tick>(move |r: Received<Tick>| {
            writes.write(&r.event.item, r.event.n);
            async { Ok::<_, std::io::Error>(()) }
        });
    let transport = Memory::with(ticks(5, 40));
    run_until(&consumer, &transport, |s| s.processed == 200).await;
    let stats = consumer.stats();
    assert_once_in_order(&db.applied(), 5, 40);
    let commits = db.commits.lock().unwrap().clone();
    assert_eq!(commits.iter().sum::<usize>(), 200, "every message applied inside a group: {commits:?}");
    assert!(commits.iter().any(|&n| n > 1), "groups of more than one message: {commits:?}");
    assert!(commits.iter().all(|&n| n <= 32), "no group above group_size: {commits:?}");
    assert_eq!(stats.groups, commits.len() as u64, "{stats:?}");
    assert_eq!(transport.acked.lock().unwrap().len(), 200);
    // Each group named its messages' inbox keys (the event ids), for a group commit to record ahead.
    let keys = db.keys.lock().unwrap().clone();
    assert!(keys.iter().all(|k| k.consumer == "c"), "{keys:?}");
    let sizes: Vec<usize> = keys.iter().map(|k| k.message_ids.len()).collect();
    assert_eq!(sizes, commits, "one key per message of each group");
    let mut ids: Vec<&String> = keys.iter().flat_map(|k| &k.message_ids).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 200, "every message's own id");
    assert!(ids.iter().all(|id| id.parse::<EventId>().is_ok_and(|e| e.to_string() == **id)));
}

#[tokio::test]
async fn a_failing_handler_rolls_its_group_back_and_every_message_then_applies_once_alone_in_order() {
    let db = StagedDb::default();
    let writes = db.clone();
    let consumer = Consumer::new("c")
        .with_config(fast().with_batch_size(64).with_group_size(16).with_max_deliveries(5))
        .with_group_commit(db.clone())
        .on::<Tick>(move |r: Received<Tick>| {
            // Fails on the first delivery of every 7th event: the writes of its group's neighbours, made
            // before it, must not stay (they apply again, alone).
            let fail = r.event.n % 7 == 3 && r.delivery == 1;
            if !fail {
                writes.write(&r.event.item, r.event.n);
            }
            async move { if fail { Err("injected".to_owned()) } else { Ok(()) } }
        });
    let transport = Memory::with(ticks(4, 30));
    run_until(&consumer, &transport, |s| s.processed == 120).await;
    let stats = consumer.stats();
    assert_once_in_order(&db.applied(), 4, 30);
    assert!(*db.rollbacks.lock().unwrap() >= 1, "{stats:?}");
    assert_eq!(stats.group_rollbacks, u64::from(*db.rollbacks.lock().unwrap()), "{stats:?}");
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
    assert_eq!(transport.acked.lock().unwrap().len(), 120);
}

#[tokio::test]
async fn poison_and_unknown_messages_in_a_group_do_not_roll_it_back() {
    let db = StagedDb::default();
    let writes = db.clone();
    let consumer =
        Consumer::new("c").with_config(fast()).with_group_commit(db.clone()).on::<Tick>(move |r: Received<Tick>| {
            writes.write(&r.event.item, r.event.n);
            async { Ok::<_, std::io::Error>(()) }
        });
    let mut messages = ticks(3, 2);
    messages.insert(2, (BTreeMap::new(), b"junk".to_vec()));
    messages.insert(4, message("other", 1, "i1", 9));
    let transport = Memory::with(messages);
    run_until(&consumer, &transport, |s| s.processed == 6 && s.dead_lettered == 1 && s.skipped == 1).await;
    assert_once_in_order(&db.applied(), 3, 2);
    assert_eq!(*db.rollbacks.lock().unwrap(), 0);
    assert_eq!(transport.acked.lock().unwrap().len(), 8);
}

/// A [`StagedDb`] whose first group waits at a gate before it commits.
#[derive(Clone, Default)]
struct GatedDb {
    db: StagedDb,
    gate: std::sync::Arc<tokio::sync::Notify>,
    first: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl GroupCommit for GatedDb {
    fn run<'a>(&'a self, keys: &'a GroupKeys, calls: GroupCalls<'a>) -> GroupOutcome<'a> {
        Box::pin(async move {
            if !self.first.swap(true, std::sync::atomic::Ordering::SeqCst) {
                self.gate.notified().await;
            }
            self.db.run(keys, calls).await
        })
    }
}

/// 40 messages of 40 lanes, one per fetch, through a consumer in groups of up to `group_size` whose first
/// group is held at the gate until `open_when` holds; every message applied once, in order.
async fn run_gated(group_size: usize, open_when: impl Fn(&Memory, &ConsumerStats) -> bool) -> GatedDb {
    let gated = GatedDb::default();
    let writes = gated.db.clone();
    let consumer = Consumer::new("c")
        // One message per fetch: a group dispatched on every arrival would hold one message.
        .with_config(fast().with_batch_size(1).with_group_size(group_size))
        .with_group_commit(gated.clone())
        .on::<Tick>(move |r: Received<Tick>| {
            writes.write(&r.event.item, r.event.n);
            async { Ok::<_, std::io::Error>(()) }
        });
    let transport = Memory::with(ticks(40, 1));
    let shutdown = crate::CancellationToken::new();
    let run = consumer.run(&transport, shutdown.clone());
    let watch = async {
        while !open_when(&transport, &consumer.stats()) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        gated.gate.notify_one();
        while consumer.stats().processed < 40 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
    };
    let (ran, ()) =
        tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(run, watch) }).await.unwrap_or_else(|_| {
            panic!("not drained in 30 s (did the other lanes wait for the held group?): {:?}", consumer.stats())
        });
    ran.unwrap();
    assert_once_in_order(&gated.db.applied(), 40, 1);
    gated
}

#[tokio::test]
async fn messages_that_arrive_while_a_group_commits_fill_the_next_groups() {
    // The first group (the first message) is held until every other message was fetched meanwhile.
    let gated = run_gated(8, |transport, _| transport.queue.lock().unwrap().is_empty()).await;
    let commits = gated.db.commits.lock().unwrap().clone();
    let alone = commits.iter().filter(|&&n| n == 1).count();
    assert_eq!(alone, 1, "only the first message, with nothing running, went without waiting: {commits:?}");
    let full = commits.iter().filter(|&&n| n == 8).count();
    assert!(full >= 4 && commits.len() <= 7, "the other 39 messages went in full groups of 8: {commits:?}");
}

#[tokio::test]
async fn a_group_that_runs_long_does_not_hold_the_other_lanes_back() {
    // Groups never fill here (40 messages, room for 64): the first is held (a slow handler) until every
    // other message was applied, which they are after waiting only a moment for company.
    run_gated(64, |_, stats| stats.processed >= 39).await;
}

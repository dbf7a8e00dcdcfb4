//! Batch handlers (`Consumer::on_batch`): a group's messages next to each other in one call, every
//! aggregate in order, a failing batch rolled back and its messages run alone.

use std::sync::Arc;

use super::*;

/// A second event type over the same aggregates, handled one message at a time.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Tock {
    item: String,
    n: u64,
}

impl DomainEvent for Tock {
    const NAME: &'static str = "tock";
    const VERSION: i32 = 1;
    const OLDEST_VERSION: i32 = 1;
    const AGGREGATE_TYPE: &'static str = "item";
    const SCHEMA: crate::event::EventSchema =
        crate::event::EventSchema { name: "tock", version: 1, type_name: "Tock", fields: &[], upcast_from: &[] };

    fn aggregate_id(&self) -> String {
        self.item.clone()
    }

    fn decode_version(_: i32, payload: &str) -> std::result::Result<Self, serde_json::Error> {
        serde_json::from_str(payload)
    }
}

/// A consumer in groups of up to `group_size` over `db` whose batch handler of ticks writes each tick,
/// records each call's size, and fails (before writing) a call holding a first delivery `fails` picks.
fn batched(db: &StagedDb, group_size: usize, fails: fn(&Received<Tick>) -> bool) -> (Consumer, Arc<Mutex<Vec<usize>>>) {
    let calls: Arc<Mutex<Vec<usize>>> = Arc::default();
    let (writes, sizes) = (db.clone(), calls.clone());
    let consumer = Consumer::new("c")
        .with_config(fast().with_batch_size(64).with_group_size(group_size).with_max_deliveries(5))
        .with_group_commit(db.clone())
        .on_batch::<Tick>(move |batch: Vec<Received<Tick>>| {
            sizes.lock().unwrap().push(batch.len());
            let fail = batch.iter().any(fails);
            if !fail {
                batch.iter().for_each(|r| writes.write(&r.event.item, r.event.n));
            }
            async move { if fail { Err("injected".to_owned()) } else { Ok(vec![Handled::Processed; batch.len()]) } }
        });
    (consumer, calls)
}

#[tokio::test]
async fn a_batch_handler_gets_a_groups_messages_at_once_and_every_aggregate_stays_in_order() {
    let db = StagedDb::default();
    let (consumer, calls) = batched(&db, 32, |_| false);
    let transport = Memory::with(ticks(5, 40));
    run_until(&consumer, &transport, |s| s.processed == 200).await;
    assert_once_in_order(&db.applied(), 5, 40);
    let calls = calls.lock().unwrap().clone();
    let commits = db.commits.lock().unwrap().clone();
    assert_eq!(calls.len(), commits.len(), "one call per group (one event type): {calls:?} {commits:?}");
    assert!(calls.iter().any(|&n| n > 5), "calls of several aggregates' messages: {calls:?}");
    assert!(calls.iter().all(|&n| n <= 32), "no call above group_size: {calls:?}");
    assert_eq!(transport.acked.lock().unwrap().len(), 200);
}

#[tokio::test]
async fn a_failing_batch_rolls_its_group_back_and_its_messages_then_apply_once_alone_in_order() {
    let db = StagedDb::default();
    let (consumer, calls) = batched(&db, 16, |r| r.event.n % 7 == 3 && r.delivery == 1);
    let transport = Memory::with(ticks(4, 30));
    run_until(&consumer, &transport, |s| s.processed == 120).await;
    let stats = consumer.stats();
    assert_once_in_order(&db.applied(), 4, 30);
    assert!(stats.group_rollbacks >= 1, "{stats:?}");
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
    assert!(calls.lock().unwrap().contains(&1), "the failing message ran alone");
    assert_eq!(transport.acked.lock().unwrap().len(), 120);
}

#[tokio::test]
async fn a_batch_ends_at_another_event_type_or_a_bad_message_so_each_aggregate_keeps_its_order() {
    let db = StagedDb::default();
    let (consumer, calls) = batched(&db, 64, |_| false);
    let writes = db.clone();
    let consumer = consumer.on::<Tock>(move |r: Received<Tock>| {
        writes.write(&r.event.item, r.event.n);
        async { Ok::<_, std::io::Error>(()) }
    });
    // Every third event of each aggregate is a tock; a junk message and an unknown type sit in between.
    let event =
        |n: u64, item: String| if n % 3 == 1 { message("tock", 1, &item, n) } else { message("tick", 2, &item, n) };
    let mut messages: Vec<Raw> = (0..12u64).flat_map(|n| (0..4).map(move |i| event(n, format!("i{i}")))).collect();
    messages.insert(9, (BTreeMap::new(), b"junk".to_vec()));
    messages.insert(20, message("other", 1, "i2", 99));
    let transport = Memory::with(messages);
    run_until(&consumer, &transport, |s| s.processed == 48 && s.dead_lettered == 1 && s.skipped == 1).await;
    assert_once_in_order(&db.applied(), 4, 12);
    assert!(calls.lock().unwrap().iter().any(|&n| n > 1), "ticks of several aggregates went together");
    assert_eq!(*db.rollbacks.lock().unwrap(), 0);
}

#[tokio::test]
async fn a_batch_handler_that_answers_for_fewer_messages_fails_them_all() {
    let consumer = Consumer::new("c")
        .with_config(fast().with_max_deliveries(2))
        .with_group_commit(StagedDb::default())
        .on_batch::<Tick>(|batch: Vec<Received<Tick>>| async move {
            Ok::<_, std::io::Error>(vec![Handled::Processed; batch.len() - 1])
        });
    let transport = Memory::with(ticks(2, 2));
    run_until(&consumer, &transport, |s| s.dead_lettered == 4).await;
    let stats = consumer.stats();
    assert_eq!(stats.processed, 0, "{stats:?}");
    let reasons: Vec<String> = transport.dead.lock().unwrap().iter().map(|(_, l)| l.reason.clone()).collect();
    assert!(reasons.iter().all(|r| r.contains("returned 0 outcomes for 1 events")), "{reasons:?}");
}

//! Per-aggregate order: an event is never published while an earlier event of its aggregate is unpublished
//! (unless that one is dead and the policy says skip), whatever fails and whenever.

use crate::common;

use std::collections::{BTreeMap, HashSet};

use common::{
    CAP, Rng, after, assert_per_aggregate_order, count_published, enqueue_committed, event, fast_config, n_of,
    outbox_row, replay_all,
};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{DeadLetterPolicy, InMemoryPublisher, NewEvent, Relay, SeaOrmStore};

/// `aggregate:event_type` of everything the broker received, in arrival order.
fn arrivals(broker: &InMemoryPublisher) -> Vec<String> {
    broker.received().iter().map(|e| format!("{}:{}", e.aggregate_id, e.event_type)).collect()
}

async fn a_failed_first_event_holds_back_its_aggregate_while_others_proceed(t: TestDb) {
    enqueue_committed(
        &t,
        &[
            event("o7", "order.placed", 1),
            event("o7", "order.paid", 2),
            event("o7", "order.shipped", 3),
            event("o8", "order.placed", 4),
        ],
    )
    .await;
    let broker = InMemoryPublisher::new();
    broker.fail_aggregate("o7", 1);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");

    let now = chrono::Utc::now();
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(
        (pass.claimed, pass.published, pass.failed, pass.released),
        (4, 1, 1, 2),
        "{t}: o7's run stops at its failed head; its later events are released untried"
    );
    assert_eq!(arrivals(&broker), ["o8:order.placed"], "{t}: o8 went ahead, o7 waits");
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.claimed, 0, "{t}: o7's later events must wait for its head: {pass:?}");

    let pass = relay.run_once_at(after(now, CAP)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published), (3, 3), "{t}: o7's whole run in one pass: {pass:?}");
    assert_eq!(arrivals(&broker), ["o8:order.placed", "o7:order.placed", "o7:order.paid", "o7:order.shipped"], "{t}");
    assert_eq!(count_published(&t).await, 4, "{t}");
}
per_backend!(a_failed_first_event_holds_back_its_aggregate_while_others_proceed, "order_failed_head_blocks");

async fn three_hundred_events_keep_per_aggregate_order_through_random_failures(t: TestDb) {
    const AGGREGATES: u64 = 15;
    const EVENTS: u64 = 300;
    let events: Vec<NewEvent> = (0..EVENTS).map(|i| event(&format!("a{:02}", i % AGGREGATES), "step", i)).collect();
    for chunk in events.chunks(100) {
        enqueue_committed(&t, chunk).await;
    }
    let broker = InMemoryPublisher::new();
    let config = fast_config().with_max_attempts(1000).with_batch_size(100);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config).expect("config");

    let mut rng = Rng::new(0x5eed_0001);
    let mut now = chrono::Utc::now();
    let (mut published, mut failed) = (0, 0);
    for pass_no in 0.. {
        assert!(pass_no < 200, "{t}: not drained after 200 passes ({published} published)");
        // About a quarter of the aggregates fail their next message; now and then an ack is lost.
        for a in 0..AGGREGATES {
            if rng.below(4) == 0 {
                broker.fail_aggregate(format!("a{a:02}"), 1);
            }
        }
        if rng.below(5) == 0 {
            broker.lose_acks(1);
        }
        let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert!(pass.claimed <= 100, "{t}: at most a batch per pass: {pass:?}");
        published += pass.published;
        failed += pass.failed;
        if published == EVENTS {
            break;
        }
        now = after(now, CAP);
    }
    assert!(failed > 0, "{t}: the test should have injected failures");
    assert_eq!(count_published(&t).await, EVENTS, "{t}");

    let received = broker.received();
    assert_per_aggregate_order(&received, &t);
    let distinct: HashSet<_> = received.iter().map(|e| e.id).collect();
    assert_eq!(distinct.len() as u64, EVENTS, "{t}: every event reached the broker");
    // Per aggregate, first arrivals are exactly the enqueue order: a00 gets 0, 15, 30, …
    let mut firsts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut seen = HashSet::new();
    for e in &received {
        if seen.insert(e.id) {
            firsts.entry(e.aggregate_id.clone()).or_default().push(n_of(e));
        }
    }
    for (aggregate, ns) in &firsts {
        let a: u64 = aggregate[1..].parse().expect("aggregate number");
        let expected: Vec<u64> = (0..EVENTS / AGGREGATES).map(|k| a + k * AGGREGATES).collect();
        assert_eq!(ns, &expected, "{t}: aggregate {aggregate}");
    }
}
per_backend!(three_hundred_events_keep_per_aggregate_order_through_random_failures, "order_300_random_failures");

async fn a_dead_event_blocks_its_aggregate_under_block_aggregate(t: TestDb) {
    let (x1, x2, y1) = (event("x", "first", 1), event("x", "second", 2), event("y", "first", 3));
    enqueue_committed(&t, &[x1.clone(), x2.clone(), y1.clone()]).await;
    let broker = InMemoryPublisher::new();
    broker.fail_aggregate("x", 1);
    let config = fast_config().with_max_attempts(1).with_dead_letters(DeadLetterPolicy::BlockAggregate);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config).expect("config");

    let now = chrono::Utc::now();
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.published, pass.dead), (1, 1), "{t}: {pass:?}");
    for k in 1..=3 {
        let pass = relay.run_once_at(after(now, k * 100 * CAP)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(pass.claimed, 0, "{t}: x:second must wait behind the dead x:first: {pass:?}");
    }
    assert_eq!(outbox_row(&t, x2.id()).await.published_at_ms, None, "{t}");
    let stats = relay.store().stats(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead), (1, 1), "{t}: {stats:?}");

    // Replaying the dead event unblocks the aggregate, in order.
    assert_eq!(replay_all(&relay).await.unwrap_or_else(|e| panic!("{t}: {e}")), 1, "{t}");
    let now = Ord::max(now, chrono::Utc::now()); // the replay made it due at the wall clock
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.published, 2, "{t}: x's run, in order: {pass:?}");
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.claimed, 0, "{t}: {pass:?}");
    assert_eq!(arrivals(&broker), ["y:first", "x:first", "x:second"], "{t}");
}
per_backend!(a_dead_event_blocks_its_aggregate_under_block_aggregate, "order_dead_blocks_aggregate");

async fn skip_dead_lets_later_events_of_the_aggregate_past_a_dead_one(t: TestDb) {
    let (x1, x2, x3) = (event("x", "first", 1), event("x", "second", 2), event("x", "third", 3));
    enqueue_committed(&t, &[x1.clone(), x2.clone(), x3.clone()]).await;
    let broker = InMemoryPublisher::new();
    broker.fail_aggregate("x", 1);
    let config = fast_config().with_max_attempts(1).with_dead_letters(DeadLetterPolicy::SkipDead);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config).expect("config");

    let now = chrono::Utc::now();
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.dead, pass.released), (3, 1, 2), "{t}: {pass:?}");
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published), (2, 2), "{t}: the run after the dead one: {pass:?}");
    assert_eq!(arrivals(&broker), ["x:second", "x:third"], "{t}: a gap where the dead event was");
    let dead = outbox_row(&t, x1.id()).await;
    assert!(dead.dead_at_ms.is_some() && dead.published_at_ms.is_none(), "{t}: {dead:?}");
    let stats = relay.store().stats(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead), (0, 1), "{t}: {stats:?}");
}
per_backend!(skip_dead_lets_later_events_of_the_aggregate_past_a_dead_one, "order_dead_skipped");

async fn aggregates_are_keyed_by_type_and_id(t: TestDb) {
    // An order and an invoice that happen to share the id "1" are different aggregates.
    let order = NewEvent::new("order", "1", "order.placed", &serde_json::json!({"n": 1})).expect("valid");
    let invoice = NewEvent::new("invoice", "1", "invoice.issued", &serde_json::json!({"n": 2})).expect("valid");
    let order_paid = NewEvent::new("order", "1", "order.paid", &serde_json::json!({"n": 3})).expect("valid");
    enqueue_committed(&t, &[order.clone(), invoice.clone(), order_paid.clone()]).await;
    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published), (3, 3), "{t}: both aggregates' runs in one pass: {pass:?}");
    let types: Vec<String> = broker.received().iter().map(|e| e.event_type.clone()).collect();
    let order: Vec<&String> = types.iter().filter(|t| t.starts_with("order.")).collect();
    assert_eq!(order, ["order.placed", "order.paid"], "{t}: {types:?}");
    assert!(types.contains(&"invoice.issued".to_owned()), "{t}: {types:?}");
}
per_backend!(aggregates_are_keyed_by_type_and_id, "order_aggregate_type_and_id");

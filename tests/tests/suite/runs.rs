//! Runs: a claim takes an aggregate's head and the due events after it, and delivery still follows each
//! aggregate's commit order, whatever fails, whoever writes, and however many relays drain it.

use crate::common;

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{CAP, Rng, after, count_published, enqueue_committed, event, fast_config, n_of, replay_all};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::{BatchOutcome, ClaimRequest, ClaimedBatch, MaintenanceStore, OutboxStore};
use outbox_seaorm::{
    Backoff, ClaimMode, DeadLetterPolicy, InMemoryPublisher, OutboxEvent, PublishError, Publisher, Relay, RelayConfig,
    SeaOrmStore,
};
use sea_orm::TransactionTrait;

/// `aggregate:event_type` of everything the broker received, in arrival order.
fn arrivals(broker: &InMemoryPublisher) -> Vec<String> {
    broker.received().iter().map(|e| format!("{}:{}", e.aggregate_id, e.event_type)).collect()
}

/// The first delivery of each event, in arrival order.
fn first_deliveries(received: &[OutboxEvent]) -> Vec<OutboxEvent> {
    let mut seen = HashSet::new();
    received.iter().filter(|e| seen.insert(e.id)).cloned().collect()
}

/// Forwards to an in-memory broker, rejecting (transiently) each message `reject` says to.
struct Rejecting<F> {
    broker: InMemoryPublisher,
    reject: F,
}

impl<F: Fn(&OutboxEvent) -> bool + Send + Sync> Publisher for Rejecting<F> {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let mut results = Vec::with_capacity(events.len());
        for event in events {
            if (self.reject)(event) {
                results.push(Err(PublishError::transient("broker rejected it")));
            } else {
                results.extend(self.broker.publish(std::slice::from_ref(event)).await);
            }
        }
        results
    }
}

/// Rejects the first message of `event_type`, once.
fn fails_once(broker: &InMemoryPublisher, event_type: &str) -> Rejecting<impl Fn(&OutboxEvent) -> bool + use<>> {
    let failing = Mutex::new(Some(event_type.to_owned()));
    let reject = move |event: &OutboxEvent| {
        failing.lock().unwrap_or_else(|p| p.into_inner()).take_if(|failing| *failing == event.event_type).is_some()
    };
    Rejecting { broker: broker.clone(), reject }
}

async fn a_failure_in_the_middle_of_a_run_stops_it_and_the_rest_waits_for_the_retry(t: TestDb) {
    let events: Vec<_> = (1..=5).map(|n| event("x", &format!("e{n}"), n)).collect();
    enqueue_committed(&t, &events).await;
    let broker = InMemoryPublisher::new();
    let publisher = fails_once(&broker, "e3");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, fast_config()).expect("config");

    let now = chrono::Utc::now();
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(
        (pass.claimed, pass.published, pass.failed, pass.released),
        (5, 2, 1, 2),
        "{t}: e1 and e2 out, e3 failed, e4 and e5 released untried: {pass:?}"
    );
    assert_eq!(arrivals(&broker), ["x:e1", "x:e2"], "{t}");
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.claimed, 0, "{t}: nothing of x overtakes e3 during its backoff: {pass:?}");

    let pass = relay.run_once_at(after(now, CAP)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published), (3, 3), "{t}: e3, e4, e5 as one run: {pass:?}");
    assert_eq!(arrivals(&broker), ["x:e1", "x:e2", "x:e3", "x:e4", "x:e5"], "{t}");
    let versions: Vec<i64> = broker.received().iter().map(|e| e.aggregate_version).collect();
    assert_eq!(versions, [1, 2, 3, 4, 5], "{t}");
}
per_backend!(a_failure_in_the_middle_of_a_run_stops_it_and_the_rest_waits_for_the_retry, "runs_failure_mid_run");

async fn two_writers_of_one_aggregate_are_delivered_in_commit_order(t: TestDb) {
    // A enqueues first and stays open; B enqueues the same aggregate and tries to commit.
    let txn_a = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    outbox_seaorm::enqueue(&txn_a, &event("x", "from_a", 1)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let db_b = t.reconnect().await;
    let label = t.to_string();
    let writer_b = tokio::spawn(async move {
        let txn_b = db_b.begin().await.unwrap_or_else(|e| panic!("{label}: {e}"));
        outbox_seaorm::enqueue(&txn_b, &event("x", "from_b", 2)).await.unwrap_or_else(|e| panic!("{label}: {e}"));
        txn_b.commit().await.unwrap_or_else(|e| panic!("{label}: {e}"));
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer_b.is_finished(), "{t}: B must wait for A, the aggregate's earlier writer");
    txn_a.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    tokio::time::timeout(Duration::from_secs(20), writer_b)
        .await
        .unwrap_or_else(|_| panic!("{t}: B never committed"))
        .unwrap_or_else(|e| panic!("{t}: {e}"));

    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    relay.drain(10).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(arrivals(&broker), ["x:from_a", "x:from_b"], "{t}: A committed first, so A is delivered first");
    let versions: Vec<i64> = broker.received().iter().map(|e| e.aggregate_version).collect();
    assert_eq!(versions, [1, 2], "{t}");
}
per_backend!(two_writers_of_one_aggregate_are_delivered_in_commit_order, "runs_commit_order");

async fn a_thousand_events_of_one_aggregate_drain_in_order_across_four_relays_with_failures(t: TestDb) {
    const EVENTS: u64 = 1000;
    let events: Vec<_> = (0..EVENTS).map(|n| event("hot", "step", n)).collect();
    enqueue_committed(&t, &events).await;
    let broker = InMemoryPublisher::new();
    // One message in ten is rejected, at random (seeded).
    let rng = Mutex::new(Rng::new(7));
    let reject = move |_: &OutboxEvent| rng.lock().unwrap_or_else(|p| p.into_inner()).below(100) < 10;
    let publisher = std::sync::Arc::new(Rejecting { broker: broker.clone(), reject });
    let backoff = Backoff { initial: Duration::from_millis(1), max: Duration::from_millis(5), multiplier: 2 };
    let config = RelayConfig::default().with_batch_size(100).with_backoff(backoff).with_max_attempts(10_000);

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut relays = Vec::new();
    for _ in 0..4 {
        let store = SeaOrmStore::new(t.reconnect().await);
        let relay = Relay::new(store, publisher.clone(), config.clone()).expect("config");
        let label = t.to_string();
        relays.push(tokio::spawn(async move {
            let mut claiming_passes = 0u64;
            loop {
                assert!(Instant::now() < deadline, "{label}: not drained in 60 s");
                let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_eq!((pass.dead, pass.fenced), (0, 0), "{label}: {pass:?}");
                if pass.claimed > 0 {
                    claiming_passes += 1;
                    continue;
                }
                let stats = relay.store().stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{label}: {e}"));
                if stats.pending == 0 {
                    return claiming_passes;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    let mut passes = 0;
    for relay in relays {
        passes += relay.await.unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    assert_eq!(count_published(&t).await, EVENTS, "{t}");
    let firsts = first_deliveries(&broker.received());
    let ns: Vec<u64> = firsts.iter().map(n_of).collect();
    assert_eq!(ns, (0..EVENTS).collect::<Vec<_>>(), "{t}: first deliveries in commit order, each event once");
    // About one failure per ten events, each ending a run: a few hundred passes, never one per event.
    assert!(passes < 400, "{t}: {passes} claiming passes for {EVENTS} events");
}
per_backend!(
    a_thousand_events_of_one_aggregate_drain_in_order_across_four_relays_with_failures,
    "runs_hot_aggregate_four_relays"
);

fn request(mode: ClaimMode, now: chrono::DateTime<chrono::Utc>) -> ClaimRequest {
    ClaimRequest { now, limit: 100, mode, dead_letters: DeadLetterPolicy::BlockAggregate }
}

fn all_published(batch: &impl ClaimedBatch, now: chrono::DateTime<chrono::Utc>) -> BatchOutcome {
    BatchOutcome { now, published: batch.events().iter().map(|e| e.seq).collect(), failed: vec![], released: vec![] }
}

async fn a_run_whose_lease_expired_is_taken_over_whole_and_the_late_relay_is_fenced(t: TestDb) {
    const LEASE: Duration = Duration::from_secs(30);
    let events: Vec<_> = (1..=3).map(|n| event("x", &format!("e{n}"), n)).collect();
    enqueue_committed(&t, &events).await;
    let (a, b) = (SeaOrmStore::new(t.reconnect().await), SeaOrmStore::new(t.reconnect().await));
    let mode = ClaimMode::Lease { duration: LEASE };
    let now = chrono::Utc::now();

    let held_by_a = a.claim(request(mode, now)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(held_by_a.events().len(), 3, "{t}");
    let nothing =
        b.claim(request(mode, after(now, Duration::from_secs(1)))).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(nothing.events().is_empty(), "{t}: the run is A's while its lease lasts");
    drop(nothing);

    // A stalls past its lease; B takes the whole run over, in order, and publishes it.
    let later = after(now, LEASE + Duration::from_secs(1));
    let taken = b.claim(request(mode, later)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let versions: Vec<i64> = taken.events().iter().map(|e| e.aggregate_version).collect();
    assert_eq!(versions, [1, 2, 3], "{t}");
    let outcome = all_published(&taken, later);
    let report = taken.complete(outcome).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(report.published, 3, "{t}: {report:?}");

    let outcome = all_published(&held_by_a, after(later, Duration::from_secs(1)));
    let report = held_by_a.complete(outcome).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((report.published, report.fenced), (0, 3), "{t}: A's late outcome is not recorded: {report:?}");
    assert_eq!(count_published(&t).await, 3, "{t}");
}
per_backend!(a_run_whose_lease_expired_is_taken_over_whole_and_the_late_relay_is_fenced, "runs_lease_fencing");

async fn a_relay_that_dies_halfway_through_a_run_leaves_it_whole_for_the_next(t: TestDb) {
    for mode in [ClaimMode::Transaction, ClaimMode::Lease { duration: Duration::from_secs(30) }] {
        let tag = if mode == ClaimMode::Transaction { "tx" } else { "lease" };
        let events: Vec<_> = (1..=4).map(|n| event(tag, &format!("e{n}"), n)).collect();
        enqueue_committed(&t, &events).await;
        let broker = InMemoryPublisher::new();
        let now = chrono::Utc::now();

        // The first relay publishes half of the run, then its process dies before marking anything.
        let doomed = SeaOrmStore::new(t.reconnect().await);
        let batch = doomed.claim(request(mode, now)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(batch.events().len(), 4, "{t} {tag}");
        let _ = broker.publish(&batch.events()[..1]).await;
        let _ = broker.publish(&batch.events()[1..2]).await;
        drop(batch);
        drop(doomed);

        // The next relay gets the run back from its head (after the lease, in lease mode).
        let relay = Relay::new(SeaOrmStore::new(t.reconnect().await), broker.clone(), fast_config()).expect("config");
        let pass = relay.run_once_at(after(now, Duration::from_secs(31))).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!((pass.claimed, pass.published), (4, 4), "{t} {tag}: {pass:?}");
        let arrived: Vec<String> = arrivals(&broker);
        let want: Vec<String> = ["e1", "e2", "e1", "e2", "e3", "e4"].iter().map(|e| format!("{tag}:{e}")).collect();
        assert_eq!(arrived, want, "{t} {tag}: duplicates of the published half, then the rest, in order");
        let firsts: Vec<String> = first_deliveries(&broker.received()).iter().map(|e| e.event_type.clone()).collect();
        assert_eq!(firsts, ["e1", "e2", "e3", "e4"], "{t} {tag}");
    }
}
per_backend!(a_relay_that_dies_halfway_through_a_run_leaves_it_whole_for_the_next, "runs_crash_mid_run");

async fn a_dead_tail_under_skip_dead_stops_being_claimed_until_a_replay_brings_it_back(t: TestDb) {
    use outbox_seaorm::entity::outbox_aggregate;
    use sea_orm::EntityTrait;
    enqueue_committed(&t, &[event("x", "e1", 1)]).await;
    let broker = InMemoryPublisher::new();
    let publisher = fails_once(&broker, "e1");
    let config = fast_config().with_max_attempts(1).with_dead_letters(DeadLetterPolicy::SkipDead);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher, config).expect("config");

    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.dead, 1, "{t}: {pass:?}");
    let hint = |t: &outbox_integration_tests::TestDb| {
        let db = t.db.clone();
        async move {
            let rows = outbox_aggregate::Entity::find().all(&db).await.expect("read outbox_aggregates");
            rows.into_iter().find(|a| a.aggregate_id == "x").map(|a| a.due_at_ms)
        }
    };
    assert_eq!(hint(&t).await, Some(None), "{t}: nothing claimable is left, so no claim looks at x again");

    assert_eq!(replay_all(&relay).await.unwrap_or_else(|e| panic!("{t}: {e}")), 1);
    assert!(hint(&t).await.flatten().is_some(), "{t}: the replay made x due again");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.published, 1, "{t}: {pass:?}");
    assert_eq!(arrivals(&broker), ["x:e1"], "{t}");
}
per_backend!(a_dead_tail_under_skip_dead_stops_being_claimed_until_a_replay_brings_it_back, "runs_dead_tail_replay");

async fn enqueues_outside_any_transaction_race_a_relay_and_lose_nothing(t: TestDb) {
    const WRITERS: u64 = 4;
    const EACH: u64 = 50;
    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.reconnect().await), broker.clone(), fast_config()).expect("config");
    let shutdown = outbox_seaorm::CancellationToken::new();
    let running = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { relay.run(shutdown).await })
    };
    // Several writers append to one aggregate on the pool, each enqueue its own unit of work, while the
    // relay claims: versions are handed out under the aggregate's lock, and no claim can see an
    // aggregate's new version without its event.
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let db = t.db.clone();
        let label = t.to_string();
        writers.push(tokio::spawn(async move {
            for k in 0..EACH {
                outbox_seaorm::enqueue(&db, &event("x", "step", w * EACH + k))
                    .await
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while count_published(&t).await < WRITERS * EACH {
        assert!(Instant::now() < deadline, "{t}: {} of {} published", count_published(&t).await, WRITERS * EACH);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    running.await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let mut versions: Vec<i64> = first_deliveries(&broker.received()).iter().map(|e| e.aggregate_version).collect();
    assert!(versions.is_sorted(), "{t}: delivered in version order");
    versions.dedup();
    assert_eq!(versions, (1..=(WRITERS * EACH) as i64).collect::<Vec<_>>(), "{t}: gapless, each once");
}
per_backend!(enqueues_outside_any_transaction_race_a_relay_and_lose_nothing, "runs_autocommit_enqueue_race");

//! Lease mode: a claim is a token and an expiry, committed before publishing; only the current holder's
//! outcome is recorded (fencing), and an expired lease passes to the next relay.

use crate::common;

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{CAP, after, enqueue_committed, event, fast_config, outbox_row};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::{BatchOutcome, ClaimRequest, ClaimedBatch, Failure, OutboxStore, SeaOrmBatch};
use outbox_seaorm::{
    ClaimMode, DeadLetterPolicy, EventId, InMemoryPublisher, OutboxEvent, PublishError, Publisher, Relay, RelayPass,
    SeaOrmStore,
};

const LEASE: Duration = Duration::from_secs(1);

fn lease_request(now: DateTime<Utc>) -> ClaimRequest {
    ClaimRequest {
        now,
        limit: 10,
        mode: ClaimMode::Lease { duration: LEASE },
        dead_letters: DeadLetterPolicy::BlockAggregate,
    }
}

/// Relay A claims the event at `now`; relay B, on its own pool, claims it again at `now + 2 s`, once A's
/// one-second lease has expired. Returns both batches, A's first.
async fn a_then_b_after_expiry(t: &TestDb, id: EventId, now: DateTime<Utc>) -> (SeaOrmBatch, SeaOrmBatch) {
    let store_a = SeaOrmStore::new(t.reconnect().await);
    let store_b = SeaOrmStore::new(t.reconnect().await);
    let a = store_a.claim(lease_request(now)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(a.events().len(), 1, "{t}");
    let token_a = outbox_row(t, id).await.lease_token.unwrap_or_else(|| panic!("{t}: A's claim set no lease token"));

    let during = store_b.claim(lease_request(after(now, LEASE / 2))).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(during.events().is_empty(), "{t}: a live lease keeps the row from other relays");

    let b = store_b.claim(lease_request(after(now, 2 * LEASE))).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(b.events().len(), 1, "{t}: the expired lease passes to B");
    assert_eq!(b.events()[0].id, id, "{t}");
    let token_b = outbox_row(t, id).await.lease_token.unwrap_or_else(|| panic!("{t}: B's claim set no lease token"));
    assert_ne!(token_a, token_b, "{t}: B holds the row under a new token");
    (a, b)
}

async fn a_relay_whose_lease_expired_cannot_overwrite_the_new_holders_outcome(t: TestDb) {
    let e = event("o1", "order.placed", 1);
    enqueue_committed(&t, std::slice::from_ref(&e)).await;
    let now = Utc::now();
    let (a, b) = a_then_b_after_expiry(&t, e.id(), now).await;
    let seq = b.events()[0].seq;

    let b_done = after(now, 2 * LEASE);
    let report = b
        .complete(BatchOutcome { now: b_done, published: vec![seq], failed: vec![], released: vec![] })
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((report.published, report.fenced), (1, 0), "{t}: {report:?}");

    // A wakes up from its pause and reports a failure for a row it no longer holds.
    let failure = Failure { seq, error: "ack timeout".to_owned(), next_attempt_at: after(now, 3 * LEASE), dead: false };
    let report = a
        .complete(BatchOutcome {
            now: after(now, 3 * LEASE),
            published: vec![],
            failed: vec![failure],
            released: vec![],
        })
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((report.published, report.failed, report.fenced), (0, 0, 1), "{t}: {report:?}");

    let row = outbox_row(&t, e.id()).await;
    assert_eq!(row.published_at_ms, Some(b_done.timestamp_millis()), "{t}: B's outcome stands");
    assert_eq!((row.attempts, row.last_error, row.dead_at_ms), (0, None, None), "{t}");
    assert_eq!((row.lease_token, row.lease_until_ms), (None, None), "{t}: the lease is released");
}
per_backend!(
    a_relay_whose_lease_expired_cannot_overwrite_the_new_holders_outcome,
    "lease_fencing_failure_after_success"
);

async fn a_stale_holders_success_is_fenced_and_the_new_holder_decides(t: TestDb) {
    let e = event("o1", "order.placed", 1);
    enqueue_committed(&t, std::slice::from_ref(&e)).await;
    let now = Utc::now();
    let (a, b) = a_then_b_after_expiry(&t, e.id(), now).await;
    let seq = a.events()[0].seq;

    // A reports success first, but its lease is gone: nothing is written.
    let report = a
        .complete(BatchOutcome { now: after(now, 2 * LEASE), published: vec![seq], failed: vec![], released: vec![] })
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((report.published, report.fenced), (0, 1), "{t}: {report:?}");
    let row = outbox_row(&t, e.id()).await;
    assert_eq!(row.published_at_ms, None, "{t}: a fenced success must not mark the row");
    assert!(row.lease_token.is_some(), "{t}: B still holds the row");

    // B fails: its outcome is the one recorded.
    let failure =
        Failure { seq, error: "broker unavailable".to_owned(), next_attempt_at: after(now, CAP), dead: false };
    let report = b
        .complete(BatchOutcome {
            now: after(now, 2 * LEASE),
            published: vec![],
            failed: vec![failure],
            released: vec![],
        })
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((report.failed, report.fenced), (1, 0), "{t}: {report:?}");
    let row = outbox_row(&t, e.id()).await;
    assert_eq!((row.attempts, row.last_error.as_deref()), (1, Some("broker unavailable")), "{t}");
    assert_eq!(row.published_at_ms, None, "{t}");
    assert_eq!(row.lease_token, None, "{t}");
}
per_backend!(a_stale_holders_success_is_fenced_and_the_new_holder_decides, "lease_fencing_success_before_failure");

async fn a_lease_mode_relay_publishes_retries_and_releases_its_leases(t: TestDb) {
    let (e1, e2) = (event("o1", "order.placed", 1), event("o2", "order.placed", 2));
    enqueue_committed(&t, &[e1.clone(), e2.clone()]).await;
    let broker = InMemoryPublisher::new();
    broker.fail_aggregate("o2", 1);
    let config = fast_config().with_claim_mode(ClaimMode::Lease { duration: Duration::from_secs(30) });
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config).expect("config");

    let now = Utc::now();
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published, pass.failed, pass.fenced), (2, 1, 1, 0), "{t}: {pass:?}");
    for id in [e1.id(), e2.id()] {
        let row = outbox_row(&t, id).await;
        assert_eq!((row.lease_token, row.lease_until_ms), (None, None), "{t}: lease released after marking");
    }
    let failed = outbox_row(&t, e2.id()).await;
    assert_eq!(failed.attempts, 1, "{t}");
    assert!(failed.next_attempt_at_ms > now.timestamp_millis(), "{t}: backoff applies in lease mode too");
    assert_eq!(relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}")).claimed, 0, "{t}");

    let pass = relay.run_once_at(after(now, CAP)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.published, 1, "{t}: {pass:?}");
    assert_eq!(broker.received_count(), 2, "{t}");
}
per_backend!(a_lease_mode_relay_publishes_retries_and_releases_its_leases, "lease_mode_relay");

/// Refuses every event for good; with `take_over`, another relay first claims the rows under a new lease
/// (as if this relay had paused past its lease), and keeps them.
struct Refuses {
    take_over: Option<(SeaOrmStore, DateTime<Utc>)>,
    taken: Mutex<Vec<SeaOrmBatch>>,
}

impl Publisher for Refuses {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        if let Some((store, at)) = &self.take_over {
            let batch = store.claim(lease_request(*at)).await.expect("the other relay's claim");
            assert_eq!(batch.events().len(), events.len(), "the other relay took every row over");
            self.taken.lock().expect("taken").push(batch);
        }
        vec![Err(PublishError::permanent("the broker refuses this event")); events.len()]
    }
}

async fn dead_rows_are_counted_alike_in_both_claim_modes(t: TestDb) {
    let transaction = fast_config().with_max_attempts(2);
    let lease = transaction.clone().with_claim_mode(ClaimMode::Lease { duration: Duration::from_secs(30) });
    let mut passes = Vec::new();
    for (aggregate, config) in [("tx", transaction), ("lease", lease)] {
        enqueue_committed(
            &t,
            &[event(aggregate, "order.placed", 1), event(&format!("{aggregate}-2"), "order.placed", 2)],
        )
        .await;
        let refuses = Refuses { take_over: None, taken: Mutex::default() };
        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), refuses, config).expect("config");
        passes.push(relay.run_once_at(Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}")));
    }
    let dead_at_once = RelayPass { claimed: 2, dead: 2, ..RelayPass::default() };
    assert_eq!(passes, [dead_at_once, dead_at_once], "{t}: a permanent failure is dead at attempt 1 in either mode");
}
per_backend!(dead_rows_are_counted_alike_in_both_claim_modes, "lease_dead_counted");

async fn a_dead_outcome_fenced_by_another_relay_is_not_counted_dead(t: TestDb) {
    let e = event("o1", "order.placed", 1);
    enqueue_committed(&t, std::slice::from_ref(&e)).await;
    let now = Utc::now();
    let lease = Duration::from_secs(30); // longer than the publish timeout, as a relay requires
    let other = SeaOrmStore::new(t.reconnect().await);
    let refuses = Refuses { take_over: Some((other, after(now, 2 * lease))), taken: Mutex::default() };
    let config = fast_config().with_claim_mode(ClaimMode::Lease { duration: lease });
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), refuses, config).expect("config");

    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass, RelayPass { claimed: 1, fenced: 1, ..RelayPass::default() }, "{t}: not written, so not dead");
    let row = outbox_row(&t, e.id()).await;
    assert_eq!((row.attempts, row.dead_at_ms), (0, None), "{t}: the new holder decides");
    assert!(row.lease_token.is_some(), "{t}: the other relay still holds the row");
}
per_backend!(a_dead_outcome_fenced_by_another_relay_is_not_counted_dead, "lease_dead_fenced");

async fn a_lease_is_stamped_on_each_runs_head_and_keeps_the_whole_run_from_other_relays(t: TestDb) {
    let run: Vec<_> = (1..=3).map(|n| event("o1", &format!("e{n}"), n)).collect();
    let other = event("o2", "order.placed", 4);
    enqueue_committed(&t, &[run.clone(), vec![other.clone()]].concat()).await;
    let now = Utc::now();
    let a = SeaOrmStore::new(t.reconnect().await);
    let b = SeaOrmStore::new(t.reconnect().await);
    let held = a.claim(lease_request(now)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(held.events().len(), 4, "{t}");

    let head = outbox_row(&t, run[0].id()).await;
    let token = head.lease_token.clone().unwrap_or_else(|| panic!("{t}: the run's head carries the lease"));
    assert_eq!(outbox_row(&t, other.id()).await.lease_token.as_ref(), Some(&token), "{t}: a run of one is its head");
    for e in &run[1..] {
        assert_eq!(outbox_row(&t, e.id()).await.lease_token, None, "{t}: one write per run, not per event");
    }
    let during = b.claim(lease_request(after(now, LEASE / 2))).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(during.events().is_empty(), "{t}: no row of a leased run is claimable, the unstamped ones included");
    drop(during);

    // The head is published, the second event fails, the third is released behind it.
    let seq =
        |e: &outbox_seaorm::NewEvent| held.events().iter().find(|c| c.id == e.id()).map(|c| c.seq).expect("claimed");
    let failure =
        Failure { seq: seq(&run[1]), error: "nack".to_owned(), next_attempt_at: after(now, CAP), dead: false };
    let outcome = BatchOutcome {
        now: after(now, LEASE / 2),
        published: vec![seq(&run[0]), seq(&other)],
        failed: vec![failure],
        released: vec![seq(&run[2])],
    };
    let report = held.complete(outcome).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((report.published, report.failed, report.fenced), (2, 1, 0), "{t}: {report:?}");
    for e in run.iter().chain([&other]) {
        let row = outbox_row(&t, e.id()).await;
        assert_eq!((row.lease_token, row.lease_until_ms), (None, None), "{t}: every lease ends with the mark");
    }
    let retried = b.claim(lease_request(after(now, CAP))).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let versions: Vec<i64> = retried.events().iter().map(|e| e.aggregate_version).collect();
    assert_eq!(versions, [2, 3], "{t}: the rest of the run is taken from its new head, in order");
}
per_backend!(a_lease_is_stamped_on_each_runs_head_and_keeps_the_whole_run_from_other_relays, "lease_on_heads");

//! Retry rules of the relay against real databases: backoff, attempts, `last_error`, dead letters and
//! replay, permanent failures, timeouts and publishers that break their contract.

use crate::common;

use std::sync::Mutex;
use std::time::Duration;

use common::{CAP, after, count_published, enqueue_committed, event, fast_config, outbox_row, replay_all};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{InMemoryPublisher, OutboxEvent, PublishError, Publisher, Relay, SeaOrmStore};

/// A broker that refuses events of type `oversized` for good and accepts the rest.
#[derive(Default)]
struct SizeLimitedBroker {
    accepted: Mutex<Vec<OutboxEvent>>,
}

impl Publisher for SizeLimitedBroker {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let mut accepted = self.accepted.lock().expect("lock");
        events
            .iter()
            .map(|event| {
                if event.event_type == "oversized" {
                    Err(PublishError::permanent("message exceeds the broker's size limit"))
                } else {
                    accepted.push(event.clone());
                    Ok(())
                }
            })
            .collect()
    }
}

/// A broker that answers with no results at all (a buggy adapter).
struct SilentBroker;

impl Publisher for SilentBroker {
    async fn publish(&self, _events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        Vec::new()
    }
}

/// A broker whose error messages are huge.
struct VerboseBroker;

impl Publisher for VerboseBroker {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        events.iter().map(|_| Err(PublishError::transient("é".repeat(5000)))).collect()
    }
}

async fn a_failed_publish_is_recorded_and_retried_only_after_its_backoff(t: TestDb) {
    let e = event("o1", "order.placed", 1);
    enqueue_committed(&t, std::slice::from_ref(&e)).await;
    let broker = InMemoryPublisher::new();
    broker.go_down_for(1);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");

    let now = chrono::Utc::now();
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published, pass.failed, pass.dead), (1, 0, 1, 0), "{t}: {pass:?}");
    let row = outbox_row(&t, e.id()).await;
    assert_eq!(row.attempts, 1, "{t}");
    assert_eq!(row.last_error.as_deref(), Some("broker unavailable"), "{t}");
    assert_eq!((row.published_at_ms, row.dead_at_ms), (None, None), "{t}");
    // The first retry delay is 0.5–1 s with the default jitter.
    let delay_ms = row.next_attempt_at_ms - now.timestamp_millis();
    assert!((500..=1000).contains(&delay_ms), "{t}: next attempt {delay_ms} ms after the failure");

    for at in [now, after(now, Duration::from_millis(400))] {
        let pass = relay.run_once_at(at).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(pass.claimed, 0, "{t}: retried before its backoff: {pass:?}");
    }
    assert_eq!(broker.received_count(), 0, "{t}");

    let retry_at = after(now, CAP);
    let pass = relay.run_once_at(retry_at).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published), (1, 1), "{t}: {pass:?}");
    let row = outbox_row(&t, e.id()).await;
    assert_eq!(row.published_at_ms, Some(retry_at.timestamp_millis()), "{t}");
    assert_eq!(row.attempts, 1, "{t}: a success does not count as an attempt");
    assert_eq!(broker.received_count(), 1, "{t}");
}
per_backend!(a_failed_publish_is_recorded_and_retried_only_after_its_backoff, "retry_after_backoff");

async fn an_event_failing_max_attempts_times_is_dead_until_replayed(t: TestDb) {
    let e = event("o1", "order.placed", 1);
    enqueue_committed(&t, std::slice::from_ref(&e)).await;
    let broker = InMemoryPublisher::new();
    broker.go_down_for(3);
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config().with_max_attempts(3)).expect("config");

    let start = chrono::Utc::now();
    let mut now = start;
    for attempt in 1..=3 {
        let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        let expected = if attempt < 3 { (1, 1, 0) } else { (1, 0, 1) };
        assert_eq!((pass.claimed, pass.failed, pass.dead), expected, "{t}: attempt {attempt}: {pass:?}");
        now = after(now, CAP);
    }
    let row = outbox_row(&t, e.id()).await;
    assert_eq!(row.attempts, 3, "{t}");
    assert_eq!(row.dead_at_ms, Some(after(start, 2 * CAP).timestamp_millis()), "{t}");
    assert_eq!(row.published_at_ms, None, "{t}");
    assert_eq!(row.last_error.as_deref(), Some("broker unavailable"), "{t}");

    let stats = relay.store().stats(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead, stats.max_attempts), (0, 1, 3), "{t}: {stats:?}");
    assert_eq!(stats.oldest_pending_seconds, 0, "{t}: dead rows are not pending: {stats:?}");
    let far_future = after(now, 1000 * CAP);
    let pass = relay.run_once_at(far_future).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.claimed, 0, "{t}: a dead event is never claimed: {pass:?}");

    let replayed = replay_all(&relay).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(replayed, 1, "{t}");
    let now = Ord::max(now, chrono::Utc::now()); // the replay made it due at the wall clock
    let row = outbox_row(&t, e.id()).await;
    assert_eq!((row.attempts, row.dead_at_ms), (0, None), "{t}");
    let stats = relay.store().stats(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead), (1, 0), "{t}: {stats:?}");
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.published, 1, "{t}: {pass:?}");
    assert_eq!(broker.received_count(), 1, "{t}");
    assert_eq!(replay_all(&relay).await.unwrap_or_else(|e| panic!("{t}: {e}")), 0, "{t}");
}
per_backend!(an_event_failing_max_attempts_times_is_dead_until_replayed, "retry_dead_then_replay");

async fn a_permanent_publish_error_sends_the_event_to_the_dead_letters_at_once(t: TestDb) {
    let poison = event("o1", "oversized", 1);
    let fine = event("o2", "order.placed", 2);
    enqueue_committed(&t, &[poison.clone(), fine.clone()]).await;
    let broker = SizeLimitedBroker::default();
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), &broker, fast_config().with_max_attempts(10)).expect("config");

    let now = chrono::Utc::now();
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published, pass.failed, pass.dead), (2, 1, 0, 1), "{t}: {pass:?}");
    let row = outbox_row(&t, poison.id()).await;
    assert_eq!(row.attempts, 1, "{t}: dead after one attempt, well below max_attempts");
    assert_eq!(row.dead_at_ms, Some(now.timestamp_millis()), "{t}");
    assert_eq!(row.last_error.as_deref(), Some("message exceeds the broker's size limit"), "{t}");
    assert!(outbox_row(&t, fine.id()).await.published_at_ms.is_some(), "{t}");

    let stats = relay.store().stats(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead), (0, 1), "{t}: {stats:?}");
    let pass = relay.run_once_at(after(now, 1000 * CAP)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.claimed, 0, "{t}: {pass:?}");
    assert_eq!(broker.accepted.lock().expect("lock").len(), 1, "{t}");
}
per_backend!(a_permanent_publish_error_sends_the_event_to_the_dead_letters_at_once, "retry_permanent_is_dead");

async fn a_publish_that_times_out_counts_as_a_failure_and_is_retried(t: TestDb) {
    let e = event("o1", "order.placed", 1);
    enqueue_committed(&t, std::slice::from_ref(&e)).await;
    let broker = InMemoryPublisher::new();
    broker.set_delay(Duration::from_millis(300));
    let config = fast_config().with_publish_timeout(Duration::from_millis(50));
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config).expect("config");

    let now = chrono::Utc::now();
    let pass = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.published, pass.failed), (0, 1), "{t}: {pass:?}");
    let row = outbox_row(&t, e.id()).await;
    assert_eq!(row.attempts, 1, "{t}");
    assert!(row.last_error.as_deref().is_some_and(|m| m.contains("timed out")), "{t}: {:?}", row.last_error);

    broker.set_delay(Duration::ZERO);
    let pass = relay.run_once_at(after(now, CAP)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.published, 1, "{t}: {pass:?}");
    assert_eq!(count_published(&t).await, 1, "{t}");
}
per_backend!(a_publish_that_times_out_counts_as_a_failure_and_is_retried, "retry_publish_timeout");

async fn events_a_publisher_forgot_to_confirm_are_retried_not_marked(t: TestDb) {
    let events = [event("o1", "order.placed", 1), event("o2", "order.placed", 2)];
    enqueue_committed(&t, &events).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), SilentBroker, fast_config()).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.published, pass.failed), (2, 0, 2), "{t}: {pass:?}");
    assert_eq!(count_published(&t).await, 0, "{t}");
    for e in &events {
        let row = outbox_row(&t, e.id()).await;
        assert_eq!(row.attempts, 1, "{t}");
        assert!(row.last_error.is_some(), "{t}");
    }
}
per_backend!(events_a_publisher_forgot_to_confirm_are_retried_not_marked, "retry_unconfirmed");

async fn a_huge_publisher_error_is_cut_to_fit_last_error(t: TestDb) {
    let e = event("o1", "order.placed", 1);
    enqueue_committed(&t, std::slice::from_ref(&e)).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), VerboseBroker, fast_config()).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.failed, 1, "{t}: {pass:?}");
    let error = outbox_row(&t, e.id()).await.last_error.unwrap_or_else(|| panic!("{t}: no last_error"));
    assert!(error.len() <= 2010, "{t}: last_error is {} bytes", error.len());
    assert!(error.starts_with("éé") && error.ends_with('…'), "{t}: cut on a character boundary");
}
per_backend!(a_huge_publisher_error_is_cut_to_fit_last_error, "retry_long_error");

async fn drain_publishes_everything_due_and_stops_at_events_waiting_for_backoff(t: TestDb) {
    // Three events of one aggregate go out as one run; a second aggregate fails once and then waits.
    let events = [event("o1", "a", 1), event("o1", "b", 2), event("o1", "c", 3), event("o2", "a", 4)];
    enqueue_committed(&t, &events).await;
    let broker = InMemoryPublisher::new();
    broker.fail_aggregate("o2", 1);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    let passes = relay.drain(10).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let published: u64 = passes.iter().map(|p| p.published).sum();
    assert_eq!(published, 3, "{t}: {passes:?}");
    assert_eq!(passes.len(), 1, "{t}: o1's run in one pass, then nothing due: {passes:?}");
    let stats = relay.store().stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(stats.pending, 1, "{t}: o2 waits for its backoff: {stats:?}");
}
per_backend!(drain_publishes_everything_due_and_stops_at_events_waiting_for_backoff, "relay_drain_stops_at_backoff");

async fn a_running_relay_publishes_new_events_and_stops_when_cancelled(t: TestDb) {
    let broker = InMemoryPublisher::new();
    let config = fast_config().with_poll_interval(Duration::from_millis(10));
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config).expect("config");
    let shutdown = outbox_seaorm::CancellationToken::new();
    let driver = async {
        for i in 0..3 {
            enqueue_committed(&t, &[event(&format!("o{i}"), "order.placed", i)]).await;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while broker.received_count() < 3 {
            assert!(std::time::Instant::now() < deadline, "{t}: the running relay did not publish");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
    };
    let stopped = tokio::time::timeout(Duration::from_secs(15), async {
        tokio::join!(relay.run(shutdown.clone()), driver);
    })
    .await;
    assert!(stopped.is_ok(), "{t}: run() did not return after cancel");
    assert_eq!(count_published(&t).await, 3, "{t}");
    assert_eq!(broker.received_count(), 3, "{t}");
}
per_backend!(a_running_relay_publishes_new_events_and_stops_when_cancelled, "relay_run_until_cancelled");

async fn a_full_batch_of_dead_failures_is_marked_despite_bind_limits(t: TestDb) {
    // 10 000 failures bind ~70 000 values when marked: over every backend's limit for one statement.
    const EVENTS: u64 = 10_000;
    let events: Vec<_> = (0..EVENTS).map(|i| event(&format!("o{i}"), "order.placed", i)).collect();
    enqueue_committed(&t, &events).await;
    let broker = InMemoryPublisher::new();
    broker.go_down_for(u32::MAX);
    let config = fast_config().with_batch_size(EVENTS as u32).with_max_attempts(1);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker, config).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.claimed, pass.dead), (EVENTS, EVENTS), "{t}: {pass:?}");
    let stats = relay.store().stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.pending, stats.dead, stats.max_attempts), (0, EVENTS, 1), "{t}: {stats:?}");
}
per_backend!(a_full_batch_of_dead_failures_is_marked_despite_bind_limits, "retry_max_batch_all_dead");

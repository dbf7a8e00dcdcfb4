//! A row the relay cannot decode (written by hand, by another tool, or by a future version) is set aside
//! as dead with a `last_error` saying what is wrong; every other aggregate keeps flowing.

use crate::common;

use std::time::Duration;

use common::{enqueue_committed, event, fast_config, outbox_row};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{ClaimMode, DeadLetterPolicy, EventId, InMemoryPublisher, Relay, SeaOrmStore};
use sea_orm::ConnectionTrait;

/// Overwrites one column of event `id`'s row with `value` (SQL text), as a hand-written fix would.
async fn corrupt(t: &TestDb, id: EventId, column: &str, value: &str) {
    let sql = format!("UPDATE outbox_events SET {column} = {value} WHERE event_id = '{id}'");
    t.db.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
}

struct Ids {
    /// Aggregate a1: its head's headers are a JSON array.
    a1: [EventId; 2],
    /// Aggregate a2: fine.
    a2: EventId,
    /// Aggregate a3: its second event's id is not a UUID.
    a3: [EventId; 3],
}

async fn enqueue_with_two_bad_rows(t: &TestDb) -> Ids {
    let events = [
        event("a1", "order.placed", 1),
        event("a1", "order.paid", 2),
        event("a2", "order.placed", 3),
        event("a3", "order.placed", 4),
        event("a3", "order.paid", 5),
        event("a3", "order.shipped", 6),
    ];
    enqueue_committed(t, &events).await;
    let ids = Ids {
        a1: [events[0].id(), events[1].id()],
        a2: events[2].id(),
        a3: [events[3].id(), events[4].id(), events[5].id()],
    };
    corrupt(t, ids.a1[0], "headers", "'[1, 2]'").await;
    corrupt(t, ids.a3[1], "event_id", "'not-a-uuid'").await;
    ids
}

/// The relay of `mode`/`policy`, drained; returns what the broker got, as event ids.
async fn drain(t: &TestDb, mode: ClaimMode, policy: DeadLetterPolicy) -> (Vec<EventId>, u64) {
    let broker = InMemoryPublisher::new();
    let config = fast_config().with_claim_mode(mode).with_dead_letters(policy);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config).expect("config");
    let mut dead = 0;
    for _ in 0..10 {
        let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: a bad row must not fail the pass: {e}"));
        dead += pass.dead;
        if pass.claimed == 0 && pass.dead == 0 {
            break;
        }
    }
    (broker.received().iter().map(|e| e.id).collect(), dead)
}

/// The `last_error` of event `id`, which must be dead (read without decoding the row's JSON columns).
async fn dead_error(t: &TestDb, id: EventId) -> String {
    let sql = format!("SELECT dead_at_ms, published_at_ms, last_error FROM outbox_events WHERE event_id = '{id}'");
    let row = t.db.query_one_raw(sea_orm::Statement::from_string(t.backend, sql)).await;
    let row = row.unwrap_or_else(|e| panic!("{t}: {e}")).unwrap_or_else(|| panic!("{t}: no row {id}"));
    let dead: Option<i64> = row.try_get("", "dead_at_ms").expect("dead_at_ms");
    let published: Option<i64> = row.try_get("", "published_at_ms").expect("published_at_ms");
    assert!(dead.is_some() && published.is_none(), "{t}: {id} is dead and unpublished");
    row.try_get::<Option<String>>("", "last_error").expect("last_error").unwrap_or_default()
}

async fn undecodable_rows_are_dead_and_block_only_their_aggregate(t: TestDb, mode: ClaimMode) {
    let ids = enqueue_with_two_bad_rows(&t).await;
    let (published, dead) = drain(&t, mode, DeadLetterPolicy::BlockAggregate).await;
    assert_eq!(published, vec![ids.a2, ids.a3[0]], "{t}: the other aggregates flowed, in order");
    assert_eq!(dead, 2, "{t}: the relay counted both rows it set aside");
    let error = dead_error(&t, ids.a1[0]).await;
    assert!(error.contains("undecodable row") && error.contains("headers"), "{t}: {error}");
    // a3's second event was not dead on the first pass (it was behind a3's head); it is now.
    let rows = common::outbox_rows(&t).await;
    let bad = rows.iter().find(|r| r.event_id == "not-a-uuid").expect("the row is still there");
    assert!(bad.dead_at_ms.is_some(), "{t}: {bad:?}");
    assert!(bad.last_error.as_deref().unwrap_or_default().contains("is not a UUID"), "{t}: {bad:?}");
    // Blocked behind them: a1's second and a3's third event, waiting for a replay.
    for id in [ids.a1[1], ids.a3[2]] {
        let row = outbox_row(&t, id).await;
        assert!(row.published_at_ms.is_none() && row.dead_at_ms.is_none(), "{t}: {row:?}");
    }
    let stats = SeaOrmStore::new(t.db.clone()).stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.dead, stats.pending), (2, 2), "{t}: {stats:?}");
}

async fn undecodable_rows_block_their_aggregate_in_transaction_mode(t: TestDb) {
    undecodable_rows_are_dead_and_block_only_their_aggregate(t, ClaimMode::Transaction).await;
}
per_backend!(undecodable_rows_block_their_aggregate_in_transaction_mode, "bad_rows_block_txn");

async fn undecodable_rows_block_their_aggregate_in_lease_mode(t: TestDb) {
    let lease = ClaimMode::Lease { duration: Duration::from_secs(60) };
    undecodable_rows_are_dead_and_block_only_their_aggregate(t, lease).await;
}
per_backend!(undecodable_rows_block_their_aggregate_in_lease_mode, "bad_rows_block_lease");

async fn under_skip_dead_the_aggregate_goes_on_past_an_undecodable_row(t: TestDb) {
    let ids = enqueue_with_two_bad_rows(&t).await;
    let (published, _) = drain(&t, ClaimMode::Transaction, DeadLetterPolicy::SkipDead).await;
    for id in [ids.a1[1], ids.a2, ids.a3[0], ids.a3[2]] {
        assert!(published.contains(&id), "{t}: {id} was published: {published:?}");
    }
    assert_eq!(published.len(), 4, "{t}: {published:?}");
    assert!(dead_error(&t, ids.a1[0]).await.contains("headers"), "{t}");
}
per_backend!(under_skip_dead_the_aggregate_goes_on_past_an_undecodable_row, "bad_rows_skip");

async fn a_payload_that_is_not_json_is_set_aside_on_sqlite(t: TestDb) {
    if t.backend != sea_orm::DbBackend::Sqlite {
        return; // PostgreSQL's jsonb and MySQL's JSON columns refuse such a payload on write.
    }
    let bad = event("b1", "order.placed", 1);
    let good = event("b2", "order.placed", 2);
    enqueue_committed(&t, &[bad.clone(), good.clone()]).await;
    corrupt(&t, bad.id(), "payload", "'{oops'").await;
    let (published, dead) = drain(&t, ClaimMode::Transaction, DeadLetterPolicy::BlockAggregate).await;
    assert_eq!((published, dead), (vec![good.id()], 1), "{t}");
    assert!(dead_error(&t, bad.id()).await.contains("not valid JSON"), "{t}");
}
per_backend!(a_payload_that_is_not_json_is_set_aside_on_sqlite, "bad_rows_payload");

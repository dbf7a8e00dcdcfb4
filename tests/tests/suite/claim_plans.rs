//! The claim's plans cannot go wrong on stale statistics: after an `ANALYZE` taken while nothing was pending
//! (what autovacuum does after a quiet hour), a burst is claimed through `outbox_events_runs`, the index
//! its per-aggregate probes match, and never by walking every pending row for each aggregate.

use crate::common;

use common::{count_published, enqueue_committed, event, fast_config};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::ClaimPlan;
use outbox_seaorm::{DeadLetterPolicy, InMemoryPublisher, NewEvent, Relay, SeaOrmStore};
use sea_orm::{ConnectionTrait, DbBackend};

const AGGREGATES: u64 = 200;

/// `per_aggregate` events for each aggregate, `round` telling them apart.
fn events(round: u64, per_aggregate: u64) -> Vec<NewEvent> {
    (0..AGGREGATES * per_aggregate)
        .map(|i| event(&format!("a{}", i % AGGREGATES), "step", round * 1_000_000 + i))
        .collect()
}

/// A quiet outbox: 20,000 published rows over 200 aggregates, nothing pending, statistics taken now.
async fn quiet_and_analyzed(t: &TestDb) {
    for chunk in events(0, 100).chunks(1000) {
        enqueue_committed(t, chunk).await;
    }
    for sql in ["UPDATE outbox_events SET published_at_ms = 1", "UPDATE outbox_aggregates SET due_at_ms = NULL"] {
        t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
    }
    let analyze: &[&str] = match t.backend {
        DbBackend::Postgres => &["VACUUM ANALYZE outbox_events", "VACUUM ANALYZE outbox_aggregates"],
        DbBackend::MySql => &["ANALYZE TABLE outbox_events", "ANALYZE TABLE outbox_aggregates"],
        _ => &["ANALYZE"],
    };
    for sql in analyze {
        t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
    }
}

async fn plans(t: &TestDb) -> Vec<ClaimPlan> {
    let store = SeaOrmStore::new(t.db.clone());
    store.claim_plans(1000, DeadLetterPolicy::BlockAggregate).await.unwrap_or_else(|e| panic!("{t}: {e}"))
}

async fn a_burst_after_a_quiet_analyze_is_claimed_through_the_runs_index(t: TestDb) {
    quiet_and_analyzed(&t).await;
    // The burst: 10 events per aggregate, which the statistics do not know about.
    enqueue_committed(&t, &events(1, 10)).await;

    let plans = plans(&t).await;
    let statements: Vec<&str> = plans.iter().map(|p| p.statement).collect();
    // The statements a relay runs: on MariaDB a plain read of the runs' keys, then their lock by key.
    let expected: &[&str] = match t.backend {
        DbBackend::MySql => &["candidates", "runs", "locks"],
        _ => &["candidates", "runs"],
    };
    assert_eq!(statements, expected, "{t}: {plans:#?}");
    for plan in &plans {
        let text = plan.plan.join("\n");
        assert!(
            !text.contains("outbox_events_pending"),
            "{t}: {} probes through the pending index:\n{text}",
            plan.statement
        );
    }
    if t.backend == DbBackend::Postgres {
        // The head of each aggregate is found in `outbox_events_runs`, never by filtering pending rows.
        let candidates = plans[0].plan.join("\n");
        assert!(candidates.contains("outbox_events_runs"), "{t}:\n{candidates}");
        assert!(!candidates.contains("Filter: (((aggregate_type)"), "{t}:\n{candidates}");
    }

    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), fast_config()).expect("config");
    loop {
        let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        if pass.claimed == 0 {
            break;
        }
    }
    assert_eq!(count_published(&t).await, AGGREGATES * 110, "{t}: the burst drained");
}
per_backend!(a_burst_after_a_quiet_analyze_is_claimed_through_the_runs_index, "claim_plans_burst");

async fn the_plans_of_an_empty_outbox_are_readable(t: TestDb) {
    let plans = plans(&t).await;
    assert_eq!(plans.len(), 1, "{t}: no candidate, so no runs to explain: {plans:#?}");
    assert!(!plans[0].plan.is_empty(), "{t}: {plans:#?}");
    enqueue_committed(&t, &[event("o1", "placed", 1)]).await;
    assert!(self::plans(&t).await.len() >= 2, "{t}");
}
per_backend!(the_plans_of_an_empty_outbox_are_readable, "claim_plans_empty");

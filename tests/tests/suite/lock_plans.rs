//! Every statement that writes or locks rows by key locks only the rows it names, whatever the table's
//! size: on MariaDB/MySQL, which in REPEATABLE READ locks every row a statement reads, each reads its keys
//! as ranges of the primary key, never by scanning it, on an empty outbox and on a small one (where a scan
//! looks cheapest), with a full statement's worth of keys. PostgreSQL and SQLite lock only what a
//! statement writes or returns, so there a scan costs time, never locks: their plans are only read.

use crate::common;

use common::{enqueue_committed, event};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::ClaimPlan;
use outbox_seaorm::{DeadLetterPolicy, SeaOrmStore};
use sea_orm::{ConnectionTrait, DbBackend};

/// The MySQL plan lines that read a table otherwise than by key ranges: a scan (`ALL`), a full index
/// scan (`index`), or the join with a derived table that a long `IN` list becomes.
fn scans(plan: &ClaimPlan) -> Vec<&String> {
    plan.plan
        .iter()
        .filter(|line| line.contains("type=ALL") || line.contains("type=index ") || line.contains("table=<derived"))
        .collect()
}

async fn check(t: &TestDb, when: &str) {
    let store = SeaOrmStore::new(t.db.clone());
    let mut plans = store.lock_plans().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    plans.extend(
        store
            .claim_plans(1000, DeadLetterPolicy::BlockAggregate)
            .await
            .unwrap_or_else(|e| panic!("{t}: {e}"))
            .into_iter()
            .filter(|plan| plan.statement == "locks"),
    );
    let names: Vec<&str> = plans.iter().map(|p| p.statement).collect();
    for expected in ["mark", "mark failed, release, lease, set aside", "fence", "hints", "rearm"] {
        assert!(names.contains(&expected), "{t}: {when}: no plan for {expected}: {names:?}");
    }
    for plan in &plans {
        assert!(!plan.plan.is_empty(), "{t}: {when}: {} has no plan", plan.statement);
        if t.backend == DbBackend::MySql {
            let text = plan.plan.join("\n");
            assert!(
                scans(plan).is_empty(),
                "{t}: {when}: {} scans instead of reading its keys:\n{text}",
                plan.statement
            );
            assert!(
                text.contains("key=PRIMARY"),
                "{t}: {when}: {} does not read the primary key:\n{text}",
                plan.statement
            );
        }
    }
    if t.backend == DbBackend::MySql {
        assert!(names.contains(&"cleanup"), "{t}: {when}: {names:?}");
        assert!(names.contains(&"locks"), "{t}: {when}: the claim's lock by key was not explained: {names:?}");
    }
}

async fn statements_by_key_never_scan_an_empty_or_small_outbox(t: TestDb) {
    for sql in ["ANALYZE TABLE outbox_events", "ANALYZE TABLE outbox_aggregates"] {
        if t.backend == DbBackend::MySql {
            t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
        }
    }
    // The claim's lock is only explained when there is something to claim.
    enqueue_committed(&t, &[event("o1", "placed", 1)]).await;
    check(&t, "one row").await;
    let small: Vec<_> = (0..20).map(|i| event(&format!("o{}", i % 5), "placed", i)).collect();
    enqueue_committed(&t, &small).await;
    if t.backend == DbBackend::MySql {
        t.db.execute_unprepared("ANALYZE TABLE outbox_events").await.unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    check(&t, "21 rows, analyzed").await;
}
per_backend!(statements_by_key_never_scan_an_empty_or_small_outbox, "lock_plans");

//! A partitioned outbox (PostgreSQL): the relay claims and marks across partitions as it does on one
//! table, cleanup drops a partition only when every row in it is published, and a relay keeps publishing,
//! losing nothing, while a partition is dropped under it. The other backends refuse the option.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::{assert_per_aggregate_order, count_outbox, count_unpublished, enqueue_committed, event, fast_config};
use outbox_integration_tests::{Backend, TestDb, run_on};
use outbox_seaorm::partition::{self, PartitionInterval};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{DeadLetterPolicy, Error, InMemoryPublisher, NewEvent, Relay, SeaOrmStore};
use sea_orm::{ConnectionTrait, Statement};

const HOUR_MS: i64 = 3_600_000;

async fn exec(t: &TestDb, sql: &str) -> u64 {
    t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}")).rows_affected()
}

async fn scalar(t: &TestDb, sql: &str) -> i64 {
    let row = t.db.query_one_raw(Statement::from_string(t.backend, sql)).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    row.expect("a row").try_get("", "v").unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn partition_names(t: &TestDb) -> Vec<String> {
    partition::partitions(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}")).into_iter().map(|p| p.name).collect()
}

/// Moves the rows `filter` selects `hours` later in creation time, so into another partition (PostgreSQL
/// moves a row whose partition key changes).
async fn shift_hours(t: &TestDb, filter: &str, hours: i64) {
    exec(t, &format!("UPDATE outbox_events SET created_at_ms = created_at_ms + {} WHERE {filter}", hours * HOUR_MS))
        .await;
}

/// Runs relay passes until one publishes nothing; returns how many were published.
async fn drain(relay: &Relay<SeaOrmStore, InMemoryPublisher>) -> u64 {
    let mut total = 0;
    loop {
        let pass = relay.run_once().await.expect("relay pass");
        total += pass.published;
        if pass.published == 0 && pass.failed == 0 {
            return total;
        }
    }
}

fn events(prefix: &str, aggregates: u64, per_aggregate: u64) -> Vec<NewEvent> {
    (0..aggregates * per_aggregate).map(|i| event(&format!("{prefix}{}", i % aggregates), "step", i)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_backends_refuse_a_partitioned_outbox_and_keep_their_table() {
    for backend in [Backend::Sqlite, Backend::MySql] {
        run_on(backend, "partition_refused", |t| async move {
            match partition::partition_outbox(&t.db, PartitionInterval::Day).await {
                Err(Error::InvalidConfig { reason, .. }) => {
                    assert!(reason.contains("needs PostgreSQL"), "{t}: {reason}");
                }
                other => panic!("{t}: expected a clear refusal, got {other:?}"),
            }
            enqueue_committed(&t, &[event("a", "t", 1)]).await;
            assert_eq!(count_unpublished(&t).await, 1, "{t}: the table still takes events");
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_aggregate_is_published_in_version_order_across_partition_boundaries() {
    run_on(Backend::Postgres, "partition_order", |t| async move {
        outbox_seaorm::notify::install_notify_trigger(&t.db, &Default::default()).await.expect("notify trigger");
        assert!(partition::partition_outbox(&t.db, PartitionInterval::Hour).await.expect("partition"));
        assert!(!partition::partition_outbox(&t.db, PartitionInterval::Hour).await.expect("again"), "idempotent");
        let triggers = scalar(
            &t,
            "SELECT COUNT(*) AS v FROM pg_trigger WHERE tgrelid = to_regclass('outbox_events') AND NOT tgisinternal",
        )
        .await;
        assert_eq!(triggers, 2, "{t}: the numbering and notify triggers are carried over");

        enqueue_committed(&t, &events("a", 50, 6)).await;
        // Versions 1, 4 stay in this hour's partition, 2, 5 move an hour on and 3, 6 two: each aggregate's
        // run crosses partition boundaries both ways.
        shift_hours(&t, "aggregate_version % 3 = 2", 1).await;
        shift_hours(&t, "aggregate_version % 3 = 0", 2).await;
        assert_eq!(scalar(&t, "SELECT COUNT(DISTINCT tableoid)::bigint AS v FROM outbox_events").await, 3, "{t}");

        let broker = InMemoryPublisher::new();
        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config().with_batch_size(37))
            .expect("config");
        assert_eq!(drain(&relay).await, 300, "{t}");
        let received = broker.received();
        assert_eq!(received.len(), 300, "{t}: each event once");
        assert_per_aggregate_order(&received, &t);
        assert_eq!(count_unpublished(&t).await, 0, "{t}");

        // Statistics taken with nothing pending, then a burst: the claim still finds rows by key, and never
        // by a range of creation times (the condition that skips partitions has no index of its own).
        exec(&t, "ANALYZE outbox_events").await;
        enqueue_committed(&t, &events("b", 50, 4)).await;
        let store = SeaOrmStore::new(t.db.clone());
        let plans = store.claim_plans(1000, DeadLetterPolicy::BlockAggregate).await.expect("plans");
        for plan in &plans {
            let by_time = plan.plan.iter().find(|line| line.contains("Index Cond") && line.contains("created_at_ms"));
            assert!(by_time.is_none(), "{t}: {} looks rows up by creation time: {:#?}", plan.statement, plan.plan);
        }
        assert_eq!(drain(&relay).await, 200, "{t}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_drops_a_partition_only_when_every_row_in_it_is_published() {
    run_on(Backend::Postgres, "partition_cleanup", |t| async move {
        partition::partition_outbox(&t.db, PartitionInterval::Hour).await.expect("partition");
        let store = SeaOrmStore::new(t.db.clone());
        let first = partition_names(&t).await;
        // 10 rows in this hour's partition, 10 in the next, 10 in the one after: all published.
        enqueue_committed(&t, &events("e", 30, 1)).await;
        shift_hours(&t, "aggregate_id IN ('e1','e4','e7','e10','e13','e16','e19','e22','e25','e28')", 1).await;
        shift_hours(&t, "aggregate_id IN ('e2','e5','e8','e11','e14','e17','e20','e23','e26','e29')", 2).await;
        let broker = InMemoryPublisher::new();
        broker.fail_aggregate("doomed", 100);
        let relay = Relay::new(store.clone(), broker, fast_config().with_max_attempts(1)).expect("config");
        // A dead row in the partition after next, then a pending one in the next.
        enqueue_committed(&t, &[event("doomed", "t", 1)]).await;
        shift_hours(&t, "aggregate_id = 'doomed'", 2).await;
        assert_eq!(drain(&relay).await, 30, "{t}");
        enqueue_committed(&t, &[event("late", "t", 1)]).await;
        shift_hours(&t, "aggregate_id = 'late'", 1).await;
        assert_eq!((count_outbox(&t).await, count_unpublished(&t).await), (32, 2), "{t}");

        // Four hours on, with no retention, this hour's partition and the next three are past it.
        let later = chrono::Utc::now() + chrono::Duration::hours(4);
        let removed = store.cleanup(later, Duration::ZERO, 100).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(removed, 10, "{t}: this hour's 10 published rows, and the empty partition 3 hours on");
        let left = partition_names(&t).await;
        assert!(!left.contains(&first[0]), "{t}: {} is dropped: {left:?}", first[0]);
        assert!(left.contains(&first[1]) && left.contains(&first[2]), "{t}: kept for the pending and the dead row");
        assert!(!left.contains(&first[3]), "{t}: the empty partition is dropped: {left:?}");
        assert_eq!((count_outbox(&t).await, count_unpublished(&t).await), (22, 2), "{t}");

        // The service's cleanup made the partitions four hours on and after, and says why it kept two.
        let report =
            partition::maintain(&t.db, later, Duration::ZERO, 100).await.expect("maintain").expect("partitioned");
        let kept: Vec<&str> = report.kept.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(kept, [first[1].as_str(), first[2].as_str()], "{t}: {report:?}");
        assert!(report.kept.iter().all(|(_, why)| why.contains("1 unpublished row")), "{t}: {report:?}");
        assert!(report.created.is_empty() && report.dropped.is_empty(), "{t}: nothing left to do: {report:?}");

        // Once the pending row is published, its partition goes; the dead row's stays.
        assert_eq!(drain(&relay).await, 1, "{t}");
        assert_eq!(store.cleanup(later, Duration::ZERO, 100).await.expect("cleanup"), 11, "{t}");
        let left = partition_names(&t).await;
        assert!(!left.contains(&first[1]) && left.contains(&first[2]), "{t}: {left:?}");
        assert_eq!((count_outbox(&t).await, count_unpublished(&t).await), (11, 1), "{t}: the dead row is kept");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_no_partition_covers_waits_in_the_default_partition_and_moves_when_its_own_is_made() {
    run_on(Backend::Postgres, "partition_default", |t| async move {
        partition::partition_outbox(&t.db, PartitionInterval::Hour).await.expect("partition");
        enqueue_committed(&t, &events("x", 1, 3)).await;
        // Version 2 was written by a clock ten hours fast: no partition covers it yet.
        shift_hours(&t, "aggregate_version = 2", 10).await;
        let in_default = "SELECT COUNT(*) AS v FROM outbox_events_default";
        assert_eq!(scalar(&t, in_default).await, 1, "{t}");

        let later = chrono::Utc::now() + chrono::Duration::hours(10);
        let report = partition::maintain(&t.db, later, Duration::from_secs(86_400), 100).await.expect("maintain");
        let report = report.expect("partitioned");
        assert_eq!((report.moved_from_default, report.created.len()), (1, 4), "{t}: {report:?}");
        assert_eq!(scalar(&t, in_default).await, 0, "{t}");

        let broker = InMemoryPublisher::new();
        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
        assert_eq!(drain(&relay).await, 3, "{t}: nothing is lost on the way");
        assert_per_aggregate_order(&broker.received(), &t);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_keeps_publishing_every_event_once_while_a_partition_is_dropped() {
    run_on(Backend::Postgres, "partition_drop_live", |t| async move {
        // 5,000 rows published two days ago, then the table is partitioned: they fill the first partition.
        let old_broker = InMemoryPublisher::new();
        let old = Relay::new(SeaOrmStore::new(t.db.clone()), old_broker, fast_config()).expect("config");
        for chunk in events("old", 100, 50).chunks(1000) {
            enqueue_committed(&t, chunk).await;
        }
        assert_eq!(drain(&old).await, 5000, "{t}");
        exec(&t, &format!("UPDATE outbox_events SET created_at_ms = created_at_ms - {}", 48 * HOUR_MS)).await;
        partition::partition_outbox(&t.db, PartitionInterval::Hour).await.expect("partition");
        let archive = partition_names(&t).await.remove(0);
        assert!(archive.starts_with("outbox_events_p_before_"), "{t}: {archive}");

        // Writers and a relay at work while the cleanup drops the old partition.
        const WRITTEN: u64 = 10_000;
        let writer = {
            let t = TestDb { db: t.db.clone(), backend: t.backend, url: t.url.clone() };
            tokio::spawn(async move {
                for chunk in events("w", 100, WRITTEN / 100).chunks(50) {
                    enqueue_committed(&t, chunk).await;
                }
            })
        };
        let broker = InMemoryPublisher::new();
        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config().with_batch_size(200))
            .expect("config");
        let relaying = tokio::spawn(tokio::time::timeout(Duration::from_secs(600), async move {
            let mut published = 0;
            while published < WRITTEN {
                published += relay.run_once().await.expect("relay pass").published;
            }
            published
        }));
        let store = SeaOrmStore::new(t.db.clone());
        let mut dropped = 0;
        for _ in 0..600 {
            dropped += store.cleanup(chrono::Utc::now(), Duration::ZERO, 1000).await.expect("cleanup");
            if !partition_names(&t).await.contains(&archive) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!partition_names(&t).await.contains(&archive), "{t}: the old partition is never dropped");
        assert!(!relaying.is_finished(), "{t}: the partition was dropped only after the relay was done");
        assert!(dropped >= 5000, "{t}: dropped {dropped}");
        writer.await.expect("writer");
        let published = relaying.await.expect("relay").unwrap_or_else(|_| panic!("{t}: the relay stalled"));
        assert_eq!(published, WRITTEN, "{t}");

        let received = broker.received();
        let ids: HashSet<_> = received.iter().map(|e| e.id).collect();
        assert_eq!((received.len(), ids.len()), (WRITTEN as usize, WRITTEN as usize), "{t}: every event once");
        assert_per_aggregate_order(&received, &t);
        assert_eq!((count_outbox(&t).await, count_unpublished(&t).await), (WRITTEN, 0), "{t}");
    })
    .await;
}

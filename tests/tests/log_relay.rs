//! The log relay (`outbox_seaorm::log`) on a real PostgreSQL cluster with `wal_level = logical`
//! (`.ci/pg-logical.sh`): rows committed before the relay's slot existed are published by the catch-up,
//! rows committed after arrive from the log in commit order, each once, and the table records them
//! published; setup problems are typed errors that say what to run.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{assert_per_aggregate_order, count_published, enqueue_committed, event};
use outbox_integration_tests::{TestDb, logical, run_suffix};
use outbox_seaorm::log::{self, LogError, LogRelay, LogRelayConfig, SetupProblem};
use outbox_seaorm::{CancellationToken, InMemoryPublisher, OutboxEvent, Publisher};
use sea_orm::ConnectionTrait;

/// A relay running in this process, stopped (and its slot dropped) by [`Running::stop`].
struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), LogError>>,
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        match tokio::time::timeout(Duration::from_secs(60), self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => panic!("the log relay failed: {error}"),
            Ok(Err(panic)) => panic!("the log relay panicked: {panic}"),
            Err(_) => panic!("the log relay did not stop within 60 s of its shutdown"),
        }
    }
}

/// Settings with a slot and publication of this test's own (the cluster is shared by the tests).
fn config_for(tag: &str) -> LogRelayConfig {
    let suffix = run_suffix();
    LogRelayConfig::default()
        .with_slot(format!("s_{tag}_{suffix}"))
        .and_then(|c| c.with_publication(format!("p_{tag}_{suffix}")))
        .expect("valid names")
}

fn start<P: Publisher + 'static>(t: &TestDb, publisher: P, config: LogRelayConfig) -> Running {
    let relay = LogRelay::new(t.db.clone(), &t.url, publisher, config).expect("valid settings");
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move { relay.run(stop).await });
    Running { shutdown, task }
}

/// Waits until `publisher` has received `n` distinct events, failing after 120 s with what it has.
async fn wait_for_distinct(publisher: &InMemoryPublisher, n: usize, t: &TestDb) -> Vec<OutboxEvent> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let received = publisher.received();
        let distinct: HashSet<_> = received.iter().map(|e| e.id).collect();
        if distinct.len() >= n {
            return received;
        }
        assert!(tokio::time::Instant::now() < deadline, "{t}: {} of {n} events arrived within 120 s", distinct.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_published_rows(t: &TestDb, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let published = count_published(t).await;
        if published >= n {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{t}: {published} of {n} rows marked published within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn drop_slot(t: &TestDb, config: &LogRelayConfig) {
    log::drop_slot(&t.db, config.slot()).await.unwrap_or_else(|e| panic!("{t}: drop the slot: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_before_the_slot_are_caught_up_and_rows_after_arrive_in_commit_order_once() {
    let Some(t) = logical("log_order").await else { return };
    let config = config_for("order");
    log::create_publication(&t.db, &config).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    // Committed before the relay ever ran: only the catch-up from the table can publish them.
    let before: Vec<_> = (0..30).map(|n| event(&format!("early-{}", n % 3), "order.placed", n)).collect();
    enqueue_committed(&t, &before).await;

    let publisher = InMemoryPublisher::new();
    let running = start(&t, publisher.clone(), config.clone());
    wait_for_distinct(&publisher, 30, &t).await;

    // One writer, so the commit order is the order of these transactions: 200 of them, 3 events each,
    // over 11 aggregates interleaved.
    let mut committed = Vec::new();
    for i in 0..200u64 {
        let events: Vec<_> = (0..3u64).map(|k| event(&format!("agg-{}", (i * 3 + k) % 11), "order.placed", i * 3 + k)).collect();
        let txn = sea_orm::TransactionTrait::begin(&t.db).await.expect("begin");
        let ids = outbox_seaorm::enqueue_all(&txn, &events).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        txn.commit().await.expect("commit");
        committed.extend(ids);
    }
    let received = wait_for_distinct(&publisher, 30 + 600, &t).await;
    assert_eq!(received.len(), 630, "{t}: each event once, no duplicate without a fault");
    let after: Vec<_> = received.iter().skip(30).map(|e| e.id).collect();
    assert_eq!(after, committed, "{t}: the log's events arrive in commit order");
    assert_per_aggregate_order(&received, &t);

    wait_for_published_rows(&t, 630).await;
    let slot = log::slot_state(&t.db, config.slot()).await.expect("slot").expect("the relay created its slot");
    assert!(slot.active, "{t}: the relay reads its slot");
    running.stop().await;
    drop_slot(&t, &config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_problems_are_typed_errors_that_say_what_to_run() {
    let Some(t) = logical("log_setup").await else { return };
    let config = config_for("setup");
    let error = log::check(&t.db, &config).await.expect_err("no publication yet");
    match &error {
        LogError::Setup(SetupProblem::PublicationMissing { name, sql }) => {
            assert_eq!(name, config.publication());
            assert!(sql.starts_with("CREATE PUBLICATION"), "{sql}");
        }
        other => panic!("{t}: expected PublicationMissing, got {other}"),
    }
    assert!(error.to_string().contains("create_publication"), "{error}");

    // A publication of another table does not cover the outbox.
    t.db.execute_unprepared("CREATE TABLE other_table (id int primary key)").await.expect("table");
    t.db.execute_unprepared(&format!("CREATE PUBLICATION \"{}\" FOR TABLE other_table", config.publication()))
        .await
        .expect("publication");
    match log::check(&t.db, &config).await {
        Err(LogError::Setup(SetupProblem::PublicationDoesNotCover { sql, .. })) => {
            assert!(sql.contains("ADD TABLE outbox_events"), "{sql}")
        }
        other => panic!("{t}: expected PublicationDoesNotCover, got {other:?}"),
    }
    t.db.execute_unprepared(&format!("DROP PUBLICATION \"{}\"", config.publication())).await.expect("drop");
    log::create_publication(&t.db, &config).await.expect("create");
    log::check(&t.db, &config).await.unwrap_or_else(|e| panic!("{t}: set up, yet {e}"));

    // A role without REPLICATION.
    let role = format!("norepl_{}", run_suffix());
    t.db.execute_unprepared(&format!("CREATE ROLE {role} LOGIN")).await.expect("role");
    let url = t.url.replacen("postgres@", &format!("{role}@"), 1);
    let other = TestDb::open(&url).await;
    match log::check(&other.db, &config).await {
        Err(LogError::Setup(SetupProblem::NoReplicationRole { role: found })) => assert_eq!(found, role),
        other => panic!("{t}: expected NoReplicationRole, got {other:?}"),
    }
    other.db.close().await.ok();
    t.db.execute_unprepared(&format!("DROP ROLE {role}")).await.expect("drop role");

    // The shared server keeps wal_level = replica.
    let replica = std::env::var("OUTBOX_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if let Ok(db) = outbox_seaorm::connect(&replica).await {
        match log::check(&db, &config).await {
            Err(LogError::Setup(SetupProblem::WalLevel { found })) => {
                assert_eq!(found, "replica");
                let text = LogError::Setup(SetupProblem::WalLevel { found }).to_string();
                assert!(text.contains("ALTER SYSTEM SET wal_level = logical"), "{text}");
            }
            other => panic!("expected WalLevel on the shared server, got {other:?}"),
        }
    }
}

//! The log relay (`outbox_seaorm::log`) on a real PostgreSQL cluster with `wal_level = logical`
//! (`.ci/pg-logical.sh`): rows committed before the relay's slot existed are published by the catch-up,
//! rows committed after arrive from the log in commit order, each once, and the table records them
//! published; setup problems are typed errors that say what to run.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use std::process::{Child, Command, Stdio};

use common::{assert_per_aggregate_order, broker_of, count_published, enqueue_committed, event};
use outbox_integration_tests::{TestDb, logical, run_suffix};
use outbox_seaorm::log::{self, LogError, LogRelay, LogRelayConfig, SetupProblem};
use outbox_seaorm::{CancellationToken, EventId, InMemoryPublisher, OutboxEvent, Publisher};
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

/// `0/16B3748` as a number.
fn lsn(text: &str) -> u64 {
    let (high, low) = text.split_once('/').expect("an LSN");
    (u64::from_str_radix(high, 16).expect("hex") << 32) | u64::from_str_radix(low, 16).expect("hex")
}

/// The server's current WAL write position.
async fn wal_position(t: &TestDb) -> u64 {
    let sql = "SELECT pg_current_wal_lsn()::text";
    let row =
        t.db.query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, sql)).await.expect("lsn");
    lsn(&row.expect("a row").try_get_by_index::<String>(0).expect("text"))
}

/// Waits (up to 120 s) until the slot's confirmed position passes the server's WAL position now, with a
/// relay reading it: the server heard that everything written so far is done (`while` says when).
async fn wait_until_confirmed_past_now(t: &TestDb, config: &LogRelayConfig, while_: &str) {
    let written = wal_position(t).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let slot = log::slot_state(&t.db, config.slot()).await.expect("slot").expect("the relay created its slot");
        assert!(slot.active, "{t}: the relay reads its slot");
        let confirmed = slot.confirmed_flush_lsn.as_deref().map(lsn).unwrap_or_default();
        if confirmed >= written {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{t}: the slot's confirmed position stayed at {confirmed:x}, before {written:x}, while {while_}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Drops the test's slot once no relay reads it (a killed relay's server process ends a moment later).
async fn drop_slot(t: &TestDb, config: &LogRelayConfig) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match log::drop_slot(&t.db, config.slot()).await {
            Ok(_) => return,
            Err(error) if error.to_string().contains("is active") && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("{t}: drop the slot: {error}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_before_the_slot_are_caught_up_and_rows_after_arrive_in_commit_order_once() {
    outbox_integration_tests::log_to_test_output();
    let Some(t) = logical("log_order").await else { return };
    let config = config_for("order");
    log::create_publication(&t.db, &config).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    // Committed before the relay ever ran: only the catch-up from the table can publish them.
    let before: Vec<_> = (0..30).map(|n| event(&format!("early-{}", n % 3), "order.placed", n)).collect();
    enqueue_committed(&t, &before).await;

    let publisher = InMemoryPublisher::new();
    let running = start(&t, publisher.clone(), config.clone());
    wait_for_distinct(&publisher, 30, &t).await;
    // Reading the log: what commits from now on comes from it (a transaction committed while the
    // catch-up still runs may come from both, a duplicate the inbox absorbs).
    reader_of(&t, &config, None).await;

    // One writer, so the commit order is the order of these transactions: 200 of them, 3 events each,
    // over 11 aggregates interleaved.
    let mut committed = Vec::new();
    for i in 0..200u64 {
        let events: Vec<_> =
            (0..3u64).map(|k| event(&format!("agg-{}", (i * 3 + k) % 11), "order.placed", i * 3 + k)).collect();
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
    // The server hears the confirmed position: the slot keeps nothing the relay has published.
    wait_until_confirmed_past_now(&t, &config, "the relay published everything").await;
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
    let replica =
        std::env::var("OUTBOX_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
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

const ROLE: &str = "OUTBOX_LOG_ROLE";
const URL: &str = "OUTBOX_LOG_URL";
const SLOT: &str = "OUTBOX_LOG_SLOT";

/// The child side: a log relay publishing to the test's broker file until killed. Not a test of its own:
/// it does nothing unless the parent set [`ROLE`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process() {
    let (Ok(_role), Ok(url), Ok(tag)) = (std::env::var(ROLE), std::env::var(URL), std::env::var(SLOT)) else { return };
    let t = TestDb::open(&url).await;
    let mut config = LogRelayConfig::default()
        .with_slot(format!("s_{tag}"))
        .and_then(|c| c.with_publication(format!("p_{tag}")))
        .expect("valid names");
    // The server hears the confirmed position often, so a relay killed soon after starting has moved it.
    config.status_interval = Duration::from_millis(100);
    let relay = LogRelay::new(t.db.clone(), &t.url, broker_of(&t), config).expect("settings");
    relay.run(CancellationToken::new()).await.expect("the relay runs until killed");
}

/// A log relay in a child process (this test binary re-run in the child role).
fn spawn_relay(t: &TestDb, config: &LogRelayConfig) -> Child {
    let tag = config.slot().trim_start_matches("s_").to_owned();
    Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "log_relay::child_process", "--nocapture", "--test-threads", "1"])
        .env(ROLE, "relay")
        .env(URL, &t.url)
        .env(SLOT, tag)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child")
}

/// The pid of the walsender that streams the slot to a relay, once one does (waits up to 60 s): the relay
/// has caught up from the table and reads the log.
async fn reader_of(t: &TestDb, config: &LogRelayConfig, not: Option<i32>) -> i32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        // A walsender, not the backend still creating the slot (which shows it active too, before the
        // relay's catch-up from the table).
        let sql = format!(
            "SELECT s.active_pid FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid \
             WHERE s.slot_name = '{}' AND s.active AND a.backend_type = 'walsender'",
            config.slot()
        );
        let row =
            t.db.query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, sql))
                .await
                .expect("slots");
        if let Some(pid) = row.and_then(|row| row.try_get_by_index::<i32>(0).ok())
            && Some(pid) != not
        {
            return pid;
        }
        assert!(tokio::time::Instant::now() < deadline, "{t}: no relay read the slot within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kill(child: &mut Child) {
    child.kill().expect("SIGKILL the relay");
    child.wait().expect("reap the relay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_five_times_in_a_20k_drain_loses_nothing_and_keeps_commit_order() {
    let Some(t) = logical("log_kill").await else { return };
    let config = config_for("kill");
    log::create_publication(&t.db, &config).await.expect("publication");
    let broker = broker_of(&t);
    let _ = std::fs::remove_file(&broker.path);
    let mut relay = spawn_relay(&t, &config);
    reader_of(&t, &config, None).await;

    // One writer: 400 transactions of 50 events over 200 aggregates; the commit order is this order.
    let writer = {
        let db = t.db.clone();
        tokio::spawn(async move {
            let mut committed: Vec<EventId> = Vec::new();
            for i in 0..400u64 {
                let events: Vec<_> = (0..50u64)
                    .map(|k| event(&format!("k-{}", (i * 50 + k) % 200), "order.placed", i * 50 + k))
                    .collect();
                let txn = sea_orm::TransactionTrait::begin(&db).await.expect("begin");
                committed.extend(outbox_seaorm::enqueue_all(&txn, &events).await.expect("enqueue"));
                txn.commit().await.expect("commit");
            }
            committed
        })
    };
    // SIGKILL the relay each time another 1,500 events arrived for the first time, restarting it at once.
    let mut kills_at = Vec::new();
    let mut distinct_at_kill = 0;
    loop {
        let deliveries = broker.deliveries();
        let distinct = deliveries.iter().map(|(id, _)| *id).collect::<HashSet<_>>().len();
        if distinct >= 20_000 {
            break;
        }
        if distinct >= distinct_at_kill + 1500 {
            kill(&mut relay);
            kills_at.push(broker.deliveries().len());
            distinct_at_kill = distinct;
            relay = spawn_relay(&t, &config);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let committed = writer.await.expect("the writer");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let deliveries = loop {
        let deliveries = broker.deliveries();
        let distinct: HashSet<EventId> = deliveries.iter().map(|(id, _)| *id).collect();
        if distinct.len() >= committed.len() {
            break deliveries;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{t}: {} of {} events delivered",
            distinct.len(),
            committed.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    wait_for_published_rows(&t, committed.len() as u64).await;
    kill(&mut relay);

    assert!(kills_at.len() >= 5, "{t}: the relay was killed {} times (at deliveries {kills_at:?})", kills_at.len());
    let mut seen = HashSet::new();
    let mut first_deliveries = Vec::new();
    let mut duplicates = 0;
    for (position, (id, _)) in deliveries.iter().enumerate() {
        if seen.insert(*id) {
            first_deliveries.push(*id);
        } else {
            duplicates += 1;
            assert!(
                position >= kills_at[0],
                "{t}: a duplicate at delivery {position}, before the first kill at {}",
                kills_at[0]
            );
        }
    }
    let delivered: HashSet<EventId> = first_deliveries.iter().copied().collect();
    let lost: Vec<usize> =
        committed.iter().enumerate().filter(|(_, id)| !delivered.contains(id)).map(|(i, _)| i).collect();
    assert!(
        lost.is_empty(),
        "{t}: {} events never delivered, at commit positions {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    // Commit order: the transactions' events come in the order the transactions committed (within one,
    // in the order of its inserts, which `enqueue_all` chooses).
    let transaction_of: std::collections::HashMap<EventId, usize> =
        committed.iter().enumerate().map(|(i, id)| (*id, i / 50)).collect();
    let order: Vec<usize> = first_deliveries.iter().map(|id| transaction_of[id]).collect();
    if let Some(at) = order.windows(2).position(|pair| pair[0] > pair[1]) {
        panic!(
            "{t}: first deliveries leave commit order at {at}: transactions {:?}",
            &order[at.saturating_sub(3)..(at + 5).min(order.len())]
        );
    }
    println!("{t}: {} events, {} kills at {kills_at:?}, {duplicates} duplicates", committed.len(), kills_at.len());
    drop_slot(&t, &config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_the_slot_over_when_the_active_relay_is_killed() {
    let Some(t) = logical("log_standby").await else { return };
    let config = config_for("standby");
    log::create_publication(&t.db, &config).await.expect("publication");
    let broker = broker_of(&t);
    let _ = std::fs::remove_file(&broker.path);
    let mut first = spawn_relay(&t, &config);
    let first_reader = reader_of(&t, &config, None).await;
    let mut standby = spawn_relay(&t, &config);
    enqueue_committed(&t, &[event("sb-1", "order.placed", 1)]).await;
    while broker.deliveries().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The standby has had time to find the slot busy and wait.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed_at = std::time::Instant::now();
    kill(&mut first);
    let second_reader = reader_of(&t, &config, Some(first_reader)).await;
    let takeover = killed_at.elapsed();
    enqueue_committed(&t, &[event("sb-2", "order.placed", 2)]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while broker.deliveries().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "{t}: the standby did not publish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "{t}: the standby took the slot over {takeover:?} after the SIGKILL (reader {first_reader} -> {second_reader})"
    );
    kill(&mut standby);
    drop_slot(&t, &config).await;
}

/// Refuses (permanently) every event of aggregate `poison` while `refusing`; passes the rest on.
#[derive(Clone)]
struct Refusing {
    inner: InMemoryPublisher,
    refusing: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Publisher for Refusing {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), outbox_seaorm::PublishError>> {
        let refusing = self.refusing.load(std::sync::atomic::Ordering::SeqCst);
        let passed: Vec<OutboxEvent> =
            events.iter().filter(|e| !(refusing && e.aggregate_id == "poison")).cloned().collect();
        let mut results = self.inner.publish(&passed).await.into_iter();
        events
            .iter()
            .map(|e| {
                if refusing && e.aggregate_id == "poison" {
                    Err(outbox_seaorm::PublishError::permanent("message refused by the broker"))
                } else {
                    results.next().unwrap_or(Ok(()))
                }
            })
            .collect()
    }
}

async fn row_states(t: &TestDb, aggregate_id: &str) -> Vec<(i64, bool, bool, Option<String>)> {
    let sql = format!(
        "SELECT aggregate_version, published_at_ms IS NOT NULL, dead_at_ms IS NOT NULL, last_error FROM outbox_events \
         WHERE aggregate_id = '{aggregate_id}' ORDER BY aggregate_version"
    );
    let rows =
        t.db.query_all_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, sql)).await.expect("rows");
    rows.iter()
        .map(|r| {
            (
                r.try_get_by_index(0).expect("version"),
                r.try_get_by_index(1).expect("published"),
                r.try_get_by_index(2).expect("dead"),
                r.try_get_by_index(3).expect("error"),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_event_is_parked_the_others_flow_and_replay_publishes_its_run_in_order() {
    let Some(t) = logical("log_poison").await else { return };
    let config = config_for("poison");
    log::create_publication(&t.db, &config).await.expect("publication");
    let publisher = Refusing { inner: InMemoryPublisher::new(), refusing: Default::default() };
    publisher.refusing.store(true, std::sync::atomic::Ordering::SeqCst);
    let running = start(&t, publisher.clone(), config.clone());
    reader_of(&t, &config, None).await;

    // Each transaction: one event of `poison` and one of another aggregate.
    for n in 0..3u64 {
        enqueue_committed(&t, &[event("poison", "order.placed", n), event(&format!("fine-{n}"), "order.placed", n)])
            .await;
    }
    wait_for_distinct(&publisher.inner, 3, &t).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let states = loop {
        let states = row_states(&t, "poison").await;
        if states.iter().skip(1).all(|(_, _, _, error)| error.is_some()) && states[0].2 {
            break states;
        }
        assert!(tokio::time::Instant::now() < deadline, "{t}: the poison run was not parked: {states:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(states[0].3.as_deref().is_some_and(|e| e.contains("refused")), "{t}: the dead row says why: {states:?}");
    for (version, published, dead, error) in &states[1..] {
        assert!(!published && !dead, "{t}: version {version} waits, neither published nor dead");
        assert!(error.as_deref().is_some_and(|e| e.starts_with("waiting behind dead event")), "{t}: {error:?}");
    }
    // The slot goes on past the parked events: the server hears a position after every commit above.
    wait_until_confirmed_past_now(&t, &config, "events wait behind the poison event").await;

    // A restarted relay still holds the aggregate back (it reads which ones from the table), and parks
    // a later event of it too.
    running.stop().await;
    let running = start(&t, publisher.clone(), config.clone());
    reader_of(&t, &config, None).await;
    enqueue_committed(&t, &[event("poison", "order.placed", 3), event("fine-3", "order.placed", 3)]).await;
    wait_for_distinct(&publisher.inner, 4, &t).await;
    assert!(publisher.inner.received().iter().all(|e| e.aggregate_id != "poison"), "{t}: nothing of poison went out");

    // The broker accepts it now; the operator replays the dead event: the whole run goes out, in order.
    publisher.refusing.store(false, std::sync::atomic::Ordering::SeqCst);
    let replayed = outbox_ops::admin::replay_dead(&t.db, &outbox_seaorm::DeadFilter::default().aggregate_id("poison"))
        .await
        .expect("replay");
    assert_eq!(replayed, 1, "{t}");
    let received = wait_for_distinct(&publisher.inner, 8, &t).await;
    let poison: Vec<u64> = received.iter().filter(|e| e.aggregate_id == "poison").map(common::n_of).collect();
    assert_eq!(poison, [0, 1, 2, 3], "{t}: the parked run, in order, once");
    wait_for_published_rows(&t, 8).await;
    running.stop().await;
    drop_slot(&t, &config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_holds_the_slot_and_lost_acks_lose_nothing() {
    let Some(t) = logical("log_outage").await else { return };
    let config = config_for("outage");
    log::create_publication(&t.db, &config).await.expect("publication");
    // Retries within milliseconds, so the outage and the lost acks below take little time.
    let backoff =
        outbox_seaorm::Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200), multiplier: 2 };
    let config = config.with_relay(outbox_seaorm::RelayConfig::default().with_backoff(backoff));
    let down = InMemoryPublisher::new();
    down.go_down_for(u32::MAX);
    let running = start(&t, down.clone(), config.clone());
    reader_of(&t, &config, None).await;
    let events: Vec<_> = (0..100u64).map(|n| event(&format!("o-{}", n % 10), "order.placed", n)).collect();
    for chunk in events.chunks(10) {
        enqueue_committed(&t, chunk).await;
    }
    // The relay keeps retrying; stopped while the broker is down, it has confirmed none of them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while down.publish_calls() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "{t}: the relay did not retry");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    assert_eq!(down.received_count(), 0, "{t}");
    assert_eq!(count_published(&t).await, 0, "{t}: nothing recorded published");

    // A new relay gets them all from the log (the slot did not move past them), through a broker that
    // is down for 30 more messages and loses the acks of 20.
    let flaky = InMemoryPublisher::new();
    flaky.go_down_for(30);
    flaky.lose_acks(20);
    let running = start(&t, flaky.clone(), config.clone());
    let received = wait_for_distinct(&flaky, 100, &t).await;
    assert_per_aggregate_order(&received, &t);
    assert!(received.len() <= 120, "{t}: duplicates only from the 20 lost acks, got {}", received.len() - 100);
    wait_for_published_rows(&t, 100).await;
    running.stop().await;
    drop_slot(&t, &config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_dropped_during_a_drain_loses_nothing() {
    let Some(t) = logical("log_dropped").await else { return };
    let config = config_for("dropped");
    log::create_publication(&t.db, &config).await.expect("publication");
    let publisher = InMemoryPublisher::new();
    let running = start(&t, publisher.clone(), config.clone());
    reader_of(&t, &config, None).await;
    let writer = {
        let db = t.db.clone();
        tokio::spawn(async move {
            let mut committed = Vec::new();
            for i in 0..100u64 {
                let events: Vec<_> =
                    (0..50u64).map(|k| event(&format!("d-{}", k % 25), "order.placed", i * 50 + k)).collect();
                let txn = sea_orm::TransactionTrait::begin(&db).await.expect("begin");
                committed.extend(outbox_seaorm::enqueue_all(&txn, &events).await.expect("enqueue"));
                txn.commit().await.expect("commit");
            }
            committed
        })
    };
    while publisher.received_count() < 1000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // An operator (or max_slot_wal_keep_size) removes the slot under the running relay.
    let sql = format!(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '{0}' AND active; \
         SELECT pg_drop_replication_slot('{0}')",
        config.slot()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Err(error) = t.db.execute_unprepared(&sql).await {
        assert!(tokio::time::Instant::now() < deadline, "{t}: could not drop the slot: {error}");
    }
    let committed = writer.await.expect("writer");
    let received = wait_for_distinct(&publisher, committed.len(), &t).await;
    let ids: HashSet<EventId> = received.iter().map(|e| e.id).collect();
    assert!(committed.iter().all(|id| ids.contains(id)), "{t}: every event published");
    assert_per_aggregate_order(&received, &t);
    wait_for_published_rows(&t, committed.len() as u64).await;
    println!(
        "{t}: slot dropped after {} deliveries; {} events, {} duplicates",
        1000,
        committed.len(),
        received.len() - committed.len()
    );
    running.stop().await;
    drop_slot(&t, &config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_outbox_beside_a_busy_table_still_moves_its_slot() {
    let Some(t) = logical("log_idle").await else { return };
    let config = config_for("idle");
    log::create_publication(&t.db, &config).await.expect("publication");
    let running = start(&t, InMemoryPublisher::new(), config.clone());
    reader_of(&t, &config, None).await;
    t.db.execute_unprepared("CREATE TABLE busy (id bigserial primary key, body text)").await.expect("table");
    for _ in 0..50 {
        t.db.execute_unprepared("INSERT INTO busy (body) SELECT repeat('x', 200) FROM generate_series(1, 100)")
            .await
            .expect("busy writes");
    }
    wait_until_confirmed_past_now(&t, &config, "the outbox is idle beside a busy table").await;
    running.stop().await;
    drop_slot(&t, &config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_plain_sql_writers_and_of_a_partitioned_outbox_are_published() {
    let Some(t) = logical("log_foreign").await else { return };
    outbox_seaorm::partition::partition_outbox(&t.db, outbox_seaorm::partition::PartitionInterval::Day)
        .await
        .unwrap_or_else(|e| panic!("{t}: partition: {e}"));
    let config = config_for("foreign");
    log::create_publication(&t.db, &config).await.expect("publication");
    log::check(&t.db, &config).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let publisher = InMemoryPublisher::new();
    let running = start(&t, publisher.clone(), config.clone());
    reader_of(&t, &config, None).await;
    // docs/foreign-writers.md's statement, from plain SQL: the trigger numbers the aggregate's versions.
    let now = chrono::Utc::now().timestamp_millis();
    for n in 0..5 {
        let sql = format!(
            "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
             headers, created_at_ms, next_attempt_at_ms) VALUES ('{}', 'order', 'plain-1', 'order.placed', 1, \
             CAST('{{\"n\": {n}}}' AS jsonb), CAST('{{}}' AS jsonb), {now}, {now})",
            uuid::Uuid::now_v7()
        );
        t.db.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
    }
    enqueue_committed(&t, &[event("app-1", "order.placed", 0)]).await;
    let received = wait_for_distinct(&publisher, 6, &t).await;
    let plain: Vec<(u64, i64)> = received
        .iter()
        .filter(|e| e.aggregate_id == "plain-1")
        .map(|e| (common::n_of(e), e.aggregate_version))
        .collect();
    assert_eq!(plain, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], "{t}: in order, numbered by the trigger");
    wait_for_published_rows(&t, 6).await;
    running.stop().await;
    drop_slot(&t, &config).await;

    // Without publish_via_partition_root the partitions would arrive under their own names: refused.
    t.db.execute_unprepared(&format!(
        "ALTER PUBLICATION \"{}\" SET (publish_via_partition_root = false)",
        config.publication()
    ))
    .await
    .expect("alter");
    match log::check(&t.db, &config).await {
        Err(LogError::Setup(SetupProblem::PartitionsNotViaRoot { .. })) => {}
        other => panic!("{t}: expected PartitionsNotViaRoot, got {other:?}"),
    }
}

/// The child's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib(child: &Child) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("the child's status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_transaction_of_100k_events_is_published_whole_in_bounded_memory() {
    let Some(t) = logical("log_big").await else { return };
    let config = config_for("big");
    log::create_publication(&t.db, &config).await.expect("publication");
    let broker = broker_of(&t);
    let _ = std::fs::remove_file(&broker.path);
    let mut relay = spawn_relay(&t, &config);
    reader_of(&t, &config, None).await;
    let txn = sea_orm::TransactionTrait::begin(&t.db).await.expect("begin");
    let mut committed = Vec::new();
    for chunk in 0..20u64 {
        let events: Vec<_> =
            (0..5000u64).map(|k| event(&format!("big-{}", k % 1000), "order.placed", chunk * 5000 + k)).collect();
        committed.extend(outbox_seaorm::enqueue_all(&txn, &events).await.expect("enqueue"));
    }
    txn.commit().await.expect("commit one transaction of 100,000 events");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while broker.deliveries().len() < committed.len() {
        assert!(tokio::time::Instant::now() < deadline, "{t}: {} of 100000 delivered", broker.deliveries().len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let peak = peak_rss_kib(&relay);
    kill(&mut relay);
    let delivered: Vec<EventId> = broker.deliveries().into_iter().map(|(id, _)| id).collect();
    assert_eq!(delivered, committed, "{t}: the transaction's events, each once, in order");
    println!("{t}: 100,000 events of one transaction published; relay peak RSS {} MiB", peak / 1024);
    assert!(peak < 64 * 1024, "{t}: the relay's peak RSS was {} MiB", peak / 1024);
    drop_slot(&t, &config).await;
}

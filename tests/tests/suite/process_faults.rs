//! Real crashes: a child process (this test binary, re-run as a child role) is killed with SIGKILL, or
//! aborts, at the worst moment; the parent then counts rows. Nothing is lost and the inbox applies every
//! event once.
//!
//! The broker is a file the child appends to, so what it "published" outlives it.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{
    FileBroker, after, bill, broker_of, count_table, count_unpublished, create_shop_tables, enqueue_committed, event,
};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::{ClaimMode, EventId, OutboxEvent, PublishError, Publisher, Relay, RelayConfig, SeaOrmStore};
use sea_orm::{ConnectionTrait, TransactionTrait};

const ROLE: &str = "OUTBOX_FAULT_ROLE";
const URL: &str = "OUTBOX_FAULT_URL";
const LEASE: Duration = Duration::from_secs(60);

/// Publishes, says so on stdout, then hangs until killed: the crash between publish and mark.
struct PublishThenHang(FileBroker);

impl Publisher for PublishThenHang {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let results = self.0.publish(events).await;
        println!("PUBLISHED {}", events.len());
        std::future::pending::<()>().await;
        results
    }
}

fn mode_of(name: &str) -> ClaimMode {
    if name == "lease" { ClaimMode::Lease { duration: LEASE } } else { ClaimMode::Transaction }
}

/// The child side. Not a test of its own: it does nothing unless the parent set [`ROLE`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process() {
    let (Ok(role), Ok(url)) = (std::env::var(ROLE), std::env::var(URL)) else { return };
    let t = TestDb::open(&url).await;
    match role.split_once(':') {
        Some(("relay", mode)) => {
            let broker = PublishThenHang(broker_of(&t));
            let config = RelayConfig::default().with_claim_mode(mode_of(mode));
            let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker, config).expect("config");
            let _ = relay.run_once().await;
            unreachable!("the publisher hangs until the parent kills this process");
        }
        Some(("commit", _)) => {
            // The app: a business row and its event in one transaction, then killed the instant COMMIT returns.
            let txn = t.db.begin().await.expect("begin");
            txn.execute_unprepared("INSERT INTO orders (id, customer, total_minor) VALUES ('o-crash', 'ann', 4900)")
                .await
                .expect("order");
            outbox_seaorm::enqueue(&txn, &event("o-crash", "order.placed", 1)).await.expect("enqueue");
            txn.commit().await.expect("commit");
            // And an event of a transaction that never commits: the process dies with it open.
            let open = t.db.begin().await.expect("begin");
            outbox_seaorm::enqueue(&open, &event("o-never", "order.placed", 2)).await.expect("enqueue");
            println!("COMMITTED");
            std::process::abort();
        }
        _ => panic!("unknown child role {role}"),
    }
}

/// Runs this binary's [`child_process`] in `role` against `t`.
fn spawn_child(t: &TestDb, role: &str) -> Child {
    let exe = std::env::current_exe().expect("the test binary");
    Command::new(exe)
        .args(["--exact", "process_faults::child_process", "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .env(URL, &t.url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child")
}

/// Waits until the child prints a line starting with `word`; panics if it exits first.
fn wait_for(child: &mut Child, word: &str, t: &TestDb) {
    let stdout = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("child output");
        if line.contains(word) {
            return;
        }
    }
    panic!("{t}: the child exited before printing {word}");
}

/// Starts `t`'s broker empty.
fn create_broker(t: &TestDb) {
    let _ = std::fs::remove_file(broker_of(t).path);
}

/// Every message the broker file holds, in arrival order.
fn deliveries(t: &TestDb) -> Vec<(EventId, String)> {
    broker_of(t).deliveries()
}

async fn a_relay_killed_between_publish_and_mark(t: TestDb, mode: &str) {
    create_shop_tables(&t).await;
    create_broker(&t);
    let events: Vec<_> = (0..6).map(|n| event(&format!("o{}", n % 3), "order.placed", n)).collect();
    enqueue_committed(&t, &events).await;

    let mut child = spawn_child(&t, &format!("relay:{mode}"));
    wait_for(&mut child, "PUBLISHED", &t);
    child.kill().expect("SIGKILL the relay"); // between publish and mark
    child.wait().expect("reap the child");
    let first = deliveries(&t).len();
    assert!(first > 0, "{t}: the killed relay published a wave");
    assert_eq!(count_unpublished(&t).await, 6, "{t}: nothing was marked");

    // A new relay; in lease mode it takes over once the dead relay's lease expired.
    let broker = broker_of(&t);
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), broker, RelayConfig::default().with_claim_mode(mode_of(mode)))
            .expect("config");
    let now =
        if mode == "lease" { after(chrono::Utc::now(), LEASE + Duration::from_secs(1)) } else { chrono::Utc::now() };
    for _ in 0..10 {
        if relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}")).claimed == 0 {
            break;
        }
    }
    assert_eq!(count_unpublished(&t).await, 0, "{t}: everything published after the crash");
    assert_eq!(deliveries(&t).len(), 6 + first, "{t}: the {first} sent before the crash went out again");
    let (processed, duplicates) = bill(&t, deliveries(&t)).await;
    assert_eq!((processed, duplicates as usize), (6, first), "{t}: each event applied once");
    assert_eq!(count_table(&t, "invoices").await, 6, "{t}: one invoice per event");
}

async fn a_relay_killed_between_publish_and_mark_in_transaction_mode(t: TestDb) {
    a_relay_killed_between_publish_and_mark(t, "transaction").await;
}
per_backend!(a_relay_killed_between_publish_and_mark_in_transaction_mode, "sigkill_relay_txn");

async fn a_relay_killed_between_publish_and_mark_in_lease_mode(t: TestDb) {
    a_relay_killed_between_publish_and_mark(t, "lease").await;
}
per_backend!(a_relay_killed_between_publish_and_mark_in_lease_mode, "sigkill_relay_lease");

async fn the_app_killed_right_after_commit_loses_nothing(t: TestDb) {
    create_shop_tables(&t).await;
    create_broker(&t);
    let mut child = spawn_child(&t, "commit:");
    wait_for(&mut child, "COMMITTED", &t);
    let status = child.wait().expect("reap the child");
    assert!(!status.success(), "{t}: the app died ({status})");

    assert_eq!(count_table(&t, "orders").await, 1, "{t}: the business change committed");
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker_of(&t), RelayConfig::default()).expect("config");
    relay.drain(10).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let got = deliveries(&t);
    assert_eq!(got.len(), 1, "{t}: its event was published, and the uncommitted one never: {got:?}");
    assert_eq!(got[0].1, "o-crash", "{t}");
    assert_eq!(count_unpublished(&t).await, 0, "{t}");
}
per_backend!(the_app_killed_right_after_commit_loses_nothing, "abort_after_commit");

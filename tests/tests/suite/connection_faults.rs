//! The relay's database connection dies while its batch is out (the mark is made again, nothing is published
//! twice); transactions commit out of `seq` order;
//! one transaction writes 100,000 events. Each test counts what the database and the broker hold.

use crate::common;

use std::time::Duration;

use common::{count_published, count_unpublished, enqueue_committed, event};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::{
    ClaimMode, InMemoryPublisher, NewEvent, OutboxEvent, PublishError, Publisher, Relay, RelayConfig, SeaOrmStore,
};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement, TransactionTrait};

const LEASE: Duration = Duration::from_secs(60);

/// A pool of exactly one connection, so the relay's connection is known, and its server-side id.
async fn single_connection(t: &TestDb) -> (DatabaseConnection, i64) {
    let base = t.url.split('#').next().unwrap_or(&t.url).to_owned();
    let mut options = sea_orm::ConnectOptions::new(base);
    options.max_connections(1).min_connections(1).sqlx_logging(false);
    if t.backend == DbBackend::Postgres {
        options.set_schema_search_path(t.url.rsplit('#').next().unwrap_or_default().to_owned());
    }
    let db = Database::connect(options).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let sql = match t.backend {
        DbBackend::Postgres => "SELECT CAST(pg_backend_pid() AS BIGINT) AS id",
        _ => "SELECT CAST(CONNECTION_ID() AS SIGNED) AS id",
    };
    let row = db.query_one_raw(Statement::from_string(t.backend, sql)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let id: i64 = row.expect("a row").try_get("", "id").expect("connection id");
    (db, id)
}

/// Publishes to `broker`, then terminates connection `victim` from `admin` before the relay can mark.
struct KillConnectionAfterPublish {
    broker: InMemoryPublisher,
    admin: DatabaseConnection,
    victim: i64,
    done: std::sync::atomic::AtomicBool,
}

impl Publisher for KillConnectionAfterPublish {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let results = self.broker.publish(events).await;
        if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let backend = self.admin.get_database_backend();
            let sql = match backend {
                DbBackend::Postgres => format!("SELECT pg_terminate_backend({})", self.victim),
                _ => format!("KILL CONNECTION {}", self.victim),
            };
            self.admin.execute_unprepared(&sql).await.expect("terminate the relay's connection");
        }
        results
    }
}

async fn a_connection_terminated_while_the_batch_is_out(t: TestDb, mode: ClaimMode) {
    if t.backend == DbBackend::Sqlite {
        return; // an embedded database has no connection to kill
    }
    let events: Vec<_> = (0..9).map(|n| event(&format!("o{}", n % 3), "order.placed", n)).collect();
    enqueue_committed(&t, &events).await;
    let (relay_db, victim) = single_connection(&t).await;
    let broker = InMemoryPublisher::new();
    let killer = KillConnectionAfterPublish {
        broker: broker.clone(),
        admin: t.reconnect().await,
        victim,
        done: Default::default(),
    };
    let relay =
        Relay::new(SeaOrmStore::new(relay_db), killer, RelayConfig::default().with_claim_mode(mode)).expect("config");
    // The broker confirmed the batch before the mark: the mark is made again over a fresh connection of the
    // pool (the claim's transaction died with its connection; a lease's mark takes a connection of its
    // own), rather than the batch published again.
    let first = relay.run_once().await;
    assert!(first.as_ref().is_ok_and(|pass| pass.published == 9), "{t}: {first:?}");
    assert_eq!(broker.received_count(), 9, "{t}: each event sent once");
    assert_eq!(count_published(&t).await, 9, "{t}");
    let next = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(next.claimed, 0, "{t}: nothing left to publish again: {next:?}");
    assert_eq!(count_unpublished(&t).await, 0, "{t}");
}

async fn a_connection_terminated_while_a_transaction_claim_is_out(t: TestDb) {
    a_connection_terminated_while_the_batch_is_out(t, ClaimMode::Transaction).await;
}
per_backend!(a_connection_terminated_while_a_transaction_claim_is_out, "killed_conn_txn");

async fn a_connection_terminated_while_a_lease_is_out(t: TestDb) {
    a_connection_terminated_while_the_batch_is_out(t, ClaimMode::Lease { duration: LEASE }).await;
}
per_backend!(a_connection_terminated_while_a_lease_is_out, "killed_conn_lease");

/// Drains `relay` and returns what `broker` received.
async fn drain(
    t: &TestDb,
    relay: &Relay<SeaOrmStore, InMemoryPublisher>,
    broker: &InMemoryPublisher,
) -> Vec<OutboxEvent> {
    relay.drain(1000).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    broker.received()
}

async fn transactions_committing_out_of_seq_order_lose_nothing_and_keep_version_order(t: TestDb) {
    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), RelayConfig::default()).expect("config");
    // Different aggregates: the first to insert (lower seq) commits last.
    let early = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    outbox_seaorm::enqueue(&early, &event("a", "order.placed", 1)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    if t.backend != DbBackend::Sqlite {
        // (SQLite has one writer: the second transaction could not start before the first ends.)
        enqueue_committed(&t, &[event("b", "order.placed", 2)]).await;
        let got = drain(&t, &relay, &broker).await;
        assert_eq!(got.iter().map(|e| e.aggregate_id.as_str()).collect::<Vec<_>>(), ["b"], "{t}: b goes first");
    }
    early.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    if t.backend == DbBackend::Sqlite {
        enqueue_committed(&t, &[event("b", "order.placed", 2)]).await;
    }
    let got = drain(&t, &relay, &broker).await;
    assert_eq!(got.len(), 2, "{t}: the late commit with the lower seq was not skipped");

    // One aggregate, two writers: the second waits for the first (its aggregate row lock), and both are
    // published in version order.
    let first = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    outbox_seaorm::enqueue(&first, &event("c", "order.placed", 3)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let second = tokio::spawn({
        let db = t.reconnect().await;
        async move {
            let txn = db.begin().await.expect("begin");
            outbox_seaorm::enqueue(&txn, &event("c", "order.paid", 4)).await.expect("enqueue");
            txn.commit().await.expect("commit");
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    second.await.expect("the second writer");
    let got = drain(&t, &relay, &broker).await;
    let c: Vec<(&str, i64)> =
        got.iter().filter(|e| e.aggregate_id == "c").map(|e| (e.event_type.as_str(), e.aggregate_version)).collect();
    assert_eq!(c, [("order.placed", 1), ("order.paid", 2)], "{t}");
    assert_eq!(count_unpublished(&t).await, 0, "{t}");
}
per_backend!(transactions_committing_out_of_seq_order_lose_nothing_and_keep_version_order, "out_of_seq_commits");

async fn one_transaction_of_100k_events_is_published_in_order_a_batch_at_a_time(t: TestDb) {
    const EVENTS: usize = 100_000;
    const AGGREGATES: usize = 10;
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let mut versions = [0i64; AGGREGATES];
    for chunk in (0..EVENTS).collect::<Vec<_>>().chunks(5_000) {
        let events: Vec<NewEvent> = chunk
            .iter()
            .map(|n| {
                NewEvent::new("order", format!("big-{}", n % AGGREGATES), "order.step", &serde_json::json!({"n": n}))
            })
            .collect::<Result<_, _>>()
            .expect("valid events");
        outbox_seaorm::enqueue_all(&txn, &events).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));

    let broker = InMemoryPublisher::new();
    let config = RelayConfig::default().with_batch_size(1000);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), config).expect("config");
    let passes = relay.drain(1000).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(passes.iter().all(|p| p.claimed <= 1000), "{t}: no pass holds more than a batch");
    let received = broker.received();
    assert_eq!(received.len(), EVENTS, "{t}: every event, once");
    for e in &received {
        let a: usize = e.aggregate_id["big-".len()..].parse().expect("aggregate number");
        assert_eq!(e.aggregate_version, versions[a] + 1, "{t}: {} in version order", e.aggregate_id);
        versions[a] = e.aggregate_version;
    }
    assert_eq!(count_unpublished(&t).await, 0, "{t}");
}
per_backend!(one_transaction_of_100k_events_is_published_in_order_a_batch_at_a_time, "one_txn_100k");

//! A relay whose mark fails after the broker confirmed its batch records the batch again instead of
//! publishing it again: here the claim's connection is killed between the publish and the mark (as a
//! database restart or a proxy would), and each event still reaches the broker once and is marked.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use common::{count_published, enqueue_committed, event};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::{
    ClaimMode, InMemoryPublisher, OutboxEvent, PublishError, Publisher, Relay, RelayConfig, SeaOrmStore,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

/// Publishes to an in-memory broker, then, the first time, kills every other connection of this database
/// that holds an open transaction on the outbox: the relay's claim.
struct KillTheClaimAfterPublishing {
    broker: InMemoryPublisher,
    killer: DatabaseConnection,
    killed: AtomicBool,
}

impl KillTheClaimAfterPublishing {
    async fn kill_claims(&self) -> usize {
        let backend = self.killer.get_database_backend();
        let holders = match backend {
            // The claim holds a lock on the table (`FOR UPDATE`) until it ends.
            DbBackend::Postgres => {
                "SELECT DISTINCT pid AS id FROM pg_locks WHERE relation = 'outbox_events'::regclass \
                 AND pid <> pg_backend_pid() AND granted"
            }
            _ => {
                "SELECT t.trx_mysql_thread_id AS id FROM information_schema.innodb_trx t \
                 JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
                 WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()"
            }
        };
        let rows = self.killer.query_all_raw(Statement::from_string(backend, holders)).await.expect("find the claim");
        let ids: Vec<i64> = rows
            .iter()
            .map(|row| match backend {
                DbBackend::Postgres => row.try_get::<i32>("", "id").map(i64::from),
                _ => row.try_get::<u64>("", "id").map(|id| id as i64),
            })
            .collect::<Result<_, _>>()
            .expect("ids");
        for id in &ids {
            let kill = match backend {
                DbBackend::Postgres => format!("SELECT pg_terminate_backend({id})"),
                _ => format!("KILL CONNECTION {id}"),
            };
            self.killer.execute_unprepared(&kill).await.expect("kill the claim's connection");
        }
        ids.len()
    }
}

impl Publisher for KillTheClaimAfterPublishing {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let results = self.broker.publish(events).await;
        if !self.killed.swap(true, Ordering::SeqCst) {
            assert_eq!(self.kill_claims().await, 1, "exactly one claim was open");
        }
        results
    }
}

async fn a_mark_whose_connection_dies_after_publishing_is_recorded_not_republished(t: TestDb) {
    if t.backend == DbBackend::Sqlite {
        eprintln!("{t}: skipped: SQLite is a file in this process, there is no connection to kill");
        return;
    }
    let events: Vec<_> = (0..30).map(|i| event(&format!("o{}", i % 7), "placed", i)).collect();
    enqueue_committed(&t, &events).await;
    let broker = InMemoryPublisher::new();
    let publisher = KillTheClaimAfterPublishing { broker: broker.clone(), killer: t.db.clone(), killed: false.into() };
    let config = RelayConfig::default().with_claim_mode(ClaimMode::Transaction).with_batch_size(100);
    let relay = Relay::new(SeaOrmStore::new(t.reconnect().await), publisher, config).expect("config");

    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: the pass failed instead of marking again: {e}"));
    assert_eq!((pass.claimed, pass.published), (30, 30), "{t}: {pass:?}");
    assert_eq!(count_published(&t).await, 30, "{t}: every published row is marked");
    let next = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(next.claimed, 0, "{t}: nothing is left to publish again: {next:?}");
    assert_eq!(broker.received().len(), 30, "{t}: each event reached the broker once");
}
per_backend!(a_mark_whose_connection_dies_after_publishing_is_recorded_not_republished, "mark_faults_killed");

//! The operations behind the `outbox` CLI (`outbox_ops::admin`) on real databases: stats per group,
//! dead events listed, replayed and discarded by filter, cleanup with progress, checks, and `migrate`
//! from several processes at once.

use crate::common;

use std::time::Duration;

use common::{count_outbox, count_published, count_table, count_unpublished, enqueue_committed, event, fast_config};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_ops::admin::{self, CheckOptions, CleanupConfig, CleanupTable, DeadFilter};
use outbox_seaorm::{
    EventId, InMemoryPublisher, InboxOutcome, NewEvent, OutboxEvent, PublishError, Publisher, Relay, RelayConfig,
    SeaOrmStore,
};
use sea_orm::ConnectionTrait;

/// A broker that refuses every event for good, with `timeout` in the error of aggregates ending in an odd
/// digit and `too large` for the others: every event is dead after one pass.
struct Refusing;

impl Publisher for Refusing {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        events
            .iter()
            .map(|e| {
                let odd = e.aggregate_id.bytes().last().is_some_and(|b| b % 2 == 1);
                let why = if odd { "ack Timeout after 5s" } else { "message too large" };
                Err(PublishError::permanent(format!("{} refused: {why}", e.aggregate_id)))
            })
            .collect()
    }
}

fn of_type(aggregate_type: &str, aggregate_id: &str, event_type: &str) -> NewEvent {
    NewEvent::new(aggregate_type, aggregate_id, event_type, &serde_json::json!({ "id": aggregate_id })).expect("event")
}

/// Eight dead events: `order` o1..o4 (`order.placed`, odd ones timed out) and `payment` p1..p4
/// (`payment.taken`); each the only event of its aggregate.
async fn eight_dead(t: &TestDb) -> Vec<EventId> {
    let mut events = Vec::new();
    for i in 1..=4 {
        events.push(of_type("order", &format!("o{i}"), "order.placed"));
        events.push(of_type("payment", &format!("p{i}"), "payment.taken"));
    }
    enqueue_committed(t, &events).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), Refusing, fast_config()).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pass.dead, 8, "{t}: {pass:?}");
    events.iter().map(NewEvent::id).collect()
}

async fn stats_break_the_backlog_down_by_aggregate_type_and_event_type(t: TestDb) {
    eight_dead(&t).await;
    enqueue_committed(&t, &[of_type("order", "o9", "order.shipped"), of_type("order", "o9", "order.shipped")]).await;
    let stats = admin::stats(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((stats.totals.pending, stats.totals.dead, stats.totals.max_attempts), (2, 8, 1), "{t}: {stats:?}");
    let names: Vec<&str> = stats.by_aggregate_type.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["order", "payment"], "{t}");
    let order = &stats.by_aggregate_type[0];
    assert_eq!((order.figures.pending, order.figures.dead), (2, 4), "{t}: {order:?}");
    let by_event: Vec<(&str, u64, u64)> =
        stats.by_event_type.iter().map(|g| (g.name.as_str(), g.figures.pending, g.figures.dead)).collect();
    assert_eq!(by_event, [("order.placed", 0, 4), ("order.shipped", 2, 0), ("payment.taken", 0, 4)], "{t}");

    let json: serde_json::Value = serde_json::to_value(&stats).expect("stats serialise");
    assert_eq!(json["pending"], 2, "{t}: {json}");
    assert_eq!(json["by_event_type"][1]["name"], "order.shipped", "{t}: {json}");
}
per_backend!(stats_break_the_backlog_down_by_aggregate_type_and_event_type, "ops_stats_groups");

async fn dead_replay_with_a_filter_republishes_exactly_the_selected_rows(t: TestDb) {
    let ids = eight_dead(&t).await;
    // Timed-out orders: o1 and o3 (error text matched regardless of case).
    let filter = DeadFilter::default().event_type("order.placed").error_contains("TIMEOUT");
    let listed = admin::list_dead(&t.db, &filter, 100).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let listed: Vec<&str> = listed.iter().map(|d| d.aggregate_id.as_str()).collect();
    assert_eq!(listed, ["o1", "o3"], "{t}");
    let replayed = admin::replay_dead(&t.db, &filter).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(replayed, 2, "{t}");

    // And p2 by id.
    let p2 = ids[3];
    assert_eq!(
        admin::replay_dead(&t.db, &DeadFilter::default().id(p2)).await.unwrap_or_else(|e| panic!("{t}: {e}")),
        1
    );

    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    relay.drain(10).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let mut sent: Vec<String> = broker.received().iter().map(|e| e.aggregate_id.clone()).collect();
    sent.sort();
    assert_eq!(sent, ["o1", "o3", "p2"], "{t}: exactly the selected rows went out");
    let replayed_rows = common::outbox_rows(&t).await;
    let o1 = replayed_rows.iter().find(|r| r.aggregate_id == "o1").expect("o1");
    assert_eq!((o1.attempts, o1.dead_at_ms.is_none(), o1.published_at_ms.is_some()), (0, true, true), "{t}");
    assert_eq!(
        admin::stats(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}")).totals.dead,
        5,
        "{t}: the rest stay dead"
    );

    // Time filters: every dead event died a moment ago.
    let old = DeadFilter::default().older_than(Duration::from_secs(3600));
    assert!(admin::list_dead(&t.db, &old, 100).await.unwrap_or_else(|e| panic!("{t}: {e}")).is_empty(), "{t}");
    let recent = DeadFilter::default().newer_than(Duration::from_secs(3600)).aggregate_type("payment");
    assert_eq!(admin::list_dead(&t.db, &recent, 100).await.unwrap_or_else(|e| panic!("{t}: {e}")).len(), 3, "{t}");
    // A LIKE wildcard in the text is literal.
    let wildcard = DeadFilter::default().error_contains("%");
    assert!(admin::list_dead(&t.db, &wildcard, 100).await.unwrap_or_else(|e| panic!("{t}: {e}")).is_empty(), "{t}");
}
per_backend!(dead_replay_with_a_filter_republishes_exactly_the_selected_rows, "ops_dead_replay_filter");

async fn dead_events_are_listed_in_pages_and_shown_with_their_payload(t: TestDb) {
    let ids = eight_dead(&t).await;
    let first = admin::list_dead(&t.db, &DeadFilter::default(), 3).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(first.len(), 3, "{t}");
    assert_eq!(first[0].id, ids[0].to_string(), "{t}: oldest first");
    assert!(first[0].payload.is_none() && first[0].last_error.as_deref().is_some_and(|e| e.contains("o1")), "{t}");

    let shown = admin::show_dead(&t.db, ids[1]).await.unwrap_or_else(|e| panic!("{t}: {e}")).expect("p1 is dead");
    assert_eq!(shown.payload, Some(serde_json::json!({ "id": "p1" })), "{t}");
    assert_eq!((shown.attempts, shown.event_type.as_str()), (1, "payment.taken"), "{t}");
    assert!(shown.dead_at.starts_with("20"), "{t}: RFC 3339: {}", shown.dead_at);
    assert!(admin::show_dead(&t.db, EventId::new()).await.unwrap_or_else(|e| panic!("{t}: {e}")).is_none(), "{t}");
}
per_backend!(dead_events_are_listed_in_pages_and_shown_with_their_payload, "ops_dead_list_show");

async fn discarding_a_dead_head_lets_its_aggregate_go_on(t: TestDb) {
    eight_dead(&t).await;
    // o1's dead head blocks the event after it.
    enqueue_committed(&t, &[of_type("order", "o1", "order.shipped")]).await;
    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    relay.drain(5).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(broker.received_count(), 0, "{t}: blocked behind the dead head");

    let err = admin::discard_dead(&t.db, &DeadFilter::default()).await.unwrap_err();
    assert!(err.to_string().contains("DeadFilter::all()"), "{t}: {err}");
    // The one filter of dead things: a consumer selects dead letters, never dead rows (which have none).
    let by_consumer = DeadFilter::default().consumer("billing").aggregate_id("o1");
    let err = admin::discard_dead(&t.db, &by_consumer).await.unwrap_err();
    assert!(err.to_string().contains("dead outbox rows have none"), "{t}: {err}");
    assert!(admin::list_dead(&t.db, &by_consumer, 10).await.is_err(), "{t}: listed by consumer");
    let discarded = admin::discard_dead(&t.db, &DeadFilter::default().aggregate_type("order").aggregate_id("o1"))
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(discarded, 1, "{t}");
    relay.drain(5).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let sent: Vec<String> = broker.received().iter().map(|e| e.event_type.clone()).collect();
    assert_eq!(sent, ["order.shipped"], "{t}: the aggregate resumed after its discarded head");

    let rest = admin::discard_dead(&t.db, &DeadFilter::all()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((rest, count_outbox(&t).await, count_published(&t).await), (7, 1, 1), "{t}");
}
per_backend!(discarding_a_dead_head_lets_its_aggregate_go_on, "ops_dead_discard");

async fn cleanup_reports_progress_per_batch_and_never_deletes_unpublished_rows(t: TestDb) {
    let events: Vec<_> = (0..25).map(|i| event(&format!("a{i}"), "order.placed", i)).collect();
    enqueue_committed(&t, &events).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), fast_config()).expect("config");
    assert_eq!(relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}")).published, 25, "{t}");
    eight_dead(&t).await;
    enqueue_committed(&t, &[event("w1", "order.placed", 1), event("w2", "order.placed", 2)]).await;
    for i in 0..3 {
        let outcome = outbox_seaorm::handle_once(&t.db, "billing", &format!("m{i}"), async |_txn| Ok::<_, String>(()))
            .await
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        assert!(matches!(outcome, InboxOutcome::Processed(())), "{t}");
    }
    tokio::time::sleep(Duration::from_millis(5)).await; // everything is now older than a zero retention

    let config = CleanupConfig::default()
        .with_outbox_retention(Duration::ZERO)
        .with_inbox_retention(Duration::ZERO)
        .with_batch_size(10);
    let mut seen = Vec::new();
    let report = admin::cleanup(&t.db, &config, |p| seen.push((p.table, p.deleted, p.total)))
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((report.outbox_deleted, report.inbox_deleted, report.skipped), (25, 3, false), "{t}: {report:?}");
    let expected = [
        (CleanupTable::Outbox, 10, 10),
        (CleanupTable::Outbox, 10, 20),
        (CleanupTable::Outbox, 5, 25),
        (CleanupTable::Inbox, 3, 3),
    ];
    assert_eq!(seen, expected, "{t}");
    assert_eq!((count_unpublished(&t).await, count_outbox(&t).await), (10, 10), "{t}: pending and dead rows stay");
    assert_eq!(count_table(&t, "inbox_messages").await, 0, "{t}");

    let config = config.with_inbox_retention(Duration::from_secs(60));
    assert!(config.validate(&RelayConfig::default()).is_err(), "{t}: the CLI refuses this inbox retention");
}
per_backend!(cleanup_reports_progress_per_batch_and_never_deletes_unpublished_rows, "ops_cleanup_progress");

/// Drops the outbox's tables and its bookkeeping: a database that was never migrated.
async fn unmigrate(t: &TestDb) {
    for table in ["outbox_events", "outbox_aggregates", "outbox_relays", "inbox_messages", "outbox_seaorm_migrations"] {
        let sql = format!("DROP TABLE {table}");
        t.db.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
    }
}

async fn concurrent_migrate_from_three_processes_applies_each_migration_once(t: TestDb) {
    unmigrate(&t).await;
    let pending = admin::pending_migrations(&t.db, None).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(pending.len(), admin::MIGRATION_NAMES.len(), "{t}: {pending:?}");
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let db = t.reconnect().await; // a pool of its own, as a separate process would have
        replicas.push(tokio::spawn(async move { outbox_seaorm::migrate(&db).await }));
    }
    for replica in replicas {
        replica.await.expect("task").unwrap_or_else(|e| panic!("{t}: a concurrent migrate failed: {e}"));
    }
    let applied = count_table(&t, "outbox_seaorm_migrations").await;
    assert_eq!(applied, admin::MIGRATION_NAMES.len() as i64, "{t}: each migration recorded once");
    assert!(admin::pending_migrations(&t.db, None).await.unwrap_or_else(|e| panic!("{t}: {e}")).is_empty(), "{t}");
    enqueue_committed(&t, &[event("o1", "order.placed", 1)]).await;
}
per_backend!(concurrent_migrate_from_three_processes_applies_each_migration_once, "ops_migrate_concurrent");

async fn check_passes_on_a_migrated_primary_and_names_missing_migrations(t: TestDb) {
    let report = admin::check(&t.db, &CheckOptions::default()).await;
    assert!(report.ok, "{t}: {report:?}");
    let names: Vec<&str> = report.checks.iter().map(|c| c.name).collect();
    assert_eq!(names, ["connection", "migrations", "primary", "clock"], "{t}");

    unmigrate(&t).await;
    let report = admin::check(&t.db, &CheckOptions::default()).await;
    let failure = report.first_failure().unwrap_or_else(|| panic!("{t}: {report:?}"));
    assert_eq!(failure.name, "migrations", "{t}");
    let missing = format!("{} not applied", admin::MIGRATION_NAMES.len());
    assert!(failure.detail.contains(&missing) && failure.detail.contains("outbox migrate"), "{t}: {failure:?}");
}
per_backend!(check_passes_on_a_migrated_primary_and_names_missing_migrations, "ops_check");

#[tokio::test]
async fn a_connection_string_that_does_not_parse_is_reported_without_its_password() {
    for url in ["postgres://app:s3cr3t@127.0.0.1:notaport/shop", "mysql://app:s3cr3t@127.0.0.1:notaport/shop"] {
        let err = outbox_seaorm::connect(url).await.expect_err("a port that is not a number");
        let message = err.to_string();
        assert!(!message.contains("s3cr3t"), "{message}");
    }
}

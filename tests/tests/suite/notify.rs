//! Cross-process wake-ups on PostgreSQL (LISTEN/NOTIFY): a commit in another process reaches an idle
//! relay long before its poll; a killed LISTEN connection falls back to polling and recovers; without
//! the trigger nothing is notified.
//!
//! Every row here is written with plain SQL through a pool of its own, never through `enqueue`, so the
//! in-process wake-up (`wake_relays` after `enqueue`) cannot be what wakes the relay: only the
//! notification can, through the listener. Each test has its own channel (channels are per database,
//! not per schema).

use crate::common;

use std::time::{Duration, Instant};

use outbox_integration_tests::{Backend, TestDb, run_on, run_suffix};
use outbox_seaorm::notify::{self, ListenerStatsHandle, NotifyChannel};
use outbox_seaorm::{InMemoryPublisher, OutboxService, RelayConfig, SeaOrmStore};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement, TransactionTrait};

/// The tests of this file run one at a time: a listener wakes every relay of its process, so another
/// test's notification must not be what wakes (or seems to poll) this test's relay.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The poll of a relay whose wake-up is tested: ten times [`WAIT`], so an event published within [`WAIT`]
/// was published because of the notification (it takes milliseconds), never by the poll. A state, not a
/// latency bound: a loaded machine makes the wake-up slower, not the test fail.
const LONG_POLL: Duration = Duration::from_secs(600);
/// The poll of the relay that must fall back to polling while its listener is gone.
const SHORT_POLL: Duration = Duration::from_secs(5);
/// How long a test waits for a publication.
const WAIT: Duration = Duration::from_secs(60);

fn channel(tag: &str) -> NotifyChannel {
    NotifyChannel::new(format!("n_{tag}_{}", run_suffix())).expect("a valid channel")
}

/// A pool on `t`'s server for the listener alone (`max` connections, acquire gives up after 2 s).
async fn listener_pool(t: &TestDb, max: u32) -> DatabaseConnection {
    let base = t.url.split('#').next().unwrap_or(&t.url).to_owned();
    let mut options = ConnectOptions::new(base);
    options
        .sqlx_logging(false)
        .max_connections(max)
        .connect_timeout(Duration::from_secs(2))
        .acquire_timeout(Duration::from_secs(2));
    Database::connect(options).await.unwrap_or_else(|e| panic!("{t}: listener pool: {e}"))
}

/// Another process's commit, as plain SQL: the aggregate's row (due now) and one event row.
async fn insert_event_with_sql(t: &TestDb, writer: &DatabaseConnection, aggregate_id: &str) {
    let now_ms = chrono::Utc::now().timestamp_millis();
    let id = uuid::Uuid::now_v7().to_string();
    let txn = writer.begin().await.unwrap_or_else(|e| panic!("{t}: begin: {e}"));
    let statements = [
        Statement::from_sql_and_values(
            DbBackend::Postgres,
            "INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) \
             VALUES ('order', $1, 1, $2)",
            [aggregate_id.into(), now_ms.into()],
        ),
        Statement::from_sql_and_values(
            DbBackend::Postgres,
            "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
             schema_version, payload, headers, created_at_ms, attempts, next_attempt_at_ms) \
             VALUES ($1, 'order', $2, 1, 'order.placed', 1, '{\"n\": 1}'::jsonb, '{}'::jsonb, $3, 0, $3)",
            [id.into(), aggregate_id.into(), now_ms.into()],
        ),
    ];
    for statement in statements {
        txn.execute_raw(statement).await.unwrap_or_else(|e| panic!("{t}: insert: {e}"));
    }
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: commit: {e}"));
}

/// The relay "process": its own pool, a relay polling every `poll`, and the listener on `channel` over
/// `listen_db`; returns once the listener listens and the relay's first pass is done.
async fn relay_process(
    t: &TestDb,
    broker: &InMemoryPublisher,
    listen_db: &DatabaseConnection,
    channel: &NotifyChannel,
    poll: Duration,
) -> (OutboxService, ListenerStatsHandle) {
    let store = SeaOrmStore::new(t.reconnect().await);
    let listener = notify::NotifyListener::new(listen_db, channel.clone()).unwrap_or_else(|e| panic!("{t}: {e}"));
    let stats = listener.stats();
    let service = OutboxService::builder(store, broker.clone())
        .relay_config(RelayConfig::default().with_poll_interval(poll))
        .without_cleanup()
        .with_task(move |stop| listener.run(stop))
        .start()
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while service.health().last_success_at.is_none() || !stats.get().connected {
        assert!(Instant::now() < deadline, "{t}: the relay never passed or the listener never listened");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // the catch-up pass is done: asleep in its poll
    (service, stats)
}

/// How long until the broker holds `count` messages (panics after `limit`).
async fn until_received(
    t: &TestDb,
    broker: &InMemoryPublisher,
    count: usize,
    since: Instant,
    limit: Duration,
) -> Duration {
    while broker.received_count() < count {
        assert!(since.elapsed() < limit, "{t}: {count} events not published within {limit:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    since.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_another_process_wakes_a_listening_relay_long_before_its_poll() {
    let _serial = SERIAL.lock().await;
    run_on(Backend::Postgres, "notify_wakes", async |t: TestDb| {
        let channel = channel("wakes");
        notify::install_notify_trigger(&t.db, &channel).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        let listen_db = listener_pool(&t, 1).await;
        let broker = InMemoryPublisher::new();
        let (service, stats) = relay_process(&t, &broker, &listen_db, &channel, LONG_POLL).await;
        let before = stats.get().notifications;

        let mut took = Vec::new();
        for i in 0..5 {
            let since = Instant::now();
            insert_event_with_sql(&t, &t.db, &format!("o{i}")).await;
            // Within WAIT, a tenth of the poll: woken by the notification, not polled.
            took.push(until_received(&t, &broker, i + 1, since, WAIT).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("{t}: poll {LONG_POLL:?}; published after a plain-SQL commit in another pool: {took:?}");
        assert!(stats.get().notifications >= before + 5, "{t}: every commit was notified: {:?}", stats.get());
        service.shutdown().await;
        assert!(!stats.get().connected, "{t}: the listener stops with the service");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listen_connection_falls_back_to_polling_and_recovers() {
    let _serial = SERIAL.lock().await;
    run_on(Backend::Postgres, "notify_reconnect", async |t: TestDb| {
        let channel = channel("reconnect");
        notify::install_notify_trigger(&t.db, &channel).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        // The listener's pool has one connection, so holding it keeps the listener from reconnecting.
        let listen_db = listener_pool(&t, 1).await;
        let broker = InMemoryPublisher::new();
        let (service, stats) = relay_process(&t, &broker, &listen_db, &channel, SHORT_POLL).await;

        let find = format!("SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN \"{channel}\"'");
        let row = t.db.query_one_raw(Statement::from_string(DbBackend::Postgres, find)).await;
        let pid: i32 = row
            .unwrap_or_else(|e| panic!("{t}: {e}"))
            .unwrap_or_else(|| panic!("{t}: no backend is in LISTEN {channel}"))
            .try_get("", "pid")
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        let kill = format!("SELECT pg_terminate_backend({pid})");
        t.db.execute_unprepared(&kill).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while stats.get().connected {
            assert!(Instant::now() < deadline, "{t}: the listener never noticed its connection was killed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The listener waits 100 ms before it reconnects: take the pool's one connection first.
        let held = listen_db.get_postgres_connection_pool().acquire().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        tokio::time::sleep(Duration::from_millis(200)).await;

        let since = Instant::now();
        insert_event_with_sql(&t, &t.db, "while-deaf").await;
        let by_poll = until_received(&t, &broker, 1, since, WAIT).await;
        let during = stats.get();
        assert!(!during.connected, "{t}: the event went out while nobody listened: {during:?}");
        assert!(during.lost >= 1 && during.connects == 1, "{t}: {during:?}");
        eprintln!("{t}: without a listener the poll published after {by_poll:?} (poll {SHORT_POLL:?})");

        drop(held);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !stats.get().connected {
            assert!(Instant::now() < deadline, "{t}: the listener never reconnected: {:?}", stats.get());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(stats.get().connects >= 2, "{t}: {:?}", stats.get());
        tokio::time::sleep(Duration::from_millis(100)).await; // its catch-up pass is done
        let notified = stats.get().notifications;
        let since = Instant::now();
        insert_event_with_sql(&t, &t.db, "after-reconnect").await;
        let woken = until_received(&t, &broker, 2, since, WAIT).await;
        eprintln!("{t}: after the reconnect a notification published after {woken:?}");
        // Recovered: the listener hears commits again (that a notification beats the poll is the first
        // test's subject; here the poll is short on purpose).
        let deadline = Instant::now() + WAIT;
        while stats.get().notifications <= notified {
            assert!(Instant::now() < deadline, "{t}: no notification after the reconnect: {:?}", stats.get());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        service.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_trigger_no_notification_is_sent_and_with_it_one_per_commit() {
    let _serial = SERIAL.lock().await;
    run_on(Backend::Postgres, "notify_disabled", async |t: TestDb| {
        use sea_orm::sqlx::postgres::PgListener;
        let channel = channel("disabled");
        let mut listener =
            PgListener::connect_with(t.db.get_postgres_connection_pool()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        listener.listen(channel.as_str()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        let silent = async |listener: &mut PgListener| {
            tokio::time::timeout(Duration::from_millis(300), listener.recv()).await.is_err()
        };

        assert_eq!(notify::notify_trigger_channel(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}")), None);
        outbox_seaorm::enqueue(&t.db, &common::event("o1", "order.placed", 1))
            .await
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        insert_event_with_sql(&t, &t.db, "o2").await;
        assert!(silent(&mut listener).await, "{t}: no trigger, so no NOTIFY");

        notify::install_notify_trigger(&t.db, &channel).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        let installed = notify::notify_trigger_channel(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(installed.as_deref(), Some(channel.as_str()), "{t}");
        // One commit of three events (one statement): one notification.
        let events: Vec<_> = (0..3).map(|i| common::event(&format!("b{i}"), "order.placed", i)).collect();
        common::enqueue_committed(&t, &events).await;
        let got = tokio::time::timeout(Duration::from_secs(30), listener.recv()).await;
        let got = got.unwrap_or_else(|_| panic!("{t}: no notification")).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!((got.channel(), got.payload()), (channel.as_str(), ""), "{t}");
        assert!(silent(&mut listener).await, "{t}: one notification per commit");
        // A rolled-back insert notifies nobody.
        let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        outbox_seaorm::enqueue(&txn, &common::event("r1", "order.placed", 1))
            .await
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        txn.rollback().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        assert!(silent(&mut listener).await, "{t}: a rollback is not notified");

        notify::remove_notify_trigger(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        insert_event_with_sql(&t, &t.db, "o3").await;
        assert!(silent(&mut listener).await, "{t}: the trigger is gone, so is the NOTIFY");
        assert_eq!(common::count_outbox(&t).await, 6, "{t}: every insert committed (but the rolled-back one)");
    })
    .await;
}

#[tokio::test]
async fn notify_is_refused_with_the_reason_on_other_backends() {
    run_on(Backend::Sqlite, "notify_sqlite", async |t: TestDb| {
        let err = notify::install_notify_trigger(&t.db, &NotifyChannel::default()).await.expect_err("SQLite");
        assert!(err.to_string().contains("LISTEN/NOTIFY needs PostgreSQL, not SQLite"), "{err}");
        let err = SeaOrmStore::new(t.db.clone()).notify_listener(NotifyChannel::default()).expect_err("SQLite");
        assert!(err.to_string().contains("needs PostgreSQL"), "{err}");
        assert_eq!(notify::notify_trigger_channel(&t.db).await.unwrap_or_else(|e| panic!("{e}")), None);
    })
    .await;
}

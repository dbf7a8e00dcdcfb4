//! A writer that knows only SQL (another service, another language, a script) inserts outbox rows with the
//! statement `docs/foreign-writers.md` gives, from a connection of its own: the relay publishes them in
//! per-aggregate insert order, interleaved correctly with the app's own events, marks the rows it cannot
//! decode dead with a reason, and `stats` agrees with the rows.

use crate::common;

use std::collections::BTreeMap;

use common::{count_published, enqueue_committed, event, fast_config, outbox_rows};
use outbox_integration_tests::contract::eventually;
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{CancellationToken, InMemoryPublisher, Relay, SeaOrmStore};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait, Value};
use sea_orm_migration::MigratorTrait;

/// The guide whose statements these tests run, verbatim.
const GUIDE: &str = include_str!("../../../docs/foreign-writers.md");

/// The guide's `INSERT` for `backend`: the first SQL block after the backend's heading.
fn documented_insert(backend: DbBackend) -> &'static str {
    let heading = match backend {
        DbBackend::Postgres => "\nPostgreSQL:\n",
        DbBackend::MySql => "\nMySQL and MariaDB:\n",
        _ => "\nSQLite:\n",
    };
    let section = GUIDE.split(heading).nth(1).unwrap_or_else(|| panic!("the guide has no {heading:?} section"));
    let block = section.split("```sql\n").nth(1).expect("an SQL block follows the heading");
    block.split("\n```").next().expect("the block ends").trim()
}

/// The guide's statement for `rows` rows in one `VALUES` list (PostgreSQL's placeholders renumbered).
fn documented_insert_of(backend: DbBackend, rows: usize) -> String {
    let sql = documented_insert(backend);
    let (head, tuple) = sql.split_once("VALUES ").expect("a VALUES list");
    let tuples: Vec<String> = (0..rows)
        .map(|row| {
            let mut tuple = tuple.to_owned();
            if backend == DbBackend::Postgres {
                for n in (1..=9).rev() {
                    tuple = tuple.replace(&format!("${n}"), &format!("$#{}", row * 9 + n));
                }
                tuple = tuple.replace("$#", "$");
            }
            tuple
        })
        .collect();
    format!("{head}VALUES {}", tuples.join(", "))
}

/// One row as a plain writer binds it.
struct Plain<'a> {
    event_id: String,
    aggregate_id: &'a str,
    event_type: &'a str,
    headers: &'a str,
}

impl<'a> Plain<'a> {
    fn new(aggregate_id: &'a str, event_type: &'a str) -> Self {
        Plain { event_id: uuid::Uuid::now_v7().to_string(), aggregate_id, event_type, headers: "{}" }
    }

    fn with_headers(self, headers: &'a str) -> Self {
        Plain { headers, ..self }
    }

    fn with_event_id(self, event_id: &str) -> Self {
        Plain { event_id: event_id.to_owned(), ..self }
    }

    fn values(&self) -> [Value; 9] {
        let now_ms = chrono::Utc::now().timestamp_millis();
        [
            self.event_id.clone().into(),
            "order".into(),
            self.aggregate_id.into(),
            self.event_type.into(),
            1i32.into(),
            format!(r#"{{"step": "{}"}}"#, self.event_type).into(),
            self.headers.into(),
            now_ms.into(),
            now_ms.into(),
        ]
    }
}

/// Inserts `rows` with one statement, in one transaction of `writer` (not the app's pool).
async fn write_plain(t: &TestDb, writer: &DatabaseConnection, rows: &[Plain<'_>]) {
    let sql = documented_insert_of(t.backend, rows.len());
    let values: Vec<Value> = rows.iter().flat_map(Plain::values).collect();
    let txn = writer.begin().await.unwrap_or_else(|e| panic!("{t}: begin: {e}"));
    txn.execute_raw(Statement::from_sql_and_values(t.backend, &sql, values))
        .await
        .unwrap_or_else(|e| panic!("{t}: the documented INSERT failed: {e}\n{sql}"));
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: commit: {e}"));
}

/// Runs relay passes until one finds nothing; returns what the broker received, per aggregate, as event types.
async fn drain(t: &TestDb) -> BTreeMap<String, Vec<(i64, String)>> {
    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("config");
    loop {
        let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
        if pass.claimed == 0 && pass.dead == 0 {
            break;
        }
    }
    let mut per_aggregate: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for e in broker.received() {
        per_aggregate.entry(e.aggregate_id.clone()).or_default().push((e.aggregate_version, e.event_type.clone()));
    }
    per_aggregate
}

fn numbered(types: &[&str]) -> Vec<(i64, String)> {
    types.iter().enumerate().map(|(i, t)| (i as i64 + 1, (*t).to_owned())).collect()
}

async fn rows_written_with_plain_sql_are_published_in_insert_order(t: TestDb) {
    let writer = t.reconnect().await;
    write_plain(&t, &writer, &[Plain::new("f1", "f1.a"), Plain::new("f2", "f2.a"), Plain::new("f1", "f1.b")]).await;
    // The app writes into the same aggregate between two plain writers' transactions.
    enqueue_committed(&t, &[event("f1", "f1.c", 1)]).await;
    write_plain(&t, &writer, &[Plain::new("f3", "f3.a")]).await;
    write_plain(&t, &writer, &[Plain::new("f1", "f1.d"), Plain::new("f2", "f2.b")]).await;
    // Undecodable: f4's head has headers that are a JSON array (its second event waits behind it), f5's
    // event id is not a UUID.
    write_plain(&t, &writer, &[Plain::new("f4", "f4.a").with_headers("[1, 2]"), Plain::new("f4", "f4.b")]).await;
    write_plain(&t, &writer, &[Plain::new("f5", "f5.a").with_event_id("not-a-uuid")]).await;

    let received = drain(&t).await;
    assert_eq!(received.get("f1"), Some(&numbered(&["f1.a", "f1.b", "f1.c", "f1.d"])), "{t}: {received:?}");
    assert_eq!(received.get("f2"), Some(&numbered(&["f2.a", "f2.b"])), "{t}: {received:?}");
    assert_eq!(received.get("f3"), Some(&numbered(&["f3.a"])), "{t}: {received:?}");
    assert_eq!(received.len(), 3, "{t}: nothing of f4 or f5 was published: {received:?}");

    let rows = outbox_rows(&t).await;
    let error_of = |event_type: &str| {
        let row = rows.iter().find(|r| r.event_type == event_type).expect("the row is kept");
        assert!(row.dead_at_ms.is_some() && row.published_at_ms.is_none(), "{t}: {row:?}");
        row.last_error.clone().unwrap_or_default()
    };
    assert!(error_of("f4.a").contains("headers"), "{t}: {}", error_of("f4.a"));
    assert!(error_of("f5.a").contains("is not a UUID"), "{t}: {}", error_of("f5.a"));
    let blocked = rows.iter().find(|r| r.event_type == "f4.b").expect("f4.b is kept");
    assert!(blocked.published_at_ms.is_none() && blocked.dead_at_ms.is_none(), "{t}: {blocked:?}");

    let stats = SeaOrmStore::new(t.db.clone()).stats(chrono::Utc::now()).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(count_published(&t).await, 7, "{t}");
    assert_eq!((stats.dead, stats.pending), (2, 1), "{t}: the two dead heads, and f4.b behind one: {stats:?}");
}
per_backend!(rows_written_with_plain_sql_are_published_in_insert_order, "foreign_writers_order");

async fn two_plain_writers_of_one_aggregate_are_numbered_in_commit_order(t: TestDb) {
    let (first, second) = (t.reconnect().await, t.reconnect().await);
    let mut expected = Vec::new();
    for round in 0..10 {
        let writer = if round % 2 == 0 { &first } else { &second };
        let (a, b) = (format!("r{round}.a"), format!("r{round}.b"));
        write_plain(&t, writer, &[Plain::new("hot", &a), Plain::new("hot", &b)]).await;
        expected.extend([a, b]);
    }
    let received = drain(&t).await;
    let types: Vec<String> =
        received.get("hot").map(|r| r.iter().map(|(_, t)| t.clone()).collect()).unwrap_or_default();
    assert_eq!(types, expected, "{t}");
    let versions: Vec<i64> = received["hot"].iter().map(|(v, _)| *v).collect();
    assert_eq!(versions, (1..=20).collect::<Vec<i64>>(), "{t}: gapless versions");
}
per_backend!(two_plain_writers_of_one_aggregate_are_numbered_in_commit_order, "foreign_writers_two");

async fn a_row_written_before_the_trigger_existed_is_numbered_by_the_migration(t: TestDb) {
    let old = t.empty("foreign_writers_upgrade").await;
    // A database as the previous release left it: every migration but the trigger's.
    let migrations = outbox_seaorm::migrations();
    let trigger = migrations.iter().position(|m| m.name() == "m20261216_000005_foreign_writers").expect("shipped");
    let before_trigger = trigger as u32;
    outbox_seaorm::Migrator::up(&old.db, Some(before_trigger)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    enqueue_committed(&old, &[event("u1", "u1.a", 1)]).await;
    let writer = old.reconnect().await;
    write_plain(&old, &writer, &[Plain::new("u1", "u1.b")]).await;
    write_plain(&old, &writer, &[Plain::new("u2", "u2.a")]).await;

    outbox_seaorm::migrate(&old.db).await.unwrap_or_else(|e| panic!("{t}: migrate: {e}"));
    write_plain(&old, &writer, &[Plain::new("u1", "u1.c"), Plain::new("u2", "u2.b")]).await;
    let received = drain(&old).await;
    assert_eq!(received.get("u1"), Some(&numbered(&["u1.a", "u1.b", "u1.c"])), "{t}: {received:?}");
    assert_eq!(received.get("u2"), Some(&numbered(&["u2.a", "u2.b"])), "{t}: {received:?}");
}
per_backend!(a_row_written_before_the_trigger_existed_is_numbered_by_the_migration, "foreign_writers_upgrade_host");

/// A relay that would poll once an hour publishes a row another writer committed with plain SQL (no
/// wake-up of its own) as soon as a commit watch in the relay's process sees it: nothing on the writer's
/// side, every backend.
async fn a_commit_watch_wakes_the_relay_for_rows_another_writer_committed(t: TestDb) {
    let broker = InMemoryPublisher::new();
    let hourly = fast_config().with_poll_interval(std::time::Duration::from_secs(3600));
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), hourly).expect("config");
    let watch = SeaOrmStore::new(t.db.clone()).commit_watch(std::time::Duration::from_millis(5)).expect("watch");
    let stats = watch.stats();
    let stop = CancellationToken::new();
    let relay_task = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    let watch_task = tokio::spawn(watch.run(stop.clone()));
    let minute = std::time::Duration::from_secs(60);
    eventually(minute, &format!("{t}: the watch looked"), async || stats.get().probes >= 2).await;

    write_plain(&t, &t.reconnect().await, &[Plain::new("w1", "w1.a"), Plain::new("w2", "w2.a")]).await;
    eventually(minute, &format!("{t}: both rows published"), async || broker.received_count() == 2).await;
    assert!(stats.get().wakes >= 1, "{t}: the watch woke the relay: {:?}", stats.get());
    assert_eq!(stats.get().failures, 0, "{t}: {:?}", stats.get());
    stop.cancel();
    relay_task.await.expect("relay task");
    watch_task.await.expect("watch task");
}
per_backend!(a_commit_watch_wakes_the_relay_for_rows_another_writer_committed, "foreign_writers_watch");

/// The guide's statements for a writer of many rows on `backend` ("PostgreSQL, many rows:" or "MySQL and
/// MariaDB, many rows:"), one per element.
fn documented_bulk(backend: DbBackend) -> Vec<&'static str> {
    let heading = match backend {
        DbBackend::Postgres => "\nPostgreSQL, many rows:",
        _ => "\nMySQL and MariaDB, many rows:",
    };
    let section = GUIDE.split(heading).nth(1).unwrap_or_else(|| panic!("the guide has no {heading:?} section"));
    let block = section.split("```sql\n").nth(1).expect("an SQL block follows the heading");
    block.split("\n```").next().expect("the block ends").split(";\n").map(str::trim).collect()
}

/// The aggregates the bulk tests write: `bulk-00` .. `bulk-49`.
const BULK_AGGREGATES: u64 = 50;

fn bulk_aggregate(n: u64) -> String {
    format!("bulk-{:02}", n % BULK_AGGREGATES)
}

/// Writer `writer`'s `rows` rows, over every bulk aggregate in a scattered order, staged in a temporary
/// `staged_events` of its connection, then inserted by `statements`, all in one transaction.
async fn write_staged(db: &DatabaseConnection, writer: u64, rows: u64, statements: &[&str]) -> Result<(), DbErr> {
    let now = chrono::Utc::now().timestamp_millis();
    let (create, fill, drop) = match db.get_database_backend() {
        DbBackend::Postgres => (
            "CREATE TEMP TABLE staged_events (id bigint PRIMARY KEY, event_id varchar(36), aggregate_type varchar(64), \
             aggregate_id varchar(128), event_type varchar(128), schema_version int, payload jsonb, headers jsonb, \
             created_at_ms bigint, next_attempt_at_ms bigint) ON COMMIT DROP",
            format!(
                "INSERT INTO staged_events SELECT i, gen_random_uuid()::text, 'order', \
                 'bulk-' || lpad(((i * 37 + {writer}) % {BULK_AGGREGATES})::text, 2, '0'), 'bulk.written', 1, \
                 jsonb_build_object('writer', {writer}, 'i', i), '{{}}'::jsonb, {now}, {now} \
                 FROM generate_series(1, {rows}) AS i"
            ),
            None,
        ),
        // MariaDB's sequence tables (`seq_1_to_n`) number the rows.
        _ => (
            "CREATE TEMPORARY TABLE staged_events (id bigint PRIMARY KEY, event_id varchar(36), \
             aggregate_type varchar(64), aggregate_id varchar(128), event_type varchar(128), schema_version int, \
             payload json, headers json, created_at_ms bigint, next_attempt_at_ms bigint)",
            format!(
                "INSERT INTO staged_events SELECT seq, UUID(), 'order', \
                 CONCAT('bulk-', LPAD((seq * 37 + {writer}) % {BULK_AGGREGATES}, 2, '0')), 'bulk.written', 1, \
                 JSON_OBJECT('writer', {writer}, 'i', seq), '{{}}', {now}, {now} FROM seq_1_to_{rows}"
            ),
            Some("DROP TEMPORARY TABLE staged_events"),
        ),
    };
    let txn = db.begin().await?;
    txn.execute_unprepared(create).await?;
    txn.execute_unprepared(&fill).await?;
    for statement in statements {
        txn.execute_unprepared(statement).await?;
    }
    if let Some(drop) = drop {
        txn.execute_unprepared(drop).await?;
    }
    txn.commit().await
}

/// App transactions that `enqueue` into two bulk aggregates each (one call, so in byte order), until
/// `done`; returns how many committed and the errors of those that did not.
async fn enqueue_until(db: DatabaseConnection, task: u64, done: CancellationToken) -> (u64, Vec<String>) {
    let (mut committed, mut errors) = (0, Vec::new());
    let mut k = task;
    while !done.is_cancelled() {
        k += 7;
        let events = [event(&bulk_aggregate(k), "app.written", k), event(&bulk_aggregate(k + 17), "app.written", k)];
        let written = async {
            let txn = db.begin().await?;
            outbox_seaorm::enqueue_all(&txn, &events).await.map_err(|e| DbErr::Custom(e.to_string()))?;
            txn.commit().await
        };
        match written.await {
            Ok(()) => committed += 2,
            Err(e) => errors.push(e.to_string()),
        }
    }
    (committed, errors)
}

/// Every aggregate's versions are 1..n, and its `outbox_aggregates` row says n; returns the rows.
async fn assert_gapless(t: &TestDb) -> u64 {
    let sql = "SELECT e.aggregate_id, COUNT(*) AS n, COUNT(DISTINCT e.aggregate_version) AS d, \
               MAX(e.aggregate_version) AS m, MAX(a.last_version) AS l FROM outbox_events e \
               JOIN outbox_aggregates a ON a.aggregate_type = e.aggregate_type AND a.aggregate_id = e.aggregate_id \
               GROUP BY e.aggregate_id";
    let mut total = 0;
    for row in t.db.query_all_raw(Statement::from_string(t.backend, sql)).await.unwrap_or_else(|e| panic!("{t}: {e}")) {
        let id: String = row.try_get("", "aggregate_id").expect("id");
        let [n, d, m, l] = ["n", "d", "m", "l"].map(|c| row.try_get::<i64>("", c).expect("count"));
        assert!(n == d && d == m && m == l, "{t}: {id}: {n} rows, {d} versions, highest {m}, last_version {l}");
        total += n as u64;
    }
    total
}

/// Plain writers of many rows that follow the guide race each other and the app's `enqueue`: nobody is
/// rolled back, and every aggregate is numbered without a gap.
async fn plain_writers_of_many_rows_that_follow_the_guide_never_fail_anyone(t: TestDb) {
    let (writers, rows, rounds) = match t.backend {
        DbBackend::Postgres => (3, 2_000, 3),
        DbBackend::MySql => (2, 10_000, 2),
        _ => return, // one writer at a time: nothing to order
    };
    let statements = documented_bulk(t.backend);
    let done = CancellationToken::new();
    let app: Vec<_> = (0..4).map(|task| tokio::spawn(enqueue_until(t.db.clone(), task, done.clone()))).collect();
    let mut bulk_errors = Vec::new();
    for round in 0..rounds {
        let mut tasks = Vec::new();
        for writer in 0..writers {
            let (db, statements) = (t.reconnect().await, statements.clone());
            tasks.push(tokio::spawn(async move {
                write_staged(&db, round * 10 + writer, rows, &statements).await.err().map(|e| e.to_string())
            }));
        }
        for task in tasks {
            bulk_errors.extend(task.await.expect("writer task"));
        }
    }
    done.cancel();
    let mut app_errors = Vec::new();
    let mut enqueued = 0;
    for task in app {
        let (committed, errors) = task.await.expect("app task");
        enqueued += committed;
        app_errors.extend(errors);
    }
    assert!(bulk_errors.is_empty(), "{t}: plain writers failed: {bulk_errors:?}");
    assert!(app_errors.is_empty(), "{t}: {} app transactions failed: {app_errors:?}", app_errors.len());
    assert!(enqueued > 0, "{t}: the app wrote while the plain writers ran");
    assert_eq!(assert_gapless(&t).await, writers * rows * rounds + enqueued, "{t}: every row numbered");
}
per_backend!(plain_writers_of_many_rows_that_follow_the_guide_never_fail_anyone, "foreign_writers_bulk");

/// MariaDB/MySQL: why the guide locks the aggregates first. An app transaction holds `bulk-00` (it
/// enqueued into it) while a plain `INSERT … SELECT` waits for that row inside its trigger, holding the
/// table's AUTO-INC lock; the app's next `enqueue` then needs that lock, and InnoDB rolls the app back.
/// With the guide's first statement, the plain writer waits for `bulk-00` before it holds the AUTO-INC
/// lock, and both commit.
async fn on_mariadb_a_plain_bulk_insert_must_lock_its_aggregates_first(t: TestDb) {
    if t.backend != DbBackend::MySql {
        return;
    }
    let statements = documented_bulk(t.backend);
    for guarded in [false, true] {
        let app = t.db.begin().await.expect("begin");
        outbox_seaorm::enqueue_all(&app, &[event("bulk-00", "app.first", 1)]).await.expect("enqueue bulk-00");
        let writer_db = t.reconnect().await;
        let plain = if guarded { statements.clone() } else { statements[1..].to_vec() };
        let writer = tokio::spawn(async move { write_staged(&writer_db, 1, 10_000, &plain).await });
        // Wait until the plain writer waits for bulk-00.
        let waiting = "SELECT x.trx_state AS state FROM information_schema.innodb_trx x \
                       JOIN information_schema.processlist p ON p.id = x.trx_mysql_thread_id \
                       WHERE p.db = DATABASE()";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            assert!(!writer.is_finished(), "{t}: the plain writer ended without waiting: {:?}", writer.await);
            let rows = t.db.query_all_raw(Statement::from_string(t.backend, waiting)).await.expect("innodb_trx");
            if rows.iter().any(|row| row.try_get::<String>("", "state").is_ok_and(|state| state == "LOCK WAIT")) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{t}: the plain writer never waited for bulk-00");
            // InnoDB refreshes what `innodb_trx` shows only when it was last read 0.1 s ago or more.
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        // The app's next aggregate, after bulk-00 in byte order, as the guide asks.
        let next = outbox_seaorm::enqueue_all(&app, &[event("bulk-01", "app.second", 2)]).await;
        let app_outcome = match next {
            Ok(_) => app.commit().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let writer_outcome = writer.await.expect("writer task");
        if guarded {
            assert!(app_outcome.is_ok(), "{t}: the app failed beside a guarded writer: {app_outcome:?}");
            assert!(writer_outcome.is_ok(), "{t}: the guarded writer failed: {writer_outcome:?}");
        } else {
            let error = app_outcome.expect_err("the app's transaction is rolled back beside an unguarded writer");
            assert!(error.contains("1467") || error.contains("1213"), "{t}: {error}");
            assert!(writer_outcome.is_ok(), "{t}: the unguarded writer itself commits: {writer_outcome:?}");
        }
    }
    assert_eq!(assert_gapless(&t).await, 20_002, "{t}: two writers' rows and the guarded app's two events");
}
per_backend!(on_mariadb_a_plain_bulk_insert_must_lock_its_aggregates_first, "foreign_writers_autoinc");

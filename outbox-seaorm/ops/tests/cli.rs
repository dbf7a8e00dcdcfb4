//! The `outbox` binary, run as a process: bad URLs fail without showing the password, `check` reports a
//! read-only database, `stats --json` parses, and `relay` survives a broker that is down at start and
//! stops cleanly on SIGTERM, `relay --http` serves `/metrics` and the health probes, and the dashboard (beside
//! the relay, or alone) shows the outbox and refuses actions without the admin token.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Running, free_port, get, outbox, request, target, text};
use outbox_integration_tests::{TestDb, per_backend};
use outbox_seaorm::NewEvent;
use sea_orm::{ConnectionTrait, DbBackend, TransactionTrait};

const SECRET: &str = "s3cr3t-pw";

fn run(t: &TestDb, args: &[&str]) -> Output {
    let (url, extra) = target(t);
    outbox().env("DATABASE_URL", url).args(extra).args(args).output().expect("run outbox")
}

async fn enqueue(t: &TestDb, events: &[NewEvent]) {
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    outbox_seaorm::enqueue_all(&txn, events).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: {e}"));
}

fn order(id: &str, event_type: &str) -> NewEvent {
    NewEvent::new("order", id, event_type, &serde_json::json!({ "id": id })).expect("event")
}

#[test]
fn a_bad_database_url_exits_non_zero_without_printing_the_password() {
    for url in [
        format!("postgres://app:{SECRET}@127.0.0.1:1/shop"), // nothing listens
        format!("postgres://app:{SECRET}@127.0.0.1:notaport/shop"), // malformed
        format!("mysql://app:{SECRET}@127.0.0.1:1/shop"),
        format!("http://app:{SECRET}@127.0.0.1/shop"), // not a database
    ] {
        let started = Instant::now();
        let output = outbox().env("DATABASE_URL", &url).arg("stats").output().expect("run outbox");
        let all = text(&output);
        assert!(!output.status.success(), "{url}: exit 0: {all}");
        assert!(all.contains("error:"), "{url}: no clear message: {all}");
        assert!(!all.contains(SECRET), "{url}: the password was printed: {all}");
        // Fails at once; the bound only tells it apart from sqlx's 30 s default acquire timeout.
        assert!(started.elapsed() < Duration::from_secs(25), "{url}: took {:?}", started.elapsed());
    }
    let output = outbox().arg("check").output().expect("run outbox");
    assert!(!output.status.success() && text(&output).contains("DATABASE_URL"), "{}", text(&output));
}

#[test]
fn a_connect_failure_names_the_database_without_its_password() {
    let url = format!("postgres://app:{SECRET}@127.0.0.1:1/shop");
    let output = outbox().env("DATABASE_URL", &url).arg("stats").output().expect("run outbox");
    let all = text(&output);
    assert!(!output.status.success(), "{all}");
    assert!(all.contains("cannot connect to PostgreSQL at postgres://***@127.0.0.1:1/shop"), "{all}");
}

#[test]
fn an_empty_or_odd_schema_is_a_usage_error_that_says_what_to_do() {
    for (schema, says) in [("", "is empty: name the schema"), ("bad-name", "is not a plain identifier")] {
        let output = outbox()
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
            .env("OUTBOX_SCHEMA", schema)
            .arg("stats")
            .output()
            .expect("run outbox");
        let all = text(&output);
        assert_eq!(output.status.code(), Some(2), "{schema:?}: {all}");
        assert!(all.contains(says) && all.contains("--schema"), "{schema:?}: {all}");
    }
}

#[test]
fn help_lists_every_subcommand() {
    let output = outbox().arg("--help").output().expect("run outbox");
    let help = String::from_utf8_lossy(&output.stdout);
    for command in ["relay", "migrate", "stats", "dead", "dead-letters", "cleanup", "check"] {
        assert!(help.contains(command), "--help lacks {command}: {help}");
    }
}

#[test]
fn an_unmigrated_database_is_refused_until_migrate_runs() {
    let path = std::env::temp_dir().join(format!("outbox-cli-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let stats = outbox().env("DATABASE_URL", &url).arg("stats").output().expect("run outbox");
    assert!(!stats.status.success(), "{}", text(&stats));
    assert!(text(&stats).contains("run `outbox migrate`"), "{}", text(&stats));
    let check = outbox().env("DATABASE_URL", &url).arg("check").output().expect("run outbox");
    assert!(!check.status.success() && text(&check).contains("FAIL  migrations"), "{}", text(&check));

    let migrate = outbox().env("DATABASE_URL", &url).arg("migrate").output().expect("run outbox");
    assert!(migrate.status.success(), "{}", text(&migrate));
    let applied = format!("applied {}", outbox_ops::admin::MIGRATION_NAMES.len());
    assert!(text(&migrate).contains(&applied), "{}", text(&migrate));
    let again = outbox().env("DATABASE_URL", &url).arg("migrate").output().expect("run outbox");
    assert!(again.status.success() && text(&again).contains("all applied already"), "{}", text(&again));
    let check = outbox().env("DATABASE_URL", &url).arg("check").output().expect("run outbox");
    assert!(check.status.success(), "{}", text(&check));
    let _ = std::fs::remove_file(&path);
}

async fn migrate_partitions_the_outbox_on_postgresql_and_refuses_elsewhere(t: TestDb) {
    enqueue(&t, &[order("o1", "order.placed"), order("o1", "order.paid")]).await;
    let output = run(&t, &["migrate", "--partition", "day"]);
    if t.backend != DbBackend::Postgres {
        assert!(!output.status.success() && text(&output).contains("needs PostgreSQL"), "{t}: {}", text(&output));
        return;
    }
    assert!(output.status.success(), "{t}: {}", text(&output));
    assert!(text(&output).contains("partitioned by creation time, one partition per day"), "{t}: {}", text(&output));
    let again = run(&t, &["migrate", "--partition", "day"]);
    assert!(text(&again).contains("partitioned already"), "{t}: {}", text(&again));
    let stats = run(&t, &["stats"]);
    assert!(text(&stats).contains("pending 2, dead 0"), "{t}: the rows were carried over: {}", text(&stats));
    let cleanup = run(&t, &["cleanup", "--outbox-retention", "1d"]);
    assert!(cleanup.status.success(), "{t}: {}", text(&cleanup));
    let bad = run(&t, &["migrate", "--partition", "week"]);
    assert!(!bad.status.success() && text(&bad).contains("expected `hour` or `day`"), "{t}: {}", text(&bad));
}
per_backend!(migrate_partitions_the_outbox_on_postgresql_and_refuses_elsewhere, "cli_partition");

async fn stats_json_parses_and_counts_the_backlog(t: TestDb) {
    enqueue(&t, &[order("o1", "order.placed"), order("o1", "order.paid"), order("o2", "order.placed")]).await;
    let output = run(&t, &["stats", "--json"]);
    assert!(output.status.success(), "{t}: {}", text(&output));
    let stats: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!(stats["pending"], 3, "{t}: {stats}");
    assert_eq!(stats["by_event_type"][0]["name"], "order.paid", "{t}: {stats}");
    let plain = run(&t, &["stats"]);
    assert!(text(&plain).contains("pending 3, dead 0"), "{t}: {}", text(&plain));
    let dead = run(&t, &["dead", "list", "--json"]);
    assert_eq!(serde_json::from_slice::<Vec<serde_json::Value>>(&dead.stdout).map(|v| v.len()).ok(), Some(0));
    let replay = run(&t, &["dead", "replay"]);
    assert!(!replay.status.success() && text(&replay).contains("needs a filter"), "{t}: {}", text(&replay));
    let replay = run(&t, &["dead", "replay", "--event-type", "order.placed"]);
    assert!(text(&replay).contains("replayed 0 dead event(s)"), "{t}: {}", text(&replay));
}
per_backend!(stats_json_parses_and_counts_the_backlog, "cli_stats_json");

async fn dead_list_labels_its_numbers_and_show_takes_the_id_like_the_others(t: TestDb) {
    let event = order("o1", "order.placed");
    enqueue(&t, std::slice::from_ref(&event)).await;
    let sql = format!(
        "UPDATE outbox_events SET dead_at_ms = 1, attempts = 3, last_error = 'broker said no' WHERE event_id = '{}'",
        event.id()
    );
    t.db.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{t}: {e}"));

    let list = text(&run(&t, &["dead", "list"]));
    for label in
        ["order.placed (schema v1)", "order/o1 event #1 of the aggregate", "seq 1", "attempts 3", "broker said no"]
    {
        assert!(list.contains(label), "{t}: {label:?} in {list}");
    }
    let shown = run(&t, &["dead", "show", "--id", &event.id().to_string()]);
    let json: serde_json::Value =
        serde_json::from_slice(&shown.stdout).unwrap_or_else(|e| panic!("{t}: {e}: {}", text(&shown)));
    assert_eq!(json["payload"]["id"], "o1", "{t}: {json}");
    let positional = run(&t, &["dead", "show", &event.id().to_string()]);
    assert_eq!(positional.status.code(), Some(2), "{t}: {}", text(&positional));
}
per_backend!(dead_list_labels_its_numbers_and_show_takes_the_id_like_the_others, "cli_dead_labels");

/// A PostgreSQL database of its own whose sessions default to read-only, migrated before that was set;
/// dropped by [`drop_database`].
async fn read_only_database(name: &str) -> Option<(sea_orm::DatabaseConnection, String)> {
    let admin_url = std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let admin = match outbox_seaorm::connect_with(&admin_url, |o| {
        o.connect_timeout(Duration::from_secs(2)).acquire_timeout(Duration::from_secs(2));
    })
    .await
    {
        Ok(admin) => admin,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("CI=true but PostgreSQL: {e}"),
        Err(e) => {
            eprintln!("skipping: PostgreSQL at {admin_url} is unreachable: {e}");
            return None;
        }
    };
    admin.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.expect("drop");
    admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await.expect("create database");
    let base = admin_url.rsplit_once('/').map(|(base, _)| base).unwrap_or(&admin_url);
    let url = format!("{base}/{name}");
    let db = outbox_seaorm::connect(&url).await.expect("connect");
    outbox_seaorm::migrate(&db).await.expect("migrate");
    db.close().await.ok();
    let sql = format!("ALTER DATABASE {name} SET default_transaction_read_only = on");
    admin.execute_unprepared(&sql).await.expect("read-only");
    Some((admin, url))
}

async fn drop_database(admin: &sea_orm::DatabaseConnection, name: &str) {
    let _ = admin.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
}

#[tokio::test]
async fn check_reports_a_read_only_database_and_relay_refuses_it() {
    let name = format!("t_cli_read_only_{}", outbox_integration_tests::run_suffix());
    let Some((admin, url)) = read_only_database(&name).await else { return };

    let check = outbox().env("DATABASE_URL", &url).args(["check", "--json"]).output().expect("run outbox");
    let report: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap_or_else(|e| panic!("{e}: {check:?}"));
    let primary = report["checks"].as_array().and_then(|c| c.iter().find(|c| c["name"] == "primary")).cloned();
    drop_database_after(&admin, &name, || {
        assert!(!check.status.success(), "check passed on a read-only database: {report}");
        let primary = primary.expect("a primary check");
        assert_eq!(primary["ok"], false, "{report}");
        assert!(primary["detail"].as_str().is_some_and(|d| d.contains("default_transaction_read_only")), "{report}");
        assert_eq!(report["checks"][1]["ok"], true, "the migrations are there: {report}");
    })
    .await;

    let (admin, url) = read_only_database(&name).await.expect("again");
    let relay = outbox()
        .env("DATABASE_URL", &url)
        .args(["relay", "--broker", "redis://127.0.0.1:6379", "--destination", "outbox-cli-test:read-only"])
        .output()
        .expect("run outbox");
    drop_database_after(&admin, &name, || {
        assert!(!relay.status.success(), "the relay started on a read-only database");
        assert!(text(&relay).contains("read-only") && text(&relay).contains("primary"), "{}", text(&relay));
    })
    .await;
}

/// Runs `assertions`, dropping the database whether they pass or not.
async fn drop_database_after(admin: &sea_orm::DatabaseConnection, name: &str, assertions: impl FnOnce()) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(assertions));
    drop_database(admin, name).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Creates a consumer group on `stream` (and the stream) where Redis answers, as a consumer would before the
/// relay runs: the relay appends only to streams that exist.
fn create_consumer_group(url: &str, stream: &str) {
    use outbox_seaorm::brokers::redis::redis;
    // A test of a broker that is down has nothing to create.
    let Ok(mut connection) = redis::Client::open(url).and_then(|c| c.get_connection()) else { return };
    let created: redis::RedisResult<()> =
        redis::cmd("XGROUP").arg("CREATE").arg(stream).arg("billing").arg("0").arg("MKSTREAM").query(&mut connection);
    if let Err(e) = created {
        assert_eq!(e.code(), Some("BUSYGROUP"), "XGROUP CREATE {stream}: {e}");
    }
}

/// Kills the child when a test fails before stopping it.
fn spawn_relay(t: &TestDb, broker: &str, stream: &str) -> Running {
    spawn_relay_with(t, broker, stream, &[])
}

fn spawn_relay_with(t: &TestDb, broker: &str, stream: &str, more: &[&str]) -> Running {
    if broker.starts_with("redis://") {
        create_consumer_group(broker, stream);
    }
    let (url, extra) = target(t);
    let child = outbox()
        .env("DATABASE_URL", url)
        .env("OUTBOX_POLL_INTERVAL", "100ms")
        .env("OUTBOX_LOG", "outbox=info,outbox_runtime=info,warn")
        .args(extra)
        .args(["relay", "--broker", broker, "--destination", stream])
        .args(more)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn outbox relay");
    Running(Some(child))
}

async fn published(t: &TestDb) -> i64 {
    let sql = "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at_ms IS NOT NULL";
    let row = t.db.query_one_raw(sea_orm::Statement::from_string(t.backend, sql)).await.expect("count");
    row.and_then(|r| r.try_get::<i64>("", "n").ok()).unwrap_or_default()
}

async fn the_relay_publishes_and_stops_cleanly_on_sigterm(t: TestDb) {
    if t.backend == DbBackend::MySql {
        return; // the same code path as PostgreSQL; one server process is enough here
    }
    enqueue(&t, &[order("o1", "order.placed"), order("o2", "order.placed")]).await;
    let stream = format!("outbox-cli-test:{}", outbox_integration_tests::run_suffix());
    let relay = spawn_relay(&t, "redis://127.0.0.1:6379", &stream);
    let deadline = Instant::now() + Duration::from_secs(15);
    while published(&t).await < 2 {
        assert!(Instant::now() < deadline, "{t}: the relay published nothing (is Redis on 6379?)");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = relay.terminate();
    assert!(output.status.success(), "{t}: {:?}: {}", output.status, text(&output));
    assert!(text(&output).contains("stopping"), "{t}: {}", text(&output));
}
per_backend!(the_relay_publishes_and_stops_cleanly_on_sigterm, "cli_relay_sigterm");

/// A relay process killed with SIGKILL between two stats samples (an hour apart here) is listed with what
/// it published: it writes a heartbeat each second in which it published, not only at each sample.
async fn a_killed_relay_is_listed_with_what_it_published(t: TestDb) {
    let events: Vec<NewEvent> = (0..25).map(|i| order(&format!("k{i}"), "order.placed")).collect();
    enqueue(&t, &events).await;
    let stream = format!("outbox-cli-test:{}", outbox_integration_tests::run_suffix());
    let relay = spawn_relay_with(&t, "redis://127.0.0.1:6379", &stream, &["--stats-interval", "1h"]);
    let pid = i64::from(relay.0.as_ref().expect("running").id());
    let deadline = Instant::now() + Duration::from_secs(30);
    while published(&t).await < 25 {
        assert!(Instant::now() < deadline, "{t}: the relay published {} of 25", published(&t).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed = || async {
        let relays = outbox_ops::admin::relays(&t.db).await.unwrap_or_else(|e| panic!("{t}: {e}"));
        relays.into_iter().find(|r| r.pid == pid)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while listed().await.is_none_or(|r| r.published_events < 25) {
        assert!(Instant::now() < deadline, "{t}: the heartbeat still says {:?}", listed().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(relay); // SIGKILL: no last heartbeat
    let after = listed().await.unwrap_or_else(|| panic!("{t}: the killed process is not listed"));
    assert_eq!((after.published_events, after.stopped), (25, false), "{t}: {after:?}");
}
per_backend!(a_killed_relay_is_listed_with_what_it_published, "cli_killed_count");

#[test]
fn a_redis_relay_without_a_destination_refuses_to_start() {
    // Redis creates any stream an XADD names: the default `{event_type}` would send events where no
    // consumer reads, so the command asks for the stream instead of guessing.
    let relay = outbox()
        .env("DATABASE_URL", "sqlite::memory:")
        .env_remove("OUTBOX_DESTINATION")
        .args(["relay", "--broker", "redis://127.0.0.1:6379"])
        .output()
        .expect("run outbox");
    assert!(!relay.status.success(), "the relay started without a destination: {}", text(&relay));
    let message = text(&relay);
    assert!(message.contains("--destination") && message.contains("required with a Redis broker"), "{message}");
}

async fn the_relay_takes_a_list_of_nats_servers_and_skips_one_that_is_down(t: TestDb) {
    if t.backend != DbBackend::Sqlite {
        return; // the broker is what this is about
    }
    enqueue(&t, &[order("o1", "order.placed"), order("o2", "order.placed")]).await;
    let name = format!("clilist_{}", outbox_integration_tests::run_suffix());
    let (destination, subjects) = (format!("{name}.{{aggregate_type}}"), format!("{name}.>"));
    // The first server of the list answers nothing; the client moves on to the second.
    let broker = "nats://127.0.0.1:1,127.0.0.1:4222";
    let more = ["--nats-stream", name.as_str(), "--nats-subjects", subjects.as_str()];
    let relay = spawn_relay_with(&t, broker, &destination, &more);
    let deadline = Instant::now() + Duration::from_secs(30);
    while published(&t).await < 2 {
        assert!(Instant::now() < deadline, "{t}: the relay published nothing through {broker} (is NATS on 4222?)");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = relay.terminate();
    assert!(output.status.success(), "{t}: {:?}: {}", output.status, text(&output));
}
per_backend!(the_relay_takes_a_list_of_nats_servers_and_skips_one_that_is_down, "cli_nats_list");

async fn a_broker_down_at_start_is_retried_not_fatal(t: TestDb) {
    if t.backend != DbBackend::Sqlite {
        return;
    }
    enqueue(&t, &[order("o1", "order.placed")]).await;
    let relay = spawn_relay(&t, &format!("redis://user:{SECRET}@127.0.0.1:1"), "never");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let output = relay.terminate();
    let all = text(&output);
    assert!(output.status.success(), "{t}: the relay gave up: {:?}: {all}", output.status);
    assert!(all.contains("broker unreachable; retrying") && all.contains("events_waiting=1"), "{t}: {all}");
    assert!(!all.contains(SECRET), "{t}: the broker password was printed: {all}");
    assert_eq!(published(&t).await, 0, "{t}");
}
per_backend!(a_broker_down_at_start_is_retried_not_fatal, "cli_broker_down");

/// A local port nothing listens on right now.
/// The value of an unlabelled sample `name` in Prometheus text.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn http_serves_metrics_that_match_the_outbox_and_ready_once_the_backlog_is_gone(t: TestDb) {
    enqueue(&t, &[order("o1", "order.placed"), order("o2", "order.placed"), order("o3", "order.placed")]).await;
    let stream = format!("outbox-cli-http:{}", outbox_integration_tests::run_suffix());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = spawn_relay_with(
        &t,
        "redis://127.0.0.1:6379",
        &stream,
        &["--http", &addr, "--stats-interval", "100ms", "--ready-max-pending-age", "30s"],
    );
    let (status, _) = get(port, "/health/live");
    assert_eq!(status, 200, "{t}: live while running");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, body) = get(port, "/health/ready");
        let metrics = get(port, "/metrics").1;
        // Ready once everything went out and a sample after that saw no backlog.
        if status == 200 && sample(&metrics, "outbox_pending_events") == Some(0.0) {
            assert!(body.contains("\"ready\":true"), "{t}: {body}");
            assert!(
                body.contains("\"stats_age_seconds\":") && !body.contains("\"stats_age_seconds\":null"),
                "{t}: {body}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{t}: not ready within 15 s (is Redis on 6379?): {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(published(&t).await, 3, "{t}");
    let metrics = get(port, "/metrics").1;
    assert_eq!(sample(&metrics, "outbox_events_published_total"), Some(3.0), "{t}: {metrics}");
    assert_eq!(sample(&metrics, "outbox_dead_events"), Some(0.0), "{t}: {metrics}");
    assert_eq!(sample(&metrics, "outbox_oldest_pending_age_seconds"), Some(0.0), "{t}: {metrics}");
    assert!(metrics.contains("# TYPE outbox_publish_latency_seconds histogram"), "{t}: {metrics}");
    let output = relay.terminate();
    assert!(output.status.success(), "{t}: {:?}: {}", output.status, text(&output));
}
per_backend!(http_serves_metrics_that_match_the_outbox_and_ready_once_the_backlog_is_gone, "cli_http");

async fn ready_is_503_with_the_reason_while_the_broker_is_down(t: TestDb) {
    if t.backend != DbBackend::Sqlite {
        return;
    }
    enqueue(&t, &[order("o1", "order.placed")]).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = spawn_relay_with(&t, "redis://127.0.0.1:1", "never", &["--http", &addr]);
    let (live, _) = get(port, "/health/live");
    let (ready, body) = get(port, "/health/ready");
    let output = relay.terminate();
    assert_eq!(live, 200, "{t}: live while retrying the broker");
    assert_eq!(ready, 503, "{t}: {body}");
    assert!(body.contains("the broker is not connected yet"), "{t}: {body}");
    assert!(output.status.success(), "{t}: {}", text(&output));
}
per_backend!(ready_is_503_with_the_reason_while_the_broker_is_down, "cli_http_down");

async fn relay_dashboard_shows_its_relay_and_refuses_actions_without_the_token(t: TestDb) {
    // A token too short to be safe is refused before anything starts, and not printed.
    let short = run(
        &t,
        &[
            "relay",
            "--broker",
            "redis://127.0.0.1:6379",
            "--destination",
            "outbox-cli-test:token",
            "--http",
            "127.0.0.1:1",
            "--dashboard",
            "--admin-token",
            "tooshort-42",
        ],
    );
    assert!(!short.status.success(), "{t}: {}", text(&short));
    assert!(
        text(&short).contains("at least 16 bytes") && !text(&short).contains("tooshort-42"),
        "{t}: {}",
        text(&short)
    );

    enqueue(&t, &[order("o1", "order.placed"), order("o2", "order.placed")]).await;
    let stream = format!("outbox-cli-dashboard:{}", outbox_integration_tests::run_suffix());
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = spawn_relay_with(
        &t,
        "redis://127.0.0.1:6379",
        &stream,
        &["--http", &addr, "--dashboard", "--stats-interval", "1s"],
    );
    // The page beside /metrics shows this process's relay once it has passed, and the backlog it drained.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, page) = get(port, "/");
        assert_eq!(status, 200, "{t}: {page}");
        // ... and its heartbeat in the table of every relay process.
        if page.contains(r#"id="relay-state">healthy<"#)
            && page.contains(r#"id="pending">0<"#)
            && page.contains(r#"class="state alive">alive<"#)
        {
            assert!(page.contains("redis://127.0.0.1:6379"), "{t}: the broker is shown");
            break;
        }
        assert!(Instant::now() < deadline, "{t}: the dashboard never showed a healthy relay and no backlog: {page}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(get(port, "/metrics").0, 200, "{t}: /metrics still served");
    assert_eq!(request(port, "POST", "/actions/replay").0, 403, "{t}: read-only without --admin-token");
    let output = relay.terminate();
    assert!(output.status.success(), "{t}: {}", text(&output));
    assert_eq!(published(&t).await, 2, "{t}");
}
per_backend!(relay_dashboard_shows_its_relay_and_refuses_actions_without_the_token, "cli_dashboard");

#[test]
fn the_dashboard_alone_serves_the_pages_until_sigterm() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let t = runtime.block_on(outbox_integration_tests::primary_backend("cli_dashboard_alone"));
    let port = free_port();
    let (url, extra) = target(&t);
    let token = "an-admin-token-for-this-test-0123";
    let child = outbox()
        .env("DATABASE_URL", url)
        .env("OUTBOX_ADMIN_TOKEN", token)
        .args(extra)
        .args(["dashboard", "--http", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn outbox dashboard");
    let running = Running(Some(child));
    let (status, page) = get(port, "/");
    assert_eq!(status, 200, "{t}: {page}");
    assert!(page.contains(r#"id="token""#) && !page.contains(token), "{t}: a sign-in form, and no token in the page");
    assert_eq!(get(port, "/dead").0, 200, "{t}");
    assert_eq!(request(port, "POST", "/actions/discard").0, 403, "{t}: not signed in");
    let output = running.terminate();
    assert!(output.status.success(), "{t}: {}", text(&output));
    assert!(!text(&output).contains(token), "{t}: the token was printed");
}

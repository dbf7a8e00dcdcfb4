//! `outbox relay --source log` and `outbox log …` against the PostgreSQL cluster with `wal_level =
//! logical` (`.ci/pg-logical.sh`): set-up, a relay process that publishes from the log with its health,
//! metrics and slot shown by `outbox check` and `outbox log status`, the slot dropped only when no relay
//! reads it and with `--yes`; a server without logical decoding refused with what to run.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{Running, free_port, get, outbox, target, text};
use outbox_integration_tests::{TestDb, logical, run_suffix};
use outbox_seaorm::NewEvent;
use sea_orm::ConnectionTrait;

fn run(t: &TestDb, args: &[&str]) -> Output {
    let (url, extra) = target(t);
    outbox().env("DATABASE_URL", url).args(extra).args(args).output().expect("run outbox")
}

async fn published(t: &TestDb) -> i64 {
    let sql = "SELECT COUNT(*) AS n FROM outbox_events WHERE published_at_ms IS NOT NULL";
    let row = t.db.query_one_raw(sea_orm::Statement::from_string(t.backend, sql)).await.expect("count");
    row.and_then(|r| r.try_get::<i64>("", "n").ok()).unwrap_or_default()
}

fn create_consumer_group(stream: &str) {
    use outbox_seaorm::brokers::redis::redis;
    let mut connection =
        redis::Client::open("redis://127.0.0.1:6379").and_then(|c| c.get_connection()).expect("Redis on 6379");
    let created: redis::RedisResult<()> =
        redis::cmd("XGROUP").arg("CREATE").arg(stream).arg("billing").arg("0").arg("MKSTREAM").query(&mut connection);
    if let Err(e) = created {
        assert_eq!(e.code(), Some("BUSYGROUP"), "XGROUP CREATE {stream}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_relay_process_publishes_reports_its_slot_and_the_slot_drops_only_when_asked() {
    let Some(t) = logical("cli_log").await else { return };
    let slot = format!("cli_{}", run_suffix());
    let names = ["--slot", &slot, "--publication", &slot];
    let setup = run(&t, &[&["log", "setup"][..], &names[..]].concat());
    assert!(setup.status.success(), "{t}: {}", text(&setup));

    let stream = format!("outbox-cli-log:{}", run_suffix());
    create_consumer_group(&stream);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let (url, extra) = target(&t);
    let relay = Running(Some(
        outbox()
            .env("DATABASE_URL", url)
            .env("OUTBOX_LOG", "outbox=info,outbox_seaorm=info,warn")
            .args(extra)
            .args(["relay", "--source", "log", "--broker", "redis://127.0.0.1:6379", "--destination", &stream])
            .args(names)
            .args(["--http", &addr, "--stats-interval", "200ms", "--dashboard"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn outbox relay"),
    ));
    // Wait until the relay reads its slot, then commit events: they come from the log.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !outbox_seaorm::log::slot_state(&t.db, &slot).await.expect("slot").is_some_and(|s| s.streaming) {
        assert!(Instant::now() < deadline, "{t}: the relay did not start reading its slot");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events: Vec<NewEvent> = (0..20)
        .map(|i| {
            NewEvent::new("order", format!("o{}", i % 4), "order.placed", &serde_json::json!({ "i": i }))
                .expect("event")
        })
        .collect();
    outbox_seaorm::enqueue_all(&t.db, &events).await.expect("enqueue");
    while published(&t).await < 20 {
        assert!(Instant::now() < deadline, "{t}: {} of 20 published", published(&t).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    loop {
        let (status, body) = get(port, "/health/ready");
        if status == 200 {
            assert!(body.contains("\"replication_lag_bytes\":"), "{t}: the slot's lag is in the health: {body}");
            break;
        }
        assert!(Instant::now() < deadline, "{t}: not ready: {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The dashboard beside it shows the slot.
    let (status, page) = get(port, "/fragments/overview");
    assert_eq!(status, 200, "{t}: {page}");
    assert!(page.contains("id=\"log-slot\"") && page.contains(&slot), "{t}: {page}");
    assert!(page.contains("read by a relay"), "{t}: {page}");
    let metrics = get(port, "/metrics").1;
    assert!(metrics.contains("outbox_events_published_total 20"), "{t}: {metrics}");

    let check = run(&t, &["check", "--log-slot", &slot]);
    assert!(check.status.success(), "{t}: {}", text(&check));
    let report = text(&check);
    assert!(report.contains("wal_level") && report.contains("logical"), "{t}: {report}");
    assert!(report.contains(&format!("{slot}: read by a relay")) && report.contains("bytes behind"), "{t}: {report}");
    let status = run(&t, &[&["log", "status"][..], &names[..]].concat());
    assert!(text(&status).contains("setup: ok") && text(&status).contains("read by a relay"), "{t}: {}", text(&status));

    let busy = run(&t, &[&["log", "drop-slot", "--yes"][..], &names[..]].concat());
    assert!(!busy.status.success() && text(&busy).contains("stop every"), "{t}: {}", text(&busy));
    let output = relay.terminate();
    assert!(output.status.success(), "{t}: {:?}: {}", output.status, text(&output));

    let deadline = Instant::now() + Duration::from_secs(30);
    let unasked = loop {
        let unasked = run(&t, &[&["log", "drop-slot"][..], &names[..]].concat());
        if !text(&unasked).contains("stop every") || Instant::now() > deadline {
            break unasked;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!unasked.status.success() && text(&unasked).contains("--yes"), "{t}: {}", text(&unasked));
    let dropped = run(&t, &[&["log", "drop-slot", "--yes"][..], &names[..]].concat());
    assert!(dropped.status.success(), "{t}: {}", text(&dropped));
    assert!(outbox_seaorm::log::slot_state(&t.db, &slot).await.expect("slot").is_none(), "{t}: the slot is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_logical_decoding_is_refused_with_what_to_run() {
    // The shared server keeps wal_level = replica.
    outbox_integration_tests::run_on(outbox_integration_tests::Backend::Postgres, "cli_log_refused", async |t| {
        let output = run(
            &t,
            &[
                "relay",
                "--source",
                "log",
                "--broker",
                "redis://127.0.0.1:6379",
                "--destination",
                "outbox-cli-log:never",
            ],
        );
        let said = text(&output);
        assert!(!output.status.success(), "{t}: {said}");
        assert!(said.contains("wal_level") && said.contains("ALTER SYSTEM SET wal_level = logical"), "{t}: {said}");
    })
    .await;
}

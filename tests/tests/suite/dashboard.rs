//! The operations dashboard in a real browser (headless Chromium driven over WebDriver), on each
//! database: what a person sees is what the database holds; a dead event is found, opened and replayed
//! only with the admin token and the session's CSRF token; nothing from the database runs as script.
//! A consumer's dead letters at a real broker (Redis Streams) are counted, found, replayed and discarded
//! the same way.
//!
//! Needs `chromedriver` and Chromium (Debian: `chromium chromium-driver`; `.ci/run` installs them). Outside
//! CI the tests skip with a reason when there is none; under `CI=true` they fail.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::{enqueue_committed, outbox_rows};
use fantoccini::{Client, ClientBuilder, Locator};
use outbox_integration_tests::contract::{self, Running};
use outbox_integration_tests::proxy::server_available;
use outbox_integration_tests::{TestDb, per_backend};
use outbox_ops::dashboard::{Dashboard, DashboardConfig};
use outbox_seaorm::DomainEvent;
use outbox_seaorm::brokers::redis::{RedisPublisher, RedisTransport, redis};
use outbox_seaorm::consume::{DeadFilter, DeadLetters};
use outbox_seaorm::{
    Destination, EventId, InMemoryPublisher, NewEvent, OutboxEvent, OutboxService, PublishError, Publisher, Relay,
    RelayConfig, SeaOrmStore,
};
use sea_orm::ConnectionTrait;

const TOKEN: &str = "a-test-admin-token-0123456789";
/// What a script in a payload or an error would set if it ran.
const XSS_FLAG: &str = "window.__outbox_xss";
const XSS_PAYLOAD: &str = "<script>window.__outbox_xss = 1</script><img src=x onerror=\"window.__outbox_xss = 2\">";
const XSS_ERROR: &str = "refused: <img src=x onerror=\"window.__outbox_xss = 3\"> timeout";

/// A broker that refuses, for good, every event of an aggregate whose id starts with `doomed`, with the
/// payload's `error` as the reason; it takes the others.
struct RefusesDoomed;

impl Publisher for RefusesDoomed {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        events
            .iter()
            .map(|e| match e.aggregate_id.starts_with("doomed") {
                true => {
                    let payload: serde_json::Value = serde_json::from_str(&e.payload).expect("payload");
                    Err(PublishError::permanent(payload["error"].as_str().unwrap_or("refused").to_owned()))
                }
                false => Ok(()),
            })
            .collect()
    }
}

fn event(aggregate_type: &str, aggregate_id: &str, event_type: &str, error: &str) -> NewEvent {
    let payload = serde_json::json!({ "id": aggregate_id, "error": error, "note": XSS_PAYLOAD });
    NewEvent::new(aggregate_type, aggregate_id, event_type, &payload).expect("event")
}

/// Two published events, three dead ones (one whose error holds markup, one whose aggregate id does),
/// then three pending ones.
async fn seed(t: &TestDb) {
    enqueue_committed(
        t,
        &[
            event("order", "ok-1", "order.placed", ""),
            event("order", "ok-2", "order.placed", ""),
            event("order", "doomed-1", "order.placed", "message too large"),
            event("payment", "doomed-2", "payment.taken", XSS_ERROR),
            event("order", "doomed-<i>3</i>", "order.cancelled", "unknown subject"),
        ],
    )
    .await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), RefusesDoomed, RelayConfig::default()).expect("config");
    let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((pass.published, pass.dead), (2, 3), "{t}: {pass:?}");
    enqueue_committed(
        t,
        &[
            event("order", "ok-3", "order.placed", ""),
            event("order", "ok-4", "order.shipped", ""),
            event("payment", "ok-5", "payment.taken", ""),
        ],
    )
    .await;
}

/// Pending and dead rows per aggregate type, counted from the rows themselves.
async fn backlog_by_aggregate_type(t: &TestDb) -> BTreeMap<String, (u64, u64)> {
    let mut counts = BTreeMap::new();
    for row in outbox_rows(t).await.into_iter().filter(|r| r.published_at_ms.is_none()) {
        let entry: &mut (u64, u64) = counts.entry(row.aggregate_type).or_default();
        match row.dead_at_ms {
            None => entry.0 += 1,
            Some(_) => entry.1 += 1,
        }
    }
    counts
}

async fn dead_count(t: &TestDb) -> usize {
    outbox_rows(t).await.iter().filter(|r| r.dead_at_ms.is_some() && r.published_at_ms.is_none()).count()
}

/// Serves `config`'s dashboard on a free loopback port, nested under `/ops/outbox` as an app would mount
/// it; returns the page's URL.
async fn serve(t: &TestDb, config: DashboardConfig) -> String {
    serve_dashboard(Dashboard::new(t.db.clone(), config)).await
}

async fn serve_dashboard(dashboard: Dashboard) -> String {
    let router = axum::Router::new().nest("/ops/outbox", dashboard.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}/ops/outbox")
}

/// A headless Chromium behind its own chromedriver; `None` (after saying why) when there is none here.
struct Browser {
    client: Client,
    _driver: tokio::process::Child,
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

async fn browser() -> Option<Browser> {
    let driver_path = std::env::var("OUTBOX_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".to_owned());
    let chromium = std::env::var("OUTBOX_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    if !std::path::Path::new(&driver_path).exists() || !std::path::Path::new(&chromium).exists() {
        let reason = format!("no browser: {driver_path} or {chromium} is missing (Debian: chromium chromium-driver)");
        assert!(!in_ci(), "CI=true but {reason}");
        eprintln!("skipping: {reason}");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let driver = tokio::process::Command::new(&driver_path)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {driver_path}: {e}"));
    let capabilities = serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"],
        },
    });
    let serde_json::Value::Object(capabilities) = capabilities else { unreachable!() };
    let url = format!("http://127.0.0.1:{port}");
    let mut last = String::new();
    for _ in 0..120 {
        match ClientBuilder::native().capabilities(capabilities.clone()).connect(&url).await {
            Ok(client) => return Some(Browser { client, _driver: driver }),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("chromedriver at {url} never started a session: {last}");
}

async fn text(client: &Client, css: &str) -> String {
    let element = client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("no `{css}` on the page: {e}"));
    element.text().await.expect("text").trim().to_owned()
}

async fn has(client: &Client, css: &str) -> bool {
    !client.find_all(Locator::Css(css)).await.expect("find").is_empty()
}

async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no `{css}` to click: {e}"))
        .click()
        .await
        .expect("click");
}

/// Waits until `css`'s text is `expected` (the page loads after a click), failing after a minute.
async fn wait_text(client: &Client, css: &str, expected: &str) {
    let mut seen = String::new();
    for _ in 0..240 {
        if let Ok(element) = client.find(Locator::Css(css)).await
            && let Ok(text) = element.text().await
        {
            if text.trim() == expected {
                return;
            }
            seen = text;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("`{css}` still says {seen:?}, expected {expected:?}");
}

/// Waits until the page has an element matching `css` (its figures arrive after the page), failing after a
/// minute.
async fn wait_for(client: &Client, css: &str) {
    for _ in 0..240 {
        if has(client, css).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("no `{css}` on the page after a minute");
}

/// No script from the database ran on this page.
async fn assert_inert(client: &Client, page: &str) {
    let ran = client
        .execute(&format!("return {XSS_FLAG} === undefined ? null : {XSS_FLAG};"), vec![])
        .await
        .expect("execute");
    assert_eq!(ran, serde_json::Value::Null, "a script from the database ran on {page}");
}

/// `fetch` from the page: a POST of `body` to `url`, answering its status.
async fn post_from_page(client: &Client, url: &str, body: &str) -> u64 {
    let script = "return fetch(arguments[0], { method: 'POST', credentials: 'same-origin', redirect: 'manual', \
                  headers: { 'Content-Type': 'application/x-www-form-urlencoded' }, body: arguments[1] }) \
                  .then(r => r.status);";
    let status = client.execute(script, vec![url.into(), body.into()]).await.expect("fetch");
    status.as_u64().unwrap_or_else(|| panic!("status {status}"))
}

fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

async fn what_the_page_shows_is_what_the_database_holds(t: TestDb) {
    seed(&t).await;
    let Some(browser) = browser().await else { return };
    let client = &browser.client;
    let url = serve(&t, DashboardConfig::read_only()).await;
    client.goto(&url).await.expect("open the overview");

    let expected = backlog_by_aggregate_type(&t).await;
    let (pending, dead): (u64, u64) = expected.values().fold((0, 0), |(p, d), (ep, ed)| (p + ep, d + ed));
    assert_eq!((pending, dead), (3, 3), "{t}: the seed");
    // A first view answers at once and shows the figures as soon as the server has read them.
    wait_text(client, "#pending", &pending.to_string()).await;
    wait_text(client, "#dead", &dead.to_string()).await;
    let mut shown = BTreeMap::new();
    for row in client.find_all(Locator::Css("#by-aggregate-type tbody tr")).await.expect("rows") {
        let cells = row.find_all(Locator::Css("td")).await.expect("cells");
        let mut texts = Vec::new();
        for cell in cells {
            texts.push(cell.text().await.expect("cell"));
        }
        let number = |i: usize| texts[i].parse::<u64>().expect("a count");
        shown.insert(texts[0].clone(), (number(1), number(2)));
    }
    assert_eq!(shown, expected, "{t}: the table per aggregate type");
    wait_for(client, "#behind").await;
    wait_for(client, "#read-only").await;
    assert!(!has(client, "button.action").await, "{t}: read-only");
    assert_inert(client, "the overview").await;
    let shots = screenshot_dir();
    std::fs::write(shots.join(format!("{t}-overview.png")), client.screenshot().await.expect("screenshot"))
        .expect("write");

    // The page refreshes itself: a new pending event shows up without a reload.
    enqueue_committed(&t, &[event("order", "ok-6", "order.placed", "")]).await;
    wait_text(client, "#pending", "4").await;

    client.goto(&format!("{url}/dead")).await.expect("open the dead events");
    wait_text(client, "#dead-count", "3").await;
    assert_eq!(client.find_all(Locator::Css("#dead-rows tbody tr")).await.expect("rows").len(), 3, "{t}");
    let errors = text(client, "#dead-rows").await;
    assert!(errors.contains(XSS_ERROR), "{t}: the error is shown as text: {errors}");
    assert!(errors.contains("doomed-<i>3</i>"), "{t}: the aggregate id is shown as text: {errors}");
    assert_inert(client, "the dead events").await;

    client.goto(&format!("{url}/dead?error=onerror")).await.expect("filter");
    click(client, "#dead-rows a.event-link").await;
    wait_text(client, "#event-state", "dead").await;
    assert!(
        text(client, "#payload").await.contains("<script>window.__outbox_xss = 1</script>"),
        "{t}: the payload as text"
    );
    assert_eq!(text(client, "#last-error").await, XSS_ERROR, "{t}");
    assert_inert(client, "a dead event's detail").await;
    std::fs::write(shots.join(format!("{t}-dead-event.png")), client.screenshot().await.expect("screenshot"))
        .expect("write");
    client.clone().close().await.ok();
}

async fn a_dead_event_is_found_opened_and_replayed_with_the_token(t: TestDb) {
    seed(&t).await;
    let Some(browser) = browser().await else { return };
    let client = &browser.client;
    let url = serve(&t, DashboardConfig::read_only().with_admin_token(TOKEN).expect("token")).await;

    // Find it by its error text, open it: no action before signing in.
    client.goto(&format!("{url}/dead")).await.expect("open the dead events");
    let filter = client.form(Locator::Css("#dead-filter")).await.expect("the filter form");
    filter.set_by_name("error", "too large").await.expect("type").submit().await.expect("filter");
    wait_text(client, "#dead-count", "1").await;
    click(client, "#dead-rows a.event-link").await;
    wait_text(client, "#event-state", "dead").await;
    let event_url = client.current_url().await.expect("url").to_string();
    assert!(!has(client, "#replay-one").await, "{t}: an action button before signing in");

    // Sign in, come back, replay: the count is shown first.
    client.find(Locator::Css("#token")).await.expect("token field").send_keys(TOKEN).await.expect("type");
    click(client, "#sign-in").await;
    wait_text(client, "#signed-in", "signed in as admin").await;
    assert!(!client.source().await.expect("source").contains(TOKEN), "{t}: the token is in the page");
    client.goto(&event_url).await.expect("back to the event");
    click(client, "#replay-one").await;
    wait_text(client, "#confirm-count", "1").await;
    click(client, "#confirm").await;
    wait_text(client, "#changed", "1").await;
    assert_eq!(dead_count(&t).await, 2, "{t}: one dead event replayed");

    // The relay publishes it, and the page says so.
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), RelayConfig::default()).expect("config");
    relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    client.goto(&event_url).await.expect("the event again");
    wait_text(client, "#event-state", "published").await;

    // Discard by filter asks for the count typed back, and refuses other words.
    client.goto(&format!("{url}/dead?event_type=order.cancelled")).await.expect("filter");
    click(client, "#discard-matching").await;
    wait_text(client, "#typed-words", "discard 1").await;
    client.find(Locator::Css("#typed")).await.expect("typed field").send_keys("discard 2").await.expect("type");
    click(client, "#confirm").await;
    wait_text(client, "#confirm-note", "The words typed do not match: type them exactly to discard.").await;
    assert_eq!(dead_count(&t).await, 2, "{t}: nothing discarded on wrong words");
    client.find(Locator::Css("#typed")).await.expect("typed field").send_keys("discard 1").await.expect("type");
    click(client, "#confirm").await;
    wait_text(client, "#changed", "1").await;
    assert_eq!(dead_count(&t).await, 1, "{t}: the matching dead event discarded");
    client.clone().close().await.ok();
}

/// A dead row the relay cannot decode is not offered for replay (it would die again), and its page says why;
/// once the row is fixed with SQL, Replay is offered and the relay publishes it.
async fn a_row_that_cannot_decode_is_not_offered_for_replay_until_fixed(t: TestDb) {
    enqueue_committed(&t, &[event("order", "bad-1", "order.placed", "")]).await;
    let id = outbox_rows(&t).await[0].event_id.clone();
    let set_headers = |value: &str| format!("UPDATE outbox_events SET headers = '{value}' WHERE event_id = '{id}'");
    t.db.execute_unprepared(&set_headers("[1, 2]")).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), RelayConfig::default()).expect("config");
    relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let row = outbox_rows(&t).await.remove(0);
    assert!(
        row.dead_at_ms.is_some() && row.last_error.as_deref().unwrap_or("").contains("undecodable"),
        "{t}: {row:?}"
    );

    let Some(browser) = browser().await else { return };
    let client = &browser.client;
    let url = serve(&t, DashboardConfig::read_only().with_admin_token(TOKEN).expect("token")).await;
    let event_url = format!("{url}/event?id={id}");
    client.goto(&event_url).await.expect("open the event");
    client.find(Locator::Css("#token")).await.expect("token field").send_keys(TOKEN).await.expect("type");
    click(client, "#sign-in").await;
    wait_text(client, "#signed-in", "signed in as admin").await;
    client.goto(&event_url).await.expect("back to the event");
    wait_for(client, "#discard-one").await;
    assert!(!has(client, "#replay-one").await, "{t}: Replay offered for a row that cannot decode");
    let why = text(client, "#cannot-replay").await;
    assert!(why.contains("headers are not a JSON map of strings"), "{t}: {why}");

    t.db.execute_unprepared(&set_headers("{}")).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    client.goto(&event_url).await.expect("the fixed event");
    wait_for(client, "#replay-one").await;
    assert!(!has(client, "#cannot-replay").await, "{t}: the fixed row still said it cannot decode");
    click(client, "#replay-one").await;
    wait_text(client, "#confirm-count", "1").await;
    click(client, "#confirm").await;
    wait_text(client, "#changed", "1").await;
    relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(outbox_rows(&t).await[0].published_at_ms.is_some(), "{t}: the fixed row was not published");
    client.clone().close().await.ok();
}
per_backend!(a_row_that_cannot_decode_is_not_offered_for_replay_until_fixed, "dash_undecodable");

/// "Was this order's event sent, when, and where": the lookup by aggregate lists its events newest first,
/// with the state, the published time and the destination the table and the relay's template give.
async fn an_aggregate_lookup_says_whether_when_and_where_each_event_went(t: TestDb) {
    let placed = [event("order", "o-1", "order.placed", ""), event("order", "o-1", "order.paid", "")];
    enqueue_committed(&t, &[placed.as_slice(), &[event("order", "o-2", "order.placed", "")]].concat()).await;
    let relay =
        Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), RelayConfig::default()).expect("config");
    while relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}")).published > 0 {}
    enqueue_committed(&t, &[event("order", "o-1", "order.shipped", "")]).await;
    let rfc3339 = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339()).unwrap_or_default();
    let mut expected: Vec<[String; 4]> = outbox_rows(&t)
        .await
        .into_iter()
        .filter(|r| r.aggregate_id == "o-1")
        .map(|r| {
            let state = if r.published_at_ms.is_some() { "published" } else { "pending" };
            let published = r.published_at_ms.map(rfc3339).unwrap_or_else(|| "not yet".to_owned());
            [r.aggregate_version.to_string(), state.to_owned(), published, format!("order.{}", r.event_type)]
        })
        .collect();
    expected.reverse();

    let Some(browser) = browser().await else { return };
    let client = &browser.client;
    let destination = Destination::parse("{aggregate_type}.{event_type}").expect("template");
    let url = serve(&t, DashboardConfig::read_only().with_destination(destination)).await;
    client.goto(&url).await.expect("open the overview");
    let find = client.form(Locator::Css("#find-aggregate")).await.expect("the lookup form");
    find.set_by_name("aggregate_type", "order").await.expect("type");
    find.set_by_name("aggregate_id", "o-1").await.expect("type").submit().await.expect("find");
    wait_for(client, "#aggregate-events").await;
    let mut shown = Vec::new();
    for row in client.find_all(Locator::Css("#aggregate-events tbody tr")).await.expect("rows") {
        let cell = |css: &'static str| {
            let row = row.clone();
            async move { row.find(Locator::Css(css)).await.expect(css).text().await.expect("text") }
        };
        shown.push([
            cell("td.num").await,
            cell("strong.state").await,
            cell("td.published-at").await,
            cell("td.destination").await,
        ]);
    }
    assert_eq!(shown, expected, "{t}: the aggregate's events, newest first");
    client.clone().close().await.ok();
}
per_backend!(an_aggregate_lookup_says_whether_when_and_where_each_event_went, "dash_lookup");

async fn without_the_token_or_its_csrf_nothing_changes(t: TestDb) {
    seed(&t).await;
    let Some(browser) = browser().await else { return };
    let client = &browser.client;
    let before = outbox_rows(&t).await;
    let replay_all = "scope=filter&confirmed=yes&expected=3&csrf=";

    // Read-only: no button, no sign-in, and a hand-made POST is refused.
    let url = serve(&t, DashboardConfig::read_only()).await;
    client.goto(&format!("{url}/dead")).await.expect("open");
    assert!(!has(client, "button.action").await && !has(client, "#token").await, "{t}: read-only page");
    assert_eq!(post_from_page(client, &format!("{url}/actions/replay"), replay_all).await, 403, "{t}");
    assert_eq!(post_from_page(client, &format!("{url}/login"), &format!("token={TOKEN}")).await, 403, "{t}");

    // With a token: signed in, but a wrong CSRF token is refused; so is a POST without the session.
    let url = serve(&t, DashboardConfig::read_only().with_admin_token(TOKEN).expect("token")).await;
    client.goto(&format!("{url}/dead")).await.expect("open");
    assert_eq!(post_from_page(client, &format!("{url}/actions/replay"), replay_all).await, 403, "{t}: not signed in");
    client.find(Locator::Css("#token")).await.expect("token field").send_keys(TOKEN).await.expect("type");
    click(client, "#sign-in").await;
    wait_text(client, "#signed-in", "signed in as admin").await;
    let forged = format!("{replay_all}{}", "0".repeat(64));
    assert_eq!(post_from_page(client, &format!("{url}/actions/replay"), &forged).await, 403, "{t}: wrong CSRF");
    assert_eq!(post_from_page(client, &format!("{url}/actions/discard"), &forged).await, 403, "{t}: wrong CSRF");
    assert_eq!(outbox_rows(&t).await, before, "{t}: a refused POST changed rows");
    client.clone().close().await.ok();
}

per_backend!(what_the_page_shows_is_what_the_database_holds, "dash_shows");
per_backend!(a_dead_event_is_found_opened_and_replayed_with_the_token, "dash_replay");
per_backend!(without_the_token_or_its_csrf_nothing_changes, "dash_refuse");

/// Every relay process writes a heartbeat: a running service shows as alive with its host and pid, then
/// as stopped once shut down; a process that stopped writing (killed) shows as gone.
async fn relay_processes_show_alive_stopped_and_gone(t: TestDb) {
    let Some(browser) = browser().await else { return };
    let client = &browser.client;
    let killed = "INSERT INTO outbox_relays (process, host, pid, relays, started_at_ms, seen_at_ms, every_ms, \
                  last_success_at_ms, consecutive_failures, last_error, published_events, stopped) \
                  VALUES ('killed-host:42:1', 'killed-host', 42, 1, 1, {seen}, 15000, NULL, 3, 'broker timeout', 9, {no})";
    let ten_minutes_ago = chrono::Utc::now().timestamp_millis() - 600_000;
    let no = if t.backend == sea_orm::DbBackend::Postgres { "false" } else { "0" };
    let sql = killed.replace("{seen}", &ten_minutes_ago.to_string()).replace("{no}", no);
    t.db.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
    // A process that stopped two hours ago: its heartbeat is kept for a day, folded away after 15 minutes.
    let two_hours_ago = chrono::Utc::now().timestamp_millis() - 2 * 3_600_000;
    let sql = killed
        .replace("killed-host:42:1', 'killed-host', 42", "old-host:7:1', 'old-host', 7")
        .replace("{seen}", &two_hours_ago.to_string())
        .replace("{no}", if t.backend == sea_orm::DbBackend::Postgres { "true" } else { "1" });
    t.db.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
    let service = OutboxService::builder(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new())
        .stats_interval(Duration::from_secs(1))
        .without_cleanup()
        .start()
        .unwrap_or_else(|e| panic!("{t}: {e}"));

    // The service stays the test's (to shut it down); the dashboard keeps a probe of its health.
    let config = DashboardConfig::read_only().with_refresh(Duration::from_secs(1));
    let url = serve_dashboard(Dashboard::new(t.db.clone(), config).with_service(&service)).await;
    client.goto(&url).await.expect("open the overview");
    let this = format!("#processes tr[data-process^='{}:{}:'] strong.state", host(), std::process::id());
    wait_text(client, &this, "alive").await;
    wait_text(client, "#relay-state", "healthy").await;
    wait_text(client, "#processes tr[data-process='killed-host:42:1'] strong.state", "gone").await;
    let row = text(client, "#processes tr[data-process='killed-host:42:1']").await;
    assert!(row.contains("killed-host pid 42") && row.contains("broker timeout"), "{t}: {row}");
    assert!(!has(client, "#processes tr[data-process='old-host:7:1']").await, "{t}: an old stopped process is folded");
    assert!(has(client, "#folded tr[data-process='old-host:7:1']").await, "{t}: and still there to unfold");
    let summary = text(client, "#folded-processes summary").await;
    assert!(summary.starts_with("1 stopped or gone process"), "{t}: {summary}");
    service.shutdown().await;
    wait_text(client, &this, "stopped").await;
    wait_text(client, "#relay-state", "stopped").await;
    client.clone().close().await.ok();
}
per_backend!(relay_processes_show_alive_stopped_and_gone, "dash_relays");

/// Rows published with `published_at_ms` in the last `minutes`, counted in the table.
async fn published_within(t: &TestDb, minutes: i64) -> u64 {
    let since = chrono::Utc::now().timestamp_millis() - minutes * 60_000;
    outbox_rows(t).await.iter().filter(|r| r.published_at_ms.is_some_and(|at| at >= since)).count() as u64
}

/// The total the chart of `span` draws, once the page has read it.
async fn charted(client: &Client, url: &str, span: &str) -> u64 {
    client.goto(&format!("{url}?span={span}")).await.expect("open the overview");
    wait_for(client, &format!("#published-chart[data-span='{span}'], #chart-error")).await;
    if has(client, "#chart-error").await {
        panic!("{}", text(client, "#chart-error").await);
    }
    let chart = client.find(Locator::Css("#published-chart")).await.expect("chart");
    let total = chart.attr("data-published").await.expect("attribute").expect("data-published");
    total.parse().unwrap_or_else(|e| panic!("data-published {total:?}: {e}"))
}

/// The rate chart is drawn from the published times in the table: a burst a real relay published while no
/// page was open is on the first view, and rows published hours ago are in the 24-hour span only.
async fn the_chart_shows_what_was_published_while_no_page_was_open(t: TestDb) {
    let events = |prefix: &str, n: usize| -> Vec<NewEvent> {
        (0..n).map(|i| event("order", &format!("{prefix}-{i}"), "order.placed", "")).collect()
    };
    enqueue_committed(&t, &[events("now", 20), events("earlier", 10)].concat()).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), InMemoryPublisher::new(), RelayConfig::default())
        .unwrap_or_else(|e| panic!("{t}: {e}"));
    while relay.run_once().await.unwrap_or_else(|e| panic!("{t}: {e}")).published > 0 {}
    let three_hours = 3 * 3_600_000;
    let sql = format!(
        "UPDATE outbox_events SET published_at_ms = published_at_ms - {three_hours} WHERE aggregate_id LIKE 'earlier-%'"
    );
    t.db.execute_unprepared(&sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
    let (recent, today) = (published_within(&t, 14).await, published_within(&t, 23 * 60).await);
    assert_eq!((recent, today), (20, 30), "{t}: the rows as published");

    let Some(browser) = browser().await else { return };
    let client = &browser.client;
    let url = serve(&t, DashboardConfig::read_only()).await;
    assert_eq!(charted(client, &url, "15m").await, recent, "{t}: the last 15 minutes");
    assert_eq!(charted(client, &url, "1h").await, recent, "{t}: the last hour");
    assert_eq!(charted(client, &url, "24h").await, today, "{t}: the last 24 hours");
    wait_for(client, "#spans strong.span").await;
    assert_eq!(text(client, "#spans strong.span").await, "24h", "{t}: the span shown is marked");
    std::fs::write(screenshot_dir().join(format!("{t}-chart-24h.png")), client.screenshot().await.expect("shot"))
        .expect("write");
    client.clone().close().await.ok();
}
per_backend!(the_chart_shows_what_was_published_while_no_page_was_open, "dash_chart");

/// The host name as the service reads it.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default()
}

const REDIS: &str = "redis://127.0.0.1:6379";
/// The consumer that dead-letters (the `outbox_dead_consumer` header).
const CONSUMER: &str = "billing";

/// How many dead letters the broker holds for the stream, read through the transport's own walk.
async fn letters_at_the_broker(stream: &str) -> usize {
    let transport = RedisTransport::connect(REDIS, stream, CONSUMER, "test-reader").await.expect("transport");
    transport.list_dead_letters(&DeadFilter::default(), 1000).await.expect("list").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_dead_letters_are_counted_found_replayed_and_discarded() {
    if !server_available("Redis Streams", "127.0.0.1:6379").await {
        return;
    }
    let Some(browser) = browser().await else { return };
    let client = &browser.client;
    let t = contract::case_db("dash_letters").await;
    let stream = format!("outbox-dash:{}", &EventId::new().to_string().replace('-', "")[..16]);

    // A real consumer dead-letters the first event of it1, it2 and it3 (two failed deliveries each). Its
    // transport creates the group and the stream, which the publisher then appends to.
    let transport = RedisTransport::connect(REDIS, &stream, CONSUMER, "c-1").await.expect("transport");
    let publisher =
        RedisPublisher::connect(REDIS, Destination::fixed(&stream).expect("stream")).await.expect("connect");
    contract::enqueue(&t, &contract::counted_events(4, 2)).await;
    contract::relay_until_published(&t, publisher, 8).await;
    let config = contract::fast_config().with_max_deliveries(2);
    let (consumer, _) = contract::counting_consumer(&t, CONSUMER, config.clone(), |e, _| e.n == 0 && e.item != "it0");
    let running = Running::start(consumer, transport);
    contract::eventually(Duration::from_secs(90), "5 effects and 3 dead letters", async || {
        contract::effects(&t, CONSUMER).await.len() == 5 && running.stats().dead_lettered == 3
    })
    .await;
    running.stop().await;
    assert_eq!(letters_at_the_broker(&stream).await, 3, "{t}");
    // Two more events wait for the stopped consumer: its lag at the broker.
    let publisher =
        RedisPublisher::connect(REDIS, Destination::fixed(&stream).expect("stream")).await.expect("connect");
    let late: Vec<NewEvent> = (0..2)
        .map(|i| contract::Counted { item: format!("late{i}"), n: 0 }.to_new_event().expect("valid event"))
        .collect();
    contract::enqueue(&t, &late).await;
    contract::relay_until_published(&t, publisher, 2).await;

    // Read-only: counted on the overview as the broker holds them, no button, a hand-made POST refused.
    // Through an `Arc`, as an app shares one transport between its consumer and its dashboard.
    let letters =
        std::sync::Arc::new(RedisTransport::connect(REDIS, &stream, CONSUMER, "dashboard").await.expect("transport"));
    let url =
        serve_dashboard(Dashboard::new(t.db.clone(), DashboardConfig::read_only()).with_dead_letters(letters)).await;
    client.goto(&url).await.expect("open the overview");
    let count = format!("#letters td[data-source='0'][data-consumer='{CONSUMER}']");
    wait_text(client, &count, "3").await;
    wait_text(client, "#consumer-lag td.lag[data-source='0']", "2").await;
    click(client, &format!("{count} a")).await;
    wait_text(client, "#letter-count", "3").await;
    assert!(!has(client, "button.action").await, "{t}: read-only");
    let shot = client.screenshot().await.expect("screenshot");
    std::fs::write(screenshot_dir().join("consumer-dead-letters.png"), shot).expect("write");
    let discard_all = "s=0&scope=filter&confirmed=yes&expected=3&typed=discard+3&csrf=";
    assert_eq!(post_from_page(client, &format!("{url}/actions/discard"), discard_all).await, 403, "{t}");
    assert_eq!(letters_at_the_broker(&stream).await, 3, "{t}: a refused POST changed the dead letters");

    // With the token: find one by its aggregate, open it, replay it; the fixed consumer applies it once.
    let letters = RedisTransport::connect(REDIS, &stream, CONSUMER, "dashboard").await.expect("transport");
    let config_with_token = DashboardConfig::read_only().with_admin_token(TOKEN).expect("token");
    let url = serve_dashboard(Dashboard::new(t.db.clone(), config_with_token).with_dead_letters(letters)).await;
    client.goto(&format!("{url}/letters?s=0")).await.expect("open the dead letters");
    let filter = client.form(Locator::Css("#letter-filter")).await.expect("the filter form");
    filter.set_by_name("aggregate_id", "it2").await.expect("type").submit().await.expect("filter");
    wait_text(client, "#letter-count", "1").await;
    click(client, "#letter-rows a.letter-link").await;
    wait_text(client, "#letter-consumer", CONSUMER).await;
    assert!(text(client, "#payload").await.contains("\"it2\""), "{t}: the payload");
    assert!(text(client, "#letter-reason").await.contains("injected failure of it2"), "{t}: the reason");
    assert!(!has(client, "#replay-one").await, "{t}: an action button before signing in");
    let letter_url = client.current_url().await.expect("url").to_string();
    client.find(Locator::Css("#token")).await.expect("token field").send_keys(TOKEN).await.expect("type");
    click(client, "#sign-in").await;
    wait_text(client, "#signed-in", "signed in as admin").await;
    client.goto(&letter_url).await.expect("back to the letter");
    click(client, "#replay-one").await;
    wait_text(client, "#confirm-count", "1").await;
    click(client, "#confirm").await;
    wait_text(client, "#changed", "1").await;
    assert_eq!(letters_at_the_broker(&stream).await, 2, "{t}: the replayed letter left the dead letters");
    let (fixed, _) = contract::counting_consumer(&t, CONSUMER, config, |_, _| false);
    let running =
        Running::start(fixed, RedisTransport::connect(REDIS, &stream, CONSUMER, "c-2").await.expect("transport"));
    contract::eventually(Duration::from_secs(90), "the replayed event and the two late ones applied", async || {
        contract::effects(&t, CONSUMER).await.len() == 8
    })
    .await;
    running.stop().await;
    let effects = contract::effects(&t, CONSUMER).await;
    assert_eq!(effects.iter().filter(|(i, n)| i == "it2" && *n == 0).count(), 1, "{t}: applied once: {effects:?}");

    // Discard every letter of the consumer: the count is typed back.
    client.goto(&format!("{url}/letters?s=0&consumer={CONSUMER}")).await.expect("filter");
    click(client, "#discard-matching").await;
    wait_text(client, "#typed-words", "discard 2").await;
    client.find(Locator::Css("#typed")).await.expect("typed field").send_keys("discard 2").await.expect("type");
    click(client, "#confirm").await;
    wait_text(client, "#changed", "2").await;
    assert_eq!(letters_at_the_broker(&stream).await, 0, "{t}: the discarded letters are gone");
    client.goto(&url).await.expect("the overview again");
    wait_text(client, "#letters td[data-source='0']", "0").await;
    client.clone().close().await.ok();

    let redis = redis::Client::open(REDIS).expect("client");
    if let Ok(mut connection) = redis.get_multiplexed_async_connection().await {
        let _: Result<(), _> =
            redis::cmd("DEL").arg(&stream).arg(format!("{stream}:dead")).query_async(&mut connection).await;
    }
}

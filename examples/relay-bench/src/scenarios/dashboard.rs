//! The operations dashboard on a big outbox: 1M published rows retained, 100k pending over 10k
//! aggregates and 10k dead rows (written by one `INSERT … SELECT` each, then analyzed), and the time each
//! page takes to answer over HTTP on loopback.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_ops::dashboard::{Dashboard, DashboardConfig};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Ctx;
use crate::report::{Table, fmt, quantile};

/// How many rows of each kind.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    published: u64,
    pending: u64,
    dead: u64,
    aggregates: u64,
}

pub async fn run(ctx: &Ctx) -> Result<()> {
    let sizes = Sizes {
        published: ctx.size(1_000_000, 20_000) as u64,
        pending: ctx.size(100_000, 5_000) as u64,
        dead: ctx.size(10_000, 1_000) as u64,
        aggregates: 10_000,
    };
    let db = ctx.target.fresh().await?;
    let started = Instant::now();
    fill(&db, sizes).await?;
    ctx.target.vacuum_analyze(&db).await?;
    eprintln!("[{}] dashboard: filled {sizes:?} in {:.1?}", ctx.target.label(), started.elapsed());

    let probe = |sql: &str| {
        let db = db.clone();
        let sql = sql.to_owned();
        async move {
            let row = db.query_one_raw(sea_orm::Statement::from_string(db.get_database_backend(), sql)).await?;
            row.context("no row")?.try_get::<String>("", "event_id").context("event_id")
        }
    };
    let dead_id = probe("SELECT event_id FROM outbox_events WHERE dead_at_ms IS NOT NULL ORDER BY seq LIMIT 1").await?;
    let published_id =
        probe("SELECT event_id FROM outbox_events WHERE published_at_ms IS NOT NULL ORDER BY seq LIMIT 1").await?;
    let middle = sizes.published + sizes.pending + sizes.dead / 2;

    let rounds = ctx.size(15, 3);
    // The first view of a new dashboard answers with a placeholder while the backlog is read, and its
    // script asks for the figures at once (the fragment waits for that read); later views and refreshes
    // show the sampler's last reading, which it renews every 5 s while someone looks.
    let (mut first, mut figures) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        let (addr, server) = serve(&db).await?;
        let started = Instant::now();
        get(addr, "/").await?;
        first.push(started.elapsed().as_secs_f64() * 1000.0);
        get(addr, "/fragments/overview").await?;
        figures.push(started.elapsed().as_secs_f64() * 1000.0);
        server.abort();
    }
    first.sort_by(f64::total_cmp);
    figures.sort_by(f64::total_cmp);
    let (addr, server) = serve(&db).await?;

    let pages = [
        ("overview page", "/".to_owned()),
        ("overview fragment (each refresh)", "/fragments/overview".to_owned()),
        ("dead events, first page", "/dead".to_owned()),
        ("dead events, a later page", format!("/dead?after={middle}")),
        ("dead events, error text filter", "/dead?error=timeout".to_owned()),
        ("dead events, event type and age", "/dead?event_type=order.placed&older_than=1m".to_owned()),
        ("a dead event's detail", format!("/event?id={dead_id}")),
        ("a published event's detail", format!("/event?id={published_id}")),
    ];
    let mut table = Table::new(
        ctx.title(&format!(
            "dashboard: {} published, {} pending over {} aggregates, {} dead; ms per page over HTTP",
            sizes.published, sizes.pending, sizes.aggregates, sizes.dead
        )),
        &["page", "median ms", "p90 ms", "max ms", "KiB"],
    );
    for (name, times) in [
        ("first overview of a new dashboard: the page (a placeholder)", &first),
        ("first overview of a new dashboard: until its figures show (reads the backlog)", &figures),
    ] {
        table.row(vec![
            name.to_owned(),
            fmt(quantile(times, 0.5)),
            fmt(quantile(times, 0.9)),
            fmt(times.last().copied().unwrap_or_default()),
            String::new(),
        ]);
    }
    for (name, path) in &pages {
        for _ in 0..2 {
            get(addr, path).await?;
        }
        let mut times = Vec::with_capacity(rounds);
        let mut bytes = 0;
        for _ in 0..rounds {
            let started = Instant::now();
            bytes = get(addr, path).await?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        table.row(vec![
            (*name).to_owned(),
            fmt(quantile(&times, 0.5)),
            fmt(quantile(&times, 0.9)),
            fmt(times.last().copied().unwrap_or_default()),
            fmt(bytes as f64 / 1024.0),
        ]);
    }
    server.abort();
    table.note(format!(
        "{rounds} timed requests per page after 2 untimed ones; the server and the database share the machine."
    ));
    table.emit(ctx.out.as_deref())?;
    db.close().await.context("close")?;
    Ok(())
}

/// A new read-only dashboard on a free loopback port.
async fn serve(
    db: &DatabaseConnection,
) -> Result<(std::net::SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let router = Dashboard::new(db.clone(), DashboardConfig::read_only()).router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("bind")?;
    let addr = listener.local_addr().context("addr")?;
    Ok((addr, tokio::spawn(async move { axum::serve(listener, router).await })))
}

/// One GET over a new connection; the body's length once the status is 200.
async fn get(addr: std::net::SocketAddr, path: &str) -> Result<usize> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.context("connect to the dashboard")?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.context("send")?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut response))
        .await
        .context("the dashboard did not answer within 60 s")?
        .context("read")?;
    let head = String::from_utf8_lossy(&response[..response.len().min(64)]).into_owned();
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(response.len())
}

/// The rows, each kind in one statement: published over the last hour, pending over the last 10 minutes
/// (`sizes.pending / aggregates` per aggregate), dead one per aggregate of their own; 3 aggregate types,
/// 5 event types, two kinds of error.
async fn fill(db: &DatabaseConnection, sizes: Sizes) -> Result<()> {
    let now = chrono::Utc::now().timestamp_millis();
    let backend = db.get_database_backend();
    let kinds = [
        // (rows, aggregate prefix, aggregates, created from, over ms, published, dead)
        (sizes.published, "a", sizes.aggregates, now - 3_600_000, 3_600_000, true, false),
        (sizes.pending, "p", sizes.aggregates, now - 600_000, 600_000, false, false),
        (sizes.dead, "d", sizes.dead, now - 7_200_000, 3_600_000, false, true),
    ];
    for (rows, prefix, aggregates, from, span, published, dead) in kinds {
        let created = format!("{from} + i * {span} / {rows}");
        let published_at = if published { format!("{created} + 50") } else { "NULL".to_owned() };
        let dead_at = if dead { format!("{created} + 5000") } else { "NULL".to_owned() };
        let (attempts, error) = if dead {
            ("10", "CASE WHEN i % 2 = 0 THEN 'ack timeout after 5s' ELSE 'message too large' END")
        } else {
            ("0", "NULL")
        };
        let columns = "event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload, \
                       headers, created_at_ms, attempts, next_attempt_at_ms, last_error, published_at_ms, dead_at_ms";
        let sql = match backend {
            DbBackend::Postgres => format!(
                "INSERT INTO outbox_events ({columns}) SELECT gen_random_uuid()::text, \
                 (ARRAY['order','payment','shipment'])[1 + i % 3], '{prefix}' || (i % {aggregates}), i / {aggregates} + 1, \
                 (ARRAY['order.placed','order.shipped','payment.taken','payment.refunded','shipment.sent'])[1 + i % 5], 1, \
                 '{{\"total_minor\": 4900, \"currency\": \"EUR\"}}'::jsonb, '{{}}'::jsonb, {created}, {attempts}, {created}, \
                 {error}, {published_at}, {dead_at} FROM generate_series(0::bigint, {rows} - 1) AS i"
            ),
            DbBackend::MySql => format!(
                "INSERT INTO outbox_events ({columns}) SELECT UUID(), ELT(1 + i % 3, 'order','payment','shipment'), \
                 CONCAT('{prefix}', i % {aggregates}), i DIV {aggregates} + 1, \
                 ELT(1 + i % 5, 'order.placed','order.shipped','payment.taken','payment.refunded','shipment.sent'), 1, \
                 '{{\"total_minor\": 4900, \"currency\": \"EUR\"}}', '{{}}', {created}, {attempts}, {created}, {error}, \
                 {published_at}, {dead_at} FROM (SELECT seq AS i FROM seq_0_to_{}) AS s",
                rows - 1
            ),
            _ => format!(
                "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < {rows} - 1) \
                 INSERT INTO outbox_events ({columns}) SELECT lower(hex(randomblob(16))), \
                 CASE i % 3 WHEN 0 THEN 'order' WHEN 1 THEN 'payment' ELSE 'shipment' END, '{prefix}' || (i % {aggregates}), \
                 i / {aggregates} + 1, CASE i % 5 WHEN 0 THEN 'order.placed' WHEN 1 THEN 'order.shipped' \
                 WHEN 2 THEN 'payment.taken' WHEN 3 THEN 'payment.refunded' ELSE 'shipment.sent' END, 1, \
                 '{{\"total_minor\": 4900, \"currency\": \"EUR\"}}', '{{}}', {created}, {attempts}, {created}, {error}, \
                 {published_at}, {dead_at} FROM s"
            ),
        };
        db.execute_unprepared(&sql)
            .await
            .with_context(|| format!("insert {rows} rows of `{prefix}` (MySQL needs MariaDB's sequence engine)"))?;
    }
    // The aggregates, as writers and relays leave them: due since their oldest pending event, dead heads
    // parked at the end of time.
    let aggregates = "INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) \
                      SELECT aggregate_type, aggregate_id, MAX(aggregate_version), \
                      MIN(CASE WHEN published_at_ms IS NULL AND dead_at_ms IS NULL THEN created_at_ms END) \
                      FROM outbox_events GROUP BY aggregate_type, aggregate_id";
    db.execute_unprepared(aggregates).await.context("fill outbox_aggregates")?;
    let parked = "UPDATE outbox_aggregates SET due_at_ms = 9223372036854775807 WHERE aggregate_id LIKE 'd%'";
    db.execute_unprepared(parked).await.context("park the dead heads")?;
    Ok(())
}

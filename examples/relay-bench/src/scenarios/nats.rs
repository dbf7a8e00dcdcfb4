//! Ours through the NATS JetStream publisher (with PubAcks) vs the same backlog through a publisher that
//! confirms at once. Skipped, with the reason printed, when `nats://127.0.0.1:4222` does not answer.

use std::time::Duration;

use anyhow::{Context, Result};
use outbox_seaorm::Destination;
use outbox_seaorm::brokers::nats::NatsPublisher;

use super::{Ctx, NullPublisher, Shape, alternate_with, config, drain_ours, fill_ours};
use crate::report::{RATE_HEADER, Table};

const NATS_ADDR: &str = "127.0.0.1:4222";
const NATS_URL: &str = "nats://127.0.0.1:4222";

/// Runs the scenario, or prints why it is skipped.
pub async fn run(ctx: &Ctx) -> Result<()> {
    let probe = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(NATS_ADDR)).await;
    if !matches!(probe, Ok(Ok(_))) {
        println!("\nnats: skipped: nothing answers on {NATS_ADDR}");
        return Ok(());
    }
    let stamp = chrono::Utc::now().timestamp_millis();
    let prefix = format!("outbox_bench_{stamp}");
    let stream = format!("OUTBOX_BENCH_{stamp}");
    let destination =
        Destination::parse(&format!("{prefix}.{{aggregate_type}}.{{event_type}}")).context("destination")?;
    let publisher = NatsPublisher::connect(NATS_URL, destination).await.context("connect to NATS")?;
    publisher.ensure_stream(&stream, &[&format!("{prefix}.>")]).await.context("create the bench stream")?;
    let publisher = std::sync::Arc::new(publisher);

    let shape = Shape { events: ctx.size(100_000, 10_000), aggregates: 10_000 };
    let result = alternate_with(ctx, 2, async |i| {
        let db = ctx.target.fresh().await?;
        fill_ours(&db, shape, "o").await?;
        let run = if i == 0 {
            drain_ours(ctx, &config(1000), 1, NullPublisher, shape.events as u64).await
        } else {
            drain_ours(ctx, &config(1000), 1, publisher.clone(), shape.events as u64).await
        };
        db.close().await.context("close")?;
        run
    })
    .await;
    let deleted = publisher.jetstream().delete_stream(&stream).await;
    let runs = result?;
    deleted.map_err(|e| anyhow::anyhow!("delete stream {stream}: {e}"))?;
    let mut table = Table::new(
        ctx.title(&format!("nats: {} events over 10,000 aggregates, batch 1000, events/s", shape.events)),
        &RATE_HEADER,
    );
    table.rate_row("publisher", "ours + confirm-at-once", &runs[0], None, "events/s");
    table.rate_row("publisher", "ours + NATS JetStream (PubAck)", &runs[1], Some(&runs[0]), "events/s");
    table.emit(ctx.out.as_deref())
}

//! Scenario ④ through a real broker (`--broker URL`): the relay publishes through the broker's adapter
//! with the same outage and lost acks, and billing consumes from the broker through its inbox.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use outbox_seaorm::brokers::BrokerKind;
use outbox_seaorm::brokers::nats::{NatsConsumer, NatsPublisher};
use outbox_seaorm::brokers::rabbitmq::{RabbitConsumer, RabbitPublisher};
use outbox_seaorm::brokers::redis::{RedisConsumer, RedisPublisher};
use outbox_seaorm::{
    CancellationToken, Destination, Disposition, EventId, FaultyPublisher, OutboxEvent, OutboxStore, Publisher, Relay,
    RelayConfig, SeaOrmStore,
};
use sea_orm::DatabaseConnection;

use crate::app::{self, Order, Result};
use crate::{BACKOFF, Checks, Lab, StepClock, drain, json};

/// What billing saw, counted as messages arrive.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
struct Tally {
    delivered: usize,
    processed: usize,
    duplicate: usize,
}

type SharedTally = Arc<Mutex<Tally>>;

fn snapshot(tally: &SharedTally) -> Tally {
    *tally.lock().unwrap_or_else(|p| p.into_inner())
}

/// The billing handler every consumer runs: inbox dedup and the invoice in one transaction, counted.
fn billing(
    db: DatabaseConnection,
    tally: SharedTally,
) -> impl Fn(OutboxEvent) -> BillingFuture + Send + Sync + 'static {
    move |message: OutboxEvent| {
        let (db, tally) = (db.clone(), tally.clone());
        Box::pin(async move {
            let result = app::bill(&db, &message).await;
            {
                let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                t.delivered += 1;
                match &result {
                    Ok(outcome) if outcome.is_processed() => t.processed += 1,
                    Ok(_) => t.duplicate += 1,
                    Err(error) => tracing::warn!(%error, "billing failed"),
                }
            }
            outbox_seaorm::disposition(&result)
        })
    }
}

type BillingFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Disposition> + Send>>;

/// A short id that keeps this run's streams, queues and topics apart from any other run's.
fn run_id() -> String {
    let id = EventId::new().to_string();
    id[id.len() - 8..].to_owned()
}

/// Runs scenario ④ through the broker at `url`.
pub async fn flaky_broker_through(lab: &Lab, url: &str, checks: &mut Checks) -> Result<()> {
    let kind = BrokerKind::from_url(url)?;
    println!(
        "④ twenty orders through {kind:?} at {}; the broker is down three times and four acks are lost:",
        outbox_seaorm::broker::redact_url(url)
    );
    app::reset(&lab.db).await?;
    for i in 1..=20 {
        app::place_order(&lab.db, &Order::new(format!("o{i}"), format!("u{i}"), 1000 * i)).await?;
    }
    let tally = SharedTally::default();
    let handler = billing(lab.db.clone(), tally.clone());
    let shutdown = CancellationToken::new();
    let run = run_id();
    // Each arm builds the publisher and a running consumer, then shares the rest of the scenario.
    let (broker_dedups, consumer, cleanup): (bool, tokio::task::JoinHandle<Result<()>>, Cleanup) = match kind {
        BrokerKind::Nats => {
            let stream = format!("LAB{run}");
            let publisher =
                NatsPublisher::connect(url, Destination::parse(&format!("lab{run}.{{event_type}}"))?).await?;
            publisher.ensure_stream(&stream, &[&format!("lab{run}.>")]).await?;
            let consumer = NatsConsumer::connect(url, &stream, "billing", None).await?;
            let token = shutdown.clone();
            let task = tokio::spawn(async move { Ok(consumer.run(handler, token).await?) });
            relay_through(lab, publisher.clone(), checks).await?;
            let cleanup = Cleanup::Nats(Box::new(publisher), stream);
            (true, task, cleanup)
        }
        BrokerKind::RabbitMq => {
            let (exchange, queue) = (format!("lab-{run}"), format!("lab-{run}-billing"));
            let publisher =
                RabbitPublisher::connect(url, &exchange, Destination::parse("{aggregate_type}.{event_type}")?).await?;
            publisher.declare_exchange(&exchange).await?;
            publisher.declare_queue(&exchange, &queue, "#").await?;
            let consumer = RabbitConsumer::connect(url, &queue, "billing").await?;
            let token = shutdown.clone();
            let task = tokio::spawn(async move { Ok(consumer.run(handler, token).await?) });
            relay_through(lab, publisher, checks).await?;
            (false, task, Cleanup::Rabbit(url.to_owned(), exchange, queue))
        }
        BrokerKind::Redis => {
            let stream = format!("lab:{run}");
            let publisher = RedisPublisher::connect(url, Destination::fixed(&stream)?).await?;
            let consumer = RedisConsumer::connect(url, &stream, "billing", "lab").await?;
            let token = shutdown.clone();
            let task = tokio::spawn(async move { Ok(consumer.run(handler, token).await?) });
            relay_through(lab, publisher, checks).await?;
            (false, task, Cleanup::Redis(url.to_owned(), stream))
        }
        BrokerKind::Kafka => {
            let topic = format!("lab-{run}");
            crate::kafka::create_topic(url, &topic).await?;
            let publisher = crate::kafka::publisher(url, &topic).await?;
            let consumer = crate::kafka::consumer(url, &topic).await?;
            let token = shutdown.clone();
            let task = tokio::spawn(async move { Ok(consumer.run(handler, token).await?) });
            relay_through(lab, publisher, checks).await?;
            (false, task, Cleanup::None)
        }
    };

    // Twenty events reach billing; the four republished after lost acks arrive too unless the broker
    // dropped them by event id.
    let expected = if broker_dedups { 20 } else { 24 };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        let t = snapshot(&tally);
        if t.processed >= 20 && t.delivered >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A moment more, so a late duplicate would be counted.
    tokio::time::sleep(Duration::from_millis(200)).await;
    shutdown.cancel();
    consumer.await??;
    cleanup.run().await;

    let t = snapshot(&tally);
    let (invoices, total, billed_orders) = app::invoices(&lab.db).await?;
    let dropped_by_broker = 24 - t.delivered;
    println!("   billing got {} messages: {} ← invoices: {invoices}, totalling {total}", t.delivered, json(&t));
    if broker_dedups {
        println!("   the broker itself dropped {dropped_by_broker} republished messages by event id");
    } else {
        println!("   the broker kept the {} republished messages; the inbox dropped them", t.duplicate);
    }
    checks.check("billing processed 20", t.processed == 20);
    checks.check("every duplicate was dropped, by the broker or by the inbox", dropped_by_broker + t.duplicate == 4);
    checks.check("20 invoices, one per order", invoices == 20 && billed_orders == 20);
    checks.check("totalling 210000", total == 210_000);
    Ok(())
}

/// Publishes the twenty orders through `publisher` with three rejected sends and four lost acks.
async fn relay_through<P: Publisher>(lab: &Lab, publisher: P, checks: &mut Checks) -> Result<()> {
    let faulty = FaultyPublisher::new(publisher);
    faulty.go_down_for(3);
    faulty.lose_acks(4);
    let config = RelayConfig::default().with_batch_size(5).with_backoff(BACKOFF);
    let relay = Relay::new(SeaOrmStore::new(lab.db.clone()), faulty, config)?;
    let passes = drain(&relay, &mut StepClock::new()).await?;
    let stats = relay.store().stats(Utc::now()).await?;
    println!("   the relay made {} passes; pending afterwards: {}", passes.len(), stats.pending);
    checks.check("the relay drained the outbox through the broker", stats.pending == 0 && stats.dead == 0);
    Ok(())
}

/// What to remove from the broker afterwards.
enum Cleanup {
    Nats(Box<NatsPublisher>, String),
    Rabbit(String, String, String),
    Redis(String, String),
    None,
}

impl Cleanup {
    async fn run(self) {
        let outcome: Result<()> = async {
            match self {
                Cleanup::Nats(publisher, stream) => {
                    publisher.jetstream().delete_stream(&stream).await?;
                }
                Cleanup::Rabbit(url, exchange, queue) => {
                    let admin = RabbitPublisher::connect(&url, &exchange, Destination::fixed("cleanup")?).await?;
                    admin.delete_queue(&queue).await?;
                    admin.delete_exchange(&exchange).await?;
                }
                Cleanup::Redis(url, stream) => {
                    use outbox_seaorm::brokers::redis::redis;
                    let mut conn = redis::Client::open(url.as_str())?.get_multiplexed_async_connection().await?;
                    redis::cmd("DEL").arg(&stream).arg(format!("{stream}:dead")).query_async::<()>(&mut conn).await?;
                }
                Cleanup::None => {}
            }
            Ok(())
        }
        .await;
        if let Err(error) = outcome {
            tracing::warn!(%error, "cleaning up the broker failed");
        }
    }
}

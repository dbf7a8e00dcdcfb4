//! Scenario ④ through a real broker (`--broker URL`): the relay publishes through the broker's adapter
//! with the same outage and lost acks, and billing consumes from the broker with the consume driver and
//! its inbox. Then billing breaks for one order: the driver retries it, dead-letters it at the broker, and
//! after the fix a replay from the dead letters bills it once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use outbox_seaorm::brokers::BrokerKind;
use outbox_seaorm::brokers::nats::{NatsPublisher, NatsTransport};
use outbox_seaorm::brokers::rabbitmq::{RabbitPublisher, RabbitTransport};
use outbox_seaorm::brokers::redis::{RedisPublisher, RedisTransport};
use outbox_seaorm::consume::{DeadLetters, Transport};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::testkit::FaultyPublisher;
use outbox_seaorm::{
    Backoff, CancellationToken, Consumer, ConsumerConfig, Destination, EventId, Publisher, Received, Relay,
    RelayConfig, SeaOrmStore,
};

use crate::app::{self, Order, OrderPlaced, Result};
use crate::{BACKOFF, Checks, Lab, StepClock, drain, json};

/// The order whose billing is broken until the fix is deployed.
const BROKEN_ORDER: &str = "o21";

/// A short id that keeps this run's streams, queues and topics apart from any other run's.
fn run_id() -> String {
    let id = EventId::new().to_string();
    id[id.len() - 8..].to_owned()
}

/// Billing: the inbox handler for `order.placed`, failing for [`BROKEN_ORDER`] while `broken` is set.
fn billing(lab: &Lab, broken: Arc<AtomicBool>) -> Result<Consumer> {
    let db = lab.db.clone();
    let config = ConsumerConfig::default()
        .with_max_deliveries(3)
        .with_backoff(Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200), multiplier: 2 })
        .with_fetch_wait(Duration::from_millis(200));
    Ok(Consumer::new("billing").with_config(config).on::<OrderPlaced>(move |placed: Received<OrderPlaced>| {
        let (db, broken) = (db.clone(), broken.clone());
        async move {
            if broken.load(Ordering::SeqCst) && placed.event.order_id == BROKEN_ORDER {
                return Err(format!("billing is broken for {BROKEN_ORDER} (fixed in the next deploy)"));
            }
            outbox_seaorm::deliver(&db, "billing", &placed.envelope, app::bill).await.map_err(|e| e.to_string())
        }
    }))
}

/// Runs scenario ④ through the broker at `url`.
pub async fn flaky_broker_through(lab: &Lab, url: &str, checks: &mut Checks) -> Result<()> {
    let kind = BrokerKind::from_url(url)?;
    println!(
        "④ twenty orders through {kind:?} at {}; the broker is down three times and four acks are lost:",
        outbox_seaorm::redact_url(url)
    );
    app::reset(&lab.db).await?;
    for i in 1..=20 {
        app::place_order(&lab.db, &Order::new(format!("o{i}"), format!("u{i}"), 1000 * i)).await?;
    }
    let run = run_id();
    match kind {
        BrokerKind::Nats => {
            let stream = format!("LAB{run}");
            let publisher =
                NatsPublisher::connect(url, Destination::parse(&format!("lab{run}.{{event_type}}"))?).await?;
            publisher.ensure_stream(&stream, &[&format!("lab{run}.>")]).await?;
            let transport = NatsTransport::connect(url, &stream, "billing", None).await?;
            let outcome = through(lab, &publisher, transport, true, checks).await;
            cleanup("NATS", async { Ok(publisher.jetstream().delete_stream(&stream).await.map(|_| ())?) }).await;
            outcome
        }
        BrokerKind::RabbitMq => {
            let (exchange, queue) = (format!("lab-{run}"), format!("lab-{run}-billing"));
            let publisher =
                RabbitPublisher::connect(url, &exchange, Destination::parse("{aggregate_type}.{event_type}")?).await?;
            publisher.declare_exchange(&exchange).await?;
            publisher.declare_queue(&exchange, &queue, "#").await?;
            let transport = RabbitTransport::connect(url, &queue, "billing").await?;
            let outcome = through(lab, &publisher, transport, false, checks).await;
            cleanup("RabbitMQ", async {
                publisher.delete_queue(&queue).await?;
                publisher.delete_queue(&format!("{queue}.dead")).await?;
                Ok(publisher.delete_exchange(&exchange).await?)
            })
            .await;
            outcome
        }
        BrokerKind::Redis => {
            let stream = format!("lab:{run}");
            let publisher = RedisPublisher::connect(url, Destination::fixed(&stream)?).await?;
            let transport = RedisTransport::connect(url, &stream, "billing", "lab").await?;
            let outcome = through(lab, &publisher, transport, false, checks).await;
            cleanup("Redis", async {
                use outbox_seaorm::brokers::redis::redis;
                let mut conn = redis::Client::open(url)?.get_multiplexed_async_connection().await?;
                Ok(redis::cmd("DEL").arg(&stream).arg(format!("{stream}:dead")).query_async::<()>(&mut conn).await?)
            })
            .await;
            outcome
        }
        BrokerKind::Kafka => {
            let topic = format!("lab-{run}");
            crate::kafka::create_topic(url, &topic).await?;
            let publisher = crate::kafka::publisher(url, &topic).await?;
            let transport = crate::kafka::transport(url, &topic).await?;
            through(lab, &publisher, transport, false, checks).await
        }
    }
}

/// Relays the twenty orders through `publisher` while billing consumes from `transport`, then breaks
/// billing for one more order, dead-letters it, fixes billing and replays it.
async fn through<P, T>(lab: &Lab, publisher: &P, transport: T, broker_dedups: bool, checks: &mut Checks) -> Result<()>
where
    P: Publisher,
    T: Transport + DeadLetters + 'static,
{
    let broken = Arc::new(AtomicBool::new(true));
    let consumer = Arc::new(billing(lab, broken.clone())?);
    let transport = Arc::new(transport);
    let shutdown = CancellationToken::new();
    let task = {
        let (consumer, transport, token) = (consumer.clone(), transport.clone(), shutdown.clone());
        tokio::spawn(async move { consumer.run(&*transport, token).await })
    };
    relay_through(lab, publisher, true, checks).await?;

    // Twenty events reach billing; the four republished after lost acks arrive too unless the broker
    // dropped them by event id.
    let expected = if broker_dedups { 20 } else { 24 };
    let delivered = |c: &Consumer| c.stats().processed + c.stats().duplicates;
    wait_until(Duration::from_secs(30), || consumer.stats().processed >= 20 && delivered(&consumer) >= expected).await;
    // A moment more, so a late duplicate would be counted.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stats = consumer.stats();
    let (invoices, total, billed_orders) = app::invoices(&lab.db).await?;
    let dropped_by_broker = 24 - delivered(&consumer);
    println!(
        "   billing got {} messages: {} ← invoices: {invoices}, totalling {total}",
        delivered(&consumer),
        json(&stats_json(&consumer))
    );
    if broker_dedups {
        println!("   the broker itself dropped {dropped_by_broker} republished messages by event id");
    } else {
        println!("   the broker kept the {} republished messages; the inbox dropped them", stats.duplicates);
    }
    checks.check("billing processed 20", stats.processed == 20);
    checks
        .check("every duplicate was dropped, by the broker or by the inbox", dropped_by_broker + stats.duplicates == 4);
    checks.check("20 invoices, one per order", invoices == 20 && billed_orders == 20);
    checks.check("totalling 210000", total == 210_000);

    println!(
        "   billing breaks for order {BROKEN_ORDER}: three deliveries fail, then it is dead-lettered at the broker"
    );
    app::place_order(&lab.db, &Order::new(BROKEN_ORDER, "u21", 21_000)).await?;
    relay_through(lab, publisher, false, checks).await?;
    wait_until(Duration::from_secs(30), || consumer.stats().dead_lettered >= 1).await;
    let stats = consumer.stats();
    checks.check(
        "the broken order was dead-lettered once, after 2 retries",
        stats.dead_lettered == 1 && stats.retried == 2,
    );
    checks.check("and not billed", app::invoices(&lab.db).await?.0 == 20);

    broken.store(false, Ordering::SeqCst);
    let replayed = transport.replay_dead_letters(10).await?;
    println!("   billing is fixed; {replayed} dead letter replayed to its original destination");
    wait_until(Duration::from_secs(30), || consumer.stats().processed >= 21).await;
    shutdown.cancel();
    task.await??;
    let (invoices, total, _) = app::invoices(&lab.db).await?;
    println!("   invoices: {invoices}, totalling {total}; billing: {}", json(&stats_json(&consumer)));
    checks.check(
        "the replayed order was billed once: 21 invoices totalling 231000",
        replayed == 1 && invoices == 21 && total == 231_000,
    );
    Ok(())
}

fn stats_json(consumer: &Consumer) -> serde_json::Value {
    let s = consumer.stats();
    serde_json::json!({ "processed": s.processed, "duplicates": s.duplicates, "retried": s.retried, "dead_lettered": s.dead_lettered })
}

async fn wait_until(limit: Duration, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Publishes the pending orders through `publisher`, with three rejected sends and four lost acks when
/// `faults` is set.
async fn relay_through<P: Publisher>(lab: &Lab, publisher: P, faults: bool, checks: &mut Checks) -> Result<()> {
    let faulty = FaultyPublisher::new(publisher);
    if faults {
        faulty.go_down_for(3);
        faulty.lose_acks(4);
    }
    let config = RelayConfig::default().with_batch_size(5).with_backoff(BACKOFF);
    let relay = Relay::new(SeaOrmStore::new(lab.db.clone()), faulty, config)?;
    let passes = drain(&relay, &mut StepClock::new()).await?;
    let stats = relay.store().stats(Utc::now()).await?;
    println!("   the relay made {} passes; pending afterwards: {}", passes.len(), stats.pending);
    checks.check("the relay drained the outbox through the broker", stats.pending == 0 && stats.dead == 0);
    Ok(())
}

/// Removes what the scenario created at the broker; a failure is only logged.
async fn cleanup(broker: &str, work: impl std::future::Future<Output = Result<()>>) {
    if let Err(error) = work.await {
        tracing::warn!(%error, broker, "cleaning up the broker failed");
    }
}

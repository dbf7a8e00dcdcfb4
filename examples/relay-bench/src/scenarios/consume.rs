//! Consumers at relay speed: one backlog relayed to a real broker, then consumed by the consume driver
//! with an inbox and an effect row on the bench database: one transaction per message, group commit with a
//! handler per message, and group commit with a batch handler (one effect statement per call). Each round
//! relays a fresh backlog to fresh destinations and reads it three times (one consumer group per variant),
//! so the four figures of a round are on the same messages. Per broker: NATS
//! JetStream, Redis Streams, RabbitMQ, and Kafka with the `kafka` feature (3 partitions, the transport
//! assigned all of them, so no group join is timed); each is skipped, with the reason printed, when it does
//! not answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_seaorm::brokers::nats::{NatsPublisher, NatsTransport};
use outbox_seaorm::brokers::rabbitmq::{DEFAULT_ROUTING_KEY, RabbitPublisher, RabbitTransport};
use outbox_seaorm::brokers::redis::{RedisPublisher, RedisPublisherConfig, RedisTransport};
use outbox_seaorm::consume::Transport;
use outbox_seaorm::{
    CancellationToken, Consumer, ConsumerConfig, Destination, DomainEvent, Publisher, Received, SeaOrmGroupCommit,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde::{Deserialize, Serialize};

use super::{Ctx, config, drain_ours, round_ratio};
use crate::report::{RATE_HEADER, Run, Table, ratio};

/// The floor of the group-commit consumer's rate over the relay's (`--floors`; measured 0.35-0.47 through
/// NATS and Redis, 1.1-1.3 through RabbitMQ, in release builds, since groups share one transaction without
/// savepoints; 0.32 through Redis in a CI run right after its test build, so the floor leaves room for a
/// loaded machine and still fails a consumer that got half as fast).
const CONSUMER_FLOOR: f64 = 0.2;
/// The floor of the batch-handler consumer's rate over the relay's (`--floors`; measured 1.12-1.31 through
/// NATS and Redis on PostgreSQL, 3 rounds, and 2.2-2.3 in a quick run, release builds: a batch path that
/// lost its one statement per call falls to the group-commit figures, 0.5-0.7, and below the floor).
const BATCH_FLOOR: f64 = 0.5;
/// The floor of the group-commit consumer's rate over one transaction per message (measured 2.0-2.5 in
/// quick runs).
const GROUP_GAIN_FLOOR: f64 = 1.5;

/// The event the scenario relays and consumes.
#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug)]
#[domain_event(name = "bench.order_placed", version = 1, aggregate = "order")]
struct OrderPlaced {
    #[aggregate_id]
    order_id: String,
    total_minor: i64,
}

/// The brokers, each with where it answers.
const BROKERS: &[(&str, &str)] = &[
    ("NATS JetStream", "127.0.0.1:4222"),
    ("Redis Streams", "127.0.0.1:6379"),
    ("RabbitMQ", "127.0.0.1:5672"),
    #[cfg(feature = "kafka")]
    ("Kafka", kafka::BOOTSTRAP),
];

/// Runs the scenario on every broker that answers.
pub async fn run(ctx: &Ctx) -> Result<()> {
    let events = ctx.size(20_000, 3_000);
    let aggregates = ctx.size(1_000, 300);
    for &(name, address) in BROKERS {
        let probe = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(address)).await;
        if !matches!(probe, Ok(Ok(_))) {
            println!("\nconsume through {name}: skipped: nothing answers on {address}");
            continue;
        }
        let mut runs: [Vec<Run>; 4] = Default::default();
        let mut group_sizes = Vec::new();
        for round in 0..ctx.rounds {
            let db = ctx.target.fresh().await?;
            let sql = "CREATE TABLE bench_effects (order_id VARCHAR(64) NOT NULL, total_minor BIGINT NOT NULL)";
            db.execute_unprepared(sql).await.context("create bench_effects")?;
            fill(&db, events, aggregates).await?;
            let tag = chrono::Utc::now().timestamp_micros().to_string();
            let (relayed, broker) = relay(ctx, name, &tag, events as u64).await?;
            runs[0].push(relayed);
            // The consumers take turns going first.
            let mut order = Mode::ALL;
            order.rotate_left(round % Mode::ALL.len());
            for mode in order {
                let (run, groups) = consume_from(&broker, &tag, &db, mode, events as u64)
                    .await
                    .with_context(|| format!("round {} ({mode:?})", round + 1))?;
                if mode == Mode::Grouped && groups > 0 {
                    group_sizes.push(run.done as f64 / groups as f64);
                }
                runs[mode as usize + 1].push(run);
            }
            broker.cleanup(&tag).await;
            db.close().await.context("close")?;
        }
        let mut table = Table::new(
            ctx.title(&format!(
                "consume through {name}: {events} events over {aggregates} aggregates, inbox + effect row, events/s"
            )),
            &RATE_HEADER,
        );
        table.rate_row("relay", "batch 1000, to the broker", &runs[0], None, "events/s");
        table.rate_row("consumer", "one transaction per message", &runs[1], Some(&runs[0]), "events/s");
        table.rate_row("consumer", "group commit (up to 64 per commit)", &runs[2], Some(&runs[0]), "events/s");
        table.rate_row("consumer", "group commit, batch handler", &runs[3], Some(&runs[0]), "events/s");
        let grouped = round_ratio(&runs[2], &runs[0]);
        let batched = round_ratio(&runs[3], &runs[0]);
        let group_size = crate::report::summary(&group_sizes).0;
        table.note(format!(
            "Consumer / relay, median of per-round ratios: one per transaction {}, group commit {} \
             ({group_size:.1} messages per commit), batch handler {}.",
            ratio(round_ratio(&runs[1], &runs[0])),
            ratio(grouped),
            ratio(batched),
        ));
        table.emit(ctx.out.as_deref())?;
        ctx.floor(&format!("group-commit consumer / relay through {name}"), grouped, CONSUMER_FLOOR);
        ctx.floor(&format!("batch-handler consumer / relay through {name}"), batched, BATCH_FLOOR);
        let gain = round_ratio(&runs[2], &runs[1]);
        ctx.floor(&format!("group commit / one transaction per message through {name}"), gain, GROUP_GAIN_FLOOR);
    }
    Ok(())
}

const NATS_URL: &str = "nats://127.0.0.1:4222";
const REDIS_URL: &str = "redis://127.0.0.1:6379";
const RABBIT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// How a round's consumer applies messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// One transaction per message.
    OneByOne,
    /// Group commit, a handler call per message.
    Grouped,
    /// Group commit, a batch handler: one call, one effect statement, per run of messages.
    Batched,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::OneByOne, Mode::Grouped, Mode::Batched];

    /// The broker-side consumer group of the mode.
    fn group(self) -> &'static str {
        GROUPS[self as usize]
    }
}

/// The consumer groups of a round, one per [`Mode`].
const GROUPS: [&str; 3] = ["bench-one", "bench-group", "bench-batch"];

/// The broker a round relayed to, kept to read it back and delete what the round created.
enum Broker {
    Nats(Box<NatsPublisher>),
    Redis,
    Rabbit,
    #[cfg(feature = "kafka")]
    Kafka,
}

impl Broker {
    fn nats_stream(tag: &str) -> String {
        format!("OUTBOX_BENCH_CONSUME_{tag}")
    }

    fn redis_stream(tag: &str) -> String {
        format!("outbox-bench-consume:{tag}")
    }

    fn rabbit_queue(tag: &str, group: &str) -> String {
        format!("outbox-bench-consume-{tag}-{group}")
    }

    async fn cleanup(&self, tag: &str) {
        if let Broker::Nats(publisher) = self
            && let Err(error) = publisher.jetstream().delete_stream(Self::nats_stream(tag)).await
        {
            eprintln!("consume: deleting stream {}: {error}", Self::nats_stream(tag));
        }
        #[cfg(feature = "kafka")]
        if let Broker::Kafka = self {
            kafka::delete_topic(&kafka::topic(tag)).await;
        }
        // A round's Redis stream and RabbitMQ queues are read to the end; they are small and left.
    }
}

/// Relays the backlog to fresh destinations through the broker's publisher (the consumers' queues bound
/// first, on RabbitMQ); timed.
async fn relay(ctx: &Ctx, broker: &str, tag: &str, expected: u64) -> Result<(Run, Broker)> {
    match broker {
        "NATS JetStream" => {
            let prefix = format!("outbox_bench_consume_{tag}");
            let destination = Destination::parse(&format!("{prefix}.{{event_type}}")).context("destination")?;
            let publisher = NatsPublisher::connect(NATS_URL, destination).await?;
            publisher.ensure_stream(&Broker::nats_stream(tag), &[&format!("{prefix}.>")]).await?;
            Ok((drain(ctx, publisher.clone(), expected).await?, Broker::Nats(Box::new(publisher))))
        }
        "Redis Streams" => {
            let destination = Destination::fixed(&Broker::redis_stream(tag)).context("destination")?;
            // The groups are created after the drain: let the first `XADD` create the stream.
            let config = RedisPublisherConfig::default().with_create_streams(true);
            let publisher = RedisPublisher::connect_with(REDIS_URL, destination, config).await?;
            Ok((drain(ctx, publisher, expected).await?, Broker::Redis))
        }
        #[cfg(feature = "kafka")]
        "Kafka" => {
            let topic = kafka::topic(tag);
            kafka::create_topic(&topic).await?;
            let publisher = Arc::new(kafka::publisher(&topic)?);
            Ok((drain(ctx, publisher, expected).await?, Broker::Kafka))
        }
        _ => {
            let exchange = format!("outbox-bench-consume-{tag}");
            let routing_key = Destination::parse(DEFAULT_ROUTING_KEY).context("routing key")?;
            let publisher = RabbitPublisher::connect(RABBIT_URL, &exchange, routing_key).await?;
            for group in GROUPS {
                publisher.declare_queue(&exchange, &Broker::rabbit_queue(tag, group), "#").await?;
            }
            Ok((drain(ctx, Arc::new(publisher), expected).await?, Broker::Rabbit))
        }
    }
}

async fn drain<P: Publisher + Clone + 'static>(ctx: &Ctx, publisher: P, expected: u64) -> Result<Run> {
    let run = drain_ours(ctx, &config(1000), 1, publisher, expected).await?;
    if run.done < expected {
        bail!("the relay published {} of {expected} events within the time budget", run.done);
    }
    Ok(run)
}

/// Reads the round's messages back as the consumer group of `mode`; timed, with the number of group
/// commits.
async fn consume_from(
    broker: &Broker,
    tag: &str,
    db: &DatabaseConnection,
    mode: Mode,
    expected: u64,
) -> Result<(Run, u64)> {
    let name = mode.group();
    match broker {
        Broker::Nats(_) => {
            let transport = NatsTransport::connect(NATS_URL, &Broker::nats_stream(tag), name, None).await?;
            consume(db, transport, name, mode, expected).await
        }
        Broker::Redis => {
            let transport = RedisTransport::connect(REDIS_URL, &Broker::redis_stream(tag), name, "c1").await?;
            consume(db, transport, name, mode, expected).await
        }
        Broker::Rabbit => {
            let transport = RabbitTransport::connect(RABBIT_URL, &Broker::rabbit_queue(tag, name), name).await?;
            consume(db, transport, name, mode, expected).await
        }
        #[cfg(feature = "kafka")]
        Broker::Kafka => consume(db, kafka::transport(&kafka::topic(tag), name)?, name, mode, expected).await,
    }
}

/// `events` events over `aggregates` aggregates, enqueued 5000 per transaction.
async fn fill(db: &DatabaseConnection, events: usize, aggregates: usize) -> Result<()> {
    let all: Vec<_> = (0..events)
        .map(|i| OrderPlaced { order_id: format!("o{}", i % aggregates), total_minor: i as i64 }.to_new_event())
        .collect::<Result<_, _>>()
        .context("build events")?;
    for chunk in all.chunks(5000) {
        outbox_seaorm::enqueue_all(db, chunk).await.context("enqueue")?;
    }
    Ok(())
}

/// Consumes until `expected` events are applied (inbox row + effect row), timed from the start; with the
/// number of group commits.
async fn consume<T: Transport + 'static>(
    db: &DatabaseConnection,
    transport: T,
    name: &str,
    mode: Mode,
    expected: u64,
) -> Result<(Run, u64)> {
    let (handler_db, consumer_name) = (db.clone(), name.to_owned());
    let backend = db.get_database_backend();
    let config = ConsumerConfig::default();
    let consumer = match mode {
        Mode::OneByOne => Consumer::new(name).with_config(config.with_group_size(1)),
        Mode::Grouped | Mode::Batched => {
            Consumer::new(name).with_config(config).with_group_commit(SeaOrmGroupCommit::new(db.clone()))
        }
    };
    let consumer = if mode == Mode::Batched {
        consumer.on_batch::<OrderPlaced>(move |batch: Vec<Received<OrderPlaced>>| {
            let (db, consumer_name) = (handler_db.clone(), consumer_name.clone());
            async move {
                outbox_seaorm::handle_batch_once(&db, &consumer_name, batch, async |txn, new| {
                    txn.execute_raw(effects(backend, new.iter().map(|r| &r.event))).await.map(|_| ())
                })
                .await
            }
        })
    } else {
        consumer.on::<OrderPlaced>(move |received: Received<OrderPlaced>| {
            let (db, consumer_name) = (handler_db.clone(), consumer_name.clone());
            async move {
                let id = received.envelope.id.to_string();
                let insert = effects(backend, [&received.event]);
                outbox_seaorm::handle_once(&db, &consumer_name, &id, async |txn| txn.execute_raw(insert).await).await
            }
        })
    };
    let consumer = Arc::new(consumer);
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let task = {
        let (consumer, shutdown) = (consumer.clone(), shutdown.clone());
        tokio::spawn(async move { consumer.run(&transport, shutdown).await })
    };
    let budget = Duration::from_secs(600);
    let mut timed_out = false;
    while consumer.stats().processed + consumer.stats().duplicates < expected {
        if started.elapsed() > budget || task.is_finished() {
            timed_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    shutdown.cancel();
    task.await.context("consumer task panicked")??;
    let stats = consumer.stats();
    if stats.dead_lettered > 0 {
        bail!("the bench consumer dead-lettered messages: {stats:?}");
    }
    Ok((Run { done: stats.processed, secs, timed_out }, stats.groups))
}

/// The effect of some events: one row each, in one statement.
fn effects<'e>(backend: DbBackend, events: impl IntoIterator<Item = &'e OrderPlaced>) -> Statement {
    let mut values = Vec::new();
    let rows: Vec<String> = events
        .into_iter()
        .map(|event| {
            values.extend([event.order_id.clone().into(), event.total_minor.into()]);
            match backend {
                DbBackend::Postgres => format!("(${}, ${})", values.len() - 1, values.len()),
                _ => "(?, ?)".to_owned(),
            }
        })
        .collect();
    let sql = format!("INSERT INTO bench_effects (order_id, total_minor) VALUES {}", rows.join(", "));
    Statement::from_sql_and_values(backend, sql, values)
}

/// Kafka for the scenario: a 3-partition topic per round, a publisher to it, and transports assigned every
/// partition (no group join: a join on tansu takes seconds that would be timed as consuming).
#[cfg(feature = "kafka")]
mod kafka {
    use std::time::Duration;

    use anyhow::{Context, Result};
    use outbox_seaorm::Destination;
    use outbox_seaorm::brokers::kafka::rdkafka::ClientConfig;
    use outbox_seaorm::brokers::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use outbox_seaorm::brokers::kafka::rdkafka::client::DefaultClientContext;
    use outbox_seaorm::brokers::kafka::{KafkaPublisher, KafkaTransport, Subscription};

    pub const BOOTSTRAP: &str = "127.0.0.1:9092";
    const PARTITIONS: i32 = 3;

    pub fn topic(tag: &str) -> String {
        format!("outbox-bench-consume-{tag}")
    }

    fn admin() -> Result<AdminClient<DefaultClientContext>> {
        ClientConfig::new().set("bootstrap.servers", BOOTSTRAP).create().context("Kafka admin client")
    }

    fn options() -> AdminOptions {
        AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
    }

    pub async fn create_topic(topic: &str) -> Result<()> {
        let new = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1));
        for result in admin()?.create_topics([&new], &options()).await.context("create topic")? {
            result.map_err(|(topic, code)| anyhow::anyhow!("create topic {topic}: {code:?}"))?;
        }
        Ok(())
    }

    pub async fn delete_topic(topic: &str) {
        let deleted = match admin() {
            Ok(admin) => admin.delete_topics(&[topic], &options()).await.map(drop).map_err(anyhow::Error::from),
            Err(error) => Err(error),
        };
        if let Err(error) = deleted {
            eprintln!("consume: deleting topic {topic}: {error}");
        }
    }

    pub fn publisher(topic: &str) -> Result<KafkaPublisher> {
        Ok(KafkaPublisher::connect(BOOTSTRAP, Destination::fixed(topic).context("topic")?, &[])?)
    }

    pub fn transport(topic: &str, group: &str) -> Result<KafkaTransport> {
        let partitions = (0..PARTITIONS).map(|p| (topic.to_owned(), p)).collect();
        Ok(KafkaTransport::connect(BOOTSTRAP, &format!("{group}-{topic}"), Subscription::Partitions(partitions), &[])?)
    }
}

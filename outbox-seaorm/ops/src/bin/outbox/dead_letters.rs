//! `outbox dead-letters`: the consumer side's dead letters, kept at the broker (NATS JetStream, Kafka,
//! RabbitMQ, Redis Streams), listed, shown, replayed, discarded and counted through
//! `outbox_runtime::consume::DeadLetters`. No database is involved.

use clap::{Args, Subcommand};
use outbox_seaorm::Destination;
use outbox_seaorm::brokers::BrokerKind;
use outbox_seaorm::brokers::kafka::{KafkaTransport, Subscription};
use outbox_seaorm::brokers::nats::{NatsPublisher, NatsTransport, NatsTransportOptions};
use outbox_seaorm::brokers::rabbitmq::RabbitTransport;
use outbox_seaorm::brokers::redis::{RedisTransport, RedisTransportConfig};
use outbox_seaorm::consume::{DeadFilter, DeadLetterAction, DeadLetterEntry, DeadLetterOutcome, DeadLetters, Lag};
use outbox_seaorm::text::one_line;

use crate::selection::SelectionArgs;
use crate::{CliError, JsonArgs};

#[derive(Subcommand)]
pub enum DeadLettersCommand {
    /// List consumer dead letters, oldest first (without payloads).
    List {
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        filter: SelectionArgs,
        /// Most dead letters to list.
        #[arg(long, env = "OUTBOX_LIMIT", default_value_t = 50)]
        limit: u64,
        #[command(flatten)]
        output: JsonArgs,
    },
    /// Show one dead letter with its headers and payload, as JSON.
    Show {
        #[command(flatten)]
        source: SourceArgs,
        /// The dead letter's id, as `dead-letters list` shows it.
        #[arg(long = "id", env = "OUTBOX_ID")]
        id: String,
    },
    /// Republish dead letters to where they were first published (each removed from the dead-letter
    /// destination only once the broker confirmed its republish); prints how many.
    Replay {
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        filter: SelectionArgs,
    },
    /// Delete dead letters for good; prints how many.
    Discard {
        #[command(flatten)]
        source: SourceArgs,
        #[command(flatten)]
        filter: SelectionArgs,
    },
    /// Count dead letters per consumer.
    Count {
        #[command(flatten)]
        source: SourceArgs,
        /// Consumers to report even with no dead letter (repeat, or comma-separate).
        #[arg(long = "consumer", env = "OUTBOX_CONSUMER", value_delimiter = ',', value_name = "CONSUMER")]
        consumers: Vec<String>,
        #[command(flatten)]
        output: JsonArgs,
    },
}

impl DeadLettersCommand {
    /// The broker URL the command was given.
    pub fn broker(&self) -> &str {
        &self.source().broker
    }

    fn source(&self) -> &SourceArgs {
        match self {
            DeadLettersCommand::List { source, .. }
            | DeadLettersCommand::Show { source, .. }
            | DeadLettersCommand::Replay { source, .. }
            | DeadLettersCommand::Discard { source, .. }
            | DeadLettersCommand::Count { source, .. } => source,
        }
    }
}

/// Where the dead letters are: the broker, and what the consumer reads (its dead-letter destination is
/// named after it, as the consumer's transport names it).
#[derive(Args)]
pub struct SourceArgs {
    /// The broker: nats://, kafka://, amqp:// (RabbitMQ) or redis:// (never printed with its password).
    #[arg(long, env = "OUTBOX_BROKER", hide_env_values = true)]
    pub broker: String,
    #[command(flatten)]
    pub place: PlaceArgs,
}

/// What the consumer reads at its broker, which names its dead-letter destination. Every field is
/// optional here; [`open`] says which one a broker needs.
#[derive(Args)]
#[command(next_help_heading = "Where the consumer dead letters are")]
pub struct PlaceArgs {
    /// The consumer group whose dead letters to manage: the NATS durable (dead letters on
    /// `outbox.dead.<stream>.<group>`), the Kafka group (replays commit as `<group>.replay`), the Redis
    /// consumer group. Not used for RabbitMQ.
    #[arg(long, env = "OUTBOX_GROUP", requires = "broker")]
    group: Option<String>,
    /// NATS: the JetStream stream consumed (dead letters in `<stream>_DEAD`); Redis: the stream consumed
    /// (dead letters in `<stream>:dead`).
    #[arg(long, env = "OUTBOX_STREAM", requires = "broker")]
    stream: Option<String>,
    /// Kafka: the topics consumed (dead letters in `<topic>.dlq`), repeat or comma-separate.
    #[arg(long = "topic", env = "OUTBOX_TOPIC", value_delimiter = ',', value_name = "TOPIC", requires = "broker")]
    topics: Vec<String>,
    /// RabbitMQ: the queue consumed (dead letters in `<queue>.dead`).
    #[arg(long, env = "OUTBOX_QUEUE", requires = "broker")]
    queue: Option<String>,
    /// NATS, Redis: the dead-letter stream, when the consumer was configured with another one.
    #[arg(long, env = "OUTBOX_DEAD_LETTER_STREAM", requires = "broker")]
    dead_letter_stream: Option<String>,
    /// NATS: the dead-letter subject, when the consumer was configured with another one (needs
    /// --dead-letter-stream).
    #[arg(long, env = "OUTBOX_DEAD_LETTER_SUBJECT", requires_all = ["broker", "dead_letter_stream"])]
    dead_letter_subject: Option<String>,
    /// RabbitMQ: the dead-letter queue, when the consumer was configured with another one.
    #[arg(long, env = "OUTBOX_DEAD_LETTER_QUEUE", requires = "broker")]
    dead_letter_queue: Option<String>,
    /// Kafka: the dead-letter topic suffix, when the consumer was configured with another one.
    #[arg(long, env = "OUTBOX_DEAD_LETTER_SUFFIX", requires = "broker")]
    dead_letter_suffix: Option<String>,
}

/// `id` when it has the shape of a dead-letter id of `kind`, otherwise a refusal saying the shape.
fn check_id(kind: BrokerKind, id: &str) -> Result<String, CliError> {
    let id = id.trim();
    let (ok, shape) = match kind {
        BrokerKind::Nats => (id.parse::<u64>().is_ok_and(|n| n > 0), "a dead-letter stream sequence, e.g. 17"),
        BrokerKind::Redis => (
            id.split_once('-').is_some_and(|(ms, seq)| ms.parse::<u64>().is_ok() && seq.parse::<u64>().is_ok()),
            "a stream entry id, e.g. 1733140000000-0",
        ),
        BrokerKind::Kafka => (
            id.rsplit_once('/').and_then(|(rest, offset)| Some((rest.rsplit_once('/')?, offset))).is_some_and(
                |((topic, partition), offset)| {
                    !topic.is_empty() && partition.parse::<i32>().is_ok() && offset.parse::<i64>().is_ok()
                },
            ),
            "topic/partition/offset, e.g. orders.dlq/0/42",
        ),
        BrokerKind::RabbitMq => (
            id.len() == 17 && id.starts_with('r') && id[1..].bytes().all(|b| b.is_ascii_hexdigit()),
            "`r` and 16 hex digits, as listed",
        ),
    };
    if ok {
        Ok(id.to_owned())
    } else {
        Err(CliError::Refused(format!("{:?} is not a {} dead-letter id ({shape})", one_line(id), kind.name())))
    }
}

/// The transport of any of the four brokers, for its dead letters.
pub enum AnyTransport {
    Nats(Box<NatsTransport>),
    Kafka(Box<KafkaTransport>),
    Rabbit(Box<RabbitTransport>),
    Redis(Box<RedisTransport>),
}

impl DeadLetters for AnyTransport {
    fn dead_letter_broker(&self) -> &'static str {
        match self {
            AnyTransport::Nats(t) => t.dead_letter_broker(),
            AnyTransport::Kafka(t) => t.dead_letter_broker(),
            AnyTransport::Rabbit(t) => t.dead_letter_broker(),
            AnyTransport::Redis(t) => t.dead_letter_broker(),
        }
    }

    fn dead_letter_location(&self) -> String {
        match self {
            AnyTransport::Nats(t) => t.dead_letter_location(),
            AnyTransport::Kafka(t) => t.dead_letter_location(),
            AnyTransport::Rabbit(t) => t.dead_letter_location(),
            AnyTransport::Redis(t) => t.dead_letter_location(),
        }
    }

    async fn dead_letters(
        &self,
        filter: &DeadFilter,
        action: DeadLetterAction,
        max: usize,
    ) -> outbox_seaorm::Result<DeadLetterOutcome> {
        match self {
            AnyTransport::Nats(t) => t.dead_letters(filter, action, max).await,
            AnyTransport::Kafka(t) => t.dead_letters(filter, action, max).await,
            AnyTransport::Rabbit(t) => t.dead_letters(filter, action, max).await,
            AnyTransport::Redis(t) => t.dead_letters(filter, action, max).await,
        }
    }

    async fn consumer_lag(&self) -> outbox_seaorm::Result<Option<Lag>> {
        match self {
            AnyTransport::Nats(t) => t.consumer_lag().await,
            AnyTransport::Kafka(t) => t.consumer_lag().await,
            AnyTransport::Rabbit(t) => t.consumer_lag().await,
            AnyTransport::Redis(t) => t.consumer_lag().await,
        }
    }
}

fn required<'a>(value: &'a Option<String>, flag: &str, kind: BrokerKind, what: &str) -> Result<&'a str, CliError> {
    value.as_deref().ok_or_else(|| CliError::Refused(format!("{} needs {flag} ({what})", kind.name())))
}

/// Opens the transport of `source` (the consumer's own, as it would open it), checking what it needs.
pub async fn open(broker: &str, source: &PlaceArgs, kind: BrokerKind) -> Result<AnyTransport, CliError> {
    Ok(match kind {
        BrokerKind::Nats => {
            let stream = required(&source.stream, "--stream", kind, "the JetStream stream consumed")?;
            let group = required(&source.group, "--group", kind, "the durable consumer's name")?;
            let mut options = NatsTransportOptions::default();
            if let Some(dead_stream) = &source.dead_letter_stream {
                let default_subject = format!("outbox.dead.{stream}.{group}");
                let subject = source.dead_letter_subject.as_deref().unwrap_or(&default_subject);
                options = options.with_dead_letters(dead_stream, subject);
            }
            // A publisher only for its JetStream context: the durable must exist (a typo must not create
            // a consumer on the stream).
            let destination = Destination::parse("outbox.cli.unused")?;
            let jetstream = NatsPublisher::connect(broker, destination).await?.jetstream().clone();
            let found = match jetstream.get_stream(stream).await {
                Ok(handle) => handle.consumer_info(group).await.is_ok(),
                Err(error) => {
                    return Err(CliError::Refused(format!(
                        "NATS JetStream has no stream {:?}: {error}",
                        one_line(stream)
                    )));
                }
            };
            if !found {
                return Err(CliError::Refused(format!(
                    "stream {:?} has no durable consumer {:?}: check --group",
                    one_line(stream),
                    one_line(group)
                )));
            }
            AnyTransport::Nats(Box::new(NatsTransport::from_context(jetstream, stream, group, None, options).await?))
        }
        BrokerKind::Redis => {
            let stream = required(&source.stream, "--stream", kind, "the stream consumed")?;
            let group = required(&source.group, "--group", kind, "the consumer group")?;
            let mut config = RedisTransportConfig::default();
            if let Some(dead_stream) = &source.dead_letter_stream {
                config = config.with_dead_letter_stream(dead_stream);
            }
            let transport = RedisTransport::connect_with(broker, stream, group, "outbox-cli", config).await?;
            AnyTransport::Redis(Box::new(transport))
        }
        BrokerKind::RabbitMq => {
            let queue = required(&source.queue, "--queue", kind, "the queue consumed")?;
            let dead_queue = source.dead_letter_queue.clone().unwrap_or_else(|| format!("{queue}.dead"));
            let transport =
                RabbitTransport::connect_with_dead_letter_queue(broker, queue, "outbox-cli", &dead_queue).await?;
            AnyTransport::Rabbit(Box::new(transport))
        }
        BrokerKind::Kafka => {
            if source.topics.is_empty() {
                return Err(CliError::Refused("Kafka needs --topic (the topics consumed)".to_owned()));
            }
            let group = required(&source.group, "--group", kind, "the consumer group")?;
            // Assigned, not subscribed: the command must never join the consumer group (a member that
            // comes and goes would make the group rebalance). Its dead-letter walk reads only the topics'
            // dead-letter topics, as group `<group>.replay`.
            let assigned = source.topics.iter().map(|topic| (topic.clone(), 0)).collect();
            let mut transport = KafkaTransport::connect(broker, group, Subscription::Partitions(assigned), &[])?;
            if let Some(suffix) = &source.dead_letter_suffix {
                transport = transport.with_dead_letter_suffix(suffix)?;
            }
            AnyTransport::Kafka(Box::new(transport))
        }
    })
}

/// Runs one `dead-letters` command.
pub async fn run(command: DeadLettersCommand) -> Result<(), CliError> {
    let source = command.source();
    let kind = BrokerKind::from_url(&source.broker)?;
    // Bad input is refused before anything connects.
    let filter = match &command {
        DeadLettersCommand::List { filter, .. } => Some(filter.filter(|id| check_id(kind, id))?),
        DeadLettersCommand::Replay { filter, .. } => {
            Some(filter.selective("dead-letters replay", |id| check_id(kind, id))?)
        }
        DeadLettersCommand::Discard { filter, .. } => {
            Some(filter.selective("dead-letters discard", |id| check_id(kind, id))?)
        }
        DeadLettersCommand::Show { id, .. } => Some(DeadFilter::default().id(check_id(kind, id)?)),
        DeadLettersCommand::Count { .. } => None,
    };
    let filter = filter.unwrap_or_default();
    let transport = open(&source.broker, &source.place, kind).await?;
    match command {
        DeadLettersCommand::List { limit, output, .. } => {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let letters = transport.list_dead_letters(&filter, limit).await?;
            if output.json {
                println!("{}", serde_json::to_string_pretty(&letters)?);
                return Ok(());
            }
            for letter in &letters {
                print_letter(letter);
            }
            println!(
                "{} dead letter(s) listed (at most {limit}) from {}",
                letters.len(),
                transport.dead_letter_location()
            );
        }
        DeadLettersCommand::Show { id, .. } => match transport.show_dead_letter(&id).await? {
            Some(letter) => println!("{}", serde_json::to_string_pretty(&letter)?),
            None => {
                return Err(CliError::Refused(format!(
                    "no dead letter has id {} in {}",
                    one_line(&id),
                    transport.dead_letter_location()
                )));
            }
        },
        DeadLettersCommand::Replay { .. } => {
            let outcome = transport.dead_letters(&filter, DeadLetterAction::Replay, usize::MAX).await?;
            println!("replayed {} dead letter(s)", outcome.letters.len());
            if outcome.kept > 0 {
                println!("kept {} dead letter(s) that cannot be replayed (no valid origin; see the log)", outcome.kept);
            }
        }
        DeadLettersCommand::Discard { .. } => {
            let discarded = transport.discard_dead_letters(&filter).await?;
            println!("discarded {discarded} dead letter(s)");
        }
        DeadLettersCommand::Count { consumers, output, .. } => {
            let counts = transport.count_dead_letters(&consumers).await?;
            if output.json {
                println!("{}", serde_json::to_string_pretty(&counts)?);
                return Ok(());
            }
            for (consumer, count) in &counts {
                println!("{consumer:<32} {count:>9}");
            }
            println!("{} dead letter(s) in {}", counts.values().sum::<u64>(), transport.dead_letter_location());
        }
    }
    Ok(())
}

fn print_letter(letter: &DeadLetterEntry) {
    let dash = |value: &Option<String>| value.as_deref().map_or_else(|| "-".to_owned(), one_line);
    println!(
        "{}  {}  {}/{}  consumer {}  attempts {}  died {}  {}",
        letter.id,
        dash(&letter.event_type),
        dash(&letter.aggregate_type),
        dash(&letter.aggregate_id),
        dash(&letter.consumer),
        letter.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string()),
        dash(&letter.dead_at),
        dash(&letter.reason),
    );
}

//! Kafka adapter (feature `kafka`, [`rdkafka`] over a vendored librdkafka): a [`KafkaPublisher`] (an
//! idempotent producer) and a [`KafkaTransport`] that the [`Consumer`](crate::Consumer) driver consumes a
//! [`Subscription`] through, with dead letters in `<topic>.dlq` topics.
//!
//! **Publishing.** [`KafkaPublisher`]: `enable.idempotence=true`, `acks=all`. Each event is a record keyed
//! by its aggregate id, so the events of one aggregate land in one partition in order; the topic comes
//! from a [`Destination`](crate::Destination) template (default [`DEFAULT_TOPIC_TEMPLATE`]); the headers
//! carry the [`envelope_headers`](crate::broker::envelope_headers). An event is reported published only
//! once its delivery report says the broker acknowledged it. A topic name Kafka would refuse and a message
//! over `message.max.bytes` are permanent failures; everything else is retried by the relay.
//!
//! **Consuming.** [`KafkaTransport`] implements [`Transport`](crate::Transport) with
//! `enable.auto.commit=false`:
//!
//! | driver call | on Kafka |
//! |---|---|
//! | `fetch(max, wait)` | waits up to `wait` for the first message, then drains what librdkafka has ready, up to `max` |
//! | `ack` | marks the offset done; only the **contiguous** done prefix of each partition is committed (the lowest offset handed out and not acked yet, or one past the highest when all are acked; an ack of offset 7 while 5 is held commits nothing past 5), by a commit that runs beside the driver, one at a time, at most every [`DEFAULT_COMMIT_INTERVAL`] (see [`KafkaTransport::with_commit_interval`]); an ack never waits for the broker |
//! | `flush` (shutdown) | a last commit of the acked prefix, waiting at most [`DEFAULT_COMMIT_TIMEOUT`] ([`KafkaTransport::with_commit_timeout`]) |
//! | `release` | leaves the offset uncommitted: the message is delivered again after a restart or a rebalance, from the last commit (with the acked messages after it, which the inbox absorbs); not within this session |
//! | `dead_letter` | produces the original key, payload and headers plus the dead-letter headers to `<origin topic>.dlq` ([`DEFAULT_DEAD_LETTER_SUFFIX`], see [`KafkaTransport::with_dead_letter_suffix`]) and awaits the delivery report (`acks=all`); the topic is created at first use (admin client, as many partitions as the origin topic, the broker's default replication), since brokers may not auto-create topics |
//! | `Delivery::deliveries` | always 1: Kafka does not count deliveries, so after a restart the driver's count towards `max_deliveries` starts again |
//! | `Delivery::origin` | the topic the message was read from |
//!
//! `replay_dead_letters` ([`DeadLetters`](crate::consume::DeadLetters)) reads the dead-letter topics as consumer group
//! `<group>.replay` ([`REPLAY_GROUP_SUFFIX`]), produces each letter back to its origin topic with the
//! original key and headers, and commits the replay group past it after the delivery report.
//!
//! **Commits.** A commit that fails or goes unanswered (a hung group coordinator) holds up nothing: the
//! driver goes on consuming and acking, [`KafkaTransport::commit_stats`] counts it (unanswered after the
//! commit timeout; failed once librdkafka gives up on it, after `socket.timeout.ms`), and the next commit
//! carries its offsets and the later ones. What a crash leaves uncommitted (at
//! most about one commit interval of acks, or more while the coordinator hangs) is delivered again and
//! absorbed by the inbox. When partitions are revoked, their acked prefix is committed first.
//!
//! **Order under retries.** The publisher keys records by aggregate id, so one aggregate is one partition,
//! in order. The driver holds a message waiting for a retry, and the later messages of its aggregate
//! behind it, in memory; librdkafka keeps fetching (no per-message deadline exists in Kafka, so nothing
//! needs a keep-alive, but the consumer must keep polling: the driver's fetches do that, and
//! `max.poll.interval.ms`, 5 minutes by default, only bounds the time between two fetches). Commits never
//! pass a held message, so no ack of a later message implies an earlier one. What holds and what does not:
//! - *One member per partition* (the group protocol assigns each partition to one member): order per
//!   aggregate holds for first applications, including across restarts (redelivery starts at the last
//!   commit, in partition order; the inbox absorbs what was applied already).
//! - *Rebalance.* When a partition is revoked, its progress is dropped: acks of messages fetched before
//!   fail (counted as ack failures), nothing more is committed for it by this member, and its new owner
//!   starts at the last commit. Messages this member still holds may be applied by it **while** the new
//!   owner applies later ones: during a rebalance two members can briefly work on one aggregate, so order
//!   holds only after the old member settled what it held (use the cooperative-sticky assignor and a
//!   short shutdown to keep this window small). [`Subscription::Partitions`] never rebalances.
//! - *Held messages and restarts.* A message held for a long time (a newer schema version waiting for the
//!   upgrade) holds the commit point of its partition: after a restart everything after it in that
//!   partition is delivered again (the inbox absorbs the copies).
//! - *Dead letters and replay.* A dead letter leaves the order of its aggregate (later messages go on); a
//!   replayed message is produced at the end of its origin topic's partition.
//!
//! ```no_run
//! # async fn demo() -> outbox_runtime::Result<()> {
//! use outbox_runtime::brokers::kafka::{KafkaPublisher, KafkaTransport, Subscription, default_destination};
//! use outbox_runtime::consume::DeadLetters as _;
//! use outbox_runtime::{CancellationToken, Consumer};
//!
//! let publisher = KafkaPublisher::connect("kafka://127.0.0.1:9092", default_destination(), &[])?;
//! let transport = KafkaTransport::connect(
//!     "kafka://127.0.0.1:9092",
//!     "billing",
//!     Subscription::Topics(vec!["order.events".into()]),
//!     &[],
//! )?; // dead letters: order.events.dlq
//! let consumer = Consumer::new("billing"); // .on::<OrderPlaced>(handler)...
//! consumer.run(&transport, CancellationToken::new()).await?;
//! transport.replay_dead_letters(100).await?; // after the fix
//! # Ok(()) }
//! ```

/// The `rdkafka` crate this adapter is built on, for [`ClientConfig`](rdkafka::ClientConfig), the admin
/// client and the mock cluster.
pub use rdkafka;

mod commits;
mod config;
mod publisher;
mod replay;
mod transport;

pub use commits::KafkaCommitStats;
pub use config::{
    DEFAULT_DEAD_LETTER_SUFFIX, DEFAULT_MESSAGE_TIMEOUT_MS, DEFAULT_TOPIC_TEMPLATE, MAX_TOPIC_LEN, REPLAY_GROUP_SUFFIX,
    Subscription, bootstrap_servers, default_destination, validate_topic,
};
pub use publisher::KafkaPublisher;
pub use transport::{DEFAULT_COMMIT_INTERVAL, DEFAULT_COMMIT_TIMEOUT, KafkaReceipt, KafkaTransport};

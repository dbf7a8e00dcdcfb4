//! NATS JetStream adapter (feature `nats`): [`NatsPublisher`] publishes each event to a subject rendered
//! from a [`Destination`](crate::Destination) template and reports success only after the stream's
//! `PubAck`; [`NatsTransport`] is a durable pull consumer that the one consume driver,
//! [`Consumer::run`](crate::Consumer::run), reads through.
//!
//! ```no_run
//! # async fn demo() -> outbox_runtime::Result<()> {
//! use outbox_runtime::brokers::nats::{NatsPublisher, NatsTransport};
//! use outbox_runtime::consume::DeadLetters as _;
//! use outbox_runtime::{CancellationToken, Consumer, Destination};
//!
//! let publisher =
//!     NatsPublisher::connect("nats://127.0.0.1:4222", Destination::parse("events.{aggregate_type}.{event_type}")?)
//!         .await?;
//! publisher.ensure_stream("EVENTS", &["events.>"]).await?;
//!
//! // Dead letters go to subject `outbox.dead.EVENTS.billing` in stream `EVENTS_DEAD`, created if missing.
//! let transport = NatsTransport::connect("nats://127.0.0.1:4222", "EVENTS", "billing", None).await?;
//! let consumer = Consumer::new("billing"); // .on::<OrderPlaced>(handler) ...
//! consumer.run(&transport, CancellationToken::new()).await?;
//! // After a fix: move the dead letters back to where they came from.
//! transport.replay_dead_letters(1_000).await?;
//! # Ok(()) }
//! ```
//!
//! # Publishing
//!
//! - **Dedup at the broker.** Every message carries `Nats-Msg-Id: <event id>`. A republish within the
//!   stream's `duplicate_window` (lost ack, relay crash between publish and mark) is acked with
//!   `duplicate: true` and not stored again; [`NatsPublisher::ensure_stream`] sets the window to
//!   [`DEFAULT_DUPLICATE_WINDOW`]. After the window, a republish is stored again and the consumer's inbox
//!   drops it.
//! - **Envelope.** All [`envelope_headers`](crate::broker::envelope_headers) travel as NATS headers
//!   (CloudEvents binary mode), the payload is the event's JSON as stored.
//! - **Pipelined publishing.** A batch is sent in full (in rounds of [`DEFAULT_MAX_IN_FLIGHT`]), then all
//!   acks are awaited together; the relay never puts two events of one aggregate in one batch, so this
//!   keeps per-aggregate order.
//! - **Permanent failures.** A rendered subject that is not a valid NATS publish subject (empty, whitespace,
//!   empty token, wildcard), a header that NATS cannot carry, or a message larger than the server's
//!   `max_payload` (or the stream's `max_msg_size`) fails with
//!   [`PublishError::permanent`](crate::PublishError::permanent): the row is dead at once with the reason
//!   as `last_error`. Anything else (server unreachable, ack timeout, no stream for the subject) is
//!   transient.
//!
//! # Consuming: what each [`Transport`](crate::Transport) method does
//!
//! | method | on the broker |
//! |---|---|
//! | `fetch` | one pull request (`max` messages, expires after `wait`): the server answers at once with what is ready, or with the first message to arrive, or with nothing; [`Delivery::origin`](crate::consume::Delivery::origin) is the subject, `deliveries` the server's delivered count |
//! | `ack` | `+ACK` sent as a request: `Ok` only once the server confirmed it (double ack) |
//! | `release` | `-NAK`: redelivered at once, ahead of newer messages |
//! | `dead_letter` | publish to the dead-letter subject, `Ok` once the dead-letter stream's `PubAck` arrived |
//!
//! The durable consumer is created with explicit acks (an existing one with another ack policy is refused:
//! under `all`, acking a later message would ack earlier ones still waiting for a retry), from the
//! stream's first message, with [`NatsTransportOptions::ack_wait`] (default 30 s) and no server-side
//! delivery limit (the driver dead-letters after its own `max_deliveries`; a server limit would make a
//! message silently undeliverable instead).
//!
//! **Held messages stay alive.** Every message the transport handed out and that is not acked or released
//! yet (running, waiting for a retry, or queued behind an earlier message of its aggregate) gets a
//! progress ack about every third of `ack_wait` (never more than half of it apart), from a task of the
//! transport, so the server does not redeliver it while the driver holds it. If progress acks cannot reach the server for longer than
//! `ack_wait` (an outage), the server redelivers the messages; the copies queue behind the originals and
//! the inbox absorbs them.
//!
//! # Dead letters
//!
//! On by default: to subject `outbox.dead.<stream>.<durable>` in stream `<stream>_DEAD` (file storage,
//! dedup window [`DEFAULT_DUPLICATE_WINDOW`]), created at connect when missing, the subject added to an
//! existing dead-letter stream when it lacks it; both configurable with
//! [`NatsTransportOptions::with_dead_letters`]. An invalid name, or a dead-letter subject that the consumed
//! stream itself captures, is an [`Error::InvalidConfig`](crate::Error::InvalidConfig) at connect.
//!
//! A dead letter keeps the original payload and headers, plus the
//! [`DeadLetter::headers`](crate::consume::DeadLetter::headers) (`outbox_dead_reason`, `_attempts`,
//! `_consumer`, `_origin`, `_at`). JetStream control headers of the original (`Nats-Msg-Id`...) are kept
//! renamed `outbox_dead_Nats-Msg-Id`, so the original id cannot make the dead-letter stream drop a second
//! dead letter of the same event; the dead letter's own `Nats-Msg-Id` is
//! `outbox-dead:<stream>:<durable>:<stream sequence>`, so a dead-letter publish retried after a lost
//! `PubAck` is stored once. A reason too long to fit the server's `max_payload` next to the payload is
//! shortened; a message that cannot fit even then stays unacked (the driver retries, logging each time).
//!
//! `replay_dead_letters` ([`DeadLetters`](crate::consume::DeadLetters)) moves dead letters back (see there).
//!
//! # Order per aggregate
//!
//! What holds, with **one consumer process per durable**:
//! - Events of one aggregate are first applied in stream order, through handler failures and retries:
//!   the driver retries a message in place and holds the later messages of its aggregate in memory (kept
//!   alive, see above), and acks are per message (explicit), so an ack never covers an earlier message.
//! - Across a shutdown: released messages are nak'ed in order and redelivered first.
//! - Across a lost connection or a restart after a crash: messages delivered but never received (lost in
//!   flight) or left unacknowledged by the previous process come back only after `ack_wait`, and then
//!   ahead of newer messages. With [`NatsTransportOptions::wait_for_lost_deliveries`] (default on), the
//!   transport compares the server's unacknowledged count with what it holds, at start and after every
//!   reconnect or failed fetch; while the server has more, it hands out only redeliveries and keeps new
//!   messages back (kept alive) until the missing ones are back or `ack_wait` has passed. After a clean
//!   shutdown (messages released) this costs nothing; after a crash or an outage it costs up to
//!   `ack_wait` (acks that failed during an outage count too: those messages come back as duplicates).
//!
//! What does not hold:
//! - **Several processes on one durable** share its messages without regard to aggregates: two events
//!   of one aggregate can be applied concurrently or out of order. Use one process per durable (or
//!   partition by subject, one durable per partition) when order matters.
//! - A held message whose progress acks failed for longer than `ack_wait` is redelivered; to this
//!   process it queues behind the original (fine), but it could go to another process of the durable.
//! - A replayed dead letter is a new message at the end of the stream, after later events of its
//!   aggregate.
//!
//! Written against async-nats 0.51 and checked with nats-server 2.9: only stream and consumer fields that
//! server accepts are set.

mod config;
mod headers;
mod publisher;
mod recovery;
mod replay;
mod transport;

/// The NATS client this adapter is built on, for options and stream management beyond the adapter's API.
pub use async_nats;
pub use config::{
    DEAD_STREAM_SUFFIX, DEAD_SUBJECT_PREFIX, DEFAULT_ACK_TIMEOUT, DEFAULT_DUPLICATE_WINDOW, DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_SUBJECT_TEMPLATE, MAX_NAME_LEN, NatsTransportOptions,
};
pub use publisher::NatsPublisher;
pub use transport::{NatsReceipt, NatsTransport};

const BROKER: &str = "NATS JetStream";

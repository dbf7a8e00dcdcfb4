//! RabbitMQ adapter (feature `rabbitmq`, [lapin]): a [`RabbitPublisher`] with publisher confirms and
//! mandatory routing, and a [`RabbitTransport`] that the [`Consumer`](crate::Consumer) driver consumes
//! one queue through, with dead letters in a queue of their own.
//!
//! **Publishing.** Every event becomes one persistent message (`delivery_mode` 2) on one exchange, with the
//! routing key rendered from a [`Destination`](crate::Destination) template (default
//! [`DEFAULT_ROUTING_KEY`]), the event id as `message_id`, `content_type` `application/json` and the
//! [`envelope_headers`](crate::broker::envelope_headers) as AMQP headers (long strings). A batch is sent in
//! one go on a confirm channel, then every confirm is awaited: an event is `Ok` only once RabbitMQ acked
//! it. Messages are `mandatory`: a message no queue is bound for is still acked by RabbitMQ, but it comes
//! back as a *return* first, so the adapter checks returns, not only acks, and reports such an event as a
//! transient failure (`unroutable: ...`): the row stays pending and is retried after its backoff. A routing
//! key over [`MAX_ROUTING_KEY_LEN`] bytes or a payload over the configured maximum is a permanent failure.
//! RabbitMQ has no publish-side dedup: a message published twice (lost confirm) is delivered twice and the
//! consumer's inbox drops the duplicate.
//!
//! **Consuming.** [`RabbitTransport`] implements [`Transport`](crate::Transport) over one queue:
//!
//! | driver call | on RabbitMQ |
//! |---|---|
//! | `fetch(max, wait)` | up to `max` deliveries of a `basic.consume` stream (manual acks, prefetch [`DEFAULT_PREFETCH`]): waits up to `wait` for the first, then takes what is already there |
//! | `ack` | `basic.ack` of that delivery tag only (never `multiple`) |
//! | `release` | `basic.nack` with `requeue = true` |
//! | `dead_letter` | publishes the payload, original properties and headers plus the dead-letter headers to the durable dead-letter queue (default `<queue>.dead`, declared at connect) through the default exchange, mandatory, and awaits the publisher confirm; a nack, a return or a timeout is an `Err` |
//! | `Delivery::deliveries` | `x-delivery-count` + 1 when the header is there (quorum queues count earlier returned deliveries), else 2 when `redelivered`, else 1 |
//! | `Delivery::origin` | the exchange and routing key the message was published with, as `<exchange>/<routing key>` ([`encode_origin`]; the default exchange is empty: `/billing`) |
//!
//! `replay_dead_letters` ([`DeadLetters`](crate::consume::DeadLetters)) moves dead letters back: `basic.get` from the dead-letter
//! queue, republish to the origin exchange and routing key with a confirm, then ack the dead letter.
//!
//! **Order under retries.** With one consumer on a queue, RabbitMQ delivers in queue order and the driver
//! keeps the order per aggregate: a message waiting for a retry stays unacked in the driver, and every
//! later message of its aggregate waits in memory behind it (also unacked). An ack is for one delivery tag
//! only, so acking a later message never acks an earlier one. What holds and what does not:
//! - *Prefetch.* RabbitMQ sends at most `prefetch` unacked messages. Keep it at least
//!   [`ConsumerConfig::max_in_flight`](crate::ConsumerConfig::max_in_flight) (both default to 512): with a
//!   smaller window, messages held behind one retrying aggregate can fill it, and other aggregates wait
//!   until the retry settles (order still holds; throughput does not).
//! - *Deadline.* RabbitMQ closes the channel of a delivery left unacked longer than its `consumer_timeout`
//!   (30 minutes by default; a broker setting, per queue with `x-consumer-timeout` on 3.12+), and requeues
//!   every unacked delivery of that channel. There is no per-message keep-alive in AMQP 0-9-1, so a message
//!   the driver holds that long (a newer schema version waiting for the upgrade, a long backoff) comes back
//!   from the queue; the transport opens a new session at the next fetch, the old receipts' acks fail, the
//!   inbox absorbs what was applied already, and order still holds because the requeued messages come back
//!   in their queue order. Raise `consumer_timeout` if messages must wait longer without redelivery.
//! - *Connection loss.* Every unacked delivery of the session is requeued (in queue order) and delivered
//!   again with `redelivered`; messages applied whose ack was lost are absorbed by the inbox.
//! - *Several consumers on one queue* (several processes, or several transports): RabbitMQ round-robins
//!   the messages between them, so two consumers can work on one aggregate at once and **per-aggregate order
//!   does not hold**. Use one consumer per queue (e.g. the queue argument `x-single-active-consumer`), or
//!   shard aggregates over queues with a consistent-hash exchange.
//! - *Dead letters and replay.* A dead letter leaves the order of its aggregate (later messages go on); a
//!   replayed message is published again at the end of the queue.
//!
//! ```no_run
//! # async fn demo() -> outbox_runtime::Result<()> {
//! use outbox_runtime::consume::DeadLetters as _;
//! use outbox_runtime::{CancellationToken, Consumer, Destination};
//! use outbox_runtime::brokers::rabbitmq::{DEFAULT_ROUTING_KEY, RabbitPublisher, RabbitTransport};
//! let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! let publisher = RabbitPublisher::connect(url, "events", Destination::parse(DEFAULT_ROUTING_KEY)?).await?;
//! publisher.declare_queue("events", "billing", "order.#").await?;
//! let transport = RabbitTransport::connect(url, "billing", "billing-1").await?; // dead letters: billing.dead
//! let consumer = Consumer::new("billing"); // .on::<OrderPlaced>(handler)...
//! consumer.run(&transport, CancellationToken::new()).await?;
//! transport.replay_dead_letters(100).await?; // after the fix
//! # Ok(()) }
//! ```

pub use lapin;

mod config;
mod publisher;
mod replay;
mod transport;

pub use config::{
    DEFAULT_DEAD_LETTER_SUFFIX, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PREFETCH, DEFAULT_ROUTING_KEY,
    DELIVERY_COUNT_HEADER, MAX_ROUTING_KEY_LEN, encode_origin, parse_origin,
};
pub use publisher::RabbitPublisher;
pub use transport::{RabbitReceipt, RabbitTransport};

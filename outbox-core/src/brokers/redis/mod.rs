//! Redis Streams adapter (feature `redis`): [`RedisPublisher`] appends each event to a stream with `XADD`;
//! [`RedisTransport`] is one consumer of a consumer group that the one consume driver,
//! [`Consumer::run`](crate::Consumer::run), reads through.
//!
//! ```no_run
//! # async fn demo() -> outbox_runtime::Result<()> {
//! use outbox_runtime::brokers::redis::{RedisPublisher, RedisTransport};
//! use outbox_runtime::consume::DeadLetters as _;
//! use outbox_runtime::{CancellationToken, Consumer, Destination};
//!
//! let publisher =
//!     RedisPublisher::connect("redis://127.0.0.1:6379", Destination::parse("outbox:{aggregate_type}")?).await?;
//! // ... Relay::new(store, publisher, RelayConfig::default())
//!
//! // Dead letters go to `outbox:order:dead`.
//! let transport = RedisTransport::connect("redis://127.0.0.1:6379", "outbox:order", "billing", "billing-1").await?;
//! let consumer = Consumer::new("billing"); // .on::<OrderPlaced>(handler) ...
//! consumer.run(&transport, CancellationToken::new()).await?;
//! // After a fix: move the dead letters back to where they came from.
//! transport.replay_dead_letters(1_000).await?;
//! # Ok(()) }
//! ```
//!
//! # Stream entries
//!
//! An event is one stream entry whose fields are the
//! [`envelope_headers`](crate::broker::envelope_headers) (CloudEvents names such as `ce_id`, `ce_type`,
//! `ce_subject`, then the event's own headers), followed by a [`PAYLOAD_FIELD`] field with the JSON
//! payload. The stream key comes from a [`Destination`](crate::Destination) template, by default
//! [`DEFAULT_STREAM_TEMPLATE`] (`outbox:{aggregate_type}`).
//!
//! # Publishing
//!
//! - The publisher pipelines a batch's `XADD`s in one round trip and reports each event on its own: `Ok`
//!   only for an entry Redis appended (and, with [`RedisPublisherConfig::min_replicas`], replicated).
//!   Redis has no server-side dedup: an event whose confirmation was lost is appended again, and the
//!   consumer's inbox drops the duplicate.
//! - **No new streams by default.** Redis creates a missing stream on `XADD`, so an event sent where no
//!   consumer group reads would count as published and never be read. The publisher appends only to
//!   streams that exist (`NOMKSTREAM`; a consumer's transport creates its stream with its group): an event
//!   for a missing stream stays pending and is retried, with a warning that names the stream and the
//!   template. [`RedisPublisherConfig::create_streams`] turns this off.
//! - **No trimming by default.** Redis 7.0 can trim a stream only by length or id, not "what every group
//!   acknowledged", so [`RedisPublisherConfig::max_len`] is off unless you opt in, and then it can delete
//!   entries no consumer group has read: lost events. See there.
//! - A dropped connection is re-established on the next command; the batch is a transient failure (the
//!   relay retries it after its backoff).
//!
//! # Consuming: what each [`Transport`](crate::Transport) method does
//!
//! | method | on the broker |
//! |---|---|
//! | `fetch` | first this consumer's own pending entries (`XREADGROUP ... 0`: at start, after a release or an error), then entries of the group idle past [`min_idle`](RedisTransportConfig::min_idle) (`XAUTOCLAIM`, every `reclaim_interval`), then new entries (`XREADGROUP ... >` with `BLOCK`, on a connection of its own); [`Delivery::origin`](crate::consume::Delivery::origin) is the stream, `deliveries` the group's delivery count (`XPENDING`; 1 for a new entry) |
//! | `ack` | `XACK` of that entry id alone |
//! | `release` | nothing: the entry stays pending in this consumer's name; it comes back on this transport's next fetch, when this consumer restarts (same consumer name), or to another consumer of the group after `min_idle` |
//! | `dead_letter` | `XADD` to the dead-letter stream, `Ok` once Redis answered with the new entry id |
//!
//! **Held entries stay alive.** Every entry the transport handed out and that is not acked or released
//! yet (running, waiting for a retry, or queued behind an earlier entry of its aggregate) has its idle time
//! reset about every third of `min_idle` (never more than half of it apart), by a task of the transport,
//! so no other consumer claims it while the driver holds it. An entry Redis delivered but whose reply was lost (connection cut) is in
//! this consumer's pending list: after any failed command the transport reads that list again before
//! anything new, so it is not skipped.
//!
//! Needs Redis 6.2 or later (`XAUTOCLAIM`); checked against 7.0.
//!
//! # Dead letters
//!
//! On by default, to `<stream>:dead` ([`RedisTransportConfig::with_dead_letter_stream`] to choose another
//! key; an empty or over-long key, the consumed stream itself, or a key holding something other than a
//! stream is an [`Error::InvalidConfig`](crate::Error::InvalidConfig) at connect). A dead letter is an
//! entry with the original fields (headers and [`PAYLOAD_FIELD`]), the
//! [`DeadLetter::headers`](crate::consume::DeadLetter::headers) (`outbox_dead_reason`, `_attempts`,
//! `_consumer`, `_origin`, `_at`) and [`dead_field::GROUP`] / [`dead_field::ENTRY_ID`]. An entry whose fields
//! are not UTF-8 (no outbox publisher writes one) cannot be handed to the driver as headers: the transport
//! dead-letters it itself, with its raw fields, and acks it once the `XADD` succeeded.
//!
//! `replay_dead_letters` ([`DeadLetters`](crate::consume::DeadLetters)) moves dead letters back (see there).
//!
//! # Order per aggregate
//!
//! What holds, with **one consumer per group** (the same consumer name across restarts):
//! - Entries of one aggregate are first applied in stream order, through handler failures and retries:
//!   the driver retries an entry in place and holds the later entries of its aggregate in memory (kept
//!   alive, see above), and `XACK` acknowledges exactly the ids given, never an earlier entry.
//! - Across a shutdown, a crash or a lost connection: the consumer's own pending entries (released,
//!   unacknowledged, or delivered with a lost reply) are read first, in id order, before any new entry.
//!
//! What does not hold:
//! - **Several consumers in one group** share its entries round-robin, without regard to aggregates: two
//!   events of one aggregate can be applied concurrently or out of order. Use one consumer per group (or
//!   one stream per partition of aggregates) when order matters.
//! - An entry of a consumer that died, claimed after `min_idle` by another consumer, is applied after
//!   the later entries that consumer read meanwhile. A restart under a *new* consumer name is such a case:
//!   keep the name stable.
//! - An entry held longer than `min_idle` without reaching Redis (an outage) can be claimed by another
//!   consumer of the group; both apply it, the inbox absorbs the second.
//! - A replayed dead letter is a new entry at the end of its stream, after later events of its aggregate.
//! - With [`RedisPublisherConfig::max_len`] on, entries can be trimmed before they are read (loss).

mod config;
mod entry;
mod link;
mod publisher;
mod replay;
mod transport;

/// The `redis` crate this adapter is built on, for raw commands (inspecting or trimming streams).
pub use ::redis;
pub use config::{
    DEAD_STREAM_SUFFIX, DEFAULT_MAX_ENTRY_PAYLOAD_BYTES, DEFAULT_STREAM_TEMPLATE, MAX_STREAM_KEY_LEN, PAYLOAD_FIELD,
    REDIS_MAX_VALUE_BYTES, RedisPublisherConfig, RedisTransportConfig, dead_field,
};
pub use publisher::RedisPublisher;
pub use transport::{RedisReceipt, RedisTransport};

const BROKER: &str = "Redis Streams";

#[cfg(test)]
mod tests {
    use super::link::open_client;
    use crate::error::Error;

    #[test]
    fn urls_of_other_brokers_and_malformed_urls_are_config_errors() {
        for url in ["nats://127.0.0.1:4222", "mqtt://h", "redis://", "127.0.0.1:6379", "redis://:1"] {
            let error = open_client(url).map(|_| ()).unwrap_err();
            assert!(matches!(error, Error::InvalidConfig { field: "broker_url", .. }), "{url}: {error}");
        }
        assert!(open_client("redis://127.0.0.1:6379/0").is_ok());
        let error = open_client("mqtt://user:secret@h").map(|_| ()).unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}

//! What a broker adapter provides to the consume driver: a small [`Transport`].

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use crate::error::Result;

/// One message as a broker delivered it, before the driver decodes it.
#[derive(Debug)]
pub struct Delivery<R> {
    /// The message headers (the envelope in CloudEvents binary mode, then the event's own headers).
    pub headers: BTreeMap<String, String>,
    /// The payload bytes (the event's JSON).
    pub payload: Vec<u8>,
    /// Where the message was published: a subject, routing key, topic or stream. A replayed dead letter
    /// goes back here.
    pub origin: String,
    /// How many times the broker has delivered this message, this delivery included (1 when the broker
    /// does not count). Added to the driver's own attempts, so a redelivery after a crash does not reset
    /// the count towards `max_deliveries`.
    pub deliveries: u32,
    /// What the transport needs to ack, release or dead-letter this message.
    pub receipt: R,
}

/// Why and how a message is dead-lettered, written to the dead-letter destination with the original
/// payload and headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// What went wrong: the handler's last error, or why the message cannot be decoded.
    pub reason: String,
    /// Deliveries the message had, the last one included.
    pub attempts: u32,
    /// The consumer that gave up on it.
    pub consumer: String,
    /// Where the message was published ([`Delivery::origin`]).
    pub origin: String,
}

/// Header names a dead letter carries next to the original headers.
pub mod dead_header {
    /// Why the message was dead-lettered.
    pub const REASON: &str = "outbox_dead_reason";
    /// Deliveries before it was dead-lettered.
    pub const ATTEMPTS: &str = "outbox_dead_attempts";
    /// The consumer that dead-lettered it.
    pub const CONSUMER: &str = "outbox_dead_consumer";
    /// Where it was published first; replay sends it back there.
    pub const ORIGIN: &str = "outbox_dead_origin";
    /// When it was dead-lettered, RFC 3339.
    pub const AT: &str = "outbox_dead_at";
    /// The prefix every dead-letter header shares, stripped on replay.
    pub const PREFIX: &str = "outbox_dead_";
}

/// Longest reason written to a dead letter (a handler error can be arbitrarily long).
pub const MAX_DEAD_REASON_LEN: usize = 2_048;

impl DeadLetter {
    /// The headers of the dead letter: `original` minus any earlier dead-letter headers, plus this
    /// letter's reason, attempts, consumer, origin and time.
    pub fn headers(&self, original: &BTreeMap<String, String>) -> Vec<(String, String)> {
        let mut headers: Vec<(String, String)> = original
            .iter()
            .filter(|(k, _)| !k.starts_with(dead_header::PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        headers.extend([
            (
                dead_header::REASON.to_owned(),
                crate::text::truncate(&crate::text::one_line(&self.reason), MAX_DEAD_REASON_LEN),
            ),
            (dead_header::ATTEMPTS.to_owned(), self.attempts.to_string()),
            (dead_header::CONSUMER.to_owned(), self.consumer.clone()),
            (dead_header::ORIGIN.to_owned(), self.origin.clone()),
            (dead_header::AT.to_owned(), chrono::Utc::now().to_rfc3339()),
        ]);
        headers
    }
}

/// A dead letter read back for replay: where it came from and the headers to republish it with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replayable {
    /// The original destination ([`dead_header::ORIGIN`]).
    pub origin: String,
    /// The original headers, dead-letter headers removed.
    pub headers: Vec<(String, String)>,
}

/// Splits a dead letter's headers into its origin and the original headers; `None` when the message
/// carries no origin (it was not written by a dead-lettering consumer).
pub fn replayable(headers: &BTreeMap<String, String>) -> Option<Replayable> {
    let origin = headers.get(dead_header::ORIGIN)?.clone();
    let headers = headers
        .iter()
        .filter(|(k, _)| !k.starts_with(dead_header::PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(Replayable { origin, headers })
}

/// How far a consumer is behind at its broker, as [`Transport::lag`] reads it. Each figure is `None` when
/// the broker does not say it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lag {
    /// Delivered to the consumer (group) and not acknowledged yet: Redis `XPENDING`, NATS `num_ack_pending`.
    pub unacked: Option<u64>,
    /// At the source and not delivered to the consumer yet: the group's Redis `lag`, NATS `num_pending`,
    /// RabbitMQ's ready messages, Kafka's high watermark minus the committed offset.
    pub undelivered: Option<u64>,
}

impl Lag {
    /// A reading.
    pub fn new(unacked: Option<u64>, undelivered: Option<u64>) -> Self {
        Lag { unacked, undelivered }
    }

    /// Every message the consumer has not acknowledged, delivered or not (the figures the broker gave).
    pub fn total(&self) -> u64 {
        self.unacked.unwrap_or(0).saturating_add(self.undelivered.unwrap_or(0))
    }
}

/// The broker side of a consumer: fetch, ack, release, dead-letter. The [`Consumer`](super::Consumer)
/// driver owns everything else (decoding, routing, retries, order, shutdown), identically for every broker.
///
/// Contract:
/// - [`ack`](Transport::ack) is called only after the message was applied (its transaction committed),
///   skipped as not this consumer's, or confirmed in the dead-letter destination.
/// - [`dead_letter`](Transport::dead_letter) returns `Ok` only once the broker confirmed the dead letter;
///   it does not ack the original (the driver acks it next).
/// - [`release`](Transport::release) hands a message back unprocessed (shutdown); it must come back
///   later, to this consumer or another.
pub trait Transport: Send + Sync {
    /// What identifies a delivered message to the broker (a delivery tag, an entry id, an offset...).
    type Receipt: Send + Sync + 'static;

    /// The broker's name for logs and errors, e.g. `NATS JetStream`.
    fn broker(&self) -> &'static str;

    /// What this transport reads, for logs: a stream, queue or topic list.
    fn source(&self) -> String;

    /// Up to `max` messages, waiting at most about `wait` when none is ready (an empty batch is fine).
    fn fetch(&self, max: usize, wait: Duration) -> impl Future<Output = Result<Vec<Delivery<Self::Receipt>>>> + Send;

    /// Acknowledges a message: the broker will not deliver it again.
    fn ack(&self, receipt: &Self::Receipt) -> impl Future<Output = Result<()>> + Send;

    /// Acknowledges the messages of a group, which the driver acks together after the group's commit: `Ok`
    /// once the broker has them all. The default acks each, all at once; a transport that can pipeline
    /// (NATS: every `+ACK` written, then one flush) does better. On `Err` the driver acks each message
    /// again alone, with retries (acking twice is harmless).
    fn ack_all(&self, receipts: &[&Self::Receipt]) -> impl Future<Output = Result<()>> + Send {
        async move {
            let acks = futures_util::future::join_all(receipts.iter().map(|receipt| self.ack(receipt))).await;
            acks.into_iter().collect()
        }
    }

    /// Hands a message back unprocessed, to be delivered again.
    fn release(&self, receipt: &Self::Receipt) -> impl Future<Output = Result<()>> + Send;

    /// Publishes `delivery` to the dead-letter destination with `letter`'s headers and waits for the
    /// broker's confirmation. Does not ack the original.
    fn dead_letter(
        &self,
        delivery: &Delivery<Self::Receipt>,
        letter: &DeadLetter,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Called once when the driver stops, after the last ack: makes durable the acks a transport batches
    /// (Kafka commits its acked offsets), waiting a bounded time so that shutdown stays bounded. An error is
    /// logged by the driver, not returned: what it could not make durable is delivered again (the inbox
    /// absorbs it). The default does nothing (each ack was final).
    fn flush(&self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// How far this consumer is behind at its broker, read now; `None` when the broker cannot say (the
    /// default). The running consumer samples it every
    /// [`ConsumerConfig::lag_interval`](super::ConsumerConfig::lag_interval) into the
    /// [`CONSUMER_LAG`](crate::metrics::CONSUMER_LAG) gauge; the dashboard shows it.
    fn lag(&self) -> impl Future<Output = Result<Option<Lag>>> + Send {
        async { Ok(None) }
    }
}

/// A shared transport is a transport: a consumer can read through an `Arc` that the dashboard or a health
/// check also holds.
impl<T: Transport> Transport for std::sync::Arc<T> {
    type Receipt = T::Receipt;

    fn broker(&self) -> &'static str {
        (**self).broker()
    }

    fn source(&self) -> String {
        (**self).source()
    }

    fn fetch(&self, max: usize, wait: Duration) -> impl Future<Output = Result<Vec<Delivery<Self::Receipt>>>> + Send {
        (**self).fetch(max, wait)
    }

    fn ack(&self, receipt: &Self::Receipt) -> impl Future<Output = Result<()>> + Send {
        (**self).ack(receipt)
    }

    fn ack_all(&self, receipts: &[&Self::Receipt]) -> impl Future<Output = Result<()>> + Send {
        (**self).ack_all(receipts)
    }

    fn release(&self, receipt: &Self::Receipt) -> impl Future<Output = Result<()>> + Send {
        (**self).release(receipt)
    }

    fn dead_letter(
        &self,
        delivery: &Delivery<Self::Receipt>,
        letter: &DeadLetter,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).dead_letter(delivery, letter)
    }

    fn flush(&self) -> impl Future<Output = Result<()>> + Send {
        (**self).flush()
    }

    fn lag(&self) -> impl Future<Output = Result<Option<Lag>>> + Send {
        (**self).lag()
    }
}

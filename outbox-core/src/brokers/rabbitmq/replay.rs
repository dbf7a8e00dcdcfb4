//! The dead letters of a queue: list, show, replay (back to where each was published) and discard them
//! ([`DeadLetters`]).

use std::collections::BTreeMap;

use lapin::options::{BasicAckOptions, BasicGetOptions};

use super::RabbitTransport;
use super::config::{BROKER, close_quietly, headers_of, parse_origin, short};
use super::transport::{carried_properties, rebuild_headers};
use crate::consume::{
    DeadFilter, DeadLetterAction, DeadLetterEntry, DeadLetterOutcome, DeadLetters, dead_header, replayable,
};
use crate::error::{Error, Result};
use crate::text::one_line;

impl RabbitTransport {
    async fn walk_on(
        &self,
        channel: &lapin::Channel,
        filter: &DeadFilter,
        action: DeadLetterAction,
        max: usize,
    ) -> Result<DeadLetterOutcome> {
        let queue = &self.dead_letter_queue;
        let now = chrono::Utc::now();
        let content = action == DeadLetterAction::Show;
        let mut outcome = DeadLetterOutcome::default();
        let mut selected = 0usize;
        while selected < max {
            let got = channel
                .basic_get(short(queue), BasicGetOptions { no_ack: false })
                .await
                .map_err(|e| Error::broker(BROKER, format!("read dead-letter queue {queue:?}"), e))?;
            let Some(got) = got else { break };
            let letter = got.delivery;
            let headers = with_broker_death(headers_of(&letter.properties));
            let id = letter_id(&headers, &letter.data);
            let entry = DeadLetterEntry::from_headers(id, &headers, &letter.data, content);
            if !filter.matches(&entry, now) {
                continue;
            }
            selected += 1;
            match action {
                DeadLetterAction::List | DeadLetterAction::Show => {}
                DeadLetterAction::Replay => {
                    if !self.republish(&letter, &headers).await? {
                        outcome.kept += 1;
                        continue;
                    }
                    self.remove(&letter, "replayed").await?;
                }
                DeadLetterAction::Discard => self.remove(&letter, "discarded").await?,
            }
            outcome.letters.push(entry);
        }
        if matches!(action, DeadLetterAction::Replay | DeadLetterAction::Discard) {
            tracing::info!(messaging.system = "rabbitmq", dead_letter_queue = %queue, done = outcome.letters.len(), kept = outcome.kept, ?action, "dead letters handled");
        }
        Ok(outcome)
    }

    /// Republishes `letter` to its origin with a confirm: `true` once confirmed, `false` when it has no
    /// readable origin or its origin routes nowhere now (it stays in the dead-letter queue).
    async fn republish(&self, letter: &lapin::message::Delivery, headers: &BTreeMap<String, String>) -> Result<bool> {
        let target = replayable(headers).and_then(|r| parse_origin(&r.origin).map(|o| (r.origin, o)));
        let Some((origin, (exchange, routing_key))) = target else {
            tracing::warn!(
                messaging.system = "rabbitmq",
                dead_letter_queue = %self.dead_letter_queue,
                origin = ?headers.get(dead_header::ORIGIN).map(|o| one_line(o)),
                "dead letter has no readable origin; it stays in the dead-letter queue"
            );
            return Ok(false);
        };
        let stripped = rebuild_headers(&letter.properties, |n| n.starts_with(dead_header::PREFIX), Vec::new());
        let properties = carried_properties(&letter.properties, stripped);
        match self.publish_confirmed(&exchange, &routing_key, &letter.data, properties).await {
            Ok(()) => Ok(true),
            Err(Error::Broker { source, .. }) if source.to_string().starts_with("unroutable") => {
                tracing::warn!(
                    messaging.system = "rabbitmq",
                    origin = %one_line(&origin),
                    error = %source,
                    "dead letter not replayed: its origin routes to no queue now; it stays in the dead-letter queue"
                );
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Acks `letter` in the dead-letter queue: it is gone.
    async fn remove(&self, letter: &lapin::message::Delivery, why: &str) -> Result<()> {
        let acked = letter.acker.ack(BasicAckOptions { multiple: false }).await;
        if matches!(acked, Ok(true)) {
            return Ok(());
        }
        let queue = &self.dead_letter_queue;
        let detail = if why == "replayed" {
            // Republished but still in the dead-letter queue: a later replay sends it again, and the
            // consumer's inbox absorbs the copy.
            format!("{acked:?}; it was republished and stays in the dead-letter queue too")
        } else {
            format!("{acked:?}; it stays in the dead-letter queue")
        };
        Err(Error::broker(BROKER, format!("remove a {why} dead letter from {queue:?}"), detail))
    }
}

/// A letter RabbitMQ dead-lettered itself (a quorum queue's `x-delivery-limit`, reached when the consumer
/// died during the last delivery; a TTL; a length limit) has no dead-letter headers of ours, but RabbitMQ's
/// `x-first-death-*` ones: they give its reason, and its origin is the queue it died in (through the
/// default exchange), so it is listed with a reason and replayed like the others.
fn with_broker_death(mut headers: BTreeMap<String, String>) -> BTreeMap<String, String> {
    if headers.contains_key(dead_header::ORIGIN) {
        return headers;
    }
    let Some(queue) = headers.get("x-first-death-queue").cloned() else { return headers };
    let reason = headers.get("x-first-death-reason").cloned().unwrap_or_else(|| "unknown".to_owned());
    headers.insert(dead_header::ORIGIN.to_owned(), super::encode_origin("", &queue));
    headers
        .insert(dead_header::REASON.to_owned(), format!("dead-lettered by RabbitMQ ({reason}) from queue {queue:?}"));
    headers
}

/// A RabbitMQ dead letter's id: its queue has no message ids, so a hash (64-bit FNV-1a) of its headers
/// (but the delivery count) and payload, stable while it waits (`r` and 16 hex digits).
fn letter_id(headers: &BTreeMap<String, String>, payload: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes.iter().copied().chain([0xff]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    // A quorum queue counts every walk that hands the letter back (`x-delivery-count`): not part of it.
    for (name, value) in headers.iter().filter(|(name, _)| *name != super::DELIVERY_COUNT_HEADER) {
        feed(name.as_bytes());
        feed(value.as_bytes());
    }
    feed(payload);
    format!("r{hash:016x}")
}

/// [`DeadLetters::replay_dead_letters`] moves up to `max` dead letters from the dead-letter queue back to the
/// exchange and routing key they were first published with ([`encode_origin`](super::encode_origin) in the
/// `outbox_dead_origin` header), with their original headers (dead-letter headers stripped) and properties. Each is
/// `basic.get` from the dead-letter queue, republished with a publisher confirm (mandatory), and acked in the
/// dead-letter queue only after that confirm; returns how many moved.
///
/// A dead letter without a readable origin, or whose origin no longer routes anywhere (RabbitMQ
/// returns it), stays in the dead-letter queue (logged). A broker failure is an `Err`; the letters
/// moved before it stay moved, the one in hand stays in the dead-letter queue.
impl DeadLetters for RabbitTransport {
    fn dead_letter_broker(&self) -> &'static str {
        BROKER
    }

    fn dead_letter_location(&self) -> String {
        format!("queue {:?}", self.dead_letter_queue)
    }

    /// The [`DeadLetters`] walk on a channel of its own: every letter is taken with `basic.get`; a replayed
    /// or discarded one is acked (a replayed one after its republish was confirmed), and closing the
    /// channel hands every other one back to the dead-letter queue, in its place. Letters held by a walk
    /// are invisible to another walk until it ends: two walks at once (two operators, a dashboard's count
    /// and a command) each miss what the other holds; nothing is lost, and a walk run again sees them.
    async fn dead_letters(
        &self,
        filter: &DeadFilter,
        action: DeadLetterAction,
        max: usize,
    ) -> Result<DeadLetterOutcome> {
        let channel = self.channel().await?;
        let result = self.walk_on(&channel, filter, action, max).await;
        // Letters left unacked on this channel (listed or kept ones) go back to the dead-letter queue.
        close_quietly(&channel).await;
        result
    }

    /// [`Transport::lag`](crate::consume::Transport::lag).
    async fn consumer_lag(&self) -> Result<Option<crate::consume::Lag>> {
        crate::consume::Transport::lag(self).await
    }
}

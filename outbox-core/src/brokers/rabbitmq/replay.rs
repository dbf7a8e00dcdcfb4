//! [`RabbitTransport::replay_dead_letters`]: dead letters back to where they were published.

use lapin::options::{BasicAckOptions, BasicGetOptions};

use super::RabbitTransport;
use super::config::{BROKER, close_quietly, exchange_label, headers_of, parse_origin, short};
use super::transport::{carried_properties, rebuild_headers};
use crate::consume::{dead_header, replayable};
use crate::error::{Error, Result};
use crate::text::one_line;

impl RabbitTransport {
    /// Moves up to `max` dead letters from the dead-letter queue back to the exchange and routing key they
    /// were first published with ([`encode_origin`](super::encode_origin) in the
    /// `outbox_dead_origin` header), with their original headers (dead-letter headers stripped) and
    /// properties. Each is `basic.get` from the dead-letter queue, republished with a publisher confirm
    /// (mandatory), and acked in the dead-letter queue only after that confirm; returns how many moved.
    ///
    /// A dead letter without a readable origin, or whose origin no longer routes anywhere (RabbitMQ
    /// returns it), stays in the dead-letter queue (logged). A broker failure is an `Err`; the letters
    /// moved before it stay moved, the one in hand stays in the dead-letter queue.
    pub async fn replay_dead_letters(&self, max: usize) -> Result<u64> {
        let channel = self.channel().await?;
        let result = self.replay_on(&channel, max).await;
        // Letters left unacked on this channel (kept ones) go back to the dead-letter queue.
        close_quietly(&channel).await;
        result
    }

    async fn replay_on(&self, channel: &lapin::Channel, max: usize) -> Result<u64> {
        let queue = &self.dead_letter_queue;
        let mut moved = 0u64;
        let mut kept = 0u64;
        while usize::try_from(moved).unwrap_or(usize::MAX) < max {
            let got = channel
                .basic_get(short(queue), BasicGetOptions { no_ack: false })
                .await
                .map_err(|e| Error::broker(BROKER, format!("read dead-letter queue {queue:?}"), e))?;
            let Some(got) = got else { break };
            let letter = got.delivery;
            let headers = headers_of(&letter.properties);
            let target = replayable(&headers).and_then(|r| parse_origin(&r.origin).map(|o| (r.origin, o)));
            let Some((origin, (exchange, routing_key))) = target else {
                kept += 1;
                tracing::warn!(
                    messaging.system = "rabbitmq",
                    dead_letter_queue = %queue,
                    origin = ?headers.get(dead_header::ORIGIN).map(|o| one_line(o)),
                    "dead letter has no readable origin; it stays in the dead-letter queue"
                );
                continue;
            };
            let stripped = rebuild_headers(&letter.properties, |n| n.starts_with(dead_header::PREFIX), Vec::new());
            let properties = carried_properties(&letter.properties, stripped);
            match self.publish_confirmed(&exchange, &routing_key, &letter.data, properties).await {
                Ok(()) => {}
                Err(Error::Broker { source, .. }) if source.to_string().starts_with("unroutable") => {
                    kept += 1;
                    tracing::warn!(
                        messaging.system = "rabbitmq",
                        origin = %one_line(&origin),
                        error = %source,
                        "dead letter not replayed: its origin routes to no queue now; it stays in the dead-letter queue"
                    );
                    continue;
                }
                Err(error) => return Err(error),
            }
            let acked = letter.acker.ack(BasicAckOptions { multiple: false }).await;
            if !matches!(acked, Ok(true)) {
                // Republished but still in the dead-letter queue: a later replay sends it again, and the
                // consumer's inbox absorbs the copy.
                return Err(Error::broker(
                    BROKER,
                    format!("remove a replayed dead letter from {queue:?}"),
                    format!(
                        "{acked:?}; it was republished to {} and stays in the dead-letter queue too",
                        exchange_label(&exchange)
                    ),
                ));
            }
            moved += 1;
        }
        tracing::info!(messaging.system = "rabbitmq", dead_letter_queue = %queue, moved, kept, "dead letters replayed");
        Ok(moved)
    }
}

impl crate::consume::ReplayDeadLetters for RabbitTransport {
    async fn replay_dead_letters(&self, max: usize) -> Result<u64> {
        RabbitTransport::replay_dead_letters(self, max).await
    }
}

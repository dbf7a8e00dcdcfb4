//! Moving dead letters back to the subject they were first published to.

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{RawMessageErrorKind, Stream};

use crate::consume::replayable;
use crate::error::{Error, Result};
use crate::text::one_line;

use super::BROKER;
use super::config::subject_problem;
use super::headers::{CONTROL_HEADER_PREFIX, header_map, headers_of};
use super::transport::NatsTransport;

impl NatsTransport {
    /// Moves up to `max` dead letters of this durable (those on [`dead_letter_subject`](Self::dead_letter_subject),
    /// oldest first) back to the subject each was first published to, with its original headers (the
    /// dead-letter headers stripped), and deletes each from the dead-letter stream only after the consumed
    /// stream acknowledged the republish. Returns how many moved.
    ///
    /// The republish carries a new `Nats-Msg-Id` (`outbox-replay:<dead stream>:<dead sequence>`), never
    /// the original one: within the stream's duplicate window the original id would make JetStream drop
    /// the republish silently. A replay retried after a lost acknowledgement is thus deduplicated, and an
    /// event applied already is absorbed by the inbox. A replayed message is a new message of the stream:
    /// every durable consumer of the stream receives it again (their inboxes absorb it), and it comes after
    /// later events of its aggregate.
    ///
    /// A message on the dead-letter subject without an `outbox_dead_origin` header, or whose origin is
    /// not a valid subject, is left in place with a warning. A failure stops the replay with an
    /// [`Error::Broker`]; what moved before it stays moved, and a dead letter is never deleted unless its
    /// republish was acknowledged.
    pub async fn replay_dead_letters(&self, max: usize) -> Result<u64> {
        let dead = self
            .jetstream
            .get_stream_no_info(&self.dead_stream)
            .await
            .map_err(|e| Error::broker(BROKER, format!("find dead-letter stream {:?}", self.dead_stream), e))?;
        let mut moved = 0u64;
        let mut next = 1u64;
        while usize::try_from(moved).unwrap_or(usize::MAX) < max {
            let Some((sequence, published)) = self.replay_next(&dead, next, moved).await? else { break };
            next = sequence + 1;
            if published {
                self.delete_dead(&dead, sequence, moved).await?;
                moved += 1;
            }
        }
        if moved > 0 {
            tracing::info!(messaging.system = "nats", stream = %self.stream, dead_letter_stream = %self.dead_stream, moved, "dead letters replayed");
        }
        Ok(moved)
    }

    /// Republishes the first dead letter at or after `from`: its sequence and whether it was moved
    /// (`false` when it is left in place), or `None` when there is none.
    async fn replay_next(&self, dead: &Stream<()>, from: u64, moved: u64) -> Result<Option<(u64, bool)>> {
        let timeout = self.options.request_timeout;
        let context = |what: &str| format!("{what} (after replaying {moved})");
        let read = tokio::time::timeout(timeout, dead.get_first_raw_message_by_subject(&self.dead_subject, from))
            .await
            .map_err(|_| Error::broker(BROKER, context("read a dead letter"), "timed out"))?;
        let letter = match read {
            Ok(letter) => letter,
            Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(error) => {
                return Err(Error::broker(
                    BROKER,
                    context(&format!("read dead letters of {:?} from {:?}", self.dead_subject, self.dead_stream)),
                    error,
                ));
            }
        };
        let sequence = letter.sequence;
        let headers = headers_of(Some(&letter.headers));
        let Some(replay) = replayable(&headers) else {
            tracing::warn!(dead_letter_stream = %self.dead_stream, sequence, "a message on the dead-letter subject has no origin header; left in place");
            return Ok(Some((sequence, false)));
        };
        if let Some(problem) = subject_problem(&replay.origin) {
            tracing::warn!(dead_letter_stream = %self.dead_stream, sequence, origin = %one_line(&replay.origin), problem, "a dead letter's origin is not a valid subject; left in place");
            return Ok(Some((sequence, false)));
        }
        let mut headers: Vec<(String, String)> =
            replay.headers.into_iter().filter(|(k, _)| !k.starts_with(CONTROL_HEADER_PREFIX)).collect();
        headers.push(("Nats-Msg-Id".to_owned(), format!("outbox-replay:{}:{sequence}", self.dead_stream)));
        let message = PublishMessage::build()
            .payload(letter.payload.clone())
            .headers(header_map(&headers)?)
            .expected_stream(&self.stream);
        let what = context(&format!(
            "republish dead letter {sequence} of {:?} to {:?} in stream {:?}",
            self.dead_stream, replay.origin, self.stream
        ));
        let publish = async {
            let ack = self
                .jetstream
                .send_publish(replay.origin.clone(), message)
                .await
                .map_err(|e| Error::broker(BROKER, what.clone(), e))?;
            ack.await.map_err(|e| Error::broker(BROKER, what.clone(), e))
        };
        tokio::time::timeout(timeout, publish)
            .await
            .map_err(|_| Error::broker(BROKER, what.clone(), "no PubAck in time"))??;
        Ok(Some((sequence, true)))
    }

    async fn delete_dead(&self, dead: &Stream<()>, sequence: u64, moved: u64) -> Result<()> {
        let what = format!(
            "delete replayed dead letter {sequence} from {:?} (after replaying {moved}; it is republished already, a second replay would send it again)",
            self.dead_stream
        );
        match tokio::time::timeout(self.options.request_timeout, dead.delete_message(sequence)).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(Error::broker(BROKER, what, "the server did not delete it")),
            Ok(Err(error)) => Err(Error::broker(BROKER, what, error)),
            Err(_) => Err(Error::broker(BROKER, what, "timed out")),
        }
    }
}

impl crate::consume::ReplayDeadLetters for NatsTransport {
    async fn replay_dead_letters(&self, max: usize) -> Result<u64> {
        NatsTransport::replay_dead_letters(self, max).await
    }
}

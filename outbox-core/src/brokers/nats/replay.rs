//! The dead letters of a durable: list, show, replay (back to the subject each was first published to)
//! and discard them ([`DeadLetters`]).

use async_nats::jetstream::message::PublishMessage;
use std::collections::BTreeMap;

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{RawMessageErrorKind, Stream};

use crate::consume::{DeadFilter, DeadLetterAction, DeadLetterEntry, DeadLetterOutcome, DeadLetters, replayable};
use crate::error::{Error, Result};
use crate::text::one_line;

use super::BROKER;
use super::config::subject_problem;
use super::headers::{CONTROL_HEADER_PREFIX, header_map, headers_of};
use super::transport::NatsTransport;

impl NatsTransport {
    /// The first message on the dead-letter subject at or after sequence `from`, or `None`.
    async fn read_dead(&self, dead: &Stream<()>, from: u64, done: usize) -> Result<Option<StreamMessage>> {
        let context = |what: &str| format!("{what} (after handling {done})");
        let read = tokio::time::timeout(
            self.options.request_timeout,
            dead.get_first_raw_message_by_subject(&self.dead_subject, from),
        )
        .await
        .map_err(|_| Error::broker(BROKER, context("read a dead letter"), "timed out"))?;
        match read {
            Ok(letter) => Ok(Some(letter)),
            Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(error) => Err(Error::broker(
                BROKER,
                context(&format!("read dead letters of {:?} from {:?}", self.dead_subject, self.dead_stream)),
                error,
            )),
        }
    }

    /// Republishes `letter` to its origin: `true` once the consumed stream acknowledged it, `false` when it
    /// cannot be replayed (no origin, or not a valid subject) and stays in place.
    async fn republish(&self, letter: &StreamMessage, headers: &BTreeMap<String, String>, done: usize) -> Result<bool> {
        let sequence = letter.sequence;
        let Some(replay) = replayable(headers) else {
            tracing::warn!(dead_letter_stream = %self.dead_stream, sequence, "a message on the dead-letter subject has no origin header; left in place");
            return Ok(false);
        };
        if let Some(problem) = subject_problem(&replay.origin) {
            tracing::warn!(dead_letter_stream = %self.dead_stream, sequence, origin = %one_line(&replay.origin), problem, "a dead letter's origin is not a valid subject; left in place");
            return Ok(false);
        }
        let mut headers: Vec<(String, String)> =
            replay.headers.into_iter().filter(|(k, _)| !k.starts_with(CONTROL_HEADER_PREFIX)).collect();
        headers.push(("Nats-Msg-Id".to_owned(), format!("outbox-replay:{}:{sequence}", self.dead_stream)));
        let message = PublishMessage::build()
            .payload(letter.payload.clone())
            .headers(header_map(&headers)?)
            .expected_stream(&self.stream);
        let what = format!(
            "republish dead letter {sequence} of {:?} to {:?} in stream {:?} (after handling {done})",
            self.dead_stream, replay.origin, self.stream
        );
        let publish = async {
            let ack = self
                .jetstream
                .send_publish(replay.origin.clone(), message)
                .await
                .map_err(|e| Error::broker(BROKER, what.clone(), e))?;
            ack.await.map_err(|e| Error::broker(BROKER, what.clone(), e))
        };
        tokio::time::timeout(self.options.request_timeout, publish)
            .await
            .map_err(|_| Error::broker(BROKER, what.clone(), "no PubAck in time"))??;
        Ok(true)
    }

    async fn delete_dead(&self, dead: &Stream<()>, sequence: u64, done: usize, why: &str) -> Result<()> {
        let what = if why == "replayed" {
            format!(
                "delete replayed dead letter {sequence} from {:?} (after handling {done}; it is republished already, a second replay would send it again)",
                self.dead_stream
            )
        } else {
            format!("delete {why} dead letter {sequence} from {:?} (after handling {done})", self.dead_stream)
        };
        match tokio::time::timeout(self.options.request_timeout, dead.delete_message(sequence)).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(Error::broker(BROKER, what, "the server did not delete it")),
            Ok(Err(error)) => Err(Error::broker(BROKER, what, error)),
            Err(_) => Err(Error::broker(BROKER, what, "timed out")),
        }
    }
}

/// [`DeadLetters::replay_dead_letters`] moves up to `max` dead letters of this durable (those on
/// [`dead_letter_subject`](Self::dead_letter_subject), oldest first) back to the subject each was first published
/// to, with its original headers (the dead-letter headers stripped), and deletes each from the dead-letter stream
/// only after the consumed stream acknowledged the republish. Returns how many moved.
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
impl DeadLetters for NatsTransport {
    fn dead_letter_broker(&self) -> &'static str {
        BROKER
    }

    fn dead_letter_location(&self) -> String {
        format!("subject {:?} of stream {:?}", self.dead_subject, self.dead_stream)
    }

    /// The [`DeadLetters`] walk: every message on the dead-letter subject, by sequence.
    async fn dead_letters(
        &self,
        filter: &DeadFilter,
        action: DeadLetterAction,
        max: usize,
    ) -> Result<DeadLetterOutcome> {
        let dead = match self.jetstream.get_stream_no_info(&self.dead_stream).await {
            Ok(dead) => dead,
            Err(error) if matches!(action, DeadLetterAction::List | DeadLetterAction::Show) => {
                tracing::debug!(dead_letter_stream = %self.dead_stream, %error, "no dead-letter stream to read");
                return Ok(DeadLetterOutcome::default());
            }
            Err(error) => {
                return Err(Error::broker(BROKER, format!("find dead-letter stream {:?}", self.dead_stream), error));
            }
        };
        let now = chrono::Utc::now();
        let content = action == DeadLetterAction::Show;
        let mut outcome = DeadLetterOutcome::default();
        let mut selected = 0usize;
        let mut next = 1u64;
        while selected < max {
            let done = outcome.letters.len();
            let Some(letter) = self.read_dead(&dead, next, done).await? else { break };
            next = letter.sequence + 1;
            let headers = headers_of(Some(&letter.headers));
            let entry = DeadLetterEntry::from_headers(letter.sequence.to_string(), &headers, &letter.payload, content);
            if !filter.matches(&entry, now) {
                continue;
            }
            selected += 1;
            match action {
                DeadLetterAction::List | DeadLetterAction::Show => {}
                DeadLetterAction::Replay => {
                    if !self.republish(&letter, &headers, done).await? {
                        outcome.kept += 1;
                        continue;
                    }
                    self.delete_dead(&dead, letter.sequence, done, "replayed").await?;
                }
                DeadLetterAction::Discard => self.delete_dead(&dead, letter.sequence, done, "discarded").await?,
            }
            outcome.letters.push(entry);
        }
        if matches!(action, DeadLetterAction::Replay | DeadLetterAction::Discard) && !outcome.letters.is_empty() {
            tracing::info!(messaging.system = "nats", stream = %self.stream, dead_letter_stream = %self.dead_stream, done = outcome.letters.len(), kept = outcome.kept, ?action, "dead letters handled");
        }
        Ok(outcome)
    }

    /// [`Transport::lag`](crate::consume::Transport::lag).
    async fn consumer_lag(&self) -> Result<Option<crate::consume::Lag>> {
        crate::consume::Transport::lag(self).await
    }
}

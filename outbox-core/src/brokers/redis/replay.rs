//! The dead letters of a stream: list, show, replay (back to the stream each was first appended to) and
//! discard them ([`DeadLetters`]).

use std::collections::BTreeMap;

use ::redis::Value;

use crate::consume::{DeadFilter, DeadLetterAction, DeadLetterEntry, DeadLetterOutcome, DeadLetters, dead_header};
use crate::error::{Error, Result};
use crate::text::one_line;

use super::BROKER;
use super::config::{PAYLOAD_FIELD, check_stream_key};
use super::entry::{Fields, parse_entries};
use super::transport::RedisTransport;

/// Dead letters read per `XRANGE`.
const PAGE: usize = 100;

impl RedisTransport {
    async fn delete_dead(&self, id: &str, what: &str) -> Result<()> {
        let mut del = ::redis::cmd("XDEL");
        del.arg(&self.dead_stream).arg(id);
        self.commands().query(&del).await.map_err(|e| Error::broker(BROKER, what.to_owned(), e))?;
        Ok(())
    }
}

/// Whether `id` reads as a stream entry id, `<ms>-<seq>` (anything else matches no entry).
fn valid_entry_id(id: &str) -> bool {
    id.split_once('-').is_some_and(|(ms, seq)| ms.parse::<u64>().is_ok() && seq.parse::<u64>().is_ok())
}

/// An entry's fields as headers (lossy UTF-8: a letter is shown whatever its bytes) and its payload.
fn lossy_split(fields: &[(Vec<u8>, Vec<u8>)]) -> (BTreeMap<String, String>, Vec<u8>) {
    let mut headers = BTreeMap::new();
    let mut payload = Vec::new();
    for (name, value) in fields {
        if name.as_slice() == PAYLOAD_FIELD.as_bytes() {
            payload.clone_from(value);
        } else {
            headers.insert(String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned());
        }
    }
    (headers, payload)
}

/// [`DeadLetters::replay_dead_letters`] moves up to `max` dead letters (oldest first) from
/// [`dead_letter_stream`](Self::dead_letter_stream) back to the stream each was first appended to (its
/// `outbox_dead_origin` field), with its original fields (every `outbox_dead_*` field stripped), and deletes each
/// from the dead-letter stream (`XDEL`) only after Redis answered the `XADD` to the origin with the new entry's id.
/// Returns how many moved.
///
/// The dead-letter stream is shared by every group of the stream (unless configured otherwise), and
/// this replays them all. A replayed entry is a new entry at the end of its stream: every consumer
/// group of the stream receives it again (their inboxes absorb what they applied already), after later
/// events of its aggregate. Two replays running at once can both move an entry; the inbox absorbs the
/// copy.
///
/// An entry without an origin, or whose origin is not a valid stream key, is left in place with a
/// warning. A failure stops the replay with an [`Error::Broker`]; what moved before it stays moved,
/// and a dead letter is never deleted unless its copy was appended.
impl DeadLetters for RedisTransport {
    fn dead_letter_broker(&self) -> &'static str {
        BROKER
    }

    fn dead_letter_location(&self) -> String {
        format!("stream {:?}", self.dead_stream)
    }

    /// The [`DeadLetters`] walk: the dead-letter stream by `XRANGE`, oldest first.
    async fn dead_letters(
        &self,
        filter: &DeadFilter,
        action: DeadLetterAction,
        max: usize,
    ) -> Result<DeadLetterOutcome> {
        let now = chrono::Utc::now();
        let content = action == DeadLetterAction::Show;
        let dead = &self.dead_stream;
        let context = |what: &str, done: usize| format!("{what} {dead:?} (after handling {done})");
        let mut outcome = DeadLetterOutcome::default();
        let mut selected = 0usize;
        let mut start = "-".to_owned();
        // One id selected: read just that entry.
        let single = match filter.selected_ids() {
            [id] => Some(id.clone()),
            _ => None,
        };
        if let Some(id) = &single {
            if !valid_entry_id(id) {
                return Ok(outcome);
            }
            start.clone_from(id);
        }
        'pages: while selected < max {
            let done = outcome.letters.len();
            let mut range = ::redis::cmd("XRANGE");
            let end = single.as_deref().unwrap_or("+");
            range.arg(dead).arg(&start).arg(end).arg("COUNT").arg(PAGE);
            let reply = self
                .commands()
                .query(&range)
                .await
                .map_err(|e| Error::broker(BROKER, context("read dead letters of", done), e))?;
            let entries =
                parse_entries(&reply).map_err(|e| Error::broker(BROKER, context("read dead letters of", done), e))?;
            let Some(last) = entries.last() else { break };
            start = format!("({}", last.id);
            for entry in entries {
                if selected >= max {
                    break 'pages;
                }
                let Fields::Present(fields) = entry.fields else { continue };
                let (headers, payload) = lossy_split(&fields);
                let letter = DeadLetterEntry::from_headers(entry.id.clone(), &headers, &payload, content);
                if !filter.matches(&letter, now) {
                    continue;
                }
                selected += 1;
                let done = outcome.letters.len();
                match action {
                    DeadLetterAction::List | DeadLetterAction::Show => {}
                    DeadLetterAction::Replay => {
                        let Some(origin) = letter.origin.clone().filter(|o| check_stream_key("origin", o).is_ok())
                        else {
                            tracing::warn!(dead_letter_stream = %dead, entry = %entry.id, "a dead letter without a valid origin; left in place");
                            outcome.kept += 1;
                            continue;
                        };
                        let mut add = ::redis::cmd("XADD");
                        add.arg(&origin).arg("*");
                        for (name, value) in &fields {
                            if !name.starts_with(dead_header::PREFIX.as_bytes()) {
                                add.arg(name.as_slice()).arg(value.as_slice());
                            }
                        }
                        let what = format!("replay dead letter {} to {:?} from", entry.id, one_line(&origin));
                        match self.commands().query(&add).await {
                            Ok(Value::BulkString(_) | Value::SimpleString(_)) => {}
                            Ok(other) => {
                                return Err(Error::broker(
                                    BROKER,
                                    context(&what, done),
                                    format!("XADD was answered {other:?}"),
                                ));
                            }
                            Err(error) => return Err(Error::broker(BROKER, context(&what, done), error)),
                        }
                        let why = format!(
                            "delete replayed dead letter {} (it is appended to {:?} already; a second replay would append it again) from",
                            entry.id,
                            one_line(&origin)
                        );
                        self.delete_dead(&entry.id, &context(&why, done)).await?;
                    }
                    DeadLetterAction::Discard => {
                        let why = format!("discard dead letter {} from", entry.id);
                        self.delete_dead(&entry.id, &context(&why, done)).await?;
                    }
                }
                outcome.letters.push(letter);
            }
            if single.is_some() {
                break;
            }
        }
        if matches!(action, DeadLetterAction::Replay | DeadLetterAction::Discard) && !outcome.letters.is_empty() {
            tracing::info!(messaging.system = "redis", dead_letter_stream = %dead, done = outcome.letters.len(), kept = outcome.kept, ?action, "dead letters handled");
        }
        Ok(outcome)
    }

    /// [`Transport::lag`](crate::consume::Transport::lag).
    async fn consumer_lag(&self) -> Result<Option<crate::consume::Lag>> {
        crate::consume::Transport::lag(self).await
    }
}

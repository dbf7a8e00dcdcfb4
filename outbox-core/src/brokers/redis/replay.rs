//! Moving dead letters back to the stream they were first appended to.

use ::redis::Value;

use crate::consume::dead_header;
use crate::error::{Error, Result};
use crate::text::one_line;

use super::BROKER;
use super::config::check_stream_key;
use super::entry::{Fields, parse_entries};
use super::transport::RedisTransport;

/// Dead letters read per `XRANGE`.
const PAGE: usize = 100;

impl RedisTransport {
    /// Moves up to `max` dead letters (oldest first) from [`dead_letter_stream`](Self::dead_letter_stream)
    /// back to the stream each was first appended to (its `outbox_dead_origin` field), with its original
    /// fields (every `outbox_dead_*` field stripped), and deletes each from the dead-letter stream
    /// (`XDEL`) only after Redis answered the `XADD` to the origin with the new entry's id. Returns how many
    /// moved.
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
    pub async fn replay_dead_letters(&self, max: usize) -> Result<u64> {
        let mut moved = 0u64;
        let mut start = "-".to_owned();
        while usize::try_from(moved).unwrap_or(usize::MAX) < max {
            let mut range = ::redis::cmd("XRANGE");
            range.arg(&self.dead_stream).arg(&start).arg("+").arg("COUNT").arg(PAGE);
            let dead = &self.dead_stream;
            let context = |what: &str, moved: u64| format!("{what} {dead:?} (after replaying {moved})");
            let reply = self
                .commands()
                .query(&range)
                .await
                .map_err(|e| Error::broker(BROKER, context("read dead letters of", moved), e))?;
            let entries =
                parse_entries(&reply).map_err(|e| Error::broker(BROKER, context("read dead letters of", moved), e))?;
            let Some(last) = entries.last() else { break };
            start = format!("({}", last.id);
            for entry in entries {
                if usize::try_from(moved).unwrap_or(usize::MAX) >= max {
                    break;
                }
                let Fields::Present(fields) = entry.fields else { continue };
                let origin = fields
                    .iter()
                    .rev()
                    .find(|(name, _)| name.as_slice() == dead_header::ORIGIN.as_bytes())
                    .and_then(|(_, value)| String::from_utf8(value.clone()).ok());
                let Some(origin) = origin.filter(|origin| check_stream_key("origin", origin).is_ok()) else {
                    tracing::warn!(dead_letter_stream = %self.dead_stream, entry = %entry.id, "a dead letter without a valid origin; left in place");
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
                            context(&what, moved),
                            format!("XADD was answered {other:?}"),
                        ));
                    }
                    Err(error) => return Err(Error::broker(BROKER, context(&what, moved), error)),
                }
                let mut del = ::redis::cmd("XDEL");
                del.arg(&self.dead_stream).arg(&entry.id);
                self.commands().query(&del).await.map_err(|e| {
                    Error::broker(
                        BROKER,
                        context(&format!(
                            "delete replayed dead letter {} (it is appended to {:?} already; a second replay would append it again) from",
                            entry.id,
                            one_line(&origin)
                        ), moved),
                        e,
                    )
                })?;
                moved += 1;
            }
        }
        if moved > 0 {
            tracing::info!(messaging.system = "redis", dead_letter_stream = %self.dead_stream, moved, "dead letters replayed");
        }
        Ok(moved)
    }
}

impl crate::consume::ReplayDeadLetters for RedisTransport {
    async fn replay_dead_letters(&self, max: usize) -> Result<u64> {
        RedisTransport::replay_dead_letters(self, max).await
    }
}

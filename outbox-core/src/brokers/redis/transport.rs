//! [`RedisTransport`]: a consumer of a Redis Streams consumer group as the consume driver's [`Transport`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::redis::{Cmd, RedisError, Value};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::consume::held::{HeldSet, KeepAlive, keep_held_alive};
use crate::consume::{DeadLetter, Delivery, Lag, Transport, dead_header};
use crate::error::{Error, Result};
use crate::text::one_line;

use super::BROKER;
use super::config::{PAYLOAD_FIELD, RedisTransportConfig, check_stream_key, dead_field, millis};
use super::entry::{Entry, Fields, parse_autoclaim_reply, parse_pending_reply, parse_read_reply, split_entry};
use super::link::Link;

/// Most pages of this consumer's own pending entries one fetch reads.
const OWN_PAGES_PER_FETCH: usize = 16;

/// Most ids in one `XCLAIM` of the keep-alive task.
const CLAIM_CHUNK: usize = 256;

/// What identifies a delivered entry to [`RedisTransport`]: its id in the stream.
#[derive(Clone, Debug)]
pub struct RedisReceipt {
    id: String,
    payload_field: bool,
}

impl RedisReceipt {
    /// The entry id, e.g. `1700000000000-0`.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Where the next fetch reads.
struct ReadState {
    /// Read this consumer's own pending entries after this id first (at start, after a release or an
    /// error: entries Redis delivered that the driver may never have received).
    own: Option<String>,
    /// The `XAUTOCLAIM` cursor.
    reclaim_cursor: String,
    /// When to claim idle entries again.
    next_reclaim: Instant,
}

/// What the transport and its keep-alive task share.
struct Shared {
    commands: Link,
    stream: String,
    group: String,
    consumer: String,
    /// Entries handed to the driver and not acked or released yet, with when their idle time was reset.
    held: HeldSet<String, ()>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// `XCLAIM <stream> <group> <me> 0 <ids> JUSTID`: resets the idle time of `ids` (without counting a
    /// delivery), so no other consumer claims them.
    async fn reset_idle(&self, ids: &[String]) -> Result<(), RedisError> {
        let mut cmd = ::redis::cmd("XCLAIM");
        cmd.arg(&self.stream).arg(&self.group).arg(&self.consumer).arg(0).arg(ids).arg("JUSTID");
        self.commands.query(&cmd).await.map(|_| ())
    }
}

/// The consume side of Redis Streams: one consumer of a consumer group, for
/// [`Consumer::run`](crate::Consumer::run). See the [module docs](super) for what each method does on
/// the broker and what order holds.
pub struct RedisTransport {
    shared: Arc<Shared>,
    /// A second connection for `XREADGROUP ... BLOCK`, which would hold up acks on the first.
    blocking: Link,
    pub(super) dead_stream: String,
    pub(super) config: RedisTransportConfig,
    read: Mutex<ReadState>,
    _keeper: DropGuard,
}

impl std::fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTransport")
            .field("url", &self.shared.commands.url)
            .field("stream", &self.shared.stream)
            .field("group", &self.shared.group)
            .field("consumer", &self.shared.consumer)
            .field("dead_letter_stream", &self.dead_stream)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RedisTransport {
    /// Connects to `url` as `consumer_name` of consumer group `group` on `stream` with the default
    /// [`RedisTransportConfig`]; dead letters go to `<stream>:dead`. Creates the group (and the stream,
    /// `MKSTREAM`) if missing, starting at the stream's first entry, so entries published before the first
    /// consumer ran are delivered too; an existing group is kept as it is.
    ///
    /// A malformed URL, another broker's scheme, an empty or over-long name, a dead-letter stream equal to
    /// `stream` or a dead-letter key that holds something other than a stream is an
    /// [`Error::InvalidConfig`]; an unreachable server or a failed group creation is an [`Error::Broker`].
    pub async fn connect(url: &str, stream: &str, group: &str, consumer_name: &str) -> Result<Self> {
        Self::connect_with(url, stream, group, consumer_name, RedisTransportConfig::default()).await
    }

    /// [`connect`](Self::connect) with explicit settings.
    pub async fn connect_with(
        url: &str,
        stream: &str,
        group: &str,
        consumer_name: &str,
        config: RedisTransportConfig,
    ) -> Result<Self> {
        config.validate()?;
        check_stream_key("stream", stream)?;
        check_stream_key("group", group)?;
        check_stream_key("consumer_name", consumer_name)?;
        let dead_stream = config.dead_letter_stream_for(stream);
        check_stream_key("dead_letter_stream", &dead_stream)?;
        if dead_stream == stream {
            return Err(Error::invalid_config(
                "dead_letter_stream",
                format!("is the consumed stream {:?} itself; dead letters would be delivered again", one_line(stream)),
            ));
        }
        let commands = Link::new(url, config.connect_timeout, config.response_timeout)?;
        let blocking = Link::new(url, config.connect_timeout, config.response_timeout + config.max_block)?;
        commands.get().await.map_err(|e| Error::broker(BROKER, format!("connect to {}", commands.url), e))?;
        let mut kind = ::redis::cmd("TYPE");
        kind.arg(&dead_stream);
        match commands.query(&kind).await {
            Ok(Value::SimpleString(kind)) if kind == "stream" || kind == "none" => {}
            Ok(other) => {
                return Err(Error::invalid_config(
                    "dead_letter_stream",
                    format!("key {:?} holds {other:?}, not a stream", one_line(&dead_stream)),
                ));
            }
            Err(error) => return Err(Error::broker(BROKER, format!("check key {dead_stream:?}"), error)),
        }
        let shared = Arc::new(Shared {
            commands,
            stream: stream.to_owned(),
            group: group.to_owned(),
            consumer: consumer_name.to_owned(),
            held: HeldSet::default(),
        });
        ensure_group(&shared)
            .await
            .map_err(|e| Error::broker(BROKER, format!("create consumer group {group:?} on stream {stream:?}"), e))?;
        let stop = CancellationToken::new();
        tokio::spawn(keep_held_alive(shared.clone(), config.min_idle / 3, stop.clone()));
        Ok(RedisTransport {
            shared,
            blocking,
            dead_stream,
            read: Mutex::new(ReadState {
                own: Some("0-0".to_owned()),
                reclaim_cursor: "0-0".to_owned(),
                next_reclaim: Instant::now(),
            }),
            config,
            _keeper: stop.drop_guard(),
        })
    }

    /// The stream read.
    pub fn stream(&self) -> &str {
        &self.shared.stream
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.shared.group
    }

    /// This consumer's name in the group.
    pub fn consumer_name(&self) -> &str {
        &self.shared.consumer
    }

    /// The stream dead letters are appended to.
    pub fn dead_letter_stream(&self) -> &str {
        &self.dead_stream
    }

    /// The settings.
    pub fn config(&self) -> &RedisTransportConfig {
        &self.config
    }

    pub(super) fn commands(&self) -> &Link {
        &self.shared.commands
    }

    /// Reads this consumer's own pending entries first on the next fetch, from the start (entries held
    /// already are skipped).
    fn reread_own(&self) {
        lock(&self.read).own = Some("0-0".to_owned());
    }

    fn redis_error(&self, operation: &str, error: RedisError) -> Error {
        if error.code() == Some("NOGROUP") {
            return Error::broker(
                BROKER,
                format!("{operation} (the consumer group or stream is gone; it is created again)"),
                error,
            );
        }
        Error::broker(
            BROKER,
            format!("{operation} on stream {:?} (group {:?})", self.shared.stream, self.shared.group),
            error,
        )
    }

    /// Fetch step 1: this consumer's own pending entries after the cursor, without blocking.
    async fn read_own(&self, after: &str, max: usize) -> Result<Option<Vec<Entry>>> {
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP").arg(&self.shared.group).arg(&self.shared.consumer).arg("COUNT").arg(max);
        cmd.arg("STREAMS").arg(&self.shared.stream).arg(after);
        let entries = self.query_entries(&self.shared.commands, &cmd, "read own pending entries").await?;
        let mut read = lock(&self.read);
        match entries.last() {
            None => {
                read.own = None;
                Ok(None)
            }
            Some(last) => {
                read.own = Some(last.id.clone());
                Ok(Some(entries))
            }
        }
    }

    /// Fetch step 2: entries idle past `min_idle` anywhere in the group, when due.
    async fn reclaim(&self, max: usize) -> Result<Vec<Entry>> {
        let cursor = {
            let read = lock(&self.read);
            if Instant::now() < read.next_reclaim {
                return Ok(Vec::new());
            }
            read.reclaim_cursor.clone()
        };
        let mut cmd = ::redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.shared.stream).arg(&self.shared.group).arg(&self.shared.consumer);
        cmd.arg(millis(self.config.min_idle)).arg(&cursor).arg("COUNT").arg(max);
        let reply = self.query(&self.shared.commands, &cmd, "claim idle entries").await?;
        let (next, entries) = parse_autoclaim_reply(&reply).map_err(|e| self.redis_error("claim idle entries", e))?;
        let mut read = lock(&self.read);
        if next == "0-0" {
            read.next_reclaim = Instant::now() + self.config.reclaim_interval;
        }
        read.reclaim_cursor = next;
        if !entries.is_empty() {
            tracing::info!(messaging.system = "redis", entries = entries.len(), "claimed entries idle past min_idle");
        }
        Ok(entries)
    }

    /// Fetch step 3: new entries, waiting up to `wait`.
    async fn read_new(&self, max: usize, wait: Duration) -> Result<Vec<Entry>> {
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP").arg(&self.shared.group).arg(&self.shared.consumer).arg("COUNT").arg(max);
        cmd.arg("BLOCK").arg(millis(wait.min(self.config.max_block)).max(1));
        cmd.arg("STREAMS").arg(&self.shared.stream).arg(">");
        self.query_entries(&self.blocking, &cmd, "read new entries").await
    }

    async fn query(&self, link: &Link, cmd: &Cmd, operation: &str) -> Result<Value> {
        match link.query(cmd).await {
            Ok(reply) => Ok(reply),
            Err(error) => {
                // Redis may have delivered entries whose reply was lost: read the pending list first next.
                self.reread_own();
                if error.code() == Some("NOGROUP") {
                    tracing::warn!(%error, "the consumer group or stream is gone; creating it again from the stream's start");
                    if let Err(error) = ensure_group(&self.shared).await {
                        tracing::warn!(%error, "cannot create the consumer group");
                    }
                }
                Err(self.redis_error(operation, error))
            }
        }
    }

    async fn query_entries(&self, link: &Link, cmd: &Cmd, operation: &str) -> Result<Vec<Entry>> {
        let reply = self.query(link, cmd, operation).await?;
        parse_read_reply(&reply).map_err(|e| self.redis_error(operation, e))
    }

    /// The deliveries of `entries`, now held: delivery counts from `XPENDING` when `counted` (a re-read
    /// or a claim), 1 for new entries. Entries already held are skipped; entries deleted while pending are
    /// acked; entries that cannot be headers are dead-lettered here. An entry whose ack or dead letter
    /// failed stays pending, not held, and is read again from the pending list on the next fetch.
    async fn deliveries(&self, entries: Vec<Entry>, counted: bool) -> Result<Vec<Delivery<RedisReceipt>>> {
        let entries: Vec<Entry> = entries.into_iter().filter(|e| !self.shared.held.contains(&e.id)).collect();
        let counts = match (counted, entries.first(), entries.last()) {
            (true, Some(first), Some(last)) => {
                let mut cmd = ::redis::cmd("XPENDING");
                cmd.arg(&self.shared.stream).arg(&self.shared.group).arg(&first.id).arg(&last.id);
                cmd.arg(entries.len().saturating_mul(2)).arg(&self.shared.consumer);
                parse_pending_reply(&self.query(&self.shared.commands, &cmd, "read delivery counts").await?)
            }
            _ => HashMap::new(),
        };
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let deliveries = counts.get(&entry.id).copied().unwrap_or(1);
            let deliveries = u32::try_from(deliveries.max(1)).unwrap_or(u32::MAX);
            let fields = match entry.fields {
                Fields::Present(fields) => fields,
                Fields::Deleted => {
                    tracing::warn!(messaging.message.id = %entry.id, "a pending entry was deleted (trimmed) before it was handled; acked");
                    if let Err(error) = self.xack(&entry.id).await {
                        tracing::warn!(%error, "ack of a deleted entry failed; it is read again");
                        self.reread_own();
                    }
                    continue;
                }
                Fields::Malformed(reason) => {
                    self.dead_letter_raw(&entry.id, &[], &reason, deliveries).await;
                    continue;
                }
            };
            let split = match split_entry(&fields) {
                Ok(split) => split,
                Err(reason) => {
                    self.dead_letter_raw(&entry.id, &fields, &reason, deliveries).await;
                    continue;
                }
            };
            self.shared.held.insert(entry.id.clone(), ());
            out.push(Delivery {
                headers: split.headers,
                payload: split.payload.clone().unwrap_or_default(),
                origin: self.shared.stream.clone(),
                deliveries,
                receipt: RedisReceipt { id: entry.id, payload_field: split.payload.is_some() },
            });
        }
        Ok(out)
    }

    async fn xack(&self, id: &str) -> Result<()> {
        self.xack_all(&[id]).await
    }

    /// `XACK <stream> <group> <id>...`: one command for every entry of a group.
    async fn xack_all(&self, ids: &[&str]) -> Result<()> {
        let mut cmd = ::redis::cmd("XACK");
        cmd.arg(&self.shared.stream).arg(&self.shared.group).arg(ids);
        let what = || match ids {
            [id] => format!("ack entry {id}"),
            _ => format!("ack {} entries", ids.len()),
        };
        self.shared.commands.query(&cmd).await.map(|_| ()).map_err(|e| self.redis_error(&what(), e))
    }

    /// `XADD <dead stream> * <fields...>`: `Ok` once Redis answered with the new entry's id.
    async fn append_dead(&self, id: &str, fields: Vec<(Vec<u8>, Vec<u8>)>) -> Result<()> {
        let mut cmd = ::redis::cmd("XADD");
        cmd.arg(&self.dead_stream).arg("*");
        for (name, value) in &fields {
            cmd.arg(name.as_slice()).arg(value.as_slice());
        }
        let what = || format!("dead-letter entry {id} of {:?} to {:?}", self.shared.stream, self.dead_stream);
        match self.shared.commands.query(&cmd).await {
            Ok(Value::BulkString(_) | Value::SimpleString(_)) => Ok(()),
            Ok(other) => Err(Error::broker(BROKER, what(), format!("XADD was answered {other:?}"))),
            Err(error) => Err(Error::broker(BROKER, what(), error)),
        }
    }

    /// The dead letter of an entry the driver never sees (fields that cannot be headers): its raw fields,
    /// then the dead-letter fields; acked once appended. On a failure the entry stays pending and is read
    /// again from the pending list on the next fetch.
    async fn dead_letter_raw(&self, id: &str, raw: &[(Vec<u8>, Vec<u8>)], reason: &str, attempts: u32) {
        let letter = DeadLetter {
            reason: format!("the stream entry cannot be read as an outbox message: {reason}"),
            attempts,
            consumer: self.shared.group.clone(),
            origin: self.shared.stream.clone(),
        };
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> =
            raw.iter().filter(|(name, _)| !name.starts_with(dead_header::PREFIX.as_bytes())).cloned().collect();
        fields.extend(letter.headers(&BTreeMap::new()).into_iter().map(|(k, v)| (k.into_bytes(), v.into_bytes())));
        fields.extend(self.dead_fields(id));
        let outcome = match self.append_dead(id, fields).await {
            Ok(()) => self.xack(id).await,
            Err(error) => Err(error),
        };
        match outcome {
            Ok(()) => {
                tracing::warn!(messaging.message.id = %id, dead_letter_stream = %self.dead_stream, reason = %one_line(reason), "entry dead-lettered")
            }
            Err(error) => {
                tracing::warn!(%error, messaging.message.id = %id, "dead letter of an unreadable entry failed; it is read again");
                self.reread_own();
            }
        }
    }

    fn dead_fields(&self, id: &str) -> [(Vec<u8>, Vec<u8>); 2] {
        [
            (dead_field::GROUP.into(), self.shared.group.clone().into_bytes()),
            (dead_field::ENTRY_ID.into(), id.as_bytes().to_vec()),
        ]
    }

    fn forget(&self, receipt: &RedisReceipt) {
        self.shared.held.remove(&receipt.id);
    }
}

/// `XGROUP CREATE <stream> <group> 0 MKSTREAM`; an existing group (`BUSYGROUP`) is fine.
async fn ensure_group(shared: &Shared) -> Result<(), RedisError> {
    let mut cmd = ::redis::cmd("XGROUP");
    cmd.arg("CREATE").arg(&shared.stream).arg(&shared.group).arg("0").arg("MKSTREAM");
    match shared.commands.query(&cmd).await {
        Ok(_) => {
            tracing::debug!(messaging.system = "redis", messaging.destination.name = %shared.stream, group = %shared.group, "consumer group created");
            Ok(())
        }
        Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
        Err(error) => Err(error),
    }
}

impl KeepAlive for Shared {
    type Key = String;
    type Value = ();

    fn held(&self) -> &HeldSet<String, ()> {
        &self.held
    }

    /// Resets the idle time of the `due` entries, [`CLAIM_CHUNK`] per `XCLAIM`.
    async fn keep_alive(&self, due: Vec<(String, ())>) -> Result<(), String> {
        let ids: Vec<String> = due.into_iter().map(|(id, ())| id).collect();
        for chunk in ids.chunks(CLAIM_CHUNK) {
            self.reset_idle(chunk).await.map_err(|e| format!("XCLAIM … JUSTID: {e}"))?;
        }
        Ok(())
    }
}

impl Transport for RedisTransport {
    type Receipt = RedisReceipt;

    fn broker(&self) -> &'static str {
        BROKER
    }

    fn source(&self) -> String {
        format!("stream {} (group {}, consumer {})", self.shared.stream, self.shared.group, self.shared.consumer)
    }

    /// This consumer's own pending entries first (at start, after a release or an error), then entries
    /// of the group idle past `min_idle` (`XAUTOCLAIM`, every `reclaim_interval`), then new entries
    /// (`XREADGROUP >` with `BLOCK`).
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery<RedisReceipt>>> {
        let max = max.max(1);
        for _ in 0..OWN_PAGES_PER_FETCH {
            let own = lock(&self.read).own.clone();
            let Some(after) = own else { break };
            let Some(entries) = self.read_own(&after, max).await? else { break };
            let out = self.deliveries(entries, true).await?;
            if !out.is_empty() {
                return Ok(out);
            }
        }
        if lock(&self.read).own.is_some() {
            // The pending list is not read through (an entry there keeps failing): nothing newer yet.
            return Ok(Vec::new());
        }
        let claimed = self.reclaim(max).await?;
        if !claimed.is_empty() {
            let out = self.deliveries(claimed, true).await?;
            if !out.is_empty() {
                return Ok(out);
            }
        }
        let entries = self.read_new(max, wait).await?;
        self.deliveries(entries, false).await
    }

    /// `XACK`.
    async fn ack(&self, receipt: &RedisReceipt) -> Result<()> {
        self.forget(receipt);
        self.xack(&receipt.id).await
    }

    /// One `XACK` for the whole group.
    async fn ack_all(&self, receipts: &[&RedisReceipt]) -> Result<()> {
        receipts.iter().for_each(|receipt| self.forget(receipt));
        let ids: Vec<&str> = receipts.iter().map(|receipt| receipt.id.as_str()).collect();
        self.xack_all(&ids).await
    }

    /// Nothing at Redis: the entry stays pending in this consumer's name. It comes back on this
    /// transport's next fetch, when this consumer restarts, or to another consumer of the group once it has
    /// been idle for `min_idle`.
    async fn release(&self, receipt: &RedisReceipt) -> Result<()> {
        self.forget(receipt);
        self.reread_own();
        Ok(())
    }

    /// `XADD` to the dead-letter stream: the original headers, the dead-letter headers, the group and the
    /// entry id, then the original payload field; `Ok` once Redis answered with the new entry's id.
    async fn dead_letter(&self, delivery: &Delivery<RedisReceipt>, letter: &DeadLetter) -> Result<()> {
        let receipt = &delivery.receipt;
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> =
            letter.headers(&delivery.headers).into_iter().map(|(k, v)| (k.into_bytes(), v.into_bytes())).collect();
        fields.extend(self.dead_fields(&receipt.id));
        if receipt.payload_field {
            fields.push((PAYLOAD_FIELD.into(), delivery.payload.clone()));
        }
        self.append_dead(&receipt.id, fields).await
    }

    /// `XINFO GROUPS`: the group's `pending` (delivered, not acknowledged) and `lag` (entries not yet
    /// delivered to the group; Redis 7 and later, unknown after some deletions).
    async fn lag(&self) -> Result<Option<Lag>> {
        let mut cmd = ::redis::cmd("XINFO");
        cmd.arg("GROUPS").arg(&self.shared.stream);
        let what = "read the consumer group's lag (XINFO GROUPS)";
        let reply = self.shared.commands.query(&cmd).await.map_err(|e| self.redis_error(what, e))?;
        let reply: ::redis::streams::StreamInfoGroupsReply =
            ::redis::from_redis_value(reply).map_err(|e| Error::broker(BROKER, what, e))?;
        match reply.groups.into_iter().find(|group| group.name == self.shared.group) {
            Some(group) => Ok(Some(Lag::new(Some(group.pending as u64), group.lag.map(|lag| lag as u64)))),
            None => Err(Error::broker(
                BROKER,
                what,
                format!("stream {:?} has no consumer group {:?}", self.shared.stream, self.shared.group),
            )),
        }
    }
}

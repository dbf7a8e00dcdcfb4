//! Redis Streams adapter (feature `redis`): [`RedisPublisher`] appends each event to a stream with `XADD`,
//! [`RedisConsumer`] reads a consumer group with `XREADGROUP` and acknowledges with `XACK`.
//!
//! ## Stream entries
//! An event is one stream entry whose fields are the [`envelope_headers`] (CloudEvents names such as
//! `ce_id`, `ce_type`, `ce_subject`, then the event's own headers), followed by a [`PAYLOAD_FIELD`] field
//! with the JSON payload. The stream key comes from a [`Destination`] template, by default
//! [`DEFAULT_STREAM_TEMPLATE`] (`outbox:{aggregate_type}`).
//!
//! ## Guarantees
//! - The publisher pipelines a batch's `XADD`s in one round trip and reports each event on its own: `Ok`
//!   only for an entry Redis appended (and, with [`RedisPublisherConfig::min_replicas`], replicated).
//!   Redis has no server-side dedup: an event whose confirmation was lost is appended again, and the
//!   consumer's inbox drops the duplicate.
//! - The consumer acks an entry only after the handler returned [`Disposition::Ack`] (which an
//!   `#[idempotent_handler]` does after its commit). An entry the handler asks to retry stays pending and is
//!   reclaimed with `XAUTOCLAIM` once idle for [`RedisConsumerConfig::min_idle`], as are entries left by
//!   a consumer that died. An entry that cannot be decoded, that the handler parks, or that was delivered
//!   more than [`RedisConsumerConfig::max_deliveries`] times is copied to the dead-letter stream
//!   (`<stream>:dead`, with the reason in [`dead_field::REASON`]) and acked: never retried in a loop.
//! - Order: a consumer handles a stream's entries in stream order, one at a time, so events of one
//!   aggregate are applied in the order the relay published them, unless the handler retries one (it is
//!   handled again after `min_idle`, after later entries). Several consumers in one group share the
//!   entries and do not keep any order between them.
//! - Needs Redis 6.2 or later (`XAUTOCLAIM`); checked against 7.0.
//! - A dropped connection is re-established on the next command: the publisher reports the batch as a
//!   transient failure (the relay retries it after its backoff), the consumer backs off and reads again.
//!
//! ```no_run
//! # async fn demo() -> outbox_core::Result<()> {
//! use outbox_core::brokers::redis::{RedisConsumer, RedisPublisher};
//! use outbox_core::{Destination, Disposition, OutboxEvent};
//!
//! let publisher =
//!     RedisPublisher::connect("redis://127.0.0.1:6379", Destination::parse("outbox:{aggregate_type}")?).await?;
//! // ... Relay::new(store, publisher, RelayConfig::default())
//!
//! let consumer = RedisConsumer::connect("redis://127.0.0.1:6379", "outbox:order", "billing", "billing-1").await?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! consumer
//!     .run(
//!         |event: OutboxEvent| async move {
//!             println!("{}", event.event_type);
//!             Disposition::Ack
//!         },
//!         shutdown,
//!     )
//!     .await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisError, Value};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::broker::redact_url as redact;
use crate::broker::{Destination, Disposition, MessageHandler, decode_message, envelope_headers};
use crate::brokers::BrokerKind;
use crate::envelope::OutboxEvent;
use crate::error::{Error, Result};
use crate::publisher::{PublishError, Publisher};

/// The `redis` crate this adapter is built on, for raw commands (inspecting or trimming streams).
pub use ::redis;

const BROKER: &str = "Redis Streams";

/// The default stream key template: one stream per aggregate type.
pub const DEFAULT_STREAM_TEMPLATE: &str = "outbox:{aggregate_type}";

/// The stream entry field that carries the JSON payload; every other field is a header.
pub const PAYLOAD_FIELD: &str = "payload";

/// The longest stream key accepted, in bytes (Redis allows far longer keys; a longer one is a mistake).
pub const MAX_STREAM_KEY_LEN: usize = 1024;

/// Redis's own limit on one value (`proto-max-bulk-len` default): 512 MiB.
pub const REDIS_MAX_VALUE_BYTES: usize = 512 * 1024 * 1024;

/// The default [`RedisPublisherConfig::max_payload_bytes`]: 64 MiB.
pub const DEFAULT_MAX_ENTRY_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;

/// The suffix of a consumer's dead-letter stream: `<stream>:dead`.
pub const DEAD_STREAM_SUFFIX: &str = ":dead";

/// Fields a consumer adds to an entry it copies to the dead-letter stream, after the entry's own fields.
pub mod dead_field {
    /// Why the entry was parked.
    pub const REASON: &str = "outbox_dead_reason";
    /// The entry's id in the source stream.
    pub const ENTRY_ID: &str = "outbox_dead_entry_id";
    /// The source stream.
    pub const STREAM: &str = "outbox_dead_stream";
    /// The consumer group that parked it.
    pub const GROUP: &str = "outbox_dead_group";
    /// The consumer that parked it.
    pub const CONSUMER: &str = "outbox_dead_consumer";
    /// How many times the group had delivered it.
    pub const DELIVERIES: &str = "outbox_dead_deliveries";
}

// ---------------------------------------------------------------------------------------------------------
// Connection
// ---------------------------------------------------------------------------------------------------------

/// Checks `url` before connecting: a `redis://` or `rediss://` URL with a host that the client accepts.
fn open_client(url: &str) -> Result<Client> {
    let shown = redact(url);
    if BrokerKind::from_url(url)? != BrokerKind::Redis {
        return Err(Error::invalid_config(
            "broker_url",
            format!(
                "{shown:?} is not a Redis URL; the Redis Streams adapter expects redis://host:6379 or rediss://host:6379"
            ),
        ));
    }
    Client::open(url)
        .map_err(|e| Error::invalid_config("broker_url", format!("{shown:?} is not a valid Redis URL: {e}")))
}

/// Whether an error means the connection is unusable and the next command should open a new one.
fn breaks_connection(error: &RedisError) -> bool {
    error.is_io_error() || error.is_timeout() || error.is_connection_dropped() || error.is_unrecoverable_error()
}

/// One multiplexed connection, opened on first use and again after it broke.
struct Link {
    client: Client,
    config: AsyncConnectionConfig,
    url: String,
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: std::sync::atomic::AtomicU64,
}

impl Link {
    fn new(url: &str, connect_timeout: Duration, response_timeout: Duration) -> Result<Self> {
        let client = open_client(url)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout));
        Ok(Link {
            client,
            config,
            url: redact(url),
            current: Mutex::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The open connection, or a new one.
    async fn get(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        let mut current = self.current.lock().await;
        if let Some((generation, connection)) = current.as_ref() {
            return Ok((*generation, connection.clone()));
        }
        let connection = self.client.get_multiplexed_async_connection_with_config(&self.config).await?;
        let generation = self.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        *current = Some((generation, connection.clone()));
        tracing::debug!(messaging.system = "redis", url = %self.url, "connected to Redis");
        Ok((generation, connection))
    }

    /// Forgets connection `generation` if `error` broke it, so the next command reconnects.
    async fn check(&self, generation: u64, error: &RedisError) {
        if breaks_connection(error) {
            let mut current = self.current.lock().await;
            if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                *current = None;
                tracing::debug!(messaging.system = "redis", url = %self.url, %error, "Redis connection dropped");
            }
        }
    }

    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let (generation, mut connection) = self.get().await?;
        let result = cmd.query_async::<Value>(&mut connection).await;
        if let Err(error) = &result {
            self.check(generation, error).await;
        }
        result
    }

    async fn query_pipeline(&self, pipe: &Pipeline) -> Result<Vec<Value>, RedisError> {
        let (generation, mut connection) = self.get().await?;
        let result = pipe.query_async::<Vec<Value>>(&mut connection).await;
        if let Err(error) = &result {
            self.check(generation, error).await;
        }
        result
    }
}

fn check_stream_key(field: &'static str, key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid_config(field, "is empty"));
    }
    if key.len() > MAX_STREAM_KEY_LEN {
        return Err(Error::invalid_config(
            field,
            format!("is {} bytes; the Redis Streams adapter accepts at most {MAX_STREAM_KEY_LEN}", key.len()),
        ));
    }
    Ok(())
}

fn check_timeout(field: &'static str, value: Duration) -> Result<()> {
    if value.is_zero() {
        return Err(Error::invalid_config(field, "must be more than zero"));
    }
    Ok(())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------------------------
// Publisher
// ---------------------------------------------------------------------------------------------------------

/// Settings of a [`RedisPublisher`]. Build with [`RedisPublisherConfig::default`] and the `with_*` methods;
/// checked by [`RedisPublisher::connect_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisPublisherConfig {
    /// Largest payload published, in bytes (default [`DEFAULT_MAX_ENTRY_PAYLOAD_BYTES`], at most
    /// [`REDIS_MAX_VALUE_BYTES`]). A larger event fails permanently: it goes to the dead letters.
    pub max_payload_bytes: usize,
    /// Trim each stream to about this many entries on every `XADD` (`MAXLEN ~ n`); `None` (the default)
    /// keeps every entry. Trimming removes entries whether or not every consumer group has read them.
    pub max_len: Option<usize>,
    /// Replicas that must have the entries before they count as published (`WAIT`); 0 (the default)
    /// counts an entry as published once the primary appended it.
    pub min_replicas: u32,
    /// How long `WAIT` waits for [`min_replicas`](Self::min_replicas) (default 1 s); fewer replicas in time
    /// is a transient failure, so the batch is published again.
    pub replica_timeout: Duration,
    /// Time allowed to open a connection (default 2 s).
    pub connect_timeout: Duration,
    /// Time allowed for Redis to answer a batch (default 5 s); keep it below the relay's `publish_timeout`.
    pub response_timeout: Duration,
}

impl Default for RedisPublisherConfig {
    fn default() -> Self {
        RedisPublisherConfig {
            max_payload_bytes: DEFAULT_MAX_ENTRY_PAYLOAD_BYTES,
            max_len: None,
            min_replicas: 0,
            replica_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
        }
    }
}

impl RedisPublisherConfig {
    /// Sets [`max_payload_bytes`](Self::max_payload_bytes).
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Sets [`max_len`](Self::max_len).
    pub fn with_max_len(mut self, entries: usize) -> Self {
        self.max_len = Some(entries);
        self
    }

    /// Sets [`min_replicas`](Self::min_replicas) and [`replica_timeout`](Self::replica_timeout).
    pub fn with_min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.min_replicas = replicas;
        self.replica_timeout = timeout;
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`response_timeout`](Self::response_timeout).
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Checks the settings; an out-of-range value is an [`Error::InvalidConfig`].
    pub fn validate(&self) -> Result<()> {
        if self.max_payload_bytes == 0 || self.max_payload_bytes > REDIS_MAX_VALUE_BYTES {
            return Err(Error::invalid_config(
                "max_payload_bytes",
                format!("is {}; expected 1 to {REDIS_MAX_VALUE_BYTES} (Redis's value limit)", self.max_payload_bytes),
            ));
        }
        if self.max_len == Some(0) {
            return Err(Error::invalid_config("max_len", "is 0, which would trim every entry; use None to keep all"));
        }
        if self.min_replicas > 0 {
            check_timeout("replica_timeout", self.replica_timeout)?;
        }
        check_timeout("connect_timeout", self.connect_timeout)?;
        check_timeout("response_timeout", self.response_timeout)
    }
}

/// Publishes events to Redis Streams with `XADD`, one pipelined round trip per batch.
///
/// Reports an event `Ok` only once Redis answered its `XADD` with the new entry id. A payload over
/// [`RedisPublisherConfig::max_payload_bytes`], a stream key that is empty or longer than
/// [`MAX_STREAM_KEY_LEN`], or a key that holds something other than a stream (`WRONGTYPE`) fails
/// permanently; everything else (connection lost, timeout, out of memory, read-only replica) fails
/// transiently and the relay retries it.
pub struct RedisPublisher {
    link: Link,
    destination: Destination,
    config: RedisPublisherConfig,
}

impl std::fmt::Debug for RedisPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPublisher")
            .field("url", &self.link.url)
            .field("destination", &self.destination.template())
            .field("config", &self.config)
            .finish()
    }
}

impl RedisPublisher {
    /// Connects to `url` (`redis://[user:password@]host:port[/db]` or `rediss://`) with the default
    /// [`RedisPublisherConfig`]; events go to the stream `destination` renders (for example
    /// `Destination::parse(DEFAULT_STREAM_TEMPLATE)`).
    ///
    /// A malformed URL or another broker's scheme is an [`Error::InvalidConfig`]; an unreachable server is
    /// an [`Error::Broker`].
    pub async fn connect(url: &str, destination: Destination) -> Result<Self> {
        Self::connect_with(url, destination, RedisPublisherConfig::default()).await
    }

    /// [`connect`](Self::connect) with explicit settings.
    pub async fn connect_with(url: &str, destination: Destination, config: RedisPublisherConfig) -> Result<Self> {
        config.validate()?;
        let link = Link::new(url, config.connect_timeout, config.response_timeout)?;
        link.get().await.map_err(|e| Error::broker(BROKER, format!("connect to {}", link.url), e))?;
        Ok(RedisPublisher { link, destination, config })
    }

    /// The stream key template.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    /// The settings.
    pub fn config(&self) -> &RedisPublisherConfig {
        &self.config
    }

    /// The `XADD` of `event` and its stream key, or why it can never be published.
    fn xadd(&self, event: &OutboxEvent) -> Result<(String, Cmd), PublishError> {
        let key = self.destination.render(event);
        check_stream_key("stream key", &key).map_err(|e| {
            PublishError::permanent(format!(
                "stream key rendered from template {:?} is invalid: {e}",
                self.destination.template()
            ))
        })?;
        if event.payload.len() > self.config.max_payload_bytes {
            return Err(PublishError::permanent(format!(
                "payload is {} bytes, over the Redis Streams publisher's max_payload_bytes of {}",
                event.payload.len(),
                self.config.max_payload_bytes
            )));
        }
        let mut cmd = ::redis::cmd("XADD");
        cmd.arg(&key);
        if let Some(max_len) = self.config.max_len {
            cmd.arg("MAXLEN").arg("~").arg(max_len);
        }
        cmd.arg("*");
        for (name, value) in envelope_headers(event) {
            cmd.arg(name).arg(value);
        }
        cmd.arg(PAYLOAD_FIELD).arg(event.payload.as_bytes());
        Ok((key, cmd))
    }

    #[tracing::instrument(
        name = "outbox.redis.publish",
        level = "debug",
        skip_all,
        fields(messaging.system = "redis", messaging.operation.name = "publish", messaging.batch.message_count = events.len())
    )]
    async fn publish_batch(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Result<(), PublishError>> = Vec::with_capacity(events.len());
        let mut pipe = ::redis::pipe();
        pipe.ignore_errors();
        // (index in `events`, stream key) of each XADD in the pipeline, in order.
        let mut sent: Vec<(usize, String)> = Vec::with_capacity(events.len());
        for (index, event) in events.iter().enumerate() {
            match self.xadd(event) {
                Ok((key, cmd)) => {
                    pipe.add_command(cmd);
                    sent.push((index, key));
                    results.push(Err(PublishError::transient("Redis did not answer this XADD")));
                }
                Err(error) => {
                    tracing::warn!(event_id = %event.id, %error, "event cannot be published to Redis Streams");
                    results.push(Err(error));
                }
            }
        }
        if sent.is_empty() {
            return results;
        }
        let wait = self.config.min_replicas > 0;
        if wait {
            pipe.cmd("WAIT").arg(self.config.min_replicas).arg(millis(self.config.replica_timeout));
        }
        let replies = match self.link.query_pipeline(&pipe).await {
            Ok(replies) if replies.len() == sent.len() + usize::from(wait) => replies,
            Ok(replies) => {
                let error = format!("Redis answered {} replies to {} commands", replies.len(), pipe.len());
                for (index, _) in &sent {
                    results[*index] = Err(PublishError::transient(error.clone()));
                }
                return results;
            }
            Err(error) => {
                tracing::warn!(%error, url = %self.link.url, "Redis Streams publish failed");
                let error = format!("Redis Streams did not confirm the XADD: {error}");
                for (index, _) in &sent {
                    results[*index] = Err(PublishError::transient(error.clone()));
                }
                return results;
            }
        };
        let unreplicated = if wait {
            match replies.last() {
                Some(Value::Int(n)) if *n >= i64::from(self.config.min_replicas) => None,
                other => Some(format!(
                    "Redis appended the entry but WAIT {} {} was answered {other:?}; it may not survive a failover",
                    self.config.min_replicas,
                    millis(self.config.replica_timeout)
                )),
            }
        } else {
            None
        };
        for ((index, key), reply) in sent.iter().zip(replies) {
            let event = &events[*index];
            results[*index] = match reply {
                Value::BulkString(_) | Value::SimpleString(_) | Value::VerbatimString { .. } => match &unreplicated {
                    None => Ok(()),
                    Some(error) => Err(PublishError::transient(error.clone())),
                },
                Value::ServerError(error) => {
                    let message = format!("XADD to stream {key:?} failed: {error}");
                    tracing::warn!(messaging.destination.name = %key, event_id = %event.id, %error, "Redis rejected an XADD");
                    if error.code() == "WRONGTYPE" {
                        Err(PublishError::permanent(format!("{message} (the key holds something other than a stream)")))
                    } else {
                        Err(PublishError::transient(message))
                    }
                }
                other => Err(PublishError::transient(format!("XADD to stream {key:?} was answered {other:?}"))),
            };
            if results[*index].is_ok() {
                tracing::trace!(messaging.destination.name = %key, event_id = %event.id, "event appended");
            }
        }
        results
    }
}

impl Publisher for RedisPublisher {
    fn publish(&self, events: &[OutboxEvent]) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send {
        self.publish_batch(events)
    }
}

// ---------------------------------------------------------------------------------------------------------
// Consumer
// ---------------------------------------------------------------------------------------------------------

/// Settings of a [`RedisConsumer`]. Build with [`RedisConsumerConfig::default`] and the `with_*` methods;
/// checked by [`RedisConsumer::connect_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConsumerConfig {
    /// Most entries read per `XREADGROUP` or `XAUTOCLAIM` (default 100).
    pub batch_size: usize,
    /// How long one `XREADGROUP` waits for new entries (default 250 ms); also bounds how long shutdown
    /// takes while idle.
    pub block: Duration,
    /// How long an entry must have been pending (unacked) before this consumer reclaims it (default 30 s):
    /// longer than the slowest handler, or entries still being handled are taken over.
    pub min_idle: Duration,
    /// How often pending entries are reclaimed with `XAUTOCLAIM` (default 5 s); also once at start.
    pub reclaim_interval: Duration,
    /// Deliveries after which an entry is parked instead of handled again (default 10).
    pub max_deliveries: u64,
    /// First pause after Redis failed; doubles while it keeps failing (default 250 ms).
    pub retry_delay: Duration,
    /// Longest pause between attempts while Redis keeps failing (default 30 s).
    pub max_retry_delay: Duration,
    /// Time allowed to open a connection (default 2 s).
    pub connect_timeout: Duration,
    /// Time allowed for Redis to answer, on top of [`block`](Self::block) (default 5 s).
    pub response_timeout: Duration,
}

impl Default for RedisConsumerConfig {
    fn default() -> Self {
        RedisConsumerConfig {
            batch_size: 100,
            block: Duration::from_millis(250),
            min_idle: Duration::from_secs(30),
            reclaim_interval: Duration::from_secs(5),
            max_deliveries: 10,
            retry_delay: Duration::from_millis(250),
            max_retry_delay: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
        }
    }
}

impl RedisConsumerConfig {
    /// Sets [`batch_size`](Self::batch_size).
    pub fn with_batch_size(mut self, entries: usize) -> Self {
        self.batch_size = entries;
        self
    }

    /// Sets [`block`](Self::block).
    pub fn with_block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Sets [`min_idle`](Self::min_idle).
    pub fn with_min_idle(mut self, min_idle: Duration) -> Self {
        self.min_idle = min_idle;
        self
    }

    /// Sets [`reclaim_interval`](Self::reclaim_interval).
    pub fn with_reclaim_interval(mut self, interval: Duration) -> Self {
        self.reclaim_interval = interval;
        self
    }

    /// Sets [`max_deliveries`](Self::max_deliveries).
    pub fn with_max_deliveries(mut self, deliveries: u64) -> Self {
        self.max_deliveries = deliveries;
        self
    }

    /// Sets [`retry_delay`](Self::retry_delay) and [`max_retry_delay`](Self::max_retry_delay).
    pub fn with_retry_delay(mut self, first: Duration, max: Duration) -> Self {
        self.retry_delay = first;
        self.max_retry_delay = max;
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`response_timeout`](Self::response_timeout).
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Checks the settings; an out-of-range value is an [`Error::InvalidConfig`].
    pub fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return Err(Error::invalid_config("batch_size", format!("is {}; expected 1 to 10000", self.batch_size)));
        }
        if self.block.is_zero() || self.block > Duration::from_secs(60) {
            // BLOCK 0 would wait forever and never notice a shutdown.
            return Err(Error::invalid_config("block", format!("is {:?}; expected 1 ms to 60 s", self.block)));
        }
        if self.max_deliveries == 0 {
            return Err(Error::invalid_config("max_deliveries", "is 0; expected at least 1"));
        }
        check_timeout("reclaim_interval", self.reclaim_interval)?;
        check_timeout("retry_delay", self.retry_delay)?;
        if self.max_retry_delay < self.retry_delay {
            return Err(Error::invalid_config(
                "max_retry_delay",
                format!("is {:?}, shorter than retry_delay {:?}", self.max_retry_delay, self.retry_delay),
            ));
        }
        check_timeout("connect_timeout", self.connect_timeout)?;
        check_timeout("response_timeout", self.response_timeout)
    }
}

/// The fields of a stream entry as received.
enum Fields {
    /// Field/value pairs in entry order.
    Present(Vec<(Vec<u8>, Vec<u8>)>),
    /// The entry was deleted (trimmed) while pending.
    Deleted,
    /// The reply could not be read as fields.
    Malformed(String),
}

struct Entry {
    id: String,
    fields: Fields,
}

fn bytes_of(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes().to_vec()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

fn string_of(value: &Value) -> Option<String> {
    bytes_of(value).and_then(|bytes| String::from_utf8(bytes).ok())
}

fn items_of(value: &Value) -> Option<&[Value]> {
    match value {
        Value::Array(items) | Value::Set(items) => Some(items),
        _ => None,
    }
}

fn unexpected(what: &str, value: &Value) -> RedisError {
    RedisError::from((
        ::redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("{what}: {}", truncate(&format!("{value:?}"), 200)),
    ))
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn parse_fields(value: &Value) -> Fields {
    let pairs: Vec<(&Value, &Value)> = match value {
        Value::Nil => return Fields::Deleted,
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        Value::Array(items) if items.len() % 2 == 0 => items.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
        other => {
            return Fields::Malformed(format!(
                "entry fields are not field/value pairs: {}",
                truncate(&format!("{other:?}"), 200)
            ));
        }
    };
    let mut fields = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        match (bytes_of(name), bytes_of(value)) {
            (Some(name), Some(value)) => fields.push((name, value)),
            _ => return Fields::Malformed("an entry field or value is not a string".to_owned()),
        }
    }
    Fields::Present(fields)
}

/// Entries of `[[id, fields], ...]`.
fn parse_entries(value: &Value) -> Result<Vec<Entry>, RedisError> {
    let items = match value {
        Value::Nil => return Ok(Vec::new()),
        other => items_of(other).ok_or_else(|| unexpected("stream entries", other))?,
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        match items_of(item) {
            Some([id, fields]) => {
                let id = string_of(id).ok_or_else(|| unexpected("stream entry id", id))?;
                entries.push(Entry { id, fields: parse_fields(fields) });
            }
            // Redis 6.2 answers XAUTOCLAIM with nil for an entry deleted while pending; 7.0 drops it.
            _ if matches!(item, Value::Nil) => {}
            _ => return Err(unexpected("stream entry", item)),
        }
    }
    Ok(entries)
}

/// The entries of an `XREADGROUP` reply for one stream: nil on timeout, `[[key, entries]]` (RESP2) or
/// `{key: entries}` (RESP3).
fn parse_read_reply(value: &Value) -> Result<Vec<Entry>, RedisError> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Map(streams) => {
            let mut entries = Vec::new();
            for (_, stream_entries) in streams {
                entries.extend(parse_entries(stream_entries)?);
            }
            Ok(entries)
        }
        other => {
            let streams = items_of(other).ok_or_else(|| unexpected("XREADGROUP reply", other))?;
            let mut entries = Vec::new();
            for stream in streams {
                match items_of(stream) {
                    Some([_, stream_entries]) => entries.extend(parse_entries(stream_entries)?),
                    _ => return Err(unexpected("XREADGROUP stream", stream)),
                }
            }
            Ok(entries)
        }
    }
}

/// `(next cursor, entries)` of an `XAUTOCLAIM` reply.
fn parse_autoclaim_reply(value: &Value) -> Result<(String, Vec<Entry>), RedisError> {
    match items_of(value) {
        Some([cursor, entries, ..]) => {
            let cursor = string_of(cursor).ok_or_else(|| unexpected("XAUTOCLAIM cursor", cursor))?;
            Ok((cursor, parse_entries(entries)?))
        }
        _ => Err(unexpected("XAUTOCLAIM reply", value)),
    }
}

/// Delivery counts by entry id from an extended `XPENDING` reply: `[[id, consumer, idle, deliveries], ...]`.
fn parse_pending_reply(value: &Value) -> HashMap<String, u64> {
    items_of(value)
        .unwrap_or_default()
        .iter()
        .filter_map(|item| match items_of(item) {
            Some([id, _, _, Value::Int(deliveries)]) => Some((string_of(id)?, u64::try_from(*deliveries).ok()?)),
            _ => None,
        })
        .collect()
}

/// Rebuilds the event of a stream entry: the last [`PAYLOAD_FIELD`] is the payload, every other field a
/// header. Anything else is an [`Error::InvalidEvent`].
fn decode_entry(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<OutboxEvent> {
    let payload_at = fields.iter().rposition(|(name, _)| name.as_slice() == PAYLOAD_FIELD.as_bytes());
    let mut headers = BTreeMap::new();
    for (position, (name, value)) in fields.iter().enumerate() {
        if Some(position) == payload_at {
            continue;
        }
        let name = std::str::from_utf8(name)
            .map_err(|e| Error::invalid_event("headers", format!("a stream entry field name is not UTF-8: {e}")))?;
        let value = std::str::from_utf8(value)
            .map_err(|e| Error::invalid_event("headers", format!("the value of field `{name}` is not UTF-8: {e}")))?;
        headers.insert(name.to_owned(), value.to_owned());
    }
    let payload_at = payload_at
        .ok_or_else(|| Error::invalid_event("payload", format!("the stream entry has no `{PAYLOAD_FIELD}` field")))?;
    decode_message(&headers, &fields[payload_at].1)
}

/// Why a consumer step stopped.
enum StepError {
    /// Redis failed; back off and go on.
    Redis(RedisError),
    /// Nothing will fix it without an operator.
    Fatal(Error),
}

impl From<RedisError> for StepError {
    fn from(error: RedisError) -> Self {
        StepError::Redis(error)
    }
}

/// Reads a stream through a consumer group and hands each entry to a [`MessageHandler`]: `XACK` after
/// [`Disposition::Ack`], left pending after [`Disposition::Retry`], copied to the dead-letter stream and
/// acked after [`Disposition::Park`] (and for entries that cannot be decoded or were delivered too often).
pub struct RedisConsumer {
    link: Link,
    stream: String,
    group: String,
    consumer: String,
    dead_stream: String,
    config: RedisConsumerConfig,
}

impl std::fmt::Debug for RedisConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConsumer")
            .field("url", &self.link.url)
            .field("stream", &self.stream)
            .field("group", &self.group)
            .field("consumer", &self.consumer)
            .field("config", &self.config)
            .finish()
    }
}

impl RedisConsumer {
    /// Connects to `url` as `consumer_name` of consumer group `group` on `stream`, with the default
    /// [`RedisConsumerConfig`]. Creates the group (and the stream, `MKSTREAM`) if missing, starting at
    /// the stream's first entry, so entries published before the first consumer ran are delivered too;
    /// an existing group is kept as it is.
    ///
    /// A malformed URL, another broker's scheme or an empty or over-long name is an
    /// [`Error::InvalidConfig`]; an unreachable server or a failed group creation is an [`Error::Broker`].
    pub async fn connect(url: &str, stream: &str, group: &str, consumer_name: &str) -> Result<Self> {
        Self::connect_with(url, stream, group, consumer_name, RedisConsumerConfig::default()).await
    }

    /// [`connect`](Self::connect) with explicit settings.
    pub async fn connect_with(
        url: &str,
        stream: &str,
        group: &str,
        consumer_name: &str,
        config: RedisConsumerConfig,
    ) -> Result<Self> {
        config.validate()?;
        check_stream_key("stream", stream)?;
        check_stream_key("group", group)?;
        check_stream_key("consumer_name", consumer_name)?;
        let link = Link::new(url, config.connect_timeout, config.response_timeout + config.block)?;
        link.get().await.map_err(|e| Error::broker(BROKER, format!("connect to {}", link.url), e))?;
        let consumer = RedisConsumer {
            link,
            stream: stream.to_owned(),
            group: group.to_owned(),
            consumer: consumer_name.to_owned(),
            dead_stream: format!("{stream}{DEAD_STREAM_SUFFIX}"),
            config,
        };
        consumer.ensure_group().await.map_err(|e| {
            Error::broker(
                BROKER,
                format!("create consumer group {:?} on stream {:?}", consumer.group, consumer.stream),
                e,
            )
        })?;
        Ok(consumer)
    }

    /// The stream read.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// This consumer's name in the group.
    pub fn consumer_name(&self) -> &str {
        &self.consumer
    }

    /// The stream parked entries are copied to: `<stream>:dead`.
    pub fn dead_letter_stream(&self) -> &str {
        &self.dead_stream
    }

    /// The settings.
    pub fn config(&self) -> &RedisConsumerConfig {
        &self.config
    }

    /// `XGROUP CREATE <stream> <group> 0 MKSTREAM`; an existing group (`BUSYGROUP`) is fine.
    async fn ensure_group(&self) -> Result<(), RedisError> {
        let mut cmd = ::redis::cmd("XGROUP");
        cmd.arg("CREATE").arg(&self.stream).arg(&self.group).arg("0").arg("MKSTREAM");
        match self.link.query(&cmd).await {
            Ok(_) => {
                tracing::debug!(messaging.system = "redis", messaging.destination.name = %self.stream, group = %self.group, "consumer group created");
                Ok(())
            }
            Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Handles entries until `shutdown` is cancelled: new entries with `XREADGROUP ... BLOCK`, and every
    /// [`reclaim_interval`](RedisConsumerConfig::reclaim_interval) (and once at start) the group's entries
    /// pending longer than [`min_idle`](RedisConsumerConfig::min_idle) with `XAUTOCLAIM`.
    ///
    /// Redis failures are logged and retried with backoff (the connection is reopened); a deleted group is
    /// created again. Returns `Ok(())` after shutdown, once the entry being handled is finished (entries
    /// read but not handled yet stay pending and are reclaimed later), or an [`Error::Broker`] when the
    /// stream key holds something other than a stream.
    #[tracing::instrument(
        name = "outbox.redis.consume",
        skip_all,
        fields(
            messaging.system = "redis",
            messaging.destination.name = %self.stream,
            messaging.consumer.group.name = %self.group,
            messaging.client.id = %self.consumer,
        )
    )]
    pub async fn run(&self, handler: impl MessageHandler, shutdown: CancellationToken) -> Result<()> {
        let mut next_reclaim = Instant::now();
        let mut failures: u32 = 0;
        while !shutdown.is_cancelled() {
            let step = if Instant::now() >= next_reclaim {
                next_reclaim = Instant::now() + self.config.reclaim_interval;
                self.reclaim(&handler, &shutdown).await
            } else {
                self.read_new(&handler, &shutdown).await
            };
            let error = match step {
                Ok(()) => {
                    failures = 0;
                    continue;
                }
                Err(StepError::Fatal(error)) => return Err(error),
                Err(StepError::Redis(error)) => error,
            };
            match error.code() {
                Some("WRONGTYPE") => {
                    return Err(Error::broker(
                        BROKER,
                        format!("read stream {:?} (the key holds something other than a stream)", self.stream),
                        error,
                    ));
                }
                Some("NOGROUP") => {
                    tracing::warn!(%error, "the consumer group or stream is gone; creating it again");
                    if let Err(error) = self.ensure_group().await {
                        tracing::warn!(%error, "cannot create the consumer group");
                    } else {
                        continue;
                    }
                }
                _ => {}
            }
            failures = failures.saturating_add(1);
            let delay = self
                .config
                .retry_delay
                .saturating_mul(1 << failures.saturating_sub(1).min(8))
                .min(self.config.max_retry_delay);
            tracing::warn!(%error, failures, retry_in = ?delay, "Redis Streams consumer failed; retrying");
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(delay) => {}
            }
        }
        tracing::debug!("Redis Streams consumer stopped");
        Ok(())
    }

    /// One `XREADGROUP` for new entries, each handled in order.
    async fn read_new(&self, handler: &impl MessageHandler, shutdown: &CancellationToken) -> Result<(), StepError> {
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.config.batch_size)
            .arg("BLOCK")
            .arg(millis(self.config.block).max(1))
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">");
        let reply = self.link.query(&cmd).await?;
        for entry in parse_read_reply(&reply)? {
            if shutdown.is_cancelled() {
                break;
            }
            self.process(entry, 1, handler).await?;
        }
        Ok(())
    }

    /// Claims and handles the group's entries pending longer than `min_idle`, a few pages at most.
    async fn reclaim(&self, handler: &impl MessageHandler, shutdown: &CancellationToken) -> Result<(), StepError> {
        let mut cursor = "0-0".to_owned();
        for _ in 0..10 {
            let mut cmd = ::redis::cmd("XAUTOCLAIM");
            cmd.arg(&self.stream)
                .arg(&self.group)
                .arg(&self.consumer)
                .arg(millis(self.config.min_idle))
                .arg(&cursor)
                .arg("COUNT")
                .arg(self.config.batch_size);
            let (next, entries) = parse_autoclaim_reply(&self.link.query(&cmd).await?)?;
            if let (Some(first), Some(last)) = (entries.first(), entries.last()) {
                tracing::debug!(entries = entries.len(), "reclaimed pending entries");
                let mut pending = ::redis::cmd("XPENDING");
                pending
                    .arg(&self.stream)
                    .arg(&self.group)
                    .arg(&first.id)
                    .arg(&last.id)
                    .arg(entries.len().saturating_mul(2))
                    .arg(&self.consumer);
                let deliveries = parse_pending_reply(&self.link.query(&pending).await?);
                for entry in entries {
                    if shutdown.is_cancelled() {
                        return Ok(());
                    }
                    let count = deliveries.get(&entry.id).copied().unwrap_or(1);
                    self.process(entry, count, handler).await?;
                }
            }
            if next == "0-0" || shutdown.is_cancelled() {
                break;
            }
            cursor = next;
        }
        Ok(())
    }

    /// Decodes and handles one entry delivered `deliveries` times, then acks, leaves or parks it.
    async fn process(&self, entry: Entry, deliveries: u64, handler: &impl MessageHandler) -> Result<(), StepError> {
        let fields = match entry.fields {
            Fields::Present(fields) => fields,
            Fields::Deleted => {
                tracing::warn!(messaging.message.id = %entry.id, "a pending entry was deleted (trimmed) before it was handled");
                return self.ack(&entry.id).await;
            }
            Fields::Malformed(reason) => return self.park(&entry.id, &[], &reason, deliveries).await,
        };
        if deliveries > self.config.max_deliveries {
            let reason = format!(
                "delivered {deliveries} times without being acknowledged (max_deliveries is {})",
                self.config.max_deliveries
            );
            return self.park(&entry.id, &fields, &reason, deliveries).await;
        }
        let event = match decode_entry(&fields) {
            Ok(event) => event,
            Err(error) => {
                return self.park(&entry.id, &fields, &format!("cannot decode the entry: {error}"), deliveries).await;
            }
        };
        let event_id = event.id;
        match crate::broker::handle_guarded(handler, event).await {
            Disposition::Ack => self.ack(&entry.id).await,
            Disposition::Retry => {
                tracing::debug!(messaging.message.id = %entry.id, %event_id, deliveries, "handler asked to retry; left pending");
                Ok(())
            }
            Disposition::Park => self.park(&entry.id, &fields, "the handler parked it", deliveries).await,
        }
    }

    async fn ack(&self, id: &str) -> Result<(), StepError> {
        let mut cmd = ::redis::cmd("XACK");
        cmd.arg(&self.stream).arg(&self.group).arg(id);
        self.link.query(&cmd).await?;
        Ok(())
    }

    /// Copies an entry to the dead-letter stream with the reason, then acks it. The copy comes first and
    /// the ack only after it succeeded, so a failure in between parks it twice rather than losing it.
    async fn park(
        &self,
        id: &str,
        fields: &[(Vec<u8>, Vec<u8>)],
        reason: &str,
        deliveries: u64,
    ) -> Result<(), StepError> {
        let mut cmd = ::redis::cmd("XADD");
        cmd.arg(&self.dead_stream).arg("*");
        for (name, value) in fields {
            cmd.arg(name.as_slice()).arg(value.as_slice());
        }
        cmd.arg(dead_field::REASON)
            .arg(reason)
            .arg(dead_field::ENTRY_ID)
            .arg(id)
            .arg(dead_field::STREAM)
            .arg(&self.stream)
            .arg(dead_field::GROUP)
            .arg(&self.group)
            .arg(dead_field::CONSUMER)
            .arg(&self.consumer)
            .arg(dead_field::DELIVERIES)
            .arg(deliveries);
        match self.link.query(&cmd).await {
            Ok(_) => {}
            Err(error) if error.code() == Some("WRONGTYPE") => {
                return Err(StepError::Fatal(Error::broker(
                    BROKER,
                    format!("park entry {id} in {:?} (the key holds something other than a stream)", self.dead_stream),
                    error,
                )));
            }
            Err(error) => return Err(error.into()),
        }
        tracing::warn!(messaging.message.id = %id, dead_letter_stream = %self.dead_stream, reason, "entry parked in the dead-letter stream");
        self.ack(id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(redact("redis://user:secret@host:6379/0"), "redis://***@host:6379/0");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact("redis://:p@ss@host/1?x=y"), "redis://***@host/1?x=y");
    }

    #[test]
    fn urls_of_other_brokers_and_malformed_urls_are_config_errors() {
        for url in ["nats://127.0.0.1:4222", "mqtt://h", "redis://", "127.0.0.1:6379", "redis://:1"] {
            let error = open_client(url).map(|_| ()).unwrap_err();
            assert!(matches!(error, Error::InvalidConfig { field: "broker_url", .. }), "{url}: {error}");
        }
        assert!(open_client("redis://127.0.0.1:6379/0").is_ok());
    }

    #[test]
    fn entries_round_trip_and_the_last_payload_field_wins() {
        let event = OutboxEvent {
            seq: 3,
            aggregate_version: 1,
            id: crate::EventId::new(),
            aggregate_type: "order".into(),
            aggregate_id: "o-1".into(),
            event_type: "order.placed".into(),
            schema_version: 1,
            payload: r#"{"n":1}"#.into(),
            headers: [("payload".to_owned(), "a user header".to_owned())].into(),
            created_at: chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap_or_default(),
            attempts: 0,
            last_error: None,
        };
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> =
            envelope_headers(&event).into_iter().map(|(k, v)| (k.into_bytes(), v.into_bytes())).collect();
        fields.push((PAYLOAD_FIELD.into(), event.payload.clone().into_bytes()));
        assert_eq!(decode_entry(&fields).unwrap(), event);
        let error = decode_entry(&[(b"foo".to_vec(), b"bar".to_vec())]).unwrap_err();
        assert!(matches!(error, Error::InvalidEvent { .. }), "{error}");
    }

    #[test]
    fn replies_are_parsed_without_panicking_on_odd_shapes() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("s"),
            Value::Array(vec![
                Value::Array(vec![bulk("1-0"), Value::Array(vec![bulk("a"), bulk("b")])]),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
                Value::Array(vec![bulk("3-0"), Value::Array(vec![bulk("odd")])]),
            ]),
        ])]);
        let entries = parse_read_reply(&reply).unwrap();
        assert_eq!(entries.len(), 3);
        assert!(matches!(entries[0].fields, Fields::Present(ref f) if f.len() == 1));
        assert!(matches!(entries[1].fields, Fields::Deleted));
        assert!(matches!(entries[2].fields, Fields::Malformed(_)));
        let resp3 = Value::Map(vec![(
            bulk("s"),
            Value::Array(vec![Value::Array(vec![bulk("4-0"), Value::Array(vec![bulk("a"), bulk("b")])])]),
        )]);
        assert_eq!(parse_read_reply(&resp3).unwrap()[0].id, "4-0");
        assert!(parse_read_reply(&Value::Nil).unwrap().is_empty());
        assert!(parse_read_reply(&Value::Int(3)).is_err());
        assert!(parse_autoclaim_reply(&Value::Array(vec![bulk("0-0")])).is_err());
        let pending = Value::Array(vec![Value::Array(vec![bulk("1-0"), bulk("c"), Value::Int(5), Value::Int(3)])]);
        assert_eq!(parse_pending_reply(&pending).get("1-0"), Some(&3));
    }

    #[test]
    fn configs_are_checked() {
        assert!(RedisPublisherConfig::default().validate().is_ok());
        assert!(RedisPublisherConfig::default().with_max_payload_bytes(0).validate().is_err());
        assert!(RedisPublisherConfig::default().with_max_payload_bytes(REDIS_MAX_VALUE_BYTES + 1).validate().is_err());
        assert!(RedisPublisherConfig::default().with_max_len(0).validate().is_err());
        assert!(RedisConsumerConfig::default().validate().is_ok());
        assert!(RedisConsumerConfig::default().with_block(Duration::ZERO).validate().is_err());
        assert!(RedisConsumerConfig::default().with_max_deliveries(0).validate().is_err());
        assert!(RedisConsumerConfig::default().with_batch_size(0).validate().is_err());
    }
}

//! Settings of the publisher and the transport, and the naming rules of stream keys.

use std::time::Duration;

use crate::error::{Error, Result};

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

/// The suffix of a stream's default dead-letter stream: `<stream>:dead`.
pub const DEAD_STREAM_SUFFIX: &str = ":dead";

/// Fields a transport adds to a dead letter next to the
/// [`DeadLetter::headers`](crate::consume::DeadLetter::headers) (stripped on replay, like them).
pub mod dead_field {
    /// The entry's id in the source stream.
    pub const ENTRY_ID: &str = "outbox_dead_entry_id";
    /// The consumer group that dead-lettered it.
    pub const GROUP: &str = "outbox_dead_group";
}

pub(super) fn check_stream_key(field: &'static str, key: &str) -> Result<()> {
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

pub(super) fn check_timeout(field: &'static str, value: Duration) -> Result<()> {
    if value.is_zero() {
        return Err(Error::invalid_config(field, "must be more than zero"));
    }
    Ok(())
}

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Settings of a [`RedisPublisher`](super::RedisPublisher). Build with [`RedisPublisherConfig::default`] and the `with_*` methods;
/// checked by [`RedisPublisher::connect_with`](super::RedisPublisher::connect_with).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisPublisherConfig {
    /// Largest payload published, in bytes (default [`DEFAULT_MAX_ENTRY_PAYLOAD_BYTES`], at most
    /// [`REDIS_MAX_VALUE_BYTES`]). A larger event fails permanently: it goes to the dead letters.
    pub max_payload_bytes: usize,
    /// Trim each stream to about this many entries on every `XADD` (`MAXLEN ~ n`). `None`, the default,
    /// never trims.
    ///
    /// **Trimming can lose events.** Redis 7.0 trims by count alone: it deletes the oldest entries
    /// whether or not every consumer group has read and acknowledged them, so an entry no consumer has
    /// applied yet (a consumer down, slow, or retrying) can be deleted, and an entry pending in a group is
    /// then delivered as deleted, with nothing to apply. Opt in only when losing events past the limit is
    /// acceptable, with a limit far above any backlog; otherwise trim acknowledged entries yourself
    /// (`XTRIM MINID` below the oldest entry every group has acknowledged).
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
    /// Whether an `XADD` may create its stream (default `false`). Redis creates a missing stream silently,
    /// so an event sent to a key no consumer group reads (a destination template that renders another key
    /// than the consumers', a typo) would count as published and never be read. By default the publisher
    /// appends only to streams that exist (`XADD … NOMKSTREAM`; a consumer's transport creates its stream
    /// with its group), and a missing stream fails the event transiently: it stays pending, the relay logs
    /// why and retries it with backoff, and it goes out once a consumer has created the group (which reads
    /// from the stream's start). Set it for streams that are meant to be created by the first event.
    pub create_streams: bool,
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
            create_streams: false,
        }
    }
}

impl RedisPublisherConfig {
    /// Sets [`max_payload_bytes`](Self::max_payload_bytes).
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Turns trimming on: see [`max_len`](Self::max_len) for why this can delete entries that no consumer
    /// group has read.
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

    /// Lets an `XADD` create a missing stream: see [`create_streams`](Self::create_streams) for why that is
    /// off by default.
    pub fn with_create_streams(mut self, create: bool) -> Self {
        self.create_streams = create;
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

/// Settings of a [`RedisTransport`](super::RedisTransport). Build with [`RedisTransportConfig::default`]
/// and the `with_*` methods; checked when the transport connects.
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::brokers::redis::RedisTransportConfig;
///
/// let config = RedisTransportConfig::default().with_min_idle(Duration::from_secs(60));
/// assert!(config.validate().is_ok());
/// assert!(RedisTransportConfig::default().with_dead_letter_stream("").validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisTransportConfig {
    /// How long an entry of another consumer of the group must have been pending without a sign of life
    /// before this one claims it with `XAUTOCLAIM` (default 30 s, at least 100 ms). The transport resets
    /// the idle time of every entry it holds at a third of this, so only entries of a consumer that died
    /// (or lost Redis for that long) are taken over.
    pub min_idle: Duration,
    /// How often the group's idle entries are claimed (default 5 s); also at start.
    pub reclaim_interval: Duration,
    /// Longest `BLOCK` of one `XREADGROUP` (default 2 s); the driver's fetch wait is capped by it.
    pub max_block: Duration,
    /// The stream dead letters are appended to (default `<stream>:dead`).
    pub dead_letter_stream: Option<String>,
    /// Time allowed to open a connection (default 2 s).
    pub connect_timeout: Duration,
    /// Time allowed for Redis to answer, on top of a read's `BLOCK` (default 5 s).
    pub response_timeout: Duration,
}

impl Default for RedisTransportConfig {
    fn default() -> Self {
        RedisTransportConfig {
            min_idle: Duration::from_secs(30),
            reclaim_interval: Duration::from_secs(5),
            max_block: Duration::from_secs(2),
            dead_letter_stream: None,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
        }
    }
}

impl RedisTransportConfig {
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

    /// Sets [`max_block`](Self::max_block).
    pub fn with_max_block(mut self, block: Duration) -> Self {
        self.max_block = block;
        self
    }

    /// Sets [`dead_letter_stream`](Self::dead_letter_stream).
    pub fn with_dead_letter_stream(mut self, stream: &str) -> Self {
        self.dead_letter_stream = Some(stream.to_owned());
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

    /// The dead-letter stream of `stream`: the configured one, or `<stream>:dead`.
    pub fn dead_letter_stream_for(&self, stream: &str) -> String {
        self.dead_letter_stream.clone().unwrap_or_else(|| format!("{stream}{DEAD_STREAM_SUFFIX}"))
    }

    /// Checks the settings; an out-of-range value or an invalid dead-letter stream key is an
    /// [`Error::InvalidConfig`] naming the setting.
    pub fn validate(&self) -> Result<()> {
        if self.min_idle < Duration::from_millis(100) {
            return Err(Error::invalid_config("min_idle", format!("is {:?}; expected at least 100 ms", self.min_idle)));
        }
        check_timeout("reclaim_interval", self.reclaim_interval)?;
        if self.max_block.is_zero() || self.max_block > Duration::from_secs(60) {
            // BLOCK 0 would wait forever and never notice a shutdown.
            return Err(Error::invalid_config("max_block", format!("is {:?}; expected 1 ms to 60 s", self.max_block)));
        }
        if let Some(stream) = &self.dead_letter_stream {
            check_stream_key("dead_letter_stream", stream)?;
        }
        check_timeout("connect_timeout", self.connect_timeout)?;
        check_timeout("response_timeout", self.response_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked() {
        assert!(RedisPublisherConfig::default().validate().is_ok());
        assert_eq!(RedisPublisherConfig::default().max_len, None, "the publisher never trims by default");
        assert!(RedisPublisherConfig::default().with_max_payload_bytes(0).validate().is_err());
        assert!(RedisPublisherConfig::default().with_max_payload_bytes(REDIS_MAX_VALUE_BYTES + 1).validate().is_err());
        assert!(RedisPublisherConfig::default().with_max_len(0).validate().is_err());
        let t = RedisTransportConfig::default();
        assert!(t.validate().is_ok());
        assert_eq!(t.dead_letter_stream_for("outbox:order"), "outbox:order:dead");
        assert!(t.clone().with_max_block(Duration::ZERO).validate().is_err());
        assert!(t.clone().with_min_idle(Duration::from_millis(10)).validate().is_err());
        let long = "d".repeat(MAX_STREAM_KEY_LEN + 1);
        let err = t.clone().with_dead_letter_stream(&long).validate().unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { field: "dead_letter_stream", .. }), "{err}");
    }
}

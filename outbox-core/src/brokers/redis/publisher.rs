//! [`RedisPublisher`]: one pipelined round trip of `XADD`s per batch, each reported on its own.

use std::sync::Arc;

use ::redis::{Cmd, Value};

use crate::broker::{Destination, envelope_headers};
use crate::envelope::OutboxEvent;
use crate::error::{Error, Result};
use crate::publisher::{PublishError, Publisher};

use super::BROKER;
use super::config::{PAYLOAD_FIELD, RedisPublisherConfig, check_stream_key, millis};
use super::link::Link;

/// Publishes events to Redis Streams with `XADD`, one pipelined round trip per batch.
///
/// Reports an event `Ok` only once Redis answered its `XADD` with the new entry id. A payload over
/// [`RedisPublisherConfig::max_payload_bytes`], a stream key that is empty or longer than
/// [`MAX_STREAM_KEY_LEN`](super::MAX_STREAM_KEY_LEN), or a key that holds something other than a stream
/// (`WRONGTYPE`) fails permanently; a stream that does not exist (unless
/// [`RedisPublisherConfig::create_streams`]) and everything else (connection lost, timeout, out of memory,
/// read-only replica) fails transiently and the relay retries it.
///
/// Cheap to clone (clones share the connection).
#[derive(Clone)]
pub struct RedisPublisher {
    link: Arc<Link>,
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
        Ok(RedisPublisher { link: Arc::new(link), destination, config })
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
        if !self.config.create_streams {
            cmd.arg("NOMKSTREAM");
        }
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
                Value::Nil => {
                    tracing::warn!(
                        messaging.destination.name = %key,
                        event_id = %event.id,
                        "the stream does not exist, so no consumer group reads it; the event stays pending"
                    );
                    Err(PublishError::transient(format!(
                        "stream {key:?} does not exist, so no consumer group reads it: the event was not \
                         published (XADD NOMKSTREAM). Start its consumer (which creates the stream with its \
                         group), point the destination template {:?} at the stream your consumers read, or let \
                         the publisher create streams (RedisPublisherConfig::with_create_streams)",
                        self.destination.template()
                    )))
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
    fn system(&self) -> &'static str {
        "redis"
    }

    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        Some(self.destination.render(event))
    }

    fn publish(&self, events: &[OutboxEvent]) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send {
        self.publish_batch(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publisher(config: RedisPublisherConfig) -> RedisPublisher {
        let link = Link::new("redis://127.0.0.1:6379", config.connect_timeout, config.response_timeout).unwrap();
        RedisPublisher {
            link: Arc::new(link),
            destination: Destination::parse("outbox:{aggregate_type}").unwrap(),
            config,
        }
    }

    fn event() -> OutboxEvent {
        OutboxEvent {
            seq: 1,
            aggregate_version: 1,
            id: crate::EventId::new(),
            aggregate_type: "order".into(),
            aggregate_id: "o-1".into(),
            event_type: "order.placed".into(),
            schema_version: 1,
            payload: "{}".into(),
            headers: Default::default(),
            created_at: chrono::Utc::now(),
            attempts: 0,
            last_error: None,
        }
    }

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                ::redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn the_default_publisher_never_trims_and_trimming_is_opt_in() {
        let (key, cmd) = publisher(RedisPublisherConfig::default()).xadd(&event()).unwrap();
        assert_eq!(key, "outbox:order");
        let plain = args(&cmd);
        assert_eq!(plain[..4], ["XADD", "outbox:order", "NOMKSTREAM", "*"], "no MAXLEN by default: {plain:?}");
        assert!(!plain.iter().any(|a| a.eq_ignore_ascii_case("MAXLEN")), "{plain:?}");
        let (_, cmd) = publisher(RedisPublisherConfig::default().with_max_len(100)).xadd(&event()).unwrap();
        assert_eq!(args(&cmd)[..7], ["XADD", "outbox:order", "NOMKSTREAM", "MAXLEN", "~", "100", "*"]);
    }

    #[test]
    fn the_default_publisher_appends_only_to_existing_streams() {
        let (_, cmd) = publisher(RedisPublisherConfig::default()).xadd(&event()).unwrap();
        assert!(args(&cmd).iter().any(|a| a == "NOMKSTREAM"), "{:?}", args(&cmd));
        let creating = RedisPublisherConfig::default().with_create_streams(true);
        let (_, cmd) = publisher(creating).xadd(&event()).unwrap();
        assert_eq!(args(&cmd)[..3], ["XADD", "outbox:order", "*"], "opted in: the XADD may create the stream");
    }
}

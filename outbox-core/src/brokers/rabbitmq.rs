//! RabbitMQ adapter (feature `rabbitmq`, [lapin]): a [`RabbitPublisher`] with publisher confirms and
//! mandatory routing, and a manual-ack [`RabbitConsumer`].
//!
//! **Publishing.** Every event becomes one persistent message (`delivery_mode` 2) on one exchange, with the
//! routing key rendered from a [`Destination`] template (default [`DEFAULT_ROUTING_KEY`]), the event id as
//! `message_id`, `content_type` `application/json` and the [`envelope_headers`] as AMQP headers (long
//! strings). A batch is sent in one go on a confirm channel, then every confirm is awaited: an event is `Ok`
//! only once RabbitMQ acked it. Messages are `mandatory`: a message no queue is bound for is still acked by
//! RabbitMQ, but it comes back as a *return* first, so the adapter checks returns, not only acks, and reports
//! such an event as a transient failure (`unroutable: ...`): the row stays pending and is retried after its
//! backoff, so nothing is dropped while a binding is missing. A routing key over [`MAX_ROUTING_KEY_LEN`]
//! bytes or a payload over the configured maximum is a permanent failure (the row goes to the dead letters).
//! When the connection or channel is gone, the next batch reconnects.
//!
//! **Consuming.** [`RabbitConsumer::run`] takes one message at a time (with a prefetch window), hands it to
//! the [`MessageHandler`] and acks it only after the handler returned [`Disposition::Ack`] (the handler
//! returns it after its database commit). [`Disposition::Retry`] nacks it with `requeue = true` after a
//! short delay; [`Disposition::Park`], and a message without a valid envelope, nack it with
//! `requeue = false`: RabbitMQ moves it to the queue's dead-letter exchange if one is configured (see
//! [`RabbitPublisher::declare_queue_with_dead_letters`]) and drops it otherwise. RabbitMQ has no
//! publish-side dedup: a message published twice (lost confirm) is delivered twice and the consumer's inbox
//! drops the duplicate.
//!
//! ```no_run
//! # async fn demo() -> outbox_core::Result<()> {
//! use outbox_core::Destination;
//! use outbox_core::brokers::rabbitmq::{DEFAULT_ROUTING_KEY, RabbitPublisher};
//! let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! let publisher = RabbitPublisher::connect(url, "events", Destination::parse(DEFAULT_ROUTING_KEY)?).await?;
//! publisher.declare_queue("events", "billing", "order.#").await?;
//! # Ok(()) }
//! ```

pub use lapin;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::{BasicReturnMessage, Delivery};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::broker::{Destination, Disposition, MessageHandler, decode_message, envelope_headers};
use crate::brokers::BrokerKind;
use crate::envelope::OutboxEvent;
use crate::error::{Error, Result};
use crate::publisher::{PublishError, Publisher};

const BROKER: &str = "RabbitMQ";

/// The default routing-key template: `"{aggregate_type}.{event_type}"`, e.g. `order.order.placed`, which a
/// topic binding such as `order.#` matches.
pub const DEFAULT_ROUTING_KEY: &str = "{aggregate_type}.{event_type}";

/// The longest routing key, exchange or queue name AMQP 0-9-1 can carry (a short string), in bytes.
pub const MAX_ROUTING_KEY_LEN: usize = 255;

/// The default largest payload the publisher sends: 16 MiB. RabbitMQ's own limit (`max_message_size`) is
/// 128 MiB in recent versions; messages that large hurt a broker long before that.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The default prefetch window of a [`RabbitConsumer`]: how many unacked messages RabbitMQ sends ahead.
pub const DEFAULT_PREFETCH: u16 = 32;

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(1);
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(30);

/// A parsed broker URL and its printable form (without credentials).
#[derive(Clone)]
struct Endpoint {
    uri: AMQPUri,
    display: String,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

impl Endpoint {
    /// Checks `url` before any connection attempt: an AMQP scheme, a host, a valid port and vhost.
    fn parse(url: &str) -> Result<Self> {
        let kind = BrokerKind::from_url(url)?;
        if kind != BrokerKind::RabbitMq {
            return Err(Error::invalid_config(
                "broker_url",
                format!(
                    "is a {kind:?} URL ({}); the RabbitMQ adapter expects amqp://user:pass@host:5672/%2f",
                    redact(url)
                ),
            ));
        }
        let mut uri: AMQPUri = url.parse().map_err(|e: String| {
            Error::invalid_config("broker_url", format!("{} is not a valid AMQP URL: {e}", redact(url)))
        })?;
        if uri.scheme == AMQPScheme::AMQPS {
            return Err(Error::invalid_config(
                "broker_url",
                format!(
                    "{} uses amqps://, but this build of the RabbitMQ adapter has no TLS support (lapin without a TLS feature); use amqp:// or add a lapin TLS feature",
                    redact(url)
                ),
            ));
        }
        // amq-protocol-uri only keeps *domain* hosts and turns an IP literal into `localhost`: keep the IP.
        if let Some(ip) = literal_ip_host(url) {
            uri.authority.host = ip;
        }
        let display = format!("amqp://{}:{}/{}", uri.authority.host, uri.authority.port, encode_vhost(&uri.vhost));
        Ok(Endpoint { uri, display })
    }

    /// Opens a connection, bounded by `timeout`.
    async fn open(&self, name: &str, timeout: Duration) -> Result<Connection> {
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        match tokio::time::timeout(timeout, Connection::connect_uri(self.uri.clone(), properties)).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(Error::broker(BROKER, format!("connect to {}", self.display), e)),
            Err(_) => Err(Error::broker(
                BROKER,
                format!("connect to {}", self.display),
                format!("no connection within {timeout:?}"),
            )),
        }
    }
}

/// `url` with its password replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// The host of `url` when it is an IPv4 or IPv6 literal.
fn literal_ip_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?;
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => host_port.split(':').next()?,
    };
    host.parse::<std::net::IpAddr>().ok().map(|ip| ip.to_string())
}

fn encode_vhost(vhost: &str) -> String {
    vhost.replace('%', "%25").replace('/', "%2f")
}

/// Checks an exchange, queue or consumer-tag name.
fn check_name(field: &'static str, name: &str, allow_empty: bool) -> Result<()> {
    if name.is_empty() && !allow_empty {
        return Err(Error::invalid_config(field, "is empty"));
    }
    if name.len() > MAX_ROUTING_KEY_LEN {
        return Err(Error::invalid_config(
            field,
            format!("is {} bytes; AMQP allows at most {MAX_ROUTING_KEY_LEN}", name.len()),
        ));
    }
    Ok(())
}

/// A name already checked by [`check_name`] (or the first bytes of one that was not, which never happens).
fn short(name: &str) -> ShortString {
    ShortString::try_new(name).unwrap_or_else(|_| ShortString::from(truncate(name, MAX_ROUTING_KEY_LEN)))
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn exchange_label(exchange: &str) -> String {
    if exchange.is_empty() { "\"\" (the default exchange)".to_owned() } else { format!("{exchange:?}") }
}

/// One open connection with a confirm channel on it.
struct Link {
    connection: Connection,
    channel: Channel,
}

impl Link {
    fn usable(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }
}

/// Marks the publisher's link stale if a publish is dropped half-way (the relay's publish timeout): the
/// channel may still owe confirms, so the next batch starts on a fresh connection.
struct InFlight<'a> {
    stale: &'a AtomicBool,
    armed: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.stale.store(true, Ordering::SeqCst);
        }
    }
}

/// One event ready to send.
struct Outgoing {
    index: usize,
    routing_key: ShortString,
    properties: BasicProperties,
}

/// Publishes outbox events to one RabbitMQ exchange with publisher confirms; see the [module docs](self).
///
/// Batches are sent one at a time (a returned message is matched to its event by `message_id`, which needs
/// the channel to itself); the connection is opened by [`connect`](Self::connect) and reopened lazily by the
/// next batch after it broke.
pub struct RabbitPublisher {
    endpoint: Endpoint,
    exchange: String,
    routing_key: Destination,
    max_message_bytes: usize,
    connect_timeout: Duration,
    confirm_timeout: Duration,
    link: Mutex<Option<Link>>,
    stale: AtomicBool,
}

impl fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisher")
            .field("endpoint", &self.endpoint)
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key.template())
            .field("max_message_bytes", &self.max_message_bytes)
            .finish_non_exhaustive()
    }
}

impl RabbitPublisher {
    /// Connects to `url` (`amqp://user:pass@host:5672/%2f`) and opens a confirm channel. Events go to
    /// `exchange` (`""` is the default exchange, which routes to the queue named by the routing key) with the
    /// routing key rendered from `routing_key` (e.g. `Destination::parse(DEFAULT_ROUTING_KEY)`).
    ///
    /// A malformed URL, another broker's scheme, `amqps://` (no TLS in this build) or an exchange name over
    /// 255 bytes is an [`Error::InvalidConfig`]; an unreachable broker or refused login an [`Error::Broker`].
    /// The exchange is not declared here: see [`declare_queue`](Self::declare_queue).
    pub async fn connect(url: &str, exchange: &str, routing_key: Destination) -> Result<Self> {
        let endpoint = Endpoint::parse(url)?;
        check_name("exchange", exchange, true)?;
        let publisher = RabbitPublisher {
            endpoint,
            exchange: exchange.to_owned(),
            routing_key,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            link: Mutex::new(None),
            stale: AtomicBool::new(false),
        };
        let link = publisher.open_link().await?;
        *publisher.link.lock().await = Some(link);
        Ok(publisher)
    }

    /// Sets the largest payload sent (default [`DEFAULT_MAX_MESSAGE_BYTES`]); a larger event fails
    /// permanently. Keep it at or below the broker's `max_message_size`.
    pub fn with_max_message_bytes(mut self, max: usize) -> Self {
        self.max_message_bytes = max;
        self
    }

    /// Sets how long a batch waits for its confirms (default 5 s); unconfirmed events are retried later and
    /// the next batch starts on a fresh connection. Keep it below the relay's `publish_timeout`.
    pub fn with_confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// Sets how long opening (or reopening) the connection may take (default 5 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The exchange events are published to.
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// The routing-key template.
    pub fn routing_key(&self) -> &Destination {
        &self.routing_key
    }

    /// The broker address, without credentials.
    pub fn endpoint(&self) -> &str {
        &self.endpoint.display
    }

    /// Declares a durable topic `exchange` (idempotent; a no-op for the default exchange `""`).
    pub async fn declare_exchange(&self, exchange: &str) -> Result<()> {
        check_name("exchange", exchange, true)?;
        if exchange.is_empty() {
            return Ok(());
        }
        let channel = self.topology_channel().await?;
        channel
            .exchange_declare(
                short(exchange),
                ExchangeKind::Topic,
                ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::broker(BROKER, format!("declare topic exchange {exchange:?}"), e))?;
        close_quietly(&channel).await;
        Ok(())
    }

    /// Declares a durable topic `exchange`, a durable `queue` and binds them with `binding_key` (a topic
    /// pattern such as `order.#`). Idempotent; declaring an existing queue with other arguments fails.
    pub async fn declare_queue(&self, exchange: &str, queue: &str, binding_key: &str) -> Result<()> {
        self.declare(exchange, queue, binding_key, FieldTable::default()).await
    }

    /// Like [`declare_queue`](Self::declare_queue), and dead-letters the queue into `dead_letter_queue`
    /// (declared too, through the default exchange): what a consumer parks lands there instead of being
    /// dropped.
    pub async fn declare_queue_with_dead_letters(
        &self,
        exchange: &str,
        queue: &str,
        binding_key: &str,
        dead_letter_queue: &str,
    ) -> Result<()> {
        check_name("dead_letter_queue", dead_letter_queue, false)?;
        let channel = self.topology_channel().await?;
        channel
            .queue_declare(short(dead_letter_queue), durable_queue(), FieldTable::default())
            .await
            .map_err(|e| Error::broker(BROKER, format!("declare dead-letter queue {dead_letter_queue:?}"), e))?;
        close_quietly(&channel).await;
        let mut arguments = FieldTable::default();
        arguments.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        arguments.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(dead_letter_queue.into()));
        self.declare(exchange, queue, binding_key, arguments).await
    }

    async fn declare(&self, exchange: &str, queue: &str, binding_key: &str, arguments: FieldTable) -> Result<()> {
        check_name("queue", queue, false)?;
        check_name("binding_key", binding_key, true)?;
        self.declare_exchange(exchange).await?;
        let channel = self.topology_channel().await?;
        channel
            .queue_declare(short(queue), durable_queue(), arguments)
            .await
            .map_err(|e| Error::broker(BROKER, format!("declare queue {queue:?}"), e))?;
        if !exchange.is_empty() {
            channel
                .queue_bind(
                    short(queue),
                    short(exchange),
                    short(binding_key),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    Error::broker(BROKER, format!("bind queue {queue:?} to {exchange:?} with {binding_key:?}"), e)
                })?;
        }
        close_quietly(&channel).await;
        Ok(())
    }

    /// How many ready messages `queue` holds (not counting delivered, unacked ones).
    pub async fn message_count(&self, queue: &str) -> Result<u32> {
        check_name("queue", queue, false)?;
        let channel = self.topology_channel().await?;
        let declared = channel
            .queue_declare(
                short(queue),
                QueueDeclareOptions { passive: true, ..durable_queue() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::broker(BROKER, format!("inspect queue {queue:?}"), e))?;
        close_quietly(&channel).await;
        Ok(declared.message_count())
    }

    /// Deletes `queue` and the messages in it (for tests and teardown).
    pub async fn delete_queue(&self, queue: &str) -> Result<()> {
        check_name("queue", queue, false)?;
        let channel = self.topology_channel().await?;
        channel
            .queue_delete(short(queue), QueueDeleteOptions::default())
            .await
            .map_err(|e| Error::broker(BROKER, format!("delete queue {queue:?}"), e))?;
        close_quietly(&channel).await;
        Ok(())
    }

    /// Deletes `exchange` (for tests and teardown).
    pub async fn delete_exchange(&self, exchange: &str) -> Result<()> {
        check_name("exchange", exchange, false)?;
        let channel = self.topology_channel().await?;
        channel
            .exchange_delete(short(exchange), ExchangeDeleteOptions::default())
            .await
            .map_err(|e| Error::broker(BROKER, format!("delete exchange {exchange:?}"), e))?;
        close_quietly(&channel).await;
        Ok(())
    }

    /// A fresh channel for declarations, so a failed one (which closes its channel) never takes the publish
    /// channel down.
    async fn topology_channel(&self) -> Result<Channel> {
        let mut link = self.link.lock().await;
        self.ensure_link(&mut link).await?;
        let Some(link) = link.as_ref() else {
            return Err(Error::broker(BROKER, format!("connect to {}", self.endpoint.display), "no connection"));
        };
        link.connection
            .create_channel()
            .await
            .map_err(|e| Error::broker(BROKER, format!("open a channel on {}", self.endpoint.display), e))
    }

    async fn open_link(&self) -> Result<Link> {
        let connection = self.endpoint.open("outbox-relay", self.connect_timeout).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| Error::broker(BROKER, format!("open a channel on {}", self.endpoint.display), e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| Error::broker(BROKER, "enable publisher confirms", e))?;
        Ok(Link { connection, channel })
    }

    /// Reopens the link when it is missing, closed, or stale.
    async fn ensure_link(&self, link: &mut Option<Link>) -> Result<()> {
        let stale = self.stale.swap(false, Ordering::SeqCst);
        if !stale && link.as_ref().is_some_and(Link::usable) {
            return Ok(());
        }
        if let Some(old) = link.take() {
            tracing::info!(
                messaging.system = "rabbitmq",
                endpoint = %self.endpoint.display,
                stale,
                "RabbitMQ connection lost or stale; reconnecting"
            );
            // Best effort, bounded: the old connection may already be dead.
            let _ = tokio::time::timeout(Duration::from_millis(200), old.connection.close(200, "OK".into())).await;
        }
        *link = Some(self.open_link().await?);
        Ok(())
    }

    /// Checks one event and builds its message properties.
    fn prepare(&self, index: usize, event: &OutboxEvent) -> Result<Outgoing, PublishError> {
        let key = self.routing_key.render(event);
        if key.len() > MAX_ROUTING_KEY_LEN {
            return Err(PublishError::permanent(format!(
                "routing key is {} bytes; RabbitMQ allows at most {MAX_ROUTING_KEY_LEN} (template {:?}, key starts {:?})",
                key.len(),
                self.routing_key.template(),
                truncate(&key, 64)
            )));
        }
        if event.payload.len() > self.max_message_bytes {
            return Err(PublishError::permanent(format!(
                "payload is {} bytes; this RabbitMQ publisher sends at most {} (with_max_message_bytes)",
                event.payload.len(),
                self.max_message_bytes
            )));
        }
        let mut headers = FieldTable::default();
        for (name, value) in envelope_headers(event) {
            let name = ShortString::try_new(name.as_str()).map_err(|_| {
                PublishError::permanent(format!(
                    "header name {:?} is {} bytes; AMQP allows at most {MAX_ROUTING_KEY_LEN}",
                    truncate(&name, 64),
                    name.len()
                ))
            })?;
            headers.insert(name, AMQPValue::LongString(LongString::from(value)));
        }
        let mut properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(short(&event.id.to_string()))
            .with_timestamp(u64::try_from(event.created_at.timestamp()).unwrap_or(0))
            .with_headers(headers);
        if let Ok(kind) = ShortString::try_new(event.event_type.as_str()) {
            properties = properties.with_type(kind);
        }
        Ok(Outgoing { index, routing_key: short(&key), properties })
    }

    async fn publish_batch(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; events.len()];
        let mut outgoing = Vec::with_capacity(events.len());
        for (index, event) in events.iter().enumerate() {
            match self.prepare(index, event) {
                Ok(message) => outgoing.push(message),
                Err(error) => {
                    tracing::warn!(event_id = %event.id, %error, "event cannot be published to RabbitMQ");
                    results[index] = Some(Err(error));
                }
            }
        }
        if !outgoing.is_empty() {
            let mut link = self.link.lock().await;
            let mut in_flight = InFlight { stale: &self.stale, armed: true };
            match self.ensure_link(&mut link).await {
                Err(error) => {
                    let message = format!("not sent: {error}");
                    tracing::warn!(messaging.system = "rabbitmq", %error, "cannot publish; will retry");
                    for message_out in &outgoing {
                        results[message_out.index] = Some(Err(PublishError::transient(message.clone())));
                    }
                }
                Ok(()) => {
                    let channel = link.as_ref().map(|l| l.channel.clone());
                    let healthy = match channel {
                        Some(channel) => self.send(&channel, events, outgoing, &mut results).await,
                        None => false,
                    };
                    if !healthy {
                        *link = None;
                    }
                }
            }
            in_flight.armed = false;
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(PublishError::transient("RabbitMQ publisher produced no result"))))
            .collect()
    }

    /// Sends `outgoing`, then awaits every confirm and checks the returns. Returns whether the channel is
    /// still fit for the next batch.
    async fn send(
        &self,
        channel: &Channel,
        events: &[OutboxEvent],
        outgoing: Vec<Outgoing>,
        results: &mut [Option<Result<(), PublishError>>],
    ) -> bool {
        let mut healthy = true;
        let mut confirms = Vec::with_capacity(outgoing.len());
        let mut routing_keys: HashMap<String, (usize, String)> = HashMap::with_capacity(outgoing.len());
        let options = BasicPublishOptions { mandatory: true, immediate: false };
        for message in outgoing {
            let event = &events[message.index];
            if !healthy {
                results[message.index] =
                    Some(Err(PublishError::transient("not sent: the RabbitMQ channel failed earlier in this batch")));
                continue;
            }
            routing_keys.insert(event.id.to_string(), (message.index, message.routing_key.to_string()));
            let sent = channel
                .basic_publish(
                    short(&self.exchange),
                    message.routing_key,
                    options,
                    event.payload.as_bytes(),
                    message.properties,
                )
                .await;
            match sent {
                Ok(confirm) => confirms.push((message.index, confirm)),
                Err(error) => {
                    tracing::warn!(messaging.system = "rabbitmq", %error, "RabbitMQ publish failed");
                    results[message.index] =
                        Some(Err(PublishError::transient(format!("RabbitMQ publish failed: {error}"))));
                    healthy = false;
                }
            }
        }
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        let mut returned: Vec<BasicReturnMessage> = Vec::new();
        for (index, confirm) in confirms {
            let result = match tokio::time::timeout_at(deadline, confirm).await {
                Ok(Ok(Confirmation::Ack(message))) => {
                    returned.extend(message);
                    Ok(())
                }
                Ok(Ok(Confirmation::Nack(message))) => {
                    returned.extend(message);
                    Err(PublishError::transient("RabbitMQ nacked the message (it could not store it)"))
                }
                Ok(Ok(Confirmation::NotRequested)) => {
                    healthy = false;
                    Err(PublishError::transient("RabbitMQ channel is not in confirm mode; nothing was confirmed"))
                }
                Ok(Err(error)) => {
                    healthy = false;
                    Err(PublishError::transient(format!("RabbitMQ confirm lost: {error}")))
                }
                Err(_) => {
                    healthy = false;
                    Err(PublishError::transient(format!("no RabbitMQ confirm within {:?}", self.confirm_timeout)))
                }
            };
            results[index] = Some(result);
        }
        // A return is delivered before its ack, but lapin attaches it to whichever confirm it resolves next:
        // match it to its event by message id.
        for message in returned {
            let id = message.delivery.properties.message_id().as_ref().map(ToString::to_string);
            let Some((index, routing_key)) = id.as_ref().and_then(|id| routing_keys.get(id)) else {
                tracing::warn!(
                    messaging.system = "rabbitmq",
                    message_id = ?id,
                    "RabbitMQ returned a message that is not part of this batch"
                );
                continue;
            };
            let error = PublishError::transient(format!(
                "unroutable: no queue bound to exchange {} with routing key {routing_key:?} (RabbitMQ returned it: {} {})",
                exchange_label(&self.exchange),
                message.reply_code,
                message.reply_text
            ));
            tracing::warn!(
                messaging.system = "rabbitmq",
                messaging.destination.name = %self.exchange,
                messaging.rabbitmq.destination.routing_key = %routing_key,
                event_id = ?id,
                "unroutable event: no queue bound; it stays pending"
            );
            results[*index] = Some(Err(error));
        }
        healthy
    }
}

impl Publisher for RabbitPublisher {
    fn publish(&self, events: &[OutboxEvent]) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send {
        let span = tracing::debug_span!(
            "outbox.rabbitmq.publish",
            messaging.system = "rabbitmq",
            messaging.destination.name = %self.exchange,
            messaging.batch.message_count = events.len(),
        );
        self.publish_batch(events).instrument(span)
    }
}

fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() }
}

async fn close_quietly(channel: &Channel) {
    let _ = tokio::time::timeout(Duration::from_secs(1), channel.close(200, "OK".into())).await;
}

/// AMQP headers as strings; values that are not strings or numbers (tables, arrays, bytes) are skipped.
fn headers_of(properties: &BasicProperties) -> BTreeMap<String, String> {
    let Some(table) = properties.headers() else { return BTreeMap::new() };
    table
        .inner()
        .iter()
        .filter_map(|(name, value)| {
            let value = match value {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                AMQPValue::ShortString(s) => s.to_string(),
                AMQPValue::Boolean(b) => b.to_string(),
                AMQPValue::ShortShortInt(n) => n.to_string(),
                AMQPValue::ShortShortUInt(n) => n.to_string(),
                AMQPValue::ShortInt(n) => n.to_string(),
                AMQPValue::ShortUInt(n) => n.to_string(),
                AMQPValue::LongInt(n) => n.to_string(),
                AMQPValue::LongUInt(n) => n.to_string(),
                AMQPValue::LongLongInt(n) => n.to_string(),
                AMQPValue::Timestamp(n) => n.to_string(),
                _ => return None,
            };
            Some((name.to_string(), value))
        })
        .collect()
}

/// Why a consume session ended.
enum SessionEnd {
    /// `shutdown` was cancelled.
    Shutdown,
    /// The session failed; `started` tells whether it got as far as consuming.
    Failed { error: Error, started: bool },
}

/// Consumes one queue with manual acks and hands each message to a [`MessageHandler`]; see the
/// [module docs](self).
///
/// Messages are handled one at a time in delivery order, so one consumer sees each aggregate's events in
/// publish order. A message the handler retries is requeued and redelivered after later messages already in
/// the prefetch window: with [`with_prefetch(1)`](Self::with_prefetch) a retry never lets a later message of
/// the same aggregate overtake it.
pub struct RabbitConsumer {
    endpoint: Endpoint,
    queue: String,
    consumer_tag: String,
    prefetch: u16,
    retry_delay: Duration,
    connect_timeout: Duration,
    connection: Mutex<Option<Connection>>,
}

impl fmt::Debug for RabbitConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitConsumer")
            .field("endpoint", &self.endpoint)
            .field("queue", &self.queue)
            .field("consumer_tag", &self.consumer_tag)
            .field("prefetch", &self.prefetch)
            .finish_non_exhaustive()
    }
}

impl RabbitConsumer {
    /// Connects to `url` and checks that `queue` exists; `consumer_tag` names this consumer in RabbitMQ's
    /// management UI (unique per channel; `""` lets RabbitMQ pick one).
    ///
    /// A malformed URL, another broker's scheme or a name over 255 bytes is an [`Error::InvalidConfig`]; an
    /// unreachable broker, a refused login or a missing queue an [`Error::Broker`].
    pub async fn connect(url: &str, queue: &str, consumer_tag: &str) -> Result<Self> {
        let endpoint = Endpoint::parse(url)?;
        check_name("queue", queue, false)?;
        check_name("consumer_tag", consumer_tag, true)?;
        let consumer = RabbitConsumer {
            endpoint,
            queue: queue.to_owned(),
            consumer_tag: consumer_tag.to_owned(),
            prefetch: DEFAULT_PREFETCH,
            retry_delay: DEFAULT_RETRY_DELAY,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connection: Mutex::new(None),
        };
        let channel = consumer.channel().await?;
        channel
            .queue_declare(
                short(queue),
                QueueDeclareOptions { passive: true, ..durable_queue() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::broker(BROKER, format!("find queue {queue:?} (declare it first)"), e))?;
        close_quietly(&channel).await;
        Ok(consumer)
    }

    /// Sets the prefetch window (default [`DEFAULT_PREFETCH`]; at least 1).
    pub fn with_prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch.max(1);
        self
    }

    /// Sets how long a message the handler asked to retry is held before it is requeued (default 1 s), so a
    /// failing dependency is not hammered in a tight redelivery loop.
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// Sets how long opening (or reopening) the connection may take (default 5 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Consumes until `shutdown` is cancelled, then finishes the message in hand and closes its channel
    /// (RabbitMQ requeues the unacked rest of the prefetch window).
    ///
    /// Per message: [`Disposition::Ack`] → `basic.ack`; `Retry` → `basic.nack` with `requeue = true` after
    /// the retry delay; `Park` → a warning and `basic.nack` with `requeue = false` (to the queue's dead-letter
    /// exchange, if any). A message without a valid outbox envelope is parked without calling the handler.
    ///
    /// Errors setting up the first session (the queue is gone, access refused) are returned; a connection
    /// lost later is logged and reopened with a growing delay (at most 30 s) until `shutdown`.
    pub async fn run(&self, handler: impl MessageHandler, shutdown: CancellationToken) -> Result<()> {
        let mut first = true;
        let mut delay = self.retry_delay.max(Duration::from_millis(100));
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            match self.session(&handler, &shutdown).await {
                SessionEnd::Shutdown => return Ok(()),
                SessionEnd::Failed { error, started } => {
                    if first && !started {
                        return Err(error);
                    }
                    if started {
                        delay = self.retry_delay.max(Duration::from_millis(100));
                    }
                    tracing::warn!(
                        messaging.system = "rabbitmq",
                        messaging.destination.name = %self.queue,
                        %error,
                        retry_in = ?delay,
                        "RabbitMQ consumer lost its session; reconnecting"
                    );
                    *self.connection.lock().await = None;
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(MAX_RECONNECT_DELAY);
                }
            }
            first = false;
        }
    }

    /// A fresh channel on the (re)opened connection.
    async fn channel(&self) -> Result<Channel> {
        let mut connection = self.connection.lock().await;
        if !connection.as_ref().is_some_and(|c| c.status().connected()) {
            let name = if self.consumer_tag.is_empty() { "outbox-consumer" } else { self.consumer_tag.as_str() };
            *connection = Some(self.endpoint.open(name, self.connect_timeout).await?);
        }
        let Some(open) = connection.as_ref() else {
            return Err(Error::broker(BROKER, format!("connect to {}", self.endpoint.display), "no connection"));
        };
        open.create_channel()
            .await
            .map_err(|e| Error::broker(BROKER, format!("open a channel on {}", self.endpoint.display), e))
    }

    async fn session(&self, handler: &impl MessageHandler, shutdown: &CancellationToken) -> SessionEnd {
        let failed = |error, started| SessionEnd::Failed { error, started };
        let channel = match self.channel().await {
            Ok(channel) => channel,
            Err(error) => return failed(error, false),
        };
        if let Err(e) = channel.basic_qos(self.prefetch, BasicQosOptions::default()).await {
            return failed(Error::broker(BROKER, format!("set prefetch {}", self.prefetch), e), false);
        }
        let consumer = channel
            .basic_consume(
                short(&self.queue),
                short(&self.consumer_tag),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await;
        let mut consumer = match consumer {
            Ok(consumer) => consumer,
            Err(e) => return failed(Error::broker(BROKER, format!("consume from queue {:?}", self.queue), e), false),
        };
        tracing::debug!(
            messaging.system = "rabbitmq",
            messaging.destination.name = %self.queue,
            consumer_tag = %consumer.tag(),
            "RabbitMQ consumer started"
        );
        loop {
            let next = tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        channel.basic_cancel(consumer.tag(), BasicCancelOptions::default()),
                    )
                    .await;
                    close_quietly(&channel).await;
                    return SessionEnd::Shutdown;
                }
                next = consumer.next() => next,
            };
            let delivery = match next {
                Some(Ok(delivery)) => delivery,
                Some(Err(e)) => {
                    return failed(Error::broker(BROKER, format!("receive from queue {:?}", self.queue), e), true);
                }
                None => {
                    return failed(
                        Error::broker(
                            BROKER,
                            format!("consume from queue {:?}", self.queue),
                            "the consumer was cancelled by the broker (queue deleted?)",
                        ),
                        true,
                    );
                }
            };
            if let Err(error) = self.process(delivery, handler, shutdown).await {
                close_quietly(&channel).await;
                return failed(error, true);
            }
        }
    }

    async fn process(
        &self,
        delivery: Delivery,
        handler: &impl MessageHandler,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        let headers = headers_of(&delivery.properties);
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(ToString::to_string)
            .or_else(|| headers.get(crate::broker::header::ID).cloned())
            .unwrap_or_default();
        let span = tracing::debug_span!(
            "outbox.rabbitmq.process",
            messaging.system = "rabbitmq",
            messaging.destination.name = %self.queue,
            messaging.message.id = %message_id,
            messaging.rabbitmq.message.delivery_tag = delivery.delivery_tag,
            redelivered = delivery.redelivered,
        );
        async {
            let disposition = match decode_message(&headers, &delivery.data) {
                Ok(event) => crate::broker::handle_guarded(handler, event).await,
                Err(error) => {
                    tracing::warn!(%error, "message has no valid outbox envelope; parking it");
                    return self.nack(&delivery, false).await;
                }
            };
            match disposition {
                Disposition::Ack => delivery
                    .ack(BasicAckOptions::default())
                    .await
                    .map(drop)
                    .map_err(|e| Error::broker(BROKER, format!("ack a message on queue {:?}", self.queue), e)),
                Disposition::Retry => {
                    tracing::debug!(delay = ?self.retry_delay, "handler asked for a retry; requeueing");
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(self.retry_delay) => {}
                    }
                    self.nack(&delivery, true).await
                }
                Disposition::Park => {
                    tracing::warn!("handler parked the message; nacking without requeue (dead-letter exchange if any)");
                    self.nack(&delivery, false).await
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn nack(&self, delivery: &Delivery, requeue: bool) -> Result<()> {
        delivery
            .nack(BasicNackOptions { multiple: false, requeue })
            .await
            .map(drop)
            .map_err(|e| Error::broker(BROKER, format!("nack a message on queue {:?}", self.queue), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_redacted_before_connecting() {
        let endpoint = Endpoint::parse("amqp://guest:secret@127.0.0.1:5673/%2f").unwrap();
        assert_eq!(endpoint.uri.authority.host, "127.0.0.1");
        assert_eq!(endpoint.uri.authority.port, 5673);
        assert_eq!(endpoint.display, "amqp://127.0.0.1:5673/%2f");
        assert_eq!(Endpoint::parse("amqp://[::1]:5672/vh").unwrap().uri.authority.host, "::1");
        assert_eq!(Endpoint::parse("amqp://rabbit.internal/%2f").unwrap().uri.authority.host, "rabbit.internal");
        for bad in ["nats://127.0.0.1:4222", "http://x", "amqp://", "amqp://u:p@h:notaport/%2f", "amqps://h/%2f"] {
            let err = Endpoint::parse(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidConfig { field: "broker_url", .. }), "{bad}: {err}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
        let err = Endpoint::parse("amqp://guest:secret@h:bad/%2f").unwrap_err().to_string();
        assert!(err.contains("guest:***@h:bad") && !err.contains("secret"), "{err}");
    }

    #[test]
    fn amqp_headers_decode_to_strings() {
        let mut table = FieldTable::default();
        table.insert("ce_id".into(), AMQPValue::LongString("abc".into()));
        table.insert("n".into(), AMQPValue::LongLongInt(7));
        table.insert("nested".into(), AMQPValue::FieldTable(FieldTable::default()));
        let headers = headers_of(&BasicProperties::default().with_headers(table));
        assert_eq!(headers.get("ce_id").map(String::as_str), Some("abc"));
        assert_eq!(headers.get("n").map(String::as_str), Some("7"));
        assert!(!headers.contains_key("nested"));
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("ééé", 3), "é");
        assert_eq!(truncate("abc", 10), "abc");
    }
}

//! [`RabbitPublisher`]: the relay's side, publisher confirms and mandatory routing (see the
//! [module docs](super)).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lapin::message::BasicReturnMessage;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ExchangeKind};
use tokio::sync::Mutex;
use tracing::Instrument;

use super::config::{
    BROKER, DEFAULT_CONFIRM_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_MESSAGE_BYTES, Endpoint, MAX_ROUTING_KEY_LEN,
    check_name, close_quietly, durable_queue, exchange_label, short,
};
use crate::broker::{Destination, envelope_headers};
use crate::envelope::OutboxEvent;
use crate::error::{Error, Result};
use crate::publisher::{PublishError, Publisher};
use crate::text::truncate;

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

/// Publishes outbox events to one RabbitMQ exchange with publisher confirms; see the [module docs](super).
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

    /// Like [`declare_queue`](Self::declare_queue), with RabbitMQ's own dead-lettering of the queue into
    /// `dead_letter_queue` (declared too, through the default exchange): messages RabbitMQ drops (expired
    /// by a TTL, over a length limit, rejected without requeue by some other consumer) land there instead.
    /// [`RabbitTransport`](super::RabbitTransport) never rejects without requeue: it publishes its dead
    /// letters itself, with a confirm, to its own dead-letter queue (which may be this one).
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

    /// Like [`declare_queue_with_dead_letters`](Self::declare_queue_with_dead_letters), for a cluster: a
    /// quorum `queue` (`x-queue-type=quorum`, replicated over the cluster's nodes, a majority confirms each
    /// message) and a quorum `dead_letter_queue`. `delivery_limit` (`x-delivery-limit`, at least 1) must be
    /// the consumer's [`ConsumerConfig::max_deliveries`](crate::ConsumerConfig::max_deliveries): the
    /// [`RabbitTransport`](super::RabbitTransport) dead-letters a message at that delivery itself, with its
    /// reason, so RabbitMQ's own limit only acts on a message whose consumer died during its last delivery;
    /// RabbitMQ then dead-letters it into the same queue, at least once (`x-dead-letter-strategy`,
    /// which needs `x-overflow=reject-publish`), where `outbox dead-letters` lists and replays it.
    pub async fn declare_quorum_queue(
        &self,
        exchange: &str,
        queue: &str,
        binding_key: &str,
        dead_letter_queue: &str,
        delivery_limit: u32,
    ) -> Result<()> {
        check_name("dead_letter_queue", dead_letter_queue, false)?;
        if delivery_limit == 0 {
            return Err(Error::invalid_config("delivery_limit", "is 0; expected the consumer's max_deliveries"));
        }
        let quorum = || {
            let mut arguments = FieldTable::default();
            arguments.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
            arguments
        };
        let channel = self.topology_channel().await?;
        channel
            .queue_declare(short(dead_letter_queue), durable_queue(), quorum())
            .await
            .map_err(|e| Error::broker(BROKER, format!("declare quorum dead-letter queue {dead_letter_queue:?}"), e))?;
        close_quietly(&channel).await;
        let mut arguments = quorum();
        arguments
            .insert("x-delivery-limit".into(), AMQPValue::LongInt(i32::try_from(delivery_limit).unwrap_or(i32::MAX)));
        arguments.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        arguments.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(dead_letter_queue.into()));
        arguments.insert("x-dead-letter-strategy".into(), AMQPValue::LongString("at-least-once".into()));
        arguments.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
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
    fn system(&self) -> &'static str {
        "rabbitmq"
    }

    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        Some(self.routing_key.render(event))
    }

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

//! [`RabbitTransport`]: the consume side, a [`Transport`] over one queue (see the [module docs](super)).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use lapin::Acker;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;

use super::config::{
    BROKER, DEFAULT_CONFIRM_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DEAD_LETTER_SUFFIX, DEFAULT_PREFETCH,
    DELIVERY_COUNT_HEADER, Endpoint, check_dead_letter_queue, check_name, close_quietly, durable_queue, encode_origin,
    exchange_label, headers_of, short,
};
use crate::consume::{DeadLetter, Delivery, Lag, Transport, dead_header};
use crate::error::{Error, Result};

/// What [`RabbitTransport`] needs to settle one delivery: its channel's acker and delivery tag, and the
/// original properties (kept on a dead letter).
#[derive(Debug)]
pub struct RabbitReceipt {
    acker: Acker,
    delivery_tag: u64,
    properties: BasicProperties,
    /// The consume session (channel) that delivered it.
    session: u64,
}

impl RabbitReceipt {
    /// The delivery tag (unique on the channel that delivered the message).
    pub fn delivery_tag(&self) -> u64 {
        self.delivery_tag
    }
}

/// The consume channel and its `basic.consume` stream.
struct Session {
    /// Numbers the sessions of this transport, so a failed ack can tell its own channel from a later one.
    id: u64,
    channel: Channel,
    consumer: lapin::Consumer,
}

/// Consumes one RabbitMQ queue for the [`Consumer`](crate::Consumer) driver, with manual acks, a prefetch
/// window and a dead-letter queue written with publisher confirms; see the [module docs](super).
pub struct RabbitTransport {
    pub(super) endpoint: Endpoint,
    pub(super) queue: String,
    consumer_tag: String,
    pub(super) dead_letter_queue: String,
    prefetch: u16,
    connect_timeout: Duration,
    pub(super) confirm_timeout: Duration,
    connection: Mutex<Option<Arc<Connection>>>,
    session: Mutex<Option<Session>>,
    /// The id of the session that delivered a message whose ack or release failed, 0 when none: if that
    /// session is still the current one, the next fetch closes its channel so RabbitMQ requeues whatever it
    /// holds unacknowledged (it never redelivers while the channel lives). A failure on an older, closed
    /// session needs nothing: closing the channel requeued its messages already.
    stale: AtomicU64,
    /// The id of the last session opened.
    sessions: AtomicU64,
    /// The confirm channel dead letters and replays are published on, one message at a time (so a
    /// returned message is the one just sent).
    pub(super) confirms: Mutex<Option<Channel>>,
}

impl fmt::Debug for RabbitTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitTransport")
            .field("endpoint", &self.endpoint)
            .field("queue", &self.queue)
            .field("consumer_tag", &self.consumer_tag)
            .field("dead_letter_queue", &self.dead_letter_queue)
            .field("prefetch", &self.prefetch)
            .finish_non_exhaustive()
    }
}

impl RabbitTransport {
    /// Connects to `url` (`amqp://user:pass@host:5672/%2f`), checks that `queue` exists and declares the
    /// durable dead-letter queue `<queue>.dead` ([`DEFAULT_DEAD_LETTER_SUFFIX`]); `consumer_tag` names
    /// this consumer in RabbitMQ's management UI (`""` lets RabbitMQ pick one). Consuming starts at the
    /// first [`fetch`](Transport::fetch).
    ///
    /// A malformed URL, another broker's scheme, a name over 255 bytes or with control characters (the
    /// dead-letter queue's too) is an [`Error::InvalidConfig`]; an unreachable broker, a refused login or
    /// a missing queue an [`Error::Broker`].
    pub async fn connect(url: &str, queue: &str, consumer_tag: &str) -> Result<Self> {
        Self::connect_with_dead_letter_queue(url, queue, consumer_tag, &format!("{queue}{DEFAULT_DEAD_LETTER_SUFFIX}"))
            .await
    }

    /// Like [`connect`](Self::connect), with dead letters going to `dead_letter_queue` (declared durable
    /// if missing). It must be a valid queue name, not `queue` itself, and not start with `amq.`.
    pub async fn connect_with_dead_letter_queue(
        url: &str,
        queue: &str,
        consumer_tag: &str,
        dead_letter_queue: &str,
    ) -> Result<Self> {
        let endpoint = Endpoint::parse(url)?;
        check_name("queue", queue, false)?;
        check_name("consumer_tag", consumer_tag, true)?;
        check_dead_letter_queue(queue, dead_letter_queue)?;
        let transport = RabbitTransport {
            endpoint,
            queue: queue.to_owned(),
            consumer_tag: consumer_tag.to_owned(),
            dead_letter_queue: dead_letter_queue.to_owned(),
            prefetch: DEFAULT_PREFETCH,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            connection: Mutex::new(None),
            session: Mutex::new(None),
            stale: AtomicU64::new(0),
            sessions: AtomicU64::new(0),
            confirms: Mutex::new(None),
        };
        let channel = transport.channel().await?;
        channel
            .queue_declare(
                short(queue),
                QueueDeclareOptions { passive: true, ..durable_queue() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::broker(BROKER, format!("find queue {queue:?} (declare it first)"), e))?;
        // A dead-letter queue that exists is used as it is (a quorum queue, one with arguments); a passive
        // declare that finds none closes its channel, and a new one declares a classic durable queue.
        let found = channel
            .queue_declare(
                short(dead_letter_queue),
                QueueDeclareOptions { passive: true, ..durable_queue() },
                FieldTable::default(),
            )
            .await
            .is_ok();
        close_quietly(&channel).await;
        if !found {
            let channel = transport.channel().await?;
            channel
                .queue_declare(short(dead_letter_queue), durable_queue(), FieldTable::default())
                .await
                .map_err(|e| Error::broker(BROKER, format!("declare dead-letter queue {dead_letter_queue:?}"), e))?;
            close_quietly(&channel).await;
        }
        Ok(transport)
    }

    /// Sets the prefetch window (default [`DEFAULT_PREFETCH`]; at least 1), applied from the next consume
    /// session on. Keep it at least the driver's
    /// [`ConsumerConfig::max_in_flight`](crate::ConsumerConfig::max_in_flight): the driver holds messages
    /// waiting behind a retry unacked, and once `prefetch` messages are held RabbitMQ sends no more, so a
    /// smaller window lets one retrying aggregate stall the others.
    pub fn with_prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch.max(1);
        self
    }

    /// Sets how long opening (or reopening) the connection may take (default 5 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long a dead letter (or a replayed message) waits for its confirm (default 5 s).
    pub fn with_confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The dead-letter queue.
    pub fn dead_letter_queue(&self) -> &str {
        &self.dead_letter_queue
    }

    /// The prefetch window.
    pub fn prefetch(&self) -> u16 {
        self.prefetch
    }

    /// Closes the connection: RabbitMQ requeues every delivery not acked yet (dropping the transport does
    /// the same without waiting).
    pub async fn close(&self) {
        *self.session.lock().await = None;
        *self.confirms.lock().await = None;
        if let Some(connection) = self.connection.lock().await.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), connection.close(200, "OK".into())).await;
        }
    }

    /// A fresh channel on the (re)opened connection.
    pub(super) async fn channel(&self) -> Result<Channel> {
        let connection = {
            let mut connection = self.connection.lock().await;
            match connection.as_ref() {
                Some(open) if open.status().connected() => open.clone(),
                _ => {
                    let name =
                        if self.consumer_tag.is_empty() { "outbox-consumer" } else { self.consumer_tag.as_str() };
                    let open = Arc::new(self.endpoint.open(name, self.connect_timeout).await?);
                    *connection = Some(open.clone());
                    open
                }
            }
        };
        connection
            .create_channel()
            .await
            .map_err(|e| Error::broker(BROKER, format!("open a channel on {}", self.endpoint.display), e))
    }

    async fn open_session(&self) -> Result<Session> {
        let channel = self.channel().await?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| Error::broker(BROKER, format!("set prefetch {}", self.prefetch), e))?;
        let consumer = channel
            .basic_consume(
                short(&self.queue),
                short(&self.consumer_tag),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::broker(BROKER, format!("consume from queue {:?}", self.queue), e))?;
        let id = self.sessions.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::debug!(
            messaging.system = "rabbitmq",
            messaging.source.name = %self.queue,
            consumer_tag = %consumer.tag(),
            prefetch = self.prefetch,
            session = id,
            "RabbitMQ consume session started"
        );
        Ok(Session { id, channel, consumer })
    }

    fn delivery(session: u64, delivery: lapin::message::Delivery) -> Delivery<RabbitReceipt> {
        let headers = headers_of(&delivery.properties);
        let deliveries = match headers.get(DELIVERY_COUNT_HEADER).and_then(|n| n.parse::<u32>().ok()) {
            // A quorum queue counts the earlier deliveries that were returned.
            Some(returned) => returned.saturating_add(1),
            None if delivery.redelivered => 2,
            None => 1,
        };
        Delivery {
            origin: encode_origin(delivery.exchange.as_str(), delivery.routing_key.as_str()),
            deliveries,
            headers,
            payload: delivery.data,
            receipt: RabbitReceipt {
                acker: delivery.acker,
                delivery_tag: delivery.delivery_tag,
                properties: delivery.properties,
                session,
            },
        }
    }

    /// Publishes one message on the confirm channel (mandatory) and waits for its confirm: `Ok` only on
    /// an ack without a return.
    pub(super) async fn publish_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) -> Result<()> {
        let what = || format!("publish to exchange {} with routing key {routing_key:?}", exchange_label(exchange));
        let mut confirms = self.confirms.lock().await;
        if !confirms.as_ref().is_some_and(|c| c.status().connected()) {
            let channel = self.channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| Error::broker(BROKER, "enable publisher confirms", e))?;
            *confirms = Some(channel);
        }
        let Some(channel) = confirms.as_ref() else {
            return Err(Error::broker(BROKER, what(), "no confirm channel"));
        };
        let options = BasicPublishOptions { mandatory: true, immediate: false };
        let sent = channel.basic_publish(short(exchange), short(routing_key), options, payload, properties).await;
        let confirm = match sent {
            Ok(confirm) => confirm,
            Err(e) => {
                *confirms = None;
                return Err(Error::broker(BROKER, what(), e));
            }
        };
        match tokio::time::timeout(self.confirm_timeout, confirm).await {
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(Error::broker(
                BROKER,
                what(),
                format!("unroutable: RabbitMQ returned it ({} {})", returned.reply_code, returned.reply_text),
            )),
            Ok(Ok(Confirmation::Nack(_))) => {
                Err(Error::broker(BROKER, what(), "RabbitMQ nacked it (it could not store it)"))
            }
            Ok(Ok(Confirmation::NotRequested)) => {
                *confirms = None;
                Err(Error::broker(BROKER, what(), "the channel is not in confirm mode"))
            }
            Ok(Err(e)) => {
                *confirms = None;
                Err(Error::broker(BROKER, what(), e))
            }
            Err(_) => {
                // The channel may still owe this confirm: start the next publish on a fresh one.
                *confirms = None;
                Err(Error::broker(BROKER, what(), format!("no confirm within {:?}", self.confirm_timeout)))
            }
        }
    }
}

/// `original`'s headers minus `strip`ped ones, plus `extra` as long strings.
pub(super) fn rebuild_headers(
    original: &BasicProperties,
    strip: impl Fn(&str) -> bool,
    extra: Vec<(String, String)>,
) -> FieldTable {
    let mut table = FieldTable::default();
    if let Some(headers) = original.headers() {
        for (name, value) in headers.inner() {
            if !strip(name.as_str()) {
                table.insert(name.clone(), value.clone());
            }
        }
    }
    for (name, value) in extra {
        if let Ok(name) = ShortString::try_new(name) {
            table.insert(name, AMQPValue::LongString(LongString::from(value)));
        }
    }
    table
}

/// The properties a dead letter or a replayed message is published with: the original's content type,
/// ids, type, timestamp and priority, persistent, with `headers`; no expiration (a dead letter must not
/// expire) and no `user_id` (RabbitMQ checks it against the publishing user).
pub(super) fn carried_properties(original: &BasicProperties, headers: FieldTable) -> BasicProperties {
    let mut properties = BasicProperties::default().with_delivery_mode(2).with_headers(headers);
    if let Some(v) = original.content_type() {
        properties = properties.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        properties = properties.with_content_encoding(v.clone());
    }
    if let Some(v) = original.message_id() {
        properties = properties.with_message_id(v.clone());
    }
    if let Some(v) = original.correlation_id() {
        properties = properties.with_correlation_id(v.clone());
    }
    if let Some(v) = original.kind() {
        properties = properties.with_type(v.clone());
    }
    if let Some(v) = original.timestamp() {
        properties = properties.with_timestamp(*v);
    }
    if let Some(v) = original.priority() {
        properties = properties.with_priority(*v);
    }
    if let Some(v) = original.app_id() {
        properties = properties.with_app_id(v.clone());
    }
    properties
}

/// How long an ack or release may take to be handed to the connection. `basic.ack` has no reply, so
/// this only bounds lapin's own bookkeeping: an ack sent while the connection was breaking has been seen
/// to never resolve, which held its aggregate's lane forever.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

/// `settle`, or an error after [`SETTLE_TIMEOUT`].
async fn within_settle_timeout(
    settle: impl Future<Output = lapin::Result<bool>>,
) -> std::result::Result<bool, crate::error::BoxError> {
    match tokio::time::timeout(SETTLE_TIMEOUT, settle).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(format!("not handed to the connection within {SETTLE_TIMEOUT:?}").into()),
    }
}

fn settled(
    operation: &str,
    delivery_tag: u64,
    queue: &str,
    result: std::result::Result<bool, crate::error::BoxError>,
) -> Result<()> {
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::broker(
            BROKER,
            format!("{operation} delivery {delivery_tag} on queue {queue:?}"),
            "its channel is closed (RabbitMQ requeued it) or it was settled already",
        )),
        Err(e) => Err(Error::broker(BROKER, format!("{operation} delivery {delivery_tag} on queue {queue:?}"), e)),
    }
}

impl RabbitTransport {
    /// [`settled`], marking the receipt's session stale when the ack or release did not go through.
    fn settled(
        &self,
        operation: &str,
        receipt: &RabbitReceipt,
        result: std::result::Result<bool, crate::error::BoxError>,
    ) -> Result<()> {
        let outcome = settled(operation, receipt.delivery_tag, &self.queue, result);
        if outcome.is_err() {
            // The newest session matters: older ones are closed, their messages requeued already.
            self.stale.fetch_max(receipt.session, Ordering::SeqCst);
        }
        outcome
    }
}

impl Transport for RabbitTransport {
    type Receipt = RabbitReceipt;

    fn broker(&self) -> &'static str {
        BROKER
    }

    fn source(&self) -> String {
        self.queue.clone()
    }

    /// Waits up to `wait` for the first delivery of the `basic.consume` stream, then takes what is
    /// already there, up to `max`. A broken session is dropped (RabbitMQ requeues its unacked
    /// deliveries) and reopened at the next fetch.
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery<RabbitReceipt>>> {
        let mut session = self.session.lock().await;
        let stale = self.stale.swap(0, Ordering::SeqCst);
        if stale != 0
            && let Some(old) = session.take_if(|current| current.id == stale)
        {
            tracing::debug!(
                session = old.id,
                "an ack failed on a live channel: closing it so RabbitMQ requeues what it holds"
            );
            close_quietly(&old.channel).await;
        }
        if !session.as_ref().is_some_and(|s| s.channel.status().connected()) {
            *session = None;
            *session = Some(self.open_session().await?);
        }
        let Some(open) = session.as_mut() else {
            return Err(Error::broker(BROKER, format!("consume from queue {:?}", self.queue), "no session"));
        };
        let lost = |e: String| Error::broker(BROKER, format!("receive from queue {:?}", self.queue), e);
        let first = match tokio::time::timeout(wait, open.consumer.next()).await {
            Err(_) => {
                tracing::trace!(session = open.id, "nothing delivered within the fetch wait");
                return Ok(Vec::new());
            }
            Ok(Some(Ok(delivery))) => delivery,
            Ok(Some(Err(e))) => {
                *session = None;
                return Err(lost(e.to_string()));
            }
            Ok(None) => {
                *session = None;
                return Err(lost("the broker cancelled the consumer (queue deleted?)".to_owned()));
            }
        };
        let id = open.id;
        let mut batch = vec![Self::delivery(id, first)];
        while batch.len() < max {
            match open.consumer.next().now_or_never() {
                Some(Some(Ok(delivery))) => batch.push(Self::delivery(id, delivery)),
                Some(Some(Err(error))) => {
                    tracing::debug!(%error, "RabbitMQ consume session broke; reopening at the next fetch");
                    *session = None;
                    break;
                }
                Some(None) => {
                    *session = None;
                    break;
                }
                None => break,
            }
        }
        tracing::trace!(session = id, fetched = batch.len(), "fetched");
        Ok(batch)
    }

    /// `basic.ack` of this delivery tag alone (never `multiple`), given up after 5 s.
    async fn ack(&self, receipt: &RabbitReceipt) -> Result<()> {
        let result = within_settle_timeout(receipt.acker.ack(BasicAckOptions { multiple: false })).await;
        self.settled("ack", receipt, result)
    }

    /// `basic.nack` with `requeue = true`: RabbitMQ puts the message back (at its old position where it
    /// can) and delivers it again. Given up after 5 s.
    async fn release(&self, receipt: &RabbitReceipt) -> Result<()> {
        let result =
            within_settle_timeout(receipt.acker.nack(BasicNackOptions { multiple: false, requeue: true })).await;
        self.settled("release", receipt, result)
    }

    /// Publishes the original payload, properties and headers (minus `x-delivery-count` and earlier
    /// dead-letter headers) plus the [`DeadLetter::headers`] to the dead-letter queue through the
    /// default exchange, and waits for the confirm.
    async fn dead_letter(&self, delivery: &Delivery<RabbitReceipt>, letter: &DeadLetter) -> Result<()> {
        let original = &delivery.receipt.properties;
        let extra = letter.headers(&Default::default());
        let headers = rebuild_headers(
            original,
            |name| name.starts_with(dead_header::PREFIX) || name == DELIVERY_COUNT_HEADER,
            extra,
        );
        let properties = carried_properties(original, headers);
        self.publish_confirmed("", &self.dead_letter_queue, &delivery.payload, properties).await.map_err(|e| match e {
            Error::Broker { broker, operation, source } => Error::Broker {
                broker,
                operation: format!("dead-letter to queue {:?}: {operation}", self.dead_letter_queue),
                source,
            },
            other => other,
        })
    }

    /// A passive declare of the queue: its ready messages (not yet delivered). RabbitMQ does not count the
    /// delivered, unacknowledged ones over AMQP (its management API does), so `unacked` is `None`.
    async fn lag(&self) -> Result<Option<Lag>> {
        let channel = self.channel().await?;
        let declared = channel
            .queue_declare(
                short(&self.queue),
                QueueDeclareOptions { passive: true, ..durable_queue() },
                FieldTable::default(),
            )
            .await;
        close_quietly(&channel).await;
        let queue =
            declared.map_err(|e| Error::broker(BROKER, format!("read the depth of queue {:?}", self.queue), e))?;
        Ok(Some(Lag::new(None, Some(u64::from(queue.message_count())))))
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::header_text;
    use super::*;

    #[test]
    fn dead_letters_keep_the_original_headers_and_properties_but_never_expire() {
        let mut table = FieldTable::default();
        table.insert("ce_id".into(), AMQPValue::LongString("abc".into()));
        table.insert("x-delivery-count".into(), AMQPValue::LongLongInt(3));
        table.insert("outbox_dead_reason".into(), AMQPValue::LongString("old".into()));
        table.insert("nested".into(), AMQPValue::FieldTable(FieldTable::default()));
        let original = BasicProperties::default()
            .with_headers(table)
            .with_message_id("m1".into())
            .with_expiration("1000".into())
            .with_user_id("guest".into());
        let headers = rebuild_headers(
            &original,
            |n| n.starts_with(dead_header::PREFIX) || n == DELIVERY_COUNT_HEADER,
            vec![("outbox_dead_reason".into(), "new".into())],
        );
        let properties = carried_properties(&original, headers);
        let out = headers_of(&properties);
        assert_eq!(out.get("ce_id").map(String::as_str), Some("abc"));
        assert_eq!(out.get("outbox_dead_reason").map(String::as_str), Some("new"));
        assert!(!out.contains_key("x-delivery-count"));
        assert!(properties.headers().as_ref().is_some_and(|h| h.contains_key("nested")), "non-text headers are kept");
        assert_eq!(properties.message_id().as_ref().map(ToString::to_string).as_deref(), Some("m1"));
        assert_eq!((properties.expiration(), properties.user_id()), (&None, &None));
        assert_eq!(properties.delivery_mode(), &Some(2));
        assert_eq!(header_text(&AMQPValue::LongLongInt(3)).as_deref(), Some("3"));
    }
}

//! NATS JetStream adapter (feature `nats`): [`NatsPublisher`] publishes each event to a subject rendered
//! from a [`Destination`] template and reports success only after the stream's `PubAck`; [`NatsConsumer`]
//! reads a durable pull consumer and acks a message only after the [`MessageHandler`] returned
//! [`Disposition::Ack`] (which an inbox handler does after its commit).
//!
//! # Guarantees and their limits
//!
//! - **Dedup at the broker.** Every message carries `Nats-Msg-Id: <event id>`. A republish within the
//!   stream's `duplicate_window` (lost ack, relay crash between publish and mark) is acked with
//!   `duplicate: true` and not stored again; [`NatsPublisher::ensure_stream`] sets the window to
//!   [`DEFAULT_DUPLICATE_WINDOW`]. After the window, a republish is stored again and the consumer's inbox
//!   drops it.
//! - **Envelope.** All [`envelope_headers`] travel as NATS headers (CloudEvents binary mode), the payload
//!   is the event's JSON as stored.
//! - **Pipelined publishing.** A batch is sent in full (in rounds of [`DEFAULT_MAX_IN_FLIGHT`]), then all
//!   acks are awaited together; the relay never puts two events of one aggregate in one batch, so this
//!   keeps per-aggregate order.
//! - **Permanent failures.** A rendered subject that is not a valid NATS publish subject (empty, whitespace,
//!   empty token, wildcard), a header that NATS cannot carry, or a message larger than the server's
//!   `max_payload` (or the stream's `max_msg_size`) fails with [`PublishError::permanent`]: the row is dead
//!   at once with the reason as `last_error`. Anything else (server unreachable, ack timeout, no stream for
//!   the subject) is transient.
//! - **Consumer.** Explicit acks; [`Disposition::Retry`] retries the message *in place* after a growing
//!   pause, keeping its ack deadline alive with progress acks while the rest of the fetch waits, so a later
//!   event of the same aggregate never overtakes it (with a single consumer process); [`Disposition::Park`] and messages
//!   without an envelope are terminated (`AckKind::Term`, never redelivered) with a warning.
//!
//! Written against async-nats 0.51 and checked with nats-server 2.9: only stream and consumer fields that
//! server accepts are set.
//!
//! ```no_run
//! # async fn demo() -> outbox_core::Result<()> {
//! use outbox_core::Destination;
//! use outbox_core::brokers::nats::{NatsConsumer, NatsPublisher};
//!
//! let publisher =
//!     NatsPublisher::connect("nats://127.0.0.1:4222", Destination::parse("events.{aggregate_type}.{event_type}")?)
//!         .await?;
//! publisher.ensure_stream("EVENTS", &["events.>"]).await?;
//! let consumer = NatsConsumer::connect("nats://127.0.0.1:4222", "EVENTS", "billing", None).await?;
//! # let _ = consumer; Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The NATS client this adapter is built on, for options and stream management beyond the adapter's API.
pub use async_nats;
use async_nats::connection::State;
use async_nats::header::{HeaderMap, HeaderName, HeaderValue, NATS_MESSAGE_ID};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream;
use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::broker::redact_url as redact;
use crate::broker::{Destination, Disposition, MessageHandler, decode_message, envelope_headers};
use crate::envelope::{EventId, OutboxEvent};
use crate::error::{Error, Result};
use crate::publisher::{PublishError, Publisher};

use super::BrokerKind;

const BROKER: &str = "NATS JetStream";

/// The default subject template: `{aggregate_type}.{event_type}`.
pub const DEFAULT_SUBJECT_TEMPLATE: &str = "{aggregate_type}.{event_type}";

/// The dedup window [`NatsPublisher::ensure_stream`] gives a stream: a republish of the same event id
/// within it is acknowledged as a duplicate and not stored again.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// How many publishes [`NatsPublisher`] sends before awaiting their acks, by default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1_000;

/// How long a publish waits for the stream's acknowledgement by default.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a consumer shutting down still waits for messages of its current fetch, to hand them back.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(50);

/// Connects with a bounded connect timeout and a reconnect delay capped at two seconds.
fn connect_options() -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5)).reconnect_delay_callback(|attempts| {
        if attempts <= 1 {
            Duration::ZERO
        } else {
            let exp = u32::try_from(attempts.saturating_sub(2)).unwrap_or(u32::MAX).min(10);
            Duration::from_millis(100u64.saturating_mul(1 << exp)).min(Duration::from_secs(2))
        }
    })
}

/// Checks `url` is a `nats://` URL (or `tls://`/`ws://`/`wss://`, which async-nats also speaks) and connects.
async fn connect_client(url: &str, options: async_nats::ConnectOptions) -> Result<async_nats::Client> {
    let shown = redact(url);
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("tls" | "ws" | "wss") => {}
        _ => {
            if BrokerKind::from_url(&shown)? != BrokerKind::Nats {
                return Err(Error::invalid_config(
                    "broker_url",
                    format!("{shown:?} is not a NATS URL; expected nats://host:4222"),
                ));
            }
        }
    }
    options.connect(url).await.map_err(|e| Error::broker(BROKER, format!("connect to {shown}"), e))
}

/// Why `subject` is not a valid NATS publish subject, if it is not.
fn subject_problem(subject: &str) -> Option<String> {
    if subject.is_empty() {
        return Some("is empty".to_owned());
    }
    if let Some(c) = subject.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Some(format!("contains whitespace or a control character ({c:?})"));
    }
    if subject.split('.').any(str::is_empty) {
        return Some("has an empty token (leading, trailing or doubled `.`)".to_owned());
    }
    if subject.contains(['*', '>']) {
        return Some("contains a wildcard (`*` or `>`); events are published to concrete subjects".to_owned());
    }
    None
}

/// The size of the NATS header block `NATS/1.0\r\n` + `name: value\r\n`... + `\r\n`.
fn header_block_len(headers: &[(String, String)]) -> usize {
    headers.iter().map(|(k, v)| k.len() + v.len() + 4).sum::<usize>() + 12
}

/// The publish error of one event: a JetStream "message too large" (server or stream limit) is permanent,
/// anything else transient.
fn publish_failure(event: &EventId, subject: &str, error: &jetstream::context::PublishError) -> PublishError {
    let too_large = error.kind() == PublishErrorKind::MaxPayloadExceeded
        || std::error::Error::source(error)
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .is_some_and(|e| e.error_code() == jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM);
    let text = match error.kind() {
        PublishErrorKind::StreamNotFound => format!(
            "NATS JetStream: no stream captures subject {subject:?} (event {event}); create one, e.g. with NatsPublisher::ensure_stream"
        ),
        _ => format!("NATS JetStream publish of event {event} to {subject:?} failed: {error}"),
    };
    if too_large { PublishError::permanent(text) } else { PublishError::transient(text) }
}

/// Publishes outbox events to NATS JetStream, one subject per event rendered from a [`Destination`].
///
/// Cheap to clone (the connection is shared).
#[derive(Clone, Debug)]
pub struct NatsPublisher {
    jetstream: jetstream::Context,
    client: async_nats::Client,
    destination: Destination,
    max_in_flight: usize,
}

impl NatsPublisher {
    /// Connects to `url` (`nats://host:4222`, credentials as `nats://user:pass@host:4222`) and publishes to
    /// the subjects `destination` renders.
    ///
    /// Fails with [`Error::InvalidConfig`] for a URL that is not a NATS URL or a template whose fixed parts
    /// can never form a valid subject, and with [`Error::Broker`] when the server does not answer. Once
    /// connected, the client reconnects by itself; publishes fail (transiently) while it is disconnected.
    pub async fn connect(url: &str, destination: Destination) -> Result<Self> {
        Self::connect_with_options(url, connect_options(), destination).await
    }

    /// Like [`connect`](Self::connect) with the client's own options (credentials files, TLS, names...).
    pub async fn connect_with_options(
        url: &str,
        options: async_nats::ConnectOptions,
        destination: Destination,
    ) -> Result<Self> {
        check_template(&destination)?;
        let client = connect_client(url, options).await?;
        Self::from_context(jetstream::new(client), destination)
    }

    /// A publisher over an existing JetStream context; its timeout, if set, is the ack timeout (otherwise
    /// [`DEFAULT_ACK_TIMEOUT`], async-nats' default).
    pub fn from_context(jetstream: jetstream::Context, destination: Destination) -> Result<Self> {
        check_template(&destination)?;
        let client = jetstream.client();
        Ok(NatsPublisher { jetstream, client, destination, max_in_flight: DEFAULT_MAX_IN_FLIGHT })
    }

    /// Sets how long each publish waits for the stream's acknowledgement (default [`DEFAULT_ACK_TIMEOUT`]).
    /// Keep it below the relay's `publish_timeout`.
    pub fn with_ack_timeout(mut self, timeout: Duration) -> Self {
        self.jetstream.set_timeout(timeout);
        self
    }

    /// Sets how many publishes of a batch are sent before their acks are awaited (default
    /// [`DEFAULT_MAX_IN_FLIGHT`]); a larger batch goes out in rounds of this size. Keep it at or below the
    /// JetStream context's `max_ack_inflight` (async-nats default 5,000), or sends wait for acks that are
    /// not awaited yet until the relay's `publish_timeout`. Zero is treated as one.
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight.max(1);
        self
    }

    /// The subject template.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    /// The JetStream context, for stream management beyond [`ensure_stream`](Self::ensure_stream).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// The underlying client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Creates the stream `name` over `subjects` (wildcards allowed, e.g. `order.>`) unless it exists, with
    /// file storage and a [`DEFAULT_DUPLICATE_WINDOW`] dedup window. An existing stream is left as it is.
    pub async fn ensure_stream(&self, name: &str, subjects: &[&str]) -> Result<stream::Info> {
        ensure_stream(&self.jetstream, name, subjects).await
    }

    /// The subject of `event`, or why it is not a valid one.
    fn subject(&self, event: &OutboxEvent) -> std::result::Result<String, PublishError> {
        let subject = self.destination.render(event);
        match subject_problem(&subject) {
            None => Ok(subject),
            Some(problem) => Err(PublishError::permanent(format!(
                "NATS subject {subject:?} rendered from template {:?} for event {} {problem}",
                self.destination.template(),
                event.id
            ))),
        }
    }

    /// The NATS message of `event`: headers and payload, checked against `max_payload`.
    fn message(&self, event: &OutboxEvent, max_payload: usize) -> std::result::Result<PublishMessage, PublishError> {
        let mut envelope = envelope_headers(event);
        envelope.push((NATS_MESSAGE_ID.to_string(), event.id.to_string()));
        let size = event.payload.len() + header_block_len(&envelope);
        if max_payload > 0 && size > max_payload {
            return Err(PublishError::permanent(format!(
                "event {} is {size} bytes as a NATS message (payload {} bytes plus headers), over the server's max_payload of {max_payload} bytes",
                event.id,
                event.payload.len()
            )));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &envelope {
            let name = HeaderName::from_str(name).map_err(|e| {
                PublishError::permanent(format!("event {}: header name {name:?} is not valid in NATS: {e}", event.id))
            })?;
            let value = HeaderValue::from_str(value).map_err(|e| {
                PublishError::permanent(format!("event {}: header {name} has a value NATS cannot carry: {e}", event.id))
            })?;
            headers.insert(name, value);
        }
        Ok(PublishMessage::build().payload(event.payload.clone().into()).headers(headers))
    }

    async fn publish_batch(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let state = self.client.connection_state();
        if state != State::Connected {
            let error = PublishError::transient(format!("NATS JetStream: not connected to the server ({state})"));
            tracing::debug!(%error, "publish skipped");
            return vec![Err(error); events.len()];
        }
        let max_payload = self.client.server_info().max_payload;
        let mut results: Vec<Result<(), PublishError>> = Vec::with_capacity(events.len());
        for chunk in events.chunks(self.max_in_flight) {
            results.extend(self.publish_chunk(chunk, max_payload).await);
        }
        results
    }

    /// Sends every event of `events`, then awaits all their acks.
    async fn publish_chunk(&self, events: &[OutboxEvent], max_payload: usize) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; events.len()];
        let mut pending: Vec<(usize, String, PublishAckFuture)> = Vec::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            let prepared = self.subject(event).and_then(|subject| Ok((self.message(event, max_payload)?, subject)));
            let (message, subject) = match prepared {
                Ok(prepared) => prepared,
                Err(error) => {
                    tracing::warn!(event_id = %event.id, %error, "event cannot be published to NATS");
                    results[i] = Some(Err(error));
                    continue;
                }
            };
            match self.jetstream.send_publish(subject.clone(), message).await {
                Ok(ack) => pending.push((i, subject, ack)),
                Err(error) => {
                    let error = publish_failure(&event.id, &subject, &error);
                    tracing::debug!(event_id = %event.id, messaging.destination.name = %subject, %error, "send failed");
                    results[i] = Some(Err(error));
                }
            }
        }
        let acks = futures_util::future::join_all(
            pending.into_iter().map(|(i, subject, ack)| async move { (i, subject, ack.await) }),
        )
        .await;
        for (i, subject, ack) in acks {
            let event = &events[i];
            results[i] = Some(match ack {
                Ok(ack) => {
                    if ack.duplicate {
                        tracing::debug!(
                            event_id = %event.id,
                            messaging.destination.name = %subject,
                            stream = %ack.stream,
                            "JetStream already had this event (duplicate within the dedup window)"
                        );
                    }
                    Ok(())
                }
                Err(error) => {
                    let error = publish_failure(&event.id, &subject, &error);
                    tracing::debug!(event_id = %event.id, messaging.destination.name = %subject, %error, "no ack");
                    Err(error)
                }
            });
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(PublishError::transient("NATS JetStream: no acknowledgement"))))
            .collect()
    }
}

impl Publisher for NatsPublisher {
    fn publish(&self, events: &[OutboxEvent]) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send {
        let span = tracing::debug_span!(
            "outbox.nats.publish",
            messaging.system = "nats",
            messaging.operation.type = "send",
            messaging.batch.message_count = events.len(),
            messaging.destination.template = %self.destination.template(),
        );
        self.publish_batch(events).instrument(span)
    }
}

/// Checks the fixed parts of a subject template: rendering it with plain placeholder values must give a
/// valid subject.
fn check_template(destination: &Destination) -> Result<()> {
    let rendered = destination.render_sample();
    match subject_problem(&rendered) {
        None => Ok(()),
        Some(problem) => Err(Error::invalid_config(
            "destination",
            format!(
                "template {:?} cannot form a NATS subject: with every placeholder filled in it {problem}",
                destination.template()
            ),
        )),
    }
}

async fn ensure_stream(jetstream: &jetstream::Context, name: &str, subjects: &[&str]) -> Result<stream::Info> {
    if name.is_empty() || name.contains(['.', '*', '>', ' ', '\t', '/', '\\']) {
        return Err(Error::invalid_config(
            "stream",
            format!(
                "{name:?} is not a valid JetStream stream name (non-empty, no `.`, `*`, `>`, whitespace or slashes)"
            ),
        ));
    }
    if subjects.is_empty() {
        return Err(Error::invalid_config("subjects", format!("stream {name:?} needs at least one subject")));
    }
    let config = stream::Config {
        name: name.to_owned(),
        subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
        storage: stream::StorageType::File,
        num_replicas: 1,
        duplicate_window: DEFAULT_DUPLICATE_WINDOW,
        ..Default::default()
    };
    let mut stream = jetstream
        .get_or_create_stream(config)
        .await
        .map_err(|e| Error::broker(BROKER, format!("create stream {name:?}"), e))?;
    stream.info().await.cloned().map_err(|e| Error::broker(BROKER, format!("read stream {name:?}"), e))
}

/// Settings of a [`NatsConsumer`].
#[derive(Clone, Debug)]
pub struct NatsConsumerOptions {
    /// Messages per fetch (default 100). A fetched message waits for the ones before it, so keep
    /// `batch_size` × handler time well below `ack_wait`, or messages are redelivered (the inbox drops the
    /// copies) while they wait.
    pub batch_size: usize,
    /// How long one fetch waits for messages when the stream is idle (default 1 s).
    pub fetch_wait: Duration,
    /// How long the server waits for an ack before redelivering (default 30 s); applied when the durable
    /// consumer is created.
    pub ack_wait: Duration,
    /// Deliveries of one message before the server gives up on it (default 100, `-1` for no limit); applied
    /// when the durable consumer is created. Parked messages are terminated at their first delivery; this
    /// bounds crash loops. A message that reaches it is no longer delivered (the server only emits a
    /// `MAX_DELIVERIES` advisory), so keep it well above what an outage of the handler's database costs:
    /// while retrying, only the message at the head of the line spends deliveries.
    pub max_deliver: i64,
    /// The pause after the first [`Disposition::Retry`] (default 500 ms); doubles on each consecutive retry.
    pub retry_delay: Duration,
    /// The longest pause between retries (default 30 s).
    pub max_retry_delay: Duration,
}

impl Default for NatsConsumerOptions {
    fn default() -> Self {
        NatsConsumerOptions {
            batch_size: 100,
            fetch_wait: Duration::from_secs(1),
            ack_wait: Duration::from_secs(30),
            max_deliver: 100,
            retry_delay: Duration::from_millis(500),
            max_retry_delay: Duration::from_secs(30),
        }
    }
}

impl NatsConsumerOptions {
    fn validate(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::invalid_config("batch_size", "is zero; every fetch would return nothing"));
        }
        if self.fetch_wait < Duration::from_millis(10) {
            return Err(Error::invalid_config("fetch_wait", "is below 10 ms; use at least 10 ms"));
        }
        if self.ack_wait < Duration::from_secs(1) {
            return Err(Error::invalid_config("ack_wait", "is below 1 s; messages would be redelivered mid-handler"));
        }
        if self.max_deliver == 0 || self.max_deliver < -1 {
            return Err(Error::invalid_config("max_deliver", "must be positive, or -1 for unlimited"));
        }
        if self.retry_delay.is_zero() || self.max_retry_delay < self.retry_delay {
            return Err(Error::invalid_config("retry_delay", "must be non-zero and not above max_retry_delay"));
        }
        Ok(())
    }

    fn retry_pause(&self, consecutive: u32) -> Duration {
        let factor = 1u32 << consecutive.saturating_sub(1).min(16);
        self.retry_delay.saturating_mul(factor).min(self.max_retry_delay)
    }
}

/// Reads a JetStream stream through a durable pull consumer and hands each message to a
/// [`MessageHandler`]: ack after [`Disposition::Ack`], nak after [`Disposition::Retry`], terminate after
/// [`Disposition::Park`] or when the message has no valid envelope.
#[derive(Debug)]
pub struct NatsConsumer {
    consumer: PullConsumer,
    stream: String,
    durable: String,
    options: NatsConsumerOptions,
}

impl NatsConsumer {
    /// Connects to `url` and binds the durable consumer `durable_name` on `stream`, creating it (explicit
    /// acks, from the first message, only `filter_subject` if given) when it does not exist yet.
    pub async fn connect(url: &str, stream: &str, durable_name: &str, filter_subject: Option<&str>) -> Result<Self> {
        Self::connect_with(url, stream, durable_name, filter_subject, NatsConsumerOptions::default()).await
    }

    /// Like [`connect`](Self::connect) with explicit [`NatsConsumerOptions`].
    pub async fn connect_with(
        url: &str,
        stream: &str,
        durable_name: &str,
        filter_subject: Option<&str>,
        options: NatsConsumerOptions,
    ) -> Result<Self> {
        options.validate()?;
        let client = connect_client(url, connect_options()).await?;
        Self::from_context(jetstream::new(client), stream, durable_name, filter_subject, options).await
    }

    /// Binds (or creates) the durable consumer over an existing JetStream context.
    pub async fn from_context(
        jetstream: jetstream::Context,
        stream: &str,
        durable_name: &str,
        filter_subject: Option<&str>,
        options: NatsConsumerOptions,
    ) -> Result<Self> {
        options.validate()?;
        if durable_name.is_empty() || durable_name.contains(['.', '*', '>', ' ', '\t']) {
            return Err(Error::invalid_config(
                "durable_name",
                format!("{durable_name:?} is not a valid consumer name (non-empty, no `.`, `*`, `>` or whitespace)"),
            ));
        }
        let handle = jetstream
            .get_stream(stream)
            .await
            .map_err(|e| Error::broker(BROKER, format!("find stream {stream:?}"), e))?;
        let config = pull::Config {
            durable_name: Some(durable_name.to_owned()),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: options.ack_wait,
            max_deliver: options.max_deliver,
            filter_subject: filter_subject.unwrap_or_default().to_owned(),
            ..Default::default()
        };
        let consumer = handle
            .get_or_create_consumer(durable_name, config)
            .await
            .map_err(|e| Error::broker(BROKER, format!("create consumer {durable_name:?} on stream {stream:?}"), e))?;
        Ok(NatsConsumer { consumer, stream: stream.to_owned(), durable: durable_name.to_owned(), options })
    }

    /// The stream name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The durable consumer name.
    pub fn durable_name(&self) -> &str {
        &self.durable
    }

    /// The server's view of the consumer (pending, redelivered, ack floor).
    pub async fn info(&self) -> Result<jetstream::consumer::Info> {
        self.consumer
            .get_info()
            .await
            .map_err(|e| Error::broker(BROKER, format!("read consumer {:?} on {:?}", self.durable, self.stream), e))
    }

    /// Fetches and handles messages until `shutdown` is cancelled, then finishes the message in hand and
    /// hands the rest of its fetch back (nak) before returning.
    ///
    /// One message at a time, in stream order: [`Disposition::Ack`] acks it (the handler returns it only
    /// after its commit; a lost ack means a redelivery the inbox drops); [`Disposition::Retry`] retries it in
    /// place after a pause ([`NatsConsumerOptions::retry_delay`], doubling up to `max_retry_delay`), with
    /// progress acks so it stays at the head of the line, until the handler acks or parks it (a handler that
    /// retries forever stalls the consumer, as order demands: return `Park` for what can never succeed);
    /// [`Disposition::Park`] and a message without a valid envelope are terminated with a warning. Fetch
    /// errors (server unreachable, leader change, consumer deleted) are logged and retried with a pause; the
    /// client reconnects by itself.
    pub async fn run<H: MessageHandler>(&self, handler: H, shutdown: CancellationToken) -> Result<()> {
        let span = tracing::info_span!(
            "outbox.nats.consume",
            messaging.system = "nats",
            messaging.destination.name = %self.stream,
            messaging.consumer.group.name = %self.durable,
        );
        self.run_loop(&handler, &shutdown).instrument(span).await
    }

    async fn run_loop<H: MessageHandler>(&self, handler: &H, shutdown: &CancellationToken) -> Result<()> {
        let mut fetch_failures = 0u32;
        while !shutdown.is_cancelled() {
            let size = self.options.batch_size;
            let started = Instant::now();
            let fetched = tokio::select! {
                () = shutdown.cancelled() => break,
                fetched = self.consumer.fetch().max_messages(size).expires(self.options.fetch_wait).messages() => fetched,
            };
            let mut batch = match fetched {
                Ok(batch) => batch,
                Err(error) => {
                    fetch_failures = fetch_failures.saturating_add(1);
                    let pause = self.options.retry_pause(fetch_failures).min(Duration::from_secs(5));
                    tracing::warn!(%error, ?pause, "NATS JetStream fetch failed; retrying");
                    pause_or_shutdown(pause, shutdown).await;
                    continue;
                }
            };
            let mut received = 0usize;
            let mut hand_back = false;
            let mut batch_failed = false;
            loop {
                let next = tokio::select! {
                    biased;
                    next = batch.next() => next,
                    // On shutdown, still take (and hand back) what is already on its way.
                    () = shutdown.cancelled() => tokio::time::timeout(SHUTDOWN_GRACE, batch.next()).await.ok().flatten(),
                };
                let message = match next {
                    None => break,
                    Some(Ok(message)) => message,
                    Some(Err(error)) => {
                        fetch_failures = fetch_failures.saturating_add(1);
                        batch_failed = true;
                        tracing::warn!(%error, "NATS JetStream fetch ended with an error; retrying");
                        break;
                    }
                };
                received += 1;
                if hand_back || shutdown.is_cancelled() {
                    // On shutdown hand the rest back in order, unprocessed.
                    if let Err(error) = message.ack_with(AckKind::Nak(None)).await {
                        tracing::debug!(%error, "nak failed; the message is redelivered after ack_wait");
                    }
                    continue;
                }
                // Retry in place: the message stays at the head of the line (its ack deadline pushed back
                // with progress acks) and the rest of the fetch waits, so a later event of the same aggregate
                // can never overtake it. Naking instead would let JetStream redeliver it behind later
                // messages, into the still-open pull request.
                let mut attempt = 0u32;
                let disposition = loop {
                    match self.handle(handler, &message).await {
                        Disposition::Retry => {
                            attempt = attempt.saturating_add(1);
                            let pause = self.options.retry_pause(attempt);
                            tracing::debug!(?pause, attempt, "handler asked for a retry; retrying in place");
                            if let Err(error) = message.ack_with(AckKind::Progress).await {
                                tracing::debug!(%error, "progress ack failed");
                            }
                            pause_or_shutdown(pause, shutdown).await;
                            if shutdown.is_cancelled() {
                                break Disposition::Retry;
                            }
                        }
                        settled => break settled,
                    }
                };
                match disposition {
                    Disposition::Ack => {
                        if let Err(error) = message.ack().await {
                            tracing::warn!(%error, "ack failed; the message comes back after ack_wait and the inbox drops it");
                        }
                    }
                    Disposition::Retry => {
                        // Only on shutdown: hand it and the rest of the fetch back, in order.
                        hand_back = true;
                        if let Err(error) = message.ack_with(AckKind::Nak(None)).await {
                            tracing::debug!(%error, "nak failed; the message is redelivered after ack_wait");
                        }
                    }
                    Disposition::Park => {
                        if let Err(error) = message.ack_with(AckKind::Term).await {
                            tracing::warn!(%error, "terminate failed; the message comes back after ack_wait");
                        }
                    }
                }
            }
            if !batch_failed {
                fetch_failures = 0;
            }
            if batch_failed {
                let pause = self.options.retry_pause(fetch_failures).min(Duration::from_secs(5));
                pause_or_shutdown(pause, shutdown).await;
            } else if received == 0 && started.elapsed() < self.options.fetch_wait / 2 {
                // The server answered "no messages" at once: do not spin.
                pause_or_shutdown(self.options.fetch_wait / 4, shutdown).await;
            }
        }
        Ok(())
    }

    /// Decodes `message` and runs the handler; a message without a valid envelope is parked.
    async fn handle<H: MessageHandler>(&self, handler: &H, message: &jetstream::Message) -> Disposition {
        let span = tracing::debug_span!(
            "outbox.nats.message",
            messaging.system = "nats",
            messaging.destination.name = %message.subject,
            messaging.message.id = tracing::field::Empty,
            messaging.operation.type = "process",
        );
        let headers: BTreeMap<String, String> = message
            .headers
            .iter()
            .flat_map(|headers| headers.iter())
            .filter_map(|(name, values)| values.last().map(|v| (name.to_string(), v.as_str().to_owned())))
            .collect();
        let event = match decode_message(&headers, &message.payload) {
            Ok(event) => event,
            Err(error) => {
                let _enter = span.enter();
                tracing::warn!(
                    %error,
                    stream = %self.stream,
                    consumer = %self.durable,
                    "parking a NATS message without a valid outbox envelope (terminated, not redelivered)"
                );
                return Disposition::Park;
            }
        };
        span.record("messaging.message.id", tracing::field::display(&event.id));
        let id = event.id;
        let disposition = crate::broker::handle_guarded(handler, event).instrument(span.clone()).await;
        if disposition == Disposition::Park {
            let _enter = span.enter();
            tracing::warn!(
                event_id = %id,
                stream = %self.stream,
                consumer = %self.durable,
                "handler parked the message: terminated, not redelivered"
            );
        }
        disposition
    }
}

async fn pause_or_shutdown(pause: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = tokio::time::sleep(pause) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_checked_before_publishing() {
        assert_eq!(subject_problem("order.placed"), None);
        assert_eq!(subject_problem("order.o-1.placed"), None);
        assert!(subject_problem("").is_some());
        assert!(subject_problem("order.o 1").is_some_and(|p| p.contains("whitespace")));
        assert!(subject_problem("order..placed").is_some_and(|p| p.contains("empty token")));
        assert!(subject_problem(".order").is_some());
        assert!(subject_problem("order.").is_some());
        assert!(subject_problem("order.*").is_some_and(|p| p.contains("wildcard")));
        assert!(subject_problem("order.>").is_some());
    }

    #[test]
    fn templates_with_bad_fixed_parts_are_rejected_at_config_time() {
        let ok = Destination::parse("events.{aggregate_type}.{event_type}").unwrap();
        assert!(check_template(&ok).is_ok());
        for bad in ["events..{event_type}", "events.{event_type}.", "events *.{event_type}", "events.>"] {
            let d = Destination::parse(bad).unwrap();
            let err = check_template(&d).unwrap_err();
            assert!(err.to_string().contains("cannot form a NATS subject"), "{bad}: {err}");
        }
    }

    #[test]
    fn credentials_never_reach_messages() {
        assert_eq!(redact("nats://user:secret@host:4222"), "nats://***@host:4222");
        assert_eq!(redact("nats://host:4222"), "nats://host:4222");
        assert_eq!(redact("user:secret@host:4222"), "***@host:4222");
    }

    #[test]
    fn retry_pauses_grow_and_cap() {
        let o = NatsConsumerOptions::default();
        assert_eq!(o.retry_pause(1), Duration::from_millis(500));
        assert_eq!(o.retry_pause(2), Duration::from_secs(1));
        assert_eq!(o.retry_pause(40), Duration::from_secs(30));
        assert!(o.validate().is_ok());
        assert!(NatsConsumerOptions { batch_size: 0, ..o }.validate().is_err());
    }
}

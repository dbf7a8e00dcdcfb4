//! [`NatsTransport`]: a durable pull consumer as the consume driver's [`Transport`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, stream};
use async_nats::{Client, Subject};
use futures_util::StreamExt as _;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::consume::held::{HeldSet, KeepAlive, keep_held_alive};
use crate::consume::{DeadLetter, Delivery, Lag, Transport, dead_header};
use crate::error::{Error, Result};
use crate::text::{one_line, truncate};

use super::BROKER;
use super::config::{
    DEFAULT_DUPLICATE_WINDOW, NatsTransportOptions, check_name, connect_client, connect_options, subject_matches,
    subject_problem,
};
use super::headers::{CONTROL_HEADER_PREFIX, header_block_len, header_map, headers_of};
use super::recovery::Recovery;

/// What identifies a delivered message to [`NatsTransport`]: its ack subject and stream sequence.
#[derive(Clone, Debug)]
pub struct NatsReceipt {
    key: u64,
    reply: Subject,
    stream_sequence: u64,
}

impl NatsReceipt {
    /// The message's sequence number in the stream.
    pub fn stream_sequence(&self) -> u64 {
        self.stream_sequence
    }
}

/// A message the transport handed to the driver and that is not acked or released yet.
/// What the transport and its keep-alive task share.
struct Shared {
    client: Client,
    held: HeldSet<u64, Subject>,
    next_key: AtomicU64,
}

/// The consume side of NATS JetStream: a durable pull consumer with explicit acks, for
/// [`Consumer::run`](crate::Consumer::run). See the [module docs](super) for what each method does on
/// the broker and what order holds.
pub struct NatsTransport {
    pub(super) jetstream: jetstream::Context,
    consumer: PullConsumer,
    pub(super) stream: String,
    durable: String,
    pub(super) dead_stream: String,
    pub(super) dead_subject: String,
    ack_wait: Duration,
    pub(super) options: NatsTransportOptions,
    shared: Arc<Shared>,
    recovery: Recovery<NatsReceipt>,
    _keeper: DropGuard,
}

impl std::fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsTransport")
            .field("stream", &self.stream)
            .field("durable", &self.durable)
            .field("dead_letter_stream", &self.dead_stream)
            .field("dead_letter_subject", &self.dead_subject)
            .field("ack_wait", &self.ack_wait)
            .field("held", &self.shared.held.len())
            .finish_non_exhaustive()
    }
}

impl NatsTransport {
    /// Connects to `url` and binds the durable consumer `durable_name` on `stream`, creating it (explicit
    /// acks, from the stream's first message, only `filter_subject` if given) when it does not exist, and
    /// the dead-letter stream `<stream>_DEAD` with subject `outbox.dead.<stream>.<durable_name>` when
    /// missing. Default [`NatsTransportOptions`].
    ///
    /// A URL that is not a NATS URL, an invalid name (stream, durable, dead-letter stream or subject), a
    /// dead-letter subject the source stream captures, or an existing durable without explicit acks is
    /// an [`Error::InvalidConfig`]; an unreachable server or a missing stream is an [`Error::Broker`].
    pub async fn connect(url: &str, stream: &str, durable_name: &str, filter_subject: Option<&str>) -> Result<Self> {
        Self::connect_with(url, stream, durable_name, filter_subject, NatsTransportOptions::default()).await
    }

    /// Like [`connect`](Self::connect) with explicit [`NatsTransportOptions`].
    pub async fn connect_with(
        url: &str,
        stream: &str,
        durable_name: &str,
        filter_subject: Option<&str>,
        options: NatsTransportOptions,
    ) -> Result<Self> {
        options.validate()?;
        let client = connect_client(url, connect_options()).await?;
        Self::from_context(jetstream::new(client), stream, durable_name, filter_subject, options).await
    }

    /// Like [`connect_with`](Self::connect_with) over an existing JetStream context (its client's
    /// credentials, TLS and reconnect settings).
    pub async fn from_context(
        jetstream: jetstream::Context,
        stream: &str,
        durable_name: &str,
        filter_subject: Option<&str>,
        options: NatsTransportOptions,
    ) -> Result<Self> {
        options.validate()?;
        check_name("stream", stream)?;
        check_name("durable_name", durable_name)?;
        if let Some(filter) = filter_subject
            && (filter.is_empty()
                || filter.split('.').any(str::is_empty)
                || filter.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(Error::invalid_config(
                "filter_subject",
                format!("{:?} is not a valid NATS subject filter", one_line(filter)),
            ));
        }
        let dead_stream = options.dead_letter_stream_for(stream);
        check_name("dead_letter_stream", &dead_stream)?;
        let dead_subject = options.dead_letter_subject_for(stream, durable_name);
        if let Some(problem) = subject_problem(&dead_subject) {
            return Err(Error::invalid_config(
                "dead_letter_subject",
                format!("{:?} is not a valid NATS subject: it {problem}", one_line(&dead_subject)),
            ));
        }
        if dead_stream == stream {
            return Err(Error::invalid_config(
                "dead_letter_stream",
                format!("is the consumed stream {stream:?} itself; dead letters would be delivered again"),
            ));
        }

        let mut source = jetstream
            .get_stream(stream)
            .await
            .map_err(|e| Error::broker(BROKER, format!("find stream {stream:?}"), e))?;
        let source_config = source
            .info()
            .await
            .map_err(|e| Error::broker(BROKER, format!("read stream {stream:?}"), e))?
            .config
            .clone();
        let source_subjects = source_config.subjects;
        if let Some(pattern) = source_subjects.iter().find(|p| subject_matches(p, &dead_subject)) {
            return Err(Error::invalid_config(
                "dead_letter_subject",
                format!(
                    "{dead_subject:?} is captured by the consumed stream {stream:?} (subject {pattern:?}); dead letters would be delivered again"
                ),
            ));
        }

        let config = pull::Config {
            durable_name: Some(durable_name.to_owned()),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: options.ack_wait,
            max_deliver: options.max_deliver,
            filter_subject: filter_subject.unwrap_or_default().to_owned(),
            ..Default::default()
        };
        let consumer: PullConsumer = source
            .get_or_create_consumer(durable_name, config)
            .await
            .map_err(|e| Error::broker(BROKER, format!("create consumer {durable_name:?} on stream {stream:?}"), e))?;
        let existing = &consumer.cached_info().config;
        if existing.ack_policy != AckPolicy::Explicit {
            return Err(Error::invalid_config(
                "durable_name",
                format!(
                    "consumer {durable_name:?} on stream {stream:?} exists with ack policy {:?}; the outbox consumer needs explicit acks (under `all`, the ack of a later message would ack earlier ones still waiting for a retry)",
                    existing.ack_policy
                ),
            ));
        }
        if let Some(filter) = filter_subject
            && existing.filter_subject != filter
        {
            return Err(Error::invalid_config(
                "filter_subject",
                format!(
                    "consumer {durable_name:?} on stream {stream:?} exists with filter subject {:?}, not {filter:?}",
                    existing.filter_subject
                ),
            ));
        }
        let ack_wait = if existing.ack_wait.is_zero() { options.ack_wait } else { existing.ack_wait };
        if ack_wait != options.ack_wait {
            tracing::info!(
                messaging.system = "nats",
                consumer = durable_name,
                ?ack_wait,
                "the durable consumer exists with its own ack_wait; keeping messages alive by it"
            );
        }
        ensure_dead_letter_stream(&jetstream, &dead_stream, &dead_subject, source_config.num_replicas).await?;

        let shared =
            Arc::new(Shared { client: jetstream.client(), held: HeldSet::default(), next_key: AtomicU64::new(0) });
        let stop = CancellationToken::new();
        tokio::spawn(keep_held_alive(shared.clone(), (ack_wait / 3).max(Duration::from_millis(200)), stop.clone()));
        let connects = shared.client.statistics().connects.load(Ordering::Relaxed);
        Ok(NatsTransport {
            jetstream,
            consumer,
            stream: stream.to_owned(),
            durable: durable_name.to_owned(),
            dead_stream,
            dead_subject,
            ack_wait,
            options,
            shared,
            recovery: Recovery::new(connects),
            _keeper: stop.drop_guard(),
        })
    }

    /// The stream read.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The durable consumer's name.
    pub fn durable_name(&self) -> &str {
        &self.durable
    }

    /// The stream dead letters go to.
    pub fn dead_letter_stream(&self) -> &str {
        &self.dead_stream
    }

    /// The subject dead letters are published to.
    pub fn dead_letter_subject(&self) -> &str {
        &self.dead_subject
    }

    /// The consumer's `ack_wait` as the server has it.
    pub fn ack_wait(&self) -> Duration {
        self.ack_wait
    }

    /// The JetStream context, for stream management beyond this API.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// The server's view of the durable consumer (pending, redelivered, ack floor).
    pub async fn info(&self) -> Result<jetstream::consumer::Info> {
        self.consumer.get_info().await.map_err(|e| {
            Error::broker(BROKER, format!("read consumer {:?} on stream {:?}", self.durable, self.stream), e)
        })
    }

    fn what(&self, operation: &str, receipt: &NatsReceipt) -> String {
        format!(
            "{operation} message {} of stream {:?} (consumer {:?})",
            receipt.stream_sequence, self.stream, self.durable
        )
    }

    fn forget(&self, receipt: &NatsReceipt) {
        self.shared.held.remove(&receipt.key);
    }

    /// Something may have been delivered and not received: check before the next fetch.
    fn suspect(&self) {
        self.recovery.suspect();
    }

    /// Whether the next fetch is a recovering one (see the `recovery` module): asks the server
    /// for its count of unacknowledged deliveries when the recovery state calls for a check.
    async fn recovering(&self) -> Result<bool> {
        if !self.options.wait_for_lost_deliveries {
            return Ok(false);
        }
        let connects = self.shared.client.statistics().connects.load(Ordering::Relaxed);
        if !self.recovery.needs_check(connects, &self.durable) {
            return Ok(false);
        }
        let info = tokio::time::timeout(self.options.request_timeout, self.info())
            .await
            .map_err(|_| Error::broker(BROKER, format!("read consumer {:?}", self.durable), "timed out"))??;
        // Held: handed to the driver or stashed, and not acked or released.
        let held = self.shared.held.len();
        Ok(self.recovery.checked(connects, info.num_ack_pending, held, self.ack_wait, &self.durable))
    }

    /// One pull request for up to `max` messages that expires after `wait`.
    async fn pull(&self, max: usize, wait: Duration) -> Result<Vec<Delivery<NatsReceipt>>> {
        let wait = wait.max(Duration::from_millis(10));
        let request = self.consumer.fetch().max_messages(max.max(1)).expires(wait).messages();
        let mut batch = match tokio::time::timeout(self.options.request_timeout, request).await {
            Ok(Ok(batch)) => batch,
            Ok(Err(error)) => {
                self.suspect();
                return Err(Error::broker(BROKER, format!("fetch from stream {:?}", self.stream), error));
            }
            Err(_) => {
                self.suspect();
                return Err(Error::broker(BROKER, format!("fetch from stream {:?}", self.stream), "timed out"));
            }
        };
        // The client ends a request 5 s after it expired; end it a little before, noting the loss.
        let deadline = Instant::now() + wait + Duration::from_secs(4);
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, batch.next()).await {
                Ok(None) => break,
                Ok(Some(Ok(message))) => out.extend(self.delivery(message)),
                Ok(Some(Err(error))) => {
                    self.suspect();
                    if out.is_empty() {
                        return Err(Error::broker(BROKER, format!("fetch from stream {:?}", self.stream), error));
                    }
                    tracing::warn!(%error, received = out.len(), "a NATS fetch ended with an error");
                    break;
                }
                Err(_) => {
                    self.suspect();
                    tracing::warn!(
                        received = out.len(),
                        "a NATS fetch did not end in time; checking for lost deliveries"
                    );
                    break;
                }
            }
        }
        Ok(out)
    }

    /// The delivery of one fetched message, now held.
    fn delivery(&self, message: jetstream::Message) -> Option<Delivery<NatsReceipt>> {
        let (stream_sequence, delivered) = match message.info() {
            Ok(info) => (info.stream_sequence, info.delivered),
            Err(error) => {
                tracing::warn!(%error, subject = %one_line(&message.subject), "a fetched message has no JetStream ack subject; ignored");
                return None;
            }
        };
        let reply = message.reply.clone()?;
        let key = self.shared.next_key.fetch_add(1, Ordering::Relaxed);
        self.shared.held.insert(key, reply.clone());
        Some(Delivery {
            headers: headers_of(message.headers.as_ref()),
            payload: message.payload.to_vec(),
            origin: message.subject.to_string(),
            deliveries: u32::try_from(delivered.max(1)).unwrap_or(u32::MAX),
            receipt: NatsReceipt { key, reply, stream_sequence },
        })
    }
}

/// Creates the dead-letter stream with `subject` when missing, with as many replicas as the consumed
/// stream (on a cluster, dead letters are kept as safely as the messages), or adds `subject` to it.
async fn ensure_dead_letter_stream(
    jetstream: &jetstream::Context,
    name: &str,
    subject: &str,
    replicas: usize,
) -> Result<()> {
    let config = stream::Config {
        name: name.to_owned(),
        subjects: vec![subject.to_owned()],
        storage: stream::StorageType::File,
        num_replicas: replicas.max(1),
        duplicate_window: DEFAULT_DUPLICATE_WINDOW,
        ..Default::default()
    };
    let mut dead = jetstream
        .get_or_create_stream(config)
        .await
        .map_err(|e| Error::broker(BROKER, format!("create dead-letter stream {name:?} for subject {subject:?}"), e))?;
    let info = dead.info().await.map_err(|e| Error::broker(BROKER, format!("read dead-letter stream {name:?}"), e))?;
    if info.config.subjects.iter().any(|p| subject_matches(p, subject)) {
        return Ok(());
    }
    let mut config = info.config.clone();
    config.subjects.push(subject.to_owned());
    jetstream
        .update_stream(config)
        .await
        .map_err(|e| Error::broker(BROKER, format!("add subject {subject:?} to dead-letter stream {name:?}"), e))?;
    tracing::info!(messaging.system = "nats", stream = name, subject, "subject added to the dead-letter stream");
    Ok(())
}

impl KeepAlive for Shared {
    type Key = u64;
    type Value = Subject;

    fn held(&self) -> &HeldSet<u64, Subject> {
        &self.held
    }

    /// `+WPI` (work in progress) to each: the server restarts the message's `ack_wait`.
    async fn keep_alive(&self, due: Vec<(u64, Subject)>) -> Result<(), String> {
        for (_, reply) in due {
            self.client.publish(reply, "+WPI".into()).await.map_err(|e| format!("progress ack: {e}"))?;
        }
        Ok(())
    }
}

impl Transport for NatsTransport {
    type Receipt = NatsReceipt;

    fn broker(&self) -> &'static str {
        BROKER
    }

    fn source(&self) -> String {
        format!("stream {} (consumer {})", self.stream, self.durable)
    }

    /// One pull request for up to `max` messages that expires after `wait`: the server answers at once
    /// with what is ready, or with the first message to arrive, or with nothing after `wait`. While
    /// recovering lost deliveries (see [`NatsTransportOptions::wait_for_lost_deliveries`]), only
    /// redeliveries are handed out and new messages wait.
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery<NatsReceipt>>> {
        if !self.recovering().await? {
            let stashed = self.recovery.take_stash(max);
            if !stashed.is_empty() {
                return Ok(stashed);
            }
            return self.pull(max, wait).await;
        }
        let max = if self.recovery.stashed() { 1 } else { max };
        let batch = self.pull(max, wait).await?;
        Ok(self.recovery.sort_recovered(batch))
    }

    /// `+ACK`, as a request: `Ok` once the server confirmed it.
    async fn ack(&self, receipt: &NatsReceipt) -> Result<()> {
        self.forget(receipt);
        let request = self.shared.client.request(receipt.reply.clone(), "+ACK".into());
        match tokio::time::timeout(self.options.request_timeout, request).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(Error::broker(BROKER, self.what("ack", receipt), error)),
            Err(_) => Err(Error::broker(BROKER, self.what("ack", receipt), "no confirmation in time")),
        }
    }

    /// Every `+ACK` written, then one flush: the server has read them all once its `PONG` arrives (one
    /// round trip for the group instead of a request per message). A lost ack costs a redelivery, which
    /// the inbox absorbs.
    async fn ack_all(&self, receipts: &[&NatsReceipt]) -> Result<()> {
        let client = &self.shared.client;
        for receipt in receipts {
            self.forget(receipt);
            client
                .publish(receipt.reply.clone(), "+ACK".into())
                .await
                .map_err(|e| Error::broker(BROKER, self.what("ack", receipt), e))?;
        }
        let what = || format!("ack {} messages of stream {:?}", receipts.len(), self.stream);
        match tokio::time::timeout(self.options.request_timeout, client.flush()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(Error::broker(BROKER, what(), error)),
            Err(_) => Err(Error::broker(BROKER, what(), "flush timed out")),
        }
    }

    /// `-NAK`: the server redelivers the message at once, ahead of newer ones.
    async fn release(&self, receipt: &NatsReceipt) -> Result<()> {
        self.forget(receipt);
        let client = &self.shared.client;
        client
            .publish(receipt.reply.clone(), "-NAK".into())
            .await
            .map_err(|e| Error::broker(BROKER, self.what("release", receipt), e))?;
        match tokio::time::timeout(self.options.request_timeout, client.flush()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(Error::broker(BROKER, self.what("release", receipt), error)),
            Err(_) => Err(Error::broker(BROKER, self.what("release", receipt), "flush timed out")),
        }
    }

    /// Publishes the original payload with the original headers plus the dead-letter headers to the
    /// dead-letter subject and waits for the dead-letter stream's `PubAck`.
    async fn dead_letter(&self, delivery: &Delivery<NatsReceipt>, letter: &DeadLetter) -> Result<()> {
        let receipt = &delivery.receipt;
        // JetStream control headers (Nats-Msg-Id...) are kept renamed: the original id would make the
        // dead-letter stream drop a second dead letter of the same event as a duplicate.
        let (control, original): (BTreeMap<_, _>, BTreeMap<_, _>) =
            delivery.headers.clone().into_iter().partition(|(k, _)| k.starts_with(CONTROL_HEADER_PREFIX));
        let mut headers = letter.headers(&original);
        headers.extend(control.into_iter().map(|(k, v)| (format!("{}{k}", dead_header::PREFIX), v)));
        headers.push((
            "Nats-Msg-Id".to_owned(),
            format!("outbox-dead:{}:{}:{}", self.stream, self.durable, receipt.stream_sequence),
        ));
        let max_payload = self.shared.client.server_info().max_payload;
        let size = delivery.payload.len() + header_block_len(&headers);
        if max_payload > 0 && size > max_payload {
            // Shorten the reason to fit; the payload and the original headers are kept as they are.
            let over = size - max_payload;
            if let Some((_, reason)) = headers.iter_mut().find(|(k, _)| k == dead_header::REASON) {
                *reason = truncate(reason, reason.len().saturating_sub(over).max(16));
            }
        }
        let message = PublishMessage::build()
            .payload(delivery.payload.clone().into())
            .headers(header_map(&headers)?)
            .expected_stream(&self.dead_stream);
        let what = || {
            format!("{} to {:?} in stream {:?}", self.what("dead-letter", receipt), self.dead_subject, self.dead_stream)
        };
        let publish = async {
            let ack = self
                .jetstream
                .send_publish(self.dead_subject.clone(), message)
                .await
                .map_err(|e| Error::broker(BROKER, what(), e))?;
            ack.await.map_err(|e| Error::broker(BROKER, what(), e))
        };
        let ack = tokio::time::timeout(self.options.request_timeout, publish)
            .await
            .map_err(|_| Error::broker(BROKER, what(), "no PubAck in time"))??;
        tracing::debug!(dead_letter_sequence = ack.sequence, duplicate = ack.duplicate, "dead letter stored");
        Ok(())
    }

    /// The durable consumer's info: `num_ack_pending` (delivered, not acknowledged) and `num_pending` (in
    /// the stream, not yet delivered).
    async fn lag(&self) -> Result<Option<Lag>> {
        let info = self.info().await?;
        Ok(Some(Lag::new(Some(info.num_ack_pending as u64), Some(info.num_pending))))
    }
}

impl Drop for NatsTransport {
    /// Hands stashed messages back (`-NAK`), so they are redelivered at once rather than after `ack_wait`.
    fn drop(&mut self) {
        let stash = self.recovery.drain();
        if stash.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let client = self.shared.client.clone();
        runtime.spawn(async move {
            for receipt in stash {
                if client.publish(receipt.reply, "-NAK".into()).await.is_err() {
                    return;
                }
            }
            let _ = client.flush().await;
        });
    }
}

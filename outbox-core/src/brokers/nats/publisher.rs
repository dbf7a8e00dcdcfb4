//! [`NatsPublisher`]: each event to the subject its [`Destination`] renders, reported only after the
//! stream's `PubAck`.

use std::str::FromStr;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::header::{HeaderMap, HeaderName, HeaderValue, NATS_MESSAGE_ID};
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, stream};
use tracing::Instrument;

use crate::broker::{Destination, envelope_headers};
use crate::envelope::{EventId, OutboxEvent};
use crate::error::{Error, Result};
use crate::publisher::{PublishError, Publisher};

use super::BROKER;
use super::config::{
    DEFAULT_DUPLICATE_WINDOW, DEFAULT_MAX_IN_FLIGHT, check_name, check_template, connect_client, connect_options,
    subject_problem,
};
use super::headers::header_block_len;

/// The publish error of one event: a JetStream "message too large" (server or stream limit) is permanent,
/// anything else transient.
fn publish_failure(event: &EventId, subject: &str, error: &jetstream::context::PublishError) -> PublishError {
    let too_large = error.kind() == PublishErrorKind::MaxPayloadExceeded
        || std::error::Error::source(error)
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .is_some_and(|e| e.error_code() == jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM);
    let text = match error.kind() {
        PublishErrorKind::StreamNotFound => format!(
            "NATS JetStream: no stream answered for subject {subject:?} (event {event}): none captures it (create one, e.g. with NatsPublisher::ensure_stream), or its cluster is electing a leader"
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
    /// [`DEFAULT_ACK_TIMEOUT`](super::DEFAULT_ACK_TIMEOUT), async-nats' default).
    pub fn from_context(jetstream: jetstream::Context, destination: Destination) -> Result<Self> {
        check_template(&destination)?;
        let client = jetstream.client();
        Ok(NatsPublisher { jetstream, client, destination, max_in_flight: DEFAULT_MAX_IN_FLIGHT })
    }

    /// Sets how long each publish waits for the stream's acknowledgement (default [`DEFAULT_ACK_TIMEOUT`](super::DEFAULT_ACK_TIMEOUT)).
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
    fn system(&self) -> &'static str {
        "nats"
    }

    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        Some(self.destination.render(event))
    }

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

/// Creates the stream `name` over `subjects` unless it exists (file storage, [`DEFAULT_DUPLICATE_WINDOW`]).
pub(super) async fn ensure_stream(
    jetstream: &jetstream::Context,
    name: &str,
    subjects: &[&str],
) -> Result<stream::Info> {
    check_name("stream", name)?;
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

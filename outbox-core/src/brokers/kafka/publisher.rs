//! [`KafkaPublisher`]: the relay's side, an idempotent producer (see the [module docs](super)).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};

use super::config::{
    BROKER, DEFAULT_MESSAGE_MAX_BYTES, DEFAULT_MESSAGE_TIMEOUT_MS, KafkaContext, bootstrap_servers, create,
    set_default, validate_destination, validate_topic,
};
use crate::broker::{Destination, envelope_headers};
use crate::envelope::OutboxEvent;
use crate::error::{Error, Result};
use crate::publisher::{PublishError, Publisher};

/// Publishes outbox events to Kafka with an idempotent producer; see the [module docs](super).
pub struct KafkaPublisher {
    producer: Mutex<FutureProducer<KafkaContext>>,
    config: ClientConfig,
    destination: Destination,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("bootstrap.servers", &self.config.get("bootstrap.servers"))
            .field("destination", &self.destination.template())
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// A publisher to the cluster at `bootstrap` (`kafka://host:port` or `host:port`, comma-separated for
    /// several), routing each event by `destination`; `extra` are librdkafka producer settings applied
    /// last (e.g. `("message.max.bytes", "2000000")`, SASL/TLS settings).
    ///
    /// Defaults: `enable.idempotence=true`, `acks=all`, `message.timeout.ms` = [`DEFAULT_MESSAGE_TIMEOUT_MS`]
    /// (keep it below the relay's `publish_timeout`), `client.id=outbox-relay`. Nothing is sent until the
    /// first publish: an unreachable cluster shows up as failed (retried) events, not as an error here.
    /// An invalid `bootstrap`, a destination whose literal parts are not valid topic characters, or a
    /// setting librdkafka rejects is an [`Error::InvalidConfig`].
    pub fn connect(bootstrap: &str, destination: Destination, extra: &[(&str, &str)]) -> Result<Self> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers(bootstrap)?);
        for (key, value) in extra {
            config.set(*key, *value);
        }
        Self::from_config(config, destination)
    }

    /// A publisher from a complete librdkafka `config` (e.g. pointing at a
    /// [`MockCluster`](rdkafka::mocking::MockCluster)). The defaults of [`connect`](Self::connect) are
    /// added where `config` does not set them.
    pub fn from_config(mut config: ClientConfig, destination: Destination) -> Result<Self> {
        validate_destination(&destination)?;
        if config.get("bootstrap.servers").is_none() && config.get("test.mock.num.brokers").is_none() {
            return Err(Error::invalid_config("bootstrap", "is not set (`bootstrap.servers`)"));
        }
        set_default(&mut config, "enable.idempotence", "true");
        set_default(&mut config, "acks", "all");
        set_default(&mut config, "message.timeout.ms", &DEFAULT_MESSAGE_TIMEOUT_MS.to_string());
        set_default(&mut config, "client.id", "outbox-relay");
        let producer = create(&config, "producer")?;
        Ok(KafkaPublisher { producer: Mutex::new(producer), config, destination })
    }

    /// Where events go.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    /// The librdkafka settings in use.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Waits up to `timeout` for every message handed to the producer to be delivered or failed (call it
    /// before shutting down if publishes may have been abandoned by a relay timeout). Blocks the calling
    /// thread: from async code, call it in `spawn_blocking`.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.producer().flush(timeout).map_err(|e| Error::broker(BROKER, "flush the producer", e))
    }

    fn producer(&self) -> FutureProducer<KafkaContext> {
        self.producer.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// After a fatal error (possible with the idempotent producer), or an error about the producer's own
    /// identity (`fenced`: fenced, unknown id, stale epoch, lost sequence, which an outage can leave behind),
    /// the producer refuses every later record: replace it, so the relay's next pass publishes again with a
    /// new producer id. The records of the failed pass stay pending and are retried.
    fn replace_if_broken(&self, producer: &FutureProducer<KafkaContext>, fenced: Option<RDKafkaErrorCode>) {
        let (code, reason) = match (producer.client().fatal_error(), fenced) {
            (Some((code, reason)), _) => (code, reason),
            (None, Some(code)) => (code, "the broker refused the producer's id or epoch".to_owned()),
            (None, None) => return,
        };
        tracing::error!(messaging.system = "kafka", ?code, reason, "Kafka producer is unusable; recreating it");
        match create::<FutureProducer<KafkaContext>>(&self.config, "producer") {
            Ok(fresh) => *self.producer.lock().unwrap_or_else(PoisonError::into_inner) = fresh,
            Err(error) => tracing::error!(messaging.system = "kafka", %error, "could not recreate the Kafka producer"),
        }
    }

    fn topic_of(&self, event: &OutboxEvent) -> std::result::Result<String, PublishError> {
        let topic = self.destination.render(event);
        validate_topic(&topic).map_err(|reason| {
            PublishError::permanent(format!(
                "invalid Kafka topic {topic:?} (from template {:?}) for event {}: the name {reason}",
                self.destination.template(),
                event.id
            ))
        })?;
        Ok(topic)
    }

    fn failure(&self, error: &KafkaError, event: &OutboxEvent, topic: &str) -> PublishError {
        match error.rdkafka_error_code() {
            Some(code) if is_too_large(code) => {
                let limit = self.config.get("message.max.bytes").unwrap_or(DEFAULT_MESSAGE_MAX_BYTES);
                PublishError::permanent(format!(
                    "Kafka rejected event {} for topic {topic:?}: the message (payload {} bytes plus key and headers) \
                     is over message.max.bytes ({limit} bytes here; the broker and topic have their own limit): {error}",
                    event.id,
                    event.payload.len()
                ))
            }
            Some(code) if is_permanent(code) => PublishError::permanent(format!(
                "Kafka rejected event {} for topic {topic:?} ({code:?}): {error}",
                event.id
            )),
            Some(RDKafkaErrorCode::QueueFull) => PublishError::transient(format!(
                "the Kafka producer queue is full (queue.buffering.max.messages/kbytes); event {} will be retried",
                event.id
            )),
            _ => PublishError::transient(format!(
                "Kafka did not acknowledge event {} on topic {topic:?}: {error}",
                event.id
            )),
        }
    }
}

/// The broker refused the producer itself (its id, epoch or sequence), not the record: only a new producer
/// gets past it.
fn is_producer_state(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::UnknownProducerId
            | RDKafkaErrorCode::OutOfOrderSequenceNumber
            | RDKafkaErrorCode::InvalidProducerIdMapping
    )
}

/// The message is over a size limit of the producer, broker or topic.
fn is_too_large(code: RDKafkaErrorCode) -> bool {
    matches!(code, RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
}

/// No retry of the same message to the same topic can succeed.
pub(super) fn is_permanent(code: RDKafkaErrorCode) -> bool {
    is_too_large(code)
        || matches!(
            code,
            RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidRecord
        )
}

fn record_headers(event: &OutboxEvent) -> OwnedHeaders {
    let headers = envelope_headers(event);
    headers.iter().fold(OwnedHeaders::new_with_capacity(headers.len()), |acc, (key, value)| {
        acc.insert(Header { key, value: Some(value.as_str()) })
    })
}

impl Publisher for KafkaPublisher {
    fn system(&self) -> &'static str {
        "kafka"
    }

    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        Some(self.destination.render(event))
    }

    /// Sends every record of the batch, then awaits every delivery report: `Ok` only for records the
    /// broker acknowledged (`acks=all`).
    #[tracing::instrument(
        name = "outbox.kafka.publish",
        level = "debug",
        skip_all,
        fields(messaging.system = "kafka", messaging.batch.message_count = events.len())
    )]
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<std::result::Result<(), PublishError>> {
        let producer = self.producer();
        let mut pending = Vec::with_capacity(events.len());
        for event in events {
            let topic = match self.topic_of(event) {
                Ok(topic) => topic,
                Err(error) => {
                    tracing::warn!(
                        messaging.system = "kafka",
                        event_id = %event.id,
                        error = error.message(),
                        "event has no valid Kafka topic"
                    );
                    pending.push((String::new(), Err(error)));
                    continue;
                }
            };
            let record = FutureRecord::to(&topic)
                .key(event.aggregate_id.as_str())
                .payload(event.payload.as_str())
                .headers(record_headers(event));
            let sent = producer.send_result(record).map_err(|(error, _)| self.failure(&error, event, &topic));
            pending.push((topic, sent));
        }
        let mut results = Vec::with_capacity(events.len());
        let mut fenced = None;
        for (event, (topic, sent)) in events.iter().zip(pending) {
            let result = match sent {
                Err(error) => Err(error),
                Ok(delivery) => match delivery.await {
                    Ok(Ok(delivery)) => {
                        tracing::trace!(
                            messaging.system = "kafka",
                            messaging.destination.name = %topic,
                            messaging.kafka.destination.partition = delivery.partition,
                            messaging.kafka.message.offset = delivery.offset,
                            event_id = %event.id,
                            "acknowledged"
                        );
                        Ok(())
                    }
                    Ok(Err((error, _))) => {
                        fenced = fenced.or(error.rdkafka_error_code().filter(|code| is_producer_state(*code)));
                        Err(self.failure(&error, event, &topic))
                    }
                    Err(_) => Err(PublishError::transient(format!(
                        "the Kafka producer went away before event {} was acknowledged",
                        event.id
                    ))),
                },
            };
            if let Err(error) = &result {
                tracing::debug!(
                    messaging.system = "kafka",
                    messaging.destination.name = %topic,
                    event_id = %event.id,
                    permanent = error.is_permanent(),
                    error = error.message(),
                    "publish failed"
                );
            }
            results.push(result);
        }
        self.replace_if_broken(&producer, fenced);
        results
    }
}

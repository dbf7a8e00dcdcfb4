//! Kafka plumbing for scenario ④ through a broker: a fresh topic, a publisher and a transport on it.

use std::time::Duration;

use outbox_seaorm::Destination;
use outbox_seaorm::brokers::kafka::rdkafka::ClientConfig;
use outbox_seaorm::brokers::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_seaorm::brokers::kafka::rdkafka::client::DefaultClientContext;
use outbox_seaorm::brokers::kafka::{KafkaPublisher, KafkaTransport, Subscription, bootstrap_servers};

use crate::app::Result;

/// Partitions of the lab's topic: orders spread over them by aggregate id.
const PARTITIONS: i32 = 3;

/// Creates `topic` (Kafka-protocol brokers such as tansu do not create topics on first use).
pub async fn create_topic(url: &str, topic: &str) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap_servers(url)?).create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let new = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1));
    for result in admin.create_topics([&new], &options).await? {
        result.map_err(|(topic, code)| format!("creating topic {topic} failed: {code:?}"))?;
    }
    Ok(())
}

/// An idempotent producer to `topic`, keyed by aggregate id.
pub async fn publisher(url: &str, topic: &str) -> Result<KafkaPublisher> {
    Ok(KafkaPublisher::connect(url, Destination::fixed(topic)?, &[])?)
}

/// A transport reading every partition of `topic`, assigned directly (no group join to wait for).
pub async fn transport(url: &str, topic: &str) -> Result<KafkaTransport> {
    let partitions = (0..PARTITIONS).map(|p| (topic.to_owned(), p)).collect();
    Ok(KafkaTransport::connect(url, "lab-billing", Subscription::Partitions(partitions), &[])?)
}

//! The broker contract suite against a real Redis (127.0.0.1:6379), through [`RedisTransport`]. Each test
//! gets its own stream (`outbox-ct:<tag>:<uuid>`) and dead-letter stream, deleted at the end.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_integration_tests::contract::{Fixture, RawMessage};
use outbox_integration_tests::proxy::Proxy;
use outbox_seaorm::Destination;
use outbox_seaorm::brokers::redis::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use outbox_seaorm::brokers::redis::{PAYLOAD_FIELD, RedisPublisher, RedisTransport, RedisTransportConfig, dead_field};

const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// A short `min_idle`, so entries of a consumer that stopped are claimed within the cases' time.
fn config() -> RedisTransportConfig {
    RedisTransportConfig::default()
        .with_min_idle(Duration::from_secs(1))
        .with_reclaim_interval(Duration::from_millis(200))
        .with_max_block(Duration::from_millis(300))
}

async fn raw() -> MultiplexedConnection {
    redis::Client::open(REDIS_URL).expect("client").get_multiplexed_async_connection().await.expect("connect")
}

struct Redis {
    publisher: RedisPublisher,
    stream: String,
    proxy: Proxy,
}

impl Redis {
    /// One consumer per group, with a stable name: a restart reads its own pending entries first.
    async fn transport_at(&self, url: &str, group: &str) -> RedisTransport {
        RedisTransport::connect_with(url, &self.stream, group, &format!("{group}-1"), config())
            .await
            .unwrap_or_else(|e| panic!("Redis transport {group}: {e}"))
    }

    fn dead_stream(&self) -> String {
        format!("{}:dead", self.stream)
    }
}

impl Fixture for Redis {
    type Publisher = RedisPublisher;
    type Transport = RedisTransport;
    const NAME: &'static str = "Redis Streams";
    const ADDRESS: &'static str = "127.0.0.1:6379";

    async fn setup(tag: &str) -> Self {
        let stream = format!("outbox-ct:{tag}:{}", uuid::Uuid::new_v4().simple());
        let destination = Destination::fixed(&stream).expect("destination");
        let publisher =
            RedisPublisher::connect(REDIS_URL, destination).await.unwrap_or_else(|e| panic!("connect: {e}"));
        let proxy = Proxy::start(Self::ADDRESS).await;
        Redis { publisher, stream, proxy }
    }

    fn publisher(&self) -> RedisPublisher {
        self.publisher.clone()
    }

    async fn transport(&self, group: &str) -> RedisTransport {
        self.transport_at(REDIS_URL, group).await
    }

    async fn publish_raw(&self, headers: &[(String, String)], payload: &[u8]) {
        let mut fields: Vec<(&[u8], &[u8])> = headers.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())).collect();
        fields.push((PAYLOAD_FIELD.as_bytes(), payload));
        let _: String = raw().await.xadd(&self.stream, "*", &fields).await.expect("XADD raw");
    }

    async fn dead_letters(&self, group: &str) -> Vec<RawMessage> {
        let reply: redis::streams::StreamRangeReply = raw().await.xrange_all(self.dead_stream()).await.expect("XRANGE");
        let mut out = Vec::new();
        for entry in reply.ids {
            let mut headers = BTreeMap::new();
            let mut payload = Vec::new();
            for (name, value) in &entry.map {
                let bytes: Vec<u8> = redis::from_redis_value_ref(value).expect("field value");
                if name == PAYLOAD_FIELD {
                    payload = bytes;
                } else {
                    headers.insert(name.clone(), String::from_utf8_lossy(&bytes).into_owned());
                }
            }
            if headers.get(dead_field::GROUP).map(String::as_str) == Some(group) {
                out.push((headers, payload));
            }
        }
        out
    }

    async fn replay(&self, group: &str) -> u64 {
        self.transport(group).await.replay_dead_letters(1_000).await.unwrap_or_else(|e| panic!("replay: {e}"))
    }

    async fn interrupt(&self, outage: Duration) -> Option<()> {
        self.proxy.outage(outage).await;
        Some(())
    }

    async fn interruptible_transport(&self, group: &str) -> RedisTransport {
        self.transport_at(&format!("redis://{}", self.proxy.addr()), group).await
    }

    async fn teardown(self) {
        let _: i64 = raw().await.del(&[&self.stream, &self.dead_stream()]).await.expect("DEL");
    }
}

outbox_integration_tests::contract_suite!(Redis);

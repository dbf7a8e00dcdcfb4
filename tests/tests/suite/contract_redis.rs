//! The broker contract suite against a real Redis (127.0.0.1:6379), through [`RedisTransport`]. Each test
//! gets its own stream (`outbox-ct:<tag>:<uuid>`) and dead-letter stream, deleted at the end.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_integration_tests::contract::{Fixture, RawMessage, Refused};
use outbox_integration_tests::proxy::Proxy;
use outbox_seaorm::brokers::redis::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use outbox_seaorm::brokers::redis::{
    PAYLOAD_FIELD, RedisPublisher, RedisPublisherConfig, RedisTransport, RedisTransportConfig, dead_field,
};
use outbox_seaorm::consume::DeadLetters as _;
use outbox_seaorm::{Destination, NewEvent};

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
    /// `outbox-ct:<tag>:<uuid>:`; the stream is `<prefix>item`, the aggregate type of the suite's events.
    prefix: String,
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
    const TAG: &'static str = "redis";
    const ADDRESS: &'static str = "127.0.0.1:6379";

    async fn setup(tag: &str) -> Self {
        let prefix = format!("outbox-ct:{tag}:{}:", uuid::Uuid::new_v4().simple());
        let stream = format!("{prefix}item");
        // The stream exists before anything is published, as where a consumer has run (the publisher
        // appends only to streams that exist): created with a group, which is then dropped.
        let mut connection = raw().await;
        let _: () = connection.xgroup_create_mkstream(&stream, "outbox-ct-setup", "0").await.expect("XGROUP CREATE");
        let _: () = connection.xgroup_destroy(&stream, "outbox-ct-setup").await.expect("XGROUP DESTROY");
        let destination = Destination::fixed(&stream).expect("destination");
        let publisher =
            RedisPublisher::connect(REDIS_URL, destination).await.unwrap_or_else(|e| panic!("connect: {e}"));
        let proxy = Proxy::start(Self::ADDRESS).await;
        Redis { publisher, prefix, stream, proxy }
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

    async fn cut(&self) -> bool {
        self.proxy.cut();
        true
    }

    async fn restore(&self) {
        self.proxy.restore();
    }

    async fn interruptible_transport(&self, group: &str) -> RedisTransport {
        self.transport_at(&format!("redis://{}", self.proxy.addr()), group).await
    }

    async fn interruptible_publisher(&self) -> RedisPublisher {
        let url = format!("redis://{}", self.proxy.addr());
        let config = RedisPublisherConfig::default().with_response_timeout(Duration::from_secs(2));
        RedisPublisher::connect_with(&url, self.publisher.destination().clone(), config)
            .await
            .unwrap_or_else(|e| panic!("connect through the proxy: {e}"))
    }

    async fn message_count(&self) -> u64 {
        raw().await.xlen(&self.stream).await.expect("XLEN")
    }

    /// Streams by aggregate type: the `blocked` type's key holds a string (`WRONGTYPE`); a payload over
    /// the publisher's `max_payload_bytes` is refused before it is sent.
    async fn refusing_publisher(&self) -> (RedisPublisher, Vec<Refused>) {
        let _: () = raw().await.set(format!("{}blocked", self.prefix), "not a stream").await.expect("SET");
        let destination = Destination::parse(&format!("{}{{aggregate_type}}", self.prefix)).expect("template");
        let config = RedisPublisherConfig::default().with_max_payload_bytes(1024);
        let publisher = RedisPublisher::connect_with(REDIS_URL, destination, config).await.expect("publisher");
        let event = |aggregate_type: &str, payload: serde_json::Value| {
            NewEvent::new(aggregate_type, "r1", "contract.counted", &payload).expect("event")
        };
        let refused = vec![
            Refused { event: event("blocked", serde_json::json!({"n": 0})), error: "WRONGTYPE" },
            Refused {
                event: event("item", serde_json::json!({"pad": "x".repeat(4096)})),
                error: "over the Redis Streams publisher's max_payload_bytes of 1024",
            },
        ];
        (publisher, refused)
    }

    const BAD_URLS: &'static [(&'static str, &'static str)] = &[
        ("not a url", "is not a URL"),
        ("mqtt://127.0.0.1:6379", "scheme \"mqtt\""),
        ("nats://127.0.0.1:4222", "is not a Redis"),
        ("redis://", "has no host"),
        ("redis://:6379", "has no host"),
        ("redis://user:secret@127.0.0.1:notaport", "has port \"notaport\""),
    ];

    const UNREACHABLE_URL: Option<&'static str> = Some("redis://user:secret@127.0.0.1:1");

    async fn connect_publisher(url: &str) -> outbox_seaorm::Result<()> {
        RedisPublisher::connect(url, Destination::fixed("outbox-ct:any").expect("stream")).await.map(drop)
    }

    async fn teardown(self) {
        let keys = [self.stream.clone(), self.dead_stream(), format!("{}blocked", self.prefix)];
        let _: i64 = raw().await.del(&keys).await.expect("DEL");
    }
}

outbox_integration_tests::contract_suite!(Redis);

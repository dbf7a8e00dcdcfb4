//! The broker contract suite against a real nats-server (127.0.0.1:4222, JetStream on), through
//! [`NatsTransport`]. Each test gets its own stream (`CT_<TAG>_<uuid>`), subject prefix and dead-letter
//! stream, deleted at the end.

use std::time::Duration;

use outbox_integration_tests::contract::{Fixture, RawMessage, Refused};
use outbox_integration_tests::proxy::Proxy;
use outbox_seaorm::brokers::nats::async_nats::jetstream::message::PublishMessage;
use outbox_seaorm::brokers::nats::async_nats::jetstream::stream::RawMessageErrorKind;
use outbox_seaorm::brokers::nats::async_nats::{HeaderMap, HeaderValue};
use outbox_seaorm::brokers::nats::{NatsPublisher, NatsTransport, NatsTransportOptions};
use outbox_seaorm::consume::DeadLetters as _;
use outbox_seaorm::{Destination, NewEvent};

const NATS_URL: &str = "nats://127.0.0.1:4222";

/// A short `ack_wait`, so the cases that wait for a redelivery (lost acks, lost deliveries) stay short.
fn options() -> NatsTransportOptions {
    NatsTransportOptions::default().with_ack_wait(Duration::from_secs(2))
}

struct Nats {
    publisher: NatsPublisher,
    stream: String,
    prefix: String,
    proxy: Proxy,
}

impl Nats {
    async fn transport_at(&self, url: &str, group: &str) -> NatsTransport {
        NatsTransport::connect_with(url, &self.stream, group, None, options())
            .await
            .unwrap_or_else(|e| panic!("NATS transport {group}: {e}"))
    }

    fn dead_stream(&self) -> String {
        format!("{}_DEAD", self.stream)
    }
}

impl Fixture for Nats {
    type Publisher = NatsPublisher;
    type Transport = NatsTransport;
    const NAME: &'static str = "NATS JetStream";
    const TAG: &'static str = "nats";
    const ADDRESS: &'static str = "127.0.0.1:4222";

    async fn setup(tag: &str) -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let stream = format!("CT_{}_{}", tag.to_ascii_uppercase(), &suffix[..16]);
        let prefix = format!("ct.{tag}.{}", &suffix[..16]);
        let destination = Destination::parse(&format!("{prefix}.{{aggregate_type}}.{{event_type}}")).expect("template");
        let publisher = NatsPublisher::connect(NATS_URL, destination).await.unwrap_or_else(|e| panic!("connect: {e}"));
        publisher.ensure_stream(&stream, &[&format!("{prefix}.>")]).await.unwrap_or_else(|e| panic!("stream: {e}"));
        let proxy = Proxy::start(Self::ADDRESS).await;
        Nats { publisher, stream, prefix, proxy }
    }

    fn publisher(&self) -> NatsPublisher {
        self.publisher.clone()
    }

    async fn transport(&self, group: &str) -> NatsTransport {
        self.transport_at(NATS_URL, group).await
    }

    async fn publish_raw(&self, headers: &[(String, String)], payload: &[u8]) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(name.as_str(), value.parse::<HeaderValue>().expect("header value"));
        }
        let message = PublishMessage::build().payload(payload.to_vec().into()).headers(map);
        let subject = format!("{}.raw.message", self.prefix);
        let ack = self.publisher.jetstream().send_publish(subject, message).await.expect("publish raw");
        ack.await.expect("raw message acked");
    }

    async fn dead_letters(&self, group: &str) -> Vec<RawMessage> {
        let js = self.publisher.jetstream();
        let Ok(dead) = js.get_stream_no_info(self.dead_stream()).await else { return Vec::new() };
        let subject = format!("outbox.dead.{}.{group}", self.stream);
        let mut out = Vec::new();
        let mut next = 1;
        loop {
            match dead.get_first_raw_message_by_subject(&subject, next).await {
                Ok(message) => {
                    next = message.sequence + 1;
                    let headers = message
                        .headers
                        .iter()
                        .filter_map(|(k, v)| v.last().map(|v| (k.to_string(), v.as_str().to_owned())))
                        .collect();
                    out.push((headers, message.payload.to_vec()));
                }
                Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(error) => panic!("read dead letters of {group}: {error}"),
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

    async fn interruptible_transport(&self, group: &str) -> NatsTransport {
        self.transport_at(&format!("nats://{}", self.proxy.addr()), group).await
    }

    async fn interruptible_publisher(&self) -> NatsPublisher {
        let url = format!("nats://{}", self.proxy.addr());
        NatsPublisher::connect(&url, self.publisher.destination().clone())
            .await
            .unwrap_or_else(|e| panic!("connect through the proxy: {e}"))
            .with_ack_timeout(Duration::from_secs(2))
    }

    async fn message_count(&self) -> u64 {
        let mut stream = self.publisher.jetstream().get_stream(&self.stream).await.expect("stream");
        stream.info().await.expect("stream info").state.messages
    }

    /// Subjects by aggregate id: one with a space, a wildcard or an empty token is no subject; one over the
    /// server's `max_payload` (with its headers) is refused before it is sent.
    async fn refusing_publisher(&self) -> (NatsPublisher, Vec<Refused>) {
        let destination =
            Destination::parse(&format!("{}.{{aggregate_type}}.{{aggregate_id}}", self.prefix)).expect("template");
        let publisher = NatsPublisher::connect(NATS_URL, destination).await.expect("publisher");
        let max_payload = publisher.client().server_info().max_payload;
        let big_text = "x".repeat(max_payload.min(outbox_seaorm::limits::DEFAULT_MAX_PAYLOAD_BYTES) - 64);
        let counted = |id: &str, payload: serde_json::Value| {
            NewEvent::new("item", id, "contract.counted", &payload).expect("event")
        };
        let refused = vec![
            Refused {
                event: counted("has space", serde_json::json!({"item": "x", "n": 0})),
                error: "contains whitespace",
            },
            Refused { event: counted("a*", serde_json::json!({"item": "x", "n": 0})), error: "contains a wildcard" },
            Refused { event: counted("x.", serde_json::json!({"item": "x", "n": 0})), error: "has an empty token" },
            Refused {
                event: counted("big", serde_json::json!({"text": big_text})),
                error: "over the server's max_payload",
            },
        ];
        (publisher, refused)
    }

    const BAD_URLS: &'static [(&'static str, &'static str)] = &[
        ("127.0.0.1:4222", "is not a URL"),
        ("mqtt://127.0.0.1:4222", "scheme \"mqtt\""),
        ("kafka://127.0.0.1:9092", "is not a NATS URL"),
        ("nats://", "has no host"),
        ("nats://user:secret@127.0.0.1:notaport", "has port \"notaport\""),
    ];

    const UNREACHABLE_URL: Option<&'static str> = Some("nats://user:secret@127.0.0.1:1");

    async fn connect_publisher(url: &str) -> outbox_seaorm::Result<()> {
        NatsPublisher::connect(url, Destination::fixed("ct.any").expect("subject")).await.map(drop)
    }

    async fn teardown(self) {
        let js = self.publisher.jetstream();
        js.delete_stream(&self.stream).await.unwrap_or_else(|e| panic!("delete {}: {e}", self.stream));
        let _ = js.delete_stream(self.dead_stream()).await;
    }
}

outbox_integration_tests::contract_suite!(Nats);

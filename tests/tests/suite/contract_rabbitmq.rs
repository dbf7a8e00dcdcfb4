//! The broker contract suite ([`outbox_integration_tests::contract`]) against a real RabbitMQ
//! (127.0.0.1:5672, guest/guest), through [`RabbitPublisher`] and [`RabbitTransport`].
//!
//! Each test gets its own topic exchange and queue, `ct-<case>-<uuid>`, bound with `#` and declared at
//! setup (the relay publishes `mandatory` before any transport exists, so the queue must be bound first);
//! the suite uses one consumer group per case, and that group consumes this queue (consumer tag = group).
//! Dead letters land in `<queue>.dead`. [`Fixture::interrupt`] cuts a [`Proxy`] in front of RabbitMQ
//! that the interruptible transport connects through: its connection really drops. Teardown deletes the
//! queues and the exchange.

use std::sync::Arc;
use std::time::Duration;

use outbox_integration_tests::contract::{Fixture, RawMessage, Refused};
use outbox_integration_tests::proxy::Proxy;
use outbox_seaorm::brokers::rabbitmq::lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use outbox_seaorm::brokers::rabbitmq::lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use outbox_seaorm::brokers::rabbitmq::lapin::{self, BasicProperties, Confirmation};
use outbox_seaorm::brokers::rabbitmq::{DEFAULT_ROUTING_KEY, RabbitPublisher, RabbitTransport};
use outbox_seaorm::consume::DeadLetters as _;
use outbox_seaorm::{Destination, NewEvent};

const ADDRESS: &str = "127.0.0.1:5672";
const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// One case's exchange, queue and proxy.
struct Rabbit {
    exchange: String,
    queue: String,
    publisher: Arc<RabbitPublisher>,
    proxy: Proxy,
}

async fn raw_connection() -> lapin::Connection {
    lapin::Connection::connect(URL, lapin::ConnectionProperties::default()).await.expect("raw lapin connection")
}

/// AMQP headers as text (the test only writes and reads long strings).
fn text_headers(properties: &BasicProperties) -> std::collections::BTreeMap<String, String> {
    let Some(table) = properties.headers() else { return Default::default() };
    table
        .inner()
        .iter()
        .filter_map(|(k, v)| match v {
            AMQPValue::LongString(s) => Some((k.to_string(), String::from_utf8_lossy(s.as_bytes()).into_owned())),
            AMQPValue::ShortString(s) => Some((k.to_string(), s.to_string())),
            AMQPValue::LongLongInt(n) => Some((k.to_string(), n.to_string())),
            _ => None,
        })
        .collect()
}

impl Fixture for Rabbit {
    type Publisher = Arc<RabbitPublisher>;
    type Transport = RabbitTransport;
    const NAME: &'static str = "RabbitMQ";
    const TAG: &'static str = "rabbitmq";
    const ADDRESS: &'static str = ADDRESS;

    async fn setup(tag: &str) -> Self {
        let name = format!("ct-{tag}-{}", uuid::Uuid::new_v4().simple());
        let routing_key = Destination::parse(DEFAULT_ROUTING_KEY).expect("default template");
        let publisher = RabbitPublisher::connect(URL, &name, routing_key).await.expect("connect the publisher");
        publisher.declare_queue(&name, &name, "#").await.expect("declare the queue");
        let proxy = Proxy::start(ADDRESS).await;
        Rabbit { exchange: name.clone(), queue: name, publisher: Arc::new(publisher), proxy }
    }

    fn publisher(&self) -> Self::Publisher {
        self.publisher.clone()
    }

    async fn transport(&self, group: &str) -> RabbitTransport {
        RabbitTransport::connect(URL, &self.queue, group).await.expect("connect the transport")
    }

    async fn publish_raw(&self, headers: &[(String, String)], payload: &[u8]) {
        let connection = raw_connection().await;
        let channel = connection.create_channel().await.expect("channel");
        channel.confirm_select(ConfirmSelectOptions::default()).await.expect("confirms");
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert(ShortString::from(name.as_str()), AMQPValue::LongString(LongString::from(value.as_str())));
        }
        let confirm = channel
            .basic_publish(
                self.exchange.as_str().into(),
                "raw".into(),
                BasicPublishOptions { mandatory: true, immediate: false },
                payload,
                BasicProperties::default().with_headers(table).with_delivery_mode(2),
            )
            .await
            .expect("publish raw")
            .await
            .expect("confirm");
        assert!(matches!(confirm, Confirmation::Ack(None)), "raw message routed and confirmed: {confirm:?}");
        connection.close(200, "OK".into()).await.ok();
    }

    async fn dead_letters(&self, _group: &str) -> Vec<RawMessage> {
        let connection = raw_connection().await;
        let channel = connection.create_channel().await.expect("channel");
        let dead = format!("{}.dead", self.queue);
        let mut out = Vec::new();
        // Read without acking; closing the connection puts them back.
        while let Some(got) =
            channel.basic_get(dead.as_str().into(), BasicGetOptions { no_ack: false }).await.expect("basic.get")
        {
            out.push((text_headers(&got.delivery.properties), got.delivery.data));
        }
        connection.close(200, "OK".into()).await.ok();
        out
    }

    async fn replay(&self, group: &str) -> u64 {
        let transport = self.transport(group).await;
        let moved = transport.replay_dead_letters(1_000).await.expect("replay");
        transport.close().await;
        moved
    }

    async fn cut(&self) -> bool {
        self.proxy.cut();
        true
    }

    async fn restore(&self) {
        self.proxy.restore();
    }

    async fn interruptible_transport(&self, group: &str) -> RabbitTransport {
        let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.proxy.port());
        RabbitTransport::connect(&url, &self.queue, group)
            .await
            .expect("connect the transport through the proxy")
            .with_connect_timeout(Duration::from_secs(2))
    }

    async fn interruptible_publisher(&self) -> Self::Publisher {
        let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.proxy.port());
        let routing_key = self.publisher.routing_key().clone();
        let publisher = RabbitPublisher::connect(&url, &self.exchange, routing_key)
            .await
            .expect("connect the publisher through the proxy")
            .with_connect_timeout(Duration::from_secs(2))
            .with_confirm_timeout(Duration::from_secs(2));
        Arc::new(publisher)
    }

    async fn message_count(&self) -> u64 {
        u64::from(self.publisher.message_count(&self.queue).await.expect("queue message count"))
    }

    /// Routing keys by aggregate id and event type: one over RabbitMQ's 255 bytes; a payload over the
    /// publisher's `max_message_bytes` is refused before it is sent.
    async fn refusing_publisher(&self) -> (Self::Publisher, Vec<Refused>) {
        let by_id = Destination::parse("{aggregate_id}.{event_type}").expect("template");
        let publisher =
            RabbitPublisher::connect(URL, &self.exchange, by_id).await.expect("publisher").with_max_message_bytes(1024);
        let (long_id, long_type) = ("a".repeat(128), format!("rmq.{}", "t".repeat(124)));
        let long_key = NewEvent::new("item", long_id.as_str(), long_type.as_str(), &serde_json::json!({"n": 0}));
        let big = NewEvent::new("item", "r1", "contract.counted", &serde_json::json!({"pad": "x".repeat(4096)}));
        let refused = vec![
            Refused { event: long_key.expect("event"), error: "routing key is 257 bytes" },
            Refused { event: big.expect("event"), error: "this RabbitMQ publisher sends at most 1024" },
        ];
        (Arc::new(publisher), refused)
    }

    const BAD_URLS: &'static [(&'static str, &'static str)] = &[
        ("127.0.0.1:5672", "is not a URL"),
        ("mqtt://127.0.0.1:1883", "scheme \"mqtt\""),
        ("nats://127.0.0.1:4222", "is not a RabbitMQ URL"),
        ("amqp://", "has no host"),
        ("amqp://guest:secret@127.0.0.1:notaport/%2f", "has port \"notaport\""),
    ];

    const UNREACHABLE_URL: Option<&'static str> = Some("amqp://guest:secret@127.0.0.1:1/%2f");

    async fn connect_publisher(url: &str) -> outbox_seaorm::Result<()> {
        let routing_key = Destination::parse(DEFAULT_ROUTING_KEY).expect("template");
        RabbitPublisher::connect(url, "ct-any", routing_key).await.map(drop)
    }

    async fn teardown(self) {
        for queue in [self.queue.clone(), format!("{}.dead", self.queue)] {
            self.publisher.delete_queue(&queue).await.unwrap_or_else(|e| panic!("delete queue {queue}: {e}"));
        }
        self.publisher.delete_exchange(&self.exchange).await.unwrap_or_else(|e| panic!("delete exchange: {e}"));
    }
}

outbox_integration_tests::contract_suite!(Rabbit);

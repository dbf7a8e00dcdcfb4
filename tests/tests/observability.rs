//! Metrics and traces: the counters and gauges the relay, the stats sampler and the consume driver record
//! equal what the database holds, and a trace started where an event is enqueued reaches the consumer's
//! span through the broker.
//!
//! Each test installs its own `metrics-util` debugging recorder (or tracing subscriber) for its thread
//! only and runs on a current-thread runtime, so the relay, the service's tasks and the consumer all record
//! into it and tests running in parallel never mix their figures.

#[path = "suite/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use common::{CAP, after, count_published, enqueue_committed, event, fast_config, outbox_rows};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_integration_tests::contract::{self, Counted, Running, counting_consumer, eventually};
use outbox_integration_tests::{Backend, TestDb, run_on};
use outbox_seaorm::consume::Transport;
use outbox_seaorm::consume::{
    DeadFilter, DeadLetter, DeadLetterAction, DeadLetterEntry, DeadLetterOutcome, DeadLetters, Delivery,
};
use outbox_seaorm::{
    DomainEvent, InMemoryPublisher, OutboxEvent, OutboxService, PublishError, Publisher, Relay, SeaOrmStore,
    ServiceConfig, emit, metrics as names,
};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

/// `async fn $name(t: TestDb)` once per backend, each on a current-thread runtime (see the module docs).
macro_rules! per_backend_on_one_thread {
    ($name:ident, $tag:literal) => {
        mod $name {
            #[tokio::test(flavor = "current_thread")]
            async fn sqlite() {
                super::run_on(super::Backend::Sqlite, $tag, super::$name).await;
            }

            #[tokio::test(flavor = "current_thread")]
            async fn postgres() {
                super::run_on(super::Backend::Postgres, $tag, super::$name).await;
            }

            #[tokio::test(flavor = "current_thread")]
            async fn mysql() {
                super::run_on(super::Backend::MySql, $tag, super::$name).await;
            }
        }
    };
}

/// One snapshot of a debugging recorder, queried by name and labels.
struct Figures(Vec<(CompositeKey, DebugValue)>);

impl Figures {
    fn of(snapshotter: &Snapshotter) -> Self {
        Figures(snapshotter.snapshot().into_vec().into_iter().map(|(key, _, _, value)| (key, value)).collect())
    }

    fn find(&self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        self.0.iter().find_map(|(key, value)| {
            let matches = key.kind() == kind
                && key.key().name() == name
                && key.key().labels().count() == labels.len()
                && labels.iter().all(|(k, v)| key.key().labels().any(|l| l.key() == *k && l.value() == *v));
            matches.then_some(value)
        })
    }

    /// A counter's value; 0 when it was never incremented.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.find(MetricKind::Counter, name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            None => 0,
            Some(other) => panic!("{name} is not a counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str) -> f64 {
        self.gauge_of(name, &[])
    }

    fn gauge_of(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.find(MetricKind::Gauge, name, labels) {
            Some(DebugValue::Gauge(v)) => v.into_inner(),
            other => panic!("gauge {name}: {other:?}"),
        }
    }

    /// A histogram's samples since the recorder was installed.
    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.find(MetricKind::Histogram, name, labels) {
            Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
            None => Vec::new(),
            Some(other) => panic!("{name} is not a histogram: {other:?}"),
        }
    }
}

/// A broker that refuses events of type `rejected` for good and passes the rest to an in-memory broker.
struct Refusing(InMemoryPublisher);

impl Publisher for Refusing {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let accepted: Vec<OutboxEvent> = events.iter().filter(|e| e.event_type != "rejected").cloned().collect();
        let mut results = self.0.publish(&accepted).await.into_iter();
        events
            .iter()
            .map(|e| {
                if e.event_type == "rejected" {
                    Err(PublishError::permanent("the broker refuses this event type"))
                } else {
                    results.next().unwrap_or_else(|| Err(PublishError::transient("no result")))
                }
            })
            .collect()
    }
}

async fn relay_counters_and_backlog_gauges_equal_the_outbox_rows(t: TestDb) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    // 10 events that go out at once, one refused for good, and two on an aggregate whose first publish
    // fails once: its second event is released behind it, both go out at the retry.
    let mut events: Vec<_> = (0..10).map(|n| event(&format!("a{}", n % 5), "order.placed", n)).collect();
    events.push(event("r0", "rejected", 0));
    events.extend([event("t0", "order.placed", 0), event("t0", "order.paid", 1)]);
    enqueue_committed(&t, &events).await;
    let broker = InMemoryPublisher::new();
    broker.fail_aggregate("t0", 1);
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), Refusing(broker.clone()), fast_config()).expect("relay");
    let now = chrono::Utc::now();
    let first = relay.run_once_at(now).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let retry = relay.run_once_at(after(now, CAP)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let idle = relay.run_once_at(after(now, CAP)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert_eq!((first.claimed, first.published, first.failed, first.dead, first.released), (13, 10, 1, 1, 1), "{t}");
    assert_eq!((retry.published, idle.claimed), (2, 0), "{t}: {retry:?} {idle:?}");

    let figures = Figures::of(&snapshotter);
    let rows = outbox_rows(&t).await;
    let dead_rows = rows.iter().filter(|r| r.dead_at_ms.is_some()).count() as u64;
    let failed_attempts: i64 = rows.iter().filter(|r| r.dead_at_ms.is_none()).map(|r| i64::from(r.attempts)).sum();
    assert_eq!(figures.counter(names::EVENTS_PUBLISHED, &[]), count_published(&t).await, "{t}: published");
    assert_eq!(figures.counter(names::EVENTS_PUBLISHED, &[]), 12, "{t}");
    assert_eq!(figures.counter(names::EVENTS_DEAD, &[]), dead_rows, "{t}: dead");
    assert_eq!(dead_rows, 1, "{t}");
    assert_eq!(figures.counter(names::EVENTS_FAILED, &[]) as i64, failed_attempts, "{t}: failed attempts");
    assert_eq!(figures.counter(names::EVENTS_RELEASED, &[]), 1, "{t}");
    assert_eq!(figures.counter(names::EVENTS_FENCED, &[]), 0, "{t}");
    // Two passes claimed something (13 rows, then 2); the idle pass claimed nothing but was timed.
    assert_eq!(figures.histogram(names::RELAY_BATCH_SIZE, &[]), vec![13.0, 2.0], "{t}");
    assert_eq!(figures.histogram(names::CLAIM_DURATION, &[]).len(), 3, "{t}");
    // One latency per broker confirmation, never negative; one duration per publish call.
    let latencies = figures.histogram(names::PUBLISH_LATENCY, &[]);
    assert_eq!(latencies.len(), 12, "{t}: {latencies:?}");
    assert!(latencies.iter().all(|s| (0.0..60.0).contains(s)), "{t}: {latencies:?}");
    let calls = figures.histogram(names::PUBLISH_DURATION, &[]).len() as u64;
    assert_eq!(calls, broker.publish_calls(), "{t}: publish calls");

    // Three more events stay pending: the service's broker is down, so its sampler sees them waiting.
    let pending: Vec<_> = (0..3).map(|n| event(&format!("p{n}"), "order.placed", n)).collect();
    enqueue_committed(&t, &pending).await;
    let down = InMemoryPublisher::new();
    down.go_down_for(u32::MAX);
    let config =
        ServiceConfig { relay: fast_config(), stats_interval: Duration::from_millis(50), ..Default::default() };
    let service =
        OutboxService::builder(SeaOrmStore::new(t.db.clone()), down).config(config).without_cleanup().start().unwrap();
    eventually(Duration::from_secs(10), "the sampler ran twice", async || {
        // The second sample follows a completed one: the gauges hold a whole sample.
        let first = service.health().sampled_at;
        tokio::time::sleep(Duration::from_millis(60)).await;
        first.is_some() && service.health().sampled_at != first
    })
    .await;
    service.shutdown().await;
    let stats = service.health().stats.expect("a sample");
    let figures = Figures::of(&snapshotter);
    let rows = outbox_rows(&t).await;
    let waiting = rows.iter().filter(|r| r.published_at_ms.is_none() && r.dead_at_ms.is_none()).count();
    assert_eq!(figures.gauge(names::PENDING_EVENTS), waiting as f64, "{t}: pending gauge");
    assert_eq!(waiting, 3, "{t}");
    assert_eq!(figures.gauge(names::DEAD_EVENTS), dead_rows as f64, "{t}: dead gauge");
    assert_eq!(figures.gauge(names::OLDEST_PENDING_AGE), stats.oldest_pending_seconds as f64, "{t}");
    assert!(stats.oldest_pending_seconds < 60, "{t}: {stats:?}");
}
per_backend_on_one_thread!(relay_counters_and_backlog_gauges_equal_the_outbox_rows, "obs_relay");

/// The headers and payload of one message.
type Raw = (BTreeMap<String, String>, Vec<u8>);

/// A broker queue in memory: holds whatever the relay published to an [`InMemoryPublisher`] (as the
/// headers and payload a real adapter sends) and anything pushed raw, acks and dead letters recorded.
#[derive(Default)]
struct Queue {
    messages: Mutex<VecDeque<Raw>>,
    acked: Mutex<u64>,
    dead: Mutex<Vec<DeadLetter>>,
}

impl Queue {
    fn push_events(&self, events: &[OutboxEvent]) {
        let mut messages = self.messages.lock().expect("queue");
        for event in events {
            let headers = outbox_seaorm::broker::envelope_headers(event).into_iter().collect();
            messages.push_back((headers, event.payload.clone().into_bytes()));
        }
    }

    fn push_raw(&self, headers: BTreeMap<String, String>, payload: &[u8]) {
        self.messages.lock().expect("queue").push_back((headers, payload.to_vec()));
    }

    fn acked(&self) -> u64 {
        *self.acked.lock().expect("acked")
    }
}

impl Transport for &'static Queue {
    type Receipt = ();

    fn broker(&self) -> &'static str {
        "memory"
    }

    fn source(&self) -> String {
        "queue".into()
    }

    async fn fetch(&self, max: usize, wait: Duration) -> outbox_seaorm::Result<Vec<Delivery<()>>> {
        let batch: Vec<_> = {
            let mut messages = self.messages.lock().expect("queue");
            let n = max.min(messages.len());
            messages.drain(..n).collect()
        };
        if batch.is_empty() {
            tokio::time::sleep(wait).await;
        }
        Ok(batch
            .into_iter()
            .map(|(headers, payload)| Delivery { headers, payload, origin: "queue".into(), deliveries: 1, receipt: () })
            .collect())
    }

    async fn ack(&self, _: &()) -> outbox_seaorm::Result<()> {
        *self.acked.lock().expect("acked") += 1;
        Ok(())
    }

    async fn release(&self, _: &()) -> outbox_seaorm::Result<()> {
        Ok(())
    }

    async fn dead_letter(&self, _: &Delivery<()>, letter: &DeadLetter) -> outbox_seaorm::Result<()> {
        self.dead.lock().expect("dead").push(letter.clone());
        Ok(())
    }
}

/// Publishes every committed event of `t` to a fresh in-memory broker; what it received.
async fn relay_to_memory(t: &TestDb) -> Vec<OutboxEvent> {
    let broker = InMemoryPublisher::new();
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), broker.clone(), fast_config()).expect("relay");
    relay.drain(100).await.unwrap_or_else(|e| panic!("{t}: relay: {e}"));
    broker.received()
}

#[tokio::test(flavor = "current_thread")]
async fn consumer_counters_equal_the_inbox_rows_and_the_messages_settled() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let t = contract::case_db("obs_consumer").await;
    contract::enqueue(&t, &contract::counted_events(4, 3)).await;
    let published = relay_to_memory(&t).await;
    assert_eq!(published.len(), 12, "{t}");

    // Every event twice (a redelivery), one event type this consumer has no handler for, one message
    // without an envelope.
    let queue: &'static Queue = Box::leak(Box::default());
    queue.push_events(&published);
    queue.push_events(&published);
    let mut other = published[0].clone();
    other.event_type = "contract.unrelated".into();
    other.id = outbox_seaorm::EventId::new();
    queue.push_events(&[other]);
    queue.push_raw(BTreeMap::from([("content-type".to_owned(), "text/plain".to_owned())]), b"hello");

    let (consumer, _) = counting_consumer(&t, "obs", contract::fast_config(), |_, _| false);
    let running = Running::start(consumer, queue);
    eventually(Duration::from_secs(20), "all 26 messages are acked", async || queue.acked() == 26).await;
    let stats = running.stop().await;

    let figures = Figures::of(&snapshotter);
    let labels = [(names::LABEL_CONSUMER, "obs"), (names::LABEL_EVENT_TYPE, Counted::NAME)];
    let inbox_rows = outbox_integration_tests::count_inbox(&t, "obs").await;
    assert_eq!(figures.counter(names::CONSUMER_PROCESSED, &labels), inbox_rows, "{t}: processed = inbox rows");
    assert_eq!(inbox_rows, 12, "{t}");
    assert_eq!(figures.counter(names::CONSUMER_DUPLICATES, &labels), 12, "{t}: duplicates");
    assert_eq!(figures.counter(names::CONSUMER_SKIPPED, &[(names::LABEL_CONSUMER, "obs")]), 1, "{t}");
    assert_eq!(figures.counter(names::CONSUMER_DEAD_LETTERED, &[(names::LABEL_CONSUMER, "obs")]), 1, "{t}");
    assert_eq!(queue.dead.lock().expect("dead").len(), 1, "{t}: dead letters at the broker");
    assert_eq!(figures.counter(names::CONSUMER_RETRIED, &labels), 0, "{t}");
    assert_eq!(figures.histogram(names::CONSUMER_HANDLER_DURATION, &labels).len(), 24, "{t}: one per attempt");
    // The figures agree with the consumer's own counts.
    assert_eq!((stats.processed, stats.duplicates, stats.skipped, stats.dead_lettered), (12, 12, 1, 1), "{t}");
}

/// Dead letters in memory, as a dead-letter destination holds them.
struct Letters(Mutex<Vec<DeadLetterEntry>>);

impl DeadLetters for Letters {
    fn dead_letter_broker(&self) -> &'static str {
        "memory"
    }

    fn dead_letter_location(&self) -> String {
        "memory".to_owned()
    }

    async fn dead_letters(
        &self,
        filter: &DeadFilter,
        action: DeadLetterAction,
        max: usize,
    ) -> outbox_seaorm::Result<DeadLetterOutcome> {
        let now = chrono::Utc::now();
        let mut outcome = DeadLetterOutcome::default();
        self.0.lock().expect("letters").retain(|letter| {
            if outcome.letters.len() >= max || !filter.matches(letter, now) {
                return true;
            }
            outcome.letters.push(letter.clone());
            matches!(action, DeadLetterAction::List | DeadLetterAction::Show)
        });
        Ok(outcome)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_dead_letter_gauge_follows_the_count_per_consumer() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let letter = |id: &str, consumer: &str| {
        let headers = BTreeMap::from([("outbox_dead_consumer".to_owned(), consumer.to_owned())]);
        DeadLetterEntry::from_headers(id.to_owned(), &headers, b"{}", false)
    };
    let letters = Letters(Mutex::new(vec![letter("1", "billing"), letter("2", "billing"), letter("3", "shipping")]));
    let counts = letters.count_dead_letters(&["audit".to_owned()]).await.expect("count");
    assert_eq!(
        counts,
        BTreeMap::from([("audit".to_owned(), 0), ("billing".to_owned(), 2), ("shipping".to_owned(), 1)])
    );
    let figures = Figures::of(&snapshotter);
    let gauge = |consumer| figures.gauge_of(names::CONSUMER_DEAD_LETTERS, &[(names::LABEL_CONSUMER, consumer)]);
    assert_eq!((gauge("billing"), gauge("shipping"), gauge("audit")), (2.0, 1.0, 0.0));

    assert!(letters.discard_dead_letters(&DeadFilter::default()).await.is_err(), "everything needs all()");
    let billing = DeadFilter::default().consumer("billing");
    assert_eq!(letters.discard_dead_letters(&billing).await.expect("discard"), 2);
    letters.count_dead_letters(&["billing".to_owned()]).await.expect("count");
    let figures = Figures::of(&snapshotter);
    assert_eq!(figures.gauge_of(names::CONSUMER_DEAD_LETTERS, &[(names::LABEL_CONSUMER, "billing")]), 0.0);
}

/// A tracing subscriber exporting spans to memory through OpenTelemetry, for this thread.
struct Traces {
    provider: SdkTracerProvider,
    exporter: InMemorySpanExporter,
}

impl Traces {
    fn install() -> (Traces, tracing::subscriber::DefaultGuard) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-tests"));
        let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        (Traces { provider, exporter }, guard)
    }

    fn finished(&self, name: &str) -> Vec<SpanData> {
        self.provider.force_flush().expect("flush");
        let spans = self.exporter.get_finished_spans().expect("spans");
        spans.into_iter().filter(|s| s.name == name).collect()
    }
}

/// Enqueues `events` inside a span standing for the HTTP request that commits them; that span's ids.
async fn enqueue_in_a_request(t: &TestDb, events: &[outbox_seaorm::NewEvent]) -> (TraceId, SpanId) {
    let request = tracing::info_span!("POST /orders", otel.kind = "server");
    let ids = {
        let context = request.context();
        let span = context.span();
        (span.span_context().trace_id(), span.span_context().span_id())
    };
    assert_ne!(ids.0, TraceId::INVALID, "the request span has an OpenTelemetry context");
    contract::enqueue(t, events).instrument(request).await;
    ids
}

fn attribute<'s>(span: &'s SpanData, key: &str) -> Option<&'s opentelemetry::Value> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
}

/// Checks that every process span continues the request's trace, as a child of the request span.
fn assert_consumer_spans_continue(traces: &Traces, (trace_id, request): (TraceId, SpanId), expected: usize) {
    let process = traces.finished("outbox.consume.process");
    assert_eq!(process.len(), expected, "one process span per delivery");
    for span in &process {
        assert_eq!(span.span_context.trace_id(), trace_id, "the consumer span is in the request's trace");
        assert_eq!(span.parent_span_id, request, "the consumer span's parent is the span the event was enqueued in");
        assert!(span.parent_span_is_remote, "the parent came through the broker");
        assert_eq!(span.span_kind, opentelemetry::trace::SpanKind::Consumer);
        assert_eq!(attribute(span, "messaging.operation.type").map(|v| v.as_str()), Some("process".into()));
        assert_eq!(attribute(span, "messaging.consumer.group.name").map(|v| v.as_str()), Some("traced".into()));
    }
    let publish = traces.finished("outbox.relay.publish");
    assert!(!publish.is_empty(), "the relay's publish spans were exported");
    for span in &publish {
        assert_eq!(span.span_kind, opentelemetry::trace::SpanKind::Producer);
        assert!(
            span.links.iter().all(|link| link.span_context.trace_id() == trace_id),
            "each publish span links to the request's trace"
        );
    }
    let linked: usize = publish.iter().map(|s| s.links.len()).sum();
    assert_eq!(linked, expected, "one link per published event");
}

#[tokio::test(flavor = "current_thread")]
async fn a_trace_started_at_enqueue_reaches_the_consumer_span_through_the_in_memory_broker() {
    let (traces, _guard) = Traces::install();
    let t = contract::case_db("obs_trace_memory").await;
    let request = enqueue_in_a_request(&t, &contract::counted_events(2, 2)).await;
    let published = relay_to_memory(&t).await;
    assert!(published.iter().all(|e| e.headers.contains_key("traceparent")), "{t}: traceparent stored and sent");

    let queue: &'static Queue = Box::leak(Box::default());
    queue.push_events(&published);
    let (consumer, _) = counting_consumer(&t, "traced", contract::fast_config(), |_, _| false);
    let running = Running::start(consumer, queue);
    eventually(Duration::from_secs(20), "all 4 messages are acked", async || queue.acked() == 4).await;
    running.stop().await;
    assert_consumer_spans_continue(&traces, request, 4);
}

#[tokio::test(flavor = "current_thread")]
async fn messages_without_a_trace_context_each_start_their_own_trace() {
    let (traces, _guard) = Traces::install();
    let t = contract::case_db("obs_trace_none").await;
    contract::enqueue(&t, &contract::counted_events(2, 1)).await; // outside any span: no traceparent
    let published = relay_to_memory(&t).await;
    assert!(published.iter().all(|e| !e.headers.contains_key("traceparent")), "{t}: no trace context sent");

    let queue: &'static Queue = Box::leak(Box::default());
    queue.push_events(&published);
    let (consumer, _) = counting_consumer(&t, "untraced", contract::fast_config(), |_, _| false);
    let running = Running::start(consumer, queue);
    eventually(Duration::from_secs(20), "both messages are acked", async || queue.acked() == 2).await;
    running.stop().await;

    let process = traces.finished("outbox.consume.process");
    assert_eq!(process.len(), 2, "one process span per delivery");
    let consumer = traces.finished("outbox.consume");
    assert_eq!(consumer.len(), 1, "the consumer's own span");
    let consumer = &consumer[0].span_context;
    let (a, b) = (&process[0].span_context, &process[1].span_context);
    assert_ne!(a.trace_id(), b.trace_id(), "two unrelated messages are two traces");
    for span in &process {
        assert_ne!(span.span_context.trace_id(), consumer.trace_id(), "not in the consumer's long trace");
        assert_eq!(span.parent_span_id, SpanId::INVALID, "a root span");
        assert!(
            span.links.iter().any(|link| link.span_context.span_id() == consumer.span_id()),
            "linked to the consumer's span"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_trace_started_at_enqueue_reaches_the_consumer_span_through_nats() {
    use outbox_seaorm::brokers::nats::{NatsPublisher, NatsTransport};
    if !outbox_integration_tests::proxy::server_available("NATS JetStream", "127.0.0.1:4222").await {
        return;
    }
    let (traces, _guard) = Traces::install();
    let t = contract::case_db("obs_trace_nats").await;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let (stream, prefix) = (format!("OBS_TRACE_{}", &suffix[..16]), format!("obs.trace.{}", &suffix[..16]));
    let destination = outbox_seaorm::Destination::parse(&format!("{prefix}.{{aggregate_type}}")).expect("template");
    let publisher = NatsPublisher::connect("nats://127.0.0.1:4222", destination).await.expect("connect to NATS");
    publisher.ensure_stream(&stream, &[&format!("{prefix}.>")]).await.expect("stream");

    let request = enqueue_in_a_request(&t, &contract::counted_events(2, 2)).await;
    let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher.clone(), fast_config()).expect("relay");
    let passes = relay.drain(100).await.unwrap_or_else(|e| panic!("{t}: relay: {e}"));
    assert_eq!(passes.iter().map(|p| p.published).sum::<u64>(), 4, "{t}: {passes:?}");

    let transport = NatsTransport::connect("nats://127.0.0.1:4222", &stream, "traced", None).await.expect("transport");
    let (consumer, _) = counting_consumer(&t, "traced", contract::fast_config(), |_, _| false);
    let running = Running::start(consumer, transport);
    let inbox = async || outbox_integration_tests::count_inbox(&t, "traced").await == 4;
    eventually(Duration::from_secs(20), "all 4 events are applied", inbox).await;
    running.stop().await;
    let _ = publisher.jetstream().delete_stream(&stream).await;
    assert_consumer_spans_continue(&traces, request, 4);
    let subject = format!("{prefix}.item");
    for span in traces.finished("outbox.relay.publish") {
        assert_eq!(attribute(&span, "messaging.system").map(|v| v.as_str()), Some("nats".into()));
        assert_eq!(attribute(&span, "messaging.destination.name").map(|v| v.as_str()), Some(subject.as_str().into()));
    }
    for span in traces.finished("outbox.consume.process") {
        // The same OpenTelemetry id as the publish spans, not the transport's display name.
        assert_eq!(attribute(&span, "messaging.system").map(|v| v.as_str()), Some("nats".into()));
    }
}

/// A service whose method emits two events: one inside a span of its own, one with a `traceparent` the
/// app chose.
struct Counter;

const APP_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[outbox_seaorm::transactional_outbox]
impl Counter {
    async fn count(&self, db: &sea_orm::DatabaseConnection, item: &str) -> Result<SpanId, sea_orm::DbErr> {
        let step = tracing::info_span!("count.step");
        let id = step.context().span().span_context().span_id();
        {
            let _in_step = step.enter();
            emit!(Counted { item: item.to_owned(), n: 0 });
        }
        emit!(Counted { item: item.to_owned(), n: 1 }, headers = [("traceparent", APP_TRACEPARENT)]);
        Ok(id)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn emit_captures_the_span_it_runs_in_and_keeps_a_traceparent_the_app_set() {
    let (_traces, _guard) = Traces::install();
    let t = contract::case_db("obs_trace_emit").await;
    let request = tracing::info_span!("POST /count");
    let trace_id = request.context().span().span_context().trace_id();
    let step = Counter.count(&t.db, "it0").instrument(request).await.unwrap_or_else(|e| panic!("{t}: {e}"));

    let rows = outbox_rows(&t).await;
    assert_eq!(rows.len(), 2, "{t}");
    let traceparent = |row: &outbox_seaorm::entity::outbox_event::Model| {
        row.headers.get("traceparent").and_then(|v| v.as_str()).map(str::to_owned)
    };
    assert_eq!(traceparent(&rows[0]), Some(format!("00-{trace_id}-{step}-01")), "{t}: the emit!'s own span");
    assert_eq!(traceparent(&rows[1]).as_deref(), Some(APP_TRACEPARENT), "{t}: the app's traceparent is kept");
}

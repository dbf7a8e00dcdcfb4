//! The broker contract suite: the same test bodies against a [`Fixture`] per broker (NATS JetStream,
//! Kafka, RabbitMQ, Redis Streams). Each body drives the real relay and the real consume driver
//! ([`Consumer::run`]) and counts rows in the database and messages at the broker: the consumer's cases
//! (exactly once, order, poison, replay, lost acks, outage) and the publisher's (lost acks, refused input,
//! bad URLs, outage).
//!
//! A broker's test file implements [`Fixture`] and expands [`contract_suite!`](crate::contract_suite),
//! which generates one `#[tokio::test]` per case.
//!
//! With `OUTBOX_CONTRACT_RELAY=log` the cases publish through the log relay (`outbox_seaorm::log`) on the
//! `wal_level = logical` cluster instead of the polling relay (CI runs the suite both ways); the two
//! cases that count one polling pass's outcome (`publisher_refuses_bad_input_as_dead_rows`,
//! `publisher_outage_loses_nothing`) keep the polling relay there.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_seaorm::consume::{DeadLetter, Delivery, GroupCalls, GroupCommit, GroupKeys, GroupOutcome, Transport};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{
    Backoff, CancellationToken, Consumer, ConsumerConfig, ConsumerStats, NewEvent, Publisher, Received, RelayConfig,
    SeaOrmGroupCommit,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use serde::{Deserialize, Serialize};

use crate::TestDb;

/// Headers and payload of one message as read at the broker.
pub type RawMessage = (BTreeMap<String, String>, Vec<u8>);

/// One broker under the contract suite. Every test calls [`Fixture::setup`] with its own tag and gets
/// destinations no other test (or run) uses.
pub trait Fixture: Send + Sync + Sized + 'static {
    /// The relay's publisher.
    type Publisher: Publisher + Clone + 'static;
    /// The consumer's transport.
    type Transport: Transport + 'static;
    /// The broker's name in messages.
    const NAME: &'static str;
    /// A short lowercase name that prefixes each case's database: the brokers' cases share one test
    /// process, and each needs its own.
    const TAG: &'static str;
    /// `host:port` of the server, checked before each test (skipped when unreachable outside CI).
    const ADDRESS: &'static str;
    /// Why this server's lag figures cannot be counted on, if so (the lag case then says it and skips).
    const LAG_UNRELIABLE: Option<&'static str> = None;

    /// Fresh destinations (stream, topic, queue, exchange...) named after `tag` plus a per-run suffix.
    fn setup(tag: &str) -> impl Future<Output = Self> + Send;
    /// A publisher to this test's destinations.
    fn publisher(&self) -> Self::Publisher;
    /// A transport reading this test's destinations as consumer group `group` (the consumer's name), with
    /// dead letters on by default. Two transports of one group share its progress.
    fn transport(&self, group: &str) -> impl Future<Output = Self::Transport> + Send;
    /// Publishes a raw message (any headers, any payload) where the transports read.
    fn publish_raw(&self, headers: &[(String, String)], payload: &[u8]) -> impl Future<Output = ()> + Send;
    /// The dead letters `group` wrote, read without removing them.
    fn dead_letters(&self, group: &str) -> impl Future<Output = Vec<RawMessage>> + Send;
    /// Moves the dead letters of `group` back to their origin with the adapter's replay API; how many.
    fn replay(&self, group: &str) -> impl Future<Output = u64> + Send;
    /// Makes the broker unreachable for the interruptible clients (a proxy cut: their connections drop and
    /// new ones are refused) until [`restore`](Fixture::restore); `false` when this fixture cannot, and the
    /// case then says so.
    fn cut(&self) -> impl Future<Output = bool> + Send;
    /// Ends a [`cut`](Fixture::cut).
    fn restore(&self) -> impl Future<Output = ()> + Send;
    /// A cut of about `outage`, as a broker restart would make; `None` when this fixture cannot cut.
    fn interrupt(&self, outage: Duration) -> impl Future<Output = Option<()>> + Send {
        async move {
            if !self.cut().await {
                return None;
            }
            tokio::time::sleep(outage).await;
            self.restore().await;
            Some(())
        }
    }
    /// A transport of `group` that [`cut`](Fixture::cut) affects.
    fn interruptible_transport(&self, group: &str) -> impl Future<Output = Self::Transport> + Send;
    /// Deletes what [`setup`](Fixture::setup) created.
    fn teardown(self) -> impl Future<Output = ()> + Send;

    // The publisher side.

    /// A publisher to this test's destinations that [`cut`](Fixture::cut) affects.
    fn interruptible_publisher(&self) -> impl Future<Output = Self::Publisher> + Send;
    /// Messages at the broker where this test's transports read (dead letters not counted).
    fn message_count(&self) -> impl Future<Output = u64> + Send;
    /// A publisher that sends a [`Counted`] event to where this test's transports read, and the events it
    /// must refuse for good (each with a fragment of the error it must record): one whose rendered
    /// destination the broker cannot take, and one too big for it where the adapter has a size bound.
    fn refusing_publisher(&self) -> impl Future<Output = (Self::Publisher, Vec<Refused>)> + Send;
    /// URLs the adapter must refuse as configuration errors before connecting, each with a fragment of the
    /// error; one of them carries the password `secret`, which no error may show.
    const BAD_URLS: &'static [(&'static str, &'static str)];
    /// A well-formed URL with the password `secret` where nothing listens: connecting is a broker error
    /// that does not show the password. `None` where the client connects lazily (Kafka).
    const UNREACHABLE_URL: Option<&'static str>;
    /// Connects a publisher to `url` (to any destination).
    fn connect_publisher(url: &str) -> impl Future<Output = outbox_seaorm::Result<()>> + Send;
}

/// An event a publisher must refuse for good, and a fragment of the error it must record.
pub struct Refused {
    /// The event.
    pub event: NewEvent,
    /// Part of the `last_error` its dead row must carry.
    pub error: &'static str,
}

/// The event every case sends, at schema version 2.
#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "contract.counted", version = 2, aggregate = "item")]
pub struct Counted {
    /// The aggregate.
    #[aggregate_id]
    pub item: String,
    /// Position of the event in its aggregate (0, 1, 2...).
    pub n: u64,
}

/// The same event at version 3 (a new field), as an upgraded consumer knows it.
#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "contract.counted", version = 3, aggregate = "item", upcast_from(v2 = Counted))]
pub struct CountedV3 {
    /// The aggregate.
    #[aggregate_id]
    pub item: String,
    /// Position of the event in its aggregate.
    pub n: u64,
    /// New in version 3.
    pub note: String,
}

impl From<Counted> for CountedV3 {
    fn from(v2: Counted) -> Self {
        CountedV3 { item: v2.item, n: v2.n, note: String::new() }
    }
}

/// An event type on the same destinations that the suite's consumers have no handler for.
#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "contract.ignored", version = 1, aggregate = "item")]
pub struct Ignored {
    /// The aggregate.
    #[aggregate_id]
    pub item: String,
}

/// `items` aggregates with `per_item` events each, interleaved as a busy service writes them.
pub fn counted_events(items: usize, per_item: u64) -> Vec<NewEvent> {
    (0..per_item)
        .flat_map(|n| (0..items).map(move |i| Counted { item: format!("it{i}"), n }))
        .map(|e| e.to_new_event().expect("valid event"))
        .collect()
}

/// The database of one case: PostgreSQL when it answers (always under CI), SQLite otherwise, with the
/// effects table.
pub async fn case_db(test: &str) -> TestDb {
    let t = if log_relay_mode() {
        let t =
            crate::logical(test).await.unwrap_or_else(|| panic!("OUTBOX_CONTRACT_RELAY=log needs the logical cluster"));
        prepare_log_slot(&t).await;
        t
    } else {
        crate::primary_backend(test).await
    };
    let sql =
        "CREATE TABLE contract_effects (consumer VARCHAR(64) NOT NULL, item VARCHAR(64) NOT NULL, n BIGINT NOT NULL)";
    t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
    t
}

/// The effect of one event: a row in `contract_effects`, inside the inbox transaction.
async fn apply(db: &DatabaseConnection, consumer: &str, id: &str, item: &str, n: u64) -> Result<bool, String> {
    let sql = format!("INSERT INTO contract_effects (consumer, item, n) VALUES ('{consumer}', '{item}', {n})");
    let outcome = outbox_seaorm::handle_once(db, consumer, id, async |txn| txn.execute_unprepared(&sql).await)
        .await
        .map_err(|e| e.to_string())?;
    Ok(outcome.is_processed())
}

/// Effects of `consumer`, `(item, n)` in insertion order is not kept by SQL; sorted.
pub async fn effects(t: &TestDb, consumer: &str) -> Vec<(String, u64)> {
    let sql = format!("SELECT item, n FROM contract_effects WHERE consumer = '{consumer}'");
    let rows = t.db.query_all_raw(Statement::from_string(t.backend, sql)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    let mut out: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            let item: String = r.try_get("", "item").expect("item");
            let n: i64 = r.try_get("", "n").expect("n");
            (item, u64::try_from(n).expect("n >= 0"))
        })
        .collect();
    out.sort();
    out
}

/// The first application of every event, in the order the handlers committed them.
#[derive(Clone, Default)]
pub struct Applications(Arc<Mutex<Vec<(String, u64)>>>);

tokio::task_local! {
    /// First applications made inside the running group, recorded only if the group commits.
    static STAGED: std::cell::RefCell<Vec<(String, u64)>>;
}

impl Applications {
    fn push(&self, item: &str, n: u64) {
        let application = (item.to_owned(), n);
        if STAGED.try_with(|staged| staged.borrow_mut().push(application.clone())).is_err() {
            self.0.lock().expect("applications").push(application);
        }
    }

    /// Everything recorded so far.
    pub fn all(&self) -> Vec<(String, u64)> {
        self.0.lock().expect("applications").clone()
    }

    /// Panics unless, within each aggregate, first applications came in `n` order.
    pub fn assert_in_order(&self, broker: &str) {
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        for (item, n) in self.all() {
            if let Some(previous) = last.get(&item) {
                assert!(n > *previous, "{broker}: aggregate {item}: n={n} first applied after n={previous}");
            }
            last.insert(item, n);
        }
    }
}

/// The suite's consumers commit in groups ([`SeaOrmGroupCommit`] on the case's database); the applications
/// a group recorded count once its transaction committed.
struct TrackedGroup {
    db: SeaOrmGroupCommit,
    applications: Applications,
}

impl GroupCommit for TrackedGroup {
    fn run<'a>(&'a self, keys: &'a GroupKeys, calls: GroupCalls<'a>) -> GroupOutcome<'a> {
        Box::pin(async move {
            let (outcome, staged) = STAGED
                .scope(std::cell::RefCell::new(Vec::new()), async {
                    let outcome = self.db.run(keys, calls).await;
                    (outcome, STAGED.with(std::cell::RefCell::take))
                })
                .await;
            if matches!(outcome, Ok(true)) {
                self.applications.0.lock().expect("applications").extend(staged);
            }
            outcome
        })
    }
}

/// Settings for tests: short backoff, short fetch waits.
pub fn fast_config() -> ConsumerConfig {
    ConsumerConfig::default()
        .with_backoff(Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200), multiplier: 2 })
        .with_fetch_wait(Duration::from_millis(300))
}

/// A consumer named `name` counting `Counted` events into `contract_effects`, in groups of up to
/// `config.group_size` per transaction; `fail` decides, per delivery, whether the handler errors (before
/// its effect; a failure inside a group rolls the group back).
pub fn counting_consumer(
    t: &TestDb,
    name: &str,
    config: ConsumerConfig,
    fail: impl Fn(&Counted, u32) -> bool + Send + Sync + 'static,
) -> (Consumer, Applications) {
    let applications = Applications::default();
    let (db, seen, consumer_name, fail) = (t.db.clone(), applications.clone(), name.to_owned(), Arc::new(fail));
    let handler = move |received: Received<Counted>| {
        let (db, seen, consumer_name, fail) = (db.clone(), seen.clone(), consumer_name.clone(), fail.clone());
        async move {
            if fail(&received.event, received.delivery) {
                return Err(format!("injected failure of {} n={}", received.event.item, received.event.n));
            }
            let id = received.envelope.id.to_string();
            let first = apply(&db, &consumer_name, &id, &received.event.item, received.event.n).await?;
            if first {
                seen.push(&received.event.item, received.event.n);
            }
            Ok::<_, String>(if first { outbox_seaorm::Handled::Processed } else { outbox_seaorm::Handled::Duplicate })
        }
    };
    (grouped(t, name, config, &applications).on::<Counted>(handler), applications)
}

/// [`counting_consumer`] with a batch handler: `Consumer::on_batch` and `handle_batch_once`, one effect
/// statement per call. `fail` is asked for each message of a call; a yes fails the whole call.
pub fn counting_batch_consumer(
    t: &TestDb,
    name: &str,
    config: ConsumerConfig,
    fail: impl Fn(&Counted, u32) -> bool + Send + Sync + 'static,
) -> (Consumer, Applications) {
    let applications = Applications::default();
    let (db, seen, consumer_name, fail) = (t.db.clone(), applications.clone(), name.to_owned(), Arc::new(fail));
    let handler = move |batch: Vec<Received<Counted>>| {
        let (db, seen, consumer_name, fail) = (db.clone(), seen.clone(), consumer_name.clone(), fail.clone());
        async move {
            if let Some(failing) = batch.iter().find(|r| fail(&r.event, r.delivery)) {
                return Err(format!("injected failure of {} n={}", failing.event.item, failing.event.n));
            }
            let events: Vec<Counted> = batch.iter().map(|r| r.event.clone()).collect();
            let outcomes = outbox_seaorm::handle_batch_once(&db, &consumer_name, batch, async |txn, new| {
                let rows: Vec<String> =
                    new.iter().map(|r| format!("('{consumer_name}', '{}', {})", r.event.item, r.event.n)).collect();
                let sql = format!("INSERT INTO contract_effects (consumer, item, n) VALUES {}", rows.join(", "));
                txn.execute_unprepared(&sql).await.map(|_| ())
            })
            .await
            .map_err(|e| e.to_string())?;
            for (event, outcome) in events.iter().zip(&outcomes) {
                if outcome.is_processed() {
                    seen.push(&event.item, event.n);
                }
            }
            Ok::<_, String>(outcomes)
        }
    };
    (grouped(t, name, config, &applications).on_batch::<Counted>(handler), applications)
}

/// A consumer named `name` committing in groups on `t`'s database, its applications tracked.
fn grouped(t: &TestDb, name: &str, config: ConsumerConfig, applications: &Applications) -> Consumer {
    let group = TrackedGroup { db: SeaOrmGroupCommit::new(t.db.clone()), applications: applications.clone() };
    Consumer::new(name).with_config(config).with_group_commit(group)
}

/// A consumer running in the background.
pub struct Running {
    consumer: Arc<Consumer>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<outbox_seaorm::Result<()>>,
}

impl Running {
    /// Starts `consumer` on `transport`.
    pub fn start<T: Transport + 'static>(consumer: Consumer, transport: T) -> Running {
        let consumer = Arc::new(consumer);
        let shutdown = CancellationToken::new();
        let (running, token) = (consumer.clone(), shutdown.clone());
        let task = tokio::spawn(async move { running.run(&transport, token).await });
        Running { consumer, shutdown, task }
    }

    /// The consumer's counts so far.
    pub fn stats(&self) -> ConsumerStats {
        self.consumer.stats()
    }

    /// The consumer's last lag reading at its broker.
    pub fn lag(&self) -> Option<outbox_seaorm::consume::Lag> {
        self.consumer.lag()
    }

    /// Cancels and waits (at most 60 s: a bound for a hang, not a latency check) for the driver to return;
    /// its final counts.
    pub async fn stop(self) -> ConsumerStats {
        self.shutdown.cancel();
        let joined = tokio::time::timeout(Duration::from_secs(60), self.task).await;
        joined.expect("the consumer stops within 60 s of shutdown").expect("consumer task").expect("consumer run");
        self.consumer.stats()
    }
}

/// Polls `check` until it holds, or panics after `limit` naming `what`.
pub async fn eventually(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Relays every committed event of `t` to the fixture's publisher.
pub async fn relay_all<F: Fixture>(t: &TestDb, fixture: &F, expected: u64) {
    relay_until_published(t, fixture.publisher(), expected).await;
}

/// A relay on `t` through `publisher`, with a short backoff so a retried publish comes back within the
/// case's time.
pub fn relay<P: Publisher + 'static>(t: &TestDb, publisher: P) -> outbox_seaorm::Relay<outbox_seaorm::SeaOrmStore, P> {
    let backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200), multiplier: 2 };
    let config = RelayConfig::default().with_batch_size(200).with_backoff(backoff);
    outbox_seaorm::Relay::new(outbox_seaorm::SeaOrmStore::new(t.db.clone()), publisher, config)
        .unwrap_or_else(|e| panic!("{t}: relay: {e}"))
}

/// Whether the cases publish through the log relay (`OUTBOX_CONTRACT_RELAY=log`).
pub fn log_relay_mode() -> bool {
    std::env::var("OUTBOX_CONTRACT_RELAY").as_deref() == Ok("log")
}

/// The log relay's settings for case database `t`: a slot and publication of its own.
fn log_config(t: &TestDb) -> outbox_seaorm::log::LogRelayConfig {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    t.url.hash(&mut hasher);
    let name = format!("ct_{}_{:016x}", std::process::id(), hasher.finish());
    let backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200), multiplier: 2 };
    outbox_seaorm::log::LogRelayConfig::default()
        .with_slot(&name)
        .and_then(|c| c.with_publication(&name))
        .unwrap_or_else(|e| panic!("{t}: {e}"))
        .with_relay(RelayConfig::default().with_batch_size(200).with_backoff(backoff))
}

/// The case's publication and a caught-up slot, before any event: what it enqueues is in the log.
async fn prepare_log_slot(t: &TestDb) {
    // Slots of earlier test processes (earlier runs of the suite) hold WAL and count against
    // max_replication_slots: drop the idle ones.
    let sql = format!(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'ct\\_%' \
         AND slot_name NOT LIKE 'ct\\_{}\\_%' AND NOT active",
        std::process::id()
    );
    let _ = t.db.execute_unprepared(&sql).await;
    let config = log_config(t);
    outbox_seaorm::log::create_publication(&t.db, &config).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    run_log_relay(t, crate::contract::NoBroker, 0, || async { true }).await;
}

/// Runs the case's log relay through `publisher` until `done` holds (60 s at most), then stops it.
async fn run_log_relay<P, F, Fut>(t: &TestDb, publisher: P, _expected: u64, done: F)
where
    P: Publisher + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let relay = outbox_seaorm::log::LogRelay::new(t.db.clone(), &t.url, publisher, log_config(t))
        .unwrap_or_else(|e| panic!("{t}: log relay: {e}"));
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move { relay.run(stop).await });
    let slot = log_config(t).slot().to_owned();
    eventually(Duration::from_secs(60), "the log relay reads its slot", async || {
        outbox_seaorm::log::slot_state(&t.db, &slot).await.ok().flatten().is_some_and(|s| s.streaming)
    })
    .await;
    eventually(Duration::from_secs(60), "the log relay published the case's events", async || done().await).await;
    shutdown.cancel();
    task.await
        .unwrap_or_else(|e| panic!("{t}: log relay panicked: {e}"))
        .unwrap_or_else(|e| panic!("{t}: log relay: {e}"));
}

/// A publisher for a relay that must publish nothing.
struct NoBroker;

impl Publisher for NoBroker {
    async fn publish(&self, events: &[outbox_seaorm::OutboxEvent]) -> Vec<Result<(), outbox_seaorm::PublishError>> {
        vec![Err(outbox_seaorm::PublishError::transient("no broker here")); events.len()]
    }
}

async fn count_published(t: &TestDb) -> u64 {
    let sql = "SELECT count(*) FROM outbox_events WHERE published_at_ms IS NOT NULL";
    let row = t.db.query_one_raw(Statement::from_string(t.backend, sql)).await.unwrap_or_else(|e| panic!("{t}: {e}"));
    row.and_then(|r| r.try_get_by_index::<i64>(0).ok()).unwrap_or(0) as u64
}

/// Runs relay passes through `publisher` until `expected` rows of `t` are published (with
/// `OUTBOX_CONTRACT_RELAY=log`, the log relay until `expected` more rows are recorded published).
pub async fn relay_until_published<P: Publisher + 'static>(t: &TestDb, publisher: P, expected: u64) {
    if log_relay_mode() {
        let before = count_published(t).await;
        run_log_relay(t, publisher, expected, || async { count_published(t).await >= before + expected }).await;
        return;
    }
    let relay = relay(t, publisher);
    let mut published = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while published < expected {
        assert!(Instant::now() < deadline, "{t}: relayed {published} of {expected} within 60 s");
        let pass = relay.run_once().await.unwrap_or_else(|e| panic!("{t}: relay pass: {e}"));
        published += pass.published;
        if pass.claimed == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Enqueues `events` in committed transactions of 200.
pub async fn enqueue(t: &TestDb, events: &[NewEvent]) {
    for chunk in events.chunks(200) {
        outbox_seaorm::enqueue_all(&t.db, chunk).await.unwrap_or_else(|e| panic!("{t}: enqueue: {e}"));
    }
}

/// A transport that loses every ack (as if the consumer died right after its commit): the broker still
/// holds every message as unacknowledged.
pub struct LosingAcks<T>(pub T);

impl<T: Transport> Transport for LosingAcks<T> {
    type Receipt = T::Receipt;

    fn broker(&self) -> &'static str {
        self.0.broker()
    }

    fn source(&self) -> String {
        self.0.source()
    }

    async fn fetch(&self, max: usize, wait: Duration) -> outbox_seaorm::Result<Vec<Delivery<T::Receipt>>> {
        self.0.fetch(max, wait).await
    }

    async fn ack(&self, _receipt: &T::Receipt) -> outbox_seaorm::Result<()> {
        Ok(())
    }

    async fn release(&self, _receipt: &T::Receipt) -> outbox_seaorm::Result<()> {
        Ok(())
    }

    async fn dead_letter(&self, delivery: &Delivery<T::Receipt>, letter: &DeadLetter) -> outbox_seaorm::Result<()> {
        self.0.dead_letter(delivery, letter).await
    }
}

/// The cases, one generated test each (see [`contract_suite!`](crate::contract_suite)).
pub mod cases;

/// One `#[tokio::test]` per contract case for `$fixture`.
#[macro_export]
macro_rules! contract_suite {
    ($fixture:ty) => {
        $crate::contract_suite!($fixture:
            round_trip,
            random_failures_keep_order,
            batch_handler_random_failures_keep_order,
            poison_messages_are_dead_lettered,
            panicking_handler_then_replay,
            newer_version_waits_for_the_upgrade,
            unhandled_types_are_skipped,
            killed_between_commit_and_ack,
            broker_outage_loses_nothing,
            publisher_lost_ack_is_absorbed,
            publisher_refuses_bad_input_as_dead_rows,
            publisher_refuses_bad_urls,
            publisher_outage_loses_nothing,
            lag_counts_what_the_consumer_has_not_acknowledged,
        );
    };
    ($fixture:ty: $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                $crate::contract::cases::$case::<$fixture>().await;
            }
        )*
    };
}

//! Run with: cargo run -p outbox-lab
//!
//! The seed lab in Rust: six scenarios showing that a *dual write* (save, then publish) loses events or
//! invents them, and that the transactional outbox, its relay and a consumer inbox do not.
//!
//! 1. dual write, then a crash: the order is saved, the event is lost;
//! 2. publish first, then a failing save: a phantom event for an order that does not exist;
//! 3. the outbox: the order and its event commit together, and a relay publishes the event;
//! 4. a flaky broker (down, lost acks): the relay retries, the broker sees duplicates, the inbox drops them;
//! 5. per-aggregate order survives a failed first event;
//! 6. two relays at once publish every event exactly once, in order; then stats and cleanup.
//!
//! The database is an SQLite file under the target directory, or `DATABASE_URL` when set
//! (`postgres://…` or `mysql://…`). The broker is [`InMemoryPublisher`], whose fault knobs replay the
//! seed's. Every fact printed is also checked; the last line is `lab: K of 6 scenarios hold`, and the exit
//! code is non-zero unless all six hold. Logs go to stderr (`RUST_LOG`, default `warn`).

mod app;
mod kafka;
mod through;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_seaorm::store::MaintenanceStore;
use outbox_seaorm::{
    Backoff, ClaimMode, EventId, Headers, InMemoryPublisher, OutboxEvent, Publisher, Relay, RelayConfig, RelayPass,
    SeaOrmStore,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, SqlErr};
use serde::Serialize;
use tracing_subscriber::EnvFilter;

use app::{BoxError, Order, Result, count, place_order};

/// The relay in this lab: SeaORM store, in-memory broker.
type LabRelay = Relay<SeaOrmStore, InMemoryPublisher>;

/// Most passes a drain makes before giving up.
const MAX_PASSES: usize = 50;
/// The relay's retry delays: tiny, so that a failed row is due again almost at once.
const BACKOFF: Backoff = Backoff { initial: Duration::from_millis(1), max: Duration::from_millis(10), multiplier: 2 };

/// The facts of one scenario that did not hold.
#[derive(Default)]
struct Checks {
    failed: usize,
}

impl Checks {
    /// Records whether `fact` holds, and says so when it does not.
    fn check(&mut self, fact: &str, holds: bool) {
        if !holds {
            self.failed += 1;
            println!("   ✗ does not hold: {fact}");
        }
    }
}

/// The database every scenario uses.
struct Lab {
    db: DatabaseConnection,
    url: String,
}

impl Lab {
    /// A relay over the lab's pool and `broker`: batches of 5, retries after 1–10 ms.
    fn relay(&self, broker: &InMemoryPublisher) -> Result<LabRelay> {
        relay_over(self.db.clone(), broker, ClaimMode::Transaction)
    }
}

fn relay_over(db: DatabaseConnection, broker: &InMemoryPublisher, claim: ClaimMode) -> Result<LabRelay> {
    let config = RelayConfig::default().with_batch_size(5).with_backoff(BACKOFF).with_claim_mode(claim);
    Ok(Relay::new(SeaOrmStore::new(db), broker.clone(), config)?)
}

/// The relay's clock in the single-relay scenarios. Each pass reads at least [`BACKOFF`]'s cap (+1 ms)
/// later than the one before, so a row that failed is due again on the next pass, as in the seed (which
/// retried at once): no sleeping, and the same number of passes on every run and every database.
struct StepClock {
    last: DateTime<Utc>,
}

impl StepClock {
    fn new() -> Self {
        StepClock { last: Utc::now() }
    }

    fn next(&mut self) -> DateTime<Utc> {
        let step = chrono::Duration::milliseconds(BACKOFF.max.as_millis() as i64 + 1);
        self.last = self.last.max(Utc::now()) + step;
        self.last
    }
}

/// Relay passes while anything is pending, at most [`MAX_PASSES`]; returns the passes made.
async fn drain<P: Publisher>(relay: &Relay<SeaOrmStore, P>, clock: &mut StepClock) -> Result<Vec<RelayPass>> {
    let mut passes = Vec::new();
    while passes.len() < MAX_PASSES && relay.store().stats(Utc::now()).await?.pending > 0 {
        passes.push(relay.run_once_at(clock.next()).await?);
    }
    Ok(passes)
}

/// What a process that dies mid-way amounts to.
fn crash() -> Result<()> {
    Err("the process crashed".into())
}

/// The naive way: send `order.placed` straight to the broker, with no outbox row behind it.
async fn publish_directly(broker: &InMemoryPublisher, order: &Order) -> Result<()> {
    let message = OutboxEvent {
        seq: 0,
        aggregate_version: 0,
        id: EventId::new(),
        aggregate_type: "order".to_owned(),
        aggregate_id: order.order_id.clone(),
        event_type: "order.placed".to_owned(),
        schema_version: 1,
        payload: serde_json::to_string(&order.placed())?,
        headers: Headers::new(),
        created_at: Utc::now(),
        attempts: 0,
        last_error: None,
    };
    for result in broker.publish(std::slice::from_ref(&message)).await {
        result?;
    }
    Ok(())
}

/// `aggregate:type` of every message the broker received, in arrival order.
fn labels(broker: &InMemoryPublisher) -> Vec<String> {
    broker.received().iter().map(|m| format!("{}:{}", m.aggregate_id, m.event_type)).collect()
}

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("<{e}>"))
}

fn distinct_ids(messages: &[OutboxEvent]) -> usize {
    messages.iter().map(|m| m.id).collect::<HashSet<_>>().len()
}

async fn dual_write_then_crash(lab: &Lab, checks: &mut Checks) -> Result<()> {
    println!("① dual write: save, then publish, and the process dies in between:");
    app::reset(&lab.db).await?;
    let broker = InMemoryPublisher::new();
    let order = Order::new("n1", "mahmoud", 500);
    let attempt: Result<()> = async {
        lab.db.execute(&order.insert()?).await?;
        crash()?;
        publish_directly(&broker, &order).await
    }
    .await;
    if let Err(error) = &attempt {
        println!("   {error}");
    }
    let orders = count(&lab.db, "orders").await?;
    let events = broker.received_count();
    println!("   orders: {orders}, events at the broker: {events} ← billing will never know");
    checks.check("the process crashed between save and publish", attempt.is_err());
    checks.check("the order was saved", orders == 1);
    checks.check("no event reached the broker", events == 0);
    Ok(())
}

async fn publish_then_failed_save(lab: &Lab, checks: &mut Checks) -> Result<()> {
    println!("② publish first, then save, and the save fails:");
    app::reset(&lab.db).await?;
    // As ① left it: order n1 is saved.
    lab.db.execute(&Order::new("n1", "mahmoud", 500).insert()?).await?;
    let broker = InMemoryPublisher::new();
    let sara = Order::new("n1", "sara", 700);
    publish_directly(&broker, &sara).await?;
    let saved = lab.db.execute(&sara.insert()?).await;
    let violation = saved.as_ref().err().and_then(DbErr::sql_err);
    match (&saved, &violation) {
        (Err(_), Some(violation)) => println!("   {violation}"),
        (Err(error), None) => println!("   {error}"),
        (Ok(_), _) => println!("   the save succeeded"),
    }
    let events = broker.received_count();
    let saras = count(&lab.db, "orders WHERE customer = 'sara'").await?;
    println!("   events at the broker: {events} ← an event for Sara's order, which was never saved (orders: {saras})");
    checks.check(
        "the save failed on the duplicate primary key",
        matches!(violation, Some(SqlErr::UniqueConstraintViolation(_))),
    );
    checks.check("the broker has one event", events == 1);
    checks.check("and no order of Sara's exists", saras == 0);
    Ok(())
}

async fn outbox_in_one_transaction(lab: &Lab, checks: &mut Checks) -> Result<()> {
    println!("③ outbox: the order and its event in one transaction:");
    app::reset(&lab.db).await?;
    let broker = InMemoryPublisher::new();
    let relay = lab.relay(&broker)?;
    let attempt = app::place_order_then_crash(&lab.db, &Order::new("o0", "karim", 900)).await;
    if let Err(error) = &attempt {
        println!("   crash before COMMIT: {error}");
    }
    let orders = count(&lab.db, "orders").await?;
    let outbox = count(&lab.db, "outbox_events").await?;
    println!("   orders: {orders}, outbox: {outbox} ← nothing, and the two agree");
    checks.check("the transaction crashed before COMMIT", attempt.is_err());
    checks.check("no order and no outbox row remain", orders == 0 && outbox == 0);

    place_order(&lab.db, &Order::new("o1", "mahmoud", 44900)).await?;
    let stats = relay.store().stats(Utc::now()).await?;
    let received = broker.received_count();
    println!("   after place_order: {} and the broker is still empty: {received}", json(&stats));
    checks.check("one event is pending, none dead", stats.pending == 1 && stats.dead == 0);
    checks.check("the broker is empty until the relay runs", received == 0);

    let pass = relay.run_once().await?;
    let got = labels(&broker);
    println!("   one relay pass: {} ← the broker: {}", json(&pass), got.join(" "));
    let after = relay.store().stats(Utc::now()).await?;
    checks.check("the pass published the one event", pass.claimed == 1 && pass.published == 1 && pass.failed == 0);
    checks.check("the broker has o1:order.placed", got == ["o1:order.placed"]);
    checks.check("nothing is pending after the pass", after.pending == 0);
    Ok(())
}

async fn flaky_broker_and_inbox(lab: &Lab, checks: &mut Checks) -> Result<()> {
    println!(
        "④ twenty orders; the broker is down three times and four acks are lost \
         (the broker got the message, the relay never heard):"
    );
    app::reset(&lab.db).await?;
    let broker = InMemoryPublisher::new();
    let relay = lab.relay(&broker)?;
    for i in 1..=20 {
        place_order(&lab.db, &Order::new(format!("o{i}"), format!("u{i}"), 1000 * i)).await?;
    }
    broker.go_down_for(3);
    broker.lose_acks(4);
    let passes = drain(&relay, &mut StepClock::new()).await?;
    let stats = relay.store().stats(Utc::now()).await?;
    let received = broker.received();
    let distinct = distinct_ids(&received);
    println!(
        "   the relay made {} passes, and the broker received {} messages for {distinct} events",
        passes.len(),
        received.len()
    );
    checks.check("the relay drained the outbox", stats.pending == 0 && stats.dead == 0);
    checks.check("in 6 passes of at most 5 events", passes.len() == 6);
    checks.check("the broker received 24 messages", received.len() == 24);
    checks.check("for 20 distinct events", distinct == 20);

    /// What billing did with the messages.
    #[derive(Serialize)]
    struct Tally {
        processed: usize,
        duplicate: usize,
    }
    let (mut processed, mut duplicate) = (0, 0);
    for message in &received {
        if outbox_seaorm::deliver(&lab.db, "billing", message, app::bill).await?.is_processed() {
            processed += 1;
        } else {
            duplicate += 1;
        }
    }
    let (invoices, total, billed_orders) = app::invoices(&lab.db).await?;
    println!("   billing: {} ← invoices: {invoices}, totalling {total}", json(&Tally { processed, duplicate }));
    println!(
        "   without an inbox there would be {} invoices: {} customers billed twice",
        received.len(),
        received.len() - distinct
    );
    checks.check("billing processed 20 and dropped 4 duplicates", processed == 20 && duplicate == 4);
    checks.check("20 invoices, one per order", invoices == 20 && billed_orders == 20);
    checks.check("totalling 210000", total == 210_000);
    Ok(())
}

async fn order_within_an_aggregate(lab: &Lab, checks: &mut Checks) -> Result<()> {
    println!("⑤ the order of one order's events, when its first event fails once:");
    app::reset(&lab.db).await?;
    let broker = InMemoryPublisher::new();
    let relay = lab.relay(&broker)?;
    app::place_pay_ship(&lab.db, &Order::new("o7", "nour", 1500)).await?;
    place_order(&lab.db, &Order::new("o8", "omar", 800)).await?;
    broker.fail_aggregate("o7", 1);

    let mut clock = StepClock::new();
    let first = relay.run_once_at(clock.next()).await?;
    let waiting = count(&lab.db, "outbox_events WHERE aggregate_id = 'o7' AND published_at_ms IS NULL").await?;
    println!("   first pass: {} ← o8 published; all of o7 waited ({waiting} of its events pending)", json(&first));
    println!(
        "   (each order's events are claimed as a run; o7's first failed, so its later two were released untried)"
    );
    checks.check(
        "the first pass claimed o7's run and o8's event: o7's head failed and held back its run, o8 published",
        first.claimed == 4 && first.published == 1 && first.failed == 1 && first.released == 2,
    );
    checks.check("o7's three events were still pending", waiting == 3);
    checks.check("only o8 reached the broker", labels(&broker) == ["o8:order.placed"]);

    let passes = drain(&relay, &mut clock).await?;
    let got = labels(&broker);
    println!("   the broker after {} more passes: {}", passes.len(), got.join("  "));
    let o7_seqs: Vec<i64> = broker.received().iter().filter(|m| m.aggregate_id == "o7").map(|m| m.seq).collect();
    checks.check(
        "the broker got o8:order.placed o7:order.placed o7:order.paid o7:order.shipped",
        got == ["o8:order.placed", "o7:order.placed", "o7:order.paid", "o7:order.shipped"],
    );
    checks.check("o7's events arrived in the order they were written", o7_seqs.is_sorted() && o7_seqs.len() == 3);
    Ok(())
}

/// Relay passes until nothing is pending; returns (published, passes that claimed something).
async fn relay_until_empty(relay: LabRelay) -> Result<(u64, usize)> {
    let (mut published, mut passes) = (0, 0);
    for _ in 0..10_000 {
        if relay.store().stats(Utc::now()).await?.pending == 0 {
            relay.store().connection().clone().close().await?;
            return Ok((published, passes));
        }
        let pass = relay.run_once().await?;
        if pass.claimed == 0 {
            // The other relay holds every due head: let it finish.
            tokio::time::sleep(Duration::from_millis(2)).await;
        } else {
            passes += 1;
            published += pass.published;
        }
    }
    Err("the relay did not drain the outbox in 10000 rounds".into())
}

async fn two_relays_at_once(lab: &Lab, checks: &mut Checks) -> Result<()> {
    const ORDERS: usize = 20;
    const STEPS: u32 = 10;
    println!(
        "⑥ two relays at once, each with its own connection pool: {} events of {ORDERS} orders:",
        ORDERS * STEPS as usize
    );
    app::reset(&lab.db).await?;
    for step in 1..=STEPS {
        app::update_orders(&lab.db, ORDERS, step).await?;
    }
    let broker = InMemoryPublisher::new();
    broker.set_delay(Duration::from_millis(3));
    // PostgreSQL and MySQL lock the claimed rows (`FOR UPDATE SKIP LOCKED`) while publishing, and the other
    // relay skips them. SQLite has no row locks: a transaction claim holds the whole database, so the
    // relays would only take turns; leases keep the write lock for the claim alone.
    let claim = match lab.db.get_database_backend() {
        DbBackend::Sqlite => {
            println!("   claims: leases of 30 s (SQLite has no row locks)");
            ClaimMode::Lease { duration: Duration::from_secs(30) }
        }
        _ => {
            println!("   claims: FOR UPDATE SKIP LOCKED, held while publishing");
            ClaimMode::Transaction
        }
    };
    let a = relay_over(outbox_seaorm::connect(&lab.url).await?, &broker, claim)?;
    let b = relay_over(outbox_seaorm::connect(&lab.url).await?, &broker, claim)?;
    let (a, b) = tokio::join!(tokio::spawn(relay_until_empty(a)), tokio::spawn(relay_until_empty(b)));
    let ((published_a, passes_a), (published_b, passes_b)) = (a??, b??);

    let received = broker.received();
    let distinct = distinct_ids(&received);
    println!(
        "   relay A published {published_a} in {passes_a} passes, relay B {published_b} in {passes_b}; \
         the broker received {} messages, {distinct} distinct",
        received.len()
    );
    let expected = (ORDERS * STEPS as usize) as u64;
    checks.check("the two relays published all 200 events between them", published_a + published_b == expected);
    checks.check(
        "the broker received each of the 200 exactly once",
        received.len() as u64 == expected && distinct as u64 == expected,
    );

    let mut steps: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for message in &received {
        let step = serde_json::from_str::<serde_json::Value>(&message.payload)?["step"].as_u64().unwrap_or(0);
        steps.entry(&message.aggregate_id).or_default().push(step);
    }
    let in_order = steps.values().filter(|s| **s == (1..=u64::from(STEPS)).collect::<Vec<_>>()).count();
    println!("   orders whose {STEPS} events arrived in order: {in_order} of {ORDERS}");
    checks.check("every order's events arrived in order", in_order == ORDERS);

    let store = SeaOrmStore::new(lab.db.clone());
    let stats = store.stats(Utc::now()).await?;
    // Rows published in this very millisecond are not yet "older than 0 ms".
    tokio::time::sleep(Duration::from_millis(5)).await;
    let deleted = store.cleanup(Utc::now(), Duration::ZERO, 50).await?;
    let left = count(&lab.db, "outbox_events").await?;
    println!("   stats: {}", json(&stats));
    println!("   cleanup(retention 0, batch 50) deleted {deleted} published rows; {left} rows left");
    checks.check("nothing pending, nothing dead", stats.pending == 0 && stats.dead == 0);
    checks.check("cleanup deleted all 200 published rows", deleted == 200 && left == 0);
    Ok(())
}

/// The SQLite file the lab uses when `DATABASE_URL` is not set, deleted first.
fn sqlite_url() -> Result<String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&target)?;
    let path = target.join("outbox-lab.db");
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        if file.exists() {
            std::fs::remove_file(&file)?;
        }
    }
    Ok(format!("sqlite://{}?mode=rwc", path.display()))
}

/// The lab's command line.
#[derive(clap::Parser)]
#[command(about = "The seed lab: dual write loses events, the transactional outbox does not.")]
struct Args {
    /// Run scenario ④ through this broker instead of the in-memory one: nats://, kafka://, amqp:// or
    /// redis:// (e.g. nats://127.0.0.1:4222).
    #[arg(long)]
    broker: Option<String>,
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let args = <Args as clap::Parser>::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .init();

    let url = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => sqlite_url()?,
    };
    let db = outbox_seaorm::connect(&url).await?;
    outbox_seaorm::migrate(&db).await?;
    app::create_tables(&db).await?;
    let lab = Lab { db, url };

    const SCENARIOS: usize = 6;
    let mut held = 0;
    for scenario in 1..=SCENARIOS {
        let mut checks = Checks::default();
        let outcome = match scenario {
            1 => dual_write_then_crash(&lab, &mut checks).await,
            2 => publish_then_failed_save(&lab, &mut checks).await,
            3 => outbox_in_one_transaction(&lab, &mut checks).await,
            4 => match &args.broker {
                Some(url) => through::flaky_broker_through(&lab, url, &mut checks).await,
                None => flaky_broker_and_inbox(&lab, &mut checks).await,
            },
            5 => order_within_an_aggregate(&lab, &mut checks).await,
            _ => two_relays_at_once(&lab, &mut checks).await,
        };
        if let Err(error) = outcome {
            checks.check(&format!("the scenario ran to the end, but: {error}"), false);
        }
        if checks.failed == 0 {
            held += 1;
        }
        println!();
    }
    lab.db.close().await?;
    println!("lab: {held} of {SCENARIOS} scenarios hold");
    Ok(if held == SCENARIOS { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

//! Helpers shared by the integration test modules (`suite/main.rs` declares this module; `macros.rs`
//! includes it by path, and not every test uses every helper).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_integration_tests::TestDb;
#[allow(unused_imports)]
pub use outbox_integration_tests::{count_inbox, outbox_row};
use outbox_seaorm::entity::outbox_event;
use outbox_seaorm::{Backoff, EventId, NewEvent, OutboxEvent, RelayConfig};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, Statement, TransactionTrait,
};

/// The backoff cap of [`fast_config`]: a pass at `now + CAP` is past every retry delay.
pub const CAP: Duration = Duration::from_secs(10);

/// Relay settings whose retry delays are at most [`CAP`], so tests step over them with `run_once_at`.
pub fn fast_config() -> RelayConfig {
    RelayConfig::default().with_backoff(Backoff { initial: Duration::from_secs(1), max: CAP, multiplier: 2 })
}

/// `t + d`.
pub fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).expect("duration fits")
}

/// An `order` event of `aggregate_id` whose payload is `{"n": n}`.
pub fn event(aggregate_id: &str, event_type: &str, n: u64) -> NewEvent {
    NewEvent::new("order", aggregate_id, event_type, &serde_json::json!({ "n": n })).expect("valid event")
}

/// The `n` of an event built by [`event`].
pub fn n_of(event: &OutboxEvent) -> u64 {
    let payload: serde_json::Value = serde_json::from_str(&event.payload).expect("payload is JSON");
    payload["n"].as_u64().expect("payload has n")
}

/// Enqueues `events` in a transaction of their own and commits it.
pub async fn enqueue_committed(t: &TestDb, events: &[NewEvent]) {
    let txn = t.db.begin().await.unwrap_or_else(|e| panic!("{t}: begin: {e}"));
    outbox_seaorm::enqueue_all(&txn, events).await.unwrap_or_else(|e| panic!("{t}: enqueue: {e}"));
    txn.commit().await.unwrap_or_else(|e| panic!("{t}: commit: {e}"));
}

/// Every outbox row, by sequence.
pub async fn outbox_rows(t: &TestDb) -> Vec<outbox_event::Model> {
    outbox_event::Entity::find()
        .order_by_asc(outbox_event::Column::Seq)
        .all(&t.db)
        .await
        .unwrap_or_else(|e| panic!("{t}: read outbox rows: {e}"))
}

/// Rows in `outbox_events`.
pub async fn count_outbox(t: &TestDb) -> u64 {
    outbox_event::Entity::find().count(&t.db).await.unwrap_or_else(|e| panic!("{t}: count outbox rows: {e}"))
}

/// Rows in `outbox_events` marked published.
pub async fn count_published(t: &TestDb) -> u64 {
    outbox_event::Entity::find()
        .filter(outbox_event::Column::PublishedAtMs.is_not_null())
        .count(&t.db)
        .await
        .unwrap_or_else(|e| panic!("{t}: count published rows: {e}"))
}

/// Rows in `outbox_events` not published yet (dead ones included).
pub async fn count_unpublished(t: &TestDb) -> u64 {
    outbox_event::Entity::find()
        .filter(outbox_event::Column::PublishedAtMs.is_null())
        .count(&t.db)
        .await
        .unwrap_or_else(|e| panic!("{t}: count unpublished rows: {e}"))
}

/// `SELECT COUNT(*)` of any table, e.g. the test's own business tables.
pub async fn count_table(t: &TestDb, table: &str) -> i64 {
    let sql = format!("SELECT COUNT(*) AS n FROM {table}");
    let row =
        t.db.query_one_raw(Statement::from_string(t.backend, sql))
            .await
            .unwrap_or_else(|e| panic!("{t}: count {table}: {e}"))
            .unwrap_or_else(|| panic!("{t}: COUNT(*) of {table} returned no row"));
    row.try_get::<i64>("", "n").unwrap_or_else(|e| panic!("{t}: decode COUNT(*) of {table}: {e}"))
}

/// A shop's own tables, next to the outbox: `orders` (the business change) and `invoices` (a consumer's
/// effect, deliberately without a unique key: only the inbox prevents a double invoice).
pub async fn create_shop_tables(t: &TestDb) {
    for sql in [
        "CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, customer VARCHAR(64) NOT NULL, total_minor BIGINT NOT NULL)",
        "CREATE TABLE invoices (order_id VARCHAR(64) NOT NULL, total_minor BIGINT NOT NULL)",
    ] {
        t.db.execute_unprepared(sql).await.unwrap_or_else(|e| panic!("{t}: {sql}: {e}"));
    }
}

/// Inserts an invoice through `conn` (a consumer's effect).
pub async fn insert_invoice<C: ConnectionTrait>(
    conn: &C,
    order_id: &str,
    total_minor: i64,
) -> Result<(), sea_orm::DbErr> {
    let sql = format!("INSERT INTO invoices (order_id, total_minor) VALUES ('{order_id}', {total_minor})");
    conn.execute_unprepared(&sql).await.map(|_| ())
}

/// The billing consumer over `deliveries` (event id, order id), in order: each applies one invoice of 4900
/// through the inbox. Returns (processed, duplicates).
pub async fn bill(t: &TestDb, deliveries: impl IntoIterator<Item = (EventId, String)>) -> (u32, u32) {
    let (mut processed, mut duplicates) = (0, 0);
    for (id, order) in deliveries {
        let outcome = outbox_seaorm::handle_once(&t.db, "billing", &id.to_string(), async |txn| {
            insert_invoice(txn, &order, 4900).await
        })
        .await
        .unwrap_or_else(|e| panic!("{t}: {e}"));
        match outcome {
            outbox_seaorm::InboxOutcome::Processed(()) => processed += 1,
            outbox_seaorm::InboxOutcome::Duplicate => duplicates += 1,
        }
    }
    (processed, duplicates)
}

/// The sum of `invoices.total_minor`, added up here (SUM's result type differs per backend).
pub async fn invoice_total(t: &TestDb) -> i64 {
    let rows =
        t.db.query_all_raw(Statement::from_string(t.backend, "SELECT total_minor FROM invoices"))
            .await
            .unwrap_or_else(|e| panic!("{t}: read invoices: {e}"));
    rows.iter().map(|r| r.try_get::<i64>("", "total_minor").expect("total_minor")).sum()
}

/// Checks per-aggregate order at the broker: within each aggregate, sequence numbers never go down. A
/// repeated sequence number right after itself is a redelivery (lost ack); a smaller one after a larger one
/// would be a reordering.
pub fn assert_per_aggregate_order(received: &[OutboxEvent], t: &TestDb) {
    let mut last: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for event in received {
        let key = (event.aggregate_type.as_str(), event.aggregate_id.as_str());
        if let Some(&previous) = last.get(&key) {
            assert!(
                event.seq >= previous,
                "{t}: aggregate {key:?}: seq {} arrived after seq {previous} (per-aggregate order broken)",
                event.seq
            );
        }
        last.insert(key, event.seq);
    }
}

/// A tiny deterministic pseudo-random generator (xorshift64*), so failures are "random" but reproducible.
pub struct Rng(u64);

impl Rng {
    /// A generator from a non-zero seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    /// The next number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Replays every dead event of the relay's database (due at the wall clock), as `outbox dead replay --all`.
pub async fn replay_all<P: outbox_seaorm::Publisher>(
    relay: &outbox_seaorm::Relay<outbox_seaorm::SeaOrmStore, P>,
) -> outbox_seaorm::Result<u64> {
    outbox_ops::admin::replay_dead(relay.store().connection(), &outbox_ops::admin::DeadFilter::all()).await
}

/// Appends each message to a file as a line `id aggregate`, synced before the publish reports success: a
/// broker that outlives any process and no database lock can hold up (SQLite's transaction claim holds the
/// only write lock).
#[derive(Clone)]
pub struct FileBroker {
    /// The file.
    pub path: std::path::PathBuf,
}

impl outbox_seaorm::Publisher for FileBroker {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), outbox_seaorm::PublishError>> {
        use std::io::Write as _;
        let append = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
            // A leading newline ends a line that a killed process left half-written, so it never runs
            // into this call's first line.
            let mut lines = String::from("\n");
            for e in events {
                lines.push_str(&format!("{} {}\n", e.id, e.aggregate_id));
            }
            file.write_all(lines.as_bytes())?;
            file.sync_data()
        };
        match append() {
            Ok(()) => vec![Ok(()); events.len()],
            Err(error) => vec![Err(outbox_seaorm::PublishError::transient(error.to_string())); events.len()],
        }
    }
}

impl FileBroker {
    /// Every message the file holds, in arrival order: `(event id, aggregate id)`.
    pub fn deliveries(&self) -> Vec<(EventId, String)> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                // A process killed mid-write leaves at most a partial last line, never confirmed; the
                // next call's leading newline ends it (and leaves empty lines).
                let (id, aggregate) = line.split_once(' ')?;
                Some((id.parse().ok()?, aggregate.to_owned()))
            })
            .collect()
    }
}

/// The broker file of test database `t`.
pub fn broker_of(t: &TestDb) -> FileBroker {
    let name: String = t.url.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    FileBroker { path: std::env::temp_dir().join(format!("outbox-fault-broker-{name}.log")) }
}

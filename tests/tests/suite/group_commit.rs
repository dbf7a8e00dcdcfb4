//! Group commit (`Consumer::with_group_commit(SeaOrmGroupCommit)`) on the real databases: a group's
//! inbox rows (written ahead, in one statement) and effects commit together, and a transaction that died under a handler which swallowed
//! the error never lets the group ack messages whose effects are gone.
//!
//! The broker here is a queue in the test (the contract suite runs groups through the four real brokers);
//! what is under test is the database side of the group. Batch handlers (`Consumer::on_batch` with
//! `handle_batch_once`) are checked here too.

use crate::common;

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use common::{count_table, create_shop_tables, enqueue_committed, fast_config, insert_invoice};
use outbox_integration_tests::contract::{Running, eventually};
use outbox_integration_tests::{Backend, TestDb, count_inbox, run_on};
use outbox_seaorm::consume::{DeadLetter, Delivery, Transport};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{Consumer, ConsumerConfig, Handled, InMemoryPublisher, InboxOutcome, Received, SeaOrmGroupCommit};
use sea_orm::{ConnectionTrait as _, DbErr};
use serde::{Deserialize, Serialize};

const CONSUMER: &str = "group-billing";

#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "order.billed", version = 1, aggregate = "order")]
struct OrderBilled {
    #[aggregate_id]
    order_id: String,
    total_minor: i64,
}

/// The messages the relay published, delivered once each, in order; acks counted.
#[derive(Default)]
struct Queue {
    messages: Mutex<VecDeque<(u64, Delivery<u64>)>>,
    acked: Mutex<Vec<u64>>,
}

impl Queue {
    async fn of(t: &TestDb, events: &[NewEvent]) -> Queue {
        enqueue_committed(t, events).await;
        let publisher = InMemoryPublisher::new();
        let relay = Relay::new(SeaOrmStore::new(t.db.clone()), publisher.clone(), fast_config()).expect("relay");
        relay.drain(50).await.expect("relay");
        let queue = Queue::default();
        for (i, event) in publisher.received().iter().enumerate() {
            let receipt = i as u64 + 1;
            let delivery = Delivery {
                headers: outbox_seaorm::broker::envelope_headers(event).into_iter().collect(),
                payload: event.payload.clone().into_bytes(),
                origin: "orders".into(),
                deliveries: 1,
                receipt,
            };
            queue.messages.lock().expect("queue").push_back((receipt, delivery));
        }
        queue
    }

    /// Queues the first `n` messages again, as their second delivery.
    fn deliver_again(&self, n: usize) {
        let mut messages = self.messages.lock().expect("queue");
        let again: Vec<_> = messages
            .iter()
            .take(n)
            .map(|(r, d)| {
                let (headers, payload, origin) = (d.headers.clone(), d.payload.clone(), d.origin.clone());
                (r + 1000, Delivery { headers, payload, origin, deliveries: 2, receipt: r + 1000 })
            })
            .collect();
        messages.extend(again);
    }

    /// The event id of each message, in queue order.
    fn ids(&self) -> Vec<String> {
        let messages = self.messages.lock().expect("queue");
        messages.iter().map(|(_, d)| d.headers[outbox_seaorm::broker::header::ID].clone()).collect()
    }

    /// The aggregate id of the last message: the last of the group that takes them all.
    fn last_order(&self) -> String {
        let messages = self.messages.lock().expect("queue");
        let (_, last) = messages.back().expect("a message");
        last.headers.get(outbox_seaorm::broker::header::SUBJECT).expect("subject").clone()
    }
}

impl Transport for Queue {
    type Receipt = u64;

    fn broker(&self) -> &'static str {
        "test queue"
    }

    fn source(&self) -> String {
        "orders".into()
    }

    async fn fetch(&self, max: usize, wait: Duration) -> outbox_seaorm::Result<Vec<Delivery<u64>>> {
        let batch: Vec<_> = {
            let mut messages = self.messages.lock().expect("queue");
            let n = max.min(messages.len());
            messages.drain(..n).map(|(_, d)| d).collect()
        };
        if batch.is_empty() {
            tokio::time::sleep(wait).await;
        }
        Ok(batch)
    }

    async fn ack(&self, receipt: &u64) -> outbox_seaorm::Result<()> {
        self.acked.lock().expect("acked").push(*receipt);
        Ok(())
    }

    async fn release(&self, _receipt: &u64) -> outbox_seaorm::Result<()> {
        Ok(())
    }

    async fn dead_letter(&self, _delivery: &Delivery<u64>, letter: &DeadLetter) -> outbox_seaorm::Result<()> {
        panic!("nothing should be dead-lettered here: {letter:?}");
    }
}

fn billed(n: usize) -> Vec<NewEvent> {
    (0..n).map(|i| OrderBilled { order_id: format!("o{i}"), total_minor: 100 }.to_new_event().expect("event")).collect()
}

/// What a billing handler does wrong for an order, then hides by swallowing the error it gets back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trouble {
    None,
    /// Ends the database transaction under its inbox call and fails its effect, as a MySQL deadlock does.
    KillsTheTransaction,
    /// Its effect writes the invoice, then fails.
    EffectFails,
}

/// A billing consumer in groups of up to 32 on `t`'s pool, whose handler causes `trouble(order)` and
/// reports success all the same.
fn billing(t: &TestDb, trouble: impl Fn(&str) -> Trouble + Send + Sync + 'static) -> Consumer {
    billing_recording_as(t, CONSUMER, trouble)
}

/// [`billing`], whose handler records its messages in the inbox under `inbox_name`.
fn billing_recording_as(
    t: &TestDb,
    inbox_name: &'static str,
    trouble: impl Fn(&str) -> Trouble + Send + Sync + 'static,
) -> Consumer {
    let (db, trouble) = (t.db.clone(), std::sync::Arc::new(trouble));
    let handler = move |received: Received<OrderBilled>| {
        let (db, trouble) = (db.clone(), trouble.clone());
        async move {
            let trouble = trouble(&received.event.order_id);
            let order = received.event.order_id.clone();
            let id = received.envelope.id.to_string();
            let outcome = outbox_seaorm::handle_once(&db, inbox_name, &id, async |txn| {
                insert_invoice(txn, &order, 100).await?;
                match trouble {
                    Trouble::None => Ok::<_, DbErr>(()),
                    Trouble::KillsTheTransaction => {
                        txn.execute_unprepared("ROLLBACK").await?;
                        Err(DbErr::Custom("deadlock found when trying to get lock".into()))
                    }
                    Trouble::EffectFails => Err(DbErr::Custom("the invoice service said no".into())),
                }
            })
            .await;
            match outcome {
                Ok(outcome) => Ok(Handled::from(outcome)),
                Err(_) if trouble != Trouble::None => Ok(Handled::Processed), // the handler bug under test: swallowed
                Err(error) => Err(error.to_string()),
            }
        }
    };
    let config = ConsumerConfig::default().with_fetch_wait(Duration::from_millis(50)).with_group_size(32);
    Consumer::new(CONSUMER)
        .with_config(config)
        .with_group_commit(SeaOrmGroupCommit::new(t.db.clone()))
        .on::<OrderBilled>(handler)
}

/// 40 orders, consumed in groups: each invoice and inbox row exactly once, in fewer commits than orders.
async fn a_group_commits_its_inbox_rows_and_effects_together(t: TestDb) {
    create_shop_tables(&t).await;
    let queue = Queue::of(&t, &billed(40)).await;
    let running = Running::start(billing(&t, |_| Trouble::None), queue);
    eventually(Duration::from_secs(60), &format!("{t}: 40 applied"), async || running.stats().processed == 40).await;
    let stats = running.stop().await;
    assert!(stats.groups > 0 && stats.groups < 40, "{t}: applied in groups: {stats:?}");
    assert_eq!(stats.group_rollbacks, 0, "{t}: {stats:?}");
    assert_eq!(count_table(&t, "invoices").await, 40, "{t}");
    assert_eq!(count_inbox(&t, CONSUMER).await, 40, "{t}");
}

/// The last handler of a group kills the transaction and swallows the error: the group must not commit
/// (its COMMIT would succeed with the neighbours' effects gone); it rolls back and every order is then
/// applied alone, once. (SQLite ends a transaction on its own only on I/O errors, a full disk or memory
/// exhaustion; there the group cannot tell, so this runs on PostgreSQL and MariaDB.)
async fn a_transaction_killed_under_a_swallowing_handler_never_acks_lost_effects(t: TestDb) {
    outbox_integration_tests::log_to_test_output();
    create_shop_tables(&t).await;
    let queue = Queue::of(&t, &billed(8)).await;
    // The last message of the one group that takes all 8 kills the transaction (every time it runs).
    let victim = queue.last_order();
    let killer = victim.clone();
    let trouble = move |order: &str| if order == killer { Trouble::KillsTheTransaction } else { Trouble::None };
    let running = Running::start(billing(&t, trouble), queue);
    eventually(Duration::from_secs(60), &format!("{t}: 8 handled"), async || running.stats().processed >= 8).await;
    let stats = running.stop().await;
    assert_eq!(stats.group_rollbacks, 1, "{t}: the dead transaction was noticed: {stats:?}");
    for i in (0..8).map(|i| format!("o{i}")).filter(|order| *order != victim) {
        let sql = format!("SELECT COUNT(*) AS n FROM invoices WHERE order_id = '{i}'");
        let row = t.db.query_one_raw(sea_orm::Statement::from_string(t.backend, sql)).await.expect("count");
        let n: i64 = row.expect("row").try_get("", "n").expect("n");
        assert_eq!(n, 1, "{t}: order {i} applied exactly once");
    }
}

/// Inside a group, the inbox call shares the group's transaction (no savepoint). An effect that fails
/// under a handler that swallows the error must still be undone, as it is when the message runs alone:
/// the group rolls back, the other orders are applied alone once each, and the failed one leaves no
/// invoice and no inbox row.
async fn a_failed_effect_is_undone_in_a_group_as_it_is_alone(t: TestDb) {
    create_shop_tables(&t).await;
    let queue = Queue::of(&t, &billed(8)).await;
    let victim = queue.last_order();
    let failing = victim.clone();
    let trouble = move |order: &str| if order == failing { Trouble::EffectFails } else { Trouble::None };
    let running = Running::start(billing(&t, trouble), queue);
    eventually(Duration::from_secs(60), &format!("{t}: 8 handled"), async || running.stats().processed >= 8).await;
    let stats = running.stop().await;
    assert_eq!(stats.group_rollbacks, 1, "{t}: the failed call spoiled its group: {stats:?}");
    for i in 0..8 {
        let order = format!("o{i}");
        let sql = format!("SELECT COUNT(*) AS n FROM invoices WHERE order_id = '{order}'");
        let row = t.db.query_one_raw(sea_orm::Statement::from_string(t.backend, sql)).await.expect("count");
        let n: i64 = row.expect("row").try_get("", "n").expect("n");
        assert_eq!(n, i64::from(order != victim), "{t}: order {order}");
    }
    assert_eq!(count_inbox(&t, CONSUMER).await, 7, "{t}: the failed message left no inbox row");
}

/// A message the inbox already holds (a redelivery) ends its call without spoiling the group.
async fn a_redelivery_in_a_group_does_not_roll_it_back(t: TestDb) {
    create_shop_tables(&t).await;
    let queue = Queue::of(&t, &billed(20)).await;
    queue.deliver_again(usize::MAX);
    let running = Running::start(billing(&t, |_| Trouble::None), queue);
    eventually(Duration::from_secs(60), &format!("{t}: 40 handled"), async || {
        let stats = running.stats();
        stats.processed + stats.duplicates >= 40
    })
    .await;
    let stats = running.stop().await;
    assert_eq!(stats.group_rollbacks, 0, "{t}: {stats:?}");
    assert_eq!((stats.processed, stats.duplicates), (20, 20), "{t}: {stats:?}");
    assert_eq!(count_table(&t, "invoices").await, 20, "{t}");
    assert_eq!(count_inbox(&t, CONSUMER).await, 20, "{t}");
}

/// A group writes its messages' inbox rows before the handlers run, in one statement. A message whose
/// row an earlier delivery committed is a duplicate there: its effect does not run again, and the group
/// commits the others.
async fn a_message_the_inbox_holds_is_a_duplicate_in_a_group(t: TestDb) {
    create_shop_tables(&t).await;
    let queue = Queue::of(&t, &billed(20)).await;
    // Every other message was applied before: its inbox row and its invoice are committed.
    for id in queue.ids().iter().step_by(2) {
        let before =
            outbox_seaorm::handle_once(&t.db, CONSUMER, id, async |txn| insert_invoice(txn, "earlier", 1).await);
        let outcome = before.await.unwrap_or_else(|e| panic!("{t}: applied before: {e}"));
        assert!(matches!(outcome, InboxOutcome::Processed(())), "{t}");
    }
    let running = Running::start(billing(&t, |_| Trouble::None), queue);
    eventually(Duration::from_secs(60), &format!("{t}: 20 handled"), async || {
        let stats = running.stats();
        stats.processed + stats.duplicates == 20
    })
    .await;
    let stats = running.stop().await;
    assert_eq!((stats.processed, stats.duplicates), (10, 10), "{t}: {stats:?}");
    assert_eq!(count_table(&t, "invoices").await, 20, "{t}: 10 earlier and 10 now, none twice");
    assert_eq!(count_inbox(&t, CONSUMER).await, 20, "{t}");
}

/// The rows a group writes ahead are under the consumer's name; a handler that records under another
/// name (or not at all) does not claim them, and they are deleted before the commit: the inbox holds
/// what the handlers recorded, as without a group.
async fn rows_no_handler_claimed_are_not_committed(t: TestDb) {
    create_shop_tables(&t).await;
    let queue = Queue::of(&t, &billed(20)).await;
    let running = Running::start(billing_recording_as(&t, "ledger", |_| Trouble::None), queue);
    eventually(Duration::from_secs(60), &format!("{t}: 20 applied"), async || running.stats().processed == 20).await;
    let stats = running.stop().await;
    assert!(stats.groups > 0, "{t}: {stats:?}");
    assert_eq!(count_table(&t, "invoices").await, 20, "{t}");
    assert_eq!(count_inbox(&t, "ledger").await, 20, "{t}: the handler's own rows");
    assert_eq!(count_inbox(&t, CONSUMER).await, 0, "{t}: no row the handlers did not record");
}

/// The queue's messages as a batch handler receives them.
fn received(queue: &Queue) -> Vec<Received<OrderBilled>> {
    let messages = queue.messages.lock().expect("queue");
    messages
        .iter()
        .map(|(_, d)| {
            let envelope = outbox_seaorm::broker::decode_message(&d.headers, &d.payload).expect("an envelope");
            Received::decode(CONSUMER, envelope, 1).expect("an event")
        })
        .collect()
}

/// One invoice per message, in one statement.
async fn invoice_all(txn: &sea_orm::DatabaseTransaction, batch: &[Received<OrderBilled>]) -> Result<(), DbErr> {
    let rows: Vec<String> =
        batch.iter().map(|r| format!("('{}', {})", r.event.order_id, r.event.total_minor)).collect();
    txn.execute_unprepared(&format!("INSERT INTO invoices (order_id, total_minor) VALUES {}", rows.join(", "))).await?;
    Ok(())
}

/// `handle_batch_once` records every message of a batch and runs one effect for the new ones: a message
/// applied before, or twice in the batch, is a duplicate and not handed to the effect; a failed effect
/// leaves no inbox row of the batch; a batch of duplicates runs no effect.
async fn a_batch_effect_runs_once_for_the_new_messages_only(t: TestDb) {
    create_shop_tables(&t).await;
    let queue = Queue::of(&t, &billed(6)).await;
    let mut batch = received(&queue);
    for r in &batch[..2] {
        let id = r.envelope.id.to_string();
        let before =
            outbox_seaorm::handle_once(&t.db, CONSUMER, &id, async |txn| insert_invoice(txn, "earlier", 1).await);
        assert!(before.await.unwrap_or_else(|e| panic!("{t}: applied before: {e}")).is_processed(), "{t}");
    }
    batch.push(batch[3].clone());
    let failed = outbox_seaorm::handle_batch_once(&t.db, CONSUMER, batch.clone(), async |txn, new| {
        invoice_all(txn, &new).await?;
        Err::<(), _>(DbErr::Custom("the invoice service said no".into()))
    })
    .await;
    assert!(matches!(failed, Err(outbox_seaorm::InboxError::Effect(_))), "{t}: {failed:?}");
    assert_eq!((count_inbox(&t, CONSUMER).await, count_table(&t, "invoices").await), (2, 2), "{t}: all rolled back");
    let mut handed = Vec::new();
    let outcomes = outbox_seaorm::handle_batch_once(&t.db, CONSUMER, batch.clone(), async |txn, new| {
        handed = new.iter().map(|r| r.event.order_id.clone()).collect();
        invoice_all(txn, &new).await
    })
    .await
    .unwrap_or_else(|e| panic!("{t}: {e}"));
    let processed: Vec<bool> = outcomes.iter().map(InboxOutcome::is_processed).collect();
    assert_eq!(processed, [false, false, true, true, true, true, false], "{t}");
    assert_eq!(handed, ["o2", "o3", "o4", "o5"], "{t}: the new messages, in order, once each");
    assert_eq!((count_inbox(&t, CONSUMER).await, count_table(&t, "invoices").await), (6, 6), "{t}");
    let again = outbox_seaorm::handle_batch_once(&t.db, CONSUMER, batch.clone(), async |_, _| -> Result<(), DbErr> {
        panic!("the effect of a batch of duplicates ran")
    });
    let again = again.await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(again.iter().all(InboxOutcome::is_duplicate), "{t}: {again:?}");
}

/// A batch bigger than one statement could bind (3 values a row: 21,845 rows on PostgreSQL and MySQL) is
/// recorded whole, 1,000 rows per statement: 25,000 messages, one effect with all of them, 25,000 inbox
/// rows; handed again, every one is a duplicate.
async fn a_batch_larger_than_one_inbox_statement_is_recorded_whole(t: TestDb) {
    create_shop_tables(&t).await;
    let batch: Vec<Received<OrderBilled>> = (0..25_000)
        .map(|i| {
            let event = OrderBilled { order_id: format!("o{i}"), total_minor: 100 };
            let new = event.to_new_event().expect("event");
            let envelope = outbox_seaorm::testkit::outbox_event(&new, i + 1, 1);
            Received { event, envelope, delivery: 1, consumer: CONSUMER.into() }
        })
        .collect();
    let outcomes = outbox_seaorm::handle_batch_once(&t.db, CONSUMER, batch.clone(), async |txn, new| {
        assert_eq!(new.len(), 25_000, "{t}: every message is new");
        invoice_all(txn, &new).await
    });
    let outcomes = outcomes.await.unwrap_or_else(|e| panic!("{t}: {e}"));
    assert!(outcomes.iter().all(InboxOutcome::is_processed), "{t}");
    assert_eq!((count_inbox(&t, CONSUMER).await, count_table(&t, "invoices").await), (25_000, 25_000), "{t}");
    let again = outbox_seaorm::handle_batch_once(&t.db, CONSUMER, batch, async |_, _| -> Result<(), DbErr> {
        panic!("the effect of a batch of duplicates ran")
    });
    assert!(again.await.unwrap_or_else(|e| panic!("{t}: {e}")).iter().all(InboxOutcome::is_duplicate), "{t}");
}

/// A batch handler in groups: 40 orders, 10 of them delivered twice and 10 applied before, each group's
/// invoices written in one statement; every order invoiced and recorded exactly once.
async fn a_batch_handler_in_groups_applies_each_message_once(t: TestDb) {
    create_shop_tables(&t).await;
    let queue = Queue::of(&t, &billed(40)).await;
    for id in queue.ids().iter().skip(3).step_by(4) {
        let before =
            outbox_seaorm::handle_once(&t.db, CONSUMER, id, async |txn| insert_invoice(txn, "earlier", 1).await);
        assert!(before.await.unwrap_or_else(|e| panic!("{t}: applied before: {e}")).is_processed(), "{t}");
    }
    queue.deliver_again(10);
    let calls = std::sync::Arc::new(Mutex::new(Vec::new()));
    let (db, sizes) = (t.db.clone(), calls.clone());
    let consumer = Consumer::new(CONSUMER)
        .with_config(ConsumerConfig::default().with_fetch_wait(Duration::from_millis(50)).with_group_size(32))
        .with_group_commit(SeaOrmGroupCommit::new(t.db.clone()))
        .on_batch::<OrderBilled>(move |batch: Vec<Received<OrderBilled>>| {
            let (db, sizes) = (db.clone(), sizes.clone());
            async move {
                sizes.lock().expect("sizes").push(batch.len());
                outbox_seaorm::handle_batch_once(&db, CONSUMER, batch, async |txn, new| invoice_all(txn, &new).await)
                    .await
            }
        });
    let running = Running::start(consumer, queue);
    eventually(Duration::from_secs(60), &format!("{t}: 50 handled"), async || {
        let stats = running.stats();
        stats.processed + stats.duplicates >= 50
    })
    .await;
    let stats = running.stop().await;
    assert_eq!((stats.processed, stats.duplicates, stats.group_rollbacks), (30, 20, 0), "{t}: {stats:?}");
    assert_eq!(count_table(&t, "invoices").await, 40, "{t}: 10 earlier and 30 now, none twice");
    assert_eq!(count_inbox(&t, CONSUMER).await, 40, "{t}");
    assert!(calls.lock().expect("calls").iter().any(|&n| n > 1), "{t}: several messages per call");
}

/// Decodes of an `order.charged` so far, per run (the part of the order id before its last `:`): what "each
/// message is decoded once" counts. Per run, because the three backends' tests run at once.
static DECODES: Mutex<std::collections::BTreeMap<String, usize>> = Mutex::new(std::collections::BTreeMap::new());

fn counted_decode<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let order_id = String::deserialize(deserializer)?;
    let run = order_id.rsplit_once(':').map_or(order_id.as_str(), |(run, _)| run).to_owned();
    *DECODES.lock().expect("decodes").entry(run).or_default() += 1;
    Ok(order_id)
}

/// An order charged: decoding it counts in [`DECODES`].
#[derive(DomainEvent, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[domain_event(name = "order.charged", version = 1, aggregate = "order")]
struct OrderCharged {
    #[aggregate_id]
    #[serde(deserialize_with = "counted_decode")]
    order_id: String,
    total_minor: i64,
}

/// The handler as an app writes it; the consumer registers it with `.on(charge)`.
#[idempotent_handler]
async fn charge(txn: &sea_orm::DatabaseTransaction, event: OrderCharged) -> Result<(), DbErr> {
    insert_invoice(txn, &event.order_id, event.total_minor).await
}

/// Its batch form, registered with `.on_batch(charge_all)`: one statement for the new events of a batch.
#[idempotent_handler]
async fn charge_all(txn: &sea_orm::DatabaseTransaction, events: Vec<OrderCharged>) -> Result<(), DbErr> {
    let rows: Vec<String> = events.iter().map(|e| format!("('{}', {})", e.order_id, e.total_minor)).collect();
    txn.execute_unprepared(&format!("INSERT INTO invoices (order_id, total_minor) VALUES {}", rows.join(", "))).await?;
    Ok(())
}

/// 20 `order.charged` messages of the run `run`, each delivered twice.
async fn charged_twice(t: &TestDb, run: &str) -> Queue {
    let events: Vec<NewEvent> = (0..20)
        .map(|i| OrderCharged { order_id: format!("{run}:{i}"), total_minor: 100 }.to_new_event().expect("event"))
        .collect();
    let queue = Queue::of(t, &events).await;
    queue.deliver_again(usize::MAX);
    queue
}

/// Handlers registered as they are written (`.on(charge)`, `.on_batch(charge_all)`), the consumer named
/// once: in groups, alone (`group_size` 1) and batched, 20 events delivered twice give 20 invoices, 20
/// inbox rows under the consumer's name, 20 duplicates, and one decode per delivery.
async fn handlers_registered_as_written_apply_each_event_once(t: TestDb) {
    create_shop_tables(&t).await;
    let ways: [(&str, usize, bool); 3] =
        [("charging-grouped", 32, false), ("charging-alone", 1, false), ("charging-batched", 32, true)];
    for (name, group_size, batched) in ways {
        t.db.execute_unprepared("DELETE FROM invoices").await.expect("clear invoices");
        let run = format!("{:?}/{name}", t.backend);
        let queue = charged_twice(&t, &run).await;
        let config = ConsumerConfig::default().with_fetch_wait(Duration::from_millis(50)).with_group_size(group_size);
        let consumer = Consumer::new(name).with_config(config).with_group_commit(SeaOrmGroupCommit::new(t.db.clone()));
        let consumer = if batched { consumer.on_batch(charge_all) } else { consumer.on(charge) };
        let running = Running::start(consumer, queue);
        eventually(Duration::from_secs(60), &format!("{t}: {name}: 40 handled"), async || {
            let stats = running.stats();
            stats.processed + stats.duplicates >= 40
        })
        .await;
        let stats = running.stop().await;
        assert_eq!((stats.processed, stats.duplicates), (20, 20), "{t}: {name}: {stats:?}");
        assert_eq!(count_table(&t, "invoices").await, 20, "{t}: {name}: one invoice per event");
        assert_eq!(count_inbox(&t, name).await, 20, "{t}: {name}: recorded under the consumer's one name");
        let decodes = DECODES.lock().expect("decodes").get(&run).copied().unwrap_or(0);
        assert_eq!(decodes, 40 + 2 * stats.group_rollbacks as usize, "{t}: {name}: one decode per delivery");
    }
}

/// A handler registered on a consumer given no database has nowhere to record its messages: the consumer
/// stops with a configuration error that says what to add, and nothing is applied, acked or
/// dead-lettered (the queue panics on a dead letter).
async fn a_handler_without_a_database_stops_its_consumer_with_what_to_add(t: TestDb) {
    create_shop_tables(&t).await;
    let queue = charged_twice(&t, &format!("{:?}/nowhere", t.backend)).await;
    let config = ConsumerConfig::default().with_fetch_wait(Duration::from_millis(50));
    let consumer = Consumer::new("charging-nowhere").with_config(config).on(charge);
    let run = consumer.run(&queue, outbox_seaorm::CancellationToken::new());
    let error = tokio::time::timeout(Duration::from_secs(120), run).await.expect("the consumer stops").unwrap_err();
    assert!(matches!(error, outbox_seaorm::Error::InvalidConfig { field: "handler", .. }), "{t}: {error}");
    assert!(error.to_string().contains("with_group_commit(SeaOrmGroupCommit::new(db))"), "{t}: {error}");
    assert!(queue.acked.lock().expect("acked").is_empty(), "{t}: nothing acked");
    assert_eq!(consumer.stats().retried, 0, "{t}: not retried: {:?}", consumer.stats());
    assert_eq!(count_table(&t, "invoices").await, 0, "{t}");
    assert_eq!(count_inbox(&t, "charging-nowhere").await, 0, "{t}");
}

outbox_integration_tests::per_backend!(handlers_registered_as_written_apply_each_event_once, "as_written");
outbox_integration_tests::per_backend!(a_handler_without_a_database_stops_its_consumer_with_what_to_add, "no_inbox_db");
outbox_integration_tests::per_backend!(a_batch_effect_runs_once_for_the_new_messages_only, "batch_once");
outbox_integration_tests::per_backend!(a_batch_handler_in_groups_applies_each_message_once, "batch_groups");
outbox_integration_tests::per_backend!(a_batch_larger_than_one_inbox_statement_is_recorded_whole, "batch_large");
outbox_integration_tests::per_backend!(a_failed_effect_is_undone_in_a_group_as_it_is_alone, "group_failed_effect");
outbox_integration_tests::per_backend!(a_message_the_inbox_holds_is_a_duplicate_in_a_group, "group_seen");
outbox_integration_tests::per_backend!(rows_no_handler_claimed_are_not_committed, "group_unclaimed");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_in_groups_postgres() {
    run_on(Backend::Postgres, "group_redelivery_pg", a_redelivery_in_a_group_does_not_roll_it_back).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_in_groups_mysql() {
    run_on(Backend::MySql, "group_redelivery_my", a_redelivery_in_a_group_does_not_roll_it_back).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_commit_together_sqlite() {
    run_on(Backend::Sqlite, "group_commit_sqlite", a_group_commits_its_inbox_rows_and_effects_together).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_commit_together_postgres() {
    run_on(Backend::Postgres, "group_commit_pg", a_group_commits_its_inbox_rows_and_effects_together).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_commit_together_mysql() {
    run_on(Backend::MySql, "group_commit_my", a_group_commits_its_inbox_rows_and_effects_together).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_group_transaction_is_noticed_postgres() {
    run_on(
        Backend::Postgres,
        "group_killed_pg",
        a_transaction_killed_under_a_swallowing_handler_never_acks_lost_effects,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_group_transaction_is_noticed_mysql() {
    run_on(Backend::MySql, "group_killed_my", a_transaction_killed_under_a_swallowing_handler_never_acks_lost_effects)
        .await;
}

//! The brokers of a soak run and its consumers.
//!
//! - Default: the `soak_broker` table. A publish inserts the batch in its own transaction (the broker
//!   has the messages once it commits; a lost ack is a commit whose confirmation never reaches the relay).
//!   Each row carries a lane (a hash of its aggregate); one consumer task per lane reads its rows in
//!   insertion order and, in one transaction, records the deliveries, applies each event through the inbox
//!   and marks the rows consumed. An aggregate's next event is inserted only after the previous one's
//!   insert committed (the relay waits for the confirmation), so insertion order per aggregate is publish
//!   order.
//! - `--broker URL`: the adapter of that broker publishes, and the consume driver (lanes per aggregate)
//!   consumes with `--consumers` as its concurrency; each delivery is recorded before the handler runs.

use outbox_seaorm::brokers::kafka::{KafkaTransport, Subscription};
use outbox_seaorm::brokers::nats::NatsTransport;
use outbox_seaorm::brokers::rabbitmq::{DEFAULT_DEAD_LETTER_SUFFIX, RabbitTransport};
use outbox_seaorm::brokers::redis::RedisTransport;
use outbox_seaorm::brokers::{AnyPublisher, BrokerKind};
use outbox_seaorm::{
    BoxError, CancellationToken, Consumer, ConsumerConfig, Destination, InboxOutcome, OutboxEvent, PublishError,
    Publisher, Received, SeaOrmGroupCommit,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait, Value};

use crate::SoakError;
use crate::db::{placeholders, statement};
use crate::writer::SoakEvent;

/// The inbox consumer name of every soak consumer.
pub const CONSUMER: &str = "soak";

/// The lane of an aggregate: FNV-1a of its id, modulo the consumers.
pub fn lane(aggregate_id: &str, consumers: u32) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in aggregate_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    i32::try_from(hash % u64::from(consumers.max(1))).unwrap_or(0)
}

/// The `soak_broker` table as a broker.
#[derive(Clone)]
pub struct TableBroker {
    db: DatabaseConnection,
    consumers: u32,
}

impl TableBroker {
    /// A broker in `db`'s `soak_broker` table, with rows spread over `consumers` lanes.
    pub fn new(db: DatabaseConnection, consumers: u32) -> Self {
        TableBroker { db, consumers }
    }
}

impl Publisher for TableBroker {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        if events.is_empty() {
            return Vec::new();
        }
        let mut values: Vec<Value> = Vec::with_capacity(events.len() * 4);
        for event in events {
            values.push(event.id.to_string().into());
            values.push(event.aggregate_id.clone().into());
            values.push(event.aggregate_version.into());
            values.push(lane(&event.aggregate_id, self.consumers).into());
        }
        let sql = format!(
            "INSERT INTO soak_broker (event_id, aggregate_id, aggregate_version, lane) VALUES {}",
            placeholders(events.len(), 4)
        );
        match self.db.execute_raw(statement(self.db.get_database_backend(), &sql, values)).await {
            Ok(_) => vec![Ok(()); events.len()],
            Err(e) => vec![Err(PublishError::transient(format!("soak_broker insert: {e}"))); events.len()],
        }
    }
}

/// The run's stream, subject, queue or topic names.
pub struct Names {
    /// NATS stream, Redis stream key, RabbitMQ queue and exchange, Kafka topic.
    pub name: String,
}

impl Names {
    /// The names of run `run_id`.
    pub fn of(run_id: &str) -> Self {
        Names { name: format!("soak_{run_id}") }
    }

    fn nats_subjects(&self) -> String {
        format!("{}.>", self.name)
    }
}

/// Connects the publisher of `url` for run `run_id`; `setup` also creates the stream, exchange or queue.
pub async fn connect_publisher(url: &str, run_id: &str, setup: bool) -> Result<AnyPublisher, SoakError> {
    let names = Names::of(run_id);
    let destination = match BrokerKind::from_url(url)? {
        BrokerKind::Nats => format!("{}.{{event_type}}", names.name),
        BrokerKind::RabbitMq => "soak.{event_type}".to_owned(),
        BrokerKind::Kafka | BrokerKind::Redis => names.name.clone(),
    };
    let publisher = AnyPublisher::connect_to_exchange(url, &names.name, Destination::parse(&destination)?).await?;
    match &publisher {
        AnyPublisher::Nats(publisher) if setup => {
            publisher.ensure_stream(&names.name, &[&names.nats_subjects()]).await?;
        }
        AnyPublisher::Rabbit(publisher) if setup => {
            publisher.declare_exchange(&names.name).await?;
            publisher.declare_queue(&names.name, &names.name, "soak.#").await?;
        }
        AnyPublisher::Redis(_) if setup => create_redis_stream(url, &names.name).await?,
        _ => {}
    }
    Ok(publisher)
}

/// Removes the run's NATS stream or RabbitMQ exchange and queues. A Redis stream key (`soak_<run>`, and
/// `soak_<run>:dead`) and a Kafka topic stay: their adapters have no delete.
pub async fn remove_topology(url: &str, run_id: &str) -> Result<(), SoakError> {
    let names = Names::of(run_id);
    match connect_publisher(url, run_id, false).await? {
        AnyPublisher::Nats(publisher) => {
            publisher
                .jetstream()
                .delete_stream(&names.name)
                .await
                .map_err(|e| SoakError::Usage(format!("delete NATS stream {}: {e}", names.name)))?;
        }
        AnyPublisher::Rabbit(publisher) => {
            publisher.delete_queue(&names.name).await?;
            publisher.delete_queue(&format!("{}{DEFAULT_DEAD_LETTER_SUFFIX}", names.name)).await?;
            publisher.delete_exchange(&names.name).await?;
        }
        _ => {}
    }
    Ok(())
}

/// The handler: one `soak_applied` row per event, at most once per event id (the inbox).
async fn apply<C>(db: &C, event_id: &str, aggregate_id: &str, version: i64) -> Result<bool, BoxError>
where
    C: outbox_seaorm::OutboxConnection,
{
    let outcome = outbox_seaorm::handle_once(db, CONSUMER, event_id, async |txn| {
        let insert = statement(
            txn.get_database_backend(),
            "INSERT INTO soak_applied (event_id, aggregate_id, aggregate_version) VALUES (?, ?, ?)",
            vec![event_id.into(), aggregate_id.into(), version.into()],
        );
        txn.execute_raw(insert).await.map(|_| ())
    })
    .await?;
    Ok(matches!(outcome, InboxOutcome::Processed(())))
}

/// The batch handler: one `soak_applied` row per new event of `batch`, in one statement, at most once per
/// event id (the inbox); the lag of each new one recorded.
async fn apply_all(
    db: &DatabaseConnection,
    batch: Vec<Received<SoakEvent>>,
    lags: &Lags,
) -> Result<Vec<InboxOutcome<()>>, BoxError> {
    let mut applied = Vec::new();
    let outcomes = outbox_seaorm::handle_batch_once(db, CONSUMER, batch, async |txn, new| {
        let mut values: Vec<Value> = Vec::with_capacity(new.len() * 3);
        for received in &new {
            let envelope = &received.envelope;
            let row: [Value; 3] = [
                envelope.id.to_string().into(),
                envelope.aggregate_id.clone().into(),
                envelope.aggregate_version.into(),
            ];
            values.extend(row);
        }
        let sql = format!(
            "INSERT INTO soak_applied (event_id, aggregate_id, aggregate_version) VALUES {}",
            placeholders(new.len(), 3)
        );
        txn.execute_raw(statement(txn.get_database_backend(), &sql, values)).await?;
        applied = new.iter().map(|received| lag_ms(&received.envelope)).collect();
        Ok::<_, sea_orm::DbErr>(())
    })
    .await?;
    lags.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(applied);
    Ok(outcomes)
}

/// Milliseconds from the event's enqueue to now.
fn lag_ms(envelope: &outbox_seaorm::OutboxEvent) -> i64 {
    (chrono::Utc::now() - envelope.created_at).num_milliseconds()
}

/// One consumer of the table broker: lane `lane`'s rows in insertion order until `stop`.
pub async fn consume_table(db: DatabaseConnection, lane: i32, stop: CancellationToken) -> Result<(), SoakError> {
    let backend = db.get_database_backend();
    let select = statement(
        backend,
        "SELECT id, event_id, aggregate_id, aggregate_version FROM soak_broker WHERE lane = ? AND consumed = 0 ORDER BY id LIMIT 200",
        vec![lane.into()],
    );
    let mut failures = 0u32;
    while !stop.is_cancelled() {
        let rows = match db.query_all_raw(select.clone()).await {
            Ok(rows) => rows,
            Err(e) => {
                failures += 1;
                tracing::warn!(lane, error = %e, "soak consumer: read failed; retrying");
                if failures > 50 {
                    return Err(SoakError::Db { context: format!("consumer {lane}: read soak_broker"), source: e });
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        if rows.is_empty() {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            }
            continue;
        }
        let mut batch = Vec::with_capacity(rows.len());
        for row in rows {
            let read = |e| SoakError::Db { context: "read a soak_broker row".into(), source: e };
            let id: i64 = row.try_get_by_index(0).map_err(read)?;
            let event_id: String = row.try_get_by_index(1).map_err(read)?;
            let aggregate_id: String = row.try_get_by_index(2).map_err(read)?;
            let version: i64 = row.try_get_by_index(3).map_err(read)?;
            batch.push((id, event_id, aggregate_id, version));
        }
        match consume_batch(&db, &batch).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                tracing::warn!(lane, error = %e, "soak consumer: batch rolled back; retrying");
                if failures > 50 {
                    return Err(SoakError::Usage(format!(
                        "consumer {lane}: 50 batches in a row failed, the last: {e}"
                    )));
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    Ok(())
}

/// Deliveries, effects and the consumed marks of one batch, in one transaction.
async fn consume_batch(db: &DatabaseConnection, batch: &[(i64, String, String, i64)]) -> Result<(), BoxError> {
    let txn = db.begin().await?;
    let backend = txn.get_database_backend();
    let deliveries: Vec<Value> = batch.iter().map(|(_, event_id, ..)| event_id.clone().into()).collect();
    let sql = format!("INSERT INTO soak_deliveries (event_id) VALUES {}", placeholders(deliveries.len(), 1));
    txn.execute_raw(statement(backend, &sql, deliveries)).await?;
    for (_, event_id, aggregate_id, version) in batch {
        apply(&txn, event_id, aggregate_id, *version).await?;
    }
    let ids: Vec<Value> = batch.iter().map(|(id, ..)| (*id).into()).collect();
    let sql = format!("UPDATE soak_broker SET consumed = 1 WHERE id IN ({})", vec!["?"; ids.len()].join(", "));
    txn.execute_raw(statement(txn.get_database_backend(), &sql, ids)).await?;
    txn.commit().await?;
    Ok(())
}

/// Consumer lag of each event applied for the first time: milliseconds from its enqueue to the end of its
/// handler (its group's commit follows within milliseconds).
pub type Lags = std::sync::Arc<std::sync::Mutex<Vec<i64>>>;

/// The consumer of a real broker: the consume driver, `consumers` lanes, until `stop`.
pub async fn consume_broker(
    db: DatabaseConnection,
    url: &str,
    run_id: &str,
    (consumers, group_size, batch_handler): (u32, usize, bool),
    lags: Lags,
    stop: CancellationToken,
) -> Result<(), SoakError> {
    let names = Names::of(run_id);
    // On SQLite a group holds the write lock, which the handler's delivery record (on another connection)
    // would wait for: one message per transaction there.
    let group_size = if db.get_database_backend() == sea_orm::DbBackend::Sqlite { 1 } else { group_size };
    let config = ConsumerConfig::default().with_concurrency(consumers.max(1) as usize).with_group_size(group_size);
    let group = SeaOrmGroupCommit::new(db.clone());
    // Every delivery is recorded, rolled back or not, outside the handler's transaction: kept in memory
    // and written every 100 ms in one statement, so that the record costs the consumer no commit of its
    // own per message (an autocommit insert per delivery capped the consumer at about 1.5k/s).
    let deliveries = Deliveries::default();
    let consumer_done = CancellationToken::new();
    let flusher = tokio::spawn(flush_deliveries(db.clone(), deliveries.clone(), consumer_done.clone()));
    let recorded = deliveries.clone();
    let consumer = Consumer::new(CONSUMER).with_config(config).with_group_commit(group);
    let consumer = if batch_handler {
        consumer.on_batch::<SoakEvent>(move |batch: Vec<Received<SoakEvent>>| {
            let (db, lags, recorded) = (db.clone(), lags.clone(), recorded.clone());
            async move {
                let ids = batch.iter().map(|received| received.envelope.id.to_string());
                recorded.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(ids);
                apply_all(&db, batch, &lags).await
            }
        })
    } else {
        consumer.on::<SoakEvent>(move |received: Received<SoakEvent>| {
            let (db, lags, recorded) = (db.clone(), lags.clone(), recorded.clone());
            async move {
                let envelope = &received.envelope;
                let event_id = envelope.id.to_string();
                recorded.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(event_id.clone());
                let first = apply(&db, &event_id, &envelope.aggregate_id, envelope.aggregate_version).await?;
                if first {
                    lags.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(lag_ms(envelope));
                }
                Ok::<_, BoxError>(())
            }
        })
    };
    match BrokerKind::from_url(url)? {
        BrokerKind::Nats => {
            let transport = NatsTransport::connect(url, &names.name, CONSUMER, None).await?;
            consumer.run(&transport, stop).await?;
        }
        BrokerKind::Kafka => {
            let transport =
                KafkaTransport::connect(url, &names.name, Subscription::Topics(vec![names.name.clone()]), &[])?;
            consumer.run(&transport, stop).await?;
        }
        BrokerKind::RabbitMq => {
            let transport = RabbitTransport::connect(url, &names.name, CONSUMER).await?;
            consumer.run(&transport, stop).await?;
        }
        BrokerKind::Redis => {
            let transport = RedisTransport::connect(url, &names.name, CONSUMER, "soak-1").await?;
            consumer.run(&transport, stop).await?;
        }
    }
    let stats = consumer.stats();
    if stats.groups > 0 {
        let applied = stats.processed + stats.duplicates;
        eprintln!(
            "soak: consumer: {applied} messages in {} group commits ({:.1} per commit)",
            stats.groups,
            applied as f64 / stats.groups as f64
        );
    }
    // The flusher writes what is left once the consumer stopped.
    consumer_done.cancel();
    flusher.await.map_err(|e| SoakError::Usage(format!("the delivery recorder panicked: {e}")))??;
    Ok(())
}

/// Deliveries seen by the consumer and not yet written to `soak_deliveries`.
type Deliveries = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Writes the recorded deliveries every 100 ms, in statements of up to 1,000 rows, until `done` (the
/// consumer returned); then once more.
async fn flush_deliveries(
    db: DatabaseConnection,
    deliveries: Deliveries,
    done: CancellationToken,
) -> Result<(), SoakError> {
    loop {
        let stopping = tokio::select! {
            () = done.cancelled() => true,
            () = tokio::time::sleep(std::time::Duration::from_millis(100)) => false,
        };
        let batch = std::mem::take(&mut *deliveries.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for chunk in batch.chunks(1000) {
            let values: Vec<Value> = chunk.iter().map(|id| id.clone().into()).collect();
            let sql = format!("INSERT INTO soak_deliveries (event_id) VALUES {}", placeholders(values.len(), 1));
            db.execute_raw(statement(db.get_database_backend(), &sql, values))
                .await
                .map_err(SoakError::db("record deliveries"))?;
        }
        if stopping {
            return Ok(());
        }
    }
}

/// Creates the run's Redis stream, empty, before any relay publishes (the publisher appends only to
/// streams that exist; the consumers' groups read it from its start).
async fn create_redis_stream(url: &str, stream: &str) -> Result<(), SoakError> {
    use outbox_seaorm::brokers::redis::redis::{self, AsyncCommands};
    let redis_error = |e: redis::RedisError| SoakError::Setup(format!("create the Redis stream {stream}: {e}"));
    let mut connection =
        redis::Client::open(url).map_err(redis_error)?.get_multiplexed_async_connection().await.map_err(redis_error)?;
    let created: redis::RedisResult<()> = connection.xgroup_create_mkstream(stream, "soak-setup", "0").await;
    match created {
        Ok(()) => {}
        Err(e) if e.code() == Some("BUSYGROUP") => {}
        Err(e) => return Err(redis_error(e)),
    }
    let _: () = connection.xgroup_destroy(stream, "soak-setup").await.map_err(redis_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aggregate_always_gets_the_same_lane_and_lanes_spread() {
        assert_eq!(lane("agg-7", 4), lane("agg-7", 4));
        let lanes: std::collections::HashSet<i32> = (0..100).map(|i| lane(&format!("agg-{i}"), 4)).collect();
        assert_eq!(lanes.len(), 4);
        assert_eq!(lane("agg-7", 1), 0);
    }
}

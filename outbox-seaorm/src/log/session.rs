//! One replication connection's life: read the log a window at a time, publish each window in commit
//! order, record it in the table (one write at a time, the windows read meanwhile merged into the next),
//! confirm transaction ends; free the aggregates held behind a dead event once it is replayed or
//! discarded.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use outbox_runtime::CancellationToken;
use tokio::task::JoinHandle;

use outbox_runtime::{OutboxEvent, Publisher};

use super::pgoutput::{self, Change, OutboxColumns, RowKey};
use super::relay::{Held, LogPass, Progress};
use super::stream::{LogMessage, ReplicationStream};
use super::table::{self, Aggregate, Backlog, Outcome};
use super::{LogError, LogRelay};

/// An inserted outbox row as the log delivered it.
enum Row {
    Event(OutboxEvent),
    Undecodable { key: RowKey, why: String },
}

impl Row {
    fn aggregate(&self) -> Aggregate {
        match self {
            Row::Event(e) => (e.aggregate_type.clone(), e.aggregate_id.clone()),
            Row::Undecodable { key, .. } => (key.aggregate_type.clone(), key.aggregate_id.clone()),
        }
    }

    fn version(&self) -> i64 {
        match self {
            Row::Event(e) => e.aggregate_version,
            Row::Undecodable { key, .. } => key.aggregate_version,
        }
    }

    fn seq(&self) -> i64 {
        match self {
            Row::Event(e) => e.seq,
            Row::Undecodable { key, .. } => key.seq,
        }
    }
}

/// The windows' records in the table: one being written, and those since merged into the next one, each
/// with the log position to confirm once it is written (and every earlier one). Merging keeps the
/// writes few and large whatever the size of the windows (a busy stream of small transactions made one
/// small write each).
#[derive(Default)]
struct Records {
    writing: Option<(RecordTask, Option<u64>)>,
    next: Option<(Outcome, Option<u64>)>,
}

impl Records {
    fn is_empty(&self) -> bool {
        self.writing.is_none() && self.next.is_none()
    }

    /// Adds a window's outcome (possibly empty) and the position to confirm after it.
    fn queue(&mut self, outcome: Outcome, confirm: Option<u64>) {
        match &mut self.next {
            Some((next, at)) => {
                next.merge(outcome);
                if confirm.is_some() {
                    *at = confirm;
                }
            }
            None => self.next = Some((outcome, confirm)),
        }
    }

    /// Rows waiting for the next write.
    fn queued_rows(&self) -> usize {
        self.next.as_ref().map_or(0, |(outcome, _)| outcome.rows())
    }
}

/// A record being written.
type RecordTask = JoinHandle<Result<(), LogError>>;

/// Most rows merged into the next write (in windows) before the stream waits for the write in flight.
const QUEUED_WINDOWS: usize = 2;

/// The state of one replication connection.
pub(super) struct Session<'a, P> {
    relay: &'a LogRelay<P>,
    shutdown: &'a CancellationToken,
    held: &'a mut Held,
    /// The columns of each relation the stream named; `None` for tables other than the outbox.
    relations: HashMap<u32, Option<OutboxColumns>>,
    /// Rows read and not yet published.
    window: Vec<Row>,
    in_transaction: bool,
    /// The transaction being read.
    xid: u32,
    /// The transactions of the rows in the window.
    window_xids: HashSet<u32>,
    /// The end of the last transaction that ended inside the window.
    window_confirm: Option<u64>,
    records: Records,
    confirmed: u64,
    progress: &'a Progress,
}

impl<'a, P: Publisher> Session<'a, P> {
    /// A session of `relay` that has just started to read the log.
    pub(super) fn new(
        relay: &'a LogRelay<P>,
        shutdown: &'a CancellationToken,
        held: &'a mut Held,
        progress: &'a Progress,
    ) -> Self {
        Session {
            relay,
            shutdown,
            held,
            relations: HashMap::new(),
            window: Vec::new(),
            in_transaction: false,
            xid: 0,
            window_xids: HashSet::new(),
            window_confirm: None,
            records: Records::default(),
            confirmed: 0,
            progress,
        }
    }

    /// Reads the log until `shutdown` or the end of the stream.
    pub(super) async fn read<S: ReplicationStream>(&mut self, stream: &mut S) -> Result<(), LogError> {
        let parked_check = self.relay.config.parked_check;
        let idle_beat = self.relay.config.status_interval;
        loop {
            let backlog = self.records.queued_rows() >= QUEUED_WINDOWS * self.relay.config.window;
            self.settle(stream, backlog).await?;
            let message = if self.window.is_empty() {
                let check_parked = !self.held.parked.is_empty();
                tokio::select! {
                    biased;
                    () = self.shutdown.cancelled() => return Ok(()),
                    message = stream.next() => message?,
                    () = tokio::time::sleep(parked_check), if check_parked => {
                        self.settle(stream, true).await?;
                        self.sweep_parked().await?;
                        self.progress.passed(&LogPass::default());
                        continue;
                    }
                    // Connected and idle: a pass that found nothing, for the service's readiness.
                    () = tokio::time::sleep(idle_beat) => {
                        self.progress.passed(&LogPass::default());
                        continue;
                    }
                }
            } else {
                match stream.try_next().await? {
                    Some(message) => Some(message),
                    None => {
                        if !self.flush(stream).await? {
                            return Ok(());
                        }
                        continue;
                    }
                }
            };
            let Some(message) = message else {
                return Err(LogError::replication("the server ended the replication stream"));
            };
            match message {
                LogMessage::Begin { xid } => {
                    self.in_transaction = true;
                    self.xid = xid;
                }
                LogMessage::Change(bytes) => {
                    if self.change(&bytes)?
                        && self.window.len() >= self.relay.config.window
                        && !self.flush(stream).await?
                    {
                        return Ok(());
                    }
                }
                LogMessage::Commit { end_lsn } => {
                    self.in_transaction = false;
                    if !self.window.is_empty() {
                        self.window_confirm = Some(end_lsn);
                    } else if self.records.is_empty() {
                        self.confirm(stream, end_lsn);
                    } else {
                        self.records.queue(Outcome::default(), Some(end_lsn));
                    }
                }
                LogMessage::KeepAlive { wal_end } => {
                    // Nothing read is unfinished: everything before `wal_end` is done (an idle outbox
                    // beside a busy database frees the WAL the others write).
                    if !self.in_transaction && self.window.is_empty() && self.records.is_empty() {
                        self.confirm(stream, wal_end);
                        self.progress.passed(&LogPass::default());
                    }
                }
            }
        }
    }

    /// Takes in one `pgoutput` message; `true` when it added a row to the window.
    fn change(&mut self, bytes: &[u8]) -> Result<bool, LogError> {
        match pgoutput::decode(bytes).map_err(LogError::replication)? {
            Change::Relation(relation) => {
                let columns = if relation.name == "outbox_events" {
                    Some(OutboxColumns::of(&relation).map_err(LogError::Replication)?)
                } else {
                    None
                };
                self.relations.insert(relation.id, columns);
                Ok(false)
            }
            Change::Insert { relation, values } => match self.relations.get(&relation) {
                Some(Some(columns)) => {
                    let row = match columns.event(&values) {
                        Ok(event) => Row::Event(event),
                        Err(why) => match columns.key(&values) {
                            Some(key) => Row::Undecodable { key, why },
                            None => return Err(LogError::Replication(format!("an outbox row without its key: {why}"))),
                        },
                    };
                    self.window.push(row);
                    self.window_xids.insert(self.xid);
                    Ok(true)
                }
                Some(None) => Ok(false),
                None => {
                    Err(LogError::Replication(format!("an insert into relation {relation} before its description")))
                }
            },
            Change::Other => Ok(false),
        }
    }

    /// Publishes the window and starts writing its record; `false` when `shutdown` stopped it before every
    /// event was settled (what was confirmed is still recorded; nothing more is confirmed to the server).
    async fn flush<S: ReplicationStream>(&mut self, stream: &S) -> Result<bool, LogError> {
        let mut rows: VecDeque<Row> = std::mem::take(&mut self.window).into();
        let confirm = self.window_confirm.take();
        let mut outcome =
            Outcome { xids: std::mem::take(&mut self.window_xids).into_iter().collect(), ..Outcome::default() };
        let mut settled = true;
        while !rows.is_empty() {
            let segment = self.segment(&mut rows, &mut outcome);
            if !segment.is_empty() && !self.publish_segment(segment, &mut outcome).await {
                settled = false;
                break;
            }
        }
        let pass = LogPass {
            published: outcome.published.len() as u64,
            dead: outcome.dead.len() as u64,
            waiting: outcome.waiting.len() as u64,
        };
        tracing::debug!(?pass, settled, "log window published");
        outbox_runtime::metrics::relay_pass(&pass.as_relay_pass());
        self.progress.passed(&pass);
        let confirm = confirm.filter(|_| settled);
        if outcome.is_empty() && self.records.is_empty() {
            if let Some(lsn) = confirm {
                self.confirm(stream, lsn);
            }
        } else {
            self.records.queue(outcome, confirm);
            if self.records.writing.is_none() {
                self.settle(stream, false).await?;
            }
        }
        Ok(settled)
    }

    /// Takes from the front of `rows` the longest run, in commit order, with at most one event per
    /// aggregate: one publish call. Rows of a held-back aggregate wait, an undecodable row is dead (and
    /// holds its aggregate back), rows the parked sweep already published are skipped.
    fn segment(&mut self, rows: &mut VecDeque<Row>, outcome: &mut Outcome) -> Vec<OutboxEvent> {
        let mut segment = Vec::new();
        let mut in_segment: HashSet<Aggregate> = HashSet::new();
        while let Some(row) = rows.front() {
            let aggregate = row.aggregate();
            if in_segment.contains(&aggregate) {
                break;
            }
            let Some(row) = rows.pop_front() else { break };
            if self.held.swept.get(&aggregate).is_some_and(|&swept| row.version() <= swept) {
                continue;
            }
            if let Some(dead) = self.held.parked.get(&aggregate) {
                outcome.waiting.push((row.seq(), dead.clone()));
                continue;
            }
            match row {
                Row::Undecodable { key, why } => {
                    tracing::error!(seq = key.seq, aggregate_type = %key.aggregate_type, aggregate_id = %key.aggregate_id, %why, "an outbox row cannot be decoded; it is marked dead");
                    self.held.parked.insert(aggregate, format!("seq {}", key.seq));
                    outcome.dead.push((key.seq, why));
                }
                Row::Event(event) => {
                    in_segment.insert(aggregate);
                    segment.push(event);
                }
            }
        }
        segment
    }

    /// Publishes `segment` (events of distinct aggregates, in commit order) until each is confirmed or
    /// dead. A refused event is dead and holds its aggregate back; a transient failure is retried after a
    /// backoff, and counts towards `max_attempts` only when the broker took other events of the same call
    /// (an outage kills nothing). `false` when `shutdown` came first.
    async fn publish_segment(&mut self, segment: Vec<OutboxEvent>, outcome: &mut Outcome) -> bool {
        let config = &self.relay.config.relay;
        let mut pending = segment;
        let mut outage: i32 = 0;
        loop {
            let results = self.relay.publish(&pending).await;
            let confirmed_at = Utc::now();
            let any_confirmed = results.iter().any(Result::is_ok);
            let mut retry = Vec::new();
            for (mut event, result) in pending.into_iter().zip(results) {
                let dead = match result {
                    Ok(()) => {
                        outbox_runtime::metrics::publish_latency(&event, confirmed_at);
                        outcome.published.push(event.seq);
                        None
                    }
                    Err(error) if error.is_permanent() => {
                        Some(format!("the publish failed permanently: {}", error.message()))
                    }
                    Err(error) => {
                        if any_confirmed {
                            event.attempts = event.attempts.saturating_add(1);
                        }
                        if event.attempts >= config.max_attempts {
                            Some(format!(
                                "the publish failed {} times, reaching max_attempts: {}",
                                event.attempts,
                                error.message()
                            ))
                        } else {
                            tracing::debug!(event_id = %event.id, %error, "publish failed; retried after backoff");
                            retry.push(event);
                            continue;
                        }
                    }
                };
                if let Some(why) = dead {
                    tracing::warn!(event_id = %event.id, %why, "outbox event is dead; its aggregate's later events wait for a replay or discard");
                    outcome.dead.push((event.seq, why));
                    self.held
                        .parked
                        .insert((event.aggregate_type.clone(), event.aggregate_id.clone()), event.id.to_string());
                }
            }
            if retry.is_empty() {
                return true;
            }
            pending = retry;
            outage = if any_confirmed { 1 } else { outage.saturating_add(1) };
            let delay = config.backoff.delay(outage).min(Duration::from_secs(30));
            tokio::select! {
                () = self.shutdown.cancelled() => return false,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Frees the aggregates whose dead event was replayed or discarded: publishes their waiting rows in
    /// order (one at a time, recorded at once: this is the rare path), and forgets an aggregate once
    /// nothing of it is unpublished.
    async fn sweep_parked(&mut self) -> Result<(), LogError> {
        let db = &self.relay.db;
        let aggregates: Vec<Aggregate> = self.held.parked.keys().cloned().collect();
        for aggregate in aggregates {
            let rows = match table::backlog(db, &aggregate, 1000).await? {
                Backlog::DeadHead => continue,
                Backlog::Rows(rows) => rows,
            };
            if rows.is_empty() {
                tracing::info!(aggregate_type = %aggregate.0, aggregate_id = %aggregate.1, "aggregate no longer waits behind a dead event");
                self.held.parked.remove(&aggregate);
                continue;
            }
            for row in rows {
                let mut outcome = Outcome::default();
                let event = match row {
                    Ok(event) => event,
                    Err((seq, why)) => {
                        outcome.dead.push((seq, why));
                        table::record(db, &outcome, Utc::now().timestamp_millis(), self.relay.config.delete_published)
                            .await?;
                        break;
                    }
                };
                let result = self.relay.publish(std::slice::from_ref(&event)).await.pop();
                match result {
                    Some(Ok(())) => outcome.published.push(event.seq),
                    Some(Err(error)) if error.is_permanent() => {
                        outcome.dead.push((event.seq, format!("the publish failed permanently: {}", error.message())));
                    }
                    _ => break,
                }
                table::record(db, &outcome, Utc::now().timestamp_millis(), self.relay.config.delete_published).await?;
                if !outcome.dead.is_empty() {
                    self.held.parked.insert(aggregate.clone(), event.id.to_string());
                    break;
                }
                self.held.swept.insert(aggregate.clone(), event.aggregate_version);
            }
        }
        Ok(())
    }

    /// Confirms the position of the write in flight once it finished and starts the next one (the
    /// windows merged since); with `wait`, waits until every record is written.
    pub(super) async fn settle<S: ReplicationStream>(&mut self, stream: &S, wait: bool) -> Result<(), LogError> {
        loop {
            if let Some((write, _)) = &self.records.writing
                && !wait
                && !write.is_finished()
            {
                return Ok(());
            }
            if let Some((write, confirm)) = self.records.writing.take() {
                write.await.map_err(|e| LogError::replication(format!("the record task failed: {e}")))??;
                if let Some(lsn) = confirm {
                    self.confirm(stream, lsn);
                }
            }
            match self.records.next.take() {
                None => return Ok(()),
                Some((outcome, confirm)) if outcome.is_empty() => {
                    if let Some(lsn) = confirm {
                        self.confirm(stream, lsn);
                    }
                }
                Some((outcome, confirm)) => {
                    let db = self.relay.db.clone();
                    let shutdown = self.shutdown.clone();
                    let backoff = self.relay.config.relay.backoff;
                    let delete = self.relay.config.delete_published;
                    let write =
                        tokio::spawn(
                            async move { record_until_done(&db, &outcome, delete, &backoff, &shutdown).await },
                        );
                    self.records.writing = Some((write, confirm));
                    if !wait {
                        return Ok(());
                    }
                }
            }
        }
    }

    fn confirm<S: ReplicationStream>(&mut self, stream: &S, lsn: u64) {
        if lsn > self.confirmed {
            self.confirmed = lsn;
            stream.confirm(lsn);
            self.progress.last_confirm.store(Utc::now().timestamp_millis(), Ordering::Relaxed);
        }
    }
}

/// Writes `outcome`, retrying while the database fails, until it is written or `shutdown`.
async fn record_until_done(
    db: &sea_orm::DatabaseConnection,
    outcome: &Outcome,
    delete: bool,
    backoff: &outbox_runtime::Backoff,
    shutdown: &CancellationToken,
) -> Result<(), LogError> {
    let mut failures: i32 = 0;
    loop {
        match table::record(db, outcome, Utc::now().timestamp_millis(), delete).await {
            Ok(()) => return Ok(()),
            Err(error) => {
                failures = failures.saturating_add(1);
                let delay = backoff.delay(failures).min(Duration::from_secs(30));
                tracing::warn!(%error, retry_in = ?delay, "recording published events failed; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => return Err(error),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

//! Writing events: `enqueue` joins whatever transaction the caller holds.
//!
//! Each write first upserts the `outbox_aggregates` row of every aggregate it touches, which hands out the
//! next gapless `aggregate_version`s and keeps that row locked until the caller commits. Two transactions
//! writing one aggregate therefore commit in version order, and the relay publishes in version order: the
//! first deliveries of an aggregate follow the order in which its events committed, whoever wrote them.
//! The locks are taken in byte order of `(aggregate_type, aggregate_id)` within one call, on every
//! database (PostgreSQL's `COLLATE "C"`), the order docs/foreign-writers.md asks plain-SQL writers of many
//! rows to keep; a transaction that enqueues into several aggregates in several calls should call them in
//! that order too (or emit them together), or it can deadlock with another writer and be rolled back.

use std::collections::BTreeMap;

use chrono::Utc;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, TransactionSession, TransactionTrait};

use outbox_runtime::{EventId, NewEvent};

use crate::error::{Result, store_error};
use crate::sql::{KeyedSelect, Sql};

/// Inserts `event` into the outbox through `conn`.
///
/// Pass the transaction that holds your business change: the event then commits or rolls back with it.
/// Passing a plain connection writes the event on its own, which is only right when there is no business
/// change to go with it.
///
/// ## Waking the relay
/// Afterwards the relays of this process are woken ([`wake_relays`](outbox_runtime::wake_relays)). Through a
/// plain connection the row is committed by then, and an idle relay publishes it at once. Inside your
/// transaction the row is not committed yet, so that signal comes early (the relay finds nothing and goes
/// back to its poll): call [`wake_relays`](crate::wake_relays) after your `commit()` for the same immediacy.
/// `#[transactional_outbox]` does that for you. Either way the relay's poll still finds every row.
pub async fn enqueue<C: ConnectionTrait + TransactionTrait>(conn: &C, event: &NewEvent) -> Result<EventId> {
    enqueue_all(conn, std::slice::from_ref(event)).await?;
    Ok(event.id())
}

/// Most events per round of statements: each event binds 9 values, and every backend caps the values one
/// statement may bind (SQLite 32766, PostgreSQL and MySQL 65535), so a large `events` slice is split.
const EVENTS_PER_CHUNK: usize = 1000;

/// Inserts `events`, in order (and wakes the relays as [`enqueue`] does): per 1000 events, one statement on PostgreSQL, three on MySQL and SQLite (in a
/// savepoint of the caller's transaction, or a transaction of their own).
///
/// Chunks are written one after the other, so the extra memory is one chunk's statement whatever the
/// slice's length. Pass a transaction to make them all-or-nothing.
pub async fn enqueue_all<C: ConnectionTrait + TransactionTrait>(conn: &C, events: &[NewEvent]) -> Result<Vec<EventId>> {
    let backend = conn.get_database_backend();
    let now_ms = Utc::now().timestamp_millis();
    // With the `opentelemetry` feature: the caller's trace context, for events that carry none.
    let trace = outbox_runtime::trace_context::current();
    for chunk in events.chunks(EVENTS_PER_CHUNK) {
        let rows = Rows::of(chunk, trace.as_deref())?;
        let written = match backend {
            DbBackend::Postgres => write_postgres(conn, &rows, now_ms).await,
            // Three statements: they must hold the aggregates' rows together (the versions read back are only
            // ours while the upsert's locks last), so they run in a transaction, or a savepoint of the caller's.
            _ => match conn.begin().await {
                Ok(txn) => match write_portable(&txn, &rows, now_ms).await {
                    Ok(()) => txn.commit().await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
        };
        written.map_err(|e| store_error(enqueue_operation(backend, &e), "outbox_events", backend, e))?;
    }
    if !events.is_empty() {
        // Best effort inside a caller's transaction (see `enqueue`): exact through a plain connection.
        outbox_runtime::wake_relays();
    }
    Ok(events.iter().map(NewEvent::id).collect())
}

/// What failed, for the error: on SQLite a refused write lock says which transactions it happens to.
fn enqueue_operation(backend: DbBackend, error: &DbErr) -> &'static str {
    let busy = error.to_string().contains("database is locked");
    if backend == DbBackend::Sqlite && busy {
        "enqueue events (SQLite refused the write lock: the transaction read before it wrote while another \
         connection wrote, or waited longer than the busy timeout; begin it IMMEDIATE or use \
         outbox_seaorm::transaction)"
    } else {
        "enqueue events"
    }
}

/// One chunk, ready to bind: each event with its 1-based position among this chunk's events of its
/// aggregate, and how many events each aggregate gets (in key order, the order rows are locked in).
struct Rows<'e> {
    events: Vec<(&'e NewEvent, i64, String)>,
    counts: BTreeMap<(&'e str, &'e str), i64>,
}

impl<'e> Rows<'e> {
    fn of(chunk: &'e [NewEvent], trace: Option<&[(&'static str, String)]>) -> Result<Self> {
        let mut counts: BTreeMap<(&str, &str), i64> = BTreeMap::new();
        let mut events = Vec::with_capacity(chunk.len());
        for event in chunk {
            let n = counts.entry((event.aggregate_type(), event.aggregate_id())).or_insert(0);
            *n += 1;
            let serialized = match trace {
                Some(trace) if !event.headers().contains_key(outbox_runtime::trace_context::TRACEPARENT) => {
                    let mut headers = event.headers().clone();
                    outbox_runtime::trace_context::add_to(&mut headers, trace);
                    serde_json::to_string(&headers)
                }
                _ => serde_json::to_string(event.headers()),
            };
            let headers = serialized.map_err(|source| outbox_runtime::Error::Serialize {
                event_type: event.event_type().to_owned(),
                source,
            })?;
            events.push((event, *n, headers));
        }
        Ok(Rows { events, counts })
    }
}

/// `INSERT INTO outbox_events (…)` with the columns every backend writes.
const INSERT_EVENTS: &str = "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, aggregate_version, \
    event_type, schema_version, payload, headers, created_at_ms, attempts, next_attempt_at_ms) ";

/// PostgreSQL: the upsert and the insert in one statement (a data-modifying CTE), one round trip.
async fn write_postgres<C: ConnectionTrait>(conn: &C, rows: &Rows<'_>, now_ms: i64) -> std::result::Result<(), DbErr> {
    let mut sql = Sql::new(DbBackend::Postgres);
    sql.push("WITH counts (aggregate_type, aggregate_id, n) AS (VALUES ");
    sql.join(&rows.counts, ", ", |sql, ((aggregate_type, aggregate_id), n)| {
        sql.push("(").bind(*aggregate_type).push(", ").bind(*aggregate_id).push(", ").bind(*n).push("::bigint)");
    });
    sql.push(
        "), bumped AS (INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) \
         SELECT aggregate_type, aggregate_id, n, ",
    )
    .bind(now_ms)
    .push(
        " FROM counts ORDER BY aggregate_type COLLATE \"C\", aggregate_id COLLATE \"C\" \
         ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE \
         SET last_version = outbox_aggregates.last_version + EXCLUDED.last_version, \
         due_at_ms = COALESCE(outbox_aggregates.due_at_ms, EXCLUDED.due_at_ms) \
         RETURNING aggregate_type, aggregate_id, last_version) ",
    )
    .push(INSERT_EVENTS)
    .push(
        "SELECT v.event_id, v.aggregate_type, v.aggregate_id, b.last_version - c.n + v.ord, v.event_type, \
         v.schema_version, v.payload::jsonb, v.headers::jsonb, v.at, 0, v.at \
         FROM (VALUES ",
    );
    sql.join(rows.events.iter().enumerate(), ", ", |sql, (position, (event, ord, headers))| {
        sql.push("(").bind(position as i64).push("::bigint, ");
        // `ord` stands where the version goes: the statement adds it to the version it hands out.
        bind_event(sql, event, *ord, headers, ("::bigint", "::int"));
        sql.push(", ").bind(now_ms).push("::bigint)");
    });
    sql.push(
        ") AS v (position, event_id, aggregate_type, aggregate_id, ord, event_type, schema_version, payload, headers, at) \
         JOIN bumped b USING (aggregate_type, aggregate_id) JOIN counts c USING (aggregate_type, aggregate_id) \
         ORDER BY v.position",
    );
    conn.execute_raw(sql.build()).await?;
    Ok(())
}

/// MySQL/MariaDB and SQLite: upsert the aggregates, read back their versions (a transaction sees its
/// own writes), insert the events.
async fn write_portable<C: ConnectionTrait>(conn: &C, rows: &Rows<'_>, now_ms: i64) -> std::result::Result<(), DbErr> {
    let backend = conn.get_database_backend();
    let mut upsert = Sql::new(backend);
    upsert.push("INSERT INTO outbox_aggregates (aggregate_type, aggregate_id, last_version, due_at_ms) VALUES ");
    upsert.join(&rows.counts, ", ", |sql, ((aggregate_type, aggregate_id), n)| {
        sql.push("(").bind(*aggregate_type).push(", ").bind(*aggregate_id).push(", ").bind(*n).push(", ").bind(now_ms);
        sql.push(")");
    });
    upsert.push(match backend {
        DbBackend::MySql => {
            " ON DUPLICATE KEY UPDATE last_version = last_version + VALUES(last_version), \
             due_at_ms = COALESCE(due_at_ms, VALUES(due_at_ms))"
        }
        _ => {
            " ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE \
             SET last_version = last_version + excluded.last_version, \
             due_at_ms = COALESCE(due_at_ms, excluded.due_at_ms)"
        }
    });
    conn.execute_raw(upsert.build()).await?;

    let mut read = Sql::new(backend);
    KeyedSelect {
        select: "aggregate_type, aggregate_id, last_version",
        table: "outbox_aggregates",
        key_columns: &["aggregate_type", "aggregate_id"],
        suffix: "",
    }
    .write(
        &mut read,
        rows.counts.keys(),
        |sql, (aggregate_type, aggregate_id)| {
            sql.bind(*aggregate_type).push(", ").bind(*aggregate_id);
        },
        |sql| {
            sql.push("1 = 1");
        },
    );
    let mut last: BTreeMap<(String, String), i64> = BTreeMap::new();
    for row in conn.query_all_raw(read.build()).await? {
        last.insert(
            (row.try_get("", "aggregate_type")?, row.try_get("", "aggregate_id")?),
            row.try_get("", "last_version")?,
        );
    }

    let mut insert = Sql::new(backend);
    insert.push(INSERT_EVENTS).push("VALUES ");
    let mut failed = None;
    insert.join(&rows.events, ", ", |sql, (event, ord, headers)| {
        let key = (event.aggregate_type().to_owned(), event.aggregate_id().to_owned());
        let n = rows.counts[&(event.aggregate_type(), event.aggregate_id())];
        let Some(last_version) = last.get(&key) else {
            failed = Some(DbErr::RecordNotFound(format!("outbox_aggregates row of {}/{}", key.0, key.1)));
            return;
        };
        sql.push("(");
        bind_event(sql, event, last_version - n + ord, headers, ("", ""));
        sql.push(", ").bind(now_ms).push(", 0, ").bind(now_ms).push(")");
    });
    if let Some(error) = failed {
        return Err(error);
    }
    conn.execute_raw(insert.build()).await?;
    Ok(())
}

/// Binds `event_id, aggregate_type, aggregate_id, <version>, event_type, schema_version, payload, headers` of
/// one event; `casts` follow the version and the schema version (PostgreSQL's `VALUES` needs their types).
fn bind_event(sql: &mut Sql, event: &NewEvent, version: i64, headers: &str, casts: (&str, &str)) {
    sql.bind(event.id().to_string())
        .push(", ")
        .bind(event.aggregate_type())
        .push(", ")
        .bind(event.aggregate_id())
        .push(", ")
        .bind(version)
        .push(casts.0)
        .push(", ")
        .bind(event.event_type())
        .push(", ")
        .bind(event.schema_version())
        .push(casts.1)
        .push(", ")
        .bind(event.payload_json())
        .push(", ")
        .bind(headers);
}

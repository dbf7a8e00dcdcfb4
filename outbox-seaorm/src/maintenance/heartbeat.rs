//! The relay processes' heartbeats (`outbox_relays`, migration 8): every
//! [`OutboxService`](crate::OutboxService) writes its own at each stats sample, so that any process (the
//! dashboard, an operator) sees which relays are alive, failing, stopped or gone.

use std::time::Duration;

use sea_orm::sea_query::{Alias, Expr, ExprTrait, OnConflict, Query};
use sea_orm::{ConnectionTrait, DbErr};

use outbox_runtime::store::Heartbeat;

/// The table of the heartbeats.
pub const HEARTBEATS_TABLE: &str = "outbox_relays";
/// How long a heartbeat is kept after its process last wrote one.
pub const HEARTBEAT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The columns of `outbox_relays`, in insert order.
pub const HEARTBEAT_COLUMNS: [&str; 12] = [
    "process",
    "host",
    "pid",
    "relays",
    "started_at_ms",
    "seen_at_ms",
    "every_ms",
    "last_success_at_ms",
    "consecutive_failures",
    "last_error",
    "published_events",
    "stopped",
];

/// Writes `beat` over the same process's last one, and forgets processes silent for
/// [`HEARTBEAT_RETENTION`].
pub(crate) async fn record_heartbeat<C: ConnectionTrait>(db: &C, beat: &Heartbeat) -> std::result::Result<(), DbErr> {
    let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let values: [sea_orm::sea_query::SimpleExpr; 12] = [
        beat.process.clone().into(),
        beat.host.clone().into(),
        i64::from(beat.pid).into(),
        i64::from(beat.relays).into(),
        beat.started_at.timestamp_millis().into(),
        beat.at.timestamp_millis().into(),
        millis(beat.every).into(),
        beat.last_success_at.map(|t| t.timestamp_millis()).into(),
        i64::from(beat.consecutive_failures).into(),
        beat.last_error.as_deref().map(|e| outbox_runtime::text::truncate(e, 2000)).into(),
        i64::try_from(beat.published_events).unwrap_or(i64::MAX).into(),
        beat.stopped.into(),
    ];
    let upsert = Query::insert()
        .into_table(Alias::new(HEARTBEATS_TABLE))
        .columns(HEARTBEAT_COLUMNS.map(Alias::new))
        .values_panic(values)
        .on_conflict(
            OnConflict::column(Alias::new("process"))
                .update_columns(HEARTBEAT_COLUMNS[1..].iter().map(|c| Alias::new(*c)))
                .to_owned(),
        )
        .to_owned();
    db.execute(&upsert).await?;
    let forget = Query::delete()
        .from_table(Alias::new(HEARTBEATS_TABLE))
        .and_where(Expr::col(Alias::new("seen_at_ms")).lt(beat.at.timestamp_millis() - millis(HEARTBEAT_RETENTION)))
        .to_owned();
    db.execute(&forget).await?;
    Ok(())
}

//! The relay processes' heartbeats (`outbox_relays`, migration 8), read: every `OutboxService` writes its
//! own at each stats sample, so that any process (the dashboard, an operator) sees which relays are alive,
//! failing, stopped or gone.

use chrono::Utc;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Order, Query};
use sea_orm::{ConnectionTrait, DbErr};
use serde::Serialize;

use outbox_seaorm::Result;
use outbox_seaorm::maintenance::{HEARTBEAT_COLUMNS as COLUMNS, HEARTBEAT_RETENTION, HEARTBEATS_TABLE as TABLE};

use outbox_seaorm::store_error;

/// Most processes [`relays`] returns.
const LIST_LIMIT: u64 = 100;

/// What a relay process last said about itself, and what that means now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RelayProcess {
    /// `host:pid:start time in ms`.
    pub process: String,
    /// The host name.
    pub host: String,
    /// The process id.
    pub pid: i64,
    /// Relay tasks in the process.
    pub relays: i64,
    /// When it started (ms since the epoch).
    pub started_at_ms: i64,
    /// When it last wrote its heartbeat (ms since the epoch).
    pub seen_at_ms: i64,
    /// How often it writes one, in ms.
    pub every_ms: i64,
    /// When one of its relay passes last succeeded (ms since the epoch).
    pub last_success_at_ms: Option<i64>,
    /// Relay passes that failed in a row.
    pub consecutive_failures: i64,
    /// The last failed pass's error, until a pass succeeds.
    pub last_error: Option<String>,
    /// Events it published since it started.
    pub published_events: i64,
    /// It said it stopped.
    pub stopped: bool,
    /// `alive`, `starting` (no pass yet), `failing`, `stopped`, or `gone` (no heartbeat for three of its
    /// intervals: killed, or cut off from the database), as of the read.
    pub state: &'static str,
}

impl RelayProcess {
    fn state_at(&self, now_ms: i64) -> &'static str {
        if self.stopped {
            "stopped"
        } else if now_ms - self.seen_at_ms > 3 * Ord::max(self.every_ms, 1000) {
            "gone"
        } else if self.consecutive_failures > 0 {
            "failing"
        } else if self.last_success_at_ms.is_none() {
            "starting"
        } else {
            "alive"
        }
    }
}

/// The relay processes that wrote a heartbeat in the last [`HEARTBEAT_RETENTION`], the most recently
/// seen first (at most 100).
pub async fn relays<C: ConnectionTrait>(db: &C) -> Result<Vec<RelayProcess>> {
    let backend = db.get_database_backend();
    let error = |e| store_error("read the relays' heartbeats", TABLE, backend, e);
    let now_ms = Utc::now().timestamp_millis();
    let cutoff = now_ms - i64::try_from(HEARTBEAT_RETENTION.as_millis()).unwrap_or(i64::MAX);
    let select = Query::select()
        .columns(COLUMNS.map(Alias::new))
        .from(Alias::new(TABLE))
        .and_where(Expr::col(Alias::new("seen_at_ms")).gte(cutoff))
        .order_by(Alias::new("seen_at_ms"), Order::Desc)
        .limit(LIST_LIMIT)
        .to_owned();
    let rows = db.query_all(&select).await.map_err(error)?;
    rows.iter()
        .map(|row| {
            let mut process = RelayProcess {
                process: row.try_get("", "process")?,
                host: row.try_get("", "host")?,
                pid: row.try_get("", "pid")?,
                relays: row.try_get("", "relays")?,
                started_at_ms: row.try_get("", "started_at_ms")?,
                seen_at_ms: row.try_get("", "seen_at_ms")?,
                every_ms: row.try_get("", "every_ms")?,
                last_success_at_ms: row.try_get("", "last_success_at_ms")?,
                consecutive_failures: row.try_get("", "consecutive_failures")?,
                last_error: row.try_get("", "last_error")?,
                published_events: row.try_get("", "published_events")?,
                stopped: row.try_get("", "stopped")?,
                state: "",
            };
            process.state = process.state_at(now_ms);
            Ok(process)
        })
        .collect::<std::result::Result<_, DbErr>>()
        .map_err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(seen_at_ms: i64) -> RelayProcess {
        RelayProcess {
            process: "h:1:0".into(),
            host: "h".into(),
            pid: 1,
            relays: 2,
            started_at_ms: 0,
            seen_at_ms,
            every_ms: 15_000,
            last_success_at_ms: Some(seen_at_ms),
            consecutive_failures: 0,
            last_error: None,
            published_events: 7,
            stopped: false,
            state: "",
        }
    }

    #[test]
    fn a_process_silent_for_three_intervals_is_gone() {
        let now = 1_000_000;
        assert_eq!(process(now - 30_000).state_at(now), "alive");
        assert_eq!(process(now - 46_000).state_at(now), "gone");
        let failing = RelayProcess { consecutive_failures: 2, ..process(now) };
        assert_eq!(failing.state_at(now), "failing");
        let stopped = RelayProcess { stopped: true, ..process(now - 100_000) };
        assert_eq!(stopped.state_at(now), "stopped");
        let starting = RelayProcess { last_success_at_ms: None, ..process(now) };
        assert_eq!(starting.state_at(now), "starting");
    }
}

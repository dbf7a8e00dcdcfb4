//! The log relay's replication slot on the overview (`outbox_seaorm::log`, PostgreSQL): whether a relay
//! reads it, how far behind it is and the WAL it holds, read at each refresh.

use maud::Markup;
use sea_orm::DatabaseConnection;

impl super::DashboardConfig {
    /// Shows the log relay's slot `slot` on the overview (`outbox relay --source log --dashboard` passes
    /// its own).
    #[cfg(feature = "log-relay")]
    pub fn with_log_slot(mut self, slot: impl Into<String>) -> Self {
        self.log_slot = Some(slot.into());
        self
    }
}

/// The slot's panel, or nothing when no slot is configured.
#[cfg(feature = "log-relay")]
pub(super) async fn panel(db: &DatabaseConnection, slot: Option<&str>) -> Option<Markup> {
    let name = slot?;
    let state = outbox_seaorm::log::slot_state(db, name).await;
    Some(maud::html! {
        table #log-slot {
            tbody {
                tr { th { "log slot" } td { (name) } }
                @match &state {
                    Err(error) => tr { th { "state" } td.error-text { (error.to_string()) } },
                    Ok(None) => tr { th { "state" } td { "none yet: the log relay creates it at its first start" } },
                    Ok(Some(slot)) => {
                        tr {
                            th { "state" }
                            @if slot.is_lost() {
                                td.error-text #slot-state { "lost: the relay recreates it and catches up from the table" }
                            } @else {
                                td #slot-state { (if slot.streaming { "read by a relay" } else if slot.active { "held" } else { "no relay reads it" }) }
                            }
                        }
                        tr { th { "behind (bytes)" } td #slot-lag { (slot.lag_bytes.unwrap_or(0)) } }
                        tr { th { "WAL held (bytes)" } td { (slot.retained_bytes.unwrap_or(0)) } }
                        tr { th { "confirmed position" } td { (slot.confirmed_flush_lsn.as_deref().unwrap_or("-")) } }
                    }
                }
            }
        }
    })
}

#[cfg(not(feature = "log-relay"))]
pub(super) async fn panel(_db: &DatabaseConnection, _slot: Option<&str>) -> Option<Markup> {
    None
}

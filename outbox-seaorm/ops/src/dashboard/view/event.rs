//! The pages of single events: one row in any state, and one aggregate's events (was it sent, when, where).

use maud::{Markup, html};

use outbox_seaorm::Destination;
use outbox_seaorm::entity::outbox_event;

use super::Frame;
use crate::admin::rfc3339;
use crate::dashboard::read::AGGREGATE_LIMIT;

/// One outbox row, in whatever state.
pub(in crate::dashboard) fn event(
    frame: &Frame<'_>,
    id: &str,
    row: Option<&outbox_event::Model>,
    destination: Option<&Destination>,
) -> Markup {
    let base = frame.base;
    html! {
        @match row {
            None => { h1 { "No such event" } p #event-state { "No outbox row has the id " code { (id) } " (it may have been cleaned up or discarded)." } }
            Some(row) => {
                @let state = if row.published_at_ms.is_some() { "published" } else if row.dead_at_ms.is_some() { "dead" } else { "pending" };
                h1 { (row.event_type) " v" (row.schema_version) }
                p { "State: " strong #event-state class=(state) { (state) } }
                table.detail {
                    tbody {
                        tr { th { "event id" } td #event-id { (row.event_id) } }
                        tr { th { "aggregate" } td { (row.aggregate_type) " / " (row.aggregate_id) " version " (row.aggregate_version) } }
                        tr { th { "seq" } td { (row.seq) } }
                        tr { th { "attempts" } td #attempts { (row.attempts) } }
                        tr { th { "created" } td { (rfc3339(row.created_at_ms)) } }
                        tr { th { "next attempt" } td { (rfc3339(row.next_attempt_at_ms)) } }
                        tr { th { "published" } td #published-at { (row.published_at_ms.map(rfc3339).unwrap_or_else(|| "not yet".to_owned())) } }
                        tr { th { "destination" } td #destination { (destination_of(row, destination)) } }
                        tr { th { "died" } td { (row.dead_at_ms.map(rfc3339).unwrap_or_else(|| "no".to_owned())) } }
                        tr { th { "last error" } td.error-text #last-error { (row.last_error.as_deref().unwrap_or("none")) } }
                    }
                }
                h2 { "Payload" }
                pre #payload { (pretty(&row.payload)) }
                h2 { "Headers" }
                pre #headers { (pretty(&row.headers)) }
                @let undecodable = undecodable(row);
                @if let (Some(why), true) = (&undecodable, row.published_at_ms.is_none()) {
                    p.error #cannot-replay {
                        "The relay cannot decode this row: " (why) ". Replayed as it is, it would die again: fix the row \
                         with SQL (this page offers Replay once it decodes) or discard it."
                    }
                }
                @if let (Some(admin), Some(_)) = (frame.admin, row.dead_at_ms.filter(|_| row.published_at_ms.is_none())) {
                    form method="post" action={ (base) "/actions/replay" } {
                        input type="hidden" name="csrf" value=(admin.csrf);
                        input type="hidden" name="scope" value="ids";
                        input type="hidden" name="id" value=(row.event_id);
                        div.actions {
                            @if undecodable.is_none() {
                                button.action #replay-one type="submit" { "Replay this event" }
                            }
                            button.action #discard-one type="submit" formaction={ (base) "/actions/discard" } { "Discard this event" }
                        }
                    }
                }
            }
        }
    }
}

/// One aggregate's events, as the lookup found them.
pub(in crate::dashboard) struct Lookup<'a> {
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub events: Result<Vec<outbox_event::Model>, String>,
    pub destination: Option<&'a Destination>,
}

/// Where the relay sends (or sent) `row`, when the dashboard was told where the relay publishes.
fn destination_of(row: &outbox_event::Model, destination: Option<&Destination>) -> String {
    match destination {
        Some(d) => d.render_for(&row.aggregate_type, &row.aggregate_id, &row.event_type, row.schema_version),
        None => "not configured here (DashboardConfig::with_destination, or --destination)".to_owned(),
    }
}

/// The answer to "was this aggregate's event sent, when, and where".
pub(in crate::dashboard) fn aggregate(frame: &Frame<'_>, lookup: &Lookup<'_>) -> Markup {
    let base = frame.base;
    html! {
        h1 { "Aggregate " (lookup.aggregate_type) " / " (lookup.aggregate_id) }
        @match &lookup.events {
            Err(message) => p.error #lookup-error { (message) },
            Ok(events) if events.is_empty() => p.muted #aggregate-empty { "No outbox row has this aggregate (never written, or cleaned up after its retention)." },
            Ok(events) => {
                p.muted { "Newest first; at most " (AGGREGATE_LIMIT) " events. Rows published longer ago than the cleanup's retention are gone." }
                table #aggregate-events {
                    thead { tr { th.num { "version" } th { "event" } th { "state" } th { "created" } th { "published" } th { "destination" } th.num { "attempts" } th { "last error" } } }
                    tbody {
                        @for row in events {
                            @let state = if row.published_at_ms.is_some() { "published" } else if row.dead_at_ms.is_some() { "dead" } else { "pending" };
                            tr data-version=(row.aggregate_version) {
                                td.num { (row.aggregate_version) }
                                td { a.event-link href={ (base) "/event?" (form_urlencoded::Serializer::new(String::new()).append_pair("id", &row.event_id).finish()) } { (row.event_type) " v" (row.schema_version) } }
                                td { strong.state class=(state) { (state) } }
                                td { (rfc3339(row.created_at_ms)) }
                                td.published-at { (row.published_at_ms.map(rfc3339).unwrap_or_else(|| "not yet".to_owned())) }
                                td.destination { (destination_of(row, lookup.destination)) }
                                td.num { (row.attempts) }
                                td.error-text { (outbox_seaorm::text::truncate(row.last_error.as_deref().unwrap_or(""), 160)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Why the relay would set `row` aside again (its claim's own checks: the event id is a UUID, the headers a
/// JSON map of strings; the JSON columns hold valid JSON or the row would not have loaded), if it would.
fn undecodable(row: &outbox_event::Model) -> Option<String> {
    if row.event_id.parse::<outbox_seaorm::EventId>().is_err() {
        return Some("its event_id is not a UUID".to_owned());
    }
    serde_json::from_value::<outbox_seaorm::Headers>(row.headers.clone())
        .err()
        .map(|e| format!("its headers are not a JSON map of strings ({e})"))
}

pub(super) fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

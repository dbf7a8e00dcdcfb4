//! A test kit for apps (feature `testkit`): break the broker on purpose and check that your handlers
//! still apply every committed event exactly once, in order per aggregate.
//!
//! - [`FaultyPublisher`] wraps any [`Publisher`](crate::Publisher) (the in-memory one or a real broker's)
//!   and fails events N times or at a seeded rate, loses acks, duplicates, delays, reorders within a call,
//!   and, to prove a check catches them, drops events or breaks per-aggregate order.
//! - [`History`] records committed events, deliveries and applied effects; [`History::check`] returns a
//!   [`HistoryReport`]: `committed`, `delivered`, `applied`, `duplicates_absorbed`, and the four counts
//!   that must be 0: `lost`, `applied_twice`, `order_violations`, `rolled_back_published`.
//!
//! ## Against your own handler
//!
//! The relay stand-in below publishes the way the relay does (one event per aggregate per call, the next
//! only after the broker confirmed the previous, retrying failures), through a broker that fails, loses
//! acks and duplicates. The handler is the app's: here an inbox set and an invoice list; in an app, the
//! handler that calls `outbox_seaorm::handle_once` (record [`History::applied`] when it returns
//! `Processed`). In an integration test, run the real `Relay` with the app's store and the wrapped
//! publisher instead of the loop, and record [`History::committed`] after each business commit.
//!
//! ```
//! use std::collections::HashSet;
//! use outbox_runtime::testkit::{FaultyPublisher, History, Recorded, outbox_event};
//! use outbox_runtime::{EventId, InMemoryPublisher, NewEvent, OutboxEvent, Publisher};
//!
//! /// The app's handler: one invoice per order event, deduplicated by event id.
//! fn bill(inbox: &mut HashSet<EventId>, invoices: &mut Vec<String>, event: &OutboxEvent) -> bool {
//!     if !inbox.insert(event.id) {
//!         return false; // a duplicate: no effect
//!     }
//!     invoices.push(event.aggregate_id.clone());
//!     true
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), outbox_runtime::Error> {
//! let history = History::new();
//! // Committed: two events of order o1, one of o2 (in an app: after the business transaction's commit).
//! let mut pending: Vec<OutboxEvent> = Vec::new();
//! for (seq, (order, version)) in [("o1", 1), ("o1", 2), ("o2", 1)].into_iter().enumerate() {
//!     let new = NewEvent::new("order", order, "order.placed", &serde_json::json!({ "total_minor": 100 }))?;
//!     let event = outbox_event(&new, seq as i64 + 1, version);
//!     history.committed(Recorded::of(&event));
//!     pending.push(event);
//! }
//!
//! let broker = InMemoryPublisher::new();
//! let faulty = FaultyPublisher::new(broker.clone()).with_seed(7);
//! faulty.set_fail_rate(0.3);
//! faulty.set_lost_ack_rate(0.3);
//! faulty.set_duplicate_rate(0.3);
//!
//! // The relay stand-in: each call carries the oldest pending event of each aggregate.
//! while !pending.is_empty() {
//!     let mut heads: Vec<OutboxEvent> = Vec::new();
//!     for event in &pending {
//!         if !heads.iter().any(|h| h.aggregate_id == event.aggregate_id) {
//!             heads.push(event.clone());
//!         }
//!     }
//!     let results = faulty.publish(&heads).await;
//!     for (head, result) in heads.iter().zip(results) {
//!         if result.is_ok() {
//!             pending.retain(|e| e.id != head.id);
//!         }
//!     }
//! }
//!
//! // The consumer: every message the broker holds, redeliveries included, through the handler.
//! let (mut inbox, mut invoices) = (HashSet::new(), Vec::new());
//! for message in broker.received() {
//!     history.delivered(message.id);
//!     if bill(&mut inbox, &mut invoices, &message) {
//!         history.applied(Recorded::of(&message));
//!     }
//! }
//!
//! let report = history.check();
//! assert!(report.is_ok(), "{report}");
//! assert_eq!((report.committed, report.applied), (3, 3));
//! assert!(report.duplicates_absorbed > 0, "the broker delivered duplicates; the inbox absorbed them");
//!
//! // The check does catch a broker that confirms without sending:
//! let lossy = History::new();
//! let dropped = outbox_event(&NewEvent::new("order", "o3", "order.placed", &serde_json::json!({}))?, 4, 1);
//! lossy.committed(Recorded::of(&dropped));
//! let faulty = FaultyPublisher::new(InMemoryPublisher::new());
//! faulty.drop_next(1);
//! assert!(faulty.publish(&[dropped]).await[0].is_ok(), "the relay would mark it published");
//! assert_eq!(faulty.inner().received_count(), 0);
//! assert_eq!(lossy.check().lost, 1);
//! # Ok(()) }
//! ```
//!
//! The soak tool (`examples/soak`) runs the same check over relays killed with SIGKILL, real databases
//! and real brokers; see RELIABILITY.md.

mod faults;
mod history;

pub use faults::{FaultCounts, FaultyPublisher, Reorder};
pub use history::{History, HistoryReport, Recorded, check};

use crate::envelope::{NewEvent, OutboxEvent};

/// The envelope the relay would hand a publisher for `event`, stored at `seq` as version
/// `aggregate_version` of its aggregate: for driving publishers and handlers without a database.
pub fn outbox_event(event: &NewEvent, seq: i64, aggregate_version: i64) -> OutboxEvent {
    OutboxEvent {
        seq,
        aggregate_version,
        id: event.id(),
        aggregate_type: event.aggregate_type().to_owned(),
        aggregate_id: event.aggregate_id().to_owned(),
        event_type: event.event_type().to_owned(),
        schema_version: event.schema_version(),
        payload: event.payload_json().to_owned(),
        headers: event.headers().clone(),
        created_at: chrono::Utc::now(),
        attempts: 0,
        last_error: None,
    }
}

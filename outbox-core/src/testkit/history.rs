//! A history of one run (committed events, broker deliveries, applied effects) and its check.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::envelope::{EventId, OutboxEvent};

/// One event as the checker sees it: its id, aggregate and position in the aggregate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Recorded {
    /// The event id (the inbox key).
    pub id: EventId,
    /// The aggregate id (`OutboxEvent::aggregate_id`); order is checked per aggregate.
    pub aggregate: String,
    /// The event's `aggregate_version` (1, 2, 3, … per aggregate).
    pub version: i64,
}

impl Recorded {
    /// The id, aggregate and version of `event`.
    pub fn of(event: &OutboxEvent) -> Self {
        Recorded { id: event.id, aggregate: event.aggregate_id.clone(), version: event.aggregate_version }
    }
}

#[derive(Default)]
struct Log {
    committed: Vec<Recorded>,
    delivered: Vec<EventId>,
    applied: Vec<Recorded>,
}

/// Records what happened to events in a run, then checks the outbox's guarantees with [`check`](Self::check).
///
/// Record, from wherever the test sees them:
/// - [`committed`](Self::committed): events whose business transaction committed (after the commit; an
///   event whose transaction rolled back must never be recorded here);
/// - [`delivered`](Self::delivered): every message a consumer received, redeliveries included;
/// - [`applied`](Self::applied): every time a handler's effect committed (inside or right after the
///   handler's transaction), in the order they happened.
///
/// Clones share one history, so a handler, a writer task and the test can each hold one.
#[derive(Clone, Default)]
pub struct History {
    log: Arc<Mutex<Log>>,
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let log = self.log();
        f.debug_struct("History")
            .field("committed", &log.committed.len())
            .field("delivered", &log.delivered.len())
            .field("applied", &log.applied.len())
            .finish()
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An event committed with its business change.
    pub fn committed(&self, event: Recorded) {
        self.log().committed.push(event);
    }

    /// A consumer received the message of event `id` (call it for every delivery, duplicates included).
    pub fn delivered(&self, id: EventId) {
        self.log().delivered.push(id);
    }

    /// A handler's effect for this event committed. Call it in the order effects happen.
    pub fn applied(&self, event: Recorded) {
        self.log().applied.push(event);
    }

    /// Checks the history: nothing lost, nothing applied twice, each aggregate's events applied in
    /// version order, nothing delivered that never committed.
    pub fn check(&self) -> HistoryReport {
        let log = self.log();
        check(&log.committed, &log.delivered, &log.applied)
    }
}

/// How many examples of each problem a report keeps.
const EXAMPLES: usize = 5;

/// The verdict of [`History::check`] (or [`check`] over histories read from elsewhere, e.g. tables).
///
/// Serialises to the one-line JSON of the soak tool: the eight counts, not the examples.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HistoryReport {
    /// Distinct events committed.
    pub committed: u64,
    /// Messages delivered to consumers, redeliveries included.
    pub delivered: u64,
    /// Effects applied (every application, so `applied > committed` means something ran twice).
    pub applied: u64,
    /// Redeliveries that did not cause a second effect: duplicates the inbox absorbed.
    pub duplicates_absorbed: u64,
    /// Committed events never applied.
    pub lost: u64,
    /// Events whose effect was applied more than once.
    pub applied_twice: u64,
    /// Effects applied out of order: an event applied after a later version of its aggregate.
    pub order_violations: u64,
    /// Events delivered or applied that never committed (a rolled-back transaction's event got out).
    pub rolled_back_published: u64,
    /// Up to five examples of each problem, for the failure message.
    #[serde(skip)]
    pub examples: Vec<String>,
}

impl HistoryReport {
    /// Whether lost, applied_twice, order_violations and rolled_back_published are all 0.
    pub fn is_ok(&self) -> bool {
        self.lost == 0 && self.applied_twice == 0 && self.order_violations == 0 && self.rolled_back_published == 0
    }

    /// The counts as one JSON object on one line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

impl fmt::Display for HistoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())?;
        for example in &self.examples {
            write!(f, "\n  {example}")?;
        }
        Ok(())
    }
}

/// Checks a history given as slices: `committed` events, `delivered` message ids (every delivery), and
/// `applied` effects in the order they happened. [`History::check`] calls this; a tool that keeps its
/// history in tables reads them and calls it directly.
pub fn check(committed: &[Recorded], delivered: &[EventId], applied: &[Recorded]) -> HistoryReport {
    let mut report = HistoryReport::default();
    let committed_ids: HashSet<EventId> = committed.iter().map(|e| e.id).collect();
    report.committed = committed_ids.len() as u64;
    report.delivered = delivered.len() as u64;
    report.applied = applied.len() as u64;

    let mut examples = |kind: &str, count: u64, text: String| {
        if count <= EXAMPLES as u64 {
            report.examples.push(format!("{kind}: {text}"));
        }
    };

    // Applications per event, and order per aggregate (first applications only: a second one is
    // already counted as applied twice).
    let mut times_applied: HashMap<EventId, u64> = HashMap::new();
    let mut highest: HashMap<&str, i64> = HashMap::new();
    let (mut applied_twice, mut order_violations) = (0, 0);
    for effect in applied {
        let times = times_applied.entry(effect.id).or_default();
        *times += 1;
        if *times == 2 {
            applied_twice += 1;
            examples(
                "applied twice",
                applied_twice,
                format!("{} ({} v{})", effect.id, effect.aggregate, effect.version),
            );
        }
        if *times > 1 {
            continue;
        }
        let top = highest.entry(effect.aggregate.as_str()).or_insert(i64::MIN);
        if effect.version <= *top {
            order_violations += 1;
            examples(
                "order violation",
                order_violations,
                format!("{} v{} applied after v{}", effect.aggregate, effect.version, *top),
            );
        } else {
            *top = effect.version;
        }
    }

    let mut lost = 0;
    for event in committed {
        if !times_applied.contains_key(&event.id) {
            lost += 1;
            examples("lost", lost, format!("{} ({} v{})", event.id, event.aggregate, event.version));
        }
    }

    let mut rolled_back = 0;
    let mut outside: HashSet<EventId> = HashSet::new();
    for id in delivered.iter().chain(applied.iter().map(|e| &e.id)) {
        if !committed_ids.contains(id) && outside.insert(*id) {
            rolled_back += 1;
            examples("never committed but published", rolled_back, id.to_string());
        }
    }

    let distinct_delivered = delivered.iter().collect::<HashSet<_>>().len() as u64;
    let redeliveries = report.delivered - distinct_delivered;
    let extra_applications = report.applied - times_applied.len() as u64;
    report.duplicates_absorbed = redeliveries.saturating_sub(extra_applications);
    report.lost = lost;
    report.applied_twice = applied_twice;
    report.order_violations = order_violations;
    report.rolled_back_published = rolled_back;
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::NewEvent;

    fn event(aggregate: &str, version: i64) -> Recorded {
        Recorded { id: EventId::new(), aggregate: aggregate.into(), version }
    }

    /// a1, a2 on aggregate `a`; b1 on `b`; all committed.
    fn committed_three(history: &History) -> [Recorded; 3] {
        let events = [event("a", 1), event("a", 2), event("b", 1)];
        for e in &events {
            history.committed(e.clone());
        }
        events
    }

    #[test]
    fn a_clean_run_with_a_redelivery_absorbed_is_ok() {
        let history = History::new();
        let [a1, a2, b1] = committed_three(&history);
        for e in [&a1, &b1, &a2, &a2] {
            history.delivered(e.id);
        }
        for e in [&a1, &b1, &a2] {
            history.applied(e.clone());
        }
        let report = history.check();
        assert!(report.is_ok(), "{report}");
        assert_eq!((report.committed, report.delivered, report.applied), (3, 4, 3));
        assert_eq!(report.duplicates_absorbed, 1);
        assert_eq!(
            report.to_json(),
            r#"{"committed":3,"delivered":4,"applied":3,"duplicates_absorbed":1,"lost":0,"applied_twice":0,"order_violations":0,"rolled_back_published":0}"#
        );
    }

    #[test]
    fn a_committed_event_never_applied_is_lost() {
        let history = History::new();
        let [a1, _a2, b1] = committed_three(&history);
        history.applied(a1);
        history.applied(b1);
        let report = history.check();
        assert_eq!(report.lost, 1);
        assert!(!report.is_ok());
        assert!(report.examples[0].starts_with("lost: "), "{report}");
    }

    #[test]
    fn an_effect_applied_twice_is_counted_once_per_event() {
        let history = History::new();
        let [a1, a2, b1] = committed_three(&history);
        for e in [&a1, &a1, &a1, &a2, &b1] {
            history.delivered(e.id);
            history.applied(e.clone());
        }
        let report = history.check();
        assert_eq!(report.applied_twice, 1, "one event, applied three times");
        assert_eq!(report.applied, 5);
        assert_eq!(report.duplicates_absorbed, 0, "none of the redeliveries was absorbed");
        assert_eq!((report.lost, report.order_violations), (0, 0));
    }

    #[test]
    fn a_later_version_applied_first_is_an_order_violation() {
        let history = History::new();
        let [a1, a2, b1] = committed_three(&history);
        for e in [&b1, &a2, &a1] {
            history.applied(e.clone());
        }
        let report = history.check();
        assert_eq!(report.order_violations, 1);
        assert_eq!(report.lost, 0);
        assert!(report.examples[0].contains("a v1 applied after v2"), "{report}");
    }

    #[test]
    fn order_is_per_aggregate_only() {
        let history = History::new();
        let [a1, a2, b1] = committed_three(&history);
        for e in [&a1, &b1, &a2] {
            history.applied(e.clone());
        }
        // b1 after a2 would be fine too: versions of different aggregates are not compared.
        assert_eq!(history.check().order_violations, 0);
    }

    #[test]
    fn a_delivered_event_that_never_committed_was_published_after_a_rollback() {
        let history = History::new();
        let [a1, a2, b1] = committed_three(&history);
        let rolled_back = event("c", 1);
        for e in [&a1, &a2, &b1, &rolled_back, &rolled_back] {
            history.delivered(e.id);
        }
        for e in [&a1, &a2, &b1] {
            history.applied(e.clone());
        }
        let report = history.check();
        assert_eq!(report.rolled_back_published, 1, "one event, delivered twice");
        assert!(!report.is_ok());
    }

    #[test]
    fn recorded_of_an_envelope_takes_its_id_aggregate_and_version() {
        let event = NewEvent::new("order", "o1", "order.placed", &serde_json::json!({})).unwrap();
        let envelope = super::super::outbox_event(&event, 9, 4);
        assert_eq!(Recorded::of(&envelope), Recorded { id: envelope.id, aggregate: "o1".into(), version: 4 });
    }
}

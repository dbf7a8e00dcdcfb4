//! Operating consumer dead letters: list, show, replay and discard them, all or a selection.
//!
//! Every broker transport implements [`DeadLetters`] with one method,
//! [`dead_letters`](DeadLetters::dead_letters), which walks its dead-letter destination oldest first and
//! does one [`DeadLetterAction`] to each letter a [`DeadFilter`] selects. The operations an operator
//! needs (and the `outbox dead-letters` command) are the provided methods built on it, and
//! [`DeadLetters::replay_dead_letters`] is the same walk with every letter
//! selected.
//!
//! Nothing is lost: a replayed letter leaves the dead-letter destination only after the broker confirmed its
//! republish to the origin, and a discarded one only when it was selected explicitly.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::transport::dead_header;
use crate::broker::header as envelope_header;
use crate::error::{Error, Result};

/// Which dead things an operation applies to: dead outbox rows (the relay gave up on them; `outbox dead`,
/// `outbox_ops::admin`) and consumers' dead letters (a consumer gave up on them; `outbox dead-letters`,
/// [`DeadLetters`]), with one set of criteria that combine with AND (a list of consumers, event types or ids
/// matches any of them). [`DeadFilter::default`] matches every one; a replay or discard of all of them must
/// say so with [`DeadFilter::all`] (see [`require_selection`](Self::require_selection)). The consumer
/// criterion applies to dead letters only (a dead outbox row has no consumer). The `outbox` command's
/// flags and the dashboard's form are this filter, for both.
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::consume::DeadFilter;
///
/// // Billing's dead letters of one order that died in the last hour.
/// let filter = DeadFilter::default()
///     .consumer("billing")
///     .aggregate_id("o-17")
///     .newer_than(Duration::from_secs(3600));
/// assert!(!filter.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadFilter {
    consumers: Vec<String>,
    event_types: Vec<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    error_contains: Option<String>,
    older_than: Option<Duration>,
    newer_than: Option<Duration>,
    ids: Vec<String>,
    everything: bool,
}

impl DeadFilter {
    /// Every dead letter, said explicitly: what a replay or discard of them all needs.
    pub fn all() -> Self {
        DeadFilter { everything: true, ..DeadFilter::default() }
    }

    /// Only letters this consumer dead-lettered (the `outbox_dead_consumer` header; call again to add more).
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumers.push(consumer.into());
        self
    }

    /// Only letters of this event type (the `ce_type` header; call again to add more).
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_types.push(event_type.into());
        self
    }

    /// Only letters of this aggregate type (the `outbox_aggregate_type` header).
    pub fn aggregate_type(mut self, aggregate_type: impl Into<String>) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self
    }

    /// Only letters of this aggregate id (the `ce_subject` header).
    pub fn aggregate_id(mut self, aggregate_id: impl Into<String>) -> Self {
        self.aggregate_id = Some(aggregate_id.into());
        self
    }

    /// Only letters whose reason contains `text`, ignoring ASCII case.
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Only letters dead-lettered more than `age` ago (a letter without a readable time never matches).
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Only letters dead-lettered less than `age` ago (a letter without a readable time never matches).
    pub fn newer_than(mut self, age: Duration) -> Self {
        self.newer_than = Some(age);
        self
    }

    /// Only the letter or row with this id (a dead letter's [`DeadLetterEntry::id`], a dead row's event id;
    /// call again to add more).
    pub fn id(mut self, id: impl ToString) -> Self {
        self.ids.push(id.to_string());
        self
    }

    /// Only these letters or rows.
    pub fn ids<I: ToString>(mut self, ids: impl IntoIterator<Item = I>) -> Self {
        self.ids.extend(ids.into_iter().map(|id| id.to_string()));
        self
    }

    /// The ids this filter selects (empty: any).
    pub fn selected_ids(&self) -> &[String] {
        &self.ids
    }

    /// The consumers it selects (empty: any).
    pub fn consumers(&self) -> &[String] {
        &self.consumers
    }

    /// The event types it selects (empty: any).
    pub fn event_types(&self) -> &[String] {
        &self.event_types
    }

    /// The aggregate type it selects, if one.
    pub fn selected_aggregate_type(&self) -> Option<&str> {
        self.aggregate_type.as_deref()
    }

    /// The aggregate id it selects, if one.
    pub fn selected_aggregate_id(&self) -> Option<&str> {
        self.aggregate_id.as_deref()
    }

    /// The text the error or reason must contain (ASCII case ignored), if any.
    pub fn error_text(&self) -> Option<&str> {
        self.error_contains.as_deref()
    }

    /// The age bounds: died more than the first ago, less than the second ago.
    pub fn age_bounds(&self) -> (Option<Duration>, Option<Duration>) {
        (self.older_than, self.newer_than)
    }

    /// Whether no criterion was given (the filter matches every dead letter).
    pub fn is_empty(&self) -> bool {
        self.consumers.is_empty()
            && self.event_types.is_empty()
            && self.aggregate_type.is_none()
            && self.aggregate_id.is_none()
            && self.error_contains.is_none()
            && self.older_than.is_none()
            && self.newer_than.is_none()
            && self.ids.is_empty()
    }

    /// Whether this is [`DeadFilter::all`].
    pub fn is_all(&self) -> bool {
        self.everything
    }

    /// Refuses a filter that would act on every dead letter without saying so: `Ok` when it has a criterion
    /// or is [`DeadFilter::all`], otherwise an [`Error::InvalidConfig`] naming `verb`.
    pub fn require_selection(&self, verb: &str) -> Result<()> {
        if self.is_empty() && !self.everything {
            return Err(Error::invalid_config(
                "dead filter",
                format!("{verb} every dead event or letter needs DeadFilter::all() (`--all`) or a criterion"),
            ));
        }
        Ok(())
    }

    /// Whether `letter` matches every criterion, at time `now`.
    pub fn matches(&self, letter: &DeadLetterEntry, now: DateTime<Utc>) -> bool {
        let any = |list: &[String], value: &Option<String>| {
            list.is_empty() || value.as_ref().is_some_and(|v| list.iter().any(|x| x == v))
        };
        let equal = |wanted: &Option<String>, value: &Option<String>| wanted.is_none() || wanted == value;
        if !any(&self.consumers, &letter.consumer)
            || !any(&self.event_types, &letter.event_type)
            || !equal(&self.aggregate_type, &letter.aggregate_type)
            || !equal(&self.aggregate_id, &letter.aggregate_id)
            || !(self.ids.is_empty() || self.ids.contains(&letter.id))
        {
            return false;
        }
        if let Some(text) = &self.error_contains {
            let reason = letter.reason.as_deref().unwrap_or_default().to_ascii_lowercase();
            if !reason.contains(&text.to_ascii_lowercase()) {
                return false;
            }
        }
        if self.older_than.is_some() || self.newer_than.is_some() {
            let Some(at) = letter.dead_at.as_deref().and_then(|at| DateTime::parse_from_rfc3339(at).ok()) else {
                return false;
            };
            let age = now.signed_duration_since(at.with_timezone(&Utc)).to_std().unwrap_or(Duration::ZERO);
            if self.older_than.is_some_and(|limit| age < limit) || self.newer_than.is_some_and(|limit| age >= limit) {
                return false;
            }
        }
        true
    }
}

/// One dead letter as read back from its dead-letter destination. Times are RFC 3339 text as written by
/// the consumer; every field but [`id`](Self::id) is `None` when the letter lacks the header.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeadLetterEntry {
    /// The letter's id in its dead-letter destination, stable until it is removed: the dead-letter stream
    /// sequence (NATS), the entry id (Redis), `topic/partition/offset` (Kafka), a hash of the letter
    /// (RabbitMQ, whose queues have no message ids).
    pub id: String,
    /// The consumer that dead-lettered it (`outbox_dead_consumer`).
    pub consumer: Option<String>,
    /// The event type (`ce_type`).
    pub event_type: Option<String>,
    /// The aggregate type (`outbox_aggregate_type`).
    pub aggregate_type: Option<String>,
    /// The aggregate id (`ce_subject`).
    pub aggregate_id: Option<String>,
    /// The event id (`ce_id`).
    pub event_id: Option<String>,
    /// Deliveries before it was dead-lettered (`outbox_dead_attempts`).
    pub attempts: Option<u32>,
    /// Why (`outbox_dead_reason`).
    pub reason: Option<String>,
    /// Where it was published first, and where a replay sends it (`outbox_dead_origin`).
    pub origin: Option<String>,
    /// When it was dead-lettered (`outbox_dead_at`).
    pub dead_at: Option<String>,
    /// Every header, dead-letter headers included ([`DeadLetterAction::Show`] only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// The payload: its JSON when it parses, otherwise its text (lossy UTF-8) ([`DeadLetterAction::Show`]
    /// only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
}

impl DeadLetterEntry {
    /// The entry of the letter `id` with `headers`; `payload` is kept when `content` is true.
    pub fn from_headers(id: String, headers: &BTreeMap<String, String>, payload: &[u8], content: bool) -> Self {
        let get = |name: &str| headers.get(name).cloned();
        DeadLetterEntry {
            id,
            consumer: get(dead_header::CONSUMER),
            event_type: get(envelope_header::TYPE),
            aggregate_type: get(envelope_header::AGGREGATE_TYPE),
            aggregate_id: get(envelope_header::SUBJECT),
            event_id: get(envelope_header::ID),
            attempts: headers.get(dead_header::ATTEMPTS).and_then(|a| a.parse().ok()),
            reason: get(dead_header::REASON),
            origin: get(dead_header::ORIGIN),
            dead_at: get(dead_header::AT),
            headers: content.then(|| headers.clone()),
            payload: content.then(|| {
                serde_json::from_slice(payload)
                    .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(payload).into_owned()))
            }),
        }
    }
}

/// What [`DeadLetters::dead_letters`] does to each selected letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadLetterAction {
    /// Reads it, without headers and payload; it stays.
    List,
    /// Reads it with its headers and payload; it stays.
    Show,
    /// Republishes it to its origin with its original headers, then removes it once the broker confirmed
    /// the republish. A letter without a valid origin stays (logged).
    Replay,
    /// Removes it for good.
    Discard,
}

/// What one [`DeadLetters::dead_letters`] walk did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeadLetterOutcome {
    /// The selected letters that were read, replayed or discarded (replayed: only those that moved),
    /// oldest first.
    pub letters: Vec<DeadLetterEntry>,
    /// Selected letters left in place because they cannot be replayed (no valid origin, unroutable).
    pub kept: u64,
}

/// The dead letters of a transport: list, show, replay and discard them. Every broker transport implements
/// it; [`DeadLetters::replay_dead_letters`] replays every letter.
pub trait DeadLetters: Send + Sync {
    /// The broker's name for messages, e.g. `Redis Streams`.
    fn dead_letter_broker(&self) -> &'static str;

    /// Where the dead letters are read: a stream, subject, queue or topic list.
    fn dead_letter_location(&self) -> String;

    /// Walks the dead letters oldest first and does `action` to each one `filter` selects, up to `max`
    /// selected letters. A broker failure is an [`Error::Broker`]; what was replayed or discarded before it
    /// stays so, and no letter is removed unless its action was confirmed.
    fn dead_letters(
        &self,
        filter: &DeadFilter,
        action: DeadLetterAction,
        max: usize,
    ) -> impl Future<Output = Result<DeadLetterOutcome>> + Send;

    /// Up to `limit` matching dead letters, oldest first, without headers and payload.
    fn list_dead_letters(
        &self,
        filter: &DeadFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetterEntry>>> + Send {
        async move { Ok(self.dead_letters(filter, DeadLetterAction::List, limit).await?.letters) }
    }

    /// The dead letter with this id, with its headers and payload; `None` when there is none.
    fn show_dead_letter(&self, id: &str) -> impl Future<Output = Result<Option<DeadLetterEntry>>> + Send {
        async move {
            let filter = DeadFilter::default().id(id);
            Ok(self.dead_letters(&filter, DeadLetterAction::Show, 1).await?.letters.into_iter().next())
        }
    }

    /// Moves up to `max` dead letters (every one, oldest first) back to their origin with their original
    /// headers, removing each from the dead-letter destination only after the broker confirmed the
    /// republish; how many moved. A fixed consumer then applies them (its inbox absorbs any it had
    /// applied). Each broker's implementation says what "removing" and "origin" mean there.
    fn replay_dead_letters(&self, max: usize) -> impl Future<Output = Result<u64>> + Send {
        async move {
            let outcome = self.dead_letters(&DeadFilter::all(), DeadLetterAction::Replay, max).await?;
            Ok(outcome.letters.len() as u64)
        }
    }

    /// Replays the matching dead letters (see [`DeadLetterAction::Replay`]); how many moved. `filter` must
    /// select ([`DeadFilter::require_selection`]).
    fn replay_dead_letters_matching(&self, filter: &DeadFilter) -> impl Future<Output = Result<u64>> + Send {
        async move {
            filter.require_selection("replaying")?;
            let outcome = self.dead_letters(filter, DeadLetterAction::Replay, usize::MAX).await?;
            Ok(outcome.letters.len() as u64)
        }
    }

    /// Discards the matching dead letters for good; how many. `filter` must select
    /// ([`DeadFilter::require_selection`]).
    fn discard_dead_letters(&self, filter: &DeadFilter) -> impl Future<Output = Result<u64>> + Send {
        async move {
            filter.require_selection("discarding")?;
            let outcome = self.dead_letters(filter, DeadLetterAction::Discard, usize::MAX).await?;
            Ok(outcome.letters.len() as u64)
        }
    }

    /// The number of dead letters per consumer (`outbox_dead_consumer`, `-` when missing), and sets the
    /// [`CONSUMER_DEAD_LETTERS`](crate::metrics::CONSUMER_DEAD_LETTERS) gauge of each. The consumers in
    /// `known` are counted even with no dead letter (0), so that their gauge falls back to 0 once their
    /// letters were replayed or discarded. Call it from a sampler to alert on dead letters.
    fn count_dead_letters(&self, known: &[String]) -> impl Future<Output = Result<BTreeMap<String, u64>>> + Send {
        async move {
            let letters = self.dead_letters(&DeadFilter::default(), DeadLetterAction::List, usize::MAX).await?;
            let mut counts: BTreeMap<String, u64> = known.iter().map(|consumer| (consumer.clone(), 0)).collect();
            for letter in letters.letters {
                *counts.entry(letter.consumer.unwrap_or_else(|| "-".to_owned())).or_insert(0) += 1;
            }
            for (consumer, count) in &counts {
                crate::metrics::consumer_dead_letters(consumer, *count);
            }
            Ok(counts)
        }
    }

    /// How far the consumer behind this transport is at its broker ([`Transport::lag`](super::Transport::lag),
    /// for tools that hold the transport as dead letters, such as the dashboard); `None` when the broker
    /// cannot say (the default).
    fn consumer_lag(&self) -> impl Future<Output = Result<Option<super::Lag>>> + Send {
        async { Ok(None) }
    }
}

/// A shared transport's dead letters: the dashboard and a running consumer can hold one transport.
impl<T: DeadLetters> DeadLetters for std::sync::Arc<T> {
    fn dead_letter_broker(&self) -> &'static str {
        (**self).dead_letter_broker()
    }

    fn dead_letter_location(&self) -> String {
        (**self).dead_letter_location()
    }

    fn dead_letters(
        &self,
        filter: &DeadFilter,
        action: DeadLetterAction,
        max: usize,
    ) -> impl Future<Output = Result<DeadLetterOutcome>> + Send {
        (**self).dead_letters(filter, action, max)
    }

    fn consumer_lag(&self) -> impl Future<Output = Result<Option<super::Lag>>> + Send {
        (**self).consumer_lag()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(consumer: &str, event_type: &str, at: DateTime<Utc>) -> DeadLetterEntry {
        let headers: BTreeMap<String, String> = [
            (dead_header::CONSUMER, consumer.to_owned()),
            (envelope_header::TYPE, event_type.to_owned()),
            (envelope_header::AGGREGATE_TYPE, "order".to_owned()),
            (envelope_header::SUBJECT, "o1".to_owned()),
            (dead_header::REASON, "Handler TIMEOUT".to_owned()),
            (dead_header::AT, at.to_rfc3339()),
            (dead_header::ATTEMPTS, "3".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        DeadLetterEntry::from_headers("7".to_owned(), &headers, b"not json", false)
    }

    #[test]
    fn criteria_combine_with_and() {
        let now = Utc::now();
        let old = letter("billing", "order.placed", now - chrono::Duration::hours(2));
        assert_eq!(old.attempts, Some(3));
        assert!(DeadFilter::default().matches(&old, now));
        assert!(DeadFilter::default().consumer("x").consumer("billing").matches(&old, now));
        assert!(!DeadFilter::default().consumer("shipping").matches(&old, now));
        assert!(DeadFilter::default().event_type("order.placed").aggregate_id("o1").matches(&old, now));
        assert!(!DeadFilter::default().aggregate_type("invoice").matches(&old, now));
        assert!(DeadFilter::default().error_contains("timeout").matches(&old, now));
        assert!(DeadFilter::default().older_than(Duration::from_secs(3600)).matches(&old, now));
        assert!(!DeadFilter::default().newer_than(Duration::from_secs(3600)).matches(&old, now));
        assert!(DeadFilter::default().id("7").matches(&old, now));
        assert!(!DeadFilter::default().id("8").matches(&old, now));
        let mut timeless = old.clone();
        timeless.dead_at = None;
        assert!(!DeadFilter::default().older_than(Duration::ZERO).matches(&timeless, now));
    }

    #[test]
    fn acting_on_everything_must_be_said() {
        assert!(DeadFilter::default().require_selection("discarding").is_err());
        assert!(DeadFilter::all().require_selection("discarding").is_ok());
        assert!(DeadFilter::default().consumer("billing").require_selection("replaying").is_ok());
    }

    #[test]
    fn show_keeps_a_payload_that_is_not_json_as_text() {
        let shown = DeadLetterEntry::from_headers("1".to_owned(), &BTreeMap::new(), b"not json", true);
        assert_eq!(shown.payload, Some(serde_json::Value::String("not json".to_owned())));
        let json = DeadLetterEntry::from_headers("1".to_owned(), &BTreeMap::new(), br#"{"a":1}"#, true);
        assert_eq!(json.payload, Some(serde_json::json!({"a": 1})));
    }
}

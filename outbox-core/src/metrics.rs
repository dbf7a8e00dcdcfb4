//! The metrics the relay, the stats sampler and the consume driver record, through the [`metrics`] facade.
//!
//! The library never installs a recorder: without one every call is a no-op. An app (or the `outbox`
//! binary's `--http`) installs one, e.g. `metrics-exporter-prometheus`, and may call [`describe`] after
//! installing it so that the exporter shows the help texts (the relay and the consumer call it too when
//! they start). With the crate's `metrics` feature off (it is on by default) nothing is recorded.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `outbox_events_published_total` | counter | | rows the broker confirmed and the store marked published |
//! | `outbox_events_failed_total` | counter | | failed publishes that will be retried after their backoff |
//! | `outbox_events_dead_total` | counter | | rows that failed for the last time and are now dead |
//! | `outbox_events_released_total` | counter | | claimed rows handed back untried (an earlier event of their aggregate failed, timeout, shutdown) |
//! | `outbox_events_fenced_total` | counter | | rows whose lease another relay took over before this one marked them |
//! | `outbox_relay_pass_failures_total` | counter | | relay passes that failed (store or claim error) |
//! | `outbox_relay_batch_size` | histogram | | rows claimed by a pass that claimed any |
//! | `outbox_claim_duration_seconds` | histogram | | time of the store's claim |
//! | `outbox_publish_duration_seconds` | histogram | | time of one publish call (a wave of events) |
//! | `outbox_publish_latency_seconds` | histogram | | commit → broker confirmation: `created_at` to the confirmation, per event |
//! | `outbox_log_slot_lag_bytes` | gauge | `slot` | the log relay's slot: WAL after its confirmed position (`outbox_seaorm::log`): **alert on it** |
//! | `outbox_log_slot_retained_bytes` | gauge | `slot` | WAL the server keeps for the slot (from its restart position) |
//! | `outbox_log_confirmed_age_seconds` | gauge | `slot` | time since the log relay last confirmed a position while the slot lagged (0 when caught up) |
//! | `outbox_pending_events` | gauge | | unpublished rows that will still be tried (stats sampler) |
//! | `outbox_dead_events` | gauge | | dead rows (stats sampler) |
//! | `outbox_oldest_pending_age_seconds` | gauge | | age of the oldest pending row (stats sampler): **alert on it** |
//! | `outbox_consumer_processed_total` | counter | `consumer`, `event_type` | messages whose effect ran and committed |
//! | `outbox_consumer_duplicates_total` | counter | `consumer`, `event_type` | messages the inbox had seen already |
//! | `outbox_consumer_retried_total` | counter | `consumer`, `event_type` | failed handler attempts retried in place |
//! | `outbox_consumer_dead_lettered_total` | counter | `consumer` | messages confirmed in the dead-letter destination |
//! | `outbox_consumer_dead_letters` | gauge | `consumer` | dead letters waiting in the dead-letter destination ([`DeadLetters::count_dead_letters`](crate::consume::DeadLetters::count_dead_letters), e.g. `outbox dead-letters count`) |
//! | `outbox_consumer_lag` | gauge | `consumer` | messages at the broker this consumer has not acknowledged, delivered or not ([`Transport::lag`](crate::consume::Transport::lag), sampled by the running consumer every [`ConsumerConfig::lag_interval`](crate::ConsumerConfig::lag_interval)): **alert on it** |
//! | `outbox_consumer_skipped_total` | counter | `consumer` | messages of event types with no handler here, acked untouched |
//! | `outbox_consumer_handler_duration_seconds` | histogram | `consumer`, `event_type` | one handler attempt (inbox check and effect) |
//!
//! `event_type` labels only carry the types a consumer has a handler for, so their number is bounded by
//! the code; messages of other types (whatever a producer sends) count under `consumer` alone.
//! The gauges are set by [`OutboxService`](crate::OutboxService)'s stats sampler, every
//! [`ServiceConfig::stats_interval`](crate::ServiceConfig::stats_interval); a relay run on its own sets
//! only counters and histograms.

use std::time::Duration;

/// Counter: rows the broker confirmed and the store marked published.
pub const EVENTS_PUBLISHED: &str = "outbox_events_published_total";
/// Counter: failed publishes that will be retried after their backoff.
pub const EVENTS_FAILED: &str = "outbox_events_failed_total";
/// Counter: rows that failed for the last time (or permanently) and are now dead.
pub const EVENTS_DEAD: &str = "outbox_events_dead_total";
/// Counter: claimed rows handed back untried (an earlier event of their aggregate failed in the pass, the
/// pass reached `publish_timeout`, or the relay was shutting down).
pub const EVENTS_RELEASED: &str = "outbox_events_released_total";
/// Counter: rows whose lease another relay took over before this one marked them (lease mode).
pub const EVENTS_FENCED: &str = "outbox_events_fenced_total";
/// Counter: relay passes that failed (the store is down, a claim failed), counted by the relay loop
/// ([`Relay::run`](crate::Relay::run) and [`OutboxService`](crate::OutboxService)'s relays).
pub const RELAY_PASS_FAILURES: &str = "outbox_relay_pass_failures_total";
/// Histogram: rows claimed by each pass that claimed any.
pub const RELAY_BATCH_SIZE: &str = "outbox_relay_batch_size";
/// Histogram, seconds: how long the store's claim took.
pub const CLAIM_DURATION: &str = "outbox_claim_duration_seconds";
/// Histogram, seconds: how long one publish call (one wave of events) took, until the broker answered.
pub const PUBLISH_DURATION: &str = "outbox_publish_duration_seconds";
/// Histogram, seconds: commit → broker confirmation, per confirmed event (`created_at` to the confirmation).
pub const PUBLISH_LATENCY: &str = "outbox_publish_latency_seconds";
/// Gauge: unpublished rows that will still be tried, at the last stats sample.
pub const PENDING_EVENTS: &str = "outbox_pending_events";
/// Gauge: dead rows, at the last stats sample.
pub const DEAD_EVENTS: &str = "outbox_dead_events";
/// Gauge, seconds: the age of the oldest pending row at the last stats sample (0 when none). The alert.
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";

/// Counter (`consumer`, `event_type`): messages whose effect ran and committed.
pub const CONSUMER_PROCESSED: &str = "outbox_consumer_processed_total";
/// Counter (`consumer`, `event_type`): messages the inbox had seen already.
pub const CONSUMER_DUPLICATES: &str = "outbox_consumer_duplicates_total";
/// Counter (`consumer`, `event_type`): failed handler attempts that were retried in place.
pub const CONSUMER_RETRIED: &str = "outbox_consumer_retried_total";
/// Counter (`consumer`): messages confirmed in the dead-letter destination.
pub const CONSUMER_DEAD_LETTERED: &str = "outbox_consumer_dead_lettered_total";
/// Counter (`consumer`): messages of event types this consumer has no handler for, acked untouched.
pub const CONSUMER_SKIPPED: &str = "outbox_consumer_skipped_total";
/// Gauge (`consumer`): dead letters waiting in the dead-letter destination, per consumer that
/// dead-lettered them, as counted by
/// [`DeadLetters::count_dead_letters`](crate::consume::DeadLetters::count_dead_letters).
pub const CONSUMER_DEAD_LETTERS: &str = "outbox_consumer_dead_letters";
/// Gauge (`consumer`): messages at the broker this consumer has not acknowledged, delivered or not, as
/// [`Transport::lag`](crate::consume::Transport::lag) reads them.
pub const CONSUMER_LAG: &str = "outbox_consumer_lag";
/// Histogram, seconds (`consumer`, `event_type`): one handler attempt, inbox check and effect included.
pub const CONSUMER_HANDLER_DURATION: &str = "outbox_consumer_handler_duration_seconds";

/// The label naming the consumer (its inbox key).
pub const LABEL_CONSUMER: &str = "consumer";
/// The label naming the event type.
pub const LABEL_EVENT_TYPE: &str = "event_type";

/// Every metric name above, for exporters' allow-lists and for tests.
pub const ALL: &[&str] = &[
    EVENTS_PUBLISHED,
    EVENTS_FAILED,
    EVENTS_DEAD,
    EVENTS_RELEASED,
    EVENTS_FENCED,
    RELAY_PASS_FAILURES,
    RELAY_BATCH_SIZE,
    CLAIM_DURATION,
    PUBLISH_DURATION,
    PUBLISH_LATENCY,
    PENDING_EVENTS,
    DEAD_EVENTS,
    OLDEST_PENDING_AGE,
    CONSUMER_PROCESSED,
    CONSUMER_DUPLICATES,
    CONSUMER_RETRIED,
    CONSUMER_DEAD_LETTERED,
    CONSUMER_DEAD_LETTERS,
    CONSUMER_LAG,
    CONSUMER_SKIPPED,
    CONSUMER_HANDLER_DURATION,
];

/// Gives the installed recorder the unit and help text of every metric above. Harmless to call more than
/// once; a no-op without a recorder or without the `metrics` feature.
pub fn describe() {
    #[cfg(feature = "metrics")]
    {
        use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
        describe_counter!(
            EVENTS_PUBLISHED,
            Unit::Count,
            "Outbox rows the broker confirmed and the store marked published"
        );
        describe_counter!(EVENTS_FAILED, Unit::Count, "Failed publishes that will be retried after their backoff");
        describe_counter!(EVENTS_DEAD, Unit::Count, "Outbox rows that failed for the last time and are now dead");
        describe_counter!(EVENTS_RELEASED, Unit::Count, "Claimed outbox rows handed back untried");
        describe_counter!(EVENTS_FENCED, Unit::Count, "Outbox rows whose lease another relay took over");
        describe_counter!(RELAY_PASS_FAILURES, Unit::Count, "Relay passes that failed");
        describe_histogram!(RELAY_BATCH_SIZE, Unit::Count, "Rows claimed by a relay pass that claimed any");
        describe_histogram!(CLAIM_DURATION, Unit::Seconds, "Time of the store's claim");
        describe_histogram!(PUBLISH_DURATION, Unit::Seconds, "Time of one publish call (a wave of events)");
        describe_histogram!(PUBLISH_LATENCY, Unit::Seconds, "Commit to broker confirmation, per event");
        describe_gauge!(PENDING_EVENTS, Unit::Count, "Unpublished outbox rows that will still be tried");
        describe_gauge!(DEAD_EVENTS, Unit::Count, "Dead outbox rows");
        describe_gauge!(OLDEST_PENDING_AGE, Unit::Seconds, "Age of the oldest pending outbox row");
        describe_gauge!(LOG_SLOT_LAG, Unit::Bytes, "WAL after the log relay's confirmed position");
        describe_gauge!(LOG_SLOT_RETAINED, Unit::Bytes, "WAL the server keeps for the log relay's slot");
        describe_gauge!(
            LOG_CONFIRMED_AGE,
            Unit::Seconds,
            "Time since the log relay confirmed a position while lagging"
        );
        describe_counter!(CONSUMER_PROCESSED, Unit::Count, "Messages whose effect ran and committed");
        describe_counter!(CONSUMER_DUPLICATES, Unit::Count, "Messages the inbox had seen already");
        describe_counter!(CONSUMER_RETRIED, Unit::Count, "Failed handler attempts retried in place");
        describe_counter!(CONSUMER_DEAD_LETTERED, Unit::Count, "Messages confirmed in the dead-letter destination");
        describe_gauge!(CONSUMER_DEAD_LETTERS, Unit::Count, "Dead letters waiting in the dead-letter destination");
        describe_gauge!(CONSUMER_LAG, Unit::Count, "Messages at the broker this consumer has not acknowledged");
        describe_counter!(CONSUMER_SKIPPED, Unit::Count, "Messages with no handler here, acked untouched");
        describe_histogram!(CONSUMER_HANDLER_DURATION, Unit::Seconds, "One handler attempt, inbox check included");
    }
}

/// Gauge, bytes: the log relay's replication slot, WAL after its confirmed position.
pub const LOG_SLOT_LAG: &str = "outbox_log_slot_lag_bytes";
/// Gauge, bytes: WAL the server keeps for the log relay's slot.
pub const LOG_SLOT_RETAINED: &str = "outbox_log_slot_retained_bytes";
/// Gauge, seconds: time since the log relay last confirmed a position while its slot lagged.
pub const LOG_CONFIRMED_AGE: &str = "outbox_log_confirmed_age_seconds";

/// A sample of the log relay's slot, as gauges labelled with the slot's name.
pub fn log_slot(slot: &str, lag_bytes: u64, retained_bytes: u64, confirmed_age: Duration) {
    #[cfg(feature = "metrics")]
    {
        let slot = slot.to_owned();
        ::metrics::gauge!(LOG_SLOT_LAG, "slot" => slot.clone()).set(lag_bytes as f64);
        ::metrics::gauge!(LOG_SLOT_RETAINED, "slot" => slot.clone()).set(retained_bytes as f64);
        ::metrics::gauge!(LOG_CONFIRMED_AGE, "slot" => slot).set(confirmed_age.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (slot, lag_bytes, retained_bytes, confirmed_age);
}

/// What one relay pass did, as counters (public for relays outside this crate: the log relay of
/// `outbox-seaorm` records its windows through it).
pub fn relay_pass(pass: &crate::RelayPass) {
    #[cfg(feature = "metrics")]
    {
        use ::metrics::counter;
        counter!(EVENTS_PUBLISHED).increment(pass.published);
        counter!(EVENTS_FAILED).increment(pass.failed);
        counter!(EVENTS_DEAD).increment(pass.dead);
        counter!(EVENTS_RELEASED).increment(pass.released);
        counter!(EVENTS_FENCED).increment(pass.fenced);
        if pass.claimed > 0 {
            ::metrics::histogram!(RELAY_BATCH_SIZE).record(pass.claimed as f64);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = pass;
}

/// A relay pass that failed.
pub(crate) fn relay_pass_failed() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(RELAY_PASS_FAILURES).increment(1);
}

/// How long a claim took.
pub(crate) fn claim_duration(took: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(CLAIM_DURATION).record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = took;
}

/// How long a publish call took.
pub fn publish_duration(took: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(PUBLISH_DURATION).record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = took;
}

/// Commit → confirmation of one event, confirmed at `confirmed_at`.
pub fn publish_latency(event: &crate::OutboxEvent, confirmed_at: chrono::DateTime<chrono::Utc>) {
    #[cfg(feature = "metrics")]
    {
        let latency = (confirmed_at - event.created_at).to_std().unwrap_or(Duration::ZERO);
        ::metrics::histogram!(PUBLISH_LATENCY).record(latency.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (event, confirmed_at);
}

/// A stats sample, as gauges.
pub(crate) fn stats_sample(stats: &crate::store::OutboxStats) {
    #[cfg(feature = "metrics")]
    {
        use ::metrics::gauge;
        gauge!(PENDING_EVENTS).set(stats.pending as f64);
        gauge!(DEAD_EVENTS).set(stats.dead as f64);
        gauge!(OLDEST_PENDING_AGE).set(stats.oldest_pending_seconds as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = stats;
}

/// What happened to one message in the consume driver.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Consumed {
    Processed,
    Duplicate,
    Retried,
}

/// One message of a handled event type, by outcome.
pub(crate) fn consumed(consumer: &str, event_type: &str, outcome: Consumed) {
    #[cfg(feature = "metrics")]
    {
        let name = match outcome {
            Consumed::Processed => CONSUMER_PROCESSED,
            Consumed::Duplicate => CONSUMER_DUPLICATES,
            Consumed::Retried => CONSUMER_RETRIED,
        };
        ::metrics::counter!(name, LABEL_CONSUMER => consumer.to_owned(), LABEL_EVENT_TYPE => event_type.to_owned())
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (consumer, event_type, outcome);
}

/// One message dead-lettered (`true`) or skipped (`false`), counted by consumer only.
pub(crate) fn consumer_dead_lettered_or_skipped(consumer: &str, dead_lettered: bool) {
    #[cfg(feature = "metrics")]
    {
        let name = if dead_lettered { CONSUMER_DEAD_LETTERED } else { CONSUMER_SKIPPED };
        ::metrics::counter!(name, LABEL_CONSUMER => consumer.to_owned()).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (consumer, dead_lettered);
}

/// How many messages one consumer has not acknowledged, as its broker counts them.
pub(crate) fn consumer_lag(consumer: &str, messages: u64) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(CONSUMER_LAG, LABEL_CONSUMER => consumer.to_owned()).set(messages as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = (consumer, messages);
}

/// The dead letters of one consumer, as counted at the broker.
pub(crate) fn consumer_dead_letters(consumer: &str, count: u64) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(CONSUMER_DEAD_LETTERS, LABEL_CONSUMER => consumer.to_owned()).set(count as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = (consumer, count);
}

/// One handler attempt's duration.
pub(crate) fn handler_duration(consumer: &str, event_type: &str, took: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(CONSUMER_HANDLER_DURATION, LABEL_CONSUMER => consumer.to_owned(), LABEL_EVENT_TYPE => event_type.to_owned())
        .record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (consumer, event_type, took);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_prefixed_and_in_prometheus_units() {
        let mut seen = std::collections::BTreeSet::new();
        for name in ALL {
            assert!(seen.insert(*name), "{name} twice");
            assert!(name.starts_with("outbox_"), "{name}");
            assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{name}");
        }
        for duration in
            [CLAIM_DURATION, PUBLISH_DURATION, PUBLISH_LATENCY, OLDEST_PENDING_AGE, CONSUMER_HANDLER_DURATION]
        {
            assert!(duration.ends_with("_seconds"), "{duration}");
        }
        let counters =
            [EVENTS_PUBLISHED, EVENTS_FAILED, EVENTS_DEAD, EVENTS_RELEASED, EVENTS_FENCED, RELAY_PASS_FAILURES];
        let consumer =
            [CONSUMER_PROCESSED, CONSUMER_DUPLICATES, CONSUMER_RETRIED, CONSUMER_DEAD_LETTERED, CONSUMER_SKIPPED];
        for counter in counters.into_iter().chain(consumer) {
            assert!(counter.ends_with("_total"), "{counter}");
        }
    }
}

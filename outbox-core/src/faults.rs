//! Fault injection around any publisher, to replay outages and lost acks against a real broker.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::envelope::OutboxEvent;
use crate::publisher::{PublishError, Publisher};

#[derive(Default)]
struct Faults {
    down_for: u32,
    lost_acks: u32,
}

/// Wraps a publisher: [`FaultyPublisher::go_down_for`] rejects the next `n` events without sending them
/// (an outage); [`FaultyPublisher::lose_acks`] sends the next `n` events but reports them failed (the
/// broker has them, the relay does not know, so they are published again). Clones share the faults.
#[derive(Clone)]
pub struct FaultyPublisher<P> {
    inner: P,
    faults: Arc<Mutex<Faults>>,
}

impl<P: Publisher> FaultyPublisher<P> {
    /// A healthy wrapper around `inner`.
    pub fn new(inner: P) -> Self {
        FaultyPublisher { inner, faults: Arc::default() }
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Rejects the next `events` events with "broker unavailable", without sending them.
    pub fn go_down_for(&self, events: u32) {
        self.faults().down_for = events;
    }

    /// Sends the next `events` events but reports "ack timeout" for each.
    pub fn lose_acks(&self, events: u32) {
        self.faults().lost_acks = events;
    }

    /// The wrapped publisher.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: Publisher> Publisher for FaultyPublisher<P> {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let rejected = {
            let mut faults = self.faults();
            let rejected = (faults.down_for as usize).min(events.len());
            faults.down_for -= rejected as u32;
            rejected
        };
        let mut results = vec![Err(PublishError::transient("broker unavailable")); rejected];
        if rejected < events.len() {
            let sent = self.inner.publish(&events[rejected..]).await;
            let mut faults = self.faults();
            for result in sent {
                if result.is_ok() && faults.lost_acks > 0 {
                    faults.lost_acks -= 1;
                    results.push(Err(PublishError::transient("ack timeout")));
                } else {
                    results.push(result);
                }
            }
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemoryPublisher;
    use crate::envelope::EventId;

    fn events(n: usize) -> Vec<OutboxEvent> {
        (0..n)
            .map(|i| OutboxEvent {
                seq: i as i64,
                aggregate_version: 1,
                id: EventId::new(),
                aggregate_type: "order".into(),
                aggregate_id: format!("o{i}"),
                event_type: "order.placed".into(),
                schema_version: 1,
                payload: "{}".into(),
                headers: Default::default(),
                created_at: chrono::Utc::now(),
                attempts: 0,
                last_error: None,
            })
            .collect()
    }

    #[tokio::test]
    async fn an_outage_sends_nothing_and_lost_acks_send_but_report_failure() {
        let broker = InMemoryPublisher::new();
        let faulty = FaultyPublisher::new(broker.clone());
        faulty.go_down_for(2);
        faulty.lose_acks(1);
        let results = faulty.publish(&events(4)).await;
        let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [false, false, false, true]);
        assert_eq!(results[0].as_ref().unwrap_err().message(), "broker unavailable");
        assert_eq!(results[2].as_ref().unwrap_err().message(), "ack timeout");
        assert_eq!(broker.received_count(), 2, "the outage sent nothing; the lost ack was sent");
    }
}

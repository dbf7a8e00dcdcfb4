//! An in-memory broker with fault knobs, for tests of the relay and for the lab. Never the only test of a
//! real broker adapter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::envelope::OutboxEvent;
use crate::publisher::{PublishError, Publisher};

#[derive(Default)]
struct State {
    log: Vec<OutboxEvent>,
    down_for: u32,
    lost_acks: u32,
    delay: Duration,
    failing_aggregates: HashMap<String, u32>,
    calls: u64,
}

/// A broker that keeps every message it received in a log.
///
/// Faults are counted per message, as in the seed lab: [`InMemoryPublisher::go_down_for`] rejects the next
/// `n` messages without receiving them; [`InMemoryPublisher::lose_acks`] receives the next `n` messages but
/// reports them failed (the broker has them, the relay does not know: at-least-once makes a duplicate).
/// Clones share the same broker.
#[derive(Clone, Default)]
pub struct InMemoryPublisher {
    state: Arc<Mutex<State>>,
}

impl InMemoryPublisher {
    /// An empty, healthy broker.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain data behind; keep going with it.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Rejects the next `messages` messages with "broker unavailable".
    pub fn go_down_for(&self, messages: u32) {
        self.state().down_for = messages;
    }

    /// Receives the next `messages` messages but reports "ack timeout" for each.
    pub fn lose_acks(&self, messages: u32) {
        self.state().lost_acks = messages;
    }

    /// Waits this long in every publish call.
    pub fn set_delay(&self, delay: Duration) {
        self.state().delay = delay;
    }

    /// Rejects the next `times` messages of this aggregate.
    pub fn fail_aggregate(&self, aggregate_id: impl Into<String>, times: u32) {
        self.state().failing_aggregates.insert(aggregate_id.into(), times);
    }

    /// Every message received so far, in arrival order (duplicates included).
    pub fn received(&self) -> Vec<OutboxEvent> {
        self.state().log.clone()
    }

    /// How many messages were received.
    pub fn received_count(&self) -> usize {
        self.state().log.len()
    }

    /// How many times `publish` was called.
    pub fn publish_calls(&self) -> u64 {
        self.state().calls
    }

    /// Forgets the log (faults stay as set).
    pub fn clear(&self) {
        self.state().log.clear();
    }
}

impl Publisher for InMemoryPublisher {
    fn system(&self) -> &'static str {
        "memory"
    }

    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        let delay = {
            let mut state = self.state();
            state.calls += 1;
            state.delay
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut state = self.state();
        events
            .iter()
            .map(|event| {
                if state.down_for > 0 {
                    state.down_for -= 1;
                    return Err(PublishError::transient("broker unavailable"));
                }
                if let Some(left) = state.failing_aggregates.get_mut(&event.aggregate_id)
                    && *left > 0
                {
                    *left -= 1;
                    return Err(PublishError::transient(format!("broker rejected aggregate {}", event.aggregate_id)));
                }
                state.log.push(event.clone());
                if state.lost_acks > 0 {
                    state.lost_acks -= 1;
                    return Err(PublishError::transient("ack timeout"));
                }
                Ok(())
            })
            .collect()
    }
}

//! Keeping stream order when deliveries were lost: at start, after a reconnect or a failed fetch, the
//! server may count unacknowledged deliveries this transport never received (lost in flight, or left by
//! a process that stopped without releasing them). JetStream redelivers them only after `ack_wait`, and
//! then ahead of newer messages; until they are back, newer messages fetched meanwhile wait in a stash.
//!
//! [`Recovery`] is the state and its rules, with no I/O: the transport asks the server and reports here.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::consume::Delivery;

/// How long after `ack_wait` recovery lasts at most, for the server's redelivery timer.
const REDELIVERY_MARGIN: Duration = Duration::from_millis(500);

/// The recovery state of one transport, for deliveries with receipts `R`.
pub(super) struct Recovery<R> {
    state: Mutex<State<R>>,
}

struct State<R> {
    /// The client's connect count at the last check.
    connects: u64,
    /// A fetch failed or timed out: something may have been delivered and lost.
    suspect: bool,
    /// Recovering until then at most: only redeliveries go to the driver.
    until: Option<Instant>,
    /// New messages fetched while recovering, in stream order, held back until recovery ends.
    stash: VecDeque<Delivery<R>>,
}

impl<R> Recovery<R> {
    /// A transport starts suspicious: a previous process may have left deliveries unacknowledged.
    pub(super) fn new(connects: u64) -> Self {
        Recovery { state: Mutex::new(State { connects, suspect: true, until: None, stash: VecDeque::new() }) }
    }

    fn lock(&self) -> MutexGuard<'_, State<R>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Something may have been delivered and not received: check before the next fetch.
    pub(super) fn suspect(&self) {
        self.lock().suspect = true;
    }

    /// Whether the server's count of unacknowledged deliveries must be read before the next fetch
    /// (recovering, suspect, or reconnected since the last check, given the client's `connects` count).
    /// Ends a recovery that outlasted its limit.
    pub(super) fn needs_check(&self, connects: u64, consumer: &str) -> bool {
        let mut state = self.lock();
        if state.until.is_some_and(|until| Instant::now() >= until) {
            state.until = None;
            tracing::info!(consumer, stashed = state.stash.len(), "recovery ended after ack_wait");
        }
        state.until.is_some() || state.suspect || state.connects != connects
    }

    /// Takes the server's answer to a check: it counts `unacknowledged` deliveries while the transport
    /// holds `held`. More means some were lost: recovery starts (for `ack_wait` plus a margin at most);
    /// not more ends it. Returns whether the next fetch is a recovering one.
    pub(super) fn checked(
        &self,
        connects: u64,
        unacknowledged: usize,
        held: usize,
        ack_wait: Duration,
        consumer: &str,
    ) -> bool {
        let mut state = self.lock();
        state.suspect = false;
        state.connects = connects;
        let lost = unacknowledged > held;
        match (lost, state.until) {
            (true, None) => {
                let limit = ack_wait + REDELIVERY_MARGIN;
                state.until = Some(Instant::now() + limit);
                tracing::warn!(
                    messaging.system = "nats",
                    consumer,
                    unacknowledged,
                    held,
                    ?limit,
                    "the server has unacknowledged deliveries this transport does not hold (lost in flight, or left by a consumer that stopped): newer messages wait until they are redelivered"
                );
            }
            (false, Some(_)) => {
                state.until = None;
                tracing::info!(consumer, stashed = state.stash.len(), "every lost delivery is back; recovery ended");
            }
            _ => {}
        }
        state.until.is_some()
    }

    /// Whether new messages wait in the stash (a recovering fetch then asks for one message at a time).
    pub(super) fn stashed(&self) -> bool {
        !self.lock().stash.is_empty()
    }

    /// Up to `max` stashed messages, oldest first (for a fetch once recovery ended).
    pub(super) fn take_stash(&self, max: usize) -> Vec<Delivery<R>> {
        let mut state = self.lock();
        let n = max.min(state.stash.len());
        state.stash.drain(..n).collect()
    }

    /// The redeliveries of a recovering fetch; its new messages go to the stash.
    pub(super) fn sort_recovered(&self, batch: Vec<Delivery<R>>) -> Vec<Delivery<R>> {
        let mut state = self.lock();
        let mut out = Vec::new();
        for delivery in batch {
            if delivery.deliveries > 1 {
                out.push(delivery);
            } else {
                state.stash.push_back(delivery);
            }
        }
        out
    }

    /// Empties the stash, for handing its messages back.
    pub(super) fn drain(&self) -> Vec<R> {
        self.lock().stash.drain(..).map(|delivery| delivery.receipt).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(receipt: u32, deliveries: u32) -> Delivery<u32> {
        Delivery { headers: Default::default(), payload: Vec::new(), origin: String::new(), deliveries, receipt }
    }

    #[test]
    fn new_messages_wait_in_the_stash_until_lost_deliveries_are_back() {
        let recovery = Recovery::new(1);
        assert!(recovery.needs_check(1, "c"), "a fresh transport checks before its first fetch");
        assert!(recovery.checked(1, 2, 0, Duration::from_secs(30), "c"), "the server counts deliveries nobody holds");
        let handed = recovery.sort_recovered(vec![delivery(1, 2), delivery(2, 1), delivery(3, 1)]);
        assert_eq!(handed.iter().map(|d| d.receipt).collect::<Vec<_>>(), [1]);
        assert!(recovery.stashed());
        assert!(recovery.needs_check(1, "c"), "checks again while recovering");
        assert!(!recovery.checked(1, 3, 3, Duration::from_secs(30), "c"), "everything unacknowledged is held");
        assert!(!recovery.needs_check(1, "c"));
        assert!(recovery.needs_check(2, "c"), "a reconnect calls for a check");
        assert_eq!(recovery.take_stash(1).iter().map(|d| d.receipt).collect::<Vec<_>>(), [2]);
        assert_eq!(recovery.drain(), [3]);
    }
}

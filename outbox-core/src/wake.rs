//! In-process wake-ups: a commit that wrote outbox rows tells the relays of this process to look now,
//! instead of at their next poll.
//!
//! One process-wide counter in a [`tokio::sync::watch`] channel: [`wake_relays`] bumps it, and every relay
//! remembers the value it saw before its last pass. A relay that finds the value changed when it is about
//! to sleep passes again at once, so a wake-up that arrives while a relay is busy is never lost. Polling
//! stays the fallback for everything a signal cannot see: other processes (unless a listener such as
//! `outbox_seaorm::notify::NotifyListener` turns their PostgreSQL notifications into [`wake_relays`]
//! calls), a missed or early signal, rows whose backoff ends.

use std::sync::LazyLock;

use tokio::sync::watch;

static SIGNAL: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::Sender::new(0));

/// Tells every relay in this process that new outbox rows have committed: an idle relay starts a pass
/// at once instead of at its next `poll_interval`. Cheap (no allocation, no lock held), safe to call
/// from any thread, and a no-op when no relay runs.
///
/// Call it *after* the commit: a relay woken before the rows are visible finds nothing and goes back to
/// its poll. `outbox_seaorm::enqueue` and `#[transactional_outbox]` call it for you.
pub fn wake_relays() {
    SIGNAL.send_modify(|generation| *generation = generation.wrapping_add(1));
}

/// One relay's view of the signal.
pub(crate) struct WakeListener {
    receiver: watch::Receiver<u64>,
}

impl WakeListener {
    /// A listener that has seen every wake-up so far.
    pub(crate) fn new() -> Self {
        WakeListener { receiver: SIGNAL.subscribe() }
    }

    /// Marks every wake-up so far as seen: called right before a pass, which will see their rows.
    pub(crate) fn mark_seen(&mut self) {
        self.receiver.borrow_and_update();
    }

    /// Resolves at the first wake-up not yet seen (at once if one came during the last pass).
    pub(crate) async fn woken(&mut self) {
        if self.receiver.changed().await.is_err() {
            // The sender is a static and never drops; should it ever, the poll still runs.
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_up_during_a_pass_is_not_lost() {
        let mut listener = WakeListener::new();
        listener.mark_seen();
        wake_relays(); // while the relay is "busy"
        tokio::time::timeout(Duration::from_millis(100), listener.woken()).await.expect("the wake-up was kept");
        listener.mark_seen();
        let idle = tokio::time::timeout(Duration::from_millis(50), listener.woken()).await;
        assert!(idle.is_err(), "no new wake-up, so the listener keeps sleeping");
    }
}

//! What a transport holds for the driver and must keep alive at a broker with a redelivery deadline, and the
//! one task that keeps it alive ([`keep_held_alive`]): every message from its fetch to its ack or release,
//! whether the driver is handling it, queues it behind its aggregate, or waits out a retry.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// Messages handed to the driver and not acked or released yet, with when each was last kept alive.
#[derive(Debug)]
pub(crate) struct HeldSet<K, V> {
    inner: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K, V> Default for HeldSet<K, V> {
    fn default() -> Self {
        HeldSet { inner: Mutex::new(HashMap::new()) }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> HeldSet<K, V> {
    fn lock(&self) -> MutexGuard<'_, HashMap<K, (V, Instant)>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `key`, kept alive as of now.
    pub(crate) fn insert(&self, key: K, value: V) {
        self.lock().insert(key, (value, Instant::now()));
    }

    /// Stops holding `key` (acked or released).
    pub(crate) fn remove(&self, key: &K) {
        self.lock().remove(key);
    }

    /// Whether `key` is held.
    #[cfg(any(test, feature = "redis"))]
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.lock().contains_key(key)
    }

    /// How many messages are held.
    #[cfg(any(test, feature = "nats"))]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// The held messages not kept alive within `every`, marked kept alive now (the caller sends the
    /// keep-alives).
    pub(crate) fn due(&self, every: Duration) -> Vec<(K, V)> {
        let now = Instant::now();
        self.lock()
            .iter_mut()
            .filter(|(_, (_, touched))| now.duration_since(*touched) >= every)
            .map(|(key, (value, touched))| {
                *touched = now;
                (key.clone(), value.clone())
            })
            .collect()
    }
}

/// The broker side of keeping held messages alive (NATS progress acks, Redis idle-time resets).
pub(crate) trait KeepAlive: Send + Sync + 'static {
    /// What identifies a held message to the transport.
    type Key: Hash + Eq + Clone + Send;
    /// What the keep-alive needs of it (a NATS reply subject; nothing for Redis).
    type Value: Clone + Send;

    /// The held messages.
    fn held(&self) -> &HeldSet<Self::Key, Self::Value>;

    /// Tells the broker the `due` messages are still being worked on; the first error ends the round.
    fn keep_alive(&self, due: Vec<(Self::Key, Self::Value)>) -> impl Future<Output = Result<(), String>> + Send;
}

/// Keeps every message `shared` holds alive until `stop`: every half of `every`, the messages not kept
/// alive within `every` go to [`KeepAlive::keep_alive`]. A failure is logged at debug level and retried next
/// round: the broker may then redeliver the message, and the inbox absorbs the copy.
pub(crate) async fn keep_held_alive<S: KeepAlive>(shared: Arc<S>, every: Duration, stop: CancellationToken) {
    let tick = every / 2;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(tick) => {}
        }
        let due = shared.held().due(every);
        if !due.is_empty()
            && let Err(error) = shared.keep_alive(due).await
        {
            tracing::debug!(%error, "keeping held messages alive failed; the broker may redeliver one (the inbox absorbs it)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_messages_not_kept_alive_lately_are_due() {
        let held = HeldSet::default();
        held.insert(1, "a");
        assert!(held.due(Duration::from_secs(60)).is_empty());
        assert_eq!(held.due(Duration::ZERO), vec![(1, "a")]);
        held.remove(&1);
        assert_eq!((held.len(), held.contains(&1)), (0, false));
    }
}

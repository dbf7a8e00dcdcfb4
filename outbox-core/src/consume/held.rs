//! What a transport holds for the driver and must keep alive at a broker with a redelivery deadline.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

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

    /// Records that `key` was just kept alive.
    pub(crate) fn touch(&self, key: &K) {
        if let Some((_, touched)) = self.lock().get_mut(key) {
            *touched = Instant::now();
        }
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

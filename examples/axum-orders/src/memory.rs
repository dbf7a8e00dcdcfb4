//! The default broker: the library's [`InMemoryPublisher`] receives what the relay publishes, and
//! [`InMemoryTransport`] hands its log to billing through the same consume driver (decode, route, inbox,
//! ack after commit) that a NATS transport feeds. One process only, nothing survives a restart.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use outbox_seaorm::broker::envelope_headers;
use outbox_seaorm::consume::{DeadLetter, Delivery, Transport};
use outbox_seaorm::{InMemoryPublisher, Result};

/// How often an idle fetch looks at the log again.
const POLL: Duration = Duration::from_millis(20);

/// Delivers an [`InMemoryPublisher`]'s messages in arrival order, duplicates included (a lost ack makes
/// the relay publish an event again, and billing's inbox drops it). The receipt is the message's
/// position in the log. Clones share the same cursor and counts.
#[derive(Clone)]
pub struct InMemoryTransport {
    inner: Arc<Inner>,
}

struct Inner {
    broker: InMemoryPublisher,
    /// Position of the first message not yet delivered.
    next: Mutex<usize>,
    /// Messages released by the driver (shutdown), delivered again before new ones.
    released: Mutex<VecDeque<usize>>,
    acked: AtomicUsize,
    dead: Mutex<Vec<DeadLetter>>,
}

impl InMemoryTransport {
    /// Delivers what `broker` (a clone of the relay's publisher) receives from now on.
    pub fn new(broker: InMemoryPublisher) -> Self {
        let next = Mutex::new(broker.received_count());
        let inner =
            Inner { broker, next, released: Mutex::default(), acked: AtomicUsize::new(0), dead: Mutex::default() };
        Self { inner: Arc::new(inner) }
    }

    /// Messages acked so far: applied, absorbed by the inbox as duplicates, skipped or dead-lettered.
    pub fn acked(&self) -> usize {
        self.inner.acked.load(Ordering::SeqCst)
    }

    /// Messages the driver gave up on, with the reason.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        lock(&self.inner.dead).clone()
    }

    fn take(&self, max: usize) -> Vec<Delivery<usize>> {
        let log = self.inner.broker.received();
        let mut released = lock(&self.inner.released);
        let returned = max.min(released.len());
        let mut positions: Vec<usize> = released.drain(..returned).collect();
        let mut next = lock(&self.inner.next);
        while positions.len() < max && *next < log.len() {
            positions.push(*next);
            *next += 1;
        }
        positions
            .into_iter()
            .filter_map(|at| {
                let event = log.get(at)?;
                Some(Delivery {
                    headers: envelope_headers(event).into_iter().collect(),
                    payload: event.payload.clone().into_bytes(),
                    origin: event.event_type.clone(),
                    deliveries: 1,
                    receipt: at,
                })
            })
            .collect()
    }
}

impl Transport for InMemoryTransport {
    type Receipt = usize;

    fn broker(&self) -> &'static str {
        "in-memory"
    }

    fn source(&self) -> String {
        "the InMemoryPublisher's log".to_owned()
    }

    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery<usize>>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let batch = self.take(max);
            if !batch.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(batch);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn ack(&self, _: &usize) -> Result<()> {
        self.inner.acked.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn release(&self, at: &usize) -> Result<()> {
        lock(&self.inner.released).push_back(*at);
        Ok(())
    }

    async fn dead_letter(&self, _: &Delivery<usize>, letter: &DeadLetter) -> Result<()> {
        tracing::error!(reason = %letter.reason, attempts = letter.attempts, "dead letter");
        lock(&self.inner.dead).push(letter.clone());
        Ok(())
    }
}

/// A panic while holding one of these locks leaves plain data behind; keep going with it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

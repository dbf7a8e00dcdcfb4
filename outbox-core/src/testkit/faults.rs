//! A publisher wrapper that injects broker faults, counted per event or drawn at a rate from a seeded RNG.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::envelope::OutboxEvent;
use crate::publisher::{PublishError, Publisher};

/// How [`FaultyPublisher`] orders the events of one call before it hands them to the wrapped publisher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reorder {
    /// In the relay's order.
    #[default]
    Keep,
    /// Shuffled within each call (seeded). Legal: the relay never puts two events of one aggregate in one
    /// call, so a correct consumer must not notice. (To break per-aggregate order on purpose, see
    /// [`FaultyPublisher::hold_back_next`].)
    WithinCall,
}

/// Counts of what [`FaultyPublisher`] did, per event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultCounts {
    /// Events handed to the wrapped publisher (duplicates and held-back events included).
    pub sent: u64,
    /// Events rejected without sending (outage, fail-N, fail rate).
    pub failed: u64,
    /// Events sent whose confirmation was replaced by a failure (lost ack).
    pub lost_acks: u64,
    /// Events confirmed but never sent: a *loss* the relay cannot see.
    pub dropped: u64,
    /// Events sent twice.
    pub duplicated: u64,
    /// Events held back by [`FaultyPublisher::hold_back_next`].
    pub held_back: u64,
}

struct Faults {
    down_for: u32,
    lost_acks: u32,
    drop_next: u32,
    duplicate_next: u32,
    hold_next: u32,
    fail_rate: f64,
    lost_ack_rate: f64,
    drop_rate: f64,
    duplicate_rate: f64,
    delay: Duration,
    reorder: Reorder,
    held: VecDeque<OutboxEvent>,
    rng: StdRng,
    counts: FaultCounts,
}

impl Faults {
    fn new(seed: u64) -> Self {
        Faults {
            down_for: 0,
            lost_acks: 0,
            drop_next: 0,
            duplicate_next: 0,
            hold_next: 0,
            fail_rate: 0.0,
            lost_ack_rate: 0.0,
            drop_rate: 0.0,
            duplicate_rate: 0.0,
            delay: Duration::ZERO,
            reorder: Reorder::Keep,
            held: VecDeque::new(),
            rng: StdRng::seed_from_u64(seed),
            counts: FaultCounts::default(),
        }
    }

    /// Takes one from a per-event counter, else draws at `rate`.
    fn take(counter: &mut u32, rate: f64, rng: &mut StdRng) -> bool {
        if *counter > 0 {
            *counter -= 1;
            return true;
        }
        rate > 0.0 && rng.random_bool(rate)
    }
}

/// What happens to one event of a call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Fail,
    Drop,
    Hold,
    Send { twice: bool },
}

/// Wraps any publisher (the in-memory one or a real broker adapter) and injects faults.
///
/// - **fail**: [`go_down_for(n)`](Self::go_down_for) rejects the next `n` events without sending them
///   (an outage, or "fail N times"); [`set_fail_rate`](Self::set_fail_rate) rejects each event with a
///   probability. The relay retries them.
/// - **lose acks**: [`lose_acks(n)`](Self::lose_acks) / [`set_lost_ack_rate`](Self::set_lost_ack_rate)
///   send the event but report it failed: the broker has it, the relay publishes it again (a duplicate
///   the consumer's inbox must absorb).
/// - **duplicate**: [`duplicate_next`](Self::duplicate_next) / [`set_duplicate_rate`](Self::set_duplicate_rate)
///   send the event twice and report it confirmed.
/// - **delay**: [`set_delay`](Self::set_delay) waits before every call (a slow broker).
/// - **reorder**: [`set_reorder`](Self::set_reorder), see [`Reorder`], shuffles within a call (legal);
///   [`hold_back_next`](Self::hold_back_next) confirms events at once but sends them after the next call's
///   events, so an aggregate's next event overtakes them (an order violation, on purpose).
/// - **drop**: [`drop_next`](Self::drop_next) / [`set_drop_rate`](Self::set_drop_rate) report the event
///   confirmed *without sending it*. No outbox can recover from a broker that does this; the fault
///   exists to prove that a [`History`](super::History) check reports the loss.
///
/// Rates are drawn from one RNG seeded by [`with_seed`](Self::with_seed) (0 by default), so a run
/// replays. Per-event counters are used up before rates are drawn. Clones share faults and counts.
#[derive(Clone)]
pub struct FaultyPublisher<P> {
    inner: P,
    faults: Arc<Mutex<Faults>>,
}

impl<P: Publisher> FaultyPublisher<P> {
    /// A healthy wrapper around `inner`, with RNG seed 0.
    pub fn new(inner: P) -> Self {
        FaultyPublisher { inner, faults: Arc::new(Mutex::new(Faults::new(0))) }
    }

    /// Reseeds the RNG that draws rates and shuffles.
    pub fn with_seed(self, seed: u64) -> Self {
        self.faults().rng = StdRng::seed_from_u64(seed);
        self
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

    /// Confirms the next `events` events without sending them (a loss).
    pub fn drop_next(&self, events: u32) {
        self.faults().drop_next = events;
    }

    /// Sends each of the next `events` events twice.
    pub fn duplicate_next(&self, events: u32) {
        self.faults().duplicate_next = events;
    }

    /// Confirms the next `events` events at once but holds them back: they are sent after the events of
    /// the next call, so the next event of their aggregate reaches the broker first (an order violation a
    /// checker must report). [`flush_held`](Self::flush_held) sends what is still held.
    pub fn hold_back_next(&self, events: u32) {
        self.faults().hold_next = events;
    }

    /// Rejects each event with probability `rate` (clamped to 0..=1) without sending it.
    pub fn set_fail_rate(&self, rate: f64) {
        self.faults().fail_rate = clamp(rate);
    }

    /// Sends each event but reports it failed with probability `rate`.
    pub fn set_lost_ack_rate(&self, rate: f64) {
        self.faults().lost_ack_rate = clamp(rate);
    }

    /// Confirms each event without sending it with probability `rate` (a loss).
    pub fn set_drop_rate(&self, rate: f64) {
        self.faults().drop_rate = clamp(rate);
    }

    /// Sends each event twice with probability `rate`.
    pub fn set_duplicate_rate(&self, rate: f64) {
        self.faults().duplicate_rate = clamp(rate);
    }

    /// Waits this long before every call.
    pub fn set_delay(&self, delay: Duration) {
        self.faults().delay = delay;
    }

    /// How events of one call are ordered, see [`Reorder`].
    pub fn set_reorder(&self, reorder: Reorder) {
        self.faults().reorder = reorder;
    }

    /// What the faults did so far.
    pub fn counts(&self) -> FaultCounts {
        self.faults().counts
    }

    /// Sends the events [`hold_back_next`](Self::hold_back_next) still holds; returns how many were sent.
    pub async fn flush_held(&self) -> usize {
        let held: Vec<OutboxEvent> = self.faults().held.drain(..).collect();
        if held.is_empty() {
            return 0;
        }
        let sent = self.inner.publish(&held).await.iter().filter(|r| r.is_ok()).count();
        self.faults().counts.sent += held.len() as u64;
        sent
    }

    /// The wrapped publisher.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

fn clamp(rate: f64) -> f64 {
    if rate.is_nan() { 0.0 } else { rate.clamp(0.0, 1.0) }
}

impl<P: Publisher> Publisher for FaultyPublisher<P> {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), PublishError>> {
        // Decide every event's fate under the lock, then send without it.
        let (delay, fates, order, released) = {
            let mut guard = self.faults();
            let f = &mut *guard;
            let mut fates = Vec::with_capacity(events.len());
            for _ in events {
                let fate = if Faults::take(&mut f.down_for, f.fail_rate, &mut f.rng) {
                    Fate::Fail
                } else if Faults::take(&mut f.drop_next, f.drop_rate, &mut f.rng) {
                    Fate::Drop
                } else if Faults::take(&mut f.hold_next, 0.0, &mut f.rng) {
                    Fate::Hold
                } else {
                    Fate::Send { twice: Faults::take(&mut f.duplicate_next, f.duplicate_rate, &mut f.rng) }
                };
                fates.push(fate);
            }
            let mut order: Vec<usize> = (0..events.len()).filter(|&i| matches!(fates[i], Fate::Send { .. })).collect();
            if f.reorder == Reorder::WithinCall {
                order.shuffle(&mut f.rng);
            }
            // Held-back events of earlier calls go out after this call's events.
            let released: Vec<OutboxEvent> = f.held.drain(..).collect();
            for (i, fate) in fates.iter().enumerate() {
                match fate {
                    Fate::Fail => f.counts.failed += 1,
                    Fate::Drop => f.counts.dropped += 1,
                    Fate::Hold => {
                        f.counts.held_back += 1;
                        f.held.push_back(events[i].clone());
                    }
                    Fate::Send { twice } => f.counts.duplicated += u64::from(*twice),
                }
            }
            (f.delay, fates, order, released)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }

        let mut batch: Vec<OutboxEvent> = Vec::new();
        let mut slots: Vec<Option<usize>> = Vec::new(); // the input index whose result a sent copy gives
        for &i in &order {
            batch.push(events[i].clone());
            slots.push(Some(i));
            if fates[i] == (Fate::Send { twice: true }) {
                batch.push(events[i].clone());
                slots.push(None);
            }
        }
        batch.extend(released.iter().cloned());
        slots.extend(released.iter().map(|_| None));

        let mut results: Vec<Result<(), PublishError>> = fates
            .iter()
            .map(|fate| match fate {
                Fate::Fail => Err(PublishError::transient("broker unavailable")),
                Fate::Drop | Fate::Hold | Fate::Send { .. } => Ok(()),
            })
            .collect();
        if batch.is_empty() {
            return results;
        }
        let sent = self.inner.publish(&batch).await;
        let mut guard = self.faults();
        let f = &mut *guard;
        f.counts.sent += batch.len() as u64;
        for (slot, result) in slots.into_iter().zip(sent) {
            let Some(i) = slot else { continue };
            results[i] = match result {
                Ok(()) if Faults::take(&mut f.lost_acks, f.lost_ack_rate, &mut f.rng) => {
                    f.counts.lost_acks += 1;
                    Err(PublishError::transient("ack timeout"))
                }
                other => other,
            };
        }
        results
    }

    fn system(&self) -> &'static str {
        self.inner.system()
    }

    fn destination_name(&self, event: &OutboxEvent) -> Option<String> {
        self.inner.destination_name(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemoryPublisher;
    use crate::envelope::{EventId, NewEvent};

    /// `n` events of `n` different aggregates (as the relay sends them), each at version `version`.
    fn events(n: usize, version: i64) -> Vec<OutboxEvent> {
        (0..n)
            .map(|i| {
                let event = NewEvent::new("order", format!("o{i}"), "order.placed", &serde_json::json!({})).unwrap();
                super::super::outbox_event(&event, i as i64, version)
            })
            .collect()
    }

    fn oks(results: &[Result<(), PublishError>]) -> Vec<bool> {
        results.iter().map(Result::is_ok).collect()
    }

    #[tokio::test]
    async fn an_outage_sends_nothing_and_lost_acks_send_but_report_failure() {
        let broker = InMemoryPublisher::new();
        let faulty = FaultyPublisher::new(broker.clone());
        faulty.go_down_for(2);
        faulty.lose_acks(1);
        let results = faulty.publish(&events(4, 1)).await;
        assert_eq!(oks(&results), [false, false, false, true]);
        assert_eq!(results[0].as_ref().unwrap_err().message(), "broker unavailable");
        assert_eq!(results[2].as_ref().unwrap_err().message(), "ack timeout");
        assert_eq!(broker.received_count(), 2, "the outage sent nothing; the lost ack was sent");
    }

    #[tokio::test]
    async fn failing_n_times_rejects_exactly_n_events_then_recovers() {
        let broker = InMemoryPublisher::new();
        let faulty = FaultyPublisher::new(broker.clone());
        faulty.go_down_for(3);
        assert_eq!(oks(&faulty.publish(&events(2, 1)).await), [false, false]);
        assert_eq!(oks(&faulty.publish(&events(2, 2)).await), [false, true]);
        assert_eq!(oks(&faulty.publish(&events(2, 3)).await), [true, true]);
        assert_eq!(broker.received_count(), 3);
        assert_eq!(faulty.counts().failed, 3);
    }

    #[tokio::test]
    async fn a_dropped_event_is_confirmed_but_never_reaches_the_broker() {
        let broker = InMemoryPublisher::new();
        let faulty = FaultyPublisher::new(broker.clone());
        faulty.drop_next(1);
        let batch = events(3, 1);
        assert_eq!(oks(&faulty.publish(&batch).await), [true, true, true], "the relay sees success");
        let received: Vec<EventId> = broker.received().iter().map(|e| e.id).collect();
        assert_eq!(received, [batch[1].id, batch[2].id], "the first event is lost");
        assert_eq!(faulty.counts().dropped, 1);
    }

    #[tokio::test]
    async fn a_duplicated_event_reaches_the_broker_twice() {
        let broker = InMemoryPublisher::new();
        let faulty = FaultyPublisher::new(broker.clone());
        faulty.duplicate_next(1);
        let batch = events(2, 1);
        assert_eq!(oks(&faulty.publish(&batch).await), [true, true]);
        let received: Vec<EventId> = broker.received().iter().map(|e| e.id).collect();
        assert_eq!(received, [batch[0].id, batch[0].id, batch[1].id]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_holds_every_call() {
        let faulty = FaultyPublisher::new(InMemoryPublisher::new());
        faulty.set_delay(Duration::from_secs(2));
        let started = tokio::time::Instant::now();
        let _ = faulty.publish(&events(1, 1)).await;
        assert!(started.elapsed() >= Duration::from_secs(2));
    }

    #[tokio::test]
    async fn reordering_within_a_call_sends_every_event_once_in_another_order() {
        let broker = InMemoryPublisher::new();
        let faulty = FaultyPublisher::new(broker.clone()).with_seed(7);
        faulty.set_reorder(Reorder::WithinCall);
        let batch = events(20, 1);
        assert!(faulty.publish(&batch).await.iter().all(Result::is_ok));
        let received: Vec<EventId> = broker.received().iter().map(|e| e.id).collect();
        let sent: Vec<EventId> = batch.iter().map(|e| e.id).collect();
        assert_ne!(received, sent, "shuffled");
        let (mut a, mut b) = (received.clone(), sent.clone());
        a.sort();
        b.sort();
        assert_eq!(a, b, "each event exactly once");
    }

    #[tokio::test]
    async fn holding_back_lets_an_aggregates_next_event_overtake_it() {
        let broker = InMemoryPublisher::new();
        let faulty = FaultyPublisher::new(broker.clone());
        faulty.hold_back_next(1);
        assert_eq!(oks(&faulty.publish(&events(1, 1)).await), [true]);
        assert_eq!(broker.received_count(), 0, "confirmed but held");
        assert_eq!(oks(&faulty.publish(&events(1, 2)).await), [true]);
        let versions: Vec<i64> = broker.received().iter().map(|e| e.aggregate_version).collect();
        assert_eq!(versions, [2, 1], "version 2 reached the broker before version 1");
        faulty.hold_back_next(1);
        let _ = faulty.publish(&events(1, 3)).await;
        assert_eq!(faulty.flush_held().await, 1, "a flush sends what is still held");
        assert_eq!(faulty.counts().held_back, 2);
    }

    #[tokio::test]
    async fn rates_are_drawn_from_the_seed_and_replay() {
        async fn run(seed: u64) -> (Vec<bool>, FaultCounts) {
            let faulty = FaultyPublisher::new(InMemoryPublisher::new()).with_seed(seed);
            faulty.set_fail_rate(0.2);
            faulty.set_lost_ack_rate(0.2);
            let mut all = Vec::new();
            for _ in 0..10 {
                all.extend(oks(&faulty.publish(&events(10, 1)).await));
            }
            (all, faulty.counts())
        }
        let (a, counts) = run(42).await;
        assert_eq!(run(42).await.0, a, "same seed, same faults");
        assert_ne!(run(43).await.0, a, "another seed, other faults");
        assert!((5..=40).contains(&counts.failed), "about 20 of 100 failed: {counts:?}");
        assert!((3..=35).contains(&counts.lost_acks), "about 16 of 80 sent lost their ack: {counts:?}");
        assert_eq!(counts.sent, 100 - counts.failed);
    }
}

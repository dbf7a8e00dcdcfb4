//! Group commit in the driver: a group's handlers in one transaction, batched handlers given the messages
//! next to each other at once, the acks after the commit.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tracing::Instrument as _;

use super::{Driver, Lane, Plan, Settled};
use crate::broker::header;
use crate::consume::Counters;
use crate::consume::group::{GroupCommit, GroupKeys};
use crate::consume::route::{Attempt, BatchRoute, Decoded, Handled};
use crate::consume::transport::{Delivery, Transport};
use crate::metrics::Consumed;
use crate::text::one_line;

/// How many groups may run before a group with room left waits for more messages.
pub(super) const PARTIAL_GROUPS_RUNNING: usize = 1;
/// The longest a group with room left waits for more messages while another group runs: about the time
/// of a commit, so that a group that runs long (a slow handler, one waiting out `handler_timeout`) holds
/// back the other lanes no longer than that.
pub(super) const MAX_FILL_WAIT: Duration = Duration::from_millis(10);

/// Whether the ready lanes hold at least `size` messages.
pub(super) fn fills_a_group<R>(lanes: &HashMap<String, Lane<R>>, ready: &VecDeque<String>, size: usize) -> bool {
    let mut held = 0;
    for lane in ready {
        held += lanes.get(lane).map_or(0, |l| l.queue.len());
        if held >= size {
            return true;
        }
    }
    false
}

/// A message its group applied, counted once the group commits.
enum Applied {
    Handled(Handled, String),
    Skipped(String),
}

/// Messages next to each other in a group for one batched handler, decoded, waiting for its call.
struct Batch<'g, R> {
    route: &'g dyn BatchRoute,
    event_type: String,
    /// The first message's delivery: the call runs in its span.
    first: &'g Delivery<R>,
    /// Each message's lane (its index in the group) and the message.
    messages: Vec<(usize, Decoded)>,
}

impl<'a, T: Transport> Driver<'a, T> {
    /// A group: every handler in one transaction, then the acks after its commit. A failure rolls the whole
    /// group back (a database may have ended the transaction under it, as MySQL does on a deadlock), and
    /// its messages go back to their lanes to run alone. A message that cannot run here (not decodable, a
    /// newer version) stops its lane's part of the group; the rest of the group goes on.
    pub(super) async fn settle_group(
        &self,
        group: &dyn GroupCommit,
        taken: Vec<(String, Vec<Delivery<T::Receipt>>)>,
    ) -> Settled<T::Receipt> {
        let mut outcomes: Vec<Vec<Applied>> = taken.iter().map(|_| Vec::new()).collect();
        let keys = self.group_keys(&taken);
        let committed = {
            let _permit = self.permits.acquire().await;
            let calls = self.apply_group(&taken, &mut outcomes);
            group.run(&keys, Box::pin(calls)).await
        };
        let size: usize = taken.iter().map(|(_, d)| d.len()).sum();
        match committed {
            Ok(true) => Counters::add(&self.counters().groups),
            Ok(false) => {
                Counters::add(&self.counters().group_rollbacks);
                tracing::debug!(size, "a handler of the group failed: rolled back, its messages run alone");
                outcomes.iter_mut().for_each(Vec::clear);
            }
            Err(error) => {
                Counters::add(&self.counters().group_rollbacks);
                tracing::warn!(error = %one_line(&error.to_string()), size, "group commit failed; its messages run again alone (the inbox absorbs any that did commit)");
                outcomes.iter_mut().for_each(Vec::clear);
            }
        }
        let mut acks = Vec::new();
        let mut lanes = Vec::with_capacity(taken.len());
        let mut applied = 0;
        for ((lane, mut deliveries), outcomes) in taken.into_iter().zip(outcomes) {
            let rest = deliveries.split_off(outcomes.len());
            applied += deliveries.len();
            for (delivery, outcome) in deliveries.into_iter().zip(outcomes) {
                self.count(outcome);
                acks.push(delivery);
            }
            lanes.push((lane, rest));
        }
        self.ack_group(&acks).await;
        Settled::Group { lanes, applied }
    }

    /// The group's handler calls, in the group's transaction: `true` to commit. Each lane's outcomes are
    /// pushed in its order, so what a lane did not settle is the rest of it. Messages of a batched handler
    /// that are next to each other (several lanes' in a row) wait in a [`Batch`] for one call; anything
    /// else of the group first runs the batch, so every lane keeps its order.
    async fn apply_group(&self, taken: &[(String, Vec<Delivery<T::Receipt>>)], outcomes: &mut [Vec<Applied>]) -> bool {
        let mut batch: Option<Batch<'_, T::Receipt>> = None;
        for (lane, (_, deliveries)) in taken.iter().enumerate() {
            for delivery in deliveries {
                if self.shutdown.is_cancelled() {
                    return true; // What ran commits; the rest (a batch not run included) is released.
                }
                let (route, event) = match self.plan(delivery) {
                    Plan::Handle(route, event) => (route, event),
                    Plan::Skip(event) => {
                        if !self.run_batch(batch.take(), outcomes).await {
                            return false;
                        }
                        outcomes[lane].push(Applied::Skipped(event.event_type));
                        continue;
                    }
                    Plan::Poison(_) => break, // It and the rest of its lane run alone.
                };
                if let Some(batched) = route.batch() {
                    if batch.as_ref().is_some_and(|b| b.event_type != event.event_type)
                        && !self.run_batch(batch.take(), outcomes).await
                    {
                        return false;
                    }
                    let event_type = event.event_type.clone();
                    match batched.decode(*event, delivery.deliveries) {
                        Ok(decoded) => batch
                            .get_or_insert_with(|| Batch {
                                route: batched,
                                event_type,
                                first: delivery,
                                messages: Vec::new(),
                            })
                            .messages
                            .push((lane, decoded)),
                        Err(_) => break,
                    }
                    continue;
                }
                if !self.run_batch(batch.take(), outcomes).await {
                    return false;
                }
                let event_type = event.event_type.clone();
                let attempt =
                    self.attempt(route, *event, delivery.deliveries).instrument(self.process_span(delivery)).await;
                match attempt {
                    Attempt::Done(handled) => outcomes[lane].push(Applied::Handled(handled, event_type)),
                    Attempt::Newer(_) | Attempt::Poison(_) => break,
                    // Alone, a configuration error stops the consumer; here it rolls the group back first.
                    Attempt::Failed(reason) | Attempt::Misconfigured(reason) => {
                        tracing::debug!(reason = %one_line(&reason), "handler failed inside a group");
                        return false;
                    }
                }
            }
        }
        self.run_batch(batch, outcomes).await
    }

    /// Runs a waiting batch in one handler call, bounded by `handler_timeout` as a whole, and pushes each
    /// message's outcome to its lane; `false` when the call failed (the group rolls back).
    async fn run_batch(&self, batch: Option<Batch<'_, T::Receipt>>, outcomes: &mut [Vec<Applied>]) -> bool {
        let Some(Batch { route, event_type, first, messages }) = batch else { return true };
        let (lanes, messages): (Vec<usize>, Vec<Decoded>) = messages.into_iter().unzip();
        let call = self.bounded(&event_type, route.attempt_batch(messages)).instrument(self.process_span(first));
        let handled = call.await.map_err(Attempt::Failed).and_then(|handled| handled);
        match handled {
            Ok(handled) => {
                for (lane, handled) in lanes.into_iter().zip(handled) {
                    outcomes[lane].push(Applied::Handled(handled, event_type.clone()));
                }
                true
            }
            Err(attempt) => {
                let reason = one_line(attempt.reason());
                tracing::debug!(%reason, messages = lanes.len(), "batch handler failed inside a group");
                false
            }
        }
    }

    /// The inbox keys of a group's messages that have a handler here, for the group commit to record
    /// ahead (a message without a valid id is poison, and left out).
    fn group_keys(&self, taken: &[(String, Vec<Delivery<T::Receipt>>)]) -> GroupKeys {
        let routes = &self.consumer.routes;
        let message_ids = taken
            .iter()
            .flat_map(|(_, deliveries)| deliveries)
            .filter(|d| d.headers.get(header::TYPE).is_some_and(|t| routes.contains_key(t.as_str())))
            .filter_map(|d| d.headers.get(header::ID)?.parse::<crate::envelope::EventId>().ok())
            .map(|id| id.to_string())
            .collect();
        GroupKeys { consumer: self.consumer.name.to_string(), message_ids }
    }

    /// Counts a message its group committed.
    fn count(&self, outcome: Applied) {
        match outcome {
            Applied::Handled(Handled::Processed, event_type) => {
                Counters::add(&self.counters().processed);
                crate::metrics::consumed(&self.consumer.name, &event_type, Consumed::Processed);
            }
            Applied::Handled(Handled::Duplicate, event_type) => {
                Counters::add(&self.counters().duplicates);
                crate::metrics::consumed(&self.consumer.name, &event_type, Consumed::Duplicate);
            }
            Applied::Skipped(event_type) => {
                tracing::debug!(event_type = %one_line(&event_type), "no handler for this event type here; acked untouched");
                Counters::add(&self.counters().skipped);
                crate::metrics::consumer_dead_lettered_or_skipped(&self.consumer.name, false);
            }
        }
    }

    /// Acks a committed group's messages together (pipelined where the transport can); when that fails,
    /// each alone, with retries.
    async fn ack_group(&self, deliveries: &[Delivery<T::Receipt>]) {
        if deliveries.is_empty() {
            return;
        }
        let receipts: Vec<&T::Receipt> = deliveries.iter().map(|delivery| &delivery.receipt).collect();
        if let Err(error) = self.transport.ack_all(&receipts).await {
            tracing::debug!(%error, messages = deliveries.len(), "acking the group at once failed; acking each alone");
            futures_util::future::join_all(deliveries.iter().map(|delivery| self.ack(delivery))).await;
        }
    }
}

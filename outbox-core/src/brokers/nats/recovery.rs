//! Keeping stream order when deliveries were lost: at start, after a reconnect or a failed fetch, the
//! server may count unacknowledged deliveries this transport never received (lost in flight, or left by
//! a process that stopped without releasing them). JetStream redelivers them only after `ack_wait`, and
//! then ahead of newer messages; until they are back, newer messages fetched meanwhile wait in a stash.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use crate::consume::Delivery;
use crate::error::{Error, Result};

use super::BROKER;
use super::transport::{NatsReceipt, NatsTransport, lock};

/// How long after `ack_wait` recovery lasts at most, for the server's redelivery timer.
const REDELIVERY_MARGIN: Duration = Duration::from_millis(500);

/// The recovery state of one transport.
pub(super) struct Recovery {
    /// The client's connect count at the last check.
    connects: u64,
    /// A fetch failed or timed out: something may have been delivered and lost.
    suspect: bool,
    /// Recovering until then at most: only redeliveries go to the driver.
    until: Option<Instant>,
    /// New messages fetched while recovering, in stream order, held back until recovery ends.
    stash: VecDeque<Delivery<NatsReceipt>>,
}

impl Recovery {
    /// A transport starts suspicious: a previous process may have left deliveries unacknowledged.
    pub(super) fn new(connects: u64) -> Self {
        Recovery { connects, suspect: true, until: None, stash: VecDeque::new() }
    }
}

impl NatsTransport {
    /// Something may have been delivered and not received: check before the next fetch.
    pub(super) fn suspect(&self) {
        lock(&self.recovery).suspect = true;
    }

    /// Whether the next fetch is a recovering one (see the module docs), starting or ending recovery.
    pub(super) async fn recovering(&self) -> Result<bool> {
        if !self.options.wait_for_lost_deliveries {
            return Ok(false);
        }
        let connects = self.client().statistics().connects.load(Ordering::Relaxed);
        let check = {
            let mut recovery = lock(&self.recovery);
            if recovery.until.is_some_and(|until| Instant::now() >= until) {
                recovery.until = None;
                tracing::info!(consumer = %self.durable_name(), stashed = recovery.stash.len(), "recovery ended after ack_wait");
            }
            recovery.until.is_some() || recovery.suspect || recovery.connects != connects
        };
        if !check {
            return Ok(false);
        }
        let info = tokio::time::timeout(self.options.request_timeout, self.info())
            .await
            .map_err(|_| Error::broker(BROKER, format!("read consumer {:?}", self.durable_name()), "timed out"))??;
        let held = self.held();
        let mut recovery = lock(&self.recovery);
        recovery.suspect = false;
        recovery.connects = connects;
        let lost = info.num_ack_pending > held;
        match (lost, recovery.until) {
            (true, None) => {
                let limit = self.ack_wait() + REDELIVERY_MARGIN;
                recovery.until = Some(Instant::now() + limit);
                tracing::warn!(
                    messaging.system = "nats",
                    consumer = %self.durable_name(),
                    unacknowledged = info.num_ack_pending,
                    held,
                    ?limit,
                    "the server has unacknowledged deliveries this transport does not hold (lost in flight, or left by a consumer that stopped): newer messages wait until they are redelivered"
                );
            }
            (false, Some(_)) => {
                recovery.until = None;
                tracing::info!(consumer = %self.durable_name(), stashed = recovery.stash.len(), "every lost delivery is back; recovery ended");
            }
            _ => {}
        }
        Ok(recovery.until.is_some())
    }

    /// Whether new messages wait in the stash (a recovering fetch then asks for one message at a time).
    pub(super) fn stashed(&self) -> bool {
        !lock(&self.recovery).stash.is_empty()
    }

    /// Up to `max` stashed messages, oldest first, once recovery ended.
    pub(super) fn take_stash(&self, max: usize) -> Vec<Delivery<NatsReceipt>> {
        let mut recovery = lock(&self.recovery);
        let n = max.min(recovery.stash.len());
        recovery.stash.drain(..n).collect()
    }

    /// The redeliveries of a recovering fetch; its new messages go to the stash.
    pub(super) fn sort_recovered(&self, batch: Vec<Delivery<NatsReceipt>>) -> Vec<Delivery<NatsReceipt>> {
        let mut recovery = lock(&self.recovery);
        let mut out = Vec::new();
        for delivery in batch {
            if delivery.deliveries > 1 {
                out.push(delivery);
            } else {
                recovery.stash.push_back(delivery);
            }
        }
        out
    }
}

impl Drop for NatsTransport {
    /// Hands stashed messages back (`-NAK`), so they are redelivered at once rather than after `ack_wait`.
    fn drop(&mut self) {
        let stash: Vec<_> = lock(&self.recovery).stash.drain(..).map(|delivery| delivery.receipt).collect();
        if stash.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let client = self.client().clone();
        runtime.spawn(async move {
            for receipt in stash {
                if client.publish(receipt.reply().clone(), "-NAK".into()).await.is_err() {
                    return;
                }
            }
            let _ = client.flush().await;
        });
    }
}

//! Consumer dead letters on the dashboard: the transports an app hands to
//! [`Dashboard::with_dead_letters`](super::Dashboard::with_dead_letters), behind one object-safe face, and
//! the bounded reads the pages make of them. The dashboard's walks of one source take turns: on RabbitMQ
//! a walk holds every letter it read until it ends, so a second walk at the same time would miss them.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use outbox_seaorm::consume::{DeadFilter, DeadLetterAction, DeadLetterEntry, DeadLetterOutcome, DeadLetters, Lag};

use outbox_seaorm::Result;

/// Most letters a count walks; more shows as "at least".
pub(super) const COUNT_CAP: usize = 10_000;
/// Most letters a list shows (the oldest that match).
pub(super) const LIST_LIMIT: usize = 100;

type Walk<'a> = Pin<Box<dyn Future<Output = Result<DeadLetterOutcome>> + Send + 'a>>;
type LagRead<'a> = Pin<Box<dyn Future<Output = Result<Option<Lag>>> + Send + 'a>>;

/// A transport's dead letters, object-safe (a [`DeadLetters`] method returns `impl Future`).
trait LetterSource: Send + Sync {
    /// `Redis Streams orders:dead`.
    fn label(&self) -> String;
    fn walk<'a>(&'a self, filter: &'a DeadFilter, action: DeadLetterAction, max: usize) -> Walk<'a>;
    fn lag(&self) -> LagRead<'_>;
}

impl<T: DeadLetters + 'static> LetterSource for T {
    fn label(&self) -> String {
        format!("{} {}", self.dead_letter_broker(), self.dead_letter_location())
    }

    fn walk<'a>(&'a self, filter: &'a DeadFilter, action: DeadLetterAction, max: usize) -> Walk<'a> {
        Box::pin(self.dead_letters(filter, action, max))
    }

    fn lag(&self) -> LagRead<'_> {
        Box::pin(self.consumer_lag())
    }
}

/// One source of consumer dead letters, walked one walk at a time.
pub(super) struct Letters {
    source: Box<dyn LetterSource>,
    label: String,
    turn: tokio::sync::Mutex<()>,
}

impl Letters {
    pub fn new(transport: impl DeadLetters + 'static) -> Self {
        let label = transport.label();
        Letters { source: Box::new(transport), label, turn: tokio::sync::Mutex::new(()) }
    }

    /// `Redis Streams stream "orders:dead"`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Does `action` to each letter `filter` selects, up to `max`, after any other walk of this source.
    pub async fn walk(&self, filter: &DeadFilter, action: DeadLetterAction, max: usize) -> Result<DeadLetterOutcome> {
        let _turn = self.turn.lock().await;
        self.source.walk(filter, action, max).await
    }

    /// The letters per consumer, walking at most [`COUNT_CAP`], and the consumer's lag at its broker.
    pub async fn count(&self) -> LetterCounts {
        let label = self.label.clone();
        let lag = match self.source.lag().await {
            Ok(lag) => lag.map(Ok),
            Err(error) => {
                tracing::debug!(%error, source = %label, "dashboard: cannot read the consumer's lag");
                Some(Err(error.to_string()))
            }
        };
        match self.walk(&DeadFilter::default(), DeadLetterAction::List, COUNT_CAP).await {
            Err(error) => {
                tracing::debug!(%error, source = %label, "dashboard: cannot count the consumer dead letters");
                LetterCounts { label, counts: Err(error.to_string()), capped: false, lag }
            }
            Ok(outcome) => {
                let capped = outcome.letters.len() >= COUNT_CAP;
                let mut counts = BTreeMap::new();
                for letter in outcome.letters {
                    *counts.entry(letter.consumer.unwrap_or_else(|| "-".to_owned())).or_insert(0) += 1;
                }
                LetterCounts { label, counts: Ok(counts), capped, lag }
            }
        }
    }

    /// The oldest [`LIST_LIMIT`] letters `filter` selects, and how many match (walking at most
    /// [`COUNT_CAP`]; `true` when it stopped there).
    pub async fn list(&self, filter: &DeadFilter) -> Result<(Vec<DeadLetterEntry>, usize, bool)> {
        let mut letters = self.walk(filter, DeadLetterAction::List, COUNT_CAP).await?.letters;
        let matching = letters.len();
        letters.truncate(LIST_LIMIT);
        Ok((letters, matching, matching >= COUNT_CAP))
    }

    /// The letter with `id`, headers and payload included.
    pub async fn show(&self, id: &str) -> Result<Option<DeadLetterEntry>> {
        let filter = DeadFilter::default().id(id);
        Ok(self.walk(&filter, DeadLetterAction::Show, 1).await?.letters.into_iter().next())
    }

    /// How many letters `filter` selects, every one counted (an action is about to touch them all).
    pub async fn count_matching(&self, filter: &DeadFilter) -> Result<u64> {
        Ok(self.walk(filter, DeadLetterAction::List, usize::MAX).await?.letters.len() as u64)
    }
}

/// One source's letters per consumer, as the overview shows them.
#[derive(Clone, Debug)]
pub(super) struct LetterCounts {
    pub label: String,
    /// Letters per consumer (`-` for a letter without the header), or why they could not be read.
    pub counts: std::result::Result<BTreeMap<String, u64>, String>,
    /// Whether the walk stopped at [`COUNT_CAP`] (the figures are lower bounds).
    pub capped: bool,
    /// The consumer's lag at its broker; `None` when the broker cannot say.
    pub lag: Option<std::result::Result<Lag, String>>,
}

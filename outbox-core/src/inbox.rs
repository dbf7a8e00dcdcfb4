//! Consumer-side de-duplication: each `(consumer, message id)` has its effect at most once.

/// What happened to a message handed to an inbox.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum InboxOutcome<T> {
    /// First delivery: the effect ran and committed with the inbox row; here is its result.
    Processed(T),
    /// Already processed by this consumer: the effect did not run.
    Duplicate,
}

impl<T> InboxOutcome<T> {
    /// Whether the effect ran.
    pub fn is_processed(&self) -> bool {
        matches!(self, InboxOutcome::Processed(_))
    }

    /// Whether the message was a duplicate.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, InboxOutcome::Duplicate)
    }
}

/// Longest consumer name the inbox stores (`VARCHAR(128)`).
pub const MAX_CONSUMER_LEN: usize = 128;
/// Longest message id the inbox stores (`VARCHAR(128)`).
pub const MAX_MESSAGE_ID_LEN: usize = 128;

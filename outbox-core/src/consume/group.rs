//! Group commit: several messages applied in one database transaction, committed once.

use std::future::Future;
use std::pin::Pin;

use crate::error::BoxError;

/// The handler calls of one group, run inside the group's transaction; `true` asks for a commit, `false`
/// for a rollback.
pub type GroupCalls<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// What [`GroupCommit::run`] returns.
pub type GroupOutcome<'a> = Pin<Box<dyn Future<Output = Result<bool, BoxError>> + Send + 'a>>;

/// The handler call of one message applied alone, for [`GroupCommit::run_alone`].
pub type AloneCall<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The inbox keys of a group's messages: what an inbox write of their handlers will most likely ask for,
/// so that a [`GroupCommit`] can record them all in one statement before the handlers run instead of one
/// statement per handler.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupKeys {
    /// The consumer's name ([`Consumer::name`](super::Consumer::name)).
    pub consumer: String,
    /// The event id (hyphenated, lower case, as `Uuid`'s `Display` writes it) of each message of the group
    /// that has a handler here, in group order; a message delivered twice appears twice.
    pub message_ids: Vec<String>,
}

/// Runs a group of handler calls in one database transaction that their inbox writes join, so that a
/// group of messages costs one commit (one fsync) instead of one each.
///
/// A consumer given one ([`Consumer::with_group_commit`](super::Consumer::with_group_commit)) takes up to
/// [`ConsumerConfig::group_size`](super::ConsumerConfig::group_size) ready messages, runs their handlers one
/// after the other inside [`run`](GroupCommit::run), and acks them only after the commit. When any handler
/// of the group fails, panics or times out, the whole group is rolled back and each of its messages runs
/// again alone, in order, so one failing message never takes its neighbours down (their handlers run once
/// more: the inbox keeps the effect exactly-once, as for any redelivery). `outbox-seaorm` implements it for
/// a SeaORM pool (`SeaOrmGroupCommit`): an inbox write (`handle_once`) or `#[transactional_outbox]` call on
/// the same pool joins the group's transaction.
pub trait GroupCommit: Send + Sync + 'static {
    /// Begins a transaction, runs `calls` with it as the task's current transaction, then commits it when
    /// `calls` returned `true` (`Ok(true)`) or rolls it back when `false` (`Ok(false)`). An error of the
    /// begin or the commit is `Err`: nothing of the group is acked, and its messages run again alone.
    ///
    /// `keys` names the inbox rows the handlers are expected to write; an implementation may record them
    /// ahead (outbox-seaorm does, in one statement), as long as the outcome is the one of each handler
    /// recording its own: a key the handlers did not claim is not committed, and a key recorded before is
    /// reported to its handler as a duplicate without running its effect.
    fn run<'a>(&'a self, keys: &'a GroupKeys, calls: GroupCalls<'a>) -> GroupOutcome<'a>;

    /// Runs the handler call of a message applied alone, outside any group (every message when
    /// [`group_size`](super::ConsumerConfig::group_size) is 1; the messages of a group that rolled back),
    /// so that it finds what a group's handlers find. The default runs it as it is; `outbox-seaorm`'s runs
    /// it with its pool as the handlers' database, where an `#[idempotent_handler]` registered with
    /// [`Consumer::on`](super::Consumer::on) begins its own transaction.
    fn run_alone<'a>(&'a self, call: AloneCall<'a>) -> AloneCall<'a> {
        call
    }
}

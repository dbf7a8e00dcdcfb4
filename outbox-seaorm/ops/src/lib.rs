//! # outbox-ops
//!
//! Operating the transactional outbox of a SeaORM app ([`outbox_seaorm`]): what an operator runs beside the
//! app, not what the app links to run it.
//!
//! - the `outbox` command (`cargo install outbox-ops`): a relay process (`outbox relay`), `migrate`,
//!   `check`, `stats`, dead events and consumers' dead letters, `cleanup`, `dashboard`;
//! - [`admin`]: the same operations as functions over a connection;
//! - [`dashboard`] (feature `dashboard`): the operations pages as an axum router to mount in an app.
//!
//! | feature | what it adds |
//! |---|---|
//! | `dashboard` (default) | [`dashboard::Dashboard`]: backlog, relays, dead events and dead letters, replay and discard behind an admin token |
//! | `cli` (default) | the `outbox` binary, with every database driver and broker |
//!
//! A library user that only mounts the dashboard: `outbox-ops = { version = "0.1", default-features = false,
//! features = ["dashboard"] }`; the app's own `outbox-seaorm` features pick the drivers.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
#[cfg(feature = "dashboard")]
#[cfg_attr(docsrs, doc(cfg(feature = "dashboard")))]
pub mod dashboard;

/// Errors: the store's, whose `Store` variant says what was being done, on which table and backend.
pub use outbox_seaorm::{Error, Result};

//! Replay and discard, of dead rows or consumer dead letters: authorized by the session and its CSRF
//! token, counted and confirmed before they run, logged with what they changed.

use std::fmt;
use std::sync::PoisonError;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

use outbox_seaorm::consume::{DeadFilter, DeadLetterAction};

use super::form::{self, DeadQuery, field};
use super::{Ctx, Shared, Visit, failure, html, not_found, refused, view};
use crate::admin;
use outbox_seaorm::Result;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Replay,
    Discard,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Replay => "replay",
            Action::Discard => "discard",
        }
    }
}

/// What an action applies to.
enum Target {
    /// Dead outbox rows.
    Rows(DeadFilter),
    /// The consumer dead letters of one source.
    Letters { source: usize, filter: DeadFilter },
}

impl Target {
    /// The selection a form asks for: its `s` field says consumer dead letters, `scope` a selection of
    /// ids or everything its filter fields select.
    fn from_form(pairs: &[(String, String)], query: &DeadQuery, sources: usize) -> std::result::Result<Self, String> {
        let letters = field(pairs, "s").map(|_| form::source(pairs, sources)).transpose()?;
        match (field(pairs, "scope"), letters) {
            (Some("ids"), None) => match form::ids(pairs)? {
                ids if ids.is_empty() => Err("no event selected: tick at least one row".to_owned()),
                ids => Ok(Target::Rows(DeadFilter::default().ids(ids))),
            },
            (Some("ids"), Some(source)) => match form::letter_ids(pairs)? {
                ids if ids.is_empty() => Err("no letter selected: tick at least one row".to_owned()),
                ids => Ok(Target::Letters { source, filter: DeadFilter::default().ids(ids) }),
            },
            (Some("filter"), None) => {
                let filter = query.filter()?;
                Ok(Target::Rows(if query.is_empty() { DeadFilter::all() } else { filter }))
            }
            (Some("filter"), Some(source)) => {
                let filter = query.filter()?;
                Ok(Target::Letters { source, filter: if query.is_empty() { DeadFilter::all() } else { filter } })
            }
            _ => Err("the form says neither a selection nor a filter (scope=ids or scope=filter)".to_owned()),
        }
    }

    fn source(&self) -> Option<usize> {
        match self {
            Target::Rows(_) => None,
            Target::Letters { source, .. } => Some(*source),
        }
    }

    fn by_ids(&self) -> bool {
        match self {
            Target::Rows(filter) => !filter.selected_ids().is_empty(),
            Target::Letters { filter, .. } => !filter.selected_ids().is_empty(),
        }
    }

    async fn count(&self, s: &Shared) -> Result<u64> {
        match self {
            Target::Rows(filter) => admin::count_dead(&s.db, filter).await,
            Target::Letters { source, filter } => s.letter_sources[*source].count_matching(filter).await,
        }
    }

    async fn apply(&self, s: &Shared, action: Action) -> Result<u64> {
        match (self, action) {
            (Target::Rows(filter), Action::Replay) => admin::replay_dead(&s.db, filter).await,
            (Target::Rows(filter), Action::Discard) => admin::discard_dead(&s.db, filter).await,
            (Target::Letters { source, filter }, action) => {
                let action =
                    if action == Action::Replay { DeadLetterAction::Replay } else { DeadLetterAction::Discard };
                let outcome = s.letter_sources[*source].walk(filter, action, usize::MAX).await?;
                if outcome.kept > 0 {
                    tracing::warn!(
                        kept = outcome.kept,
                        "dashboard: dead letters kept: they cannot be replayed (no valid origin)"
                    );
                }
                Ok(outcome.letters.len() as u64)
            }
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Rows(filter) => write!(f, "dead rows {filter:?}"),
            Target::Letters { source, filter } => write!(f, "dead letters of source {source} {filter:?}"),
        }
    }
}

pub(super) async fn action(State(s): Ctx, visit: Visit, Path(name): Path<String>, body: Bytes) -> Response {
    let frame = s.frame(&visit);
    let pairs = form::pairs(&body);
    let admin = match s.gate.authorize(&visit.headers, field(&pairs, "csrf")) {
        Ok(admin) => admin,
        Err(refusal) => return refused(&frame, refusal),
    };
    let action = match name.as_str() {
        "replay" => Action::Replay,
        "discard" => Action::Discard,
        _ => return not_found(&frame, "no such action"),
    };
    let query = DeadQuery::from_pairs(&pairs);
    let target = match Target::from_form(&pairs, &query, s.letter_sources.len()) {
        Ok(target) => target,
        Err(message) => {
            let page = view::page(&frame, "Cannot do that", view::message("Cannot do that", &message));
            return html(StatusCode::BAD_REQUEST, page);
        }
    };
    let count = match target.count(&s).await {
        Ok(count) => count,
        Err(error) => return failure(&frame, &error),
    };
    let typed = (action == Action::Discard && !target.by_ids()).then(|| format!("discard {count}"));
    let ask = |note: Option<&str>| {
        let ids: Option<Vec<String>> = match &target {
            Target::Rows(filter) => {
                let ids = filter.selected_ids();
                (!ids.is_empty()).then(|| ids.iter().map(ToString::to_string).collect())
            }
            Target::Letters { filter, .. } => {
                let ids = filter.selected_ids();
                (!ids.is_empty()).then(|| ids.to_vec())
            }
        };
        let confirm = view::Confirm {
            action: action.name(),
            admin: &admin,
            source: target.source(),
            query: &query,
            ids: ids.as_deref(),
            count,
            typed: typed.clone(),
            note,
        };
        html(StatusCode::OK, view::page(&frame, "Confirm", view::confirm(&frame, &confirm)))
    };
    if field(&pairs, "confirmed") != Some("yes") {
        return ask(None);
    }
    if !target.by_ids() && field(&pairs, "expected").and_then(|e| e.parse::<u64>().ok()) != Some(count) {
        return ask(Some("The number of matching items changed since the count was shown: check it again."));
    }
    if let Some(words) = &typed
        && field(&pairs, "typed") != Some(words.as_str())
    {
        return ask(Some("The words typed do not match: type them exactly to discard."));
    }
    match target.apply(&s, action).await {
        Ok(changed) => {
            tracing::warn!(action = action.name(), changed, selection = ?target, "dashboard: changed by an admin");
            // The next view reads the figures again rather than show them from before the change.
            *s.backlog.lock().unwrap_or_else(PoisonError::into_inner) = None;
            let page = view::done(&frame, action.name(), target.source(), changed);
            html(StatusCode::OK, view::page(&frame, "Done", page))
        }
        Err(error) => failure(&frame, &error),
    }
}

//! The pages, as maud templates: every value from the database goes through maud's escaping, so a
//! payload or an error text that holds markup is shown as text.

use maud::{DOCTYPE, Markup, PreEscaped, html};

use outbox_seaorm::Health;

use super::auth::Admin;
use super::chart::{self, Bar, Span};
use super::form::{DeadQuery, FILTER_FIELDS, LETTER_FIELDS};
use super::letters::{COUNT_CAP, LIST_LIMIT, LetterCounts};
use super::read::{Backlog, DEAD_PAGE};
use crate::admin::{DeadEvent, GroupStats, RelayProcess, rfc3339};
use outbox_seaorm::consume::DeadLetterEntry;

mod event;

use event::pretty;
pub(super) use event::{Lookup, aggregate, event};

/// What every page needs: where the dashboard is mounted and who is looking.
pub(super) struct Frame<'a> {
    /// The path the dashboard is mounted under, without a trailing `/` (`""` at the root).
    pub base: &'a str,
    pub admin: Option<&'a Admin>,
    pub read_only: bool,
    pub refresh_ms: u64,
    /// How many consumer dead-letter sources the dashboard was given.
    pub letter_sources: usize,
}

/// A whole page around `body`.
pub(super) fn page(frame: &Frame<'_>, title: &str, body: Markup) -> Markup {
    let base = frame.base;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · outbox" }
                link rel="stylesheet" href={ (base) "/assets/dashboard.css" };
                script src={ (base) "/assets/dashboard.js" } defer {}
            }
            body data-base=(base) data-refresh-ms=(frame.refresh_ms) {
                header {
                    nav {
                        a.brand href=(home(base)) { "outbox" }
                        a href=(home(base)) { "Overview" }
                        a href={ (base) "/dead" } { "Dead events" }
                        @if frame.letter_sources > 0 { a href={ (base) "/letters" } { "Consumer dead letters" } }
                        form #find-aggregate method="get" action={ (base) "/aggregate" } {
                            input name="aggregate_type" placeholder="aggregate type" aria-label="aggregate type" required;
                            input name="aggregate_id" placeholder="aggregate id" aria-label="aggregate id" required;
                            button #find type="submit" { "Find" }
                        }
                    }
                    (session(frame))
                }
                main { (body) }
            }
        }
    }
}

fn session(frame: &Frame<'_>) -> Markup {
    let base = frame.base;
    html! {
        div #session {
            @if frame.read_only {
                span.muted #read-only { "read-only (no admin token configured)" }
            } @else if let Some(admin) = frame.admin {
                form method="post" action={ (base) "/logout" } {
                    input type="hidden" name="csrf" value=(admin.csrf);
                    span #signed-in { "signed in as admin " }
                    button #sign-out type="submit" { "Sign out" }
                }
            } @else {
                form method="post" action={ (base) "/login" } {
                    label { "admin token " input #token type="password" name="token" autocomplete="off" required; }
                    button #sign-in type="submit" { "Sign in" }
                }
            }
        }
    }
}

/// What the overview shows.
pub(super) struct Overview<'a> {
    pub backlog: Result<Backlog, String>,
    /// The chart's bars and the rate of the last complete 15 s, or why they could not be read.
    pub chart: Result<(Vec<Bar>, Option<f64>), String>,
    pub span: Span,
    pub now_ms: i64,
    pub health: Option<Health>,
    pub details: &'a [(String, String)],
    /// Per consumer dead-letter source, read with the backlog.
    pub letters: &'a [LetterCounts],
    /// The log relay's slot (`DashboardConfig::with_log_slot`).
    pub slot: Option<Markup>,
}

/// The part of the overview that refreshes itself.
pub(super) fn overview(frame: &Frame<'_>, overview: &Overview<'_>) -> Markup {
    let base = frame.base;
    let rate = overview.chart.as_ref().ok().and_then(|(_, rate)| *rate);
    html! {
        div #overview {
            @match &overview.backlog {
                Err(message) => p.error #backlog-error { "Cannot read the outbox: " (message) },
                Ok(backlog) => {
                    @let totals = &backlog.stats.totals;
                    section.cards {
                        div.card { div.label { "pending" } div.figure #pending { (totals.pending) } }
                        div.card {
                            div.label { "dead" }
                            div.figure #dead { a href={ (base) "/dead" } { (totals.dead) } }
                        }
                        div.card { div.label { "oldest pending" } div.figure #oldest { (age(totals.oldest_pending_seconds)) } }
                        div.card {
                            div.label { "published / s" }
                            div.figure #published-rate { @match rate { Some(r) => (chart::rate(r)), None => "…" } }
                        }
                    }
                    section {
                        h2 { "Published per second, " (overview.span.label()) }
                        nav.spans #spans {
                            @for span in Span::ALL {
                                @if span == overview.span {
                                    strong.span { (span.param()) }
                                } @else {
                                    a.span href={ (home(base)) "?span=" (span.param()) } { (span.param()) }
                                }
                                " "
                            }
                        }
                        @match &overview.chart {
                            Ok((bars, _)) => (PreEscaped(chart::svg(bars, overview.span))),
                            Err(message) => p.error #chart-error { "Cannot count the published rows: " (message) },
                        }
                    }
                    section.split {
                        div { h2 { "By aggregate type" } (groups("by-aggregate-type", &backlog.stats.by_aggregate_type)) }
                        div { h2 { "By event type" } (groups("by-event-type", &backlog.stats.by_event_type)) }
                    }
                    section {
                        h2 { "Aggregates most behind" }
                        @if backlog.behind.is_empty() {
                            p.muted #behind-empty { "No aggregate is waiting for the relay." }
                        } @else {
                            table #behind {
                                thead { tr { th { "aggregate" } th.num { "pending" } th.num { "dead" } th.num { "due for" } th.num { "oldest unpublished" } } }
                                tbody {
                                    @for row in &backlog.behind {
                                        tr {
                                            td { (row.aggregate_type) " / " (row.aggregate_id) }
                                            td.num { (row.pending) }
                                            td.num {
                                                @if row.dead > 0 {
                                                    a href={ (base) "/dead?" (DeadQuery { aggregate_type: Some(row.aggregate_type.clone()), aggregate_id: Some(row.aggregate_id.clone()), ..DeadQuery::default() }.query_string(&[])) } { (row.dead) }
                                                } @else { "0" }
                                            }
                                            td.num { (age(row.due_seconds)) }
                                            td.num { (age(row.oldest_seconds)) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if !overview.letters.is_empty() {
                section {
                    h2 { "Consumer dead letters" }
                    (letter_counts(frame, overview.letters))
                }
            }
            @if let Ok(backlog) = &overview.backlog {
                section {
                    h2 { "Relay processes" }
                    (processes(&backlog.relays, overview.now_ms))
                }
            }
            section {
                h2 { "Relays in this process" }
                (relays(overview.health.as_ref(), overview.details))
                @if let Some(slot) = &overview.slot { (slot) }
            }
            @if let Ok(backlog) = &overview.backlog {
                p.muted.small #read-at { "Backlog read at " (rfc3339(backlog.read_at_ms)) " in " (backlog.took_ms) " ms." }
            }
        }
    }
}

/// The overview of a first view, while the backlog is read: the script asks for the figures at once.
pub(super) fn reading() -> Markup {
    html! {
        div #overview data-reading="1" {
            p.muted #reading { "Reading the outbox…" }
        }
    }
}

fn groups(id: &str, groups: &[GroupStats]) -> Markup {
    html! {
        @if groups.is_empty() {
            p.muted { "Nothing unpublished." }
        } @else {
            table id=(id) {
                thead { tr { th { "name" } th.num { "pending" } th.num { "dead" } th.num { "oldest pending" } } }
                tbody {
                    @for group in groups {
                        tr { td { (group.name) } td.num { (group.figures.pending) } td.num { (group.figures.dead) } td.num { (age(group.figures.oldest_pending_seconds)) } }
                    }
                }
            }
        }
    }
}

fn letter_counts(frame: &Frame<'_>, sources: &[LetterCounts]) -> Markup {
    let base = frame.base;
    html! {
        table #letters {
            thead { tr { th { "broker and dead-letter destination" } th { "consumer" } th.num { "dead letters" } } }
            tbody {
                @for (i, source) in sources.iter().enumerate() {
                    @let list = |extra: &[(&str, &str)]| format!("{base}/letters?{}", DeadQuery::default().query_string(&[&[("s", i.to_string().as_str())], extra].concat()));
                    @match &source.counts {
                        Err(message) => tr { td { (source.label) } td.error-text colspan="2" { "cannot read them: " (message) } },
                        Ok(counts) if counts.is_empty() => tr { td { a href=(list(&[])) { (source.label) } } td.muted { "none" } td.num data-source=(i) data-consumer="" { "0" } },
                        Ok(counts) => @for (consumer, count) in counts {
                            tr {
                                td { a href=(list(&[])) { (source.label) } }
                                td { (consumer) }
                                td.num data-source=(i) data-consumer=(consumer) {
                                    a href=(list(&[("consumer", consumer.as_str())])) { (count) @if source.capped { "+" } }
                                }
                            }
                        },
                    }
                }
            }
        }
        @if sources.iter().any(|source| source.lag.is_some()) {
            table #consumer-lag {
                thead { tr { th { "consumer at its broker" } th.num { "not acknowledged" } th.num { "not delivered yet" } th.num { "lag" } } }
                tbody {
                    @for (i, source) in sources.iter().enumerate() {
                        @match &source.lag {
                            None => {},
                            Some(Err(message)) => tr { td { (source.label) } td.error-text colspan="3" { "cannot read it: " (message) } },
                            Some(Ok(lag)) => tr {
                                td { (source.label) }
                                td.num { (known(lag.unacked)) }
                                td.num { (known(lag.undelivered)) }
                                td.num.lag data-source=(i) { (lag.total()) }
                            },
                        }
                    }
                }
            }
        }
    }
}

/// A figure the broker may not give.
fn known(figure: Option<u64>) -> String {
    figure.map_or_else(|| "not counted by this broker".to_owned(), |n| n.to_string())
}

/// How long a stopped or gone process stays in the relays table before it folds into a closed list (its
/// heartbeat stays in the database for a day).
const FOLD_AFTER_MS: i64 = 15 * 60_000;

/// Every relay process's last heartbeat: the running ones and those that stopped or went quiet in the last
/// 15 minutes, then the older ones folded.
fn processes(relays: &Result<Vec<RelayProcess>, String>, now_ms: i64) -> Markup {
    let folded =
        |relay: &&RelayProcess| matches!(relay.state, "stopped" | "gone") && now_ms - relay.seen_at_ms > FOLD_AFTER_MS;
    html! {
        @match relays {
            Err(message) => p.error #processes-error { "Cannot read the heartbeats: " (message) },
            Ok(relays) if relays.is_empty() => p.muted #processes-empty { "No relay process has written a heartbeat in the last day (an OutboxService writes one at every stats sample)." },
            Ok(relays) => {
                @let (old, recent): (Vec<&RelayProcess>, Vec<&RelayProcess>) = relays.iter().partition(folded);
                (process_table("processes", &recent, now_ms))
                @if !old.is_empty() {
                    details #folded-processes {
                        summary { (old.len()) " stopped or gone " @if old.len() == 1 { "process" } @else { "processes" } ", last seen over 15 minutes ago" }
                        (process_table("folded", &old, now_ms))
                    }
                }
            },
        }
    }
}

fn process_table(id: &str, relays: &[&RelayProcess], now_ms: i64) -> Markup {
    let ago = |ms: i64| format!("{} ago", age(u64::try_from((now_ms - ms) / 1000).unwrap_or(0)));
    html! {
        table id=(id) {
            thead { tr { th { "process" } th { "state" } th.num { "relays" } th { "last heartbeat" } th { "last successful pass" } th.num { "failures in a row" } th.num { "published" } th { "last error" } } }
            tbody {
                @for relay in relays {
                    tr data-process=(relay.process) {
                        td { (relay.host) " pid " (relay.pid) }
                        td { strong class={ "state " (relay.state) } { (relay.state) } }
                        td.num { (relay.relays) }
                        td { (ago(relay.seen_at_ms)) }
                        td { (relay.last_success_at_ms.map(ago).unwrap_or_else(|| "none yet".to_owned())) }
                        td.num { (relay.consecutive_failures) }
                        td.num.published { (relay.published_events) }
                        td.error-text { (relay.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

fn relays(health: Option<&Health>, details: &[(String, String)]) -> Markup {
    html! {
        table #relays {
            tbody {
                @match health {
                    None => tr { th { "relay" } td { "none in this process (the dashboard reads the database only)" } },
                    Some(h) => {
                        tr { th { "state" } td #relay-state { (if h.stopped { "stopped" } else if h.is_healthy() { "healthy" } else { "failing" }) } }
                        tr { th { "last successful pass" } td { (h.last_success_at.map(|t| t.to_rfc3339()).unwrap_or_else(|| "none yet".to_owned())) } }
                        tr { th { "failures in a row" } td { (h.consecutive_failures) } }
                        tr {
                            th { "last error" }
                            @match &h.last_error { Some(error) => td.error-text { (error) }, None => td.muted { "none" } }
                        }
                        tr { th { "published since start" } td { (h.published_events) } }
                        tr { th { "last cleanup" } td { (h.last_cleanup_at.map(|t| t.to_rfc3339()).unwrap_or_else(|| "none yet".to_owned())) } }
                    }
                }
                @for (name, value) in details {
                    tr { th { (name) } td { (value) } }
                }
            }
        }
    }
}

/// The dead events a filter selects, one page of them.
pub(super) struct DeadList {
    pub query: DeadQuery,
    pub rows: Result<(Vec<DeadEvent>, bool, u64), String>,
}

pub(super) fn dead_list(frame: &Frame<'_>, list: &DeadList) -> Markup {
    let base = frame.base;
    html! {
        h1 { "Dead events" }
        form.filter #dead-filter method="get" action={ (base) "/dead" } {
            @for (name, label) in FILTER_FIELDS {
                label { (label) input type="text" name=(name) value=(list.query.value(name).unwrap_or_default()); }
            }
            button #apply-filter type="submit" { "Filter" }
            a href={ (base) "/dead" } { "clear" }
        }
        @match &list.rows {
            Err(message) => p.error #filter-error { (message) },
            Ok((rows, more, count)) => {
                p { span #dead-count { (count) } " dead events match." }
                @if rows.is_empty() {
                    p.muted { "None." }
                } @else {
                    form #dead-form method="post" action={ (base) "/actions/replay" } {
                        @if let Some(admin) = frame.admin {
                            input type="hidden" name="csrf" value=(admin.csrf);
                            (filter_fields(&list.query))
                            div.actions {
                                button.action #replay-selected type="submit" name="scope" value="ids" formaction={ (base) "/actions/replay" } { "Replay selected" }
                                button.action #discard-selected type="submit" name="scope" value="ids" formaction={ (base) "/actions/discard" } { "Discard selected" }
                                button.action #replay-matching type="submit" name="scope" value="filter" formaction={ (base) "/actions/replay" } { "Replay all " (count) " matching" }
                                button.action #discard-matching type="submit" name="scope" value="filter" formaction={ (base) "/actions/discard" } { "Discard all " (count) " matching" }
                            }
                        }
                        table #dead-rows {
                            thead { tr {
                                @if frame.admin.is_some() { th {} }
                                th { "seq" } th { "event" } th { "aggregate" } th.num { "attempts" } th { "died" } th { "last error" }
                            } }
                            tbody {
                                @for row in rows {
                                    tr data-id=(row.id) {
                                        @if frame.admin.is_some() { td { input type="checkbox" name="id" value=(row.id); } }
                                        td.num { (row.seq) }
                                        td { a.event-link href={ (base) "/event?" (form_urlencoded::Serializer::new(String::new()).append_pair("id", &row.id).finish()) } { (row.event_type) " v" (row.schema_version) } }
                                        td { (row.aggregate_type) " / " (row.aggregate_id) " #" (row.aggregate_version) }
                                        td.num { (row.attempts) }
                                        td { (row.dead_at) }
                                        td.error-text { (outbox_seaorm::text::truncate(row.last_error.as_deref().unwrap_or(""), 160)) }
                                    }
                                }
                            }
                        }
                    }
                    @if *more {
                        @if let Some(last) = rows.last() {
                            a #next-page href={ (base) "/dead?" (list.query.query_string(&[("after", &last.seq.to_string())])) } { "Next " (DEAD_PAGE) " →" }
                        }
                    }
                }
            }
        }
    }
}

fn filter_fields(query: &DeadQuery) -> Markup {
    html! {
        @for (name, _) in LETTER_FIELDS {
            @if let Some(value) = query.value(name) { input type="hidden" name=(name) value=(value); }
        }
    }
}

/// What an action would do, asked before it runs.
pub(super) struct Confirm<'a> {
    pub action: &'a str,
    pub admin: &'a Admin,
    /// The consumer dead-letter source acted on; `None` for dead outbox rows.
    pub source: Option<usize>,
    pub query: &'a DeadQuery,
    /// The selected ids, when the scope is a selection.
    pub ids: Option<&'a [String]>,
    pub count: u64,
    /// A discard by filter: the words to type.
    pub typed: Option<String>,
    pub note: Option<&'a str>,
}

/// What the items acted on are called: `dead event`, `dead letter`.
fn noun(source: Option<usize>) -> &'static str {
    if source.is_some() { "dead letter" } else { "dead event" }
}

/// The list an action came from, with its filter.
fn back(frame: &Frame<'_>, source: Option<usize>, query: &DeadQuery) -> Markup {
    let base = frame.base;
    html! {
        @match source {
            None => a #back href={ (base) "/dead?" (query.query_string(&[])) } { "Back to the dead events" },
            Some(s) => a #back href={ (base) "/letters?" (query.query_string(&[("s", &s.to_string())])) } { "Back to the dead letters" },
        }
    }
}

pub(super) fn confirm(frame: &Frame<'_>, c: &Confirm<'_>) -> Markup {
    let base = frame.base;
    html! {
        h1 { "Confirm: " (c.action) }
        @if let Some(note) = c.note { p.error #confirm-note { (note) } }
        p { "This will " (c.action) " " strong #confirm-count { (c.count) } " " (noun(c.source)) @if c.count != 1 { "s" } "."
            @match (c.action, c.source) {
                ("discard", None) => " Discarded events are deleted for good; consumers will see a gap.",
                ("discard", Some(_)) => " Discarded letters are deleted for good; their consumer never applies them.",
                (_, None) => " They become pending now and the relays publish them in order.",
                (_, Some(_)) => " They are published again where they were first published; the consumer applies each once (its inbox drops any it had applied).",
            } }
        @if c.count > 0 {
            form method="post" action={ (base) "/actions/" (c.action) } {
                input type="hidden" name="csrf" value=(c.admin.csrf);
                input type="hidden" name="confirmed" value="yes";
                input type="hidden" name="expected" value=(c.count);
                @if let Some(source) = c.source { input type="hidden" name="s" value=(source); }
                (filter_fields(c.query))
                @match c.ids {
                    Some(ids) => { input type="hidden" name="scope" value="ids"; @for id in ids { input type="hidden" name="id" value=(id); } }
                    None => input type="hidden" name="scope" value="filter";,
                }
                @if let Some(words) = &c.typed {
                    label { "Type " code #typed-words { (words) } " to confirm: " input #typed type="text" name="typed" autocomplete="off" required; }
                }
                button.action #confirm type="submit" { (c.action) " " (c.count) }
            }
        }
        (back(frame, c.source, c.query))
    }
}

pub(super) fn done(frame: &Frame<'_>, action: &str, source: Option<usize>, changed: u64) -> Markup {
    html! {
        h1 { "Done" }
        p #done { (if action == "replay" { "Replayed " } else { "Discarded " }) strong #changed { (changed) } " " (noun(source)) @if changed != 1 { "s" } "." }
        (back(frame, source, &DeadQuery::default()))
    }
}

/// One source's consumer dead letters that a filter selects.
pub(super) struct LetterList<'a> {
    pub source: usize,
    /// Every source's label, for the switcher.
    pub labels: &'a [String],
    pub query: DeadQuery,
    /// The oldest matching letters, how many match, and whether that count stopped at its cap.
    pub letters: Result<(Vec<DeadLetterEntry>, usize, bool), String>,
}

pub(super) fn letter_list(frame: &Frame<'_>, list: &LetterList<'_>) -> Markup {
    let base = frame.base;
    let s = list.source.to_string();
    html! {
        h1 { "Consumer dead letters" }
        @if list.labels.len() > 1 {
            p #sources { @for (i, label) in list.labels.iter().enumerate() {
                @if i == list.source { strong { (label) } } @else { a href={ (base) "/letters?s=" (i) } { (label) } } " "
            } }
        }
        p.muted #letter-source { (list.labels.get(list.source).map(String::as_str).unwrap_or_default()) }
        form.filter #letter-filter method="get" action={ (base) "/letters" } {
            input type="hidden" name="s" value=(s);
            @for (name, label) in LETTER_FIELDS {
                label { (label) input type="text" name=(name) value=(list.query.value(name).unwrap_or_default()); }
            }
            button #apply-filter type="submit" { "Filter" }
            a href={ (base) "/letters?s=" (s) } { "clear" }
        }
        @match &list.letters {
            Err(message) => p.error #filter-error { (message) },
            Ok((letters, matching, capped)) => {
                p { span #letter-count { (matching) @if *capped { "+" } } " dead letters match"
                    @if *capped { " (counted up to " (COUNT_CAP) ")" }
                    @if letters.len() < *matching { "; the oldest " (LIST_LIMIT) " are listed" } "." }
                @if letters.is_empty() {
                    p.muted { "None." }
                } @else {
                    form #letter-form method="post" action={ (base) "/actions/replay" } {
                        @if let Some(admin) = frame.admin {
                            input type="hidden" name="csrf" value=(admin.csrf);
                            input type="hidden" name="s" value=(s);
                            (filter_fields(&list.query))
                            div.actions {
                                button.action #replay-selected type="submit" name="scope" value="ids" formaction={ (base) "/actions/replay" } { "Replay selected" }
                                button.action #discard-selected type="submit" name="scope" value="ids" formaction={ (base) "/actions/discard" } { "Discard selected" }
                                button.action #replay-matching type="submit" name="scope" value="filter" formaction={ (base) "/actions/replay" } { "Replay all matching" }
                                button.action #discard-matching type="submit" name="scope" value="filter" formaction={ (base) "/actions/discard" } { "Discard all matching" }
                            }
                        }
                        table #letter-rows {
                            thead { tr {
                                @if frame.admin.is_some() { th {} }
                                th { "id" } th { "consumer" } th { "event" } th { "aggregate" } th.num { "attempts" } th { "died" } th { "reason" }
                            } }
                            tbody {
                                @for letter in letters {
                                    tr data-id=(letter.id) {
                                        @if frame.admin.is_some() { td { input type="checkbox" name="id" value=(letter.id); } }
                                        td { a.letter-link href={ (base) "/letter?" (form_urlencoded::Serializer::new(String::new()).append_pair("s", &s).append_pair("id", &letter.id).finish()) } { (letter.id) } }
                                        td { (dash(&letter.consumer)) }
                                        td { (dash(&letter.event_type)) }
                                        td { (dash(&letter.aggregate_type)) " / " (dash(&letter.aggregate_id)) }
                                        td.num { (letter.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string())) }
                                        td { (dash(&letter.dead_at)) }
                                        td.error-text { (outbox_seaorm::text::truncate(letter.reason.as_deref().unwrap_or(""), 160)) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One consumer dead letter, headers and payload included.
pub(super) fn letter(frame: &Frame<'_>, source: usize, id: &str, letter: Option<&DeadLetterEntry>) -> Markup {
    let base = frame.base;
    html! {
        @match letter {
            None => { h1 { "No such dead letter" } p #letter-state { "No dead letter has the id " code { (id) } " (it may have been replayed or discarded)." } }
            Some(letter) => {
                h1 { "Dead letter " (letter.id) }
                table.detail {
                    tbody {
                        tr { th { "consumer" } td #letter-consumer { (dash(&letter.consumer)) } }
                        tr { th { "event" } td { (dash(&letter.event_type)) " " (dash(&letter.event_id)) } }
                        tr { th { "aggregate" } td { (dash(&letter.aggregate_type)) " / " (dash(&letter.aggregate_id)) } }
                        tr { th { "attempts" } td { (letter.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string())) } }
                        tr { th { "died" } td { (dash(&letter.dead_at)) } }
                        tr { th { "first published to" } td { (dash(&letter.origin)) } }
                        tr { th { "reason" } td.error-text #letter-reason { (dash(&letter.reason)) } }
                    }
                }
                h2 { "Payload" }
                pre #payload { (letter.payload.as_ref().map(pretty).unwrap_or_default()) }
                h2 { "Headers" }
                table #letter-headers { tbody { @for (name, value) in letter.headers.iter().flatten() { tr { th { (name) } td { (value) } } } } }
                @if let Some(admin) = frame.admin {
                    form method="post" action={ (base) "/actions/replay" } {
                        input type="hidden" name="csrf" value=(admin.csrf);
                        input type="hidden" name="s" value=(source);
                        input type="hidden" name="scope" value="ids";
                        input type="hidden" name="id" value=(letter.id);
                        div.actions {
                            button.action #replay-one type="submit" { "Replay this letter" }
                            button.action #discard-one type="submit" formaction={ (base) "/actions/discard" } { "Discard this letter" }
                        }
                    }
                }
            }
        }
        (back(frame, Some(source), &DeadQuery::default()))
    }
}

fn dash(value: &Option<String>) -> &str {
    value.as_deref().unwrap_or("-")
}

pub(super) fn message(title: &str, text: &str) -> Markup {
    html! { h1 { (title) } p.error #message { (text) } }
}

/// The overview's path: the mount point itself (a nested router does not answer its path plus `/`).
pub(super) fn home(base: &str) -> &str {
    if base.is_empty() { "/" } else { base }
}

/// `3h 12m`, `45s`.
fn age(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m {}s", seconds / 60, seconds % 60),
        3600..86_400 => format!("{}h {}m", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d {}h", seconds / 86_400, seconds % 86_400 / 3600),
    }
}

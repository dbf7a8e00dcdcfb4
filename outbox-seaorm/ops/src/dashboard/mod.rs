//! An operations dashboard: the backlog, the dead events and what to do about them, in a browser.
//!
//! [`Dashboard::router`] is an axum [`Router`] an app mounts where it likes (under its own auth, if it
//! has one); `outbox relay --http ADDR --dashboard` and `outbox dashboard` serve the same pages. The HTML
//! is rendered on the server (maud, every database value escaped), with one small script that refreshes
//! the overview: no build step, no CDN, works offline.
//!
//! - `/`: pending, dead, oldest pending age, published per second over the last 15 minutes, hour or day
//!   (`?span=15m|1h|24h`, counted from the published times in the table, so the history is there on the
//!   first view), the backlog per aggregate type and event type, the 20 aggregates most behind, and the
//!   relay processes.
//! - `/aggregate?aggregate_type=…&aggregate_id=…`: one aggregate's latest 100 events, whether and when each
//!   was published and where to ([`DashboardConfig::with_destination`]).
//! - `/dead`: the dead events, filtered by aggregate, event type, error text and age, 50 per page;
//!   `/event?id=…`: one row in any state, payload and headers pretty-printed.
//! - `/letters`, `/letter?s=…&id=…`: the consumers' dead letters of each broker transport given to
//!   [`Dashboard::with_dead_letters`], per consumer, with the same filters (and the consumer), and one
//!   letter's headers and payload.
//! - Replay and discard (a selection, one row, or every row a filter selects) exist only with an admin
//!   token ([`DashboardConfig::with_admin_token`]). A person signs in with the token; each action is a
//!   POST that carries the session cookie and a CSRF token, shows its count before it runs, and is
//!   logged with what it changed. A discard by filter needs the count typed back.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_ops::dashboard::{Dashboard, DashboardConfig};
//!
//! let db = outbox_seaorm::connect("postgres://outbox@db/app").await?;
//! let config = DashboardConfig::read_only().with_admin_token(std::env::var("OUTBOX_ADMIN_TOKEN")?)?;
//! // Mounted under the app's own path (and its own auth layer, if it has one); serve `app` as usual.
//! let app: axum::Router = axum::Router::new().nest("/ops/outbox", Dashboard::new(db, config).router());
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! Every query is bounded: the backlog figures read the unpublished rows once per refresh interval
//! whatever the number of browsers (in the background, and only while someone looks), lists have a
//! `LIMIT` and a keyset on `seq` over the dead rows' index, the chart counts a range of the
//! published-time index per bucket: the whole span on its first view, then at most once per refresh
//! interval the last minute or so.

mod actions;
mod auth;
mod chart;
mod form;
mod letters;
mod read;
mod slot;
mod view;

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, OriginalUri, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::Utc;
use maud::Markup;
use sea_orm::DatabaseConnection;

use outbox_seaorm::consume::DeadLetters;
use outbox_seaorm::{Destination, Health, OutboxService};

use crate::admin;
use auth::{Admin, Gate};
use chart::{Bar, History, Span};
use form::{DeadQuery, field};
use letters::{LetterCounts, Letters};
use outbox_seaorm::{Error, Result};
use read::Backlog;
use view::Frame;

/// The shortest admin token accepted.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// How the dashboard behaves. [`DashboardConfig::read_only`] (the default) shows everything and changes
/// nothing.
#[derive(Clone)]
pub struct DashboardConfig {
    admin_token: Option<String>,
    refresh: Duration,
    details: Vec<(String, String)>,
    destination: Option<Destination>,
    log_slot: Option<String>,
}

impl fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DashboardConfig")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<redacted>"))
            .field("refresh", &self.refresh)
            .field("details", &self.details)
            .field("destination", &self.destination.as_ref().map(Destination::template))
            .field("log_slot", &self.log_slot)
            .finish()
    }
}

impl Default for DashboardConfig {
    fn default() -> Self {
        Self::read_only()
    }
}

impl DashboardConfig {
    /// No actions: the pages show no button and every POST but sign-in is answered 403.
    pub fn read_only() -> Self {
        let refresh = Duration::from_secs(5);
        DashboardConfig { admin_token: None, refresh, details: Vec::new(), destination: None, log_slot: None }
    }

    /// Replay and discard for whoever signs in with `token` (at least [`MIN_ADMIN_TOKEN_LEN`] bytes, no
    /// whitespace). The token never appears in a page, a cookie or a log.
    pub fn with_admin_token(mut self, token: impl Into<String>) -> Result<Self> {
        let token = token.into();
        if token.len() < MIN_ADMIN_TOKEN_LEN || token.chars().any(char::is_whitespace) {
            return Err(Error::invalid_config(
                "admin token",
                format!(
                    "must be at least {MIN_ADMIN_TOKEN_LEN} bytes without whitespace (got {} bytes); generate one, \
                     e.g. `openssl rand -hex 32`",
                    token.len()
                ),
            ));
        }
        self.admin_token = Some(token);
        Ok(self)
    }

    /// How often the overview refreshes itself in the browser (default 5 s; at least 1 s).
    pub fn with_refresh(mut self, every: Duration) -> Self {
        self.refresh = every.max(Duration::from_secs(1));
        self
    }

    /// Where the relay publishes: the aggregate lookup and the event pages then show each event's
    /// destination (subject, topic, routing key or stream), rendered from the row as the relay renders it.
    pub fn with_destination(mut self, destination: Destination) -> Self {
        self.destination = Some(destination);
        self
    }

    /// A line in the overview's "relays" table, e.g. `("wake-up", "LISTEN outbox_events")`. Never pass a
    /// secret: it is shown as given.
    pub fn with_detail(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.details.push((name.into(), value.into()));
        self
    }
}

type HealthSource = Box<dyn Fn() -> Option<Health> + Send + Sync>;

/// The dashboard over one outbox database; [`Dashboard::router`] serves it.
pub struct Dashboard {
    db: DatabaseConnection,
    config: DashboardConfig,
    health: Option<HealthSource>,
    letter_sources: Vec<Letters>,
}

impl fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dashboard").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Dashboard {
    /// The dashboard of the outbox in `db`.
    pub fn new(db: DatabaseConnection, config: DashboardConfig) -> Self {
        Dashboard { db, config, health: None, letter_sources: Vec::new() }
    }

    /// Shows the relays of `service`, running in this process, at each refresh; the app keeps the service
    /// (to shut it down).
    pub fn with_service(self, service: &OutboxService) -> Self {
        let probe = service.health_probe();
        self.with_health(move || Some(probe.health()))
    }

    /// Shows the relays of this process: `health` is asked at each refresh, e.g.
    /// `move || Some(service.health())` for an [`OutboxService`].
    pub fn with_health(mut self, health: impl Fn() -> Option<Health> + Send + Sync + 'static) -> Self {
        self.health = Some(Box::new(health));
        self
    }

    /// Shows the consumer dead letters of `transport` (a broker transport opened as its consumer opens
    /// it): counts per consumer on the overview, a filtered list, each letter's detail, and, with an
    /// admin token, replay and discard. Call once per broker or consumer; the counts walk at most 10,000
    /// letters each, read with the backlog while someone looks.
    pub fn with_dead_letters(mut self, transport: impl DeadLetters + 'static) -> Self {
        self.letter_sources.push(Letters::new(transport));
        self
    }

    /// The pages, ready to serve or to [`nest`](Router::nest) under a path of the app's. Call it inside a
    /// Tokio runtime: the chart's sampler starts with the first request and stops with the router.
    pub fn router(self) -> Router {
        let shared = Arc::new(Shared {
            db: self.db,
            gate: Gate::new(self.config.admin_token.clone()),
            config: self.config,
            health: self.health,
            letter_sources: self.letter_sources,
            letter_counts: Mutex::new(Vec::new()),
            reading: tokio::sync::Mutex::new(()),
            histories: tokio::sync::Mutex::new(Span::ALL.map(History::new)),
            backlog: Mutex::new(None),
            viewed_at_ms: AtomicI64::new(0),
            sampler: OnceLock::new(),
        });
        Router::new()
            .route("/", get(index))
            .route("/fragments/overview", get(overview_fragment))
            .route("/dead", get(dead))
            .route("/event", get(event))
            .route("/aggregate", get(aggregate))
            .route("/letters", get(letter_list))
            .route("/letter", get(letter))
            .route("/login", post(login))
            .route("/logout", post(logout))
            .route("/actions/{action}", post(actions::action))
            .route("/assets/dashboard.js", get(script))
            .route("/assets/dashboard.css", get(style))
            .with_state(shared)
    }
}

struct Shared {
    db: DatabaseConnection,
    gate: Gate,
    config: DashboardConfig,
    health: Option<HealthSource>,
    letter_sources: Vec<Letters>,
    /// The last counts of the consumer dead letters, read with the backlog.
    letter_counts: Mutex<Vec<LetterCounts>>,
    /// Held while the backlog is read: one read at a time.
    reading: tokio::sync::Mutex<()>,
    /// The chart's counts per span, read from the table on view and kept between views.
    histories: tokio::sync::Mutex<[History; 3]>,
    /// The last reading of the backlog: the pages show it, the sampler renews it.
    backlog: Mutex<Option<std::result::Result<Backlog, String>>>,
    /// When a page last showed the backlog (epoch ms): the sampler reads it only while someone looks.
    viewed_at_ms: AtomicI64,
    sampler: OnceLock<()>,
}

/// How long after the last view the sampler keeps reading the backlog.
const VIEWED_FOR: Duration = Duration::from_secs(120);

/// The request's place: where the dashboard is mounted, who asks, and the headers that say so.
struct Visit {
    base: String,
    admin: Option<Admin>,
    headers: HeaderMap,
}

impl FromRequestParts<Arc<Shared>> for Visit {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, shared: &Arc<Shared>) -> std::result::Result<Self, Self::Rejection> {
        let original = parts.extensions.get::<OriginalUri>().map_or(&parts.uri, |o| &o.0);
        Ok(Visit {
            base: base(original, &parts.uri),
            admin: shared.gate.admin(&parts.headers),
            headers: parts.headers.clone(),
        })
    }
}

impl Shared {
    fn frame<'a>(&self, visit: &'a Visit) -> Frame<'a> {
        Frame {
            base: &visit.base,
            admin: visit.admin.as_ref(),
            read_only: self.gate.read_only(),
            refresh_ms: self.config.refresh.as_millis() as u64,
            letter_sources: self.letter_sources.len(),
        }
    }

    /// Starts the sampler once; it stops when the router is dropped. While a page was viewed in the last
    /// two minutes it reads the backlog again every `refresh`: the pages answer from memory however many
    /// browsers refresh them.
    fn start_sampler(self: &Arc<Self>) {
        self.sampler.get_or_init(|| {
            let shared = Arc::downgrade(self);
            let refresh = self.config.refresh;
            tokio::spawn(async move {
                loop {
                    let Some(this) = shared.upgrade() else { break };
                    let now_ms = Utc::now().timestamp_millis();
                    let viewed = now_ms - this.viewed_at_ms.load(Ordering::Relaxed) < VIEWED_FOR.as_millis() as i64;
                    let read_at = match &*this.backlog.lock().unwrap_or_else(PoisonError::into_inner) {
                        Some(Ok(backlog)) => backlog.read_at_ms,
                        _ => 0,
                    };
                    if viewed && now_ms - read_at >= refresh.as_millis() as i64 {
                        let _kept_for_the_pages = this.fresh_backlog(refresh).await;
                    }
                    drop(this);
                    tokio::time::sleep(refresh).await;
                }
            });
        });
    }

    /// The bars of `span` and the rate of the last complete 15 seconds, from the published times in the
    /// table: the whole span on the first view, then at most once per refresh interval only the buckets
    /// that may still change. Concurrent views wait for one read.
    async fn chart(&self, span: Span) -> std::result::Result<(Vec<Bar>, Option<f64>), String> {
        let mut histories = self.histories.lock().await;
        let now_ms = Utc::now().timestamp_millis();
        for wanted in [Span::Quarter, span] {
            let history = &mut histories[wanted.index()];
            if now_ms - history.read_at_ms < self.config.refresh.as_millis() as i64 {
                continue;
            }
            let (from_ms, bucket_ms) = history.next_read(now_ms);
            match read::published_per_bucket(&self.db, from_ms, bucket_ms).await {
                Ok(counts) => history.merge(from_ms, counts, now_ms),
                Err(error) => {
                    tracing::debug!(%error, "dashboard: cannot count the published rows");
                    return Err(error.to_string());
                }
            }
        }
        let rate = chart::last_rate(&histories[Span::Quarter.index()].bars(now_ms));
        Ok((histories[span.index()].bars(now_ms), rate))
    }

    /// The kept reading of the backlog when it is younger than `max_age`; otherwise a new one. One read at
    /// a time: a caller that waited for another's read takes its result.
    async fn fresh_backlog(&self, max_age: Duration) -> std::result::Result<Backlog, String> {
        let _turn = self.reading.lock().await;
        match self.kept_backlog(max_age) {
            Some(backlog) => Ok(backlog),
            None => self.read_backlog().await,
        }
    }

    /// The kept reading of the backlog, if it is younger than `max_age`.
    fn kept_backlog(&self, max_age: Duration) -> Option<Backlog> {
        let fresh_after = Utc::now().timestamp_millis() - max_age.as_millis() as i64;
        match &*self.backlog.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(Ok(backlog)) if backlog.read_at_ms >= fresh_after => Some(backlog.clone()),
            _ => None,
        }
    }

    /// Reads the backlog and counts the consumer dead letters now, and keeps both for the pages.
    async fn read_backlog(&self) -> std::result::Result<Backlog, String> {
        let counting = async {
            let mut counts = Vec::with_capacity(self.letter_sources.len());
            for source in &self.letter_sources {
                counts.push(source.count().await);
            }
            counts
        };
        let (backlog, counts) = tokio::join!(read::backlog(&self.db), counting);
        *self.letter_counts.lock().unwrap_or_else(PoisonError::into_inner) = counts;
        let backlog = backlog.map_err(|e| e.to_string());
        if let Err(error) = &backlog {
            tracing::debug!(%error, "dashboard: cannot read the backlog");
        }
        *self.backlog.lock().unwrap_or_else(PoisonError::into_inner) = Some(backlog.clone());
        backlog
    }

    /// The overview. `wait`: read the backlog when the kept reading is stale (the fragment); otherwise
    /// (the page) answer at once with a placeholder the script replaces as soon as the reading is done.
    async fn overview_markup(self: &Arc<Self>, frame: &Frame<'_>, span: Span, wait: bool) -> Markup {
        self.viewed_at_ms.store(Utc::now().timestamp_millis(), Ordering::Relaxed);
        self.start_sampler();
        // The sampler's reading, unless nobody looked for a while and it stopped renewing it.
        let max_age = 2 * self.config.refresh;
        let backlog = match self.kept_backlog(max_age) {
            Some(backlog) => Ok(backlog),
            None if wait => self.fresh_backlog(max_age).await,
            None => {
                let this = Arc::clone(self);
                tokio::spawn(async move { this.fresh_backlog(max_age).await });
                return view::reading();
            }
        };
        let chart = self.chart(span).await;
        let letters = self.letter_counts.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let overview = view::Overview {
            letters: &letters,
            backlog,
            chart,
            span,
            now_ms: Utc::now().timestamp_millis(),
            health: self.health.as_ref().and_then(|health| health()),
            details: &self.config.details,
            slot: slot::panel(&self.db, self.config.log_slot.as_deref()).await,
        };
        view::overview(frame, &overview)
    }
}

/// The path the dashboard is mounted under: the original path minus the router's own.
fn base(original: &Uri, uri: &Uri) -> String {
    let (outer, inner) = (original.path(), uri.path());
    let base = if inner == "/" { outer } else { outer.strip_suffix(inner).unwrap_or("") };
    base.trim_end_matches('/').to_owned()
}

type Ctx = State<Arc<Shared>>;

/// The chart's span the query names (`span=15m|1h|24h`).
fn span_of(query: Option<&str>) -> Span {
    let pairs = form::pairs(query.unwrap_or_default().as_bytes());
    Span::parse(field(&pairs, "span"))
}

async fn index(State(s): Ctx, visit: Visit, RawQuery(query): RawQuery) -> Response {
    let frame = s.frame(&visit);
    let body = s.overview_markup(&frame, span_of(query.as_deref()), false).await;
    html(StatusCode::OK, view::page(&frame, "Overview", body))
}

async fn overview_fragment(State(s): Ctx, visit: Visit, RawQuery(query): RawQuery) -> Response {
    let frame = s.frame(&visit);
    html(StatusCode::OK, s.overview_markup(&frame, span_of(query.as_deref()), true).await)
}

async fn dead(State(s): Ctx, visit: Visit, RawQuery(query): RawQuery) -> Response {
    let frame = s.frame(&visit);
    let pairs = form::pairs(query.unwrap_or_default().as_bytes());
    let dead_query = DeadQuery::from_pairs(&pairs);
    let after = field(&pairs, "after").and_then(|a| a.parse::<i64>().ok());
    let rows = match dead_query.filter() {
        Err(message) => Err(message),
        Ok(filter) => async {
            let (rows, more) = read::dead_page(&s.db, &filter, after).await?;
            let count = admin::count_dead(&s.db, &filter).await?;
            Ok::<_, Error>((rows, more, count))
        }
        .await
        .map_err(|e| e.to_string()),
    };
    let status = if rows.is_err() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let list = view::DeadList { query: dead_query, rows };
    html(status, view::page(&frame, "Dead events", view::dead_list(&frame, &list)))
}

async fn event(State(s): Ctx, visit: Visit, RawQuery(query): RawQuery) -> Response {
    let frame = s.frame(&visit);
    let pairs = form::pairs(query.unwrap_or_default().as_bytes());
    let id = outbox_seaorm::text::truncate(field(&pairs, "id").unwrap_or_default(), 200);
    match read::event(&s.db, &id).await {
        Ok(row) => {
            let status = if row.is_some() { StatusCode::OK } else { StatusCode::NOT_FOUND };
            let destination = s.config.destination.as_ref();
            html(status, view::page(&frame, "Event", view::event(&frame, &id, row.as_ref(), destination)))
        }
        Err(error) => failure(&frame, &error),
    }
}

async fn aggregate(State(s): Ctx, visit: Visit, RawQuery(query): RawQuery) -> Response {
    let frame = s.frame(&visit);
    let pairs = form::pairs(query.unwrap_or_default().as_bytes());
    let trimmed = |name| field(&pairs, name).map(str::trim).filter(|v| !v.is_empty());
    let (aggregate_type, aggregate_id) = (trimmed("aggregate_type"), trimmed("aggregate_id"));
    let events = match (aggregate_type, aggregate_id) {
        (Some(aggregate_type), Some(aggregate_id)) => {
            read::aggregate_events(&s.db, aggregate_type, aggregate_id).await.map_err(|e| e.to_string())
        }
        _ => Err("give both the aggregate type and the aggregate id (the lookup reads the outbox by both)".to_owned()),
    };
    let status = if events.is_err() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let lookup = view::Lookup {
        aggregate_type: aggregate_type.unwrap_or_default(),
        aggregate_id: aggregate_id.unwrap_or_default(),
        events,
        destination: s.config.destination.as_ref(),
    };
    html(status, view::page(&frame, "Aggregate", view::aggregate(&frame, &lookup)))
}

async fn letter_list(State(s): Ctx, visit: Visit, RawQuery(query): RawQuery) -> Response {
    let frame = s.frame(&visit);
    let pairs = form::pairs(query.unwrap_or_default().as_bytes());
    let query = DeadQuery::from_pairs(&pairs);
    let labels: Vec<String> = s.letter_sources.iter().map(|source| source.label().to_owned()).collect();
    let source = match form::source(&pairs, labels.len()) {
        Ok(source) => source,
        Err(message) => return not_found(&frame, &message),
    };
    let letters = match query.filter() {
        Err(message) => Err(message),
        Ok(filter) => s.letter_sources[source].list(&filter).await.map_err(|e| e.to_string()),
    };
    let status = if letters.is_err() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let list = view::LetterList { source, labels: &labels, query, letters };
    html(status, view::page(&frame, "Consumer dead letters", view::letter_list(&frame, &list)))
}

async fn letter(State(s): Ctx, visit: Visit, RawQuery(query): RawQuery) -> Response {
    let frame = s.frame(&visit);
    let pairs = form::pairs(query.unwrap_or_default().as_bytes());
    let source = match form::source(&pairs, s.letter_sources.len()) {
        Ok(source) => source,
        Err(message) => return not_found(&frame, &message),
    };
    let id = outbox_seaorm::text::truncate(field(&pairs, "id").unwrap_or_default(), 200);
    match s.letter_sources[source].show(&id).await {
        Ok(letter) => {
            let status = if letter.is_some() { StatusCode::OK } else { StatusCode::NOT_FOUND };
            html(status, view::page(&frame, "Dead letter", view::letter(&frame, source, &id, letter.as_ref())))
        }
        Err(error) => failure(&frame, &error),
    }
}

async fn login(State(s): Ctx, visit: Visit, body: Bytes) -> Response {
    let frame = s.frame(&visit);
    let pairs = form::pairs(&body);
    match s.gate.sign_in(field(&pairs, "token").unwrap_or_default()) {
        Some(session) => {
            tracing::info!("dashboard: an admin signed in");
            let cookie = format!(
                "{}={session}; Path={}; HttpOnly; SameSite=Strict; Max-Age={}",
                auth::COOKIE_NAME,
                view::home(&visit.base),
                auth::SESSION_TTL.as_secs()
            );
            redirect(view::home(&visit.base), Some(cookie))
        }
        None => {
            tracing::warn!("dashboard: a sign-in was refused (wrong token, or the dashboard is read-only)");
            let text = if s.gate.read_only() { auth::Refusal::ReadOnly.message() } else { "wrong admin token" };
            html(StatusCode::FORBIDDEN, view::page(&frame, "Refused", view::message("Refused", text)))
        }
    }
}

async fn logout(State(s): Ctx, visit: Visit, body: Bytes) -> Response {
    let frame = s.frame(&visit);
    let pairs = form::pairs(&body);
    if let Err(refusal) = s.gate.authorize(&visit.headers, field(&pairs, "csrf")) {
        return refused(&frame, refusal);
    }
    s.gate.sign_out(&visit.headers);
    let cookie =
        format!("{}=; Path={}; HttpOnly; SameSite=Strict; Max-Age=0", auth::COOKIE_NAME, view::home(&visit.base));
    redirect(view::home(&visit.base), Some(cookie))
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", include_str!("assets/dashboard.js"))
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", include_str!("assets/dashboard.css"))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    guard(response.headers_mut());
    response
}

/// The same headers on every response: no framing, no sniffing, scripts and styles from here only.
fn guard(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

fn html(status: StatusCode, markup: Markup) -> Response {
    let mut response =
        (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], markup.into_string()).into_response();
    guard(response.headers_mut());
    response
}

fn redirect(to: &str, cookie: Option<String>) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(location) = HeaderValue::from_str(to) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    guard(response.headers_mut());
    response
}

fn not_found(frame: &Frame<'_>, text: &str) -> Response {
    html(StatusCode::NOT_FOUND, view::page(frame, "Not found", view::message("Not found", text)))
}

fn refused(frame: &Frame<'_>, refusal: auth::Refusal) -> Response {
    tracing::warn!(reason = refusal.message(), "dashboard: an action was refused");
    html(StatusCode::FORBIDDEN, view::page(frame, "Refused", view::message("Refused", refusal.message())))
}

fn failure(frame: &Frame<'_>, error: &Error) -> Response {
    tracing::warn!(%error, "dashboard: a database read or write failed");
    let text = error.to_string();
    html(StatusCode::INTERNAL_SERVER_ERROR, view::page(frame, "Error", view::message("The database refused", &text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_where_the_router_is_mounted() {
        let uri = |s: &str| s.parse::<Uri>().expect("uri");
        assert_eq!(base(&uri("/"), &uri("/")), "");
        assert_eq!(base(&uri("/dead?x=1"), &uri("/dead?x=1")), "");
        assert_eq!(base(&uri("/ops/outbox"), &uri("/")), "/ops/outbox");
        assert_eq!(base(&uri("/ops/outbox/"), &uri("/")), "/ops/outbox");
        assert_eq!(base(&uri("/ops/outbox/dead"), &uri("/dead")), "/ops/outbox");
    }

    #[test]
    fn a_short_admin_token_is_refused_and_a_token_never_prints() {
        assert!(DashboardConfig::read_only().with_admin_token("short").is_err());
        assert!(DashboardConfig::read_only().with_admin_token("has a space in it!!").is_err());
        let config = DashboardConfig::read_only().with_admin_token("0123456789abcdef-secret").expect("long enough");
        assert!(!format!("{config:?}").contains("secret"));
    }
}

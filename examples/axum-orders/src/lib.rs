//! An order service on axum with the transactional outbox, in one process:
//!
//! - `POST /orders` places an order through [`OrderService::place`], a `#[transactional_outbox]` method:
//!   the `orders` row and its `order.placed` event commit in one transaction;
//! - the relay publishes committed events to the broker, in a background task;
//! - billing consumes them through the consume driver and writes `invoices` through the
//!   `#[idempotent_handler]` [`orders::bill`], so a redelivered event is billed once;
//! - `GET /orders/{id}` and `GET /invoices` show the result;
//! - `/ops/outbox` is the outbox's operations dashboard ([`outbox_ops::dashboard`]), read-only here; an
//!   app mounts it behind its own auth, and gives it an admin token to allow replay and discard.
//!
//! The binary (`main.rs`) picks the database and the broker; [`serve`] is the whole app, so a test can
//! run it on an ephemeral port. `src/orders.rs` is the README's quick start, verbatim.

pub mod entity;
pub mod memory;
pub mod migration;
// The README shows this file as it is; doc comments on every field would only lengthen it.
#[allow(missing_docs)]
pub mod orders;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use outbox_ops::dashboard::{Dashboard, DashboardConfig};
use outbox_seaorm::consume::Transport;
use outbox_seaorm::prelude::*;
use outbox_seaorm::{BoxError, CancellationToken, OutboxService, Publisher, SeaOrmGroupCommit};
use sea_orm::{DatabaseConnection, DbErr, EntityTrait, QueryOrder, SqlErr};
use tokio::net::TcpListener;

use entity::{invoice, order};
use orders::{OrderService, PlaceOrder, bill};

/// What every handler gets: the pool and the services (cheap to clone; the pool is shared).
#[derive(Clone, Debug)]
pub struct AppState {
    /// The connection pool.
    pub db: DatabaseConnection,
    /// Places orders.
    pub orders: OrderService,
}

/// The HTTP API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/orders", post(place_order))
        .route("/orders/batch", post(place_orders))
        .route("/orders/{id}", get(get_order))
        .route("/invoices", get(list_invoices))
        .with_state(state)
}

/// Serves the API on `listener` and runs the outbox (relay and billing) next to it until `shutdown` is
/// cancelled: the server then stops accepting, finishes the requests it has, and the relay and billing
/// stop with it. An order committed after the relay stopped is published at the next start: the outbox
/// table holds it.
pub async fn serve<P, T>(
    listener: TcpListener,
    db: DatabaseConnection,
    publisher: P,
    transport: T,
    shutdown: CancellationToken,
) -> Result<(), BoxError>
where
    P: Publisher + 'static,
    T: Transport + 'static,
{
    let outbox = tokio::spawn({
        let (db, shutdown) = (db.clone(), shutdown.clone());
        async move {
            let outcome = run_outbox(db, publisher, transport, shutdown.clone()).await;
            shutdown.cancel(); // never serve orders with nobody to publish them
            outcome
        }
    });
    let dashboard = Dashboard::new(db.clone(), DashboardConfig::read_only()).router();
    let app = router(AppState { orders: OrderService { db: db.clone() }, db }).nest("/ops/outbox", dashboard);
    let served = axum::serve(listener, app).with_graceful_shutdown(shutdown.clone().cancelled_owned()).await;
    shutdown.cancel();
    let outbox = outbox.await?;
    served?;
    outbox
}

/// The outbox's background half: the relay publishes committed events through `publisher`, and billing
/// consumes them from `transport`, until `shutdown` is cancelled.
pub async fn run_outbox<P: Publisher + 'static, T: Transport>(
    db: DatabaseConnection,
    publisher: P,
    transport: T,
    shutdown: CancellationToken,
) -> Result<(), BoxError> {
    // The relay (claim → publish → mark), cleanup of published rows and a stats sampler, in the background
    let outbox = OutboxService::builder(SeaOrmStore::new(db.clone()), publisher).shutdown_on(&shutdown).start()?;
    let billing = Consumer::new("billing")
        .with_group_commit(SeaOrmGroupCommit::new(db)) // the inbox's database; up to 64 messages per commit
        .on(bill); // each `OrderPlaced`: inbox row + effect in one transaction
    // fetch → handle → ack after commit; both stop when `shutdown` is cancelled
    let consumed = billing.run(&transport, shutdown).await;
    outbox.stopped().await;
    Ok(consumed?)
}

/// `POST /orders`: 201 with the order, 409 when an order with this id exists (a retried request).
async fn place_order(
    State(state): State<AppState>,
    Json(cmd): Json<PlaceOrder>,
) -> Result<(StatusCode, Json<order::Model>), ApiError> {
    let order = state.orders.place(cmd).await?;
    Ok((StatusCode::CREATED, Json(order)))
}

/// `POST /orders/batch`: 201 with every order, or 409 and none of them when one id exists.
async fn place_orders(
    State(state): State<AppState>,
    Json(cmds): Json<Vec<PlaceOrder>>,
) -> Result<(StatusCode, Json<Vec<order::Model>>), ApiError> {
    let orders = state.orders.place_all(cmds).await?;
    Ok((StatusCode::CREATED, Json(orders)))
}

/// `GET /orders/{id}`.
async fn get_order(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<order::Model>, ApiError> {
    let order = state.orders.get(id).await?.ok_or(ApiError::NotFound)?;
    Ok(Json(order))
}

/// `GET /invoices`: every invoice billing wrote, oldest first.
async fn list_invoices(State(state): State<AppState>) -> Result<Json<Vec<invoice::Model>>, ApiError> {
    Ok(Json(invoice::Entity::find().order_by_asc(invoice::Column::Id).all(&state.db).await?))
}

/// What a handler can fail with, as an HTTP status.
#[derive(Debug)]
enum ApiError {
    NotFound,
    Conflict,
    Db(DbErr),
}

impl From<DbErr> for ApiError {
    fn from(error: DbErr) -> Self {
        // `sql_err()` recognises a unique violation on every backend.
        match error.sql_err() {
            Some(SqlErr::UniqueConstraintViolation(_)) => ApiError::Conflict,
            _ => ApiError::Db(error),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ApiError::NotFound => (StatusCode::NOT_FOUND, "not found"),
            ApiError::Conflict => (StatusCode::CONFLICT, "already exists"),
            ApiError::Db(error) => {
                tracing::error!(%error, "database error");
                (StatusCode::INTERNAL_SERVER_ERROR, "database error")
            }
        };
        (status, Json(serde_json::json!({ "error": message }))).into_response()
    }
}

/// The example's event schemas are locked in `events.lock` (`OUTBOX_BLESS=1 cargo test` adds new ones; a
/// released event that changed fails the build and this test). A unit test, so every event is linked in.
#[cfg(test)]
#[test]
fn events_lock() {
    outbox_seaorm::verify_events_lock_all(concat!(env!("CARGO_MANIFEST_DIR"), "/events.lock")).unwrap();
}

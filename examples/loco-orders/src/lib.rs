//! A minimal Loco 1.2 app with the transactional outbox: `POST /api/orders` writes an order and its
//! `order.placed` event in one transaction, and the [`OutboxRelay`] initializer runs the relay next to
//! the server, from start to graceful shutdown.
//!
//! Loco has no shutdown hook on initializers, so the initializer keeps the running relay in the app's
//! shared store and [`App::on_shutdown`] (called by Loco's graceful shutdown) stops it, letting its
//! current pass finish. Loco calls it when the shutdown signal arrives, while the server still finishes
//! its requests: an order committed after that waits in the outbox table for the next start.

pub mod migration;

use std::path::Path;

use loco_rs::app::{AppContext, Hooks, Initializer};
use loco_rs::bgworker::Queue;
use loco_rs::boot::{BootResult, StartMode, create_app};
use loco_rs::config::Config;
use loco_rs::controller::{AppRoutes, Routes};
use loco_rs::environment::Environment;
use loco_rs::prelude::{State, async_trait, post};
use loco_rs::task::Tasks;
use loco_rs::{Error, Result};
use outbox_seaorm::prelude::*;
use outbox_seaorm::{InMemoryPublisher, OutboxService};
use sea_orm::sea_query::{Alias, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
use serde::{Deserialize, Serialize};

/// The app.
pub struct App;

#[async_trait]
impl Hooks for App {
    fn app_name() -> &'static str {
        env!("CARGO_CRATE_NAME")
    }

    /// The config folder next to this manifest, wherever `cargo run` starts.
    async fn load_config(env: &Environment) -> Result<Config> {
        env.load_from_folder(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config"))
    }

    async fn boot(mode: StartMode, environment: &Environment, config: Config) -> Result<BootResult> {
        create_app::<Self, migration::Migrator>(mode, environment, config).await
    }

    async fn initializers(_ctx: &AppContext) -> Result<Vec<Box<dyn Initializer>>> {
        Ok(vec![Box::new(OutboxRelay)])
    }

    fn routes(_ctx: &AppContext) -> AppRoutes {
        AppRoutes::empty().prefix("/api").add_route(Routes::new().add("/orders", post(place_order)))
    }

    async fn on_shutdown(ctx: &AppContext) {
        OutboxRelay::stop(ctx).await;
    }

    async fn connect_workers(_ctx: &AppContext, _queue: &Queue) -> Result<()> {
        Ok(())
    }

    fn register_tasks(_tasks: &mut Tasks) {}

    async fn truncate(_ctx: &AppContext) -> Result<()> {
        Ok(())
    }

    async fn seed(_ctx: &AppContext, _path: &Path) -> Result<()> {
        Ok(())
    }
}

/// Runs the outbox relay for as long as the app runs.
///
/// It publishes to an [`InMemoryPublisher`] so the skeleton runs without a broker; an app passes its
/// broker's publisher instead (`NatsPublisher`, `KafkaPublisher`, ... with that feature of outbox-seaorm).
pub struct OutboxRelay;

/// The outbox service (relays, cleanup of published rows, a stats sampler), kept in the app's shared store
/// between start and shutdown.
struct RunningOutbox(OutboxService);

#[async_trait]
impl Initializer for OutboxRelay {
    fn name(&self) -> String {
        "outbox-relay".to_owned()
    }

    /// Starts the relay on the app's own connection pool, after migrations ran.
    async fn before_run(&self, ctx: &AppContext) -> Result<()> {
        let store = SeaOrmStore::new(ctx.db.clone());
        // An app passes its broker's publisher here (`brokers::nats::NatsPublisher`, ...).
        let service = OutboxService::builder(store, InMemoryPublisher::new()).start().map_err(Error::wrap)?;
        ctx.shared_store.insert(RunningOutbox(service));
        tracing::info!("outbox service started");
        Ok(())
    }
}

impl OutboxRelay {
    /// Stops the relay [`before_run`](Initializer::before_run) started and waits for its current pass.
    pub async fn stop(ctx: &AppContext) {
        let Some(RunningOutbox(service)) = ctx.shared_store.remove::<RunningOutbox>() else { return };
        service.shutdown().await; // claims nothing more; the batch in flight is recorded or released
    }
}

/// An order was placed.
#[derive(DomainEvent, Clone, Debug, Serialize, Deserialize)]
#[domain_event(name = "order.placed", version = 1, aggregate = "order")]
pub struct OrderPlaced {
    /// The order.
    #[aggregate_id]
    pub order_id: String,
    /// Who ordered.
    pub customer: String,
}

/// The body of `POST /api/orders`.
#[derive(Clone, Debug, Deserialize)]
pub struct PlaceOrder {
    /// Chosen by the client.
    pub id: String,
    /// Who orders.
    pub customer: String,
}

/// Writes the order and its event in one transaction: both commit or neither does.
#[transactional_outbox]
pub async fn place(db: &DatabaseConnection, cmd: PlaceOrder) -> Result<(), DbErr> {
    let mut insert = Query::insert();
    insert
        .into_table(Alias::new("orders"))
        .columns([Alias::new("id"), Alias::new("customer")])
        .values([cmd.id.clone().into(), cmd.customer.clone().into()])
        .map_err(|e| DbErr::Custom(e.to_string()))?;
    db.execute(&insert).await?;
    emit!(OrderPlaced { order_id: cmd.id, customer: cmd.customer });
    Ok(())
}

/// `POST /api/orders`.
async fn place_order(
    State(ctx): State<AppContext>,
    loco_rs::prelude::Json(cmd): loco_rs::prelude::Json<PlaceOrder>,
) -> Result<loco_rs::prelude::Response> {
    place(&ctx.db, cmd).await?;
    loco_rs::prelude::format::empty()
}

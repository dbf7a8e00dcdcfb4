//! Run with: cargo run -p outbox-example-loco
//!
//! Then `curl -i localhost:5150/api/orders -H 'content-type: application/json' -d '{"id":"o1","customer":"ada"}'`;
//! Ctrl-C stops the server gracefully and, through `App::on_shutdown`, the outbox relay.
//!
//! Loco's CLI (`cargo loco start`, `db migrate`, ...) is its `cli` feature, left out to keep the build small;
//! this boots the way `cargo loco start` does.

use loco_rs::app::Hooks;
use loco_rs::boot::{ServeParams, StartMode, start};
use loco_rs::environment::{Environment, resolve_from_env};
use outbox_example_loco::App;

#[tokio::main]
async fn main() -> loco_rs::Result<()> {
    let environment: Environment = resolve_from_env().into();
    let config = App::load_config(&environment).await?;
    loco_rs::logger::init::<App>(&config.logger)?;
    let serve = ServeParams { port: config.server.port, binding: config.server.binding.clone() };
    let boot = App::boot(StartMode::ServerOnly, &environment, config).await?;
    start::<App>(boot, serve, false).await
}

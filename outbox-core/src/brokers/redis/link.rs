//! One multiplexed Redis connection, opened on first use and again after it broke.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisError, Value};
use tokio::sync::Mutex;

use crate::brokers::{BrokerKind, BrokerUrl};
use crate::error::{Error, Result};
use crate::text::redact_url;

/// Checks `url` before connecting: a `redis://` or `rediss://` URL with a host that the client accepts.
pub(super) fn open_client(url: &str) -> Result<Client> {
    let url = BrokerUrl::parse(url)?.expect(BrokerKind::Redis, "redis://host:6379 or rediss://host:6379")?;
    Client::open(url.expose())
        .map_err(|e| Error::invalid_config("broker_url", format!("{url:?} is not a valid Redis URL: {e}")))
}

/// Whether an error means the connection is unusable and the next command should open a new one.
fn breaks_connection(error: &RedisError) -> bool {
    error.is_io_error() || error.is_timeout() || error.is_connection_dropped() || error.is_unrecoverable_error()
}

/// One multiplexed connection, opened on first use and again after it broke.
pub(super) struct Link {
    client: Client,
    config: AsyncConnectionConfig,
    pub(super) url: String,
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
}

impl Link {
    pub(super) fn new(url: &str, connect_timeout: Duration, response_timeout: Duration) -> Result<Self> {
        let client = open_client(url)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout));
        Ok(Link { client, config, url: redact_url(url), current: Mutex::new(None), generation: AtomicU64::new(0) })
    }

    /// The open connection, or a new one.
    pub(super) async fn get(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        let mut current = self.current.lock().await;
        if let Some((generation, connection)) = current.as_ref() {
            return Ok((*generation, connection.clone()));
        }
        let connection = self.client.get_multiplexed_async_connection_with_config(&self.config).await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *current = Some((generation, connection.clone()));
        tracing::debug!(messaging.system = "redis", url = %self.url, "connected to Redis");
        Ok((generation, connection))
    }

    /// Forgets connection `generation` if `error` broke it, so the next command reconnects.
    async fn check(&self, generation: u64, error: &RedisError) {
        if breaks_connection(error) {
            let mut current = self.current.lock().await;
            if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                *current = None;
                tracing::debug!(messaging.system = "redis", url = %self.url, %error, "Redis connection dropped");
            }
        }
    }

    pub(super) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let (generation, mut connection) = self.get().await?;
        let result = cmd.query_async::<Value>(&mut connection).await;
        if let Err(error) = &result {
            self.check(generation, error).await;
        }
        result
    }

    pub(super) async fn query_pipeline(&self, pipe: &Pipeline) -> Result<Vec<Value>, RedisError> {
        let (generation, mut connection) = self.get().await?;
        let result = pipe.query_async::<Vec<Value>>(&mut connection).await;
        if let Err(error) = &result {
            self.check(generation, error).await;
        }
        result
    }
}

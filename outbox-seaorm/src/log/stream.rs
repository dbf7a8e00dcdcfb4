//! The replication connection behind a small trait, so the client crate can be swapped: what the relay
//! reads ([`LogMessage`]) and the one thing it tells the server (how far it has confirmed).

use std::future::Future;
use std::time::Duration;

use pgwire_replication::{
    FeedbackObserver, Lsn, PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent, SslMode, TlsConfig,
};

use super::{LogError, LogRelayConfig};

/// One message of the stream, in the order the server sends them: whole transactions in commit order.
#[derive(Debug)]
pub(crate) enum LogMessage {
    /// A transaction starts; `xid` is its (32-bit) id.
    Begin { xid: u32 },
    /// A `pgoutput` message inside it (a relation or a change).
    Change(bytes::Bytes),
    /// It committed; confirming `end_lsn` means everything up to and including it is done.
    Commit { end_lsn: u64 },
    /// The server is alive and has sent everything before `wal_end`.
    KeepAlive { wal_end: u64 },
}

/// A logical replication stream of one slot.
pub(crate) trait ReplicationStream: Send {
    /// The next message; `Ok(None)` when the stream ended.
    fn next(&mut self) -> impl Future<Output = Result<Option<LogMessage>, LogError>> + Send;

    /// The next message if one is already here, without waiting.
    fn try_next(&mut self) -> impl Future<Output = Result<Option<LogMessage>, LogError>> + Send;

    /// Everything up to `lsn` is done: the server may free it and never sends it again.
    fn confirm(&self, lsn: u64);

    /// Ends the stream, sending the last confirmed position first.
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// Why a stream could not start or went away.
#[derive(Debug)]
pub(crate) enum StreamFailure {
    /// Another connection reads the slot (a relay that is still active).
    SlotBusy(String),
    /// The slot does not exist, or the server can no longer stream from it.
    SlotGone(String),
    /// Anything else: the connection failed or closed.
    Other(String),
}

/// Classifies a client error by the server's message (SQLSTATE 55006 object in use, 42704 undefined
/// object, 55000 invalidated slot).
pub(crate) fn classify(error: &PgWireError) -> StreamFailure {
    let text = error.to_string();
    if text.contains("is active for PID") {
        StreamFailure::SlotBusy(text)
    } else if (text.contains("replication slot") && text.contains("does not exist"))
        || text.contains("can no longer get changes")
        || text.contains("has been invalidated")
    {
        StreamFailure::SlotGone(text)
    } else {
        StreamFailure::Other(text)
    }
}

/// The stream over `pgwire-replication`.
pub(crate) struct PgWireStream {
    client: ReplicationClient,
    status_interval: Duration,
}

impl PgWireStream {
    /// Connects to `url` and starts streaming `config`'s slot from its confirmed position.
    pub(crate) async fn start(url: &str, config: &LogRelayConfig) -> Result<Self, StreamFailure> {
        let replication = replication_config(url, config)
            .map_err(|e| StreamFailure::Other(e.to_string()))?
            // An observer makes the client track positions not yet reported, which `close` waits for.
            .with_feedback_observer(FeedbackObserver::new(|sent| {
                tracing::trace!(pending_for = ?sent.pending_for, "confirmed position reported to the server");
            }));
        let mut client = ReplicationClient::connect(replication).await.map_err(|e| classify(&e))?;
        // The server refuses a busy or missing slot only after the connection is up.
        client.wait_started().await.map_err(|e| classify(&e))?;
        Ok(PgWireStream { client, status_interval: config.status_interval })
    }
}

impl ReplicationStream for PgWireStream {
    async fn next(&mut self) -> Result<Option<LogMessage>, LogError> {
        loop {
            match self.client.recv().await.map_err(LogError::replication)? {
                None | Some(ReplicationEvent::StoppedAt { .. }) => return Ok(None),
                Some(event) => {
                    if let Some(message) = message(event) {
                        return Ok(Some(message));
                    }
                }
            }
        }
    }

    async fn try_next(&mut self) -> Result<Option<LogMessage>, LogError> {
        loop {
            let Ok(event) = tokio::time::timeout(Duration::ZERO, self.client.recv()).await else {
                return Ok(None);
            };
            match event.map_err(LogError::replication)? {
                None | Some(ReplicationEvent::StoppedAt { .. }) => {
                    return Err(LogError::replication("the server ended the replication stream"));
                }
                Some(event) => {
                    if let Some(message) = message(event) {
                        return Ok(Some(message));
                    }
                }
            }
        }
    }

    fn confirm(&self, lsn: u64) {
        self.client.update_applied_lsn(Lsn::from_u64(lsn));
    }

    async fn close(mut self) {
        // The client reports a confirmed position at its next status interval; ending the stream before
        // then would make the next relay publish again what this one confirmed.
        let deadline = tokio::time::Instant::now() + self.status_interval + Duration::from_secs(1);
        while self.client.feedback_pending_since().is_some() && self.client.is_running() {
            if tokio::time::Instant::now() >= deadline {
                tracing::debug!("the last confirmed position was not reported before the stream closed");
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Err(error) = self.client.shutdown().await {
            tracing::debug!(%error, "closing the replication stream");
        }
    }
}

/// The relay's view of a client event; `None` for the ones it does not act on (logical messages).
fn message(event: ReplicationEvent) -> Option<LogMessage> {
    match event {
        ReplicationEvent::Begin { xid, .. } => Some(LogMessage::Begin { xid }),
        ReplicationEvent::XLogData { data, .. } => Some(LogMessage::Change(data)),
        ReplicationEvent::Commit { end_lsn, .. } => Some(LogMessage::Commit { end_lsn: end_lsn.as_u64() }),
        ReplicationEvent::KeepAlive { wal_end, .. } => Some(LogMessage::KeepAlive { wal_end: wal_end.as_u64() }),
        ReplicationEvent::Message { .. } | ReplicationEvent::StoppedAt { .. } => None,
    }
}

/// The client's settings from a `postgres://user:password@host:port/db?sslmode=…` URL.
fn replication_config(url: &str, config: &LogRelayConfig) -> Result<ReplicationConfig, LogError> {
    let invalid = |reason: String| LogError::Outbox(crate::Error::invalid_config("database_url", reason));
    let parsed = url::Url::parse(url).map_err(|e| invalid(format!("does not parse as a URL: {e}")))?;
    let decode = |text: &str| {
        url::form_urlencoded::parse(format!("x={text}").as_bytes())
            .next()
            .map(|(_, value)| value.into_owned())
            .unwrap_or_default()
    };
    let user = if parsed.username().is_empty() { "postgres".to_owned() } else { decode(parsed.username()) };
    let password = parsed.password().map(decode).unwrap_or_default();
    let host = parsed.host_str().unwrap_or("localhost").to_owned();
    let database = parsed.path().trim_start_matches('/');
    let database = if database.is_empty() { user.clone() } else { decode(database) };
    let tls = match parsed.query_pairs().find(|(key, _)| key == "sslmode").map(|(_, value)| value.into_owned()) {
        None => TlsConfig::disabled(),
        Some(mode) => match mode.as_str() {
            "disable" | "allow" => TlsConfig::disabled(),
            "prefer" => TlsConfig { mode: SslMode::Prefer, ..TlsConfig::disabled() },
            "require" => TlsConfig::require(),
            "verify-ca" => TlsConfig::verify_ca(None),
            "verify-full" => TlsConfig::verify_full(None),
            other => {
                return Err(invalid(format!(
                    "has sslmode {other:?}; expected disable, prefer, require, verify-ca or verify-full"
                )));
            }
        },
    };
    Ok(ReplicationConfig::new(host, user, password, database, config.slot(), config.publication())
        .with_port(parsed.port().unwrap_or(5432))
        .with_tls(tls)
        .with_status_interval(config.status_interval)
        .with_application_name("outbox log relay"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replication_connection_takes_the_database_urls_parts() {
        let config = LogRelayConfig::default();
        let parsed = replication_config("postgres://app%40x:p%2Fw@db.example:6543/orders?sslmode=require", &config)
            .expect("parses");
        assert_eq!((parsed.host.as_str(), parsed.port), ("db.example", 6543));
        assert_eq!(
            (parsed.user.as_str(), parsed.password.as_str(), parsed.database.as_str()),
            ("app@x", "p/w", "orders")
        );
        assert!(parsed.tls.mode.requires_tls());
        let plain = replication_config("postgres://postgres@127.0.0.1/test", &config).expect("parses");
        assert_eq!((plain.port, plain.password.as_str()), (5432, ""));
        assert!(!plain.tls.mode.requires_tls());
        assert!(replication_config("postgres://h/db?sslmode=sometimes", &config).is_err());
    }
}

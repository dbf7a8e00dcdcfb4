//! Connecting to a broker that starts after the app (a deploy that brings both up at once, a broker being
//! restarted): retry with backoff, within a bound, saying so in the log at every attempt.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

/// How [`connect_with_retry`] waits between attempts and when it gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectRetry {
    /// The wait after the first failed attempt (default 1 s); it doubles per attempt up to `max_delay`.
    pub initial_delay: Duration,
    /// The longest wait between two attempts (default 30 s).
    pub max_delay: Duration,
    /// No attempt starts later than this after the first (default 5 minutes); `None` retries for ever
    /// (what a relay process wants: its events wait in the outbox meanwhile).
    pub give_up_after: Option<Duration>,
}

impl Default for ConnectRetry {
    fn default() -> Self {
        ConnectRetry {
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            give_up_after: Some(Duration::from_secs(300)),
        }
    }
}

impl ConnectRetry {
    /// Retries for ever (see [`ConnectRetry::give_up_after`]).
    pub fn forever() -> Self {
        ConnectRetry { give_up_after: None, ..ConnectRetry::default() }
    }

    /// Gives up once `bound` has passed since the first attempt.
    pub fn give_up_after(self, bound: Duration) -> Self {
        ConnectRetry { give_up_after: Some(bound), ..self }
    }
}

/// Runs `connect` until it succeeds, waiting `retry`'s backoff between attempts and logging each failure
/// (a warning naming `broker`, which should be the URL as [`BrokerUrl::redacted`](super::BrokerUrl::redacted)
/// shows it, the attempt, the error and the next wait).
///
/// A configuration error ([`Error::InvalidConfig`]: a bad URL, a bad destination) is returned at once:
/// retrying cannot fix it. After [`ConnectRetry::give_up_after`] the last error is returned, its
/// operation saying how many attempts failed over how long.
///
/// ```no_run
/// # #[cfg(feature = "nats")]
/// # async fn demo() -> outbox_runtime::Result<()> {
/// use outbox_runtime::brokers::nats::NatsPublisher;
/// use outbox_runtime::brokers::{ConnectRetry, connect_with_retry};
/// use outbox_runtime::Destination;
///
/// let url = "nats://nats:4222";
/// let publisher = connect_with_retry(url, ConnectRetry::default(), || {
///     NatsPublisher::connect(url, Destination::parse("events.{aggregate_type}").expect("a valid template"))
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn connect_with_retry<T, F, Fut>(broker: &str, retry: ConnectRetry, mut connect: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let started = Instant::now();
    let mut delay = retry.initial_delay.max(Duration::from_millis(1));
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let error = match connect().await {
            Ok(connected) => {
                if attempt > 1 {
                    tracing::info!(broker, attempt, "connected to the broker");
                }
                return Ok(connected);
            }
            Err(error @ Error::InvalidConfig { .. }) => return Err(error),
            Err(error) => error,
        };
        let elapsed = started.elapsed();
        if retry.give_up_after.is_some_and(|bound| elapsed + delay > bound) {
            tracing::error!(broker, attempt, %error, ?elapsed, "broker unreachable; giving up");
            return Err(gave_up(error, attempt, elapsed));
        }
        tracing::warn!(broker, attempt, %error, retry_in = ?delay, "broker unreachable; retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(retry.max_delay.max(retry.initial_delay));
    }
}

/// `error`, its operation extended with the attempts made.
fn gave_up(error: Error, attempts: u32, elapsed: Duration) -> Error {
    let tried = format!("(gave up after {attempts} attempts over {:.1} s)", elapsed.as_secs_f64());
    match error {
        Error::Broker { broker, operation, source } => {
            Error::Broker { broker, operation: format!("{operation} {tried}"), source }
        }
        other => Error::Broker { broker: "broker", operation: format!("connect {tried}"), source: Box::new(other) },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn down(attempts: &AtomicU32) -> Error {
        attempts.fetch_add(1, Ordering::SeqCst);
        Error::broker("NATS JetStream", "connect to nats://127.0.0.1:4222", "connection refused")
    }

    #[tokio::test(start_paused = true)]
    async fn a_broker_that_comes_up_late_is_connected() {
        let attempts = Arc::new(AtomicU32::new(0));
        let connected = connect_with_retry("nats://127.0.0.1:4222", ConnectRetry::default(), || {
            let attempts = attempts.clone();
            async move { if attempts.load(Ordering::SeqCst) < 3 { Err(down(&attempts)) } else { Ok("connected") } }
        })
        .await;
        assert_eq!(connected.unwrap(), "connected");
        assert_eq!(attempts.load(Ordering::SeqCst), 3, "three failures, then the fourth attempt succeeded");
    }

    #[tokio::test(start_paused = true)]
    async fn a_broker_that_stays_down_is_given_up_on_after_the_bound_with_the_attempts_said() {
        let attempts = Arc::new(AtomicU32::new(0));
        let retry = ConnectRetry::default().give_up_after(Duration::from_secs(60));
        let started = Instant::now();
        let error = connect_with_retry("nats://127.0.0.1:4222", retry, || {
            let attempts = attempts.clone();
            async move { Err::<(), _>(down(&attempts)) }
        })
        .await
        .unwrap_err();
        // Waits 1 + 2 + 4 + 8 + 16 s; the next 30 s wait would pass the 60 s bound.
        assert_eq!(attempts.load(Ordering::SeqCst), 6);
        assert!(started.elapsed() <= Duration::from_secs(60), "{:?}", started.elapsed());
        let message = error.to_string();
        assert!(
            message.contains("connect to nats://127.0.0.1:4222 (gave up after 6 attempts over 31.0 s)"),
            "{message}"
        );
        assert!(message.contains("connection refused"), "{message}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_configuration_error_is_not_retried() {
        let attempts = AtomicU32::new(0);
        let error = connect_with_retry("nats://", ConnectRetry::forever(), || {
            attempts.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(Error::invalid_config("broker", "has no host")) }
        })
        .await
        .unwrap_err();
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
        assert!(matches!(error, Error::InvalidConfig { .. }), "{error}");
    }
}

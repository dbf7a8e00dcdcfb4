//! Connection options, transport options and the naming rules of NATS subjects, streams and consumers.

use std::time::Duration;

use crate::broker::Destination;
use crate::brokers::{BrokerKind, BrokerUrl};
use crate::error::{Error, Result};

use super::BROKER;

/// The default subject template: [`DEFAULT_DESTINATION`](crate::broker::DEFAULT_DESTINATION),
/// `{event_type}` (e.g. `order.placed`, which a stream subject such as `order.>` captures).
pub const DEFAULT_SUBJECT_TEMPLATE: &str = crate::broker::DEFAULT_DESTINATION;

/// The dedup window [`NatsPublisher::ensure_stream`](super::NatsPublisher::ensure_stream) gives a stream
/// (and a transport gives the dead-letter stream it creates): a republish of the same `Nats-Msg-Id` within
/// it is acknowledged as a duplicate and not stored again.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// How many publishes [`NatsPublisher`](super::NatsPublisher) sends before awaiting their acks, by default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1_000;

/// How long a publish waits for the stream's acknowledgement by default.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The prefix of the default dead-letter subject, `outbox.dead.<stream>.<durable>`.
pub const DEAD_SUBJECT_PREFIX: &str = "outbox.dead";

/// The suffix of the default dead-letter stream, `<stream>_DEAD`.
pub const DEAD_STREAM_SUFFIX: &str = "_DEAD";

/// The longest stream or consumer name accepted (JetStream keeps them as file names).
pub const MAX_NAME_LEN: usize = 255;

/// Connects with a bounded connect timeout and a reconnect delay capped at two seconds.
pub(super) fn connect_options() -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5)).reconnect_delay_callback(|attempts| {
        if attempts <= 1 {
            Duration::ZERO
        } else {
            let exp = u32::try_from(attempts.saturating_sub(2)).unwrap_or(u32::MAX).min(10);
            Duration::from_millis(100u64.saturating_mul(1 << exp)).min(Duration::from_secs(2))
        }
    })
}

/// Checks `url` is a `nats://` URL (or `tls://`/`ws://`/`wss://`, which async-nats also speaks), with one
/// host or a comma-separated list of a cluster's (`nats://a:4222,b:4222`), and connects.
pub(super) async fn connect_client(url: &str, options: async_nats::ConnectOptions) -> Result<async_nats::Client> {
    let url = BrokerUrl::parse(url)?.expect(BrokerKind::Nats, "nats://host:4222")?;
    // async-nats logs the address it dials, password and all: credentials go in through the options.
    let (address, credentials) = crate::text::split_credentials(url.expose());
    let options = match credentials {
        Some((user, Some(password))) => options.user_and_password(user, password),
        Some((token, None)) => options.token(token),
        None => options,
    };
    // A cluster is `nats://a:4222,b:4222,c:4222`: one server address each; the client picks one and moves
    // to another when it is lost.
    let (scheme, hosts) = address.split_once("://").unwrap_or(("nats", address.as_str()));
    let servers = hosts
        .split(',')
        .map(|host| format!("{scheme}://{host}").parse::<async_nats::ServerAddr>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid_config("broker_url", format!("{url}: {e}")))?;
    options.connect(servers).await.map_err(|e| Error::broker(BROKER, format!("connect to {url}"), e))
}

/// Why `subject` is not a valid NATS publish subject, if it is not.
pub(super) fn subject_problem(subject: &str) -> Option<String> {
    if subject.is_empty() {
        return Some("is empty".to_owned());
    }
    if let Some(c) = subject.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Some(format!("contains whitespace or a control character ({c:?})"));
    }
    if subject.split('.').any(str::is_empty) {
        return Some("has an empty token (leading, trailing or doubled `.`)".to_owned());
    }
    if subject.contains(['*', '>']) {
        return Some("contains a wildcard (`*` or `>`); events are published to concrete subjects".to_owned());
    }
    None
}

/// Why `name` is not a valid JetStream stream or consumer name, if it is not.
pub(super) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".to_owned());
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!("is {} bytes; at most {MAX_NAME_LEN}", name.len()));
    }
    if let Some(c) =
        name.chars().find(|c| c.is_whitespace() || c.is_control() || ['.', '*', '>', '/', '\\'].contains(c))
    {
        return Some(format!("contains {c:?}; a name has no `.`, `*`, `>`, slashes, whitespace or control characters"));
    }
    None
}

/// `name` checked as the setting `field`.
pub(super) fn check_name(field: &'static str, name: &str) -> Result<()> {
    match name_problem(name) {
        None => Ok(()),
        Some(problem) => Err(Error::invalid_config(
            field,
            format!("{:?} is not a valid JetStream name: it {problem}", crate::text::one_line(name)),
        )),
    }
}

/// Whether the subject filter `pattern` (with `*` and `>` wildcards) matches the concrete `subject`.
pub(super) fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for wanted in pattern.split('.') {
        match (wanted, tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (wanted, Some(token)) if wanted == token => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

/// Checks the fixed parts of a subject template: rendering it with plain placeholder values must give a
/// valid subject.
pub(super) fn check_template(destination: &Destination) -> Result<()> {
    let rendered = destination.render_sample();
    match subject_problem(&rendered) {
        None => Ok(()),
        Some(problem) => Err(Error::invalid_config(
            "destination",
            format!(
                "template {:?} cannot form a NATS subject: with every placeholder filled in it {problem}",
                destination.template()
            ),
        )),
    }
}

/// Settings of a [`NatsTransport`](super::NatsTransport), checked when it connects.
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::brokers::nats::NatsTransportOptions;
///
/// let options = NatsTransportOptions::default()
///     .with_ack_wait(Duration::from_secs(60))
///     .with_dead_letters("BILLING_DEAD", "billing.dead");
/// assert!(options.validate().is_ok());
/// assert!(NatsTransportOptions::default().with_dead_letters("BAD.NAME", "x").validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsTransportOptions {
    /// How long the server waits for an ack before it redelivers a message (default 30 s, at least 1 s).
    /// Applied when the durable consumer is created; an existing consumer keeps its own. The transport
    /// keeps every message it holds alive with progress acks at a third of this.
    pub ack_wait: Duration,
    /// Deliveries of one message before the server stops delivering it (default `-1`, unlimited).
    /// Applied when the durable consumer is created. The consume driver dead-letters after its own
    /// `max_deliveries`; a server limit below it makes a message silently undeliverable instead (the
    /// server only emits an advisory), so leave it unlimited unless you know why.
    pub max_deliver: i64,
    /// The stream that keeps dead letters (default `<stream>_DEAD`), created when missing.
    pub dead_letter_stream: Option<String>,
    /// The subject dead letters are published to (default `outbox.dead.<stream>.<durable>`), added to the
    /// dead-letter stream's subjects when missing. It must not be one the source stream captures.
    pub dead_letter_subject: Option<String>,
    /// How long an ack, a dead-letter publish or a replay step waits for the server (default 5 s).
    pub request_timeout: Duration,
    /// At start, after a reconnect and after a failed fetch, when the server counts more unacknowledged
    /// deliveries than this transport holds (messages lost in flight, or left by a process that stopped
    /// without releasing them), hand out only redeliveries and keep new messages back until those
    /// deliveries are back or `ack_wait` has passed (default `true`). JetStream redelivers them after
    /// `ack_wait`, ahead of newer messages, so this keeps per-aggregate order across a lost connection or
    /// a crash, with one process per durable. Messages released at a clean shutdown are redelivered at
    /// once and cost nothing. With several processes sharing a durable the count includes the others'
    /// messages, so every start and reconnect would hold new messages back for `ack_wait`: turn it off
    /// there (order does not hold across processes anyway).
    pub wait_for_lost_deliveries: bool,
}

impl Default for NatsTransportOptions {
    fn default() -> Self {
        NatsTransportOptions {
            ack_wait: Duration::from_secs(30),
            max_deliver: -1,
            dead_letter_stream: None,
            dead_letter_subject: None,
            request_timeout: DEFAULT_ACK_TIMEOUT,
            wait_for_lost_deliveries: true,
        }
    }
}

impl NatsTransportOptions {
    /// Sets [`ack_wait`](Self::ack_wait).
    pub fn with_ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// Sets [`max_deliver`](Self::max_deliver).
    pub fn with_max_deliver(mut self, max_deliver: i64) -> Self {
        self.max_deliver = max_deliver;
        self
    }

    /// Sets the dead-letter [stream](Self::dead_letter_stream) and [subject](Self::dead_letter_subject).
    pub fn with_dead_letters(mut self, stream: &str, subject: &str) -> Self {
        self.dead_letter_stream = Some(stream.to_owned());
        self.dead_letter_subject = Some(subject.to_owned());
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`wait_for_lost_deliveries`](Self::wait_for_lost_deliveries).
    pub fn with_wait_for_lost_deliveries(mut self, wait: bool) -> Self {
        self.wait_for_lost_deliveries = wait;
        self
    }

    /// Checks every setting; an out-of-range value or an invalid dead-letter name is an
    /// [`Error::InvalidConfig`] naming the setting.
    pub fn validate(&self) -> Result<()> {
        if self.ack_wait < Duration::from_secs(1) || self.ack_wait > Duration::from_secs(24 * 3600) {
            return Err(Error::invalid_config(
                "ack_wait",
                format!(
                    "is {:?}; expected 1 s to a day (below 1 s messages are redelivered mid-handler)",
                    self.ack_wait
                ),
            ));
        }
        if self.max_deliver == 0 || self.max_deliver < -1 {
            return Err(Error::invalid_config("max_deliver", "must be positive, or -1 for unlimited"));
        }
        if self.request_timeout.is_zero() {
            return Err(Error::invalid_config("request_timeout", "must be more than zero"));
        }
        if let Some(stream) = &self.dead_letter_stream {
            check_name("dead_letter_stream", stream)?;
        }
        if let Some(subject) = &self.dead_letter_subject
            && let Some(problem) = subject_problem(subject)
        {
            return Err(Error::invalid_config(
                "dead_letter_subject",
                format!("{:?} is not a valid NATS subject: it {problem}", crate::text::one_line(subject)),
            ));
        }
        Ok(())
    }

    /// The dead-letter stream for `stream`: the configured one, or `<stream>_DEAD`.
    pub fn dead_letter_stream_for(&self, stream: &str) -> String {
        self.dead_letter_stream.clone().unwrap_or_else(|| format!("{stream}{DEAD_STREAM_SUFFIX}"))
    }

    /// The dead-letter subject for `durable` on `stream`: the configured one, or
    /// `outbox.dead.<stream>.<durable>`.
    pub fn dead_letter_subject_for(&self, stream: &str, durable: &str) -> String {
        self.dead_letter_subject.clone().unwrap_or_else(|| format!("{DEAD_SUBJECT_PREFIX}.{stream}.{durable}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_checked_before_publishing() {
        assert_eq!(subject_problem("order.placed"), None);
        assert_eq!(subject_problem("order.o-1.placed"), None);
        assert!(subject_problem("").is_some());
        assert!(subject_problem("order.o 1").is_some_and(|p| p.contains("whitespace")));
        assert!(subject_problem("order..placed").is_some_and(|p| p.contains("empty token")));
        assert!(subject_problem(".order").is_some());
        assert!(subject_problem("order.").is_some());
        assert!(subject_problem("order.*").is_some_and(|p| p.contains("wildcard")));
        assert!(subject_problem("order.>").is_some());
    }

    #[test]
    fn templates_with_bad_fixed_parts_are_rejected_at_config_time() {
        let ok = Destination::parse("events.{aggregate_type}.{event_type}").unwrap();
        assert!(check_template(&ok).is_ok());
        for bad in ["events..{event_type}", "events.{event_type}.", "events *.{event_type}", "events.>"] {
            let d = Destination::parse(bad).unwrap();
            let err = check_template(&d).unwrap_err();
            assert!(err.to_string().contains("cannot form a NATS subject"), "{bad}: {err}");
        }
    }

    #[test]
    fn wildcard_filters_match_like_the_server() {
        assert!(subject_matches("a.>", "a.b.c"));
        assert!(!subject_matches("a.>", "a"));
        assert!(subject_matches("a.*.c", "a.b.c"));
        assert!(!subject_matches("a.*", "a.b.c"));
        assert!(subject_matches("a.b", "a.b"));
        assert!(!subject_matches("a.b", "a.b.c"));
        assert!(subject_matches(">", "x"));
    }

    #[test]
    fn names_and_options_are_checked() {
        assert_eq!(name_problem("ORDERS_DEAD"), None);
        for bad in ["", "A.B", "A B", "A*", "A>", "a/b", "a\nb"] {
            assert!(name_problem(bad).is_some(), "{bad:?}");
        }
        assert!(name_problem(&"x".repeat(256)).is_some());
        let o = NatsTransportOptions::default();
        assert!(o.validate().is_ok());
        assert_eq!(o.dead_letter_stream_for("ORDERS"), "ORDERS_DEAD");
        assert_eq!(o.dead_letter_subject_for("ORDERS", "billing"), "outbox.dead.ORDERS.billing");
        let err = o.clone().with_dead_letters("ORDERS.DEAD", "x").validate().unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { field: "dead_letter_stream", .. }), "{err}");
        let err = o.clone().with_dead_letters("D", "dead.>").validate().unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { field: "dead_letter_subject", .. }), "{err}");
        assert!(o.clone().with_ack_wait(Duration::from_millis(500)).validate().is_err());
        assert!(o.clone().with_max_deliver(0).validate().is_err());
    }
}

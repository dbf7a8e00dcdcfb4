//! The one parser of broker URLs: scheme, credentials, hosts and path checked before any connection, and
//! every error and log line showing the URL with its credentials redacted.

use std::fmt;

use super::BrokerKind;
use crate::error::{Error, Result};
use crate::text::redact_url;

/// A broker URL that parsed: `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?query]`.
///
/// Its [`Display`](fmt::Display) is the redacted form, so it can go into any message.
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerUrl {
    raw: String,
    kind: BrokerKind,
    scheme: String,
    hosts: Vec<(String, Option<u16>)>,
    path: String,
}

impl fmt::Debug for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BrokerUrl({})", self.redacted())
    }
}

impl fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl BrokerUrl {
    /// Parses `url`. An unknown scheme, a missing host, an empty host in a list or a port that is not a
    /// number in 1..=65535 is an [`Error::InvalidConfig`] whose text shows the URL redacted.
    pub fn parse(url: &str) -> Result<Self> {
        let shown = redact_url(url.trim());
        let invalid = |reason: String| Error::invalid_config("broker_url", format!("{shown:?} {reason}"));
        let trimmed = url.trim();
        let (scheme, rest) = trimmed
            .split_once("://")
            .ok_or_else(|| invalid("is not a URL; expected e.g. nats://127.0.0.1:4222".to_owned()))?;
        let kind = match scheme.to_ascii_lowercase().as_str() {
            "nats" | "tls" | "ws" | "wss" => BrokerKind::Nats,
            "kafka" => BrokerKind::Kafka,
            "amqp" | "amqps" => BrokerKind::RabbitMq,
            "redis" | "rediss" => BrokerKind::Redis,
            other => {
                return Err(invalid(format!(
                    "has scheme {other:?}; expected one of nats, kafka, amqp, amqps, redis, rediss"
                )));
            }
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let hosts_part = authority.rsplit_once('@').map_or(authority, |(_, hosts)| hosts);
        if hosts_part.is_empty() {
            return Err(invalid("has no host".to_owned()));
        }
        let mut hosts = Vec::new();
        for host in hosts_part.split(',') {
            hosts.push(parse_host(host).map_err(&invalid)?);
        }
        Ok(BrokerUrl {
            raw: trimmed.to_owned(),
            kind,
            scheme: scheme.to_ascii_lowercase(),
            hosts,
            path: path.to_owned(),
        })
    }

    /// Checks the URL names `kind`; otherwise an [`Error::InvalidConfig`] saying what `adapter` expects,
    /// e.g. `redis://host:6379`.
    pub fn expect(self, kind: BrokerKind, example: &str) -> Result<Self> {
        if self.kind == kind {
            return Ok(self);
        }
        Err(Error::invalid_config(
            "broker_url",
            format!(
                "{} is not a {} URL (its scheme names {}); expected e.g. {example}",
                self.redacted(),
                kind.name(),
                self.kind.name()
            ),
        ))
    }

    /// The broker the scheme names.
    pub fn kind(&self) -> BrokerKind {
        self.kind
    }

    /// The scheme, lowercase.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// Hosts and their ports, as written (`None` when the URL has no port).
    pub fn hosts(&self) -> &[(String, Option<u16>)] {
        &self.hosts
    }

    /// Everything after the hosts (`/vhost`, `/0`, `?query`), possibly empty.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The URL as given, credentials included: only for the client library's connect call.
    pub fn expose(&self) -> &str {
        &self.raw
    }

    /// The URL with its credentials replaced by `***`.
    pub fn redacted(&self) -> String {
        redact_url(&self.raw)
    }
}

fn parse_host(host: &str) -> std::result::Result<(String, Option<u16>), String> {
    let host = host.trim();
    if host.is_empty() {
        return Err("has an empty host in its list".to_owned());
    }
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or_else(|| format!("has an unclosed `[` in host {host:?}"))?;
        (format!("[{addr}]"), after.strip_prefix(':'))
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (host.to_owned(), None),
        }
    };
    if name.is_empty() || name == "[]" {
        return Err(format!("has no host name in {host:?}"));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("has whitespace in host {:?}", crate::text::one_line(&name)));
    }
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("has port {port:?}; expected a number in 1..=65535")),
            Ok(port) => Some(port),
        },
    };
    Ok((name, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_kind_hosts_and_path() {
        let url = BrokerUrl::parse("amqp://guest:secret@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(url.kind(), BrokerKind::RabbitMq);
        assert_eq!(url.hosts(), &[("127.0.0.1".to_owned(), Some(5672))]);
        assert_eq!(url.path(), "/%2f");
        assert_eq!(url.to_string(), "amqp://***@127.0.0.1:5672/%2f");
        let kafka = BrokerUrl::parse("kafka://a:9092,b,[::1]:9093").unwrap();
        assert_eq!(kafka.hosts().len(), 3);
        assert_eq!(kafka.hosts()[2], ("[::1]".to_owned(), Some(9093)));
    }

    #[test]
    fn no_error_ever_shows_a_password() {
        for bad in [
            "redis://user:hunter2@",
            "mqtt://user:hunter2@host",
            "user:hunter2@host:4222",
            "nats://user:hunter2@host:99999",
            "kafka://user:hunter2@a,,b",
        ] {
            let err = BrokerUrl::parse(bad).unwrap_err().to_string();
            assert!(!err.contains("hunter2"), "{bad}: {err}");
        }
        let wrong = BrokerUrl::parse("redis://u:hunter2@h").unwrap().expect(BrokerKind::Nats, "nats://host:4222");
        assert!(!wrong.unwrap_err().to_string().contains("hunter2"));
    }
}

//! NATS headers as the driver sees them (a map) and as the client sends them (a `HeaderMap`).

use std::collections::BTreeMap;
use std::str::FromStr;

use async_nats::header::{HeaderMap, HeaderName, HeaderValue};

use crate::error::{Error, Result};
use crate::text::one_line;

/// Headers whose name starts with this are JetStream control headers (`Nats-Msg-Id`, `Nats-Rollup`...):
/// a dead letter keeps them renamed, so they take no effect on the dead-letter stream.
pub(super) const CONTROL_HEADER_PREFIX: &str = "Nats-";

/// The headers of a message, the last value of a repeated name.
pub(super) fn headers_of(headers: Option<&HeaderMap>) -> BTreeMap<String, String> {
    headers
        .iter()
        .flat_map(|headers| headers.iter())
        .filter_map(|(name, values)| values.last().map(|v| (name.to_string(), v.as_str().to_owned())))
        .collect()
}

/// `headers` as a NATS header map; a value NATS cannot carry is escaped first.
pub(super) fn header_map(headers: &[(String, String)]) -> Result<HeaderMap> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let header = HeaderName::from_str(name).map_err(|e| {
            Error::invalid_event("headers", format!("{:?} is not a valid NATS header name: {e}", one_line(name)))
        })?;
        let value = HeaderValue::from_str(value)
            .or_else(|_| HeaderValue::from_str(&one_line(value)))
            .map_err(|e| Error::invalid_event("headers", format!("header {name} cannot be carried by NATS: {e}")))?;
        map.insert(header, value);
    }
    Ok(map)
}

/// Size of the NATS header block of `headers`.
pub(super) fn header_block_len(headers: &[(String, String)]) -> usize {
    headers.iter().map(|(k, v)| k.len() + v.len() + 4).sum::<usize>() + 12
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_nats_cannot_carry_are_escaped_and_bad_names_rejected() {
        let map = header_map(&[("a".into(), "x\ny".into()), ("b".into(), "plain".into())]).unwrap();
        assert_eq!(map.get("a").map(HeaderValue::as_str), Some("x\\ny"));
        assert_eq!(headers_of(Some(&map)).get("b").map(String::as_str), Some("plain"));
        assert!(header_map(&[("bad name:".into(), "v".into())]).is_err());
        assert_eq!(header_block_len(&[("ab".into(), "cd".into())]), 20);
    }
}

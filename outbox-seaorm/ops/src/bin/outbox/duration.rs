//! Durations on the command line: `250ms`, `30s`, `5m`, `2h`, `7d` (a bare number is seconds).

/// Parses `text` as a duration; the error names the accepted units.
pub use outbox_seaorm::text::parse_duration as parse;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn durations_read_with_their_unit_and_reject_unknown_ones() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse("5 weeks").unwrap_err().contains("unknown unit"));
        assert!(parse("soon").is_err());
    }
}

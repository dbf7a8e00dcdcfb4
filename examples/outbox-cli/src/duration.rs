//! Durations on the command line: `250ms`, `30s`, `5m`, `2h`, `7d` (a bare number is seconds).

use std::time::Duration;

/// Parses `text` as a duration; the error names the accepted units.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 =
        number.parse().map_err(|_| format!("{text:?} is not a duration; expected e.g. 500ms, 30s, 5m, 7d"))?;
    let unit_ms: u64 = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("unknown unit {other:?} in {text:?}; expected one of ms, s, m, h, d")),
    };
    value.checked_mul(unit_ms).map(Duration::from_millis).ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
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

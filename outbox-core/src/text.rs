//! The text helpers every adapter shares: redacting credentials, escaping control characters, truncating.

/// `url` with its user info (user name and password) replaced by `***`, for error messages and logs:
/// `redis://user:secret@host:6379/0` → `redis://***@host:6379/0`. Works without a scheme too.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((_, host)) = authority.rsplit_once('@') else { return url.to_owned() };
    match scheme {
        Some(scheme) => format!("{scheme}://***@{host}{tail}"),
        None => format!("***@{host}{tail}"),
    }
}

/// `text` with control characters escaped (`\n` → `\\n`, NUL → `\\u{0}`), so a value from a message can
/// never forge a log line or break a header.
pub fn one_line(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// `text` cut to at most `max` bytes on a character boundary, with `…` when something was cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_reach_messages() {
        assert_eq!(redact_url("nats://user:secret@host:4222"), "nats://***@host:4222");
        assert_eq!(redact_url("nats://host:4222"), "nats://host:4222");
        assert_eq!(redact_url("user:secret@host:4222"), "***@host:4222");
        assert_eq!(redact_url("amqp://guest:p@ss@h:5672/%2f"), "amqp://***@h:5672/%2f");
    }

    #[test]
    fn control_characters_are_escaped_and_long_text_cut_on_a_boundary() {
        assert_eq!(one_line("a\nb\u{0}"), "a\\nb\\u{0}");
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate("ééééé", 6);
        assert!(cut.len() <= 6 && cut.ends_with('…'), "{cut}");
    }
}

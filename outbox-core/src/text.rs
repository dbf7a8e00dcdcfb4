//! Text as the adapters and the operating tools show it: credentials redacted, control characters
//! escaped, long values truncated, durations read as an operator types them.

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

/// The user info of `url`, taken out: the URL without it, the user name and the password, both
/// percent-decoded. Adapters hand credentials to their client apart from the URL, because clients log
/// the URL they connect to (SeaORM in a trace span, async-nats at debug level).
pub fn split_credentials(url: &str) -> (String, Option<(String, Option<String>)>) {
    let Some(UserInfo { scheme, userinfo, host, tail }) = user_info(url) else { return (url.to_owned(), None) };
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (percent_decode(user), Some(percent_decode(password))),
        None => (percent_decode(userinfo), None),
    };
    (format!("{scheme}://{host}{tail}"), Some((user, password)))
}

/// `text` with the password of each of `urls` replaced by `***` wherever it appears, as the URL spells it
/// (percent-encoded) and decoded, then [`redact_secrets`]: for a message that may quote a password away
/// from its URL (a driver's error echoing the setting it was given), as the `outbox` command's errors.
pub fn redact_passwords_of(text: &str, urls: &[&str]) -> String {
    let mut text = text.to_owned();
    for url in urls {
        let Some(UserInfo { userinfo, .. }) = user_info(url) else { continue };
        let Some((_, password)) = userinfo.split_once(':') else { continue };
        for form in [percent_decode(password), password.to_owned()] {
            if !form.is_empty() {
                text = text.replace(&form, "***");
            }
        }
    }
    redact_secrets(&text)
}

/// A URL's parts around its user info, as written (not decoded).
struct UserInfo<'u> {
    scheme: &'u str,
    userinfo: &'u str,
    host: &'u str,
    tail: &'u str,
}

/// `scheme://userinfo@host…` taken apart; `None` without a scheme or a user info.
fn user_info(url: &str) -> Option<UserInfo<'_>> {
    let (scheme, rest) = url.split_once("://")?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, host) = authority.rsplit_once('@')?;
    Some(UserInfo { scheme, userinfo, host, tail })
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// `text` (an error message, a log line) with every credential it carries replaced by `***`: the user
/// info of each URL in it (`amqp://guest:secret@host` → `amqp://***@host`) and the value of every
/// `password=`/`pwd=`/`passwd=` setting (`host=db password=secret` → `host=db password=***`). Publisher
/// errors pass through it before they reach `last_error` or a log.
pub fn redact_secrets(text: &str) -> String {
    let ends_authority = |c: char| {
        matches!(c, '/' | '?' | '#' | '"' | '\'' | '`' | '<' | '>' | ')' | ']' | ',' | ';') || c.is_whitespace()
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail.find(ends_authority).unwrap_or(tail.len());
        let (authority, after) = tail.split_at(end);
        match authority.rfind('@') {
            Some(user_end) if user_end > 0 => {
                out.push_str("***");
                out.push_str(&authority[user_end..]);
            }
            _ => out.push_str(authority),
        }
        rest = after;
    }
    out.push_str(rest);
    redact_password_settings(&out)
}

/// `password=…` style settings (libpq connection strings, query parameters) with their values hidden.
fn redact_password_settings(text: &str) -> String {
    const KEYS: [&str; 4] = ["password", "passwd", "pwd", "pass"];
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = lower[from..].find('=').map(|i| from + i) {
        from = found + 1;
        let key_start = lower[..found].rfind(|c: char| !c.is_ascii_alphanumeric() && c != '_').map_or(0, |i| i + 1);
        if !KEYS.contains(&lower[key_start..found].trim_start_matches('_')) {
            continue;
        }
        let value_end = text[from..]
            .find(|c: char| matches!(c, '&' | ';' | '"' | '\'' | ',') || c.is_whitespace())
            .map_or(text.len(), |i| from + i);
        if value_end > from {
            out.push_str(&text[copied..from]);
            out.push_str("***");
            copied = value_end;
            from = value_end;
        }
    }
    out.push_str(&text[copied..]);
    out
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

/// A duration as an operator types it: `250ms`, `30s`, `5m`, `2h`, `7d` (a bare number is seconds); the
/// error names the accepted units. The `outbox` command's flags and the dashboard's age filter read it.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let shown = truncate(text, 40);
    let value: u64 =
        number.parse().map_err(|_| format!("{shown:?} is not a duration; expected e.g. 30s, 5m, 2h, 7d or 500ms"))?;
    let unit_ms: u64 = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(format!("unknown unit {:?} in {shown:?}; expected one of ms, s, m, h, d", truncate(other, 20)));
        }
    };
    value.checked_mul(unit_ms).map(std::time::Duration::from_millis).ok_or_else(|| format!("{shown:?} is too long"))
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
    fn credentials_are_split_from_urls_and_decoded() {
        let (url, credentials) = split_credentials("postgres://app:p%40ss%3Aw@db:5432/x?sslmode=require");
        assert_eq!(url, "postgres://db:5432/x?sslmode=require");
        assert_eq!(credentials, Some(("app".to_owned(), Some("p@ss:w".to_owned()))));
        assert_eq!(split_credentials("nats://token@h:4222").1, Some(("token".to_owned(), None)));
        assert_eq!(split_credentials("nats://h:4222"), ("nats://h:4222".to_owned(), None));
        assert_eq!(split_credentials("sqlite:///tmp/a@b.db"), ("sqlite:///tmp/a@b.db".to_owned(), None));
    }

    #[test]
    fn a_urls_password_is_redacted_wherever_a_message_quotes_it() {
        let urls = ["postgres://app:s3cr%40t@db:5432/x", "redis://h:6379", "sqlite://data/app.db"];
        let message = "bad s3cr@t and s3cr%40t; at postgres://app:s3cr%40t@db:5432/x";
        assert_eq!(redact_passwords_of(message, &urls), "bad *** and ***; at postgres://***@db:5432/x");
        assert_eq!(redact_passwords_of("nothing secret", &["nats://token@h:4222"]), "nothing secret");
    }

    #[test]
    fn secrets_inside_free_text_are_hidden() {
        let message = "connect to amqp://guest:s3cret@rabbit:5672/%2f failed; retrying nats://n:pw@h:4222, \
                       and redis://h:6379 has none";
        assert_eq!(
            redact_secrets(message),
            "connect to amqp://***@rabbit:5672/%2f failed; retrying nats://***@h:4222, \
                       and redis://h:6379 has none"
        );
        assert_eq!(redact_secrets("(postgres://u:p@ss@db/app)"), "(postgres://***@db/app)");
        assert_eq!(redact_secrets("host=db user=u password=s3cret dbname=x"), "host=db user=u password=*** dbname=x");
        assert_eq!(
            redact_secrets("mysql://h/db?user=u&PASSWORD=s3cret&ssl=1"),
            "mysql://h/db?user=u&PASSWORD=***&ssl=1"
        );
        assert_eq!(redact_secrets("no secrets: a=b, compass=north"), "no secrets: a=b, compass=north");
        assert_eq!(redact_secrets("ends with password="), "ends with password=");
        assert_eq!(redact_secrets("ünïcode://ü:ß@h"), "ünïcode://***@h");
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

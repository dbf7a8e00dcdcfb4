//! Keeping passwords out of every message the command prints.

/// The password in `scheme://user:password@host…`, if any.
pub fn password_of(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let (user_info, _) = authority.rsplit_once('@')?;
    let (_, password) = user_info.split_once(':')?;
    (!password.is_empty()).then(|| password.to_owned())
}

/// `message` with every secret (and its percent-decoded form) replaced by `***`.
pub fn scrub(message: &str, secrets: &[String]) -> String {
    let mut message = message.to_owned();
    for secret in secrets {
        for form in [secret.clone(), percent_decode(secret)] {
            if !form.is_empty() {
                message = message.replace(&form, "***");
            }
        }
    }
    message
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_in_urls_and_scrubbed_in_both_spellings() {
        assert_eq!(password_of("postgres://app:s3cr%40t@db:5432/x").as_deref(), Some("s3cr%40t"));
        assert_eq!(password_of("postgres://app@db/x"), None);
        assert_eq!(password_of("sqlite://data/app.db"), None);
        let secrets = vec!["s3cr%40t".to_owned()];
        assert_eq!(scrub("bad s3cr@t and s3cr%40t", &secrets), "bad *** and ***");
    }
}

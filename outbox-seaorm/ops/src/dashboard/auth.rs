//! Who may act: the admin token signs a browser in; every action then carries the session's cookie and
//! its CSRF token.
//!
//! - Without an admin token the dashboard is read-only: no session can exist, every action is refused.
//! - `POST login` with the token starts a session: a random id in an `HttpOnly`, `SameSite=Strict` cookie,
//!   and a random CSRF token the pages put in each action's form. The token itself is never stored in the
//!   browser nor written in a page.
//! - An action needs both the cookie and the matching CSRF token: another site can neither read the token
//!   nor send the cookie with its own POST.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::COOKIE;

/// The session cookie's name.
pub(super) const COOKIE_NAME: &str = "outbox_dashboard";
/// How long a sign-in lasts.
pub(super) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions kept; the oldest is dropped beyond it.
const MAX_SESSIONS: usize = 256;

/// The admin token (if any) and the signed-in sessions.
pub(super) struct Gate {
    token: Option<String>,
    sessions: Mutex<HashMap<String, Session>>,
}

struct Session {
    csrf: String,
    started: Instant,
}

/// A signed-in browser: what its pages need to post actions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Admin {
    pub csrf: String,
}

/// Why an action was refused (answered with 403).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    ReadOnly,
    NotSignedIn,
    BadCsrf,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Refusal::ReadOnly => "this dashboard is read-only: start it with an admin token to replay or discard",
            Refusal::NotSignedIn => "sign in with the admin token first",
            Refusal::BadCsrf => "the form's CSRF token does not match this session; reload the page and try again",
        }
    }
}

impl Gate {
    pub fn new(token: Option<String>) -> Self {
        Gate { token, sessions: Mutex::new(HashMap::new()) }
    }

    pub fn read_only(&self) -> bool {
        self.token.is_none()
    }

    /// A new session id when `given` is the admin token.
    pub fn sign_in(&self, given: &str) -> Option<String> {
        let token = self.token.as_deref()?;
        if !same(token.as_bytes(), given.as_bytes()) {
            return None;
        }
        let id = random();
        let mut sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.retain(|_, s| s.started.elapsed() < SESSION_TTL);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions.iter().min_by_key(|(_, s)| s.started).map(|(id, _)| id.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(id.clone(), Session { csrf: random(), started: Instant::now() });
        Some(id)
    }

    pub fn sign_out(&self, headers: &HeaderMap) {
        if let Some(id) = session_id(headers) {
            self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
        }
    }

    /// The signed-in admin of this request, if any.
    pub fn admin(&self, headers: &HeaderMap) -> Option<Admin> {
        if self.read_only() {
            return None;
        }
        let id = session_id(headers)?;
        let sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let session = sessions.get(&id).filter(|s| s.started.elapsed() < SESSION_TTL)?;
        Some(Admin { csrf: session.csrf.clone() })
    }

    /// Whether this request may act: signed in, with the session's CSRF token in its form.
    pub fn authorize(&self, headers: &HeaderMap, csrf: Option<&str>) -> Result<Admin, Refusal> {
        if self.read_only() {
            return Err(Refusal::ReadOnly);
        }
        let admin = self.admin(headers).ok_or(Refusal::NotSignedIn)?;
        match csrf {
            Some(given) if same(admin.csrf.as_bytes(), given.as_bytes()) => Ok(admin),
            _ => Err(Refusal::BadCsrf),
        }
    }
}

fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.to_owned())
}

/// 244 random bits as hex (two v4 UUIDs, from the operating system's generator).
fn random() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Compares without stopping at the first difference, so the time taken says nothing about the token.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_cookie(id: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("theme=dark; {COOKIE_NAME}={id}")).expect("header");
        headers.insert(COOKIE, value);
        headers
    }

    #[test]
    fn without_a_token_nobody_signs_in_and_every_action_is_refused() {
        let gate = Gate::new(None);
        assert_eq!(gate.sign_in(""), None);
        assert_eq!(gate.authorize(&HeaderMap::new(), Some("x")), Err(Refusal::ReadOnly));
    }

    #[test]
    fn an_action_needs_the_session_cookie_and_its_csrf_token() {
        let gate = Gate::new(Some("s3cret-token".to_owned()));
        assert_eq!(gate.sign_in("wrong"), None);
        let id = gate.sign_in("s3cret-token").expect("signed in");
        let headers = with_cookie(&id);
        let admin = gate.admin(&headers).expect("a session");
        assert_eq!(gate.authorize(&headers, Some(&admin.csrf)), Ok(admin.clone()));
        assert_eq!(gate.authorize(&headers, Some("forged")), Err(Refusal::BadCsrf));
        assert_eq!(gate.authorize(&headers, None), Err(Refusal::BadCsrf));
        assert_eq!(gate.authorize(&with_cookie("guessed"), Some(&admin.csrf)), Err(Refusal::NotSignedIn));
        gate.sign_out(&headers);
        assert_eq!(gate.authorize(&headers, Some(&admin.csrf)), Err(Refusal::NotSignedIn));
    }
}

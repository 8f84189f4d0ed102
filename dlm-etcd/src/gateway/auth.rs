//! User/password authentication: the credentials (the password never shown) and the
//! token etcd gives for them, asked for once and again when etcd refuses it.

use std::sync::Arc;

use dlm_core::backend::{BackendError, BackendErrorKind};
use serde_json::Value;

use super::{Gateway, Outcome, not_etcd};

/// A password: its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// The user and password a backend authenticates with.
#[derive(Debug)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: Secret,
}

/// Credentials and the token etcd gave for them.
#[derive(Debug)]
pub(super) struct Auth {
    pub(super) credentials: Credentials,
    /// The current token; `Some("")` when etcd said authentication is not enabled (no
    /// header is sent). Held while a new one is asked for, so that threads that find it
    /// stale at once ask etcd once.
    pub(super) token: parking_lot::Mutex<Option<Arc<str>>>,
}

/// Whether etcd refused the token a request carried (not the credentials): a new token
/// may do.
fn stale_token(e: &BackendError) -> bool {
    let m = e.message();
    m.ends_with("invalid auth token")
        || m.ends_with("revision of auth store is old")
        || m.ends_with("user name is empty")
}

impl Gateway {
    /// The token to send to member `i` (asked of it when there is none yet); `None`
    /// without credentials or when etcd has authentication disabled.
    pub(crate) fn token(&self, i: usize) -> Result<Option<Arc<str>>, BackendError> {
        self.token_or_outcome(i).map_err(Outcome::into_error)
    }

    /// Forgets `used` if it is still the current token (etcd refused it): the next
    /// request asks for a new one.
    pub(crate) fn forget_token(&self, used: Option<&Arc<str>>) {
        if let (Some(auth), Some(used)) = (&self.auth, used) {
            let mut token = auth.token.lock();
            if token.as_ref().is_some_and(|t| Arc::ptr_eq(t, used)) {
                *token = None;
            }
        }
    }

    pub(super) fn token_or_outcome(&self, i: usize) -> Result<Option<Arc<str>>, Outcome> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let mut token = auth.token.lock();
        if token.is_none() {
            let body = serde_json::json!({
                "name": auth.credentials.user,
                "password": auth.credentials.password.0,
            })
            .to_string();
            let who = &auth.credentials.user;
            let got = match self.send_as(i, "/v3/auth/authenticate", &body, None) {
                Ok(reply) => serde_json::from_str::<Value>(&reply)
                    .ok()
                    .and_then(|v| v.get("token")?.as_str().map(Arc::<str>::from))
                    .ok_or_else(|| {
                        Outcome::Fail(not_etcd(
                            &self.members[i],
                            "/v3/auth/authenticate",
                            "its reply has no token",
                        ))
                    })?,
                Err(Outcome::Fail(e)) if e.message().ends_with("authentication is not enabled") => {
                    Arc::from("")
                }
                Err(Outcome::Fail(e)) if e.kind() == BackendErrorKind::Auth => {
                    return Err(Outcome::Fail(BackendError::new(
                        BackendErrorKind::Auth,
                        format!("{} (authenticating as user {who:?})", e.message()),
                    )));
                }
                Err(other) => return Err(other),
            };
            *token = Some(got);
        }
        Ok(token.clone().filter(|t| !t.is_empty()))
    }

    /// Sends with the current token; when etcd says the token is invalid or stale (it
    /// expired, the user's password changed, the auth store moved on), asks for a new
    /// one and sends once more.
    pub(super) fn send(&self, i: usize, path: &str, text: &str) -> Result<String, Outcome> {
        if self.auth.is_none() {
            return self.send_as(i, path, text, None);
        }
        let token = self.token_or_outcome(i)?;
        match self.send_as(i, path, text, token.as_deref()) {
            Err(Outcome::Fail(e)) if stale_token(&e) => {
                log::debug!("dlm-etcd: {}: getting a new auth token", self.members[i]);
                self.forget_token(token.as_ref());
                let token = self.token_or_outcome(i)?;
                self.send_as(i, path, text, token.as_deref())
            }
            other => other,
        }
    }
}

//! Talking to a member over its JSON gateway: a plain HTTP/1.0 request (no client
//! library in the testkit), the member's status, and the admin calls that set up users,
//! roles and authentication for the auth tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use super::{EtcdServer, HTTP_TIMEOUT};

impl EtcdServer {
    /// This member's ID and the ID of the leader it knows (`/v3/maintenance/status`), as
    /// etcd prints them (decimal strings); `None` when it does not answer.
    pub fn status(&self) -> Option<(String, String)> {
        let (code, body) = http(
            self.client_port,
            "POST",
            "/v3/maintenance/status",
            "{}",
            None,
        )
        .ok()?;
        if code != 200 {
            return None;
        }
        let member = json_string_field(&body, "member_id")?;
        let leader = json_string_field(&body, "leader")?;
        Some((member, leader))
    }

    /// Sends a raw request to this member's client port (`method`, `path`, a JSON body)
    /// and returns the HTTP status and the body, for tests that look at etcd directly.
    ///
    /// # Errors
    /// The I/O error when the member does not answer within 2 s.
    pub fn request(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        http(self.client_port, method, path, body, None)
    }

    /// As [`request`](Self::request), with an auth token (from
    /// [`authenticate`](Self::authenticate)) in the `Authorization` header.
    ///
    /// # Errors
    /// As [`request`](Self::request).
    pub fn request_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: &str,
    ) -> std::io::Result<(u16, String)> {
        http(self.client_port, method, path, body, Some(token))
    }

    /// Adds the etcd user `name` with `password` (before [`enable_auth`](Self::enable_auth)),
    /// and, with `prefix`, a role `{name}-rw` that reads and writes every key that starts
    /// with it, granted to the user. Without `prefix` the user has no rights on any key.
    ///
    /// # Panics
    /// When etcd refuses a request (with its answer).
    pub fn add_user(&self, name: &str, password: &str, prefix: Option<&str>) {
        self.must(
            "/v3/auth/user/add",
            &format!(
                r#"{{"name":{},"password":{}}}"#,
                json_str(name),
                json_str(password)
            ),
        );
        let Some(prefix) = prefix else { return };
        let role = json_str(&format!("{name}-rw"));
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().expect("a non-empty prefix") += 1;
        self.must("/v3/auth/role/add", &format!(r#"{{"name":{role}}}"#));
        self.must(
            "/v3/auth/role/grant",
            &format!(
                r#"{{"name":{role},"perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                base64(prefix.as_bytes()),
                base64(&end)
            ),
        );
        self.must(
            "/v3/auth/user/grant",
            &format!(r#"{{"user":{},"role":{role}}}"#, json_str(name)),
        );
    }

    /// Turns etcd's authentication on: adds the `root` user (with `root_password`) and
    /// role that etcd requires first. Every request then needs a token.
    ///
    /// # Panics
    /// When etcd refuses a request (with its answer).
    pub fn enable_auth(&self, root_password: &str) {
        self.must("/v3/auth/role/add", r#"{"name":"root"}"#);
        self.add_user("root", root_password, None);
        self.must("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#);
        self.must("/v3/auth/enable", "{}");
    }

    /// A token for `name` (`/v3/auth/authenticate`).
    ///
    /// # Panics
    /// When etcd refuses the credentials.
    pub fn authenticate(&self, name: &str, password: &str) -> String {
        let body = self.must(
            "/v3/auth/authenticate",
            &format!(
                r#"{{"name":{},"password":{}}}"#,
                json_str(name),
                json_str(password)
            ),
        );
        json_string_field(&body, "token").unwrap_or_else(|| panic!("no token in {body}"))
    }

    /// Sets `user`'s password (as `root`), which makes etcd invalidate every token it
    /// gave that user.
    ///
    /// # Panics
    /// When etcd refuses a request (with its answer).
    pub fn change_password(&self, root_password: &str, user: &str, password: &str) {
        let root = self.authenticate("root", root_password);
        let body = format!(
            r#"{{"name":{},"password":{}}}"#,
            json_str(user),
            json_str(password)
        );
        let (code, reply) = self
            .request_as(&root, "POST", "/v3/auth/user/changepw", &body)
            .unwrap_or_else(|e| self.fail(&format!("/v3/auth/user/changepw: {e}")));
        if code != 200 {
            self.fail(&format!("/v3/auth/user/changepw: HTTP {code}: {reply}"));
        }
    }

    /// POSTs `body` to `path` without a token; panics unless etcd answers 200.
    fn must(&self, path: &str, body: &str) -> String {
        match self.request("POST", path, body) {
            Ok((200, reply)) => reply,
            Ok((code, reply)) => self.fail(&format!("{path}: HTTP {code}: {reply}")),
            Err(e) => self.fail(&format!("{path}: {e}")),
        }
    }
}

/// One HTTP/1.0 request to `127.0.0.1:port` (connection closed after the reply); the
/// status code and the body.
pub(super) fn http(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))?;
    s.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let authorization = token
        .map(|t| format!("Authorization: {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{authorization}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    // No half-close: the gateway cancels a request whose client has shut its side.
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP reply: {head:?}")))?;
    Ok((code, body.to_owned()))
}

/// `s` as a JSON string.
fn json_str(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Standard base64 with padding (keys in etcd's JSON).
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The string value of the first `"field":"..."` in a JSON text (etcd prints its 64-bit
/// integers as strings).
fn json_string_field(body: &str, field: &str) -> Option<String> {
    let pat = format!("\"{field}\":\"");
    let start = body.find(&pat)? + pat.len();
    let len = body[start..].find('"')?;
    Some(body[start..start + len].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_fields_are_read_from_etcd_json() {
        let body = r#"{"header":{"member_id":"42","raft_term":"2"},"leader":"7"}"#;
        assert_eq!(json_string_field(body, "member_id").as_deref(), Some("42"));
        assert_eq!(json_string_field(body, "leader").as_deref(), Some("7"));
        assert_eq!(json_string_field(body, "missing"), None);
    }

    #[test]
    fn base64_and_json_strings_as_etcd_reads_them() {
        assert_eq!(base64(b"dlm/"), "ZGxtLw==");
        assert_eq!(base64(b"dlm/lock/"), "ZGxtL2xvY2sv");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(json_str("a\"b\\c"), r#""a\"b\\c""#);
    }
}

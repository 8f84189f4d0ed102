//! [`RedisServerBuilder`]'s settings and [`spawn`](RedisServerBuilder::spawn).

use std::fs;
use std::path::PathBuf;

use super::{
    CONFIG_FILE, LIVE_PIDS, LOGS, NOT_FOUND, RedisServer, RedisServerBuilder, TlsConfig,
    redis_server_binary,
};
use crate::process::{Process, Server};

impl RedisServerBuilder {
    /// Turns the append-only file on (`--appendonly yes --appendfsync always`), so
    /// that data survives [`RedisServer::restart`].
    pub fn appendonly(mut self, on: bool) -> Self {
        self.appendonly = on;
        self
    }

    /// Sets `requirepass` (the `default` user's password). [`RedisServer::connection`]
    /// and, unless [`credentials`](Self::credentials) are set, [`RedisServer::url`]
    /// authenticate with it.
    pub fn password(mut self, pw: &str) -> Self {
        self.password = Some(pw.to_owned());
        self
    }

    /// Adds an ACL user: `--user <user> <rules...>`, e.g.
    /// `acl_user("app", "on >secret ~dlm:* &dlm:* +@all")`.
    pub fn acl_user(mut self, user: &str, rules: &str) -> Self {
        self.args.extend(["--user".to_owned(), user.to_owned()]);
        self.args
            .extend(rules.split_whitespace().map(str::to_owned));
        self
    }

    /// The user and password that [`RedisServer::url`] carries (for the client under
    /// test). Admin controls keep using the `default` user.
    pub fn credentials(mut self, user: &str, pw: &str) -> Self {
        self.credentials = Some((user.to_owned(), pw.to_owned()));
        self
    }

    /// Appends a raw command-line argument, e.g. `.arg("--maxmemory").arg("1mb")`.
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_owned());
        self
    }

    /// Adds an environment variable for the child (e.g. `LD_PRELOAD` for a clock shim).
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }

    /// Runs the server with its wall clock shifted by `skew` (see [`crate::skew`]):
    /// change the offset at any time, and the server's next clock read sees it. Survives
    /// [`RedisServer::restart`]. Keep `skew` alive as long as the server.
    ///
    /// # Panics
    /// When the shim cannot be compiled (no `cc`).
    pub fn clock_skew(self, skew: &crate::skew::ClockSkew) -> Self {
        let shim = crate::skew::shim().display().to_string();
        let file = skew.path().display().to_string();
        self.env("LD_PRELOAD", &shim).env("CLOCKSKEW_FILE", &file)
    }

    /// Opens a TLS port too (`--tls-port`), presenting `cert` from `pki` (see
    /// [`crate::tls`]); clients need no certificate of their own unless
    /// [`tls_auth_clients`](Self::tls_auth_clients). The plain port stays open for the
    /// testkit's admin connections; [`RedisServer::tls_url`] is the TLS one. Keep `pki`
    /// alive as long as the server (a restart reads the files again).
    pub fn tls(mut self, pki: &crate::tls::TestPki, cert: crate::tls::ServerCert) -> Self {
        let (cert, key) = pki.server_cert(cert);
        self.tls = Some(TlsConfig {
            cert,
            key,
            ca: pki.ca_file(),
            auth_clients: false,
        });
        self
    }

    /// Requires clients on the TLS port to present a certificate signed by the test CA
    /// (`--tls-auth-clients yes`: mutual TLS). Needs [`tls`](Self::tls) first.
    pub fn tls_auth_clients(mut self, on: bool) -> Self {
        let tls = self
            .tls
            .as_mut()
            .expect("tls_auth_clients needs tls(..) first");
        tls.auth_clients = on;
        self
    }

    /// Gives the server a cluster bus port of its own, `--cluster-port <free port>` (picked
    /// like the main port, kept across restarts; see [`RedisServer::cluster_port`]), for
    /// `--cluster-enabled yes` (see [`crate::cluster`]). Without it, the bus would listen on
    /// the main port + 10000, which may be taken or out of range.
    pub fn cluster_port(mut self, on: bool) -> Self {
        self.cluster_port = on;
        self
    }

    /// Runs this `redis-server` binary instead of the one [`redis_server_binary`] finds
    /// (e.g. [`legacy_redis_server_binary`](super::legacy_redis_server_binary)).
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Starts the server from a config file with `contents`, written once into its dir
    /// (the command-line options still apply on top). The file stays writable and is
    /// reused by [`RedisServer::restart`], as Sentinel needs (it rewrites its file).
    pub(crate) fn config_file(mut self, contents: &str) -> Self {
        self.config_file = Some(contents.to_owned());
        self
    }

    /// Starts the server and waits until it answers. Panics (with the server's log) if
    /// it cannot be started.
    pub fn spawn(self) -> RedisServer {
        let binary = match &self.binary {
            Some(b) => b.clone(),
            None => redis_server_binary().unwrap_or_else(|| panic!("{NOT_FOUND}")),
        };
        let process = Process::new("redis-server", binary, "dlm-redis-", LOGS, &LIVE_PIDS);
        if let Some(contents) = &self.config_file {
            fs::write(process.dir().join(CONFIG_FILE), contents)
                .expect("writing redis-server's config file");
        }
        let mut server = RedisServer {
            config: self,
            process,
            port: 0,
            tls_port: 0,
            cluster_port: 0,
        };
        server.start(false);
        server
    }
}

//! Each store built from the command line: Redis (one server, Redlock, Cluster,
//! Sentinel), etcd, PostgreSQL, and the file backend.

use std::str::FromStr;
use std::sync::Arc;

use dlm_core::backend::LockBackend;
use dlm_redis::{RedisBackend, Redlock};

use super::secrets::{password, postgres_password_in, tls, tls_options, with_password};
use super::{ANY_PASSWORD_VAR, Connection, ETCD_PASSWORD_VAR, PASSWORD_VAR, POSTGRES_PASSWORD_VAR};
use crate::BackendArgs;
use crate::exit::Failure;

/// A Redis backend (one server, Redlock, `--cluster`, `--sentinel`) on the URLs `list`
/// from `source`.
pub(super) fn redis(
    args: &BackendArgs,
    list: &str,
    source: &'static str,
) -> Result<Connection, Failure> {
    let password = password(args, &[PASSWORD_VAR, ANY_PASSWORD_VAR])?;
    // With Sentinel the password is the data nodes', not the sentinels'.
    let url_password = password.as_deref().filter(|_| args.sentinel.is_none());
    let urls: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .enumerate()
        .map(|(i, u)| with_password(source, i, u, url_password))
        .collect::<Result<_, _>>()?;
    if !args.cluster && args.sentinel.is_none() {
        redlock_or_one(source, list, urls.len())?;
    }
    let tls = tls(args, &urls, ("rediss", "redis"))?;
    let wait = match (args.wait_replicas, args.wait_timeout) {
        (None, _) => None,
        (Some(n), secs) => {
            let secs = secs.unwrap_or(0.5);
            let timeout = std::time::Duration::try_from_secs_f64(secs)
                .map_err(|_| Failure::usage(format!("--wait-timeout {secs}: not a duration")))?;
            Some((n, timeout))
        }
    };
    let bad = |e: dlm_core::Error| {
        if args.sentinel.is_some() && not_a_sentinel(&e) {
            log::info!("{e}");
            return Failure::usage(format!(
                "--sentinel: {source} does not name a Redis Sentinel (the server does not know the SENTINEL command: a plain Redis?); give the sentinels' URLs (port 26379 by default), or drop --sentinel to lock on one server"
            ));
        }
        Failure::from_lock_error_with("cannot use the backend", &e, source)
    };
    // The settings every single-master builder takes (each deployment has a builder
    // type of its own, with the same setter names).
    macro_rules! configure {
        ($builder:expr) => {{
            let mut b = $builder;
            if let Some(tls) = tls.clone() {
                b = b.tls(tls);
            }
            if let Some(prefix) = &args.prefix {
                b = b.prefix(prefix);
            }
            if let Some((n, timeout)) = wait {
                b = b.wait_for_replicas(n, timeout);
            }
            b
        }};
    }
    let (backend, describe): (Arc<dyn LockBackend>, String) = match urls.len() {
        0 => return Err(Failure::usage(format!("{source} names no URL"))),
        n if args.cluster => (
            Arc::new(
                configure!(RedisBackend::cluster_builder(&urls))
                    .build()
                    .map_err(bad)?,
            ),
            format!("Redis Cluster ({n} seed{})", if n == 1 { "" } else { "s" }),
        ),
        n => match &args.sentinel {
            Some(name) => {
                let mut b = configure!(RedisBackend::sentinel_builder(name, &urls));
                if let Some(password) = &password {
                    b = b.master_auth(None, password);
                }
                (
                    Arc::new(b.build().map_err(bad)?),
                    format!(
                        "master {name:?} of {n} sentinel{}",
                        if n == 1 { "" } else { "s" }
                    ),
                )
            }
            None if n == 1 => (
                Arc::new(
                    configure!(RedisBackend::builder(&urls[0]))
                        .build()
                        .map_err(bad)?,
                ),
                "1 server".into(),
            ),
            None => {
                if wait.is_some() {
                    return Err(Failure::usage(
                        "--wait-replicas is for a single server, --sentinel or --cluster: Redlock's masters are independent",
                    ));
                }
                let mut b = Redlock::builder(&urls);
                if let Some(tls) = tls {
                    b = b.tls(tls);
                }
                if let Some(prefix) = &args.prefix {
                    b = b.prefix(prefix);
                }
                (
                    Arc::new(b.build().map_err(bad)?),
                    format!("Redlock over {n} servers"),
                )
            }
        },
    };
    log::info!("backend: {describe}");
    Ok(Connection { backend, describe })
}

/// An etcd backend on the members `list` (comma-separated client URLs) from `source`.
/// The options of Redis deployments (`--cluster`, `--sentinel`, `--wait-replicas`) were
/// refused by `choose`.
pub(super) fn etcd(args: &BackendArgs, list: &str, source: &str) -> Result<Connection, Failure> {
    let urls: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let mut b = dlm_etcd::EtcdBackend::builder(&urls);
    // The password of --password-file, $DLM_ETCD_PASSWORD, $DLM_PASSWORD or
    // $DLM_REDIS_PASSWORD is for
    // URLs that name a user and have no password (etcd has no default user, so it needs
    // one).
    let parsed: Vec<Option<url::Url>> = urls.iter().map(|u| url::Url::parse(u).ok()).collect();
    let has_user = parsed.iter().flatten().any(|u| !u.username().is_empty());
    let has_password = parsed.iter().flatten().any(|u| u.password().is_some());
    if let Some(password) = password(args, &[ETCD_PASSWORD_VAR, ANY_PASSWORD_VAR, PASSWORD_VAR])? {
        if !has_user && args.password_file.is_some() {
            return Err(Failure::usage(format!(
                "--password-file with etcd needs a user: name it in the URL of {source} (http://USER@host:port)"
            )));
        }
        if has_user && !has_password {
            b = b.password(&password);
        }
    }
    if let Some(prefix) = &args.prefix {
        b = b.prefix(prefix);
    }
    if let Some(tls) = tls(args, &urls, ("https", "http"))? {
        b = b.tls(tls);
    }
    let backend = b
        .build()
        .map_err(|e| Failure::usage(format!("{source}: {e}")))?;
    let n = urls.len();
    let describe = format!("etcd ({n} member{})", if n == 1 { "" } else { "s" });
    log::info!("backend: {describe}");
    Ok(Connection {
        backend: Arc::new(backend),
        describe,
    })
}

/// A PostgreSQL backend on the server(s) of `url` (one libpq URL, whose hosts may be
/// several: `host1:5432,host2:5432`) from `source`. The options of Redis deployments were
/// refused by `choose`. The password of `--password-file`, `$DLM_POSTGRES_PASSWORD`
/// or `$DLM_PASSWORD` is for a URL that has none; without any, dlm-postgres reads
/// `$PGPASSWORD`. `--prefix` names the schema; the `--tls-*` flags make it TLS
/// (`sslmode=require`, verified), whatever the URL says but `sslmode=disable`.
pub(super) fn postgres(
    args: &BackendArgs,
    url: &str,
    source: &'static str,
) -> Result<Connection, Failure> {
    let url = url.trim();
    let mut b = dlm_postgres::PostgresBackend::builder(url);
    if let Some(password) = password(args, &[POSTGRES_PASSWORD_VAR, ANY_PASSWORD_VAR])?
        && !postgres_password_in(url)
    {
        b = b.password(&password);
    }
    if let Some(prefix) = &args.prefix {
        b = b.schema(prefix);
    }
    if let Some(tls) = tls_options(args) {
        b = b.tls(tls);
    }
    // Checked before any I/O: the scheme, libpq's rules, the settings, the files.
    let backend = b
        .build()
        .map_err(|e| Failure::usage(crate::exit::invalid(&e, source)))?;
    let describe = format!("postgres ({})", postgres_servers(url));
    log::info!("backend: {describe}");
    Ok(Connection {
        backend: Arc::new(backend),
        describe,
    })
}

/// The `host:port` pairs of a PostgreSQL URL that dlm-postgres accepted, comma-separated
/// (never its user or password).
fn postgres_servers(url: &str) -> String {
    let Ok(config) = tokio_postgres::Config::from_str(url) else {
        return "?".into();
    };
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                tokio_postgres::config::Host::Tcp(h) if h.contains(':') => {
                    format!("[{h}]:{port}")
                }
                tokio_postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
                // Refused by dlm-postgres.
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            }
        })
        .collect();
    if hosts.is_empty() {
        // libpq's default host, as dlm-postgres takes it.
        return format!("localhost:{}", ports.first().copied().unwrap_or(5432));
    }
    hosts.join(", ")
}

/// `--local`'s directory when none is given: `$XDG_RUNTIME_DIR/dlm` (the user's runtime
/// directory, private and on a tmpfs), else `/run/lock/dlm` for root, else
/// `/tmp/dlm-UID` (made 0700; refused if another user made it first).
pub(crate) fn default_dir() -> std::path::PathBuf {
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return std::path::Path::new(&run).join("dlm");
    }
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 && std::path::Path::new("/run/lock").is_dir() {
        return "/run/lock/dlm".into();
    }
    format!("/tmp/dlm-{uid}").into()
}

/// The file backend over `dir`.
pub(super) fn file(dir: &std::path::Path, source: &'static str) -> Result<Connection, Failure> {
    let backend = dlm_file::FileBackend::new(dir)
        .map_err(|e| Failure::from_lock_error_with("cannot use the backend", &e, source))?;
    let describe = format!("this machine, {}", dir.display());
    log::info!("backend: {describe}");
    Ok(Connection {
        backend: Arc::new(backend),
        describe,
    })
}

/// A plain URL list (not `--cluster`, not `--sentinel`) is one server, or Redlock over 3
/// or more independent masters. Two masters are refused: Redlock's majority of 2 is both,
/// so either one down stops every lock (worse than one server). So is one URL written as
/// a list (`URL,`), which reads as an unfinished Redlock.
fn redlock_or_one(source: &str, list: &str, n: usize) -> Result<(), Failure> {
    let why = "Redlock needs 3 or more independent masters; for one server, give one URL";
    match n {
        1 if list.contains(',') => Err(Failure::usage(format!(
            "{source} is a list of one URL: {why} (without a comma)"
        ))),
        2 => Err(Failure::usage(format!(
            "{source} gives 2 URLs: {why} (with 2, a majority is both: either one down stops every lock)"
        ))),
        _ => Ok(()),
    }
}

/// Whether a `--sentinel` build failed because the server is no Sentinel. The library
/// returns the server's error as a protocol error with no kind of its own, so this reads
/// the server's words (`ERR unknown command 'SENTINEL'`).
fn not_a_sentinel(e: &dlm_core::Error) -> bool {
    e.backend().is_some_and(|b| {
        let text = b.to_string().to_ascii_lowercase();
        text.contains("unknown command") && text.contains("sentinel")
    })
}

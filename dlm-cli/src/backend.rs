//! The backend from the command line: URLs, the password, TLS.

use std::str::FromStr;
use std::sync::Arc;

use dlm_core::backend::LockBackend;
use dlm_core::{LockClient, LockClientBuilder};
use dlm_redis::{RedisBackend, Redlock, TlsOptions};

use crate::BackendArgs;
use crate::exit::Failure;

/// The environment variable read when `--redis` is not given.
pub(crate) const URL_VAR: &str = "DLM_REDIS_URL";
/// The environment variable read for etcd when neither `--redis` nor `--etcd` is given.
pub(crate) const ETCD_VAR: &str = "DLM_ETCD_ENDPOINTS";
/// The environment variable with the password for URLs that have none, on every backend
/// (after the backend's own variable).
pub(crate) const ANY_PASSWORD_VAR: &str = "DLM_PASSWORD";
/// The environment variable with the password for Redis URLs that have none: the older
/// name of `DLM_PASSWORD`, read before it on Redis (and last on etcd).
pub(crate) const PASSWORD_VAR: &str = "DLM_REDIS_PASSWORD";
/// The environment variable with the password for etcd URLs that name a user and have
/// none; `DLM_PASSWORD`, then `DLM_REDIS_PASSWORD`, are read when it is not set.
pub(crate) const ETCD_PASSWORD_VAR: &str = "DLM_ETCD_PASSWORD";
/// The environment variable read for PostgreSQL when no backend flag is given.
pub(crate) const POSTGRES_VAR: &str = "DLM_POSTGRES_URL";
/// The directory of the file backend's locks (`--dir`).
pub(crate) const DIR_VAR: &str = "DLM_DIR";
/// The environment variable with the password for a PostgreSQL URL that has none (else
/// dlm-postgres reads libpq's `$PGPASSWORD`).
pub(crate) const POSTGRES_PASSWORD_VAR: &str = "DLM_POSTGRES_PASSWORD";

/// dlm's environment variables that hold a secret, which the command does not get: the
/// passwords, and the URLs (Redis, etcd or PostgreSQL) when one of them carries a password
/// (as `user:pw@`, or `?pass=` for a Redis unix socket, `?password=` for PostgreSQL). A URL
/// list without one stays, for a nested `dlm`.
pub(crate) fn secret_vars() -> Vec<&'static str> {
    let mut vars = vec![
        ANY_PASSWORD_VAR,
        PASSWORD_VAR,
        ETCD_PASSWORD_VAR,
        POSTGRES_PASSWORD_VAR,
    ];
    let has_password = |u: &str| {
        url::Url::parse(u.trim()).is_ok_and(|u| {
            u.password().is_some_and(|p| !p.is_empty())
                || u.query_pairs().any(|(k, _)| k.eq_ignore_ascii_case("pass"))
        })
    };
    for var in [URL_VAR, ETCD_VAR] {
        if std::env::var(var).is_ok_and(|urls| urls.split(',').any(has_password)) {
            vars.push(var);
        }
    }
    // One URL, whose hosts are comma-separated (not a list), read as libpq reads it.
    if std::env::var(POSTGRES_VAR).is_ok_and(|url| postgres_password_in(&url)) {
        vars.push(POSTGRES_VAR);
    }
    vars
}

/// Whether a PostgreSQL URL carries a password (`user:pw@` or `?password=`), read with
/// dlm-postgres's parser. One that parser refuses is taken to carry one when it has a
/// `:` before its `@` or a `password=` (it reaches the command only if dlm refuses it).
fn postgres_password_in(url: &str) -> bool {
    let url = url.trim();
    match tokio_postgres::Config::from_str(url) {
        Ok(config) => config.get_password().is_some_and(|p| !p.is_empty()),
        Err(_) => {
            url.split_once('@')
                .is_some_and(|(creds, _)| creds.contains(':'))
                || url.to_ascii_lowercase().contains("password=")
        }
    }
}

/// A backend, and what the output may say about it (never a password).
pub(crate) struct Connection {
    pub(crate) backend: Arc<dyn LockBackend>,
    /// "1 server", "Redlock over 3 servers", "Redis Cluster (2 seeds)", "master \"m\" of
    /// 3 sentinels".
    pub(crate) describe: String,
}

impl Connection {
    /// Builds the backend the arguments (or the environment) name.
    pub(crate) fn from_args(args: &BackendArgs) -> Result<Connection, Failure> {
        if let Some((dir, source)) = local(args)? {
            return file(args, &dir, source);
        }
        let (backend, list, source) = choose(args)?;
        match backend {
            Backend::Postgres => return postgres(args, &list, source),
            Backend::Etcd => return etcd(args, &list, source),
            Backend::Redis => {}
        }
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
            redlock_or_one(source, &list, urls.len())?;
        }
        let tls = tls(args, &urls, ("rediss", "redis"))?;
        let wait = match (args.wait_replicas, args.wait_timeout) {
            (None, _) => None,
            (Some(n), secs) => {
                let secs = secs.unwrap_or(0.5);
                let timeout = std::time::Duration::try_from_secs_f64(secs).map_err(|_| {
                    Failure::usage(format!("--wait-timeout {secs}: not a duration"))
                })?;
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

    /// A client builder over this backend.
    pub(crate) fn client(&self) -> LockClientBuilder {
        LockClient::builder(self.backend.clone())
    }
}

/// The directory of the file backend when the command line names it: `--local` (with
/// `--dir DIR` or the default directory), `--dir DIR`, or, without any backend option,
/// `$DLM_DIR` when no server's variable is set. `None`: another backend.
fn local(args: &BackendArgs) -> Result<Option<(std::path::PathBuf, &'static str)>, Failure> {
    let dir_flag = args.dir.is_some() && !args.is_from_env("dir");
    let servers = [
        (
            "--redis",
            args.redis.is_some() && !args.is_from_env("redis"),
        ),
        ("--etcd", args.etcd.is_some() && !args.is_from_env("etcd")),
        (
            "--postgres",
            args.postgres.is_some() && !args.is_from_env("postgres"),
        ),
    ];
    let server_flag = servers.iter().find(|(_, given)| *given).map(|(f, _)| *f);
    let source = match (args.local, dir_flag) {
        (true, _) => "--local",
        (false, true) => "--dir",
        (false, false) => {
            // $DLM_DIR alone, with no server option or variable.
            let env_dir = args.dir.as_ref().filter(|d| !d.as_os_str().is_empty());
            let server_var = [&args.redis, &args.etcd, &args.postgres]
                .iter()
                .any(|v| v.as_ref().is_some_and(|v| !v.trim().is_empty()));
            match (env_dir, server_flag, server_var) {
                (Some(dir), None, false) => {
                    refuse_server_options(args, "$DLM_DIR")?;
                    return Ok(Some((dir.clone(), "$DLM_DIR")));
                }
                (Some(_), None, true) => {
                    return Err(Failure::usage(format!(
                        "{DIR_VAR} is set beside a server's variable: give --local or the server's option"
                    )));
                }
                _ => return Ok(None),
            }
        }
    };
    if let Some(flag) = server_flag {
        return Err(Failure::usage(format!(
            "{source} cannot be used with {flag}: give one backend"
        )));
    }
    refuse_server_options(args, source)?;
    let dir = match &args.dir {
        Some(dir) if !dir.as_os_str().is_empty() => dir.clone(),
        _ => default_dir(),
    };
    Ok(Some((dir, source)))
}

/// The options that only a server takes, refused beside the file backend.
fn refuse_server_options(args: &BackendArgs, source: &str) -> Result<(), Failure> {
    let server_only = [
        ("--cluster", args.cluster),
        ("--sentinel", args.sentinel.is_some()),
        ("--wait-replicas", args.wait_replicas.is_some()),
        ("--password-file", args.password_file.is_some()),
        ("--prefix", args.prefix.is_some()),
        (
            "--tls-ca-file",
            args.tls_ca_file.is_some() && !args.is_from_env("tls_ca_file"),
        ),
        (
            "--tls-cert",
            args.tls_cert.is_some() && !args.is_from_env("tls_cert"),
        ),
        (
            "--tls-server-name",
            args.tls_server_name.is_some() && !args.is_from_env("tls_server_name"),
        ),
    ];
    match server_only.iter().find(|(_, given)| *given) {
        Some((option, _)) => Err(Failure::usage(format!(
            "{option} cannot be used with {source}: it is for a server"
        ))),
        None => Ok(()),
    }
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
fn file(
    args: &BackendArgs,
    dir: &std::path::Path,
    source: &'static str,
) -> Result<Connection, Failure> {
    let _ = args;
    let backend = dlm_file::FileBackend::new(dir)
        .map_err(|e| Failure::from_lock_error_with("cannot use the backend", &e, source))?;
    let describe = format!("this machine, {}", dir.display());
    log::info!("backend: {describe}");
    Ok(Connection {
        backend: Arc::new(backend),
        describe,
    })
}

/// Which store a command line names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Redis,
    Etcd,
    Postgres,
}

/// The backend, its URL(s), and where they came from (`--redis` or `$DLM_REDIS_URL`, ...).
/// A flag names the backend (two are refused); without one, the one variable that is set
/// does (a blank one is not set). The Redis options (`--cluster`, `--sentinel`,
/// `--wait-replicas`) are refused with another backend.
fn choose(args: &BackendArgs) -> Result<(Backend, String, &'static str), Failure> {
    let all = [
        (Backend::Redis, &args.redis, "redis", "--redis", URL_VAR),
        (Backend::Etcd, &args.etcd, "etcd", "--etcd", ETCD_VAR),
        (
            Backend::Postgres,
            &args.postgres,
            "postgres",
            "--postgres",
            POSTGRES_VAR,
        ),
    ];
    // (backend, value, flag, variable) for each option given on the command line, then
    // for each variable that is set (and not blank).
    let flags: Vec<(Backend, &String, &'static str, &'static str)> = all
        .iter()
        .filter(|(.., id, _, _)| !args.is_from_env(id))
        .filter_map(|(b, value, _, flag, var)| value.as_ref().map(|v| (*b, v, *flag, *var)))
        .collect();
    let (backend, list, source) = match &flags[..] {
        [(backend, value, flag, _)] => (*backend, (*value).clone(), *flag),
        [(_, _, a, _), (_, _, b, _), ..] => {
            return Err(Failure::usage(format!(
                "{b} cannot be used with {a}: give one backend"
            )));
        }
        [] => {
            let set: Vec<(Backend, &String, &'static str, &'static str)> = all
                .iter()
                .filter_map(|(b, value, _, flag, var)| value.as_ref().map(|v| (*b, v, *flag, *var)))
                .filter(|(_, v, ..)| !v.trim().is_empty())
                .collect();
            match &set[..] {
                [(backend, value, ..)] => (
                    *backend,
                    (*value).clone(),
                    match backend {
                        Backend::Redis => "$DLM_REDIS_URL",
                        Backend::Etcd => "$DLM_ETCD_ENDPOINTS",
                        Backend::Postgres => "$DLM_POSTGRES_URL",
                    },
                ),
                [] => {
                    return Err(Failure::usage(format!(
                        "no backend: give --redis URL[,URL...], --etcd URL[,URL...] or --postgres URL, or set {URL_VAR}, {ETCD_VAR} or {POSTGRES_VAR}; --local for a lock on this machine only (see dlm --help)"
                    )));
                }
                [(_, _, fa, a), (_, _, fb, b)] => {
                    return Err(Failure::usage(format!(
                        "both {a} and {b} are set: give {fa} or {fb}"
                    )));
                }
                _ => {
                    return Err(Failure::usage(format!(
                        "{URL_VAR}, {ETCD_VAR} and {POSTGRES_VAR} are all set: give --redis, --etcd or --postgres"
                    )));
                }
            }
        }
    };
    if backend != Backend::Redis {
        let redis_only = [
            ("--cluster", args.cluster),
            ("--sentinel", args.sentinel.is_some()),
            ("--wait-replicas", args.wait_replicas.is_some()),
        ];
        if let Some((option, _)) = redis_only.iter().find(|(_, given)| *given) {
            return Err(Failure::usage(format!(
                "{option} cannot be used with {source}: it is a Redis option"
            )));
        }
    }
    Ok((backend, list, source))
}

/// An etcd backend on the members `list` (comma-separated client URLs) from `source`.
/// The options of Redis deployments (`--cluster`, `--sentinel`, `--wait-replicas`) were
/// refused by [`choose`].
fn etcd(args: &BackendArgs, list: &str, source: &str) -> Result<Connection, Failure> {
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
/// refused by [`choose`]. The password of `--password-file`, `$DLM_POSTGRES_PASSWORD`
/// or `$DLM_PASSWORD` is for a URL that has none; without any, dlm-postgres reads
/// `$PGPASSWORD`. `--prefix` names the schema; the `--tls-*` flags make it TLS
/// (`sslmode=require`, verified), whatever the URL says but `sslmode=disable`.
fn postgres(args: &BackendArgs, url: &str, source: &'static str) -> Result<Connection, Failure> {
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

/// The password from `--password-file` or the first of `vars` that is set, if any.
fn password(args: &BackendArgs, vars: &[&str]) -> Result<Option<String>, Failure> {
    if let Some(path) = &args.password_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Failure::usage(format!(
                "cannot read the password file {}: {e}",
                path.display()
            ))
        })?;
        let line = text.lines().next().unwrap_or("");
        if line.is_empty() {
            return Err(Failure::usage(format!(
                "the password file {} is empty",
                path.display()
            )));
        }
        return Ok(Some(line.to_owned()));
    }
    Ok(vars
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|p| !p.is_empty())))
}

/// `url` with `password` put in when it has none. Errors never echo the URL (it may hold
/// a password); they say which one by its position.
fn with_password(
    source: &str,
    i: usize,
    url: &str,
    password: Option<&str>,
) -> Result<String, Failure> {
    let Some(password) = password else {
        return Ok(url.to_owned());
    };
    let mut parsed = url::Url::parse(url).map_err(|e| {
        Failure::usage(format!("URL {} of {source} is not a valid URL: {e}", i + 1))
    })?;
    if parsed.password().is_some() || parsed.cannot_be_a_base() || !parsed.has_host() {
        // Has its own password, or a unix socket URL: left as given.
        return Ok(url.to_owned());
    }
    // The URL's password is percent-decoded on the way to the server: encode every byte
    // that is not a letter or digit, so that `%41` is sent as `%41` and not as `A`.
    let encoded =
        percent_encoding::utf8_percent_encode(password, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
    parsed.set_password(Some(&encoded)).map_err(|()| {
        Failure::usage(format!("URL {} of {source} cannot take a password", i + 1))
    })?;
    Ok(parsed.into())
}

/// The TLS options, when any TLS flag is given: the same flags and the same options
/// (`dlm_core::tls::TlsOptions`) for Redis, etcd and PostgreSQL; `tls_scheme` is the
/// scheme of the URLs they apply to (`rediss`, `https`), `plain` the other one's.
/// (PostgreSQL has one scheme: the flags make its connections TLS, see [`postgres`].)
fn tls(
    args: &BackendArgs,
    urls: &[impl AsRef<str>],
    (tls_scheme, plain): (&str, &str),
) -> Result<Option<TlsOptions>, Failure> {
    let Some(options) = tls_options(args) else {
        return Ok(None);
    };
    let prefix = format!("{tls_scheme}://");
    if !urls
        .iter()
        .any(|u| u.as_ref().to_ascii_lowercase().starts_with(&prefix))
    {
        // Named as the user set them: flags, or their variables.
        let given = [
            ("tls_ca_file", args.tls_ca_file.is_some(), "DLM_TLS_CA_FILE"),
            ("tls_cert", args.tls_cert.is_some(), "DLM_TLS_CERT"),
            ("tls_key", args.tls_key.is_some(), "DLM_TLS_KEY"),
            (
                "tls_server_name",
                args.tls_server_name.is_some(),
                "DLM_TLS_SERVER_NAME",
            ),
        ];
        let vars: Vec<String> = given
            .iter()
            .filter(|(id, set, _)| *set && args.is_from_env(id))
            .map(|(_, _, var)| format!("${var}"))
            .collect();
        let what = if vars.len() == given.iter().filter(|(_, set, _)| *set).count() {
            format!("the TLS options of {}", vars.join(", "))
        } else {
            "--tls-* options".to_owned()
        };
        return Err(Failure::usage(format!(
            "{what} need a URL with the {prefix} scheme (TLS); the URLs are plain {plain}://"
        )));
    }
    Ok(Some(options))
}

/// A path option's value, empty ones included: clap's own parser refuses an empty value,
/// and an empty variable (`DLM_TLS_CA_FILE=`) is taken as not set (`note_sources` in
/// main.rs), not as an error.
pub(crate) fn path(s: &str) -> Result<std::path::PathBuf, String> {
    Ok(std::path::PathBuf::from(s))
}

/// The TLS options of the `--tls-*` flags (or their variables), if any is given.
fn tls_options(args: &BackendArgs) -> Option<TlsOptions> {
    let any =
        args.tls_ca_file.is_some() || args.tls_cert.is_some() || args.tls_server_name.is_some();
    if !any {
        return None;
    }
    let mut tls = TlsOptions::new();
    if let Some(ca) = &args.tls_ca_file {
        tls = tls.ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        tls = tls.client_cert(cert, key);
    }
    if let Some(name) = &args.tls_server_name {
        tls = tls.server_name(name);
    }
    Some(tls)
}

//! The backend from the command line: which store the options (or the environment) name,
//! built by `stores`, with the passwords and TLS settings of `secrets`.

mod secrets;
mod stores;

use std::sync::Arc;

use dlm_core::backend::LockBackend;
use dlm_core::{LockClient, LockClientBuilder};

use crate::BackendArgs;
use crate::exit::Failure;

pub(crate) use secrets::{path, secret_vars};
pub(crate) use stores::default_dir;

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
            return stores::file(&dir, source);
        }
        let (backend, list, source) = choose(args)?;
        match backend {
            Backend::Postgres => return stores::postgres(args, &list, source),
            Backend::Etcd => return stores::etcd(args, &list, source),
            Backend::Redis => {}
        }
        stores::redis(args, &list, source)
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

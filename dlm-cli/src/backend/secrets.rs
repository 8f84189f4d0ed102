//! Passwords and TLS settings from the command line and the environment, and which
//! variables the command's child must not inherit.

use std::str::FromStr;

use dlm_redis::TlsOptions;

use super::{
    ANY_PASSWORD_VAR, ETCD_PASSWORD_VAR, ETCD_VAR, PASSWORD_VAR, POSTGRES_PASSWORD_VAR,
    POSTGRES_VAR, URL_VAR,
};
use crate::BackendArgs;
use crate::exit::Failure;

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
pub(super) fn postgres_password_in(url: &str) -> bool {
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

/// The password from `--password-file` or the first of `vars` that is set, if any.
pub(super) fn password(args: &BackendArgs, vars: &[&str]) -> Result<Option<String>, Failure> {
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
pub(super) fn with_password(
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
/// (PostgreSQL has one scheme: the flags make its connections TLS, see `stores::postgres`.)
pub(super) fn tls(
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
pub(super) fn tls_options(args: &BackendArgs) -> Option<TlsOptions> {
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

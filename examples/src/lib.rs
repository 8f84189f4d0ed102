//! Shared plumbing of the example programs: command-line parsing and backend choice
//! (`--redis URL[,URL...]`: one URL for a single Redis server, three or more for Redlock;
//! `--etcd URL[,URL...]`: an etcd cluster's members; `--postgres URL`: a PostgreSQL
//! server; without any, the embedded memory backend).
#![deny(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::LockBackend;

/// Command-line arguments, parsed by hand (`--flag value` pairs and bare `--switch`es).
#[derive(Debug)]
pub struct Args {
    program: &'static str,
    usage: &'static str,
    rest: Vec<String>,
}

impl Args {
    /// The process's arguments; `usage` is printed for `--help` and on errors.
    pub fn from_env(program: &'static str, usage: &'static str) -> Self {
        let rest: Vec<String> = std::env::args().skip(1).collect();
        if rest.iter().any(|a| a == "--help" || a == "-h") {
            println!("usage: {program} {usage}");
            std::process::exit(0);
        }
        Args {
            program,
            usage,
            rest,
        }
    }

    /// Prints `message` and the usage, and exits with status 2.
    pub fn fail(&self, message: &str) -> ! {
        eprintln!(
            "{}: {message}\nusage: {} {}",
            self.program, self.program, self.usage
        );
        std::process::exit(2)
    }

    /// Removes and returns the value of `--name VALUE`.
    pub fn value(&mut self, name: &str) -> Option<String> {
        let i = self.rest.iter().position(|a| a == name)?;
        if i + 1 >= self.rest.len() {
            self.fail(&format!("{name} needs a value"));
        }
        self.rest.remove(i);
        Some(self.rest.remove(i))
    }

    /// The value of `--name VALUE`, left in place.
    pub fn peek(&self, name: &str) -> Option<&str> {
        let i = self.rest.iter().position(|a| a == name)?;
        self.rest.get(i + 1).map(String::as_str)
    }

    /// Removes `--name VALUE` and parses it, or returns `default`.
    pub fn parsed<T: std::str::FromStr>(&mut self, name: &str, default: T) -> T {
        match self.value(name) {
            None => default,
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| self.fail(&format!("bad value for {name}: {v:?}"))),
        }
    }

    /// Removes `--name` and returns whether it was there.
    pub fn switch(&mut self, name: &str) -> bool {
        let before = self.rest.len();
        self.rest.retain(|a| a != name);
        self.rest.len() != before
    }

    /// Fails on anything not consumed.
    pub fn finish(&self) {
        if let Some(a) = self.rest.first() {
            self.fail(&format!("unexpected argument {a:?}"));
        }
    }

    /// The backend chosen by the arguments: `--redis URL` for one Redis server,
    /// `--redis URL,URL,URL[,...]` (three or more) for Redlock, else the embedded memory
    /// backend; `--etcd URL[,URL...]` for an etcd cluster (the members' client URLs);
    /// `--postgres URL` for a PostgreSQL server.
    pub fn backend(&mut self) -> Arc<dyn LockBackend> {
        if let Some(url) = self.value("--postgres") {
            return match dlm_postgres::PostgresBackend::new(&url) {
                Ok(b) => Arc::new(b),
                Err(e) => self.fail(&format!("--postgres: {e}")),
            };
        }
        if let Some(urls) = self.value("--etcd") {
            let urls: Vec<&str> = urls.split(',').filter(|u| !u.is_empty()).collect();
            return match dlm_etcd::EtcdBackend::new(&urls) {
                Ok(b) => Arc::new(b),
                Err(e) => self.fail(&format!("--etcd: {e}")),
            };
        }
        let Some(urls) = self.value("--redis") else {
            return Arc::new(dlm_memory::MemoryBackend::new());
        };
        let urls: Vec<&str> = urls.split(',').filter(|u| !u.is_empty()).collect();
        let built: dlm_core::Result<Arc<dyn LockBackend>> = match urls.len() {
            1 => dlm_redis::RedisBackend::new(urls[0]).map(|b| Arc::new(b) as _),
            n if n >= 3 => dlm_redis::Redlock::new(&urls).map(|b| Arc::new(b) as _),
            _ => self.fail("--redis takes one URL (single instance) or three or more (Redlock)"),
        };
        built.unwrap_or_else(|e| self.fail(&format!("--redis: {e}")))
    }
}

/// Parses a number of seconds such as `5` or `0.5`.
pub fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

/// The README's code examples, compiled and run as doc-tests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The guide's pages (`docs/guide/`): their Rust blocks compiled and run as doc-tests.
/// `guide_pages_are_all_compiled` checks that every page is listed here.
#[cfg(doctest)]
pub mod guide {
    #[doc = include_str!("../../docs/guide/README.md")]
    pub struct Readme;
    #[doc = include_str!("../../docs/guide/deployments.md")]
    pub struct Deployments;
    #[doc = include_str!("../../docs/guide/redis.md")]
    pub struct Redis;
    #[doc = include_str!("../../docs/guide/locks.md")]
    pub struct Locks;
    #[doc = include_str!("../../docs/guide/semaphores-and-rw-locks.md")]
    pub struct SemaphoresAndRwLocks;
    #[doc = include_str!("../../docs/guide/elections.md")]
    pub struct Elections;
    #[doc = include_str!("../../docs/guide/multi-locks.md")]
    pub struct MultiLocks;
    #[doc = include_str!("../../docs/guide/fencing.md")]
    pub struct Fencing;
    #[doc = include_str!("../../docs/guide/command.md")]
    pub struct Command;
    #[doc = include_str!("../../docs/guide/command-reference.md")]
    pub struct CommandReference;
    #[doc = include_str!("../../docs/guide/operating.md")]
    pub struct Operating;
    #[doc = include_str!("../../docs/guide/testing.md")]
    pub struct Testing;
    #[doc = include_str!("../../docs/guide/migrating.md")]
    pub struct Migrating;
    #[doc = include_str!("../../docs/guide/contributing.md")]
    pub struct Contributing;
}

/// The guide pages whose Rust blocks are compiled (the `guide` module, built for
/// doc-tests only), by file name.
pub const GUIDE_PAGES: &[&str] = &[
    "README.md",
    "deployments.md",
    "redis.md",
    "locks.md",
    "semaphores-and-rw-locks.md",
    "elections.md",
    "multi-locks.md",
    "fencing.md",
    "command.md",
    "command-reference.md",
    "operating.md",
    "testing.md",
    "migrating.md",
    "contributing.md",
];

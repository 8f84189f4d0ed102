//! Helpers for running the real `dlm` binary: processes that are always waited for with a
//! deadline and killed when a test ends early, bounded polls, `/proc` checks, and a small
//! JSON reader for `dlm status --json`, and lock helpers. Each test file uses a part of it.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlm_redis::redis;
use dlm_testkit::redis_server::{RedisServer, require_redis_server};

/// The timing-sensitive tests run one at a time, even without `--test-threads=1`.
pub(crate) static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// How long a `dlm` run that should end by itself may take before the test fails.
pub(crate) const LIMIT: Duration = Duration::from_secs(30);

pub(crate) const SECOND: Duration = Duration::from_secs(1);

pub(crate) fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A shell-quoted path.
pub(crate) fn q(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}

/// `DEL`s lock `name`'s key by hand (`dlm:{name}`, see dlm-redis's crate docs), asserting
/// it was there.
pub(crate) fn delete_key(server: &RedisServer, name: &str) {
    let deleted: i64 = redis::cmd("DEL")
        .arg(format!("dlm:{{{name}}}"))
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(deleted, 1, "no key dlm:{{{name}}}: is that the lock's key?");
}

/// Waits until a waiter has marked lock `name` (dlm-redis appends `~` to the holder's
/// value once a waiter waits for its release): the waiter is past its first attempt and
/// waiting.
pub(crate) fn wait_for_a_waiter(server: &RedisServer, name: &str) {
    let mut con = server.connection();
    wait_until(Duration::from_secs(10), "a waiter to wait", || {
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("dlm:{{{name}}}"))
            .query(&mut con)
            .unwrap();
        v.is_some_and(|v| v.ends_with('~'))
    });
}

/// `dlm run -n NAME -- true`: 0 when it got the lock, 1 when it is held.
pub(crate) fn try_once(urls: &str, name: &str) -> i32 {
    let code = run(dlm().args(["run", "-n", "--redis", urls, name, "--", "true"])).code();
    assert!(code == 0 || code == 1, "dlm run -n exited {code}");
    code
}

/// The binary under test, with no backend or password from the test's environment
/// (`PGPASSWORD` included: dlm-postgres reads it).
pub(crate) fn dlm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlm"));
    c.env_remove("DLM_REDIS_URL")
        .env_remove("DLM_REDIS_PASSWORD")
        .env_remove("DLM_ETCD_ENDPOINTS")
        .env_remove("DLM_ETCD_PASSWORD")
        .env_remove("DLM_POSTGRES_URL")
        .env_remove("DLM_POSTGRES_PASSWORD")
        .env_remove("DLM_PASSWORD")
        .env_remove("DLM_TLS_CA_FILE")
        .env_remove("DLM_TLS_CERT")
        .env_remove("DLM_TLS_KEY")
        .env_remove("DLM_TLS_SERVER_NAME")
        .env_remove("PGPASSWORD")
        .env_remove("DLM_DIR")
        .stdin(Stdio::null());
    c
}

/// A fresh redis-server on a free loopback port (killed when dropped). Fails the test when
/// there is no redis-server binary: it never passes without running.
pub(crate) fn server() -> RedisServer {
    require_redis_server();
    RedisServer::spawn()
}

/// A running process (normally `dlm`), its stdout and stderr going to files (no pipe can
/// fill up). Killed and reaped when dropped before it was waited for.
pub(crate) struct Proc {
    child: Child,
    what: String,
    out: PathBuf,
    err: PathBuf,
    _dir: tempfile::TempDir,
    started: Instant,
    reaped: bool,
}

/// How a process ended, and what it wrote.
#[derive(Debug)]
pub(crate) struct Done {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    /// From the spawn to the exit (seen within ~10 ms).
    pub(crate) took: Duration,
    /// When the exit was seen.
    pub(crate) at: Instant,
    what: String,
}

impl Done {
    /// The exit status; fails the test if the process was killed by a signal.
    #[track_caller]
    pub(crate) fn code(&self) -> i32 {
        self.status.code().unwrap_or_else(|| {
            panic!(
                "{} was killed ({}), stderr:\n{}",
                self.what, self.status, self.stderr
            )
        })
    }

    /// Asserts the exit status, showing the output when it differs.
    #[track_caller]
    pub(crate) fn expect(&self, code: i32) -> &Self {
        assert_eq!(
            self.status.code(),
            Some(code),
            "{}: {}\nstdout:\n{}\nstderr:\n{}",
            self.what,
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

impl Proc {
    pub(crate) fn spawn(cmd: &mut Command) -> Proc {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("stdout");
        let err = dir.path().join("stderr");
        let child = cmd
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Proc {
            child,
            what: format!("{cmd:?}"),
            out,
            err,
            _dir: dir,
            started: Instant::now(),
            reaped: false,
        }
    }

    pub(crate) fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// Sends `SIG<sig>` (e.g. "TERM") with the `kill` command; the process must not have
    /// been reaped yet (its pid is still ours).
    #[track_caller]
    pub(crate) fn signal(&self, sig: &str) {
        assert!(!self.reaped, "signalling a reaped process");
        signal(self.pid(), sig);
    }

    /// Its stdout so far.
    pub(crate) fn stdout_now(&self) -> String {
        read(&self.out)
    }

    /// Its stderr so far.
    pub(crate) fn stderr_now(&self) -> String {
        read(&self.err)
    }

    /// Waits at most `limit` for the exit; past it, kills the process and fails the
    /// test. Fails the test too if the output shows a panic.
    #[track_caller]
    pub(crate) fn wait(&mut self, limit: Duration) -> Done {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.reaped = true;
                panic!(
                    "{} did not exit within {limit:?}; stderr:\n{}",
                    self.what,
                    read(&self.err)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.reaped = true;
        let done = Done {
            status,
            stdout: read(&self.out),
            stderr: read(&self.err),
            took: self.started.elapsed(),
            at: Instant::now(),
            what: self.what.clone(),
        };
        assert!(
            !done.stderr.contains("panicked") && !done.stderr.contains("RUST_BACKTRACE"),
            "{} panicked:\n{}",
            done.what,
            done.stderr
        );
        done
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `cmd` to its end (at most [`LIMIT`]).
#[track_caller]
pub(crate) fn run(cmd: &mut Command) -> Done {
    Proc::spawn(cmd).wait(LIMIT)
}

/// Kills (SIGKILL), when dropped, the processes it was given that still run: for the
/// command's own processes, which are not our children.
#[derive(Default)]
pub(crate) struct Reaper(Vec<i32>);

impl Reaper {
    pub(crate) fn add(&mut self, pid: i32) {
        self.0.push(pid);
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if alive(pid) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// Sends `SIG<sig>` to `pid` with the `kill` command.
#[track_caller]
pub(crate) fn signal(pid: i32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}: {status}");
}

/// Polls `cond` every 20 ms until it holds; fails the test after `limit`.
#[track_caller]
pub(crate) fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A file's text, empty when it does not exist (yet).
pub(crate) fn read(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Waits (at most 10 s) until `path` holds a complete line, and parses it as a pid.
#[track_caller]
pub(crate) fn read_pid(path: &Path) -> i32 {
    wait_until(
        Duration::from_secs(10),
        &format!("a pid in {}", path.display()),
        || read(path).ends_with('\n'),
    );
    read(path).trim().parse().unwrap()
}

/// The `/proc` state letter of `pid`, if it exists.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether `pid` runs (exists and is not a zombie: an orphan's zombie may wait long for
/// its reaper in a container).
pub(crate) fn alive(pid: i32) -> bool {
    state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

/// The live processes whose parent is `pid`.
pub(crate) fn children_of(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1) == Some(&pid.to_string().as_str()) && alive(child) {
            found.push(child);
        }
    }
    found
}

/// Converts `date +%s%N` readings (wall clock) to this process's `Instant`s.
pub(crate) struct Clock {
    instant: Instant,
    real: SystemTime,
}

impl Clock {
    pub(crate) fn now() -> Clock {
        Clock {
            instant: Instant::now(),
            real: SystemTime::now(),
        }
    }

    /// The `Instant` of a `date +%s%N` reading.
    #[track_caller]
    pub(crate) fn at(&self, nanos: &str) -> Instant {
        let real = UNIX_EPOCH + Duration::from_nanos(nanos.parse().expect("date +%s%N"));
        match real.duration_since(self.real) {
            Ok(after) => self.instant + after,
            Err(e) => self.instant - e.duration(),
        }
    }

    /// How long after this reading a `date +%s%N` reading is (negative: zero).
    pub(crate) fn since(&self, nanos: &str) -> Duration {
        self.at(nanos).saturating_duration_since(self.instant)
    }
}

/// `Some(remaining_ms)` when `dlm status --json` says `name` is held, `None` when free.
#[track_caller]
pub(crate) fn held(urls: &str, name: &str) -> Option<u64> {
    let done = run(dlm().args(["status", "--json", "--redis", urls, name]));
    done.expect(0);
    let rows = Json::parse(&done.stdout);
    let row = &rows.array()[0];
    assert_eq!(row.get("name").str(), name);
    match row.get("held") {
        Json::Bool(true) => Some(row.get("remaining_ms").u64()),
        Json::Bool(false) => {
            assert_eq!(row.get("remaining_ms"), &Json::Null);
            None
        }
        other => panic!("held is {other:?}"),
    }
}

/// A JSON value, read strictly enough to tell valid JSON from invalid.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    /// The number's text (integers must stay exact).
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// Parses one JSON document (surrounding whitespace allowed); panics when invalid.
    #[track_caller]
    pub(crate) fn parse(text: &str) -> Json {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p
            .value()
            .unwrap_or_else(|e| panic!("invalid JSON ({e}): {text:?}"));
        p.ws();
        assert_eq!(p.i, p.s.len(), "trailing text after the JSON: {text:?}");
        v
    }

    #[track_caller]
    pub(crate) fn array(&self) -> &[Json] {
        match self {
            Json::Arr(a) => a,
            other => panic!("not an array: {other:?}"),
        }
    }

    #[track_caller]
    pub(crate) fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(fields) => {
                &fields
                    .iter()
                    .find(|(k, _)| k == key)
                    .unwrap_or_else(|| panic!("no {key:?} in {self:?}"))
                    .1
            }
            other => panic!("not an object: {other:?}"),
        }
    }

    #[track_caller]
    pub(crate) fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }

    #[track_caller]
    pub(crate) fn u64(&self) -> u64 {
        match self {
            Json::Num(n) => n.parse().unwrap_or_else(|_| panic!("not a u64: {n}")),
            other => panic!("not a number: {other:?}"),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && b" \t\r\n".contains(&self.s[self.i]) {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, lit: &str) -> Result<(), String> {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(format!("expected {lit:?} at byte {}", self.i))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.peek().ok_or("unexpected end")? {
            b'n' => self.eat("null").map(|()| Json::Null),
            b't' => self.eat("true").map(|()| Json::Bool(true)),
            b'f' => self.eat("false").map(|()| Json::Bool(false)),
            b'"' => self.string().map(Json::Str),
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return Err(format!("expected , or ] at byte {}", self.i)),
                    }
                }
            }
            b'{' => {
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.ws();
                    self.eat(":")?;
                    fields.push((key, self.value()?));
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(fields));
                        }
                        _ => return Err(format!("expected , or }} at byte {}", self.i)),
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = self.i;
                if self.peek() == Some(b'-') {
                    self.i += 1;
                }
                let digits = self.i;
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.i += 1;
                }
                if self.i == digits || (self.s[digits] == b'0' && self.i - digits > 1) {
                    return Err(format!("bad number at byte {start}"));
                }
                // Fractions and exponents are valid JSON but never in dlm's output.
                Ok(Json::Num(
                    String::from_utf8(self.s[start..self.i].to_vec()).unwrap(),
                ))
            }
            c => Err(format!("unexpected {:?} at byte {}", char::from(c), self.i)),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.eat("\"")?;
        let mut out = Vec::new();
        loop {
            let c = self.peek().ok_or("unterminated string")?;
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                b'\\' => {
                    let e = self.peek().ok_or("unterminated escape")?;
                    self.i += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'u' => {
                            let hex = self.s.get(self.i..self.i + 4).ok_or("short \\u")?;
                            let code = u32::from_str_radix(std::str::from_utf8(hex).unwrap(), 16)
                                .map_err(|e| e.to_string())?;
                            self.i += 4;
                            let ch = char::from_u32(code).ok_or("a surrogate in \\u")?;
                            out.extend_from_slice(ch.to_string().as_bytes());
                        }
                        _ => return Err(format!("bad escape at byte {}", self.i)),
                    }
                }
                0..0x20 => return Err(format!("raw control character at byte {}", self.i)),
                _ => out.push(c),
            }
        }
    }
}

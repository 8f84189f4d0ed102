//! Real wall-clock jumps on a `redis-server`: Redis key expiry, stream IDs and `TIME`
//! follow the server's wall clock, and a lock's safety depends on it.
//!
//! A [`ClockSkew`] is an offset that a test changes at will; a server started with
//! [`RedisServerBuilder::clock_skew`](crate::redis_server::RedisServerBuilder::clock_skew)
//! runs with an `LD_PRELOAD` shim (`src/skew.c`) that adds the offset to every wall-clock
//! read (`clock_gettime(CLOCK_REALTIME)`, `gettimeofday`, `time`), from the next read on.
//! Monotonic clocks are left alone. (`faketime` hangs Debian's jemalloc-linked
//! redis-server; the shim reads the real time with the raw system call instead.)
//!
//! The shim is compiled on first use with `cc` into a cache directory under the system's
//! temporary directory (no build script: users of the testkit who never skew a clock need
//! no C compiler).
//!
//! ```no_run
//! use std::time::Duration;
//! use dlm_testkit::redis_server::RedisServer;
//! use dlm_testkit::skew::ClockSkew;
//!
//! let skew = ClockSkew::new();
//! let server = RedisServer::builder().clock_skew(&skew).spawn();
//! skew.forward(Duration::from_secs(60)); // the server's keys age by a minute at once
//! ```

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::LazyLock;
use std::time::Duration;

use tempfile::NamedTempFile;

const SOURCE: &str = include_str!("skew.c");

/// An offset added to the wall clock of the servers started with it.
#[derive(Debug)]
pub struct ClockSkew {
    file: NamedTempFile,
}

impl Default for ClockSkew {
    fn default() -> Self {
        ClockSkew::new()
    }
}

impl ClockSkew {
    /// An offset of zero.
    ///
    /// # Panics
    /// If the offset file cannot be made.
    pub fn new() -> ClockSkew {
        let file = tempfile::Builder::new()
            .prefix("dlm-clock-skew-")
            .tempfile()
            .expect("a file for the clock offset");
        file.as_file()
            .write_all_at(&0i64.to_ne_bytes(), 0)
            .expect("write the clock offset");
        ClockSkew { file }
    }

    /// Sets the offset, in nanoseconds (negative: behind the real clock).
    pub fn set(&self, offset_ns: i64) {
        self.file
            .as_file()
            .write_all_at(&offset_ns.to_ne_bytes(), 0)
            .expect("write the clock offset");
    }

    /// The offset, in nanoseconds.
    pub fn offset(&self) -> i64 {
        let mut b = [0u8; 8];
        self.file
            .as_file()
            .read_exact_at(&mut b, 0)
            .expect("read the clock offset");
        i64::from_ne_bytes(b)
    }

    /// Moves the clock forward by `by` (keys expire early).
    pub fn forward(&self, by: Duration) {
        self.set(self.offset() + nanos(by));
    }

    /// Moves the clock back by `by` (keys live longer).
    pub fn back(&self, by: Duration) {
        self.set(self.offset() - nanos(by));
    }

    /// The file the shim reads.
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).expect("a clock jump of less than 292 years")
}

/// The compiled shim.
///
/// # Panics
/// When it cannot be compiled (no `cc`): the test cannot run without it.
pub(crate) fn shim() -> &'static Path {
    static SHIM: LazyLock<PathBuf> = LazyLock::new(compile);
    &SHIM
}

fn compile() -> PathBuf {
    // FNV-1a of the source: a new source gets a new cache entry.
    let hash = SOURCE.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let dir = std::env::temp_dir().join(format!("dlm-testkit-skew-{hash:016x}"));
    let lib = dir.join("libdlmskew.so");
    if lib.is_file() {
        return lib;
    }
    std::fs::create_dir_all(&dir).expect("the clock shim's cache directory");
    // Written and compiled under names of this process, then renamed into place: several
    // test processes may do this at once.
    let pid = std::process::id();
    let src = dir.join(format!("skew-{pid}.c"));
    let tmp = dir.join(format!("libdlmskew-{pid}.so"));
    std::fs::write(&src, SOURCE).expect("write the clock shim's source");
    let out = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&tmp)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `cc` to build the clock shim for clock-skew tests ({e}); install a C compiler (apt-get install gcc)")
        });
    assert!(
        out.status.success(),
        "compiling the clock shim failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&src);
    std::fs::rename(&tmp, &lib).expect("put the clock shim in place");
    // The file exists now; opened once to be sure it is complete.
    File::open(&lib).expect("the clock shim");
    lib
}

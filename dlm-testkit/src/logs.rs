//! Captures the log records of the test process (the `log` facade), so that a test can
//! check what was logged: a warning that must appear, or a secret that must not.
//!
//! [`capture`] installs the capturing logger once per process (a test binary may have no
//! other logger) and returns a [`Mark`]; [`Mark::lines`] gives the lines logged since,
//! by any thread. Tests of one binary run in parallel, so a test looks only for lines that
//! its own servers or names make unique.
//!
//! ```
//! let mark = dlm_testkit::logs::capture();
//! log::warn!("disk {} is full", 7);
//! assert!(mark.lines().iter().any(|l| l.ends_with("disk 7 is full")));
//! ```

use std::sync::Once;

use parking_lot::Mutex;

/// At most this many lines are kept (a runaway test must not exhaust memory).
const MAX_LINES: usize = 1_000_000;

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let mut lines = LINES.lock();
        if lines.len() < MAX_LINES {
            lines.push(format!(
                "{} {}: {}",
                record.level(),
                record.target(),
                record.args()
            ));
        }
    }

    fn flush(&self) {}
}

/// A point in the captured log; see [`Mark::lines`].
#[derive(Debug, Clone, Copy)]
pub struct Mark(usize);

impl Mark {
    /// The lines logged since the mark, as `LEVEL target: message`, every level included.
    pub fn lines(&self) -> Vec<String> {
        LINES.lock().get(self.0..).unwrap_or_default().to_vec()
    }
}

/// Installs the capturing logger (once per process; every level is recorded) and marks
/// the present point of the log.
///
/// # Panics
/// When another logger was installed in this process first.
pub fn capture() -> Mark {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&Capture).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
    Mark(LINES.lock().len())
}

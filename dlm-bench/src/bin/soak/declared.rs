//! Declared windows: the spans in which a fault broke an assumption that mutual
//! exclusion (or fencing) needs, so that what happens in them is counted apart.

use std::time::Instant;

use parking_lot::Mutex;

use crate::AFTERMATH;

/// Windows in which a fault broke an assumption that mutual exclusion needs.
#[derive(Default)]
pub(crate) struct Declared(Mutex<Vec<Window>>);

pub(crate) struct Window {
    start: Instant,
    end: Instant,
    /// Whether stale writes accepted in it are excused too (tokens may go wrong), or
    /// only overlaps (a failover: the tokens stay ordered).
    fencing: bool,
}

impl Declared {
    /// Runs `fault` and declares the time it took (plus its aftermath).
    pub(crate) fn window<R>(&self, fault: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = fault();
        self.push(start, true);
        r
    }

    /// Declares a failover that began at `start` and has settled now (plus its
    /// aftermath): overlapping holds are excused, stale writes are not.
    pub(crate) fn failover(&self, start: Instant) {
        self.push(start, false);
    }

    pub(crate) fn push(&self, start: Instant, fencing: bool) {
        self.0.lock().push(Window {
            start,
            end: Instant::now() + AFTERMATH,
            fencing,
        });
    }

    /// Whether a hold over `[from, until)` touches a declared window.
    pub(crate) fn covers(&self, from: Instant, until: Instant) -> bool {
        self.0
            .lock()
            .iter()
            .any(|w| from < w.end && w.start < until)
    }

    /// Whether a write at `at` by a hold that began at `from` touches a window that
    /// excuses stale writes.
    pub(crate) fn covers_fencing(&self, from: Instant, at: Instant) -> bool {
        self.0
            .lock()
            .iter()
            .any(|w| w.fencing && from < w.end && w.start < at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Duration;

    #[test]
    fn a_failover_window_excuses_overlaps_but_not_stale_writes() {
        let declared = Declared::default();
        let before = Instant::now();
        thread::sleep(Duration::from_millis(5));
        declared.failover(Instant::now());
        let inside = Instant::now();
        assert!(declared.covers(before, inside));
        assert!(!declared.covers_fencing(before, inside));
        declared.window(|| ());
        assert!(declared.covers_fencing(before, Instant::now()));
        // A window covers from its start to its aftermath's end, not before.
        let early = Declared::default();
        let t0 = Instant::now();
        thread::sleep(Duration::from_millis(5));
        let t1 = Instant::now();
        early.failover(t1);
        assert!(!early.covers(t0, t1));
    }
}

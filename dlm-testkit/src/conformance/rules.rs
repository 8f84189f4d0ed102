//! The rules every kind of hold keeps, checked for each kind the backend keeps (the mutex
//! always; permits, read and write holds where [`supports`](dlm_core::backend::LockBackend::supports)
//! says so):
//! - a step that failed but may have written a hold (an acquisition or a downgrade whose
//!   reply was lost) leaves no hold behind;
//! - a release that failed transiently is sent again until it succeeds, and a client
//!   dropped with such a release pending waits for it;
//! - the watchdog renews every kind in one round (one `extend_many`), never one by one
//!   (the front's rule; that a backend's `extend_many` batches at its servers is what
//!   the scale bar, [`crate::scale`], checks on each real backend).
//!
//! The faults are a [`FaultyBackend`] around the fixture's backend: the store is the real
//! one, only the reply (or the sending) is lost at the client's edge. The backends' own
//! tests lose them on the network (the fault proxy).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlm_core::backend::{Claim, LockBackend};
use dlm_core::{Lock, LockClient, LockGuard, Result};

use super::PROMPT;
use crate::{CountingBackend, FaultyBackend, Fixture, unique_name};

/// The kinds of hold, as a test takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mutex,
    Permit,
    Read,
    Write,
}

impl Kind {
    fn claim(self) -> Claim {
        match self {
            Kind::Mutex => Claim::Exclusive,
            Kind::Permit => Claim::Permit { permits: 2 },
            Kind::Read => Claim::Read,
            Kind::Write => Claim::Write,
        }
    }
}

/// The kinds `backend` keeps.
fn kinds(backend: &dyn LockBackend) -> Vec<Kind> {
    [Kind::Mutex, Kind::Permit, Kind::Read, Kind::Write]
        .into_iter()
        .filter(|k| backend.supports(k.claim()))
        .collect()
}

/// One attempt at a hold of `kind` of `name`.
fn try_take(client: &LockClient, kind: Kind, name: &str) -> Result<Option<LockGuard>> {
    match kind {
        Kind::Mutex => client.get_lock(name)?.try_lock(),
        Kind::Permit => client.get_semaphore(name, 2)?.try_acquire(),
        Kind::Read => client.get_rw_lock(name)?.try_read(),
        Kind::Write => Ok(client
            .get_rw_lock(name)?
            .try_write()?
            .map(dlm_core::WriteGuard::into_guard)),
    }
}

/// How many hold `kind`'s resource of `name` now, as the store says.
fn holders(f: &dyn Fixture, kind: Kind, name: &str) -> usize {
    let client = LockClient::new(f.backend());
    match kind {
        Kind::Mutex => usize::from(client.get_lock(name).unwrap().is_locked().unwrap()),
        Kind::Permit => client
            .get_semaphore(name, 2)
            .unwrap()
            .inspect()
            .unwrap()
            .holders
            .len(),
        Kind::Read | Kind::Write => client
            .get_rw_lock(name)
            .unwrap()
            .inspect()
            .unwrap()
            .holders
            .len(),
    }
}

/// Waits up to [`PROMPT`] for `kind`'s resource of `name` to be free.
fn free_soon(f: &dyn Fixture, kind: Kind, name: &str, what: &str) {
    let start = Instant::now();
    while holders(f, kind, name) > 0 {
        assert!(
            start.elapsed() < PROMPT,
            "{kind:?}: {what}: still held after {PROMPT:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An acquisition whose reply was lost (the store took the hold, the client heard a
/// timeout) leaves no hold: the front undoes it at once, not at the end of its lease (a
/// 60 s lease here). So does a downgrade whose reply was lost: neither the read hold it
/// wrote nor the write hold is left.
pub fn a_step_whose_reply_was_lost_leaves_no_hold(f: &dyn Fixture) {
    let faulty = Arc::new(FaultyBackend::new(f.backend()));
    let client = LockClient::builder(faulty.clone())
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    for kind in kinds(&*f.backend()) {
        let name = unique_name("lost-reply");
        faulty.lose_replies(1);
        let e = try_take(&client, kind, &name).expect_err("the reply was lost");
        assert!(e.is_transient(), "{kind:?}: {e}");
        assert_eq!(faulty.pending(), (0, 0));
        assert_eq!(
            holders(f, kind, &name),
            0,
            "{kind:?}: the hold the lost reply granted was left behind"
        );
        // Nothing of it lingers: another client takes it at once.
        let other = LockClient::new(f.backend());
        try_take(&other, kind, &name)
            .unwrap()
            .unwrap_or_else(|| panic!("{kind:?}: not free after the undo"))
            .unlock()
            .unwrap();
    }
    if !f.backend().supports(Claim::Write) {
        return;
    }
    let name = unique_name("lost-downgrade");
    let write = client.get_rw_lock(&name).unwrap().write().unwrap();
    faulty.lose_replies(1);
    let e = write.downgrade().expect_err("the reply was lost");
    assert!(e.is_transient(), "downgrade: {e}");
    assert_eq!(
        holders(f, Kind::Read, &name),
        0,
        "a downgrade whose reply was lost left a hold (the read hold it wrote, or the write hold)"
    );
}

/// A release that failed transiently (it could not be sent) is sent again in the
/// background: the resource is free within moments, not at the end of its lease (60 s).
/// A client dropped while such a release is pending waits for it: once the drop
/// returns, the resource is free.
pub fn a_release_that_failed_is_sent_again(f: &dyn Fixture) {
    for kind in kinds(&*f.backend()) {
        let faulty = Arc::new(FaultyBackend::new(f.backend()));
        let client = LockClient::builder(faulty.clone())
            .lease(Duration::from_secs(60))
            .build()
            .unwrap();
        let name = unique_name("release-again");
        let guard = try_take(&client, kind, &name).unwrap().expect("free");
        faulty.fail_next(1);
        let e = guard.unlock().expect_err("the release could not be sent");
        assert!(e.is_transient(), "{kind:?}: {e}");
        free_soon(f, kind, &name, "a release that failed was not sent again");

        // Dropped with the release pending: the drop waits for it (the first two sends
        // fail, the third goes through).
        let name = unique_name("release-on-drop");
        let guard = try_take(&client, kind, &name).unwrap().expect("free");
        faulty.fail_next(3);
        drop(guard);
        drop(client);
        assert_eq!(
            holders(f, kind, &name),
            0,
            "{kind:?}: the client was dropped before its pending release was sent"
        );
        assert_eq!(faulty.pending(), (0, 0));
    }
}

/// The watchdog renews every kind of hold of a client in one round: one
/// [`extend_many`](LockBackend::extend_many) with the mutex's, the permits' and the read
/// and write holds' renewals together, and no renewal sent on its own.
pub fn renewals_of_every_kind_share_one_round(f: &dyn Fixture) {
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let watchdog = Duration::from_millis(900);
    let client = LockClient::builder(counting.clone())
        .watchdog_timeout(watchdog)
        .build()
        .unwrap();
    let kinds = kinds(&*f.backend());
    // Read and write holds of two read-write locks: one thread cannot hold both of one.
    let guards: Vec<LockGuard> = kinds
        .iter()
        .map(|&k| {
            try_take(&client, k, &unique_name("one-round"))
                .unwrap()
                .expect("free")
        })
        .collect();
    let start = Instant::now();
    let mixed = |r: &crate::Round| r.holds == kinds.len() && r.renewed == r.holds;
    while !counting.rounds().iter().any(mixed) {
        assert!(
            start.elapsed() < watchdog * 4,
            "no round renewed all {} kinds together: {:?}",
            kinds.len(),
            counting.rounds()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for r in counting.rounds() {
        assert_eq!(r.renewed, r.holds, "a renewal failed: {r:?}");
    }
    assert_eq!(
        counting.single_extends(),
        0,
        "the watchdog renewed a hold on its own, not in the round"
    );
    for (g, k) in guards.into_iter().zip(&kinds) {
        assert!(g.is_held(), "{k:?}: lost");
        g.unlock().unwrap();
    }
}

//! The scale bar of the renewal rule, for any backend: many holds of every kind in one
//! client, renewed through a slow network.
//!
//! [`ScaleBar::run`] takes 1,000 mutex holds, 1,000 permits (of semaphores of one permit)
//! and 1,000 read holds (of read-write locks) in one client with a 2 s watchdog, then
//! delays every request 50 ms (toward the servers, on every [`FaultProxy`] given) for
//! three leases: no hold may be lost, and another client takes none of a sample of each
//! kind. It prints the renewal rounds and what they cost the servers (as the caller
//! counts it), and panics on a violation.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::LockBackend;
use dlm_core::{Lock, LockClient, LockGuard};

use crate::faults::{Direction, FaultProxy};
use crate::{CountingBackend, unique_name};

/// Holds of each kind.
const EACH: usize = 1_000;
/// The watchdog timeout: renewals every 667 ms, a lease of 2 s.
const WATCHDOG: Duration = Duration::from_secs(2);
/// The delay added to every request.
const LATENCY: Duration = Duration::from_millis(50);

/// One run of the scale bar: what it runs on, and how to count the servers' work.
#[allow(missing_debug_implementations)]
pub struct ScaleBar<'a> {
    /// Named in the report and in failures.
    pub what: &'a str,
    /// The backend under test, reaching the servers through `proxies`.
    pub backend: Arc<dyn LockBackend>,
    /// A backend of another client (not slowed down if it does not go through the
    /// proxies): it must take none of the holds.
    pub other: Arc<dyn LockBackend>,
    /// Every way to the servers: each gets the latency.
    pub proxies: &'a [FaultProxy],
    /// How many threads take the holds at first (each acquisition is a round trip).
    pub takers: usize,
    /// What the servers have counted so far, by name (requests, scripts, reads...):
    /// reported per renewal round.
    pub counters: &'a dyn Fn() -> Vec<(&'static str, u64)>,
    /// The counter (by name) that counts the requests the servers read, and the most it
    /// may count per round: far fewer than the round's renewals, or the backend renews
    /// one hold per request (the front's batching is checked by the wrapper; this checks
    /// the backend's, at the servers).
    pub at_most: (&'static str, f64),
}

impl ScaleBar<'_> {
    /// Runs it (see the module's docs); panics on a lost hold, a hold another client
    /// took, a failed renewal or a renewal sent on its own.
    pub fn run(&self) {
        let what = self.what;
        let counting = Arc::new(CountingBackend::new(self.backend.clone()));
        let client = LockClient::builder(counting.clone())
            .watchdog_timeout(WATCHDOG)
            .build()
            .unwrap();
        let prefix = unique_name("every-kind");
        let names = |i: usize| {
            [
                format!("{prefix}-m-{i}"),
                format!("{prefix}-s-{i}"),
                format!("{prefix}-r-{i}"),
            ]
        };
        let takers = self.takers.max(1);
        let guards: Vec<LockGuard> = thread::scope(|scope| {
            let threads: Vec<_> = (0..takers)
                .map(|t| {
                    let (client, names) = (&client, &names);
                    scope.spawn(move || {
                        let mut guards = Vec::new();
                        for i in (t..EACH).step_by(takers) {
                            let [m, s, r] = names(i);
                            guards.push(client.get_lock(&m).unwrap().lock().unwrap());
                            guards.push(client.get_semaphore(&s, 1).unwrap().acquire().unwrap());
                            guards.push(client.get_rw_lock(&r).unwrap().read().unwrap());
                        }
                        guards
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        for p in self.proxies {
            p.set_latency(Direction::ToServer, LATENCY);
        }
        let rounds_before = counting.rounds().len();
        let counted_before = (self.counters)();
        let slow = Instant::now();
        let mut checked_others = false;
        while slow.elapsed() < WATCHDOG * 3 {
            let lost = guards.iter().filter(|g| !g.is_held()).count();
            assert_eq!(lost, 0, "{what}: {lost} of {} holds lost", guards.len());
            if !checked_others && slow.elapsed() > WATCHDOG {
                // One lease in: another client takes none of a sample of each kind.
                let other = LockClient::new(self.other.clone());
                for i in (0..EACH).step_by(EACH / 10) {
                    let [m, s, r] = names(i);
                    assert!(other.get_lock(&m).unwrap().try_lock().unwrap().is_none());
                    let sem = other.get_semaphore(&s, 1).unwrap();
                    assert!(sem.try_acquire().unwrap().is_none());
                    assert!(
                        other
                            .get_rw_lock(&r)
                            .unwrap()
                            .try_write()
                            .unwrap()
                            .is_none()
                    );
                }
                checked_others = true;
            }
            thread::sleep(Duration::from_millis(200));
        }
        let counted = (self.counters)();
        let rounds = counting.rounds()[rounds_before..].to_vec();
        let renewed: usize = rounds.iter().map(|r| r.renewed).sum();
        let mut took: Vec<Duration> = rounds.iter().map(|r| r.took).collect();
        took.sort_unstable();
        let per_round_of = |(name, after): &(&'static str, u64), before: u64| {
            (*name, (after - before) as f64 / rounds.len().max(1) as f64)
        };
        let per_round: Vec<(&'static str, f64)> = counted
            .iter()
            .zip(&counted_before)
            .map(|(c, (_, before))| per_round_of(c, *before))
            .collect();
        let (bounded, most) = self.at_most;
        let seen = per_round
            .iter()
            .find(|(name, _)| *name == bounded)
            .map(|(_, n)| *n)
            .unwrap_or_else(|| panic!("{what}: no counter named {bounded:?}"));
        let per_round: Vec<String> = per_round
            .iter()
            .map(|(name, n)| format!("{n:.1} {name}"))
            .collect();
        eprintln!(
            "{what}: {} holds (each kind {EACH}), {LATENCY:?} per request, {WATCHDOG:?} watchdog: 0 lost; {} rounds in {:?}, {renewed} renewals, round median {:?}, slowest {:?}; per round at the servers (the other client's checks included): {}",
            guards.len(),
            rounds.len(),
            slow.elapsed(),
            took[took.len() / 2],
            took[took.len() - 1],
            per_round.join(", "),
        );
        assert!(rounds.len() >= 3, "{what}: {} rounds", rounds.len());
        assert!(
            rounds.iter().all(|r| r.renewed == r.holds),
            "{what}: a renewal failed: {rounds:?}"
        );
        assert!(checked_others);
        let renewals_per_round = renewed as f64 / rounds.len().max(1) as f64;
        assert!(
            seen <= most,
            "{what}: {seen:.1} {bounded} per round for {renewals_per_round:.0} renewals: not batched at the servers (at most {most})"
        );
        assert_eq!(
            counting.single_extends(),
            0,
            "{what}: a renewal was sent on its own"
        );
        for p in self.proxies {
            p.heal();
        }
        for g in guards {
            g.unlock().unwrap();
        }
    }
}

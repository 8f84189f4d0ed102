//! Elections: one leader at a time with strictly increasing terms, the value seen by
//! `leader()` and by observers in order, a resignation that wakes the next candidate at
//! once, a lost lead signalled, bad values refused before any I/O; refused with a typed
//! error by a backend that keeps no elections.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dlm_core::backend::LockBackend;
use dlm_core::{BackendErrorKind, Error, HoldState, Leader, LockClient};

use super::{PROMPT, assert_still_blocked, client};
use crate::counting::CountingBackend;
use crate::history::{History, Hold};
use crate::{Fixture, unique_name};

/// A backend that keeps no elections refuses them at `get_election`, with a typed error,
/// before any I/O.
pub fn elections_unsupported_are_refused_at_the_call(f: &dyn Fixture) {
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let c = LockClient::builder(counting.clone()).build().unwrap();
    match c.get_election(&unique_name("no-election")) {
        Err(e) => assert_eq!(e.backend_kind(), Some(BackendErrorKind::Unsupported), "{e}"),
        Ok(_) => assert!(
            counting.supports_elections(),
            "an election was handed out by a backend that keeps none"
        ),
    }
    assert_eq!(counting.calls(), 0);
}

/// Three clients campaign in turn for about a second: never two leaders at once (history
/// checker), terms strictly increasing, each client leads.
pub fn election_one_leader_at_a_time(f: &dyn Fixture) {
    const CLIENTS: usize = 3;
    let name = unique_name("elect");
    let history = Arc::new(History::new());
    let leading = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(CLIENTS));
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let election = client(f).get_election(&name).unwrap();
            let (history, leading, start) = (history.clone(), leading.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let until = Instant::now() + Duration::from_secs(1);
                let mut terms = 0;
                while Instant::now() < until {
                    let lead = election
                        .try_campaign_timeout(&format!("node-{c}"), Duration::from_secs(10))
                        .unwrap()
                        .expect("a candidate waited 10 s: the lead was never handed over");
                    let from = Instant::now();
                    assert!(!leading.swap(true, Ordering::SeqCst), "two leaders at once");
                    thread::yield_now();
                    leading.store(false, Ordering::SeqCst);
                    let until = Instant::now().min(lead.valid_until());
                    history.push(Hold::new(
                        lead.name(),
                        format!("client {c}"),
                        from,
                        until,
                        Some(lead.term().get()),
                    ));
                    lead.resign().unwrap();
                    terms += 1;
                }
                terms
            })
        })
        .collect();
    for (c, h) in handles.into_iter().enumerate() {
        assert!(h.join().unwrap() > 0, "client {c} never led");
    }
    history.check().assert_clean();
}

/// `leader()` shows nobody, then the leader's value, term and lease; a proclamation
/// changes the value and keeps the term; after the resignation, nobody again; dropping a
/// lead resigns it.
pub fn election_leader_is_seen_by_everyone(f: &dyn Fixture) {
    let name = unique_name("elect-seen");
    let bystander = client(f).get_election(&name).unwrap();
    assert_eq!(bystander.leader().unwrap(), None);
    let lead = client(f)
        .get_election(&name)
        .unwrap()
        .campaign("10.0.0.1:80")
        .unwrap();
    let seen = bystander.leader().unwrap().expect("a leader");
    assert_eq!(seen.value(), Some("10.0.0.1:80"));
    if f.fencing() {
        assert_eq!(seen.term(), Some(lead.term()));
    }
    assert!(seen.remaining() > Duration::ZERO);
    lead.proclaim("10.0.0.1:81").unwrap();
    assert_eq!(lead.value(), "10.0.0.1:81");
    let seen = bystander.leader().unwrap().expect("still a leader");
    assert_eq!(seen.value(), Some("10.0.0.1:81"));
    if f.fencing() {
        assert_eq!(
            seen.term(),
            Some(lead.term()),
            "a proclamation changed the term"
        );
    }
    lead.resign().unwrap();
    assert_eq!(bystander.leader().unwrap(), None);
    // Dropping a lead resigns it too.
    let dropped = client(f)
        .get_election(&name)
        .unwrap()
        .campaign("x")
        .unwrap();
    assert!(bystander.leader().unwrap().is_some());
    drop(dropped);
    assert_eq!(
        bystander.leader().unwrap(),
        None,
        "a dropped lead was not resigned"
    );
}

/// A candidate blocked in `campaign` leads right after the leader resigns (long leases:
/// not by expiry), with a larger term.
pub fn election_resign_wakes_the_next_candidate(f: &dyn Fixture) {
    let name = unique_name("elect-resign");
    let first = client(f)
        .get_election(&name)
        .unwrap()
        .campaign("a")
        .unwrap();
    let term = first.term();
    let next = client(f).get_election(&name).unwrap();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let candidate = thread::spawn(move || {
        let lead = next.campaign("b").unwrap();
        tx.send((Instant::now(), lead.term())).unwrap();
        lead.resign().unwrap();
    });
    assert_still_blocked(&rx, Duration::from_millis(300), "the second candidate");
    let resigned = Instant::now();
    first.resign().unwrap();
    let (led, next_term) = rx
        .recv_timeout(PROMPT)
        .expect("the next candidate was not woken");
    candidate.join().unwrap();
    assert!(led >= resigned);
    assert!(
        next_term > term,
        "terms went back: {next_term:?} after {term:?}"
    );
}

/// An observer sees every change, in order, starting with the current state: nobody, a
/// leader, its new value, nobody, the next leader.
pub fn election_observers_see_every_change_in_order(f: &dyn Fixture) {
    let name = unique_name("elect-observe");
    let changes = client(f)
        .get_election(&name)
        .unwrap()
        .observe()
        .into_channel();
    let next = |what: &str| -> Option<Leader> {
        changes
            .receiver()
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{what}: no change seen: {e}"))
            .unwrap()
    };
    assert_eq!(next("the start"), None);
    let election = client(f).get_election(&name).unwrap();
    let lead = election.campaign("v1").unwrap();
    assert_eq!(
        next("the first leader")
            .and_then(|l| l.value().map(str::to_owned))
            .as_deref(),
        Some("v1")
    );
    lead.proclaim("v2").unwrap();
    assert_eq!(
        next("the proclamation")
            .and_then(|l| l.value().map(str::to_owned))
            .as_deref(),
        Some("v2")
    );
    lead.resign().unwrap();
    assert_eq!(next("the resignation"), None);
    let second = client(f)
        .get_election(&name)
        .unwrap()
        .campaign("v3")
        .unwrap();
    let seen = next("the second leader").expect("a leader");
    assert_eq!(seen.value(), Some("v3"));
    if f.fencing() {
        assert_eq!(seen.term(), Some(second.term()));
    }
    assert!(
        changes
            .receiver()
            .recv_timeout(Duration::from_millis(200))
            .is_err(),
        "a change was reported that did not happen"
    );
    second.resign().unwrap();
}

/// A lead broken by an administrator is signalled lost, and a proclamation then fails
/// with `LockLost`.
pub fn election_lost_lead_is_signalled(f: &dyn Fixture) {
    let name = unique_name("elect-lost");
    let leader = LockClient::builder(f.backend())
        .watchdog_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let lead = leader.get_election(&name).unwrap().campaign("x").unwrap();
    let signal = lead.lost_signal();
    assert_eq!(
        signal.wait_timeout(Duration::from_millis(350)),
        HoldState::Held
    );
    assert!(
        client(f)
            .get_semaphore(&name, 1)
            .unwrap()
            .force_unlock()
            .unwrap()
    );
    assert_eq!(signal.wait_timeout(Duration::from_secs(5)), HoldState::Lost);
    assert!(!lead.is_held());
    assert!(matches!(lead.proclaim("y"), Err(Error::LockLost)));
    assert!(matches!(lead.resign(), Err(Error::LockLost)));
}

/// An oversized value, or one with a control character, is refused before any I/O.
pub fn election_refuses_bad_values_before_io(f: &dyn Fixture) {
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let c = LockClient::builder(counting.clone()).build().unwrap();
    let election = c.get_election(&unique_name("elect-bad")).unwrap();
    let long = "v".repeat(dlm_core::MAX_LABEL_LEN + 1);
    for bad in [long.as_str(), "new\nline"] {
        let e = election.try_campaign(bad).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(a) if a.argument() == "value"),
            "{e}"
        );
    }
    assert_eq!(counting.calls(), 0, "a bad value reached the backend");
    let lead = election.campaign("good").unwrap();
    let before = counting.calls();
    assert!(lead.proclaim(&long).unwrap_err().is_invalid_argument());
    assert_eq!(counting.calls(), before);
    assert_eq!(lead.value(), "good");
}

//! Conformance cases: fencing tokens (order, a paused holder fenced off, no token after
//! the loss, one token per hold, draws on read or with the acquisition).

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use dlm_core::{BackendErrorKind, Error, Lock, LockClient, TokenDraw};

use super::{client, client_with_lease};
use crate::{CountingBackend, Fixture, unique_name};

/// Fencing tokens strictly increase over successive acquisitions, across clients and
/// threads, whether or not the holds in between read theirs, and re-entrant holds share
/// theirs. A backend without fencing says so with `Unsupported`.
pub fn fencing_tokens_strictly_increase(f: &dyn Fixture) {
    let name = unique_name("fence");
    if !f.fencing() {
        let g = client(f).get_lock(&name).unwrap().lock().unwrap();
        let e = g.fencing_token().unwrap_err();
        assert_eq!(e.backend_kind(), Some(BackendErrorKind::Unsupported), "{e}");
        assert!(
            g.is_held(),
            "asking for a token that does not exist lost nothing"
        );
        return;
    }
    let clients = [client(f), client(f)];
    let mut last = None;
    for i in 0..12 {
        let g = clients[i % 2].get_lock(&name).unwrap().lock().unwrap();
        if i % 3 == 1 {
            continue; // a hold that never reads its token
        }
        let token = g.fencing_token().expect("no fencing token");
        assert!(Some(token) > last, "token {token} after {last:?}");
        last = Some(token);
    }
    // Concurrent holders record their tokens in acquisition order.
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let lock = client(f).get_lock(&name).unwrap();
            let order = order.clone();
            thread::spawn(move || {
                for _ in 0..20 {
                    let g = lock.lock().unwrap();
                    order.lock().push(g.fencing_token().unwrap());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let order = order.lock();
    assert_eq!(order.len(), 80);
    assert!(order[0] > last.unwrap());
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "tokens out of order: {order:?}"
    );
}

/// Kleppmann's scenario: client 1 takes the lock and pauses past its lease; client 2 takes
/// it and writes; client 1 wakes and writes. The resource, checking fencing tokens,
/// refuses client 1's write.
pub fn a_paused_holder_is_fenced_off(f: &dyn Fixture) {
    let name = unique_name("pause");
    let lease = Duration::from_millis(300);
    let first = client_with_lease(f, lease).get_lock(&name).unwrap();
    let g1 = first.lock().unwrap();
    let t1 = match g1.fencing_token() {
        Ok(t1) => t1,
        Err(e) => return assert!(!f.fencing(), "no fencing token: {e}"),
    };
    let resource = dlm_core::FencedResource::new(Vec::new());
    resource
        .write(t1, |log| log.push("client 1, before the pause"))
        .unwrap();
    // Client 1 is paused (it does nothing) while its lease runs out; client 2 takes over.
    let g2 = client(f)
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("client 2 never got the lock");
    let t2 = g2.fencing_token().unwrap();
    assert!(t2 > t1, "token {t2} after {t1}");
    resource.write(t2, |log| log.push("client 2")).unwrap();
    // Client 1 wakes up and writes as if it still held the lock.
    let refused = resource.write(t1, |log| log.push("client 1, after the pause"));
    assert_eq!(
        refused,
        Err(dlm_core::StaleToken {
            presented: t1,
            highest: t2
        })
    );
    assert!(
        g1.is_expired(),
        "client 1 could have known: its lease had run out"
    );
    assert_eq!(
        resource.read(|log| log.clone()),
        ["client 1, before the pause", "client 2"]
    );
}

/// A holder that lost its lock never gets a token afterwards: its first read of the token
/// after its lease ran out (and another holder took the lock) is `LockLost`, never a
/// token. After a force release under a lease it still believes in, a backend that draws
/// tokens on demand answers `LockLost` too (and the guard then knows it lost the lock); one
/// that handed the token out with the acquisition may give that token, which is older than
/// the next holder's.
pub fn a_token_read_after_the_lock_was_lost_is_an_error(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("lost-token");
    let lease = Duration::from_millis(300);
    let first = client_with_lease(f, lease).get_lock(&name).unwrap();
    let g1 = first.lock().unwrap();
    let g2 = client(f)
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("the lease ran out, the lock is free");
    match g1.fencing_token() {
        Err(Error::LockLost) => {}
        other => panic!("a token read after the lease ran out: {other:?}"),
    }
    let t2 = g2.fencing_token().unwrap();
    drop(g2);

    let held = client(f).get_lock(&name).unwrap();
    let g3 = held.lock().unwrap();
    assert!(client(f).get_lock(&name).unwrap().force_unlock().unwrap());
    let g4 = client(f).get_lock(&name).unwrap().lock().unwrap();
    let t4 = g4.fencing_token().unwrap();
    assert!(t4 > t2, "token {t4} after {t2}");
    match g3.fencing_token() {
        Err(Error::LockLost) => assert!(!g3.is_held(), "the guard learnt nothing"),
        Ok(t3) => assert!(
            t3 < t4,
            "the old holder's token {t3} is not older than {t4}"
        ),
        Err(e) => panic!("{e}"),
    }
}

/// One token per hold: read twice, through a re-entrant guard, or from another thread, it
/// is the same (and the later reads do no I/O); the next acquisition gets a larger one.
pub fn the_token_is_stable_within_a_hold(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("stable-token");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let c = LockClient::builder(counting.clone())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let lock = c.get_lock(&name).unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    let t = inner.fencing_token().unwrap();
    let calls = counting.calls();
    assert_eq!(outer.fencing_token().unwrap(), t);
    assert_eq!(inner.fencing_token().unwrap(), t);
    assert_eq!(lock.lock().unwrap().fencing_token().unwrap(), t);
    let moved = thread::spawn(move || inner.fencing_token().unwrap())
        .join()
        .unwrap();
    assert_eq!(moved, t);
    assert_eq!(counting.calls(), calls, "a second read did I/O");
    outer.unlock().unwrap();
    let next = lock.lock().unwrap();
    let t2 = next.fencing_token().unwrap();
    assert!(t2 > t, "token {t2} after {t}");
    assert_eq!(next.fencing_token().unwrap(), t2);
}

/// Fencing costs nothing until it is used: acquisitions (fresh, contended, re-entrant)
/// whose tokens are never read write no fencing key; the first read writes one.
pub fn an_unread_token_writes_no_fencing_key(f: &dyn Fixture) {
    let Some(before) = f.fencing_keys() else {
        return;
    };
    let names: Vec<String> = (0..20).map(|_| unique_name("unread")).collect();
    let (a, b) = (client(f), client(f));
    for name in &names {
        let g = a.get_lock(name).unwrap().lock().unwrap();
        let again = a.get_lock(name).unwrap().lock().unwrap();
        assert!(b.get_lock(name).unwrap().try_lock().unwrap().is_none());
        drop(again);
        g.unlock().unwrap();
        let g = b.get_lock(name).unwrap().lock().unwrap();
        g.unlock().unwrap();
    }
    assert_eq!(
        f.fencing_keys(),
        Some(before),
        "acquisitions whose tokens were never read wrote fencing keys"
    );
    if f.fencing() {
        let g = a.get_lock(&names[0]).unwrap().lock().unwrap();
        g.fencing_token().unwrap();
        assert!(f.fencing_keys() > Some(before), "the read wrote no key");
    }
}

/// A client over `counting` with a fixed lease, drawing tokens as `draw` says.
fn counted_client(counting: &Arc<CountingBackend>, draw: TokenDraw) -> LockClient {
    LockClient::builder(counting.clone())
        .lease(Duration::from_secs(30))
        .token_draw(draw)
        .build()
        .unwrap()
}

/// After a hold that read its token, the next acquisition of the lock by the same client
/// (through a new handle too) draws the token with it: the token is known right after
/// acquiring, with no request but the acquisition, and reading it does no I/O. Tokens
/// drawn so still increase across holders (another client holds and reads in between).
/// A name the client has not held is predicted from its last hold of any name.
pub fn a_read_token_comes_with_the_next_acquisition(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("predicted");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let a = counted_client(&counting, TokenDraw::Predicted);
    let other = client(f);
    let g = a.get_lock(&name).unwrap().lock().unwrap();
    assert_eq!(
        counting.fenced_acquisitions(),
        0,
        "nothing to predict from: the first hold draws when read"
    );
    let mut last = g.fencing_token().unwrap();
    g.unlock().unwrap();
    let lock = a.get_lock(&name).unwrap();
    for round in 1..=3 {
        let g = other.get_lock(&name).unwrap().lock().unwrap();
        let t = g.fencing_token().unwrap();
        assert!(t > last, "token {t} after {last}");
        last = t;
        g.unlock().unwrap();
        // Once through the kept handle, once through a new one.
        let calls = counting.calls();
        let g = if round % 2 == 0 {
            lock.lock().unwrap()
        } else {
            a.get_lock(&name).unwrap().lock().unwrap()
        };
        assert_eq!(counting.fenced_acquisitions(), round, "round {round}");
        let t = g
            .known_fencing_token()
            .expect("the token came with the acquisition");
        assert_eq!(g.fencing_token().unwrap(), t);
        assert_eq!(counting.calls(), calls + 1, "more than the acquisition");
        assert!(t > last, "token {t} after {last}");
        last = t;
        g.unlock().unwrap();
    }
    // A name this client has not held yet is predicted from its last hold of any name
    // (a lock per entity: `order-123`): that one read its token, so this one's comes
    // with the acquisition too.
    let fenced = counting.fenced_acquisitions();
    let g = a
        .get_lock(&unique_name("predicted-new"))
        .unwrap()
        .lock()
        .unwrap();
    assert_eq!(
        counting.fenced_acquisitions(),
        fenced + 1,
        "a new name after holds that read their tokens"
    );
    // (Tokens are ordered per name: nothing to compare it with.)
    assert!(
        g.known_fencing_token().is_some(),
        "drawn with the acquisition"
    );
    g.unlock().unwrap();
    // That hold did not read it: the next new name draws on read again.
    let g = a
        .get_lock(&unique_name("predicted-new"))
        .unwrap()
        .lock()
        .unwrap();
    assert_eq!(
        counting.fenced_acquisitions(),
        fenced + 1,
        "a new name after a hold that did not read its token"
    );
    g.fencing_token().unwrap();
    g.unlock().unwrap();
}

/// A token drawn with the acquisition and never read is released with the lock: the
/// lock is free afterwards, the store holds the same fencing keys as before and no key
/// without expiry, and the next acquisition goes back to drawing on read. A later read
/// still gets a larger token.
pub fn a_mispredicted_draw_is_released_with_the_lock(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("mispredicted");
    let counting = Arc::new(CountingBackend::new(f.backend()));
    let a = counted_client(&counting, TokenDraw::Predicted);
    let lock = a.get_lock(&name).unwrap();
    let g = lock.lock().unwrap();
    let t1 = g.fencing_token().unwrap();
    g.unlock().unwrap();
    let keys = f.fencing_keys();
    // Predicted a read, and not read.
    let g = lock.lock().unwrap();
    assert_eq!(counting.fenced_acquisitions(), 1);
    let drawn = g.known_fencing_token().expect("drawn with the acquisition");
    assert!(drawn > t1, "token {drawn} after {t1}");
    g.unlock().unwrap();
    assert!(!lock.is_locked().unwrap(), "released with the lock");
    assert_eq!(f.fencing_keys(), keys, "the unused draw left fencing keys");
    assert_eq!(
        f.keys_without_expiry().unwrap_or(0),
        0,
        "a key without expiry"
    );
    // The prediction is cleared: draw on read again.
    let g = lock.lock().unwrap();
    assert_eq!(
        counting.fenced_acquisitions(),
        1,
        "still drawn with the acquisition"
    );
    let t3 = g.fencing_token().unwrap();
    assert!(t3 > drawn, "token {t3} after {drawn}");
    g.unlock().unwrap();
    assert_eq!(
        f.keys_without_expiry().unwrap_or(0),
        0,
        "a key without expiry"
    );
}

/// `TokenDraw::AtAcquisition` draws with every acquisition (the first one too) and
/// `TokenDraw::WhenRead` with none, whatever was read before; tokens increase either way.
pub fn token_draw_settings_are_followed(f: &dyn Fixture) {
    if !f.fencing() {
        return;
    }
    let name = unique_name("token-draw");
    let eager = Arc::new(CountingBackend::new(f.backend()));
    let lazy = Arc::new(CountingBackend::new(f.backend()));
    let (e, l) = (
        counted_client(&eager, TokenDraw::AtAcquisition),
        counted_client(&lazy, TokenDraw::WhenRead),
    );
    let mut last = None;
    for i in 0..3 {
        let g = e.get_lock(&name).unwrap().lock().unwrap();
        let t = g.known_fencing_token().expect("drawn with the acquisition");
        assert!(Some(t) > last, "token {t} after {last:?}");
        last = Some(t);
        if i == 1 {
            // Read once; the other holds leave theirs unread, and each next acquisition
            // draws all the same.
            assert_eq!(g.fencing_token().unwrap(), t);
        }
        g.unlock().unwrap();
        let g = l.get_lock(&name).unwrap().lock().unwrap();
        let t = g.fencing_token().unwrap();
        assert!(Some(t) > last, "token {t} after {last:?}");
        last = Some(t);
        g.unlock().unwrap();
    }
    assert_eq!(eager.fenced_acquisitions(), 3);
    assert_eq!(lazy.fenced_acquisitions(), 0);
}

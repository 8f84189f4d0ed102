//! Leader election: [`Election`], the lead it grants ([`Leadership`]), what anyone sees of
//! it ([`Leader`]) and the changes an [`Observer`] is told of.
//!
//! An election is a one-permit semaphore of its name whose holder publishes a value: the
//! permit's label at the store, so that `dlm status` and
//! [`Semaphore::inspect`](crate::Semaphore::inspect) show it too. The lead is an ordinary
//! permit hold (a lease renewed by the watchdog, the lost signal, wake-ups of the next
//! candidate at its release) with its fencing token drawn at the grant: the term.

use std::fmt;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, select};

use crate::acquire::{Acquisition, Wait};
use crate::backend::{
    BackendError, BackendErrorKind, Claim, FencingToken, LockName, Watch, check_label,
};
use crate::client::LockClient;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::handle::Handle;
use crate::interrupt::Interrupt;
use crate::lost::LostSignal;

/// The claim every election's lead is: the one permit of its name's semaphore.
const LEAD: Claim = Claim::Permit { permits: 1 };

/// How long an observer waits at most between two looks when the backend sends it no
/// hints (or none arrives): the current leader's remaining lease, at least this.
const LOOK_AT_LEAST_EVERY: Duration = Duration::from_millis(50);

/// An election of a [`LockClient`]: at most one leader of its name at a time across every
/// client of the store, publishing a value (an address, a host name) that everyone can
/// read ([`leader`](Election::leader)) and follow ([`observe`](Election::observe)).
///
/// Made by [`LockClient::get_election`]. Campaigns wait as lock acquisitions do, with the
/// same family of calls (blocking, interruptible, one attempt, with a timeout); the lead
/// is kept by the client's watchdog until it is resigned (or its [`Leadership`] dropped),
/// and lost like a lock (the lost signal says so). Each lead's term is a fencing token,
/// larger than every earlier leader's: hand it to the resources the leader writes.
///
/// ```
/// use dlm_core::LockClient;
/// use dlm_memory::MemoryBackend;
///
/// let backend = std::sync::Arc::new(MemoryBackend::new());
/// let election = LockClient::new(backend.clone()).get_election("scheduler")?;
/// let standby = LockClient::new(backend).get_election("scheduler")?;
///
/// let lead = election.campaign("10.0.0.7:8080")?;      // blocks until this client leads
/// assert!(standby.try_campaign("10.0.0.8:8080")?.is_none());
/// let leader = standby.leader()?.expect("someone leads");
/// assert_eq!(leader.value(), Some("10.0.0.7:8080"));   // where to forward work
/// assert_eq!(leader.term(), Some(lead.term()));
///
/// lead.proclaim("10.0.0.7:9090")?;                     // a new value, the same term
/// assert_eq!(standby.leader()?.unwrap().value(), Some("10.0.0.7:9090"));
/// lead.resign()?;                                      // the next candidate at once
/// let next = standby.try_campaign("10.0.0.8:8080")?.expect("free");
/// assert!(next.term() > leader.term().unwrap());
/// # Ok::<(), dlm_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Election {
    /// The one-permit semaphore of the name, as the client's (each thread's lead is its
    /// hold there).
    handle: Handle,
}

impl Election {
    pub(crate) fn new(client: &LockClient, name: LockName) -> Result<Election> {
        let backend = &client.shared.backend;
        if !backend.supports_elections() {
            return Err(BackendError::new(
                BackendErrorKind::Unsupported,
                format!("the {} backend keeps no elections", backend.kind()),
            )
            .into());
        }
        Ok(Election {
            handle: client.group_handle(name, LEAD)?,
        })
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.handle.name.as_str()
    }

    /// Blocks until this client leads, publishing `value`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `value` over [`MAX_LABEL_LEN`](crate::MAX_LABEL_LEN)
    /// bytes or with control characters (before any I/O);
    /// [`Error::WouldDeadlock`] when the calling thread leads already; backend failures
    /// as for a lock.
    pub fn campaign(&self, value: &str) -> Result<Leadership> {
        self.run(value, Wait::Forever, None)
            .map(|l| l.expect("an unbounded wait ends only with the lead or an error"))
    }

    /// Like [`campaign`](Election::campaign), ending with [`Error::Interrupted`] when
    /// `interrupt` fires.
    pub fn campaign_interruptibly(&self, value: &str, interrupt: &Interrupt) -> Result<Leadership> {
        self.run(value, Wait::Forever, Some(interrupt))
            .map(|l| l.expect("an unbounded wait ends only with the lead or an error"))
    }

    /// One attempt: `Ok(None)` when someone else leads.
    pub fn try_campaign(&self, value: &str) -> Result<Option<Leadership>> {
        self.run(value, Wait::No, None)
    }

    /// Waits at most `timeout` for the lead (zero: one attempt; `Duration::MAX`: forever).
    pub fn try_campaign_timeout(
        &self,
        value: &str,
        timeout: Duration,
    ) -> Result<Option<Leadership>> {
        self.run(value, Wait::from_timeout(timeout), None)
    }

    /// Like [`try_campaign_timeout`](Election::try_campaign_timeout), ending with
    /// [`Error::Interrupted`] when `interrupt` fires.
    pub fn try_campaign_interruptibly(
        &self,
        value: &str,
        timeout: Duration,
        interrupt: &Interrupt,
    ) -> Result<Option<Leadership>> {
        self.run(value, Wait::from_timeout(timeout), Some(interrupt))
    }

    fn run(
        &self,
        value: &str,
        wait: Wait,
        interrupt: Option<&Interrupt>,
    ) -> Result<Option<Leadership>> {
        check_label(value).map_err(|e| {
            Error::InvalidArgument(crate::InvalidArgument::new("value", e.reason().to_owned()))
        })?;
        // The hold labelled with the value, its token (the term) drawn with the grant.
        let shared = self.handle.state(LEAD);
        let acquisition = Acquisition {
            shared: &shared,
            lease: self.handle.lease,
            keep_alive: &self.handle.keep_alive,
            campaign: Some(value),
        };
        let Some(guard) = acquisition.run(wait, interrupt)? else {
            return Ok(None);
        };
        let term = match guard.fencing_token() {
            Ok(term) => term,
            Err(e) => {
                drop(guard);
                return Err(e);
            }
        };
        Ok(Some(Leadership {
            guard,
            term,
            value: parking_lot::Mutex::new(value.to_owned()),
        }))
    }

    /// The current leader, if any (asks the backend); anyone may ask, campaigning or not.
    ///
    /// # Errors
    /// [`BackendErrorKind::Conflict`] when the name is held as a semaphore of more than one
    /// permit; backend failures.
    pub fn leader(&self) -> Result<Option<Leader>> {
        let holders = self
            .handle
            .client
            .backend
            .inspect_group(&self.handle.name, LEAD)?;
        if let Some(permits) = holders.permits.filter(|&p| p != 1) {
            return Err(BackendError::new(
                BackendErrorKind::Conflict,
                format!(
                    "{:?} is held as a semaphore of {permits} permits, not as an election",
                    self.handle.name.as_str()
                ),
            )
            .into());
        }
        Ok(holders.holders.into_iter().next().map(|h| Leader {
            value: h.label,
            term: h.token,
            remaining: h.remaining,
        }))
    }

    /// A follower of the leader's changes: each new leader, a new value, or the lead
    /// falling vacant, in order (see [`Observer`]).
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            watch: None,
            last: None,
            started: false,
        }
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.handle.name.as_str())
            .finish_non_exhaustive()
    }
}

/// This client's lead of an [`Election`]: resigned when dropped.
#[must_use = "if unused the lead is resigned immediately"]
#[clippy::has_significant_drop]
pub struct Leadership {
    guard: LockGuard,
    term: FencingToken,
    value: parking_lot::Mutex<String>,
}

impl Leadership {
    /// The term: the lead's fencing token, larger than every earlier leader's of this
    /// election. Hand it to the resources the leader writes.
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// The value published now.
    pub fn value(&self) -> String {
        self.value.lock().clone()
    }

    /// The end of the lead's lease as this process knows it (see
    /// [`LockGuard::valid_until`]).
    pub fn valid_until(&self) -> Instant {
        self.guard.valid_until()
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// `true` while the lead is held (no I/O; see [`LockGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// `Ok(())` while the lead is held, else [`Error::LockLost`].
    pub fn ensure_held(&self) -> Result<()> {
        self.guard.ensure_held()
    }

    /// A signal that ends when the lead is lost or resigned.
    pub fn lost_signal(&self) -> LostSignal {
        self.guard.lost_signal()
    }

    /// Publishes `value` instead, without giving up the lead (the term stays); observers
    /// are told.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad `value` (no I/O); [`Error::LockLost`] when the
    /// lead is no longer this client's; backend failures (the value may or may not have
    /// changed: [`Election::leader`] says).
    pub fn proclaim(&self, value: &str) -> Result<()> {
        check_label(value).map_err(|e| {
            Error::InvalidArgument(crate::InvalidArgument::new("value", e.reason().to_owned()))
        })?;
        let (shared, generation) = self.guard.hold();
        let owner = shared
            .with_current(generation, |h| h.token)
            .ok_or(Error::LockLost)?;
        if !self.guard.is_held() {
            return Err(Error::LockLost);
        }
        let mut published = self.value.lock();
        if shared
            .client
            .backend
            .relabel_group(&shared.name, LEAD, &owner, Some(value))?
        {
            *published = value.to_owned();
            Ok(())
        } else {
            Err(Error::LockLost)
        }
    }

    /// The lead as a plain guard (its [`fencing_token`](LockGuard::fencing_token) is the
    /// term), for code written for guards: releasing it resigns. The value can no longer
    /// be changed.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Gives up the lead; the next candidate is woken at once.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the lead had been lost already; backend failures (a
    /// transient one is sent again in the background, as a lock's release).
    pub fn resign(self) -> Result<()> {
        self.guard.unlock()
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.guard.name())
            .field("term", &self.term)
            .field("value", &*self.value.lock())
            .field("held", &self.is_held())
            .finish()
    }
}

/// The leader of an election as the store has it: its value, its term and its remaining
/// lease.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    value: Option<String>,
    term: Option<FencingToken>,
    remaining: Duration,
}

impl Leader {
    /// The value it published (`None` only for a lead taken without one, such as a
    /// one-permit semaphore of the same name held by an unlabelled client).
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// Its term (its lead's fencing token), where the backend issues tokens.
    pub fn term(&self) -> Option<FencingToken> {
        self.term
    }

    /// Its remaining lease at the store, when asked: the lead falls vacant then at the
    /// latest unless it is renewed.
    pub fn remaining(&self) -> Duration {
        self.remaining
    }

    /// Whether `other` is the same lead with the same value (the remaining lease aside).
    fn same(&self, other: &Leader) -> bool {
        self.term == other.term && self.value == other.value
    }
}

/// The changes of an election's leader, in order: a blocking iterator whose items are the
/// leader after each change (`None`: nobody leads), starting with the current one. Woken
/// by the store's notifications of each grant, release and proclamation; it also looks
/// again when the leader's lease would end (a crashed leader announces nothing), and
/// while the store sends no notifications (its listener reconnecting), once per lease. After a failure (the
/// store unreachable), the next item is the current leader once the store answers
/// again, so an observer that missed changes meanwhile sees where things stand.
///
/// ```
/// use dlm_core::LockClient;
/// use dlm_memory::MemoryBackend;
///
/// let backend = std::sync::Arc::new(MemoryBackend::new());
/// let mut changes = LockClient::new(backend.clone()).get_election("compactor")?.observe();
/// assert_eq!(changes.next().unwrap()?, None);          // nobody leads yet
/// let lead = LockClient::new(backend).get_election("compactor")?.campaign("node-3")?;
/// let leader = changes.next().unwrap()?.expect("a leader");
/// assert_eq!(leader.value(), Some("node-3"));
/// lead.resign()?;
/// assert_eq!(changes.next().unwrap()?, None);
/// # Ok::<(), dlm_core::Error>(())
/// ```
pub struct Observer {
    election: Election,
    /// The backend's change hints, once subscribed.
    watch: Option<Watch>,
    /// The leader last handed out.
    last: Option<Leader>,
    /// Whether the current leader has been handed out once.
    started: bool,
}

impl Observer {
    /// The next change, waiting at most until `deadline` (`None`: as long as it takes):
    /// `Ok(None)` when nothing changed in time.
    fn next_change(
        &mut self,
        deadline: Option<Instant>,
        stop: &Receiver<()>,
    ) -> Result<Option<Option<Leader>>> {
        loop {
            if self.watch.is_none() {
                // (Again after a subscription died: a listener reconnecting, say.)
                self.watch = self
                    .election
                    .handle
                    .client
                    .backend
                    .observe_group(&self.election.handle.name, LEAD);
            }
            let now = self.election.leader()?;
            let changed = match (&self.last, &now) {
                (Some(a), Some(b)) => !a.same(b),
                (None, None) => false,
                _ => true,
            };
            if changed || !self.started {
                self.started = true;
                self.last = now.clone();
                return Ok(Some(now));
            }
            // With hints: when the leader's lease would end (a crashed leader says
            // nothing). Without: that, and at least once per lease a campaign asks for.
            let shared = &self.election.handle.client;
            let lease = shared.lease.unwrap_or(shared.watchdog.config().timeout);
            let quiet = match (&now, &self.watch) {
                (Some(l), Some(_)) => l.remaining,
                (Some(l), None) => l.remaining.min(lease),
                (None, Some(_)) => Duration::from_secs(3600),
                (None, None) => lease,
            };
            let look_again = Instant::now() + quiet.max(LOOK_AT_LEAST_EVERY);
            let wake = match deadline {
                Some(d) if d <= Instant::now() => return Ok(None),
                Some(d) => look_again.min(d),
                None => look_again,
            };
            let never = crossbeam_channel::never();
            let hints = self.watch.as_ref().map_or(&never, Watch::receiver);
            select! {
                recv(hints) -> hint => {
                    if hint.is_err() {
                        self.watch = None; // the subscription died: looks at lease ends
                    }
                }
                recv(stop) -> _ => return Ok(None),
                recv(crossbeam_channel::at(wake)) -> _ => {}
            }
        }
    }

    /// The next change, waiting at most `timeout`: `Ok(None)` when nothing changed.
    ///
    /// # Errors
    /// Backend failures; the next call looks again.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Option<Leader>>> {
        let deadline = Instant::now().checked_add(timeout);
        self.next_change(deadline, &crossbeam_channel::never())
    }

    /// The changes on a channel, for `select!` beside other work: a thread of their own
    /// follows them until the returned [`ObservedChanges`] is dropped (which stops and
    /// joins it). Failures are sent too; the thread looks again a second after each.
    pub fn into_channel(mut self) -> ObservedChanges {
        let (tx, rx) = crossbeam_channel::bounded(16);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("dlm-observer".into())
            .spawn(move || {
                loop {
                    let item = match self.next_change(None, &stop_rx) {
                        Ok(Some(change)) => Ok(change),
                        Ok(None) => return, // stopped
                        Err(e) => {
                            self.started = false;
                            Err(e)
                        }
                    };
                    let failed = item.is_err();
                    select! {
                        send(tx, item) -> sent => if sent.is_err() { return },
                        recv(stop_rx) -> _ => return,
                    }
                    if failed
                        && stop_rx.recv_timeout(Duration::from_secs(1))
                            != Err(crossbeam_channel::RecvTimeoutError::Timeout)
                    {
                        return;
                    }
                }
            })
            .expect("starting an observer thread");
        ObservedChanges {
            receiver: rx,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

/// An election's leader changes on a channel ([`Observer::into_channel`]); dropping it
/// stops the thread that follows them.
pub struct ObservedChanges {
    receiver: Receiver<Result<Option<Leader>>>,
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ObservedChanges {
    /// The channel: the leader after each change (`None`: nobody leads), or a failure.
    pub fn receiver(&self) -> &Receiver<Result<Option<Leader>>> {
        &self.receiver
    }
}

impl Drop for ObservedChanges {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for ObservedChanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObservedChanges").finish_non_exhaustive()
    }
}

impl Iterator for Observer {
    type Item = Result<Option<Leader>>;

    /// Blocks until the leader changes (the first call: the current leader).
    fn next(&mut self) -> Option<Self::Item> {
        match self.next_change(None, &crossbeam_channel::never()) {
            Ok(Some(change)) => Some(Ok(change)),
            Ok(None) => unreachable!("no deadline and no stop"),
            Err(e) => {
                // Seen again after the failure: the current leader, whatever it is.
                self.started = false;
                Some(Err(e))
            }
        }
    }
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election.handle.name.as_str())
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

//! Release hints: one connection per backend that `LISTEN`s on the schema's channel, read
//! by a thread of its own, its notifications routed to each resource's `WaitList` (one
//! waiter per mutex release; every waiter of a semaphore or read-write lock).
//!
//! A release notifies (`pg_notify`, at its commit) only when someone waits: a failed
//! attempt records that it will look again (`waiting`). The payload is the sender's id,
//! the resource's kind and its name; a backend's own releases wake its waiters at once,
//! and their notifications are then skipped. The thread starts with the first waiter,
//! which waits for its `LISTEN` (or its failure) before it looks once more, so that no
//! release after that look goes unheard. After a reconnection it wakes every waiter to
//! look again: a release while it was away was not heard. A silent connection is probed every two seconds, so a server
//! that stopped answering is left for another (waiters meanwhile wait as long as the
//! holder's lease, which bounds every wait).

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use dlm_core::backend::{WaitList, Watch};
use parking_lot::{Condvar, Mutex};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{AsyncMessage, NoTls};

use crate::conn::{Connector, within};

/// How long the listening connection may stay silent before it is probed.
const PROBE_AFTER: Duration = Duration::from_secs(2);
/// The pause before connecting again after a failure.
const RECONNECT_AFTER: Duration = Duration::from_millis(200);

/// The waiters of each resource.
#[derive(Default)]
struct Lists {
    /// By name, then by kind (`m`, `s`, `r`): looked up with the name as it is, no copy.
    by_key: HashMap<String, [Option<WaitList>; 3]>,
    /// Size after the last sweep of empty lists.
    swept_at: usize,
}

/// The release hints of one backend, and its listening thread.
pub(crate) struct Hints {
    lists: Arc<Mutex<Lists>>,
    /// This backend's id in notifications.
    pub(crate) sender: String,
    channel: String,
    connector: Connector,
    listener: Mutex<Option<Listener>>,
    /// Whether the listening thread has made its first attempt to `LISTEN`.
    first: Arc<(Mutex<bool>, Condvar)>,
}

struct Listener {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Hints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hints")
            .field("channel", &self.channel)
            .field("listening", &self.listener.lock().is_some())
            .finish_non_exhaustive()
    }
}

impl Hints {
    pub(crate) fn new(connector: Connector, channel: String) -> Hints {
        let sender = format!("{:016x}", rand::random::<u64>());
        Hints {
            lists: Arc::default(),
            sender,
            channel,
            connector,
            listener: Mutex::new(None),
            first: Arc::default(),
        }
    }

    /// A subscription to the releases of (`kind`, `name`); starts the listening thread
    /// with the first one.
    pub(crate) fn subscribe(&self, kind: u8, name: &str) -> Option<Watch> {
        self.start();
        // The first waiters wait (once) for the first LISTEN: the front looks once more
        // after subscribing, and a release after that look must be heard.
        let (done, cv) = &*self.first;
        let mut done = done.lock();
        if !*done {
            let deadline = std::time::Instant::now()
                + self.connector.connect_timeout
                + self.connector.io_timeout;
            while !*done && !cv.wait_until(&mut done, deadline).timed_out() {}
        }
        drop(done);
        let mut lists = self.lists.lock();
        if lists.by_key.len() > 64 && lists.by_key.len() >= 2 * lists.swept_at {
            lists
                .by_key
                .retain(|_, kinds| kinds.iter().flatten().any(|l| !l.is_empty()));
            lists.swept_at = lists.by_key.len();
        }
        let list = lists.by_key.entry(name.to_owned()).or_default()[slot(kind)]
            .get_or_insert_with(WaitList::new);
        Some(list.subscribe())
    }

    /// This backend released (`kind`, `name`): wake its own waiters now (one for a
    /// mutex, all for a group).
    pub(crate) fn released(&self, kind: u8, name: &str) {
        wake(&self.lists, kind, name);
    }

    /// Whether a hand-over of the mutex `name` to a waiter of this backend is under way.
    pub(crate) fn wake_pending(&self, name: &str) -> bool {
        self.lists
            .lock()
            .by_key
            .get(name)
            .and_then(|kinds| kinds[slot(b'm')].as_ref())
            .is_some_and(WaitList::wake_pending)
    }

    fn start(&self) {
        let mut listener = self.listener.lock();
        if listener.is_some() {
            return;
        }
        let (stop, stopped) = oneshot::channel();
        let listen = Listen {
            lists: self.lists.clone(),
            sender: self.sender.clone(),
            channel: self.channel.clone(),
            connector: self.connector.clone(),
            first: self.first.clone(),
        };
        let thread = thread::Builder::new()
            .name("dlm-postgres-listen".into())
            .spawn(move || listen.run(stopped))
            .map_err(|e| {
                log::warn!("dlm-postgres: cannot start the listening thread ({e}); waiters poll")
            })
            .ok();
        *listener = Some(Listener {
            stop: Some(stop),
            thread,
        });
    }
}

impl Drop for Hints {
    fn drop(&mut self) {
        if let Some(mut l) = self.listener.get_mut().take() {
            drop(l.stop.take());
            if let Some(t) = l.thread.take() {
                let _ = t.join();
            }
        }
        for list in self.lists.lock().by_key.values().flatten().flatten() {
            list.close();
        }
    }
}

/// Where a kind's list is kept.
fn slot(kind: u8) -> usize {
    match kind {
        b'm' => 0,
        b's' => 1,
        _ => 2,
    }
}

/// Wakes the waiters of (`kind`, `name`): one for a mutex, all for a group.
fn wake(lists: &Mutex<Lists>, kind: u8, name: &str) {
    let lists = lists.lock();
    if let Some(list) = lists
        .by_key
        .get(name)
        .and_then(|kinds| kinds[slot(kind)].as_ref())
    {
        if kind == b'm' {
            list.notify_one();
        } else {
            list.notify_all();
        }
    }
}

/// The listening thread's side.
struct Listen {
    lists: Arc<Mutex<Lists>>,
    sender: String,
    channel: String,
    connector: Connector,
    first: Arc<(Mutex<bool>, Condvar)>,
}

impl Listen {
    /// The first attempt to listen is over (it worked or not): the first waiters go on.
    fn first_attempt_over(&self) {
        let (done, cv) = &*self.first;
        *done.lock() = true;
        cv.notify_all();
    }

    fn run(self, mut stopped: oneshot::Receiver<()>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                log::warn!("dlm-postgres: cannot start the listening runtime ({e}); waiters poll");
                return;
            }
        };
        runtime.block_on(async {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    kept = self.listen() => if !kept {
                        // The connection does not keep a LISTEN: listening again would
                        // only leave more of them behind. Waiters poll from now on.
                        return;
                    }
                }
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(RECONNECT_AFTER) => {}
                }
            }
        });
    }

    /// One connection's life: connect, `LISTEN`, route notifications until it fails.
    /// `false` when the connection did not keep its `LISTEN` (a pooler in transaction
    /// mode): hints are then off for good.
    async fn listen(&self) -> bool {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let connect = async move {
            match &self.connector.tls {
                None => {
                    let (client, mut connection) = within(
                        self.connector.connect_timeout,
                        self.connector.config.connect(NoTls),
                    )
                    .await?;
                    tokio::spawn(async move {
                        while let Some(Ok(m)) =
                            std::future::poll_fn(|cx| connection.poll_message(cx)).await
                        {
                            if let AsyncMessage::Notification(n) = m
                                && tx.send(n).is_err()
                            {
                                return;
                            }
                        }
                    });
                    Ok(client)
                }
                Some(tls) => {
                    let (client, mut connection) = within(
                        self.connector.connect_timeout,
                        self.connector.config.connect(tls.clone()),
                    )
                    .await?;
                    tokio::spawn(async move {
                        while let Some(Ok(m)) =
                            std::future::poll_fn(|cx| connection.poll_message(cx)).await
                        {
                            if let AsyncMessage::Notification(n) = m
                                && tx.send(n).is_err()
                            {
                                return;
                            }
                        }
                    });
                    Ok::<_, crate::conn::Failure>(client)
                }
            }
        };
        let client = match connect.await {
            Ok(c) => c,
            Err(f) => {
                let e = f.connecting(&self.connector.servers, self.connector.connect_timeout);
                log::debug!("dlm-postgres: the listening connection: {e}");
                self.first_attempt_over();
                return true;
            }
        };
        let listen = format!("LISTEN \"{}\"", self.channel);
        if let Err(f) = within(self.connector.io_timeout, client.batch_execute(&listen)).await {
            log::debug!(
                "dlm-postgres: LISTEN failed: {}",
                f.requesting(self.connector.io_timeout)
            );
            self.first_attempt_over();
            return true;
        }
        // Asked in a request of its own: behind a pooler in transaction mode it runs on
        // another server connection, which does not listen (and the LISTEN stays behind
        // on the one that ran it, hearing for nobody).
        let check = format!(
            "SELECT count(*) FROM pg_listening_channels() c WHERE c = '{}'",
            self.channel
        );
        let kept = |rows: &[tokio_postgres::SimpleQueryMessage]| {
            rows.iter().any(|m| {
                matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("1"))
            })
        };
        match within(self.connector.io_timeout, client.simple_query(&check)).await {
            Ok(rows) if !kept(&rows) => {
                self.give_up(&client).await;
                return false;
            }
            Ok(_) => {}
            Err(_) => {
                self.first_attempt_over();
                return true;
            }
        }
        // After a break, a release before this LISTEN was not heard: every waiter looks
        // again. (The first waiters waited for it: they look again anyway.)
        let (first, _) = &*self.first;
        if *first.lock() {
            self.wake_everyone();
        }
        self.first_attempt_over();
        loop {
            tokio::select! {
                n = rx.recv() => match n {
                    Some(n) => self.route(n.payload()),
                    None => break,
                },
                () = tokio::time::sleep(PROBE_AFTER) => {
                    match within(self.connector.io_timeout, client.simple_query(&check)).await {
                        Ok(rows) if !kept(&rows) => {
                            self.give_up(&client).await;
                            return false;
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            }
        }
        log::debug!("dlm-postgres: the listening connection ended; connecting again");
        self.wake_everyone();
        true
    }

    /// The connection does not keep a `LISTEN`: says so once, undoes what it can, and
    /// wakes every waiter (they poll from now on, within the holder's lease).
    async fn give_up(&self, client: &tokio_postgres::Client) {
        log::warn!(
            "dlm-postgres: the listening connection to {} does not keep its LISTEN (a connection \
             pooler in transaction mode?): release wake-ups are off, waiters look again when the \
             holder's lease would end. Give the server's own address as listen_url",
            self.connector.servers
        );
        let _ = within(
            self.connector.io_timeout,
            client.batch_execute("UNLISTEN *"),
        )
        .await;
        self.first_attempt_over();
        self.wake_everyone();
    }

    /// `sender kind name`: wake the waiters of (kind, name), unless this backend sent it
    /// (its own waiters were woken at the release).
    fn route(&self, payload: &str) {
        let mut parts = payload.splitn(3, ' ');
        let (Some(sender), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        if sender == self.sender || kind.len() != 1 {
            return;
        }
        wake(&self.lists, kind.as_bytes()[0], name);
    }

    fn wake_everyone(&self) {
        for list in self.lists.lock().by_key.values().flatten().flatten() {
            list.notify_all();
        }
    }
}

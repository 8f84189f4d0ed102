//! How a connection's requests run on the calling thread: its socket as the protocol
//! sees it (reads that never wait, writes bounded by the send timeout), and the loop that
//! polls the protocol and the request and, when neither can go on, waits for the server
//! in a blocking read bounded by the socket's read timeout. No runtime, no timer.

use std::future::Future;
use std::io::{self, Write};
use std::net::TcpStream;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::RecvFlags;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::failure::Failure;

/// The half of a connection that talks to the server (`tokio_postgres::Connection`), run
/// by the caller's thread beside each request.
pub(crate) type Driver = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

/// The most a read takes from the socket at once.
const READ_CHUNK: usize = 4096;

/// A connection's socket, shared by the protocol (which reads and writes it, as
/// [`Socket`]) and the thread that waits on it ([`Io`]).
struct Shared {
    stream: TcpStream,
    inbox: parking_lot::Mutex<Inbox>,
}

/// What a wait read from the socket and the protocol has not taken yet.
struct Inbox {
    buf: Box<[u8; READ_CHUNK]>,
    /// The bytes not taken yet: `buf[start..end]`.
    start: usize,
    end: usize,
    /// The socket had nothing more when last read (a read found nothing, or took less than
    /// it asked for): a read that does not wait would find nothing, so it is not made, and
    /// the protocol's read is `Pending` until a wait reads again.
    drained: bool,
    /// What a wait found instead of data: the end of the stream (`Ok`) or an error; the
    /// protocol's next read gets it.
    ended: Option<io::Result<()>>,
}

/// A connection's socket as the protocol sees it. A read takes what a wait read, else
/// what has arrived, and never waits (`MSG_DONTWAIT`; nothing yet is `Pending`, and the
/// waiting is [`Io::run`]'s); a write blocks, bounded by the socket's send timeout (the
/// I/O timeout).
pub(crate) struct Socket(Arc<Shared>);

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut inbox = self.0.inbox.lock();
        if inbox.start < inbox.end {
            let n = (inbox.end - inbox.start).min(buf.remaining());
            let from = inbox.start;
            buf.put_slice(&inbox.buf[from..from + n]);
            inbox.start += n;
            return Poll::Ready(Ok(()));
        }
        if let Some(ended) = inbox.ended.take() {
            return Poll::Ready(ended);
        }
        if inbox.drained {
            return Poll::Pending;
        }
        let want = buf.remaining().min(READ_CHUNK);
        let unfilled = buf.initialize_unfilled_to(want);
        loop {
            return match rustix::net::recv(&self.0.stream, &mut *unfilled, RecvFlags::DONTWAIT) {
                Ok((n, _)) => {
                    inbox.drained = n < want;
                    buf.advance(n);
                    Poll::Ready(Ok(()))
                }
                Err(Errno::AGAIN) => {
                    inbox.drained = true;
                    Poll::Pending
                }
                Err(Errno::INTR) => continue,
                Err(e) => Poll::Ready(Err(e.into())),
            };
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match (&self.0.stream).write(buf) {
            // A signal cut the write short: written again on the next turn of
            // `Io::run`, which looks at the deadline first.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the server took no more data within the I/O timeout",
            ))),
            written => Poll::Ready(written),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(match self.0.stream.shutdown(std::net::Shutdown::Write) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        })
    }
}

/// Set by a wake-up: something other than the socket (the channel between the client and
/// its connection) has more to do, so [`Io::run`] polls again instead of waiting.
struct Woken(AtomicBool);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// What runs a connection's futures on the caller's thread: its socket, waited on when
/// nothing else is to be done, and the wake-up flag.
pub(crate) struct Io {
    shared: Arc<Shared>,
    /// The read timeout set on the socket: the longest one wait for the server lasts. Set
    /// again when a deadline is longer than it or shorter by more than a tenth, so a
    /// request usually sets nothing.
    waits: Option<Duration>,
    woken: Arc<Woken>,
    waker: Waker,
}

impl Io {
    pub(crate) fn new(stream: TcpStream) -> Io {
        let woken = Arc::new(Woken(AtomicBool::new(false)));
        let inbox = Inbox {
            buf: Box::new([0; READ_CHUNK]),
            start: 0,
            end: 0,
            drained: false,
            ended: None,
        };
        Io {
            shared: Arc::new(Shared {
                stream,
                inbox: parking_lot::Mutex::new(inbox),
            }),
            waits: None,
            waker: Waker::from(woken.clone()),
            woken,
        }
    }

    /// Runs `request` to its end or to `deadline`, polling `driver` (the connection's
    /// half that reads and writes the socket) beside it; when neither can go on, waits for
    /// the server to send.
    pub(crate) fn run<T>(
        &mut self,
        driver: &mut Option<Driver>,
        deadline: Instant,
        request: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, Failure> {
        let mut request = pin!(request);
        let waker = self.waker.clone();
        let mut cx = Context::from_waker(&waker);
        loop {
            self.woken.0.store(false, Ordering::Relaxed);
            poll_driver(driver, &mut cx);
            if let Poll::Ready(answer) = request.as_mut().poll(&mut cx) {
                return answer.map_err(|e| {
                    // A socket that failed because the deadline passed (a write that timed
                    // out) is a timeout.
                    if e.as_db_error().is_none() && Instant::now() >= deadline {
                        Failure::TimedOut
                    } else {
                        Failure::Postgres(e)
                    }
                });
            }
            // Checked on every turn, not only before a wait: a future that wakes itself
            // again and again (a signal interrupting a write) ends at the deadline too.
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::TimedOut);
            }
            if !self.woken.0.load(Ordering::Acquire) {
                self.wait(left).map_err(Failure::Socket)?;
            }
        }
    }

    /// Lets `driver` read what the server sent meanwhile (its closing, for one), without
    /// waiting.
    pub(crate) fn poke(&mut self, driver: &mut Option<Driver>) {
        // What was drained then may have come since.
        self.shared.inbox.lock().drained = false;
        let waker = self.waker.clone();
        let mut cx = Context::from_waker(&waker);
        loop {
            self.woken.0.store(false, Ordering::Relaxed);
            poll_driver(driver, &mut cx);
            if driver.is_none() || !self.woken.0.load(Ordering::Acquire) {
                return;
            }
        }
    }

    /// The socket, for the protocol.
    pub(crate) fn socket(&self) -> Socket {
        Socket(self.shared.clone())
    }

    /// Waits until the server sends (or closes, or the socket fails), and keeps what it
    /// read for the protocol's next read. At most `left` and a ninth: the socket's read
    /// timeout is set again when `left` is longer than it or shorter by more than a tenth.
    fn wait(&mut self, left: Duration) -> io::Result<()> {
        let mut inbox = self.shared.inbox.lock();
        if inbox.start < inbox.end || inbox.ended.is_some() {
            // The protocol has not taken what is there yet (it waits for its other half).
            return Ok(());
        }
        let want = left.max(Duration::from_millis(1));
        if self.waits.is_none_or(|w| want > w || want < w.mul_f64(0.9)) {
            self.shared.stream.set_read_timeout(Some(want))?;
            self.waits = Some(want);
        }
        match rustix::net::recv(&self.shared.stream, &mut inbox.buf[..], RecvFlags::empty()) {
            Ok((0, _)) => inbox.ended = Some(Ok(())),
            Ok((n, _)) => (inbox.start, inbox.end, inbox.drained) = (0, n, n < READ_CHUNK),
            // The wait ran out, or a signal cut it short: the caller looks at its deadline
            // (a wait begun again with the whole read timeout could outlast it without end
            // under a stream of signals).
            Err(Errno::AGAIN | Errno::INTR) => {}
            Err(e) => inbox.ended = Some(Err(e.into())),
        }
        Ok(())
    }
}

/// Polls the connection's driver once; drops it when it has ended.
fn poll_driver(driver: &mut Option<Driver>, cx: &mut Context<'_>) {
    if let Some(d) = driver
        && let Poll::Ready(end) = d.as_mut().poll(cx)
    {
        if let Err(e) = end {
            log::debug!("dlm-postgres: a connection ended: {e}");
        }
        *driver = None;
    }
}

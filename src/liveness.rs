//! What keeps a client connection that hyper or the HTTP/2 front end serves (HTTP/2,
//! HTTP/1.1 after the fast path hands it over) from holding its slot for nothing (`docs/operations.md`,
//! "Limits"):
//!
//! - the **idle timeout**: a connection with no request open for that long is closed
//!   gracefully (`GOAWAY` on HTTP/2), and one that never opens a request (an HTTP/2
//!   preface and nothing more) too; HTTP/3 keeps the same [`IDLE_TIMEOUT`] in its own
//!   loop (QUIC's connection has no socket for the watchdog to read);
//! - the **send timeout**: a connection whose client takes no byte of an answer for that
//!   long is closed at once, and the backend slots its requests held are freed;
//! - a **grace** for a graceful close: a connection still open that long after one was
//!   asked for is closed at once.
//!
//! Neither hyper nor `h2` offers these: HTTP/2 keep-alive pings find a dead peer, not an
//! idle or a stalled one, and a response body no longer polled (the client's flow
//! control window is shut) looks like any other. So the connection keeps an
//! [`Activity`]: the requests open, the answers waiting on the client, and a count of
//! progress (bytes written, frames taken). A [`Watchdog`] beside the connection reads it
//! a few times per timeout; nothing on the request path reads a clock.
//!
//! [`Stopping`] is how every client connection, whichever front end serves it, learns
//! that the process stops, and whether the stop is a hand-over to a new process.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use crate::clock::Stamp;
use crate::deadline::Deadline;

/// How long a client connection may have no request open before it is closed
/// gracefully, on every front end: HTTP/1.1's keep-alive, HTTP/2 and HTTP/3 alike
/// (`docs/operations.md`, "Limits").
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client connection is doing, as its requests, answers and socket report it.
#[derive(Debug)]
pub(crate) struct Activity {
    /// Requests open: from the service call until the answer's body is done with.
    open: AtomicUsize,
    /// Answers whose body waits on the client: a frame handed to the front end (hyper,
    /// or the HTTP/2 front end), not taken yet.
    waiting: AtomicUsize,
    /// Moves with every request opened, every frame the front end takes, and (on HTTP/1.1)
    /// every byte written to the client.
    progress: AtomicU64,
    /// The connection speaks HTTP/2: its writes are not progress, since `h2` answers a
    /// client's PINGs and SETTINGS by itself, and a client that only sends those must
    /// still be idle, or stalled if it opens no window.
    h2: bool,
    /// The client's TCP socket (`-1`: none to ask), whose send queue shrinking is the
    /// client's progress too: a write can wait on a multi-megabyte kernel buffer while
    /// the client reads steadily ([`unsent`]).
    socket: i32,
}

impl Activity {
    /// A connection's, speaking HTTP/2 or not (its preface, or ALPN, tells), over the
    /// TCP socket `socket` (`-1`: none).
    pub(crate) fn new(h2: bool, socket: i32) -> Activity {
        Activity {
            open: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            progress: AtomicU64::new(0),
            h2,
            socket,
        }
    }

    /// A request begins: it is open until the returned guard (moved into its answer's
    /// body, [`Watched`]) goes.
    pub(crate) fn open(self: &Arc<Self>) -> Opened {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.progress.fetch_add(1, Ordering::Relaxed);
        Opened(Arc::clone(self))
    }

    /// Requests open now.
    #[cfg(test)]
    pub(crate) fn requests_open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    fn moved(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }

    fn reading(&self) -> Reading {
        let waiting = self.waiting.load(Ordering::Relaxed);
        Reading {
            open: self.open.load(Ordering::Relaxed),
            waiting,
            progress: self.progress.load(Ordering::Relaxed),
            // Asked only while an answer waits: an idle connection costs no system call.
            unsent: if waiting > 0 {
                unsent(self.socket)
            } else {
                None
            },
        }
    }
}

/// Bytes the kernel holds for the client on TCP socket `fd` and the client has not
/// acknowledged (`SIOCOUTQ`); `None` without a socket. When it shrinks the client is
/// reading, whether or not fulcrum's own write has been woken yet (the kernel wakes a
/// writer only once a third of its buffer is free: seconds or minutes for a slow
/// reader of a multi-megabyte buffer).
pub(crate) fn unsent(fd: i32) -> Option<u32> {
    if fd < 0 {
        return None;
    }
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ on a socket) writes one int through the pointer, which
    // points at `n`; `fd` is the connection's own socket, open while the connection (and
    // so the caller) lives. On a descriptor of another kind the call fails and writes
    // nothing.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    (r == 0 && n >= 0).then_some(n as u32)
}

/// A request's place in [`Activity::open`].
#[derive(Debug)]
pub(crate) struct Opened(Arc<Activity>);

impl Drop for Opened {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0.moved();
    }
}

/// An answer's body, watched: it waits on the client from the moment it is handed to
/// the front end until it is polled, and again after each frame until the next poll.
#[derive(Debug)]
pub(crate) struct Watched<B> {
    inner: B,
    waiting: bool,
    opened: Opened,
}

impl<B> Watched<B> {
    /// `inner`, the body of the answer to the request `opened` stands for.
    pub(crate) fn new(inner: B, opened: Opened) -> Watched<B> {
        opened.0.waiting.fetch_add(1, Ordering::Relaxed);
        Watched {
            inner,
            waiting: true,
            opened,
        }
    }

    fn taken(&mut self) {
        if self.waiting {
            self.waiting = false;
            self.opened.0.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl<B> Drop for Watched<B> {
    fn drop(&mut self) {
        self.taken();
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Watched<B> {
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.taken();
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &r {
            self.opened.0.moved();
            self.opened.0.waiting.fetch_add(1, Ordering::Relaxed);
            self.waiting = true;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A client's stream, its writes counted as progress on HTTP/1.1, and `held` (what the
/// connection takes of the process's limits) kept as long as the socket lives: into a
/// WebSocket tunnel too, where the socket goes once the upgrade is done.
#[derive(Debug)]
pub(crate) struct Tracked<S, H> {
    inner: S,
    activity: Arc<Activity>,
    _held: H,
}

impl<S, H> Tracked<S, H> {
    /// `inner`, reporting to `activity`, holding `held`.
    pub(crate) fn new(inner: S, activity: Arc<Activity>, held: H) -> Tracked<S, H> {
        Tracked {
            inner,
            activity,
            _held: held,
        }
    }

    fn wrote(&self, n: usize) {
        if n > 0 && !self.activity.h2 {
            self.activity.moved();
        }
    }
}

impl<S: AsyncRead + Unpin, H: Unpin> AsyncRead for Tracked<S, H> {
    #[inline]
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin, H: Unpin> AsyncWrite for Tracked<S, H> {
    #[inline]
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.wrote(*n);
        }
        r
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &r {
            self.wrote(*n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The connection's timeouts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// No request open this long: close gracefully.
    pub(crate) idle: Duration,
    /// An answer waiting on the client, and nothing taken, this long: close now.
    pub(crate) send: Duration,
}

/// What the watchdog found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No request open for the idle timeout.
    Idle,
    /// The client took nothing of an answer for the send timeout.
    Stalled,
}

/// One look at an [`Activity`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reading {
    open: usize,
    waiting: usize,
    progress: u64,
    /// The socket's [`unsent`] bytes, read while an answer waits.
    unsent: Option<u32>,
}

/// Reads a connection's [`Activity`] every quarter of the shorter timeout, and says when
/// one has run out: a state that held, with no progress, from one look to the next held
/// all the time between. So a timeout is noticed within a quarter of itself late, and a
/// connection costs one timer wake-up per quarter timeout whatever its traffic.
#[derive(Debug)]
pub(crate) struct Watchdog {
    activity: Arc<Activity>,
    timeouts: Timeouts,
    period: Duration,
    last: Reading,
    idle_for: Duration,
    stalled_for: Duration,
    /// When the next look is due: a lazily re-armed timer, polled only when due
    /// (`crate::deadline`), as the watchdog is polled whenever its connection is.
    tick: Deadline,
}

impl Watchdog {
    /// Watches `activity` from now.
    pub(crate) fn new(activity: Arc<Activity>, timeouts: Timeouts) -> Watchdog {
        let period = (timeouts.idle.min(timeouts.send) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(5));
        let last = activity.reading();
        Watchdog {
            activity,
            timeouts,
            period,
            last,
            idle_for: Duration::ZERO,
            stalled_for: Duration::ZERO,
            tick: Deadline::new(Stamp::now().after(period)),
        }
    }

    /// Resolves when a timeout has run out.
    pub(crate) async fn verdict(&mut self) -> Verdict {
        loop {
            self.tick.expired().await;
            self.tick.set(Stamp::now().after(self.period));
            if let Some(v) = self.look() {
                return v;
            }
        }
    }

    /// One look, a period after the last.
    fn look(&mut self) -> Option<Verdict> {
        let now = self.activity.reading();
        let drained = matches!((now.unsent, self.last.unsent), (Some(n), Some(l)) if n < l);
        let still = now.progress == self.last.progress && !drained;
        self.idle_for = match still && now.open == 0 && self.last.open == 0 {
            true => self.idle_for + self.period,
            false => Duration::ZERO,
        };
        self.stalled_for = match still && now.waiting > 0 && self.last.waiting > 0 {
            true => self.stalled_for + self.period,
            false => Duration::ZERO,
        };
        self.last = now;
        if self.stalled_for >= self.timeouts.send {
            Some(Verdict::Stalled)
        } else if self.idle_for >= self.timeouts.idle {
            Some(Verdict::Idle)
        } else {
            None
        }
    }
}

/// How a worker's connections learn that the process stops, and how.
#[derive(Debug, Clone)]
pub(crate) struct Stopping {
    rx: watch::Receiver<bool>,
    /// Set with the stop, for what checks it per request without the channel's lock.
    flag: Arc<AtomicBool>,
    /// The listening sockets went to a new process (`--upgrade`): a connection's next
    /// request is still answered (with `Connection: close`) and only connections idle
    /// for the idle timeout are closed, so that a request already on its way is never
    /// cut (`docs/architecture.md`, "Shutdown").
    handed_over: Arc<AtomicBool>,
}

impl Stopping {
    /// Watching `rx`; [`Self::stop`] sets the rest.
    pub(crate) fn new(rx: watch::Receiver<bool>) -> Stopping {
        Stopping {
            rx,
            flag: Arc::new(AtomicBool::new(false)),
            handed_over: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Stops every worker (`handed_over`: for a new process).
    pub(crate) fn stop(&self, tx: &watch::Sender<bool>, handed_over: bool) {
        self.handed_over.store(handed_over, Ordering::Relaxed);
        self.flag.store(true, Ordering::Relaxed);
        let _ = tx.send(true);
    }

    /// Whether the process stops: answers close their connections.
    pub(crate) fn is_stopping(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Whether the stop is a hand-over, which keeps idle connections to their timeout.
    pub(crate) fn is_handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Relaxed)
    }

    /// The channel, for a wait on the stop.
    pub(crate) fn receiver(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }
}

/// A future that never resolves when `None`.
pub(crate) async fn maybe<F: Future>(f: Option<F>) -> F::Output {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dog(activity: &Arc<Activity>) -> Watchdog {
        Watchdog::new(
            Arc::clone(activity),
            Timeouts {
                idle: Duration::from_secs(8),
                send: Duration::from_secs(4),
            },
        )
    }

    #[test]
    fn a_connection_without_requests_is_idle_after_the_idle_timeout() {
        let a = Arc::new(Activity::new(false, -1));
        let mut d = dog(&a);
        // A period is a quarter of the send timeout: 1 s. Eight looks make 8 s.
        for _ in 0..7 {
            assert_eq!(d.look(), None);
        }
        assert_eq!(d.look(), Some(Verdict::Idle));
        // A request resets it.
        let mut d = dog(&a);
        for _ in 0..5 {
            assert_eq!(d.look(), None);
        }
        let opened = a.open();
        drop(opened);
        // The look that sees the request starts the count again.
        for _ in 0..8 {
            assert_eq!(d.look(), None);
        }
        assert_eq!(d.look(), Some(Verdict::Idle));
    }

    #[test]
    fn an_answer_the_client_takes_nothing_of_is_stalled_after_the_send_timeout() {
        let a = Arc::new(Activity::new(true, -1));
        let body = Watched::new(http_body_util::Empty::<Bytes>::new(), a.open());
        assert_eq!(a.requests_open(), 1);
        let mut d = dog(&a);
        // Waiting on the client from the first look: four periods make 4 s.
        for _ in 0..3 {
            assert_eq!(d.look(), None);
        }
        assert_eq!(d.look(), Some(Verdict::Stalled));
        // Written bytes are progress.
        let mut d = dog(&a);
        for _ in 0..3 {
            assert_eq!(d.look(), None);
        }
        a.moved();
        for _ in 0..4 {
            assert_eq!(d.look(), None);
        }
        assert_eq!(d.look(), Some(Verdict::Stalled));
        // Once the body is gone nothing waits: the connection is idle, not stalled.
        drop(body);
        assert_eq!(a.requests_open(), 0);
        let mut d = dog(&a);
        for _ in 0..7 {
            assert_eq!(d.look(), None);
        }
        assert_eq!(d.look(), Some(Verdict::Idle));
    }

    #[tokio::test]
    async fn a_body_polled_again_no_longer_waits() {
        use http_body_util::BodyExt;
        let a = Arc::new(Activity::new(false, -1));
        let inner = http_body_util::Full::new(Bytes::from_static(b"abc"));
        let mut body = Watched::new(inner, a.open());
        assert_eq!(a.reading().waiting, 1);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "abc");
        assert_eq!(a.reading().waiting, 1, "the frame waits to be taken");
        assert!(body.frame().await.is_none());
        assert_eq!(a.reading().waiting, 0);
        drop(body);
        assert_eq!(a.reading().open, 0);
    }
}

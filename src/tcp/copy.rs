//! Bytes copied both ways between a client and a backend (`docs/tcp.md`, "Copying"):
//! each direction until its reader's end, passed on as a half-close; a reset on either
//! side resets the other; a connection silent both ways for `idle_timeout` is closed.
//!
//! Each direction reads into the worker's one scratch buffer and writes at once; only
//! what the other side cannot take yet is kept, in a buffer of the connection's own
//! until it is written. An idle connection holds no buffer at all, where
//! `tokio::io::copy_bidirectional` keeps two (`docs/performance.md`, "TCP").

use std::cell::RefCell;
use std::future::Future;
use std::io::{self, ErrorKind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::net::TcpStream;

use super::splice::Moved;
use crate::clock::Stamp;
use crate::pool::tcp_counts::TcpCounts;

/// The scratch buffer's size: one read moves at most this much.
const SCRATCH: usize = 64 * 1024;

thread_local! {
    /// The worker's scratch buffer (one thread, one runtime: a read and its write
    /// happen between two awaits, so no two directions share it at once).
    static BUFFER: RefCell<Vec<u8>> = RefCell::new(vec![0; SCRATCH]);
}

/// How a copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Both sides closed their direction.
    Closed,
    /// A side reset (or failed); the other was reset too.
    Reset,
    /// Nothing moved for the idle timeout.
    Idle,
    /// Cut at a stop's drain timeout, or after an upgrade at `tcp_drain_timeout`.
    Cut,
}

impl End {
    /// Its name in the access log.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::Reset => "reset",
            End::Idle => "idle",
            End::Cut => "cut",
        }
    }
}

/// What a copy moved, and how it ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Copied {
    /// Bytes from the client to the backend.
    pub(crate) up: u64,
    /// Bytes from the backend to the client.
    pub(crate) down: u64,
    /// How it ended.
    pub(crate) end: End,
}

/// One direction's count: the connection's own (for its log line) and its pool's
/// (for the metrics, as the bytes move).
struct Tally<'a> {
    mine: AtomicU64,
    pool: &'a TcpCounts,
    up: bool,
}

impl super::splice::Moved for Tally<'_> {
    fn add(&self, n: usize) {
        let n = n as u64;
        self.mine.fetch_add(n, Ordering::Relaxed);
        match self.up {
            true => self.pool.bytes(n, 0),
            false => self.pool.bytes(0, n),
        }
    }
}

/// Copies between `client` and `backend` until both directions have ended, one side
/// resets, nothing moves for `idle`, or `cut` comes; the bytes count in `pool` as they
/// move.
///
/// One state machine polls both directions, the idle timer and `cut`: a connection's
/// task holds two small [`Direction`]s and one timer, where two joined `async` loops
/// held a readiness future each, and a timer made afresh at every wake-up
/// (`docs/performance.md`, "TCP": the memory an idle connection costs).
pub(crate) async fn both_ways(
    (client, backend): (&TcpStream, &TcpStream),
    idle: Duration,
    pool: &TcpCounts,
    cut: impl Future<Output = ()>,
) -> Copied {
    let tally = |up| Tally {
        mine: AtomicU64::new(0),
        pool,
        up,
    };
    let (up_count, down_count) = (tally(true), tally(false));
    let last = AtomicU64::new(Stamp::now().ns());
    let ended = AtomicBool::new(false);
    let (mut up, mut down) = (Direction::default(), Direction::default());
    let quiet = tokio::time::sleep(idle);
    tokio::pin!(cut, quiet);
    let end = std::future::poll_fn(|cx| {
        if cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Cut);
        }
        let shared = (&last, &ended);
        let up = up.poll(cx, (client, backend), &up_count, shared);
        let down = down.poll(cx, (backend, client), &down_count, shared);
        match (up, down) {
            // The first error ends both directions: the other may wait for a peer
            // that has nothing more to say.
            (Poll::Ready(Err(_)), _) | (_, Poll::Ready(Err(_))) => Poll::Ready(End::Reset),
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => Poll::Ready(End::Closed),
            _ => idle_over(cx, quiet.as_mut(), &last, idle),
        }
    })
    .await;
    if end != End::Closed {
        // Dropping the sockets then sends a reset, not an orderly close: neither end
        // takes a cut connection for a finished one.
        reset_on_close(client);
        reset_on_close(backend);
    }
    Copied {
        up: up_count.mine.load(Ordering::Relaxed),
        down: down_count.mine.load(Ordering::Relaxed),
        end,
    }
}

/// `Ready(End::Idle)` once nothing has moved for `idle`; until then the timer is set
/// for `idle` after the last move.
fn idle_over(
    cx: &mut Context<'_>,
    mut quiet: Pin<&mut tokio::time::Sleep>,
    last: &AtomicU64,
    idle: Duration,
) -> Poll<End> {
    while quiet.as_mut().poll(cx).is_ready() {
        let since = Stamp::from_ns(last.load(Ordering::Relaxed));
        if Stamp::now().since(since) >= idle {
            return Poll::Ready(End::Idle);
        }
        quiet.as_mut().reset(since.after(idle).to_tokio());
    }
    Poll::Pending
}

/// A bulk direction's copy by `splice`, boxed: only a bulk connection pays for its room.
type Bulk<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>>;

/// One direction of a copy: what the writer could not take yet, the full reads in a
/// row, and, once bulk, the `splice` loop.
#[derive(Default)]
struct Direction<'a> {
    /// Bytes read but not written yet, and how far their writing got.
    rest: Option<(Box<[u8]>, usize)>,
    /// Full scratch-buffer reads in a row.
    full: u32,
    /// The rest of the copy by `splice`, once bulk.
    bulk: Option<Bulk<'a>>,
    /// The direction has ended (its reader's end was passed on).
    done: bool,
}

impl<'a> Direction<'a> {
    /// Copies from `from` to `to` until `from` ends, then half-closes `to` (see
    /// `splice::finish`); an error on either side ends it with the error. After
    /// [`BULK_READS`] full reads in a row the rest goes by `splice` (`super::splice`).
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        (from, to): (&'a TcpStream, &'a TcpStream),
        moved: &'a Tally<'a>,
        (last, ended): (&'a AtomicU64, &'a AtomicBool),
    ) -> Poll<io::Result<()>> {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            if let Some(bulk) = &mut self.bulk {
                let got = ready!(bulk.as_mut().poll(cx));
                self.done = true;
                return Poll::Ready(got);
            }
            ready!(self.poll_rest(cx, to, last))?;
            if self.full >= BULK_READS {
                self.full = 0;
                if let Some(pipe) = super::splice::Pipe::new() {
                    let rest = super::splice::rest(from, to, pipe, moved, (last, ended));
                    self.bulk = Some(Box::pin(rest));
                    continue;
                }
            }
            // Readiness polled this way spends tokio's budget: a connection whose peer
            // keeps up still lets the worker's other tasks run.
            ready!(from.poll_read_ready(cx))?;
            let (read, rest) = match read_and_write(from, to) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
                Ok(step) => step,
            };
            if read == 0 {
                self.done = true;
                return Poll::Ready(super::splice::finish(to, ended));
            }
            moved.add(read);
            last.store(Stamp::now().ns(), Ordering::Relaxed);
            self.rest = rest.map(|r| (r.into_boxed_slice(), 0));
            self.full = if read == SCRATCH { self.full + 1 } else { 0 };
        }
    }

    /// Writes what `to` could not take at once, as it makes room.
    fn poll_rest(
        &mut self,
        cx: &mut Context<'_>,
        to: &TcpStream,
        last: &AtomicU64,
    ) -> Poll<io::Result<()>> {
        while let Some((rest, at)) = &mut self.rest {
            if *at == rest.len() {
                self.rest = None;
                break;
            }
            ready!(to.poll_write_ready(cx))?;
            match to.try_write(&rest[*at..]) {
                Ok(n) => {
                    *at += n;
                    last.store(Stamp::now().ns(), Ordering::Relaxed);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Full scratch-buffer reads in a row after which a direction is bulk and goes by
/// `splice` (256 KiB moved).
const BULK_READS: u32 = 4;

/// One read from `from` into the scratch buffer, written to `to` at once (see
/// [`move_once`]). A read shorter than the buffer took everything there was: `from`'s
/// readiness is cleared then, as tokio's own `poll_read` does, so the next wait does not
/// begin with a read that finds nothing. Cleared inside `try_io`, whose look at the
/// readiness comes before the read: an event newer than that stays.
fn read_and_write(from: &TcpStream, to: &TcpStream) -> io::Result<(usize, Option<Vec<u8>>)> {
    let mut step = None;
    let cleared = from.try_io(tokio::io::Interest::READABLE, || {
        let moved = BUFFER.with(|b| move_once(from, to, &mut b.borrow_mut()))?;
        let short = moved.0 > 0 && moved.0 < SCRATCH;
        step = Some(moved);
        match short {
            true => Err(ErrorKind::WouldBlock.into()),
            false => Ok(()),
        }
    });
    match (cleared, step) {
        (_, Some(step)) => Ok(step),
        (Err(e), None) => Err(e),
        (Ok(()), None) => Err(ErrorKind::WouldBlock.into()),
    }
}

/// One read from `from` into `buf`, written to `to` at once: how much was read, and
/// what `to` could not take yet (copied out of the scratch buffer).
fn move_once(
    from: &TcpStream,
    to: &TcpStream,
    buf: &mut [u8],
) -> io::Result<(usize, Option<Vec<u8>>)> {
    let n = from.try_read(buf)?;
    if n == 0 {
        return Ok((0, None));
    }
    let written = match to.try_write(&buf[..n]) {
        Ok(w) => w,
        Err(e) if e.kind() == ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    Ok((n, (written < n).then(|| buf[written..n].to_vec())))
}

/// Has closing `s` send a reset (`SO_LINGER` 0).
pub(crate) fn reset_on_close(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two connected sockets, the accepting listener with `TCP_NODELAY` set as the
    /// TCP listeners' are: the accepted end, the connecting end.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket2::SockRef::from(&listener)
            .set_tcp_nodelay(true)
            .unwrap();
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let there = TcpStream::connect(listener.local_addr().unwrap());
        let (here, there) = tokio::join!(listener.accept(), there);
        (here.unwrap().0, there.unwrap())
    }

    #[tokio::test]
    async fn an_accepted_connection_inherits_nodelay_from_its_listener() {
        let (accepted, _) = pair().await;
        assert!(accepted.nodelay().unwrap());
    }

    #[tokio::test]
    async fn an_idle_copy_holds_little() {
        let (a, b) = pair().await;
        let counts = TcpCounts::default();
        let copy = both_ways(
            (&a, &b),
            Duration::from_secs(1),
            &counts,
            std::future::pending(),
        );
        // Each idle connection's task carries this state (`docs/performance.md`, "TCP").
        let size = std::mem::size_of_val(&copy);
        assert!(size <= 512, "the copy's state is {size} bytes");
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_and_the_half_close_is_passed_on() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ((mut client, proxy_client), (proxy_backend, mut backend)) =
            (pair().await, pair().await);
        let copy = async move {
            let counts = TcpCounts::default();
            let ends = (&proxy_client, &proxy_backend);
            let copied = both_ways(
                ends,
                Duration::from_secs(5),
                &counts,
                std::future::pending(),
            );
            let copied = copied.await;
            // Closing both sends the FIN the last direction's end left to the close.
            drop((proxy_client, proxy_backend));
            copied
        };
        let (mut to_client, mut from_client) = client.split();
        let sending = async {
            from_client.write_all(&[7; 200_000]).await.unwrap();
            from_client.shutdown().await.unwrap();
        };
        let backend_side = async {
            let mut got = Vec::new();
            backend.read_to_end(&mut got).await.unwrap();
            // The client's half-close came through: the backend answers after it.
            backend.write_all(b"done").await.unwrap();
            backend.shutdown().await.unwrap();
            got.len()
        };
        let ends = async {
            let (_, up) = tokio::join!(sending, backend_side);
            let mut answer = Vec::new();
            to_client.read_to_end(&mut answer).await.unwrap();
            (up, answer)
        };
        let (copied, (up, answer)) = tokio::join!(copy, ends);
        assert_eq!((up, answer.as_slice()), (200_000, &b"done"[..]));
        assert_eq!(
            (copied.up, copied.down, copied.end),
            (200_000, 4, End::Closed)
        );
    }
}

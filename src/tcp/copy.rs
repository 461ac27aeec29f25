//! Bytes copied both ways between a client and a backend (`docs/tcp.md`, "Copying"):
//! each direction until its reader's end, passed on as a half-close; a reset on either
//! side resets the other; a connection silent both ways for `idle_timeout` is closed.
//!
//! Each direction reads into the worker's one scratch buffer and writes at once; only
//! what the other side cannot take yet is kept, in a buffer of the connection's own
//! until it is written. An idle connection holds no buffer at all, where
//! `tokio::io::copy_bidirectional` keeps two (`docs/performance.md`, "TCP").

use std::cell::RefCell;
use std::io::{self, ErrorKind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpStream;

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
pub(super) struct Tally<'a> {
    mine: AtomicU64,
    pool: &'a TcpCounts,
    up: bool,
}

impl Tally<'_> {
    /// `n` more bytes moved.
    pub(super) fn add(&self, n: usize) {
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
pub(crate) async fn both_ways(
    (client, backend): (&TcpStream, &TcpStream),
    idle: Duration,
    pool: &TcpCounts,
    cut: impl std::future::Future<Output = ()>,
) -> Copied {
    let tally = |up| Tally {
        mine: AtomicU64::new(0),
        pool,
        up,
    };
    let (up, down) = (tally(true), tally(false));
    let last = AtomicU64::new(Stamp::now().ns());
    let ended = AtomicBool::new(false);
    let copying = async {
        // The first error ends both directions: the other may wait for a peer that
        // has nothing more to say.
        let both = tokio::try_join!(
            pump(client, backend, &up, (&last, &ended)),
            pump(backend, client, &down, (&last, &ended))
        );
        match both {
            Ok(_) => End::Closed,
            Err(_) => End::Reset,
        }
    };
    tokio::pin!(copying, cut);
    let end = loop {
        let since = Stamp::from_ns(last.load(Ordering::Relaxed));
        tokio::select! {
            end = &mut copying => break end,
            _ = &mut cut => break End::Cut,
            _ = tokio::time::sleep_until(since.after(idle).to_tokio()) => {
                let quiet = Stamp::now().since(Stamp::from_ns(last.load(Ordering::Relaxed)));
                if quiet >= idle {
                    break End::Idle;
                }
            }
        }
    };
    if end != End::Closed {
        // Dropping the sockets then sends a reset, not an orderly close: neither end
        // takes a cut connection for a finished one.
        reset_on_close(client);
        reset_on_close(backend);
    }
    Copied {
        up: up.mine.load(Ordering::Relaxed),
        down: down.mine.load(Ordering::Relaxed),
        end,
    }
}

/// Copies from `from` to `to` until `from` ends, then half-closes `to` unless the other
/// direction has ended already (`ended`: then closing both sends the FIN, one
/// `shutdown` fewer); an error on either side ends it with the error. After
/// [`BULK_READS`] full reads in a row the rest goes by `splice` (`super::splice`).
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    moved: &Tally<'_>,
    (last, ended): (&AtomicU64, &AtomicBool),
) -> io::Result<()> {
    let mut full = 0;
    loop {
        from.readable().await?;
        // Socket readiness spends none of tokio's budget: without this, a connection
        // whose peer keeps up would never let the worker's other tasks run.
        tokio::task::coop::consume_budget().await;
        let (read, rest) = match read_and_write(from, to) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
            Ok(step) => step,
        };
        if read == 0 {
            if ended.swap(true, Ordering::Relaxed) {
                return Ok(());
            }
            return socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
        }
        moved.add(read);
        last.store(Stamp::now().ns(), Ordering::Relaxed);
        if let Some(rest) = rest {
            write_rest(to, &rest, last).await?;
        }
        full = if read == SCRATCH { full + 1 } else { 0 };
        if full == BULK_READS {
            if let Some(pipe) = super::splice::Pipe::new() {
                let count = |n| moved.add(n);
                // Boxed: only a bulk connection pays for the splice loop's state, not
                // every idle one.
                let rest = super::splice::rest(from, to, pipe, &count, (last, ended));
                return Box::pin(rest).await;
            }
        }
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

/// Writes what `to` could not take at once, as it makes room.
async fn write_rest(to: &TcpStream, rest: &[u8], last: &AtomicU64) -> io::Result<()> {
    let mut at = 0;
    while at < rest.len() {
        to.writable().await?;
        match to.try_write(&rest[at..]) {
            Ok(n) => {
                at += n;
                last.store(Stamp::now().ns(), Ordering::Relaxed);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Has closing `s` send a reset (`SO_LINGER` 0).
pub(crate) fn reset_on_close(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
}

//! Zero-copy for bulk transfers (`docs/performance.md`, "TCP"): once a direction moves
//! whole scratch buffers in a row, its bytes go socket → pipe → socket with `splice(2)`
//! and never through this process's memory. Measured: the CPU a mebibyte costs falls by
//! about 40 %; a connection that moves little never makes a pipe (a pipe costs two
//! descriptors and two syscalls to make and close, which short connections would pay
//! for nothing). No crate wraps `splice` for tokio's sockets; this is the call, the
//! pipe that owns its two descriptors, and the readiness handling around them.

use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::clock::Stamp;
use crate::descriptors::{self, Descriptor};

/// The most one `splice` moves: what a default pipe holds (16 pages).
const CHUNK: usize = 64 * 1024;

/// A pipe and its two descriptors' share of the budget.
pub(super) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    _budget: (Descriptor, Descriptor),
}

impl Pipe {
    /// A non-blocking pipe, when two descriptors of the budget are free and the kernel
    /// makes one; `None`: the copy goes on through the scratch buffer.
    pub(super) fn new() -> Option<Pipe> {
        let budget = (descriptors::try_take()?, descriptors::try_take()?);
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: both descriptors were just made and belong to nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Some(Pipe {
            read,
            write,
            _budget: budget,
        })
    }
}

/// One `splice` from `from` to `to` (either a socket or a pipe end), at most `len`
/// bytes, without blocking.
fn splice(from: i32, to: i32, len: usize) -> io::Result<usize> {
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    // SAFETY: both are open descriptors this process owns while the call runs; no
    // offsets are passed (sockets and pipes have none).
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            flags,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// What is told of the bytes a direction moved (its counts).
pub(super) trait Moved: Sync {
    /// `n` more bytes moved.
    fn add(&self, n: usize);
}

/// A direction's reader ended: `to` is half-closed, unless the other direction has
/// ended already (`ended`: then closing both sends the FIN, one `shutdown` fewer).
pub(super) fn finish(to: &TcpStream, ended: &AtomicBool) -> io::Result<()> {
    if ended.swap(true, Ordering::Relaxed) {
        return Ok(());
    }
    socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write)
}

/// Copies the rest of `from` to `to` through `pipe`, as `copy::Direction` would: each write
/// told to `moved`, the time of the last byte in `last`, the half-close at `from`'s end
/// unless the other direction `ended` first.
pub(super) async fn rest(
    from: &TcpStream,
    to: &TcpStream,
    pipe: Pipe,
    moved: &dyn Moved,
    (last, ended): (&AtomicU64, &AtomicBool),
) -> io::Result<()> {
    loop {
        from.readable().await?;
        tokio::task::coop::consume_budget().await;
        let got = from.try_io(Interest::READABLE, || {
            splice(from.as_raw_fd(), pipe.write.as_raw_fd(), CHUNK)
        });
        let n = match got {
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
            Ok(n) => n,
        };
        if n == 0 {
            return finish(to, ended);
        }
        // The pipe is emptied before the next read: nothing waits in it across reads.
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            let put = to.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_raw_fd(), to.as_raw_fd(), left)
            });
            match put {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
                Ok(w) => {
                    left -= w;
                    // Counted as written: a slow reader is not idle while it reads.
                    moved.add(w);
                    last.store(Stamp::now().ns(), Ordering::Relaxed);
                }
            }
        }
    }
}

//! Logs on stderr through `tracing`, with the access log batched on the request path
//! (on stderr too, or in a file of its own: `docs/install.md`, "Logs").
//!
//! A worker thread writes its log lines into a buffer of its own and hands them to
//! stderr in one `write(2)` of whole lines once 4 KiB have gathered, or at the worker's
//! next heartbeat (at most 100 ms later), or when the worker stops. Every other thread
//! (admin, health checks, start-up and shutdown) writes each line at once.
//!
//! Written here rather than taken from `tracing-appender`: its non-blocking writer moves
//! every line through a channel to a thread of its own (an allocation, a send and often
//! a wake-up per line), which costs more CPU per request than the write it saves. A
//! thread-local buffer costs a copy. Whole lines of at most 4 KiB (`PIPE_BUF`) per write
//! also keep lines from different threads from interleaving on a pipe.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::config::LogFormat;

/// Bytes gathered before a worker writes them out.
const BATCH: usize = 4096;

thread_local! {
    /// `Some` on threads that batch (the proxy's workers).
    static BUFFER: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
    /// The access lines of a batching thread while the access log has a file.
    static ACCESS: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// The access log's file, when it has one: its path (to reopen it) and the open file.
/// Locked once per batch written (4 KiB of lines, or a heartbeat), never per request.
static ACCESS_FILE: Mutex<Option<(PathBuf, File)>> = Mutex::new(None);

/// Whether access lines go to [`ACCESS_FILE`] rather than stderr.
static TO_FILE: AtomicBool = AtomicBool::new(false);

fn open_append(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Sends the access log to `path` (appended to, made if missing) from now on; the
/// message names the path when it cannot be opened.
pub(crate) fn access_to_file(path: &Path) -> Result<(), String> {
    let file = open_append(path)
        .map_err(|e| format!("access_log: cannot write '{}': {e}", path.display()))?;
    *lock_file() = Some((path.to_path_buf(), file));
    TO_FILE.store(true, Ordering::Release);
    Ok(())
}

/// Opens the access log's file again under its path (`SIGUSR1`, after a rotation moved
/// it): lines written so far stay in the old file, whole, and the next go to the new
/// one. When the new one cannot be opened, the old one is kept and the error returned.
/// `false`: the access log has no file.
pub(crate) fn reopen_access_file() -> Result<bool, String> {
    let mut slot = lock_file();
    let Some((path, file)) = slot.as_mut() else {
        return Ok(false);
    };
    let fresh = open_append(path).map_err(|e| {
        format!(
            "access_log: cannot reopen '{}': {e}; still writing to the old file",
            path.display()
        )
    })?;
    *file = fresh;
    Ok(true)
}

fn lock_file() -> MutexGuard<'static, Option<(PathBuf, File)>> {
    // Nothing panics while holding it.
    ACCESS_FILE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes the current thread batch its log lines (a proxy worker).
pub(crate) fn batch_this_thread() {
    BUFFER.with(|b| *b.borrow_mut() = Some(Vec::with_capacity(BATCH)));
    ACCESS.with(|b| *b.borrow_mut() = Some(Vec::with_capacity(BATCH)));
}

/// Writes out what the current thread has gathered.
pub(crate) fn flush_this_thread() {
    BUFFER.with(|b| {
        if let Some(buf) = b.borrow_mut().as_mut() {
            write_out(buf);
        }
    });
    ACCESS.with(|b| {
        if let Some(buf) = b.borrow_mut().as_mut() {
            write_access(buf);
        }
    });
}

fn write_out(buf: &mut Vec<u8>) {
    if !buf.is_empty() {
        // Nothing sensible is left to do when stderr itself fails.
        let _ = std::io::stderr().lock().write_all(buf);
        buf.clear();
    }
}

/// Writes access lines to the access log's file, in one `write(2)` (appending, so a
/// line is never split, whoever else writes).
fn write_access(buf: &mut Vec<u8>) {
    if buf.is_empty() {
        return;
    }
    if let Some((_, file)) = lock_file().as_mut() {
        // A full disk loses these lines, not the request: nothing else to do here.
        let _ = file.write_all(buf);
    }
    buf.clear();
}

/// Appends one access log line, formatted straight into the batch: with the other logs
/// on stderr, or in the access log's own batch when it has a file.
pub(crate) fn write_access_line(fill: impl FnOnce(&mut Vec<u8>)) {
    if TO_FILE.load(Ordering::Relaxed) {
        batched(&ACCESS, fill, write_access);
    } else {
        batched(&BUFFER, fill, write_out);
    }
}

/// `fill`s the line into `batch` and writes the batch out with `out` past [`BATCH`]
/// bytes; a thread that does not batch writes the line at once.
fn batched(
    batch: &'static std::thread::LocalKey<RefCell<Option<Vec<u8>>>>,
    fill: impl FnOnce(&mut Vec<u8>),
    out: fn(&mut Vec<u8>),
) {
    batch.with(|b| {
        let mut b = b.borrow_mut();
        match b.as_mut() {
            Some(buf) => {
                let before = buf.len();
                fill(buf);
                if buf.len() > BATCH {
                    // Write what was gathered before this line, then keep the line.
                    let line = buf.split_off(before);
                    out(buf);
                    buf.extend_from_slice(&line);
                    if buf.len() > BATCH {
                        out(buf);
                    }
                }
            }
            None => {
                let mut line = Vec::with_capacity(256);
                fill(&mut line);
                out(&mut line);
            }
        }
    });
}

/// The writer `tracing-subscriber` formats each event into.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stderr;

impl Write for Stderr {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let batched = BUFFER.with(|b| {
            let mut b = b.borrow_mut();
            let Some(buf) = b.as_mut() else {
                return false;
            };
            if buf.len() + data.len() > BATCH {
                write_out(buf);
            }
            if data.len() > BATCH {
                write_out(&mut data.to_vec());
            } else {
                buf.extend_from_slice(data);
            }
            true
        });
        if !batched {
            std::io::stderr().lock().write_all(data)?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Stderr;

    fn make_writer(&'a self) -> Stderr {
        Stderr
    }
}

/// Installs the global subscriber: level from `FULCRUM_LOG` (default `info`), the given
/// format, lines on stderr.
pub(crate) fn init(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("FULCRUM_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => b.with_ansi(false).try_init(),
        LogFormat::Json => b.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batching_thread_keeps_lines_until_flushed() {
        std::thread::spawn(|| {
            batch_this_thread();
            let mut w = Stderr;
            w.write_all(b"one line\n").unwrap();
            let held = BUFFER.with(|b| b.borrow().as_ref().map(Vec::len));
            assert_eq!(held, Some(9));
            // A line that would overflow the batch sends what was gathered first.
            w.write_all(&[b'x'; BATCH - 4]).unwrap();
            let held = BUFFER.with(|b| b.borrow().as_ref().map(Vec::len));
            assert_eq!(held, Some(BATCH - 4));
            flush_this_thread();
            let held = BUFFER.with(|b| b.borrow().as_ref().map(Vec::len));
            assert_eq!(held, Some(0));
        })
        .join()
        .unwrap();
        // Other threads do not batch.
        assert!(BUFFER.with(|b| b.borrow().is_none()));
    }
}

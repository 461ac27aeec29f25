//! Logs on stderr through `tracing`, with the access log batched on the request path.
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
use std::io::Write;

use crate::config::LogFormat;

/// Bytes gathered before a worker writes them out.
const BATCH: usize = 4096;

thread_local! {
    /// `Some` on threads that batch (the proxy's workers).
    static BUFFER: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Makes the current thread batch its log lines (a proxy worker).
pub(crate) fn batch_this_thread() {
    BUFFER.with(|b| *b.borrow_mut() = Some(Vec::with_capacity(BATCH)));
}

/// Writes out what the current thread has gathered.
pub(crate) fn flush_this_thread() {
    BUFFER.with(|b| {
        if let Some(buf) = b.borrow_mut().as_mut() {
            write_out(buf);
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

/// Appends one line to the current thread's batch through `fill` (or, on a thread that
/// does not batch, writes it at once). The access log formats straight into the batch.
pub(crate) fn write_line(fill: impl FnOnce(&mut Vec<u8>)) {
    BUFFER.with(|b| {
        let mut b = b.borrow_mut();
        match b.as_mut() {
            Some(buf) => {
                let before = buf.len();
                fill(buf);
                if buf.len() > BATCH {
                    // Write what was gathered before this line, then keep the line.
                    let line = buf.split_off(before);
                    write_out(buf);
                    buf.extend_from_slice(&line);
                    if buf.len() > BATCH {
                        write_out(buf);
                    }
                }
            }
            None => {
                let mut line = Vec::with_capacity(256);
                fill(&mut line);
                write_out(&mut line);
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

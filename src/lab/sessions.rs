//! The `long-lived` scenario's load (`docs/lab.md`, "long-lived"): the schedule's
//! times are connections opened through a TCP pool, each a session of queries sent one
//! after the other (`demo/tcp_backend.rs` answers each with its name). Every query is
//! a sample, timed from when it was sent; a connection refused or broken is one failed
//! sample.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

use super::load::{run_schedule, Sample, Samples, Schedule, REQUEST_TIMEOUT};
use super::Phase;

/// Opens the schedule's connections to `target` (127.0.0.1 only), each at its time,
/// each sending `queries` queries; every query's outcome, or `None` when the lab was
/// asked to stop.
pub(crate) async fn drive(
    target: SocketAddr,
    schedule: &Schedule,
    start: Instant,
    queries: u32,
    tick: &mut dyn FnMut(Phase, Duration),
) -> Result<Option<Vec<Sample>>, String> {
    if target.ip() != std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST) {
        return Err(format!(
            "the lab sends traffic to 127.0.0.1 only, not {target}"
        ));
    }
    let each = move |at, key, tx: Samples| async move {
        let sample = |sent: Instant, ok, backend| Sample {
            at: sent - start,
            latency: sent.elapsed(),
            ok,
            backend,
            key,
        };
        let mut on = session(target, queries, start + at);
        while let Some((sent, answer)) = on.next().await {
            let failed = answer.is_none();
            let _ = tx.send(sample(sent, !failed, answer));
            if failed {
                break;
            }
        }
    };
    let expected = schedule.sends.len() * queries as usize;
    Ok(run_schedule(schedule, start, expected, tick, each).await)
}

/// One session's connection and how far it has gone.
struct Session {
    target: SocketAddr,
    left: u32,
    /// When the connection was due: the first query's time.
    due: Instant,
    conn: Option<BufReader<tokio::net::TcpStream>>,
}

fn session(target: SocketAddr, queries: u32, due: Instant) -> Session {
    Session {
        target,
        left: queries,
        due,
        conn: None,
    }
}

impl Session {
    /// The next query's time and the backend that answered it; `None` (the answer)
    /// when the connection could not be made or broke; nothing after the last.
    async fn next(&mut self) -> Option<(Instant, Option<String>)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let sent = match self.conn {
            None => self.due,
            Some(_) => Instant::now(),
        };
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, self.query()).await;
        let answer = answer.ok().flatten();
        if answer.is_none() {
            self.left = 0;
        }
        Some((sent, answer))
    }

    /// One query on the connection (made first if need be): the name that answered.
    async fn query(&mut self) -> Option<String> {
        if self.conn.is_none() {
            let s = tokio::net::TcpStream::connect(self.target).await.ok()?;
            let _ = s.set_nodelay(true);
            self.conn = Some(BufReader::new(s));
        }
        let conn = self.conn.as_mut()?;
        conn.get_mut().write_all(b"q\n").await.ok()?;
        let mut line = String::new();
        conn.read_line(&mut line).await.ok()?;
        let name = line.strip_suffix('\n')?;
        Some(name.to_string())
    }
}

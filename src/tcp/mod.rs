//! **TCP pools' connections** (`docs/tcp.md`): a connection from a `[[tcp_listeners]]`
//! socket, or a TLS connection passed through by its server name, is one request to its
//! pool — the strategy picks a backend for it (the hash key is the client IP), it holds
//! the backend's in-flight slot (and waits in the §9 queue at `max_conns`) until it
//! ends, its connect time is the backend's latency, and a failed connect counts against
//! the backend and is tried again on another (HAProxy's `option redispatch`), within the
//! pool's `retries`. Then bytes are copied both ways (`copy`) and one access log line
//! is written.

pub(crate) mod copy;
pub(crate) mod hello;
pub(crate) mod passthrough;
mod splice;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::backend::RequestGuard;
use crate::clock::Stamp;
use crate::descriptors::{self, Descriptor};
use crate::pool::{Ask, NoPick, Pool, QueueError, Turn};
use crate::proxy::record::{write_tcp_line, TcpRecord};

/// The two ends of a client connection: the client (as a PROXY header may name it) and
/// the address it reached.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ends {
    /// The client.
    pub(crate) client: SocketAddr,
    /// The address it connected to.
    pub(crate) reached: SocketAddr,
}

/// A backend connection made for a client connection.
struct Connected {
    stream: TcpStream,
    guard: RequestGuard,
    /// The backend connection's share of the descriptor budget.
    _fd: Descriptor,
    took: Duration,
}

/// Serves `client`, a connection for `pool`, until it ends or `cut` comes; `log`: the
/// access log's format, if it is on.
pub(crate) async fn serve(
    client: TcpStream,
    ends: Ends,
    pool: Arc<Pool>,
    log: Option<crate::config::AccessFormat>,
    cut: impl std::future::Future<Output = ()>,
) {
    let started = Stamp::now();
    pool.tcp.connection();
    let record = |backend: Option<&str>, copied: Option<copy::Copied>, connect, end| {
        if let Some(format) = log {
            let r = TcpRecord {
                client: ends.client.ip(),
                pool: &pool.name,
                backend,
                bytes_in: copied.map_or(0, |c| c.up),
                bytes_out: copied.map_or(0, |c| c.down),
                connect,
                duration: Stamp::now().since(started),
                end,
            };
            write_tcp_line(format, &r);
        }
    };
    let c = match connect(&pool, &ends).await {
        Ok(c) => c,
        Err(why) => {
            copy::reset_on_close(&client);
            return record(None, None, None, why);
        }
    };
    let idle = pool.settings.idle_timeout;
    let copied = copy::both_ways((&client, &c.stream), idle, &pool.tcp, cut).await;
    let backend = c.guard.backend();
    record(
        Some(&backend.name),
        Some(copied),
        Some(c.took),
        copied.end.as_str(),
    );
}

/// A connection to a backend of `pool` for the client of `ends`: the strategy's pick,
/// with its slot (waiting in the queue when every backend is at `max_conns`), then
/// another backend after a failed connect, up to `retries` more. `Err` names why none
/// was made, as the access log says it.
async fn connect(pool: &Pool, ends: &Ends) -> Result<Connected, &'static str> {
    let (mut tried, mut key) = (Vec::new(), None);
    let (mut deadline, mut ticket) = (None, None);
    let mut tries = pool.settings.retries + 1;
    while tries > 0 {
        let seen = pool.queue.epoch();
        let ask = Ask {
            sticky: None,
            tried: &mut tried,
            fresh: tries == pool.settings.retries + 1 && ticket.is_none(),
            key: &mut key,
        };
        let guard = match pool.acquire(ask, |_| crate::strategy::key::ip_key(ends.client.ip())) {
            Ok(got) => got.guard,
            // Nothing left after a failed connect: that failure is the reason.
            Err(NoPick::Nothing) if !tried.is_empty() => return Err("connect_failed"),
            Err(NoPick::Nothing) => return Err("no_backend"),
            Err(NoPick::Full(preferred)) => {
                let turn = Turn {
                    preferred,
                    seen,
                    ticket,
                };
                match pool.wait_turn(turn, &mut deadline).await {
                    Ok(place) => ticket = place.or(ticket),
                    Err(QueueError::Full) => return Err("queue_full"),
                    Err(QueueError::Timeout) => return Err("queue_timeout"),
                }
                continue;
            }
        };
        deadline = None;
        tries -= 1;
        tried.push(guard.backend().id);
        match dial(guard, ends).await {
            Ok(c) => return Ok(c),
            Err(Failure::NoDescriptor) => return Err("no_descriptor"),
            Err(Failure::Connect) => {}
        }
    }
    Err("connect_failed")
}

/// Why a dial made no connection.
enum Failure {
    /// The backend refused, or did not answer in time (counted against it).
    Connect,
    /// The descriptor budget is spent.
    NoDescriptor,
}

/// Connects to the backend `guard` holds a slot of, within its connect timeout, and
/// sends the PROXY header first when its pool does; the connect time is its latency, a
/// failure counts against it (passive health).
async fn dial(mut guard: RequestGuard, ends: &Ends) -> Result<Connected, Failure> {
    let fd = descriptors::try_take().ok_or(Failure::NoDescriptor)?;
    let b = Arc::clone(guard.backend());
    let started = Stamp::now();
    let connecting = async {
        let mut s = match b.socket_addr {
            Some(addr) => TcpStream::connect(addr).await?,
            None => TcpStream::connect(b.authority.as_str()).await?,
        };
        if let Some(v) = b.transport.send_proxy {
            let header = crate::proxy_protocol::header(v, ends.client, ends.reached);
            tokio::io::AsyncWriteExt::write_all(&mut s, &header).await?;
        }
        Ok::<_, std::io::Error>(s)
    };
    match tokio::time::timeout(b.connect_timeout, connecting).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            let now = Stamp::now();
            let took = now.since(started);
            crate::strategy::record_latency_at(&b, took, now.ns());
            guard.outcome(true);
            Ok(Connected {
                stream,
                guard,
                _fd: fd,
                took,
            })
        }
        Ok(Err(e)) => {
            tracing::debug!(backend = %b.name, error = %e, "TCP connect failed");
            guard.fail();
            guard.outcome(false);
            Err(Failure::Connect)
        }
        Err(_) => {
            tracing::debug!(backend = %b.name, "TCP connect timed out");
            guard.fail();
            guard.outcome(false);
            Err(Failure::Connect)
        }
    }
}

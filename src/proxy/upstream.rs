//! Keep-alive connections to backends, one pool per worker: HTTP/1.1 connections, one
//! exchange at a time each, and HTTP/2 connections (`protocol = "h2"`), shared by every
//! request to their backend until their streams run out.
//!
//! Written here rather than taken from hyper-util's pooled client because the request
//! path needs less than that client does: the pool key is the backend's numeric id (no
//! URI hashing), a connection goes back to the pool exactly when its response body has
//! been read whole (no background "is it ready yet" polling), and a connect failure must
//! be told apart from a broken exchange so that only the former is retried elsewhere.
//! The pool belongs to one worker thread, so its lock is never contended.

use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::body::ReqBody;
use super::wire::{Wire, WireBody, WireError};
use crate::backend::Backend;
use crate::clock::Stamp;
use crate::descriptors::{self, Descriptor};
use crate::stats::BadAnswer;

/// Idle connections older than this are closed.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per backend and worker.
const MAX_IDLE_PER_BACKEND: usize = 1024;
/// How often an HTTP/2 connection to a backend is pinged, and how long an answer may take.
const H2_PING: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// How an attempt ended without a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No connection could be made: nothing was sent, another backend may be tried.
    Connect,
    /// The backend broke the exchange.
    Broken,
    /// No response headers within the upstream timeout.
    Timeout,
    /// The client's request body broke off: the client is gone.
    ClientGone,
    /// The client's request body stopped arriving: the upstream timeout ran out before
    /// the upload was whole. The client's doing, not the backend's.
    ClientStalled,
    /// The request body grew over `max_request_body` and was cut: 413, the client's
    /// doing.
    BodyTooLarge,
    /// A new connection was needed and no descriptor was free
    /// ([`crate::descriptors`]): this process is full, the backend is not at fault.
    NoDescriptor,
}

impl Failure {
    /// Its name in a try's span (`error.type`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Broken => "broken",
            Failure::Timeout => "timeout",
            Failure::ClientGone => "client_gone",
            Failure::ClientStalled => "client_stalled",
            Failure::BodyTooLarge => "body_too_large",
            Failure::NoDescriptor => "no_descriptor",
        }
    }

    /// Whether the backend is not to blame: it counts neither against the backend
    /// (passive checks, errors) nor as a reason to retry.
    pub(crate) fn spares_backend(self) -> bool {
        matches!(
            self,
            Failure::ClientGone
                | Failure::ClientStalled
                | Failure::BodyTooLarge
                | Failure::NoDescriptor
        )
    }
}

/// A failed exchange on hyper's client: the failure, and the request itself when none
/// of it left (so it can go to another backend, whatever its method).
pub(crate) struct SendError {
    /// What went wrong.
    pub(crate) failure: Failure,
    /// The request, untouched, when nothing of it was written.
    pub(crate) unsent: Option<Request<ReqBody>>,
}

impl From<Failure> for SendError {
    fn from(failure: Failure) -> SendError {
        SendError {
            failure,
            unsent: None,
        }
    }
}

/// The sending half of a backend connection.
#[derive(Debug)]
enum Sender {
    /// HTTP/1.1: one exchange at a time.
    H1(http1::SendRequest<ReqBody>),
    /// HTTP/2: a handle on a shared, multiplexed connection.
    H2(http2::SendRequest<ReqBody>),
}

/// A connection checked out of the pool.
#[derive(Debug)]
pub(crate) struct Conn {
    sender: Sender,
    backend: u64,
    reused: bool,
    /// It carries one client's PROXY header: never pooled for another request.
    private: bool,
    /// Its stream on a shared HTTP/2 connection.
    slot: Option<StreamSlot>,
    /// The HTTP/1.1 connection's task; none for a handle on a shared HTTP/2 one, whose
    /// task lives with the pool.
    task: Task,
    /// The HTTP/1.1 connection's descriptor; none for a shared HTTP/2 one (its task
    /// holds it).
    fd: Option<Descriptor>,
}

impl Conn {
    /// Lets the connection's task run on after this handle goes: an upgrade takes its
    /// socket over when the task hands it out. The socket's descriptor goes with it.
    pub(crate) fn detach(mut self) -> Option<Descriptor> {
        self.task.0 = None;
        self.fd.take()
    }
}

/// The task that drives a connection, ended when its last handle goes without being
/// pooled. hyper's client would otherwise go on writing a request body to a backend
/// that stopped taking it, holding the client's body and the connection after the
/// exchange has been given up (a timeout, a client gone).
#[derive(Debug)]
struct Task(Option<tokio::task::AbortHandle>);

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.abort();
        }
    }
}

#[derive(Debug)]
struct Idle {
    sender: http1::SendRequest<ReqBody>,
    task: Task,
    fd: Option<Descriptor>,
    since: Stamp,
}

/// A shared HTTP/2 connection: its handle, its task, when a request last took it.
#[derive(Debug)]
struct Shared {
    sender: http2::SendRequest<ReqBody>,
    /// Requests on it now (see [`MAX_STREAMS`]).
    streams: Arc<AtomicUsize>,
    used: Stamp,
}

/// Requests one HTTP/2 connection carries at once before another is opened: the
/// `SETTINGS_MAX_CONCURRENT_STREAMS` most servers advertise (RFC 9113 asks for at least
/// 100), which hyper does not expose to its client.
const MAX_STREAMS: usize = 100;

/// A request's stream on a shared HTTP/2 connection, counted while it lasts.
#[derive(Debug)]
struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A map by backend id. Ids are fulcrum's own (never a client's), so they need no
/// keyed hash against flooding; the default SipHash cost two of them per request about
/// 190 instructions (`docs/performance.md`). One multiplication spreads them over the
/// table instead (Fibonacci hashing: the top bits, which the table reads, depend on
/// every bit of the id).
type ById<V> = std::collections::HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// The hasher of [`ById`].
#[derive(Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); any other input still hashes.
        for &b in bytes {
            self.write_u64(u64::from(b) ^ self.0.rotate_left(8));
        }
    }

    #[inline]
    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// One worker's keep-alive connections, by backend id.
#[derive(Debug)]
pub(crate) struct Upstreams {
    idle: Mutex<ById<Vec<Idle>>>,
    /// HTTP/2 connections, by backend id; a new one is opened when every one open has
    /// as many streams as the backend allows.
    h2: Mutex<ById<Vec<Shared>>>,
    /// One connect at a time per HTTP/2 backend: requests that find no connection with
    /// a stream free wait for the one being opened instead of each opening their own
    /// (a burst at start would open one connection per request). The only lock here
    /// held across an await, and only while no usable connection exists.
    h2_connecting: Mutex<ById<Arc<tokio::sync::Mutex<()>>>>,
    /// Connections driven inline (requests without a body), by backend id.
    wires: Mutex<ById<Vec<(Wire, Stamp)>>>,
}

impl Upstreams {
    /// An empty pool; each connection it opens takes a descriptor of the process's
    /// budget ([`crate::descriptors`]).
    pub(crate) fn new() -> Self {
        Upstreams {
            idle: Mutex::default(),
            h2: Mutex::default(),
            h2_connecting: Mutex::default(),
            wires: Mutex::default(),
        }
    }

    fn pop_idle(&self, backend: u64) -> Option<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(&backend)?;
        // Most recently used first: it is the least likely to have been closed.
        let now = Stamp::now();
        while let Some(i) = list.pop() {
            if !i.sender.is_closed() && now.since(i.since) < IDLE_TIMEOUT {
                return Some(i);
            }
        }
        None
    }

    /// A connection to `b`: a pooled one, else a new one. A connection that carries a
    /// PROXY header naming `origin` is always new (it belongs to one client).
    async fn checkout(
        &self,
        b: &Backend,
        origin: Option<(SocketAddr, SocketAddr)>,
    ) -> Result<Conn, Failure> {
        if b.transport.h2 {
            return self.checkout_h2(b).await;
        }
        if b.transport.send_proxy.is_some() {
            return self.connect(b, origin).await;
        }
        while let Some(Idle {
            mut sender,
            task,
            fd,
            ..
        }) = self.pop_idle(b.id)
        {
            // Checked in when its exchange had ended both ways, its connection task may
            // just not have run since: it turns ready (or closed) at its next turn, no
            // timer needed.
            if sender.is_ready() || sender.ready().await.is_ok() {
                return Ok(Conn {
                    sender: Sender::H1(sender),
                    backend: b.id,
                    reused: true,
                    private: false,
                    slot: None,
                    task,
                    fd,
                });
            }
        }
        self.connect(b, None).await
    }

    /// A TCP connection to `b`, with the descriptor it takes.
    async fn dial(&self, b: &Backend) -> Result<(TcpStream, Descriptor), Failure> {
        // Out of descriptors, this worker's idle connections go first: they hold
        // descriptors nobody uses (a flood leaves many, some to backends long gone).
        let fd = match descriptors::try_take() {
            Some(fd) => fd,
            None => {
                self.close_idle();
                descriptors::try_take().ok_or_else(|| {
                    tracing::debug!(backend = %b.name, "no descriptor free for a new connection");
                    Failure::NoDescriptor
                })?
            }
        };
        let connecting = async {
            match b.socket_addr {
                Some(addr) => TcpStream::connect(addr).await,
                None => TcpStream::connect(b.authority.as_str()).await,
            }
        };
        let stream = match tokio::time::timeout(b.connect_timeout, connecting).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(backend = %b.name, error = %e, "connect failed");
                return Err(Failure::Connect);
            }
            Err(_) => {
                tracing::debug!(backend = %b.name, "connect timed out");
                return Err(Failure::Connect);
            }
        };
        let _ = stream.set_nodelay(true);
        Ok((stream, fd))
    }

    /// A TCP connection to `b`, with the PROXY header naming `origin` (client, and the
    /// address it reached) first when the pool sends one, then TLS for an `https://`
    /// backend; the handshake has the connect timeout too, and its failure (a
    /// certificate that does not verify, say) is a connect failure: nothing was sent.
    async fn open(
        &self,
        b: &Backend,
        origin: Option<(SocketAddr, SocketAddr)>,
    ) -> Result<(crate::transport::Stream, Descriptor), Failure> {
        let (mut tcp, fd) = self.dial(b).await?;
        if let (Some(version), Some((client, reached))) = (b.transport.send_proxy, origin) {
            let header = crate::proxy_protocol::header(version, client, reached);
            if tokio::io::AsyncWriteExt::write_all(&mut tcp, &header)
                .await
                .is_err()
            {
                return Err(Failure::Connect);
            }
        }
        match tokio::time::timeout(b.connect_timeout, b.transport.open(tcp)).await {
            Ok(Ok(s)) => Ok((s, fd)),
            Ok(Err(e)) => {
                tracing::warn!(backend = %b.name, error = %e, "TLS handshake with the backend failed");
                Err(Failure::Connect)
            }
            Err(_) => {
                tracing::debug!(backend = %b.name, "TLS handshake with the backend timed out");
                Err(Failure::Connect)
            }
        }
    }

    async fn connect(
        &self,
        b: &Backend,
        origin: Option<(SocketAddr, SocketAddr)>,
    ) -> Result<Conn, Failure> {
        let private = b.transport.send_proxy.is_some();
        let (stream, fd) = self.open(b, origin).await?;
        let (sender, conn) = http1::Builder::new()
            .writev(false)
            // A response head over the limits is refused (502), as on the inline path.
            .max_header_size(super::wire::MAX_HEAD)
            .max_headers(super::wire::MAX_HEADERS)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|_| Failure::Connect)?;
        let task = tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        Ok(Conn {
            sender: Sender::H1(sender),
            backend: b.id,
            reused: false,
            private,
            slot: None,
            task: Task(Some(task.abort_handle())),
            fd: Some(fd),
        })
    }

    /// A handle on an HTTP/2 connection to `b` with a stream free: an open one (the
    /// pool's lock is not held across the connect), else a new one, shared from then on.
    async fn checkout_h2(&self, b: &Backend) -> Result<Conn, Failure> {
        let ((sender, slot), reused) = match self.open_h2(b) {
            Some(s) => (s, true),
            None => {
                let gate = {
                    let mut g = self.h2_connecting.lock().unwrap_or_else(|e| e.into_inner());
                    Arc::clone(g.entry(b.id).or_default())
                };
                // Bounded: behind a connect that fails slowly, a request gives up after
                // one connect timeout, not one per request ahead of it.
                let Ok(_turn) = tokio::time::timeout(b.connect_timeout, gate.lock()).await else {
                    return Err(Failure::Connect);
                };
                match self.open_h2(b) {
                    // Opened while this request waited its turn.
                    Some(s) => (s, true),
                    None => (self.connect_h2(b).await?, false),
                }
            }
        };
        Ok(Conn {
            sender: Sender::H2(sender),
            backend: b.id,
            reused,
            private: false,
            slot: Some(slot),
            task: Task(None),
            fd: None,
        })
    }

    /// A handle on an open HTTP/2 connection to `b` with a stream free, and that stream.
    fn open_h2(&self, b: &Backend) -> Option<(http2::SendRequest<ReqBody>, StreamSlot)> {
        let mut h2 = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        let list = h2.entry(b.id).or_default();
        list.retain(|c| !c.sender.is_closed());
        let c = list
            .iter_mut()
            .find(|c| c.streams.load(Ordering::Relaxed) < MAX_STREAMS)?;
        c.used = Stamp::now();
        c.streams.fetch_add(1, Ordering::Relaxed);
        Some((c.sender.clone(), StreamSlot(Arc::clone(&c.streams))))
    }

    /// Takes the HTTP/2 connection `slot` is on out of the pool: an exchange on it timed
    /// out or broke, so it may be dead (its requests in flight go on; new ones open
    /// another).
    fn evict_h2(&self, backend: u64, slot: &StreamSlot) {
        let mut h2 = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = h2.get_mut(&backend) {
            list.retain(|c| !Arc::ptr_eq(&c.streams, &slot.0));
        }
    }

    /// Opens an HTTP/2 connection to `b` (prior knowledge over TCP, ALPN `h2` over TLS)
    /// and shares it.
    async fn connect_h2(
        &self,
        b: &Backend,
    ) -> Result<(http2::SendRequest<ReqBody>, StreamSlot), Failure> {
        let (stream, fd) = self.open(b, None).await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .max_header_list_size(super::wire::MAX_HEAD as u32)
            // A backend that vanished without a word is found within 40 s.
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(H2_PING)
            .keep_alive_timeout(H2_PING_TIMEOUT)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| {
                tracing::warn!(backend = %b.name, error = %e, "HTTP/2 handshake with the backend failed");
                Failure::Connect
            })?;
        // Not aborted when the pool lets it go: it ends by itself once no handle on it
        // is left and its streams are over, so a long stream outlives the idle sweep.
        tokio::spawn(async move {
            let _ = conn.await;
            drop(fd);
        });
        let streams = Arc::new(AtomicUsize::new(1));
        let slot = StreamSlot(Arc::clone(&streams));
        let mut h2 = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        h2.entry(b.id).or_default().push(Shared {
            sender: sender.clone(),
            streams,
            used: Stamp::now(),
        });
        Ok((sender, slot))
    }

    /// Sends `req` to `b` and waits for the response head, at most `timeout` from the
    /// moment the request is handed to a connection. A pooled connection that turns out
    /// to have been closed by the backend before anything was sent is replaced by a new
    /// one once. Returns the response, its connection and when the request was sent;
    /// a failure before anything was written gives the request back.
    pub(crate) async fn send(
        &self,
        b: &Backend,
        mut req: Request<ReqBody>,
        timeout: Duration,
        origin: Option<(SocketAddr, SocketAddr)>,
    ) -> Result<(Response<Incoming>, Conn, Stamp), SendError> {
        let mut replaced_stale = false;
        loop {
            let mut conn = match self.checkout(b, origin).await {
                Ok(c) => c,
                Err(failure) => {
                    return Err(SendError {
                        failure,
                        unsent: Some(req),
                    })
                }
            };
            let sent_at = Stamp::now();
            let sending = async {
                match &mut conn.sender {
                    Sender::H1(s) => s.try_send_request(req).await,
                    Sender::H2(s) => s.try_send_request(req).await,
                }
            };
            let outcome = tokio::time::timeout(timeout, sending).await;
            if let (Some(slot), Err(_) | Ok(Err(_))) = (&conn.slot, &outcome) {
                self.evict_h2(b.id, slot);
            }
            match outcome {
                Err(_) => return Err(Failure::Timeout.into()),
                Ok(Ok(resp)) => return Ok((resp, conn, sent_at)),
                Ok(Err(mut e)) => match e.take_message() {
                    // Nothing was written: a stale pooled connection is replaced once, and
                    // otherwise the request is as unsent as after a failed connect.
                    Some(unsent) if conn.reused && !replaced_stale => {
                        replaced_stale = true;
                        req = unsent;
                    }
                    Some(unsent) => {
                        return Err(SendError {
                            failure: Failure::Connect,
                            unsent: Some(unsent),
                        })
                    }
                    None if e.error().is_user() => {
                        // The client's own body failed (it went away mid-upload): not the
                        // backend's fault.
                        return Err(Failure::ClientGone.into());
                    }
                    None if e.error().is_parse() => {
                        // hyper does not say which limit a head broke.
                        let why = match e.error().is_parse_too_large() {
                            true => BadAnswer::HeadTooLarge,
                            false => BadAnswer::Malformed,
                        };
                        refused(b, why);
                        return Err(Failure::Broken.into());
                    }
                    None => {
                        tracing::debug!(backend = %b.name, error = %e.error(), "upstream exchange failed");
                        return Err(Failure::Broken.into());
                    }
                },
            }
        }
    }

    /// Sends a request without a body, already serialised as `head`, over an inline
    /// connection to `b`, and waits for the response head at most `timeout`. A pooled
    /// connection that the backend closed without answering is replaced by a new one
    /// once (only idempotent requests come this way, so sending again is safe).
    pub(crate) async fn send_head(
        &'static self,
        b: &Backend,
        head: &[u8],
        method: &http::Method,
        timeout: Duration,
    ) -> Result<(super::message::ResponseHead, WireBody, Stamp), Failure> {
        let mut replaced_stale = false;
        loop {
            // After a stale pooled connection, a new one: others pooled as long may be
            // just as stale.
            // One clock read serves the pooled connection's age and the send time.
            let now = Stamp::now();
            let pooled = if replaced_stale {
                None
            } else {
                self.pop_wire(b.id, now)
            };
            let (mut wire, sent_at) = match pooled {
                Some(w) => (w, now),
                None => {
                    let (stream, fd) = self.dial(b).await?;
                    (Wire::new(stream, b.id, fd), Stamp::now())
                }
            };
            let reused = wire.reused;
            let by = sent_at.after(timeout);
            match wire.exchange(head, method, by).await {
                Err(WireError::Timeout) => return Err(Failure::Timeout),
                Ok(answered) => {
                    let (head, body) = wire.into_body(answered);
                    return Ok((head, body, sent_at));
                }
                Err(WireError::Silent | WireError::Unsent) if reused && !replaced_stale => {
                    replaced_stale = true
                }
                // Nothing reached the backend: as good as a failed connect.
                Err(WireError::Unsent) => return Err(Failure::Connect),
                Err(WireError::Refused(why)) => {
                    refused(b, why);
                    return Err(Failure::Broken);
                }
                Err(_) => {
                    tracing::debug!(backend = %b.name, "upstream exchange failed");
                    return Err(Failure::Broken);
                }
            }
        }
    }

    /// The most recently pooled inline connection to `backend` that is idle and has
    /// not been idle longer than [`IDLE_TIMEOUT`] at `now`.
    fn pop_wire(&self, backend: u64, now: Stamp) -> Option<Wire> {
        let mut wires = self.wires.lock().unwrap_or_else(|e| e.into_inner());
        let list = wires.get_mut(&backend)?;
        while let Some((w, since)) = list.pop() {
            if now.since(since) < IDLE_TIMEOUT && w.is_idle() {
                return Some(w);
            }
        }
        None
    }

    /// Returns an inline connection whose response has been read whole.
    pub(crate) fn checkin_wire(&self, w: Wire) {
        let mut wires = self.wires.lock().unwrap_or_else(|e| e.into_inner());
        let list = wires.entry(w.backend).or_default();
        if list.len() < MAX_IDLE_PER_BACKEND {
            list.push((w, Stamp::now()));
        }
    }

    /// Returns a connection whose response has been read whole (a handle on a shared
    /// HTTP/2 connection is just dropped: the connection stays with the pool).
    pub(crate) fn checkin(&self, conn: Conn) {
        let Sender::H1(sender) = conn.sender else {
            return;
        };
        if conn.private {
            return;
        }
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(conn.backend).or_default();
        if list.len() < MAX_IDLE_PER_BACKEND {
            list.push(Idle {
                sender,
                task: conn.task,
                fd: conn.fd,
                since: Stamp::now(),
            });
        }
    }

    /// Closes every idle connection, of every backend: descriptors are short, or the
    /// worker ends.
    pub(crate) fn close_idle(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.wires.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let mut h2 = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        h2.retain(|_, list| {
            list.retain(|c| c.streams.load(Ordering::Relaxed) > 0);
            !list.is_empty()
        });
    }

    /// Closes idle connections past their time, and those of backends that are gone.
    pub(crate) fn sweep(&self, live: impl Fn(u64) -> bool) {
        let now = Stamp::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|id, list| {
            list.retain(|i| !i.sender.is_closed() && now.since(i.since) < IDLE_TIMEOUT);
            live(*id) && !list.is_empty()
        });
        drop(idle);
        let mut h2 = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        h2.retain(|id, list| {
            list.retain(|c| {
                let busy = c.streams.load(Ordering::Relaxed) > 0;
                !c.sender.is_closed() && (busy || now.since(c.used) < IDLE_TIMEOUT)
            });
            live(*id) && !list.is_empty()
        });
        drop(h2);
        let mut gates = self.h2_connecting.lock().unwrap_or_else(|e| e.into_inner());
        gates.retain(|id, _| live(*id));
        drop(gates);
        let mut wires = self.wires.lock().unwrap_or_else(|e| e.into_inner());
        wires.retain(|id, list| {
            list.retain(|(_, since)| now.since(*since) < IDLE_TIMEOUT);
            live(*id) && !list.is_empty()
        });
    }
}

/// Says why a backend's answer was refused (a warning, and its counter): an operator
/// sees the 502 explained without a debug log (`docs/operations.md`, "Limits").
fn refused(b: &Backend, why: BadAnswer) {
    b.live.stats.bad_answer(why);
    tracing::warn!(backend = %b.name, pool = %b.pool, reason = why.label(), "{}; answered 502", why.text());
}

/// Faults injected with `degrade`: the proxy itself waits first (returns how long), or
/// answers 503 as if the backend had (`Err`); both count like the real thing.
pub(super) async fn inject_faults(backend: &Backend) -> Result<Duration, ()> {
    let Some(faults) = backend.faults() else {
        return Ok(Duration::ZERO);
    };
    if !faults.latency.is_zero() {
        // Boxed: rare, and it would otherwise enlarge every request's future.
        Box::pin(tokio::time::sleep(faults.latency)).await;
    }
    if faults.error_rate > 0.0 && fastrand::f64() < faults.error_rate {
        return Err(());
    }
    Ok(faults.latency)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_hash_apart_in_the_bits_the_table_reads() {
        use std::hash::BuildHasher;
        let b = BuildHasherDefault::<IdHasher>::default();
        // hashbrown keeps the top 7 bits as a tag: sixteen consecutive ids must not
        // share one.
        let tags: std::collections::HashSet<u64> = (0..16).map(|id| b.hash_one(id) >> 57).collect();
        assert!(tags.len() >= 12, "{tags:?}");
        let mut m: ById<u32> = ById::default();
        for id in 0..1000 {
            m.insert(id, id as u32);
        }
        assert_eq!(m.get(&777), Some(&777));
    }
}

//! The connection driver: what every client connection shares, whatever its protocol
//! (`docs/architecture.md`, "The connection driver"). A connection accepted by a
//! worker takes a slot and a descriptor (`Connections`), learns who its client is
//! (`client_of`: the PROXY header, `Peer`), makes its TLS handshake, and is served by
//! its front end — the HTTP/1 fast path, hyper's HTTP/1, HTTP/2 — under one
//! [`drive`]: the watchdog's idle and send timeouts, the stop and the grace of a
//! graceful close. HTTP/3's connections take their slot here too
//! (`Connections::spawn_quic`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::clock::Stamp;
use crate::config::tcp::TcpListenerSpec;
use crate::descriptors::{self, Descriptor};
use crate::liveness::{Activity, Stopping, Timeouts, Tracked, Verdict, Watchdog, Watched};
use crate::proxy::{Proxy, MAX_HEADER_BYTES};
use crate::tcp::passthrough::Through;

/// How long requests in flight may take to finish after a stop signal.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// A client must send its request head within this time.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// hyper's server connection builder, for the HTTP/1.1 connections the fast path hands
/// over (HTTP/2 has its own front end, `http2`).
type HttpBuilder = hyper::server::conn::http1::Builder;

fn http_builder() -> HttpBuilder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES + 1024)
        .max_headers(256)
        // One send() of a flattened buffer costs the kernel less than a writev() (no
        // file-position lock, no iovec walk), and responses through a proxy are small.
        .writev(false)
        .keep_alive(true);
    b
}

/// What an accepted client connection holds until it ends: its place under the cap
/// and its descriptor.
pub(crate) type Held = (OwnedSemaphorePermit, Descriptor);

/// A connection slot and a descriptor for a connection just accepted, once both are
/// free. At the cap this worker holds the one connection it accepted and accepts no
/// more until a slot frees; the rest wait in the kernel's queue. (Taking the slot
/// before accepting would let an idle worker sit on a free slot while connections queue
/// on another worker's socket.)
pub(crate) async fn hold_for(slots: &Arc<Semaphore>) -> Held {
    let slot = match Arc::clone(slots).acquire_owned().await {
        Ok(slot) => slot,
        // The semaphore is never closed.
        Err(_) => std::future::pending().await,
    };
    (slot, descriptors::take().await)
}

/// The slot and the descriptor, if both are free now.
fn try_hold(slots: &Arc<Semaphore>) -> Option<Held> {
    let slot = Arc::clone(slots).try_acquire_owned().ok()?;
    Some((slot, descriptors::try_take()?))
}

/// A client connection just accepted: its socket, its ends, and its TLS acceptor when
/// it came on the HTTPS listener.
pub(crate) struct Accepted {
    pub(crate) stream: tokio::net::TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) local: SocketAddr,
    pub(crate) tls: Option<crate::tls::Acceptor>,
    /// The TCP listener it came on, for a TCP pool (`docs/tcp.md`).
    pub(crate) tcp: Option<Arc<crate::config::tcp::TcpListenerSpec>>,
}

/// One worker's client connections: how they are served and how they drain.
pub(crate) struct Connections {
    proxy: &'static Proxy,
    builder: Arc<HttpBuilder>,
    pub(crate) stop: Stopping,
    timeouts: Timeouts,
    /// One clone per connection: the drain waits for them to go.
    live: Arc<()>,
    /// One clone per TCP pool's connection (passed through ones too): after an upgrade
    /// the drain waits for them up to `tcp_drain_timeout`.
    tcp_live: Arc<()>,
    /// The most connections open at once since memory was last given back.
    peak: std::cell::Cell<usize>,
}

impl Connections {
    pub(crate) fn new(proxy: &'static Proxy, stop: Stopping) -> Connections {
        Connections {
            proxy,
            builder: Arc::new(http_builder()),
            stop,
            timeouts: Timeouts {
                idle: crate::liveness::IDLE_TIMEOUT,
                send: proxy.settings().send_timeout,
            },
            live: Arc::new(()),
            tcp_live: Arc::new(()),
            peak: std::cell::Cell::new(0),
        }
    }

    /// How many connections are open now.
    fn open(&self) -> usize {
        Arc::strong_count(&self.live) + Arc::strong_count(&self.tcp_live) - 2
    }

    /// Serves `a` if a slot and a descriptor are free now; else gives it back to wait.
    pub(crate) fn spawn_or_wait(&self, a: Accepted, slots: &Arc<Semaphore>) -> Option<Accepted> {
        match try_hold(slots) {
            Some(held) => {
                self.spawn(a, held);
                None
            }
            None => Some(a),
        }
    }

    /// Serves a new QUIC connection on its own task. It counts as a TCP connection does:
    /// a slot, a descriptor's worth of the budget, and its client's cap (refused at once
    /// without them), and the drain waits for it.
    pub(crate) fn spawn_quic(
        &self,
        incoming: quinn::Incoming,
        slots: &Arc<Semaphore>,
        handshakes: &Arc<crate::h3_front::Handshakes>,
        local: SocketAddr,
    ) {
        // `deny_clients`/`allow_clients`: nothing is sent back to a refused address.
        if !self
            .proxy
            .site()
            .admits_client(incoming.remote_address().ip())
        {
            incoming.ignore();
            return;
        }
        let admitted = self.proxy.admit_client(incoming.remote_address().ip());
        match (try_hold(slots), admitted) {
            (Some(held), Ok(client_slot)) => {
                let handshakes = Arc::clone(handshakes);
                let held = (held, client_slot, Arc::clone(&self.live));
                tokio::spawn(crate::h3_front::serve(
                    incoming,
                    self.proxy,
                    handshakes,
                    local,
                    held,
                    self.stop.clone(),
                ));
            }
            _ => incoming.refuse(),
        }
    }

    /// Serves a connection on its own task. It holds `held` as long as its socket lives
    /// (into a WebSocket tunnel too): a plain one goes to the fast path, then to hyper
    /// for what the fast path hands over; an HTTPS one makes its handshake (within its
    /// first head's timeout), then goes the same way for HTTP/1, or to the HTTP/2 front
    /// end (ALPN `h2`); so does a plain connection that opens with HTTP/2's preface.
    pub(crate) fn spawn(&self, a: Accepted, held: Held) {
        if let Some(front) = a.tcp.clone() {
            return self.spawn_tcp(a, front, held);
        }
        let Accepted {
            mut stream,
            peer,
            local,
            tls,
            tcp: _,
        } = a;
        // `deny_clients`/`allow_clients` judge the peer before any byte is read, unless
        // it is a trusted proxy whose PROXY header names the client (judged below).
        let pp = self.proxy.settings().proxy_protocol_from(peer.ip());
        let named_later = pp == Some(true);
        if !named_later && !self.proxy.site().admits_client(peer.ip()) {
            return;
        }
        // A client at its `max_connections_per_client` has this one closed at once.
        let Ok(client_slot) = self.proxy.admit_client(peer.ip()) else {
            return;
        };
        self.note_open();
        let _ = stream.set_nodelay(true);
        let builder = Arc::clone(&self.builder);
        let live = Arc::clone(&self.live);
        let (proxy, stop, timeouts) = (self.proxy, self.stop.clone(), self.timeouts);
        // Only a TLS listener with passthrough names may hand a connection to TCP.
        let passing = (tls.is_some() && !proxy.settings().passthrough.is_empty())
            .then(|| Arc::clone(&self.tcp_live));
        let task = async move {
            let _client_slot = client_slot;
            let over_tls = tls.is_some();
            let Some(client) = client_of(&mut stream, (peer, local), over_tls, pp).await else {
                return;
            };
            if named_later && !proxy.site().admits_client(client.addr.ip()) {
                return;
            }
            let conn = ClientConn {
                proxy,
                builder: &builder,
                stop: &stop,
                timeouts,
            };
            match tls {
                None => {
                    let _live = live;
                    let by = Stamp::now().after(HEADER_TIMEOUT);
                    conn.serve_h1(stream, client, held, by).await
                }
                Some(acceptor) => {
                    let held = (held, live);
                    Box::pin(conn.serve_tls_or_pass(stream, acceptor, client, held, passing)).await
                }
            }
        };
        tokio::spawn(task);
    }

    /// Serves a connection of a TCP listener (`docs/tcp.md`): the listener's `allow`
    /// and `deny` and the top-level ones judge its client (the one a trusted peer's
    /// PROXY header names, with `accept_proxy_protocol`), then its pool takes it.
    fn spawn_tcp(&self, a: Accepted, front: Arc<TcpListenerSpec>, held: Held) {
        let Accepted {
            mut stream,
            peer,
            local,
            ..
        } = a;
        let pp = self
            .proxy
            .settings()
            .tcp_proxy_protocol_from(front.accept_proxy_protocol, peer.ip());
        let admits = |ip| front.clients.admits(ip) && self.proxy.site().admits_client(ip);
        if pp != Some(true) && !admits(peer.ip()) {
            return;
        }
        let Ok(client_slot) = self.proxy.admit_client(peer.ip()) else {
            return;
        };
        self.note_open();
        let (proxy, live, stop) = (self.proxy, Arc::clone(&self.tcp_live), self.stop.clone());
        // Boxed: the connection's future then goes through tokio's spawn and the task's
        // changes of stage as a pointer; unboxed it was copied whole five times, about
        // 1 500 instructions of each short connection's 20 000 (`docs/performance.md`,
        // "TCP").
        tokio::spawn(Box::pin(async move {
            let (_live, _held, _client_slot) = (live, held, client_slot);
            let Some(ends) = ends_of(&mut stream, (peer, local), pp).await else {
                return;
            };
            let ip = ends.client.ip();
            if front.clients.admits(ip) && proxy.site().admits_client(ip) {
                pass_through(stream, ends, &front.pool, (proxy, stop)).await;
            }
        }));
    }

    fn note_open(&self) {
        self.peak.set(self.peak.get().max(self.open() + 1));
    }

    /// Gives the allocator's free memory back to the system once a flood of connections
    /// has gone (`docs/performance.md`, "Memory"): each connection's buffers come from
    /// the worker's arena, and glibc keeps freed arena memory in the process. Checked
    /// every heartbeat; trims when at most a quarter of the peak is left, and the peak
    /// was worth it.
    pub(crate) fn trim_after_flood(&self) {
        let (peak, now) = (self.peak.get(), self.open());
        if peak >= TRIM_AFTER_CONNECTIONS && now <= peak / 4 {
            self.peak.set(now);
            give_memory_back();
        }
    }

    /// Lets the connections finish: HTTP ones up to the drain timeout, TCP pools' ones
    /// up to `tcp_grace` (the drain timeout at a stop, `tcp_drain_timeout` after an
    /// upgrade).
    pub(crate) async fn drain(self, tcp_grace: Duration) {
        let gone = |live: Arc<()>| async move {
            while Arc::strong_count(&live) > 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let started = tokio::time::Instant::now();
        if tokio::time::timeout(DRAIN_TIMEOUT, gone(self.live))
            .await
            .is_err()
        {
            tracing::warn!("requests still in flight after the drain timeout; closing them");
        }
        // A moment past the connections' own cut (`cut_at_drain`), which logs them.
        let tcp_until = started + tcp_grace + TCP_CUT_LOGGED;
        if tokio::time::timeout_at(tcp_until, gone(self.tcp_live))
            .await
            .is_err()
        {
            tracing::warn!("TCP connections still open after their drain; closing them");
        }
    }
}

/// How long past its cut a TCP connection's end may take to be logged before the drain
/// drops it.
const TCP_CUT_LOGGED: Duration = Duration::from_secs(1);

/// A peak of open connections after which memory is given back (a few hundred
/// connections' buffers are not worth a trim).
const TRIM_AFTER_CONNECTIONS: usize = 512;

/// Returns free heap memory to the system (glibc's `malloc_trim`, which also releases
/// free pages in the middle of each arena). Written against libc directly: no crate
/// wraps it, and the system allocator is the one in use (`docs/architecture.md`).
fn give_memory_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it may be called
    // from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Who a new connection is from and what it reached: its own ends, or with
/// `accept_proxy_protocol` and a peer in `trusted_proxies` those its PROXY header names
/// (read before anything else, the TLS handshake included); `None` closes it: a trusted
/// peer's header is missing, malformed or late, or another peer sent one.
async fn ends_of(
    stream: &mut tokio::net::TcpStream,
    (peer, local): (SocketAddr, SocketAddr),
    pp: Option<bool>,
) -> Option<crate::tcp::Ends> {
    // A wildcard bind says nothing about the address reached: ask the socket.
    let local = match local.ip().is_unspecified() {
        true => stream.local_addr().unwrap_or(local),
        false => local,
    };
    let (addr, local) = match pp {
        // A trusted proxy must send its header.
        Some(true) => match crate::proxy_protocol::read_header(stream, HEADER_TIMEOUT).await {
            Ok(named) => named.unwrap_or((peer, local)),
            Err(e) => {
                tracing::debug!(%peer, error = ?e, "connection closed: no valid PROXY protocol header");
                return None;
            }
        },
        // Anyone else is its own client: one that claims another is closed.
        Some(false) => {
            match crate::proxy_protocol::starts_with_header(stream, HEADER_TIMEOUT).await {
                Ok(false) => (peer, local),
                Ok(true) => {
                    tracing::debug!(%peer, "connection closed: a PROXY protocol header from a peer outside trusted_proxies");
                    return None;
                }
                Err(_) => return None,
            }
        }
        None => (peer, local),
    };
    Some(crate::tcp::Ends {
        client: addr,
        reached: local,
    })
}

/// [`ends_of`] as the request path's `Peer` (over TLS with `tls`).
async fn client_of(
    stream: &mut tokio::net::TcpStream,
    ends: (SocketAddr, SocketAddr),
    tls: bool,
    pp: Option<bool>,
) -> Option<crate::proxy::Peer> {
    let e = ends_of(stream, ends, pp).await?;
    let socket = std::os::fd::AsRawFd::as_raw_fd(&*stream);
    Some(crate::proxy::Peer::new(e.client, e.reached, tls, socket))
}

/// Serves a connection for the TCP pool `pool` (gone after a reload: closed).
async fn pass_through(
    stream: tokio::net::TcpStream,
    ends: crate::tcp::Ends,
    pool: &str,
    (proxy, stop): (&'static Proxy, Stopping),
) {
    let Ok(pool) = proxy.site().pool(pool) else {
        return;
    };
    let cut = cut_at_drain(stop, proxy.settings().tcp_drain_timeout);
    crate::tcp::serve(stream, ends, pool, proxy.settings().access_log, cut).await
}

/// When a TCP pool's connection is cut: once a stop comes, at the drain timeout, or
/// after an upgrade at `tcp_drain` (`docs/tcp.md`, "Reloads, upgrades, stops"); the
/// drain itself waits a moment longer, so that the connection's own end is logged.
async fn cut_at_drain(stop: Stopping, tcp_drain: Duration) {
    let mut rx = stop.receiver();
    while !stop.is_stopping() {
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
    let grace = match stop.is_handed_over() {
        true => tcp_drain,
        false => DRAIN_TIMEOUT,
    };
    // Boxed: a timer is large, and every idle connection would carry its room.
    Box::pin(tokio::time::sleep(grace)).await
}

/// The TLS handshake of a client connection, done by `by` (the connection's head
/// deadline); `None` when it fails or is late (logged).
async fn tls_handshake(
    acceptor: crate::tls::Acceptor,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    by: tokio::time::Instant,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    match tokio::time::timeout_at(by, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            if let Some(e) = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                crate::mtls::note_handshake_error(e);
            }
            tracing::debug!(error = %e, %peer, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// The first bytes of a TLS connection, read by `by` (the connection's head deadline)
/// and put back in front of it; `None` when the client leaves or is late.
async fn first_bytes<S: crate::front::ClientIo>(
    mut tls: S,
    peer: SocketAddr,
    by: tokio::time::Instant,
) -> Option<crate::front::Rewind<S>> {
    use tokio::io::AsyncReadExt as _;
    let mut first = vec![0u8; 4096];
    match tokio::time::timeout_at(by, tls.read(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {
            first.truncate(n);
            Some(crate::front::Rewind::new(first.into(), tls))
        }
        Ok(_) => None,
        Err(_) => {
            tracing::debug!(%peer, "no HTTP/2 preface in time");
            None
        }
    }
}

/// One client connection's serving: the proxy, hyper's builder, the stop, the timeouts.
struct ClientConn<'a> {
    proxy: &'static Proxy,
    builder: &'a HttpBuilder,
    stop: &'a Stopping,
    timeouts: Timeouts,
}

impl ClientConn<'_> {
    /// Serves an HTTP/1 connection, plain or TLS: the fast path first, then hyper for
    /// what the fast path hands over (`docs/architecture.md`, "Server protocol").
    /// The first head must be whole by `first_by`.
    async fn serve_h1<S>(
        self,
        mut stream: S,
        client: crate::proxy::Peer,
        held: Held,
        first_by: Stamp,
    ) where
        S: crate::front::ClientIo + Send + 'static,
    {
        let peer = client.addr;
        let timeouts = (first_by, HEADER_TIMEOUT);
        let outcome =
            crate::front::serve(&mut stream, self.proxy, &client, timeouts, self.stop).await;
        let pre = match outcome {
            crate::front::Outcome::Closed => return,
            crate::front::Outcome::Refused(answer) => {
                // Short, but the client may have stopped reading after pipelined requests.
                use tokio::io::AsyncWriteExt as _;
                let write = async {
                    stream.write_all(answer).await?;
                    stream.shutdown().await
                };
                let _ = tokio::time::timeout(self.timeouts.send, write).await;
                return;
            }
            crate::front::Outcome::HandOff(pre) => pre,
        };
        let h2 = pre.starts_with(H2_PREFACE);
        let io = crate::front::Rewind::new(pre, stream);
        // Boxed: hyper's and h2's connection states are kilobytes, and inline they would
        // make every fast-path connection's task that large, idle or not
        // (`docs/performance.md`, "Memory per idle connection").
        let served = match h2 {
            true => Box::pin(self.serve_h2(io, client, held)).await,
            false => Box::pin(self.serve_hyper(io, client, held)).await,
        };
        if let Err(e) = served {
            tracing::debug!(error = %e, %peer, "client connection ended with an error");
        }
    }

    /// Serves an HTTPS connection: passed through to a TCP pool when its ClientHello
    /// names one of `[[tls_passthrough]]` (`passing` is then the TCP drain's count to
    /// join: the connection is a TCP pool's from then on, drained as one), else
    /// terminated ([`Self::serve_tls`]). The ClientHello's read, the handshake and the
    /// first head share one head timeout.
    async fn serve_tls_or_pass(
        self,
        stream: tokio::net::TcpStream,
        acceptor: crate::tls::Acceptor,
        client: crate::proxy::Peer,
        (held, live): (Held, Arc<()>),
        passing: Option<Arc<()>>,
    ) {
        let by = Stamp::now().after(HEADER_TIMEOUT);
        if let Some(tcp_live) = passing {
            match crate::tcp::passthrough::classify(&stream, &self.proxy.settings().passthrough)
                .await
            {
                Through::Terminate => {}
                Through::Close => return,
                Through::Pass(pool) => {
                    let (_tcp, _held) = (tcp_live, held);
                    drop(live);
                    let ends = crate::tcp::Ends {
                        client: client.addr,
                        reached: client.local,
                    };
                    let how = (self.proxy, self.stop.clone());
                    return pass_through(stream, ends, &pool, how).await;
                }
            }
        }
        let _live = live;
        self.serve_tls(stream, acceptor, client, held, by).await
    }

    /// Terminates an HTTPS connection: its handshake by `by`, then HTTP/2 (by ALPN)
    /// through the HTTP/2 front end, or HTTP/1 as a plain connection is served.
    async fn serve_tls(
        self,
        stream: tokio::net::TcpStream,
        acceptor: crate::tls::Acceptor,
        mut client: crate::proxy::Peer,
        held: Held,
        by: Stamp,
    ) {
        let peer = client.addr;
        let verifier = acceptor.verifier();
        let Some(tls) = tls_handshake(acceptor, stream, peer, by.to_tokio()).await else {
            return;
        };
        // The identity every request on it carries (`docs/tls.md`, "Mutual TLS"); a
        // resumed session's is checked again.
        let session = tls.get_ref().1;
        let resumed = session.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        match verifier.identity(session.peer_certificates(), resumed) {
            Ok(identity) => client.client_cert = identity,
            Err(()) => return,
        }
        match tls.get_ref().1.alpn_protocol() {
            // The ACME CA checked the challenge certificate: nothing more is said.
            Some(crate::tls::ACME_TLS_ALPN) => return,
            Some(b"h2") => {}
            _ => return self.serve_h1(tls, client, held, by).await,
        }
        // The preface is read here, so that a stop arriving before the HTTP/2 front end
        // has read it does not close a connection whose client already sent it.
        let Some(io) = first_bytes(tls, peer, by.to_tokio()).await else {
            return;
        };
        if let Err(e) = self.serve_h2(io, client, held).await {
            tracing::debug!(error = %e, %peer, "client connection ended with an error");
        }
    }

    /// Serves an HTTP/1 connection with hyper until it ends, under the [`Watchdog`]'s
    /// timeouts and the stop: at a stop it is closed gracefully unless the sockets were
    /// handed over (then its answers close it); a graceful close that takes longer than
    /// [`GRACE`] is cut. `held` goes with the socket, into a WebSocket tunnel too.
    async fn serve_hyper<S>(
        &self,
        io: S,
        client: crate::proxy::Peer,
        held: Held,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(Activity::new(false, client.socket));
        let io = TokioIo::new(Tracked::new(io, Arc::clone(&activity), held));
        let (proxy, stop, seen) = (self.proxy, self.stop.clone(), Arc::clone(&activity));
        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let opened = seen.open();
            let (client, stop) = (client.clone(), stop.clone());
            async move {
                let mut r = crate::hyper_front::handle(proxy, req, client).await;
                if stop.is_stopping() {
                    r.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                }
                Ok::<_, Infallible>(r.map(|b| Watched::new(b, opened)))
            }
        });
        let conn = self.builder.serve_connection(io, svc).with_upgrades();
        tokio::pin!(conn);
        let dog = Watchdog::new(Arc::clone(&activity), self.timeouts);
        self.watched(conn, dog, false, |c| c.graceful_shutdown())
            .await
    }

    /// Serves an HTTP/2 connection ([`crate::http2`]) until it ends: its streams are
    /// futures polled here, beside the connection, under the [`Watchdog`]'s timeouts
    /// and the stop, which close it gracefully (`GOAWAY`: the streams open finish); a
    /// graceful close that takes longer than [`GRACE`] is cut.
    async fn serve_h2<S>(
        &self,
        io: S,
        client: crate::proxy::Peer,
        held: Held,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(Activity::new(true, client.socket));
        let io = Tracked::new(io, Arc::clone(&activity), held);
        let mut dog = Watchdog::new(Arc::clone(&activity), self.timeouts);
        // The start of the preface was read before (the fast path or `first_bytes`); the
        // handshake waits at most for its rest, under the watchdog: a client that never
        // sends it is closed at the idle timeout, without a GOAWAY (there is no HTTP/2
        // connection yet to send one on).
        let conn = tokio::select! {
            c = crate::http2::handshake(io) => c?,
            _ = dog.verdict() => return Err("no HTTP/2 handshake in time".into()),
        };
        let close = std::sync::atomic::AtomicBool::new(false);
        let served = crate::http2::serve(conn, self.proxy, &client, &activity, &close);
        tokio::pin!(served);
        // `watched` polls `served` again after each close it asks for: that is how the
        // flag is seen.
        self.watched(served, dog, true, |_| {
            close.store(true, std::sync::atomic::Ordering::Relaxed)
        })
        .await
    }

    /// Runs `served`, a connection being served, to its end under the [`Watchdog`]'s
    /// timeouts and the stop: an idle connection, or one at a stop, is closed gracefully
    /// by `close` (once), and cut when that takes longer than [`GRACE`]; a stalled one is
    /// cut at once. HTTP/2 (`h2`) is closed at any stop, with its `GOAWAY` at once when
    /// the stop came first. An HTTP/1.1 connection is closed at a stop unless the
    /// sockets were handed over (then its answers close it); one handed to hyper after
    /// the stop has a request read already (the fast path read it), and its answer
    /// closes it.
    async fn watched<F, E>(
        &self,
        mut served: std::pin::Pin<&mut F>,
        mut dog: Watchdog,
        h2: bool,
        mut close: impl FnMut(std::pin::Pin<&mut F>),
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    where
        F: std::future::Future<Output = Result<(), E>>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut stop_rx = self.stop.receiver();
        let mut stop_seen = self.stop.is_stopping();
        let mut closing: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        let mut begin_close = |served: std::pin::Pin<&mut F>, closing: &mut Option<_>| {
            if closing.is_none() {
                close(served);
                *closing = Some(Box::pin(tokio::time::sleep(GRACE)));
            }
        };
        if stop_seen && h2 {
            begin_close(served.as_mut(), &mut closing);
        }
        loop {
            tokio::select! {
                r = served.as_mut() => return r.map_err(Into::into),
                v = dog.verdict() => match v {
                    Verdict::Stalled => return Err("send timeout: the client took nothing of an answer".into()),
                    Verdict::Idle => begin_close(served.as_mut(), &mut closing),
                },
                _ = stop_rx.changed(), if !stop_seen => {
                    stop_seen = true;
                    if h2 || !self.stop.is_handed_over() {
                        begin_close(served.as_mut(), &mut closing);
                    }
                }
                _ = crate::liveness::maybe(closing.as_mut()) => {
                    return Err("not closed within the grace after a graceful close".into());
                }
            }
        }
    }
}

/// The start of HTTP/2's connection preface (RFC 9113 §3.4): the fast path hands a
/// connection over as soon as this much of it shows the request line is no HTTP/1.x
/// one, which may be before the whole preface has come.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2";

/// How long a graceful close may take before the connection is cut: a client that
/// never finishes its preface, or never opens the window of a last answer.
const GRACE: Duration = Duration::from_secs(10);

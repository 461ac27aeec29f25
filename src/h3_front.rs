//! HTTP/3 from clients (`docs/tls.md`, "HTTP/3"): QUIC on the TLS listener's port,
//! with quinn, and HTTP/3 with the `h3` crate. Each QUIC connection is a task on its
//! worker; its requests are futures polled inside it (as `http2`'s streams are), each
//! handed to the request path as a `RequestHead` and a `ClientBody`, its answer sent
//! back as HEADERS, DATA and, for gRPC, trailers.
//!
//! The protocol (QUIC's handshake, loss recovery, flow control, QPACK) is quinn's and
//! h3's; this module sets their limits and adapts their types.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use http::Response;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;
use rustls::pki_types::CertificateDer;

use crate::liveness::{Stopping, IDLE_TIMEOUT};
use crate::proxy::{BodyError, ClientBody, Peer, Proxy, RequestHead, RespBody, MAX_HEADER_BYTES};

/// Streams a client may have open at once (HAProxy's default for HTTP/3; nginx's is 128).
const MAX_STREAMS: u32 = 100;
/// What a stream, and the whole connection, may have in flight from the client: 1 MiB,
/// as the HTTP/2 front end's windows, so a connection buffers at most that much.
const WINDOW: u32 = 1 << 20;
/// A connection with no packet at all for this long is gone (a client that vanished
/// with requests open); one with no request open is closed sooner, after the idle
/// timeout every front end keeps ([`IDLE_TIMEOUT`]).
const QUIC_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Handshakes in progress on one worker above which a new client must first prove its
/// address (a Retry), as a SYN flood meets SYN cookies.
pub(crate) const RETRY_ABOVE: usize = 64;

/// The QUIC transport's limits.
pub(crate) fn transport() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(MAX_STREAMS.into());
    // HTTP/3 needs three unidirectional streams from the client (control, QPACK's two).
    t.max_concurrent_uni_streams(8u32.into());
    t.stream_receive_window(WINDOW.into());
    t.receive_window(WINDOW.into());
    t.send_window(u64::from(WINDOW));
    // No DATAGRAM frames: nothing here reads them.
    t.datagram_receive_buffer_size(None);
    if let Ok(idle) = quinn::IdleTimeout::try_from(QUIC_IDLE_TIMEOUT) {
        t.max_idle_timeout(Some(idle));
    }
    t
}

/// Handshakes in progress on a worker.
#[derive(Debug)]
pub(crate) struct Handshakes {
    in_progress: AtomicUsize,
    /// The HTTPS listener's client certificate verifier, for a connection's identity.
    verifier: Option<Arc<crate::mtls::LiveVerifier>>,
}

impl Handshakes {
    /// A worker's count, with the listener's verifier.
    pub(crate) fn new(verifier: Option<Arc<crate::mtls::LiveVerifier>>) -> Handshakes {
        Handshakes {
            in_progress: AtomicUsize::new(0),
            verifier,
        }
    }
}

/// Takes one new QUIC connection: a Retry first when too many handshakes are in
/// progress and the client has not proven its address; then the handshake and the
/// connection's requests until it ends, or until the stop (`stop`) has let its
/// requests in flight finish.
pub(crate) async fn serve<H: Send>(
    incoming: quinn::Incoming,
    proxy: &'static Proxy,
    handshakes: Arc<Handshakes>,
    local: SocketAddr,
    held: H,
    stop: Stopping,
) {
    if handshakes.in_progress.load(Ordering::Relaxed) >= RETRY_ABOVE
        && !incoming.remote_address_validated()
    {
        let _ = incoming.retry();
        return;
    }
    let peer_addr = incoming.remote_address();
    let local = incoming
        .local_ip()
        .map_or(local, |ip| SocketAddr::new(ip, local.port()));
    handshakes.in_progress.fetch_add(1, Ordering::Relaxed);
    let connected = match incoming.accept() {
        Ok(connecting) => connecting.await,
        Err(e) => Err(e),
    };
    handshakes.in_progress.fetch_sub(1, Ordering::Relaxed);
    let conn = match connected {
        Ok(c) => c,
        Err(e) => {
            note_refused(&e);
            tracing::debug!(error = %e, peer = %peer_addr, "QUIC handshake failed");
            return;
        }
    };
    let mut peer = Peer::new(peer_addr, local, true, -1);
    // The identity every request on it carries (`docs/tls.md`, "Mutual TLS"), checked
    // again: QUIC does not tell a resumed session from a new one.
    let chain = conn
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok());
    if let Some(verifier) = &handshakes.verifier {
        match verifier.identity(chain.as_deref().map(Vec::as_slice), true) {
            Ok(identity) => peer.client_cert = identity,
            Err(()) => {
                conn.close(CERTIFICATE_REFUSED.into(), b"client certificate refused");
                return;
            }
        }
    }
    if let Err(e) = requests(conn, proxy, &peer, &stop).await {
        tracing::debug!(error = %e, peer = %peer_addr, "HTTP/3 connection ended with an error");
    }
    // The connection's slot (`max_connections`, its client's cap) is given back now.
    drop(held);
}

/// Counts a handshake refused for want of a client certificate: QUIC carries rustls's
/// `certificate_required` alert (116) as a crypto error.
fn note_refused(e: &quinn::ConnectionError) {
    if let quinn::ConnectionError::TransportError(t) = e {
        if t.code == quinn::TransportErrorCode::crypto(116) {
            crate::mtls::note_missing();
        }
    }
}

/// Serves a connection's requests, each a future polled here, until the client closes
/// it (or QUIC finds it gone: requests still running then are dropped), or until the stop
/// or the idle timeout (no request open for [`IDLE_TIMEOUT`], as on every front end):
/// then a GOAWAY says no request after those taken will be, those finish, and the
/// connection is closed. A connection closed under them (by the client, by the
/// upgrade) drops the requests still running. A client that cancels most of its
/// requests (a flood of resets, as HTTP/2's rapid reset) has its connection closed.
async fn requests(
    conn: quinn::Connection,
    proxy: &Proxy,
    peer: &Peer,
    stop: &Stopping,
) -> Result<(), h3::error::ConnectionError> {
    let quic = conn.clone();
    let (conn, stops) = crate::h3_quic::Conn::new(conn);
    let mut h3 = h3::server::builder()
        .max_field_section_size(MAX_HEADER_BYTES as u64)
        .build::<_, Bytes>(conn)
        .await?;
    let mut running = FuturesUnordered::new();
    let mut tally = Tally::default();
    let mut stop_rx = stop.receiver();
    let mut stopping = stop.is_stopping();
    if stopping {
        h3.shutdown(NEXT_REQUEST).await?;
    }
    let closed = quic.closed();
    tokio::pin!(closed);
    // No request open for the idle timeout: closed as at a stop (GOAWAY, then the close).
    let idle = tokio::time::sleep(IDLE_TIMEOUT);
    tokio::pin!(idle);
    while !(stopping && running.is_empty()) {
        tokio::select! {
            accepted = h3.accept(), if !stopping => match accepted? {
                Some(resolver) => running.push(request(resolver, proxy, peer, &stops)),
                None => break,
            },
            Some(outcome) = running.next(), if !running.is_empty() => {
                if tally.count(outcome) {
                    tracing::warn!(peer = %peer.addr, "HTTP/3 client cancelled too many requests; closing its connection");
                    quic.close(EXCESSIVE_LOAD.into(), b"too many cancelled requests");
                    return Ok(());
                }
                if running.is_empty() {
                    idle.as_mut().reset(tokio::time::Instant::now() + IDLE_TIMEOUT);
                }
            }
            _ = &mut idle, if running.is_empty() && !stopping => {
                stopping = true;
                h3.shutdown(NEXT_REQUEST).await?;
            }
            _ = stop_rx.changed(), if !stopping => {
                stopping = true;
                h3.shutdown(NEXT_REQUEST).await?;
            }
            _ = &mut closed => return Ok(()),
        }
    }
    tokio::select! {
        _ = async { while running.next().await.is_some() {} } => {}
        _ = &mut closed => return Ok(()),
    }
    if stopping {
        // A close drops what the client has not acknowledged yet, the end of the last
        // answers included: the client may close first, else a few round trips go by.
        let linger = (quic.rtt() * 4).clamp(LINGER_MIN, LINGER_MAX);
        let _ = tokio::time::timeout(linger, &mut closed).await;
        quic.close(NO_ERROR.into(), b"");
    }
    Ok(())
}

/// Bounds on how long a connection closed by the stop waits for its last answers to be
/// acknowledged.
const LINGER_MIN: Duration = Duration::from_millis(50);
const LINGER_MAX: Duration = Duration::from_secs(2);

/// The GOAWAY's stream: h3 names the last request taken plus this many, and RFC 9114
/// (section 5.2) reads the one named as not processed: the next one, then.
const NEXT_REQUEST: usize = 1;

/// HTTP/3's error codes (RFC 9114, section 8.1) for closing a connection.
const NO_ERROR: u32 = 0x100;
/// A resumed session whose client certificate no longer verifies: `H3_REQUEST_REJECTED`
/// for the whole connection (nothing of it was processed).
const CERTIFICATE_REFUSED: u32 = 0x10b;
const EXCESSIVE_LOAD: u32 = 0x107;

/// How a request ended, as far as the connection's health goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Its answer went out whole.
    Answered,
    /// The client reset it or stopped its answer first.
    Cancelled,
    /// Anything else (a refused head, a slow reader cut off).
    Other,
}

/// A connection's answered and cancelled requests.
#[derive(Debug, Default)]
struct Tally {
    answered: u64,
    cancelled: u64,
}

impl Tally {
    /// Counts `outcome`; true once the client has cancelled more requests than one
    /// connection may have open at once and than it let be answered: a flood of
    /// resets, not a client that gave up on a few.
    fn count(&mut self, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Answered => self.answered += 1,
            Outcome::Cancelled => self.cancelled += 1,
            Outcome::Other => {}
        }
        self.cancelled > u64::from(MAX_STREAMS) && self.cancelled > self.answered
    }
}

/// Whether `e` is the client's reset of the stream (or its STOP_SENDING).
fn cancelled(e: &h3::error::StreamError) -> bool {
    matches!(e, h3::error::StreamError::RemoteTerminate { .. })
}

type Resolver = h3::server::RequestResolver<crate::h3_quic::Conn, Bytes>;

/// One request: its head and body into the request path, its answer back. A client
/// that stops reading the answer (STOP_SENDING) before it is whole drops the exchange
/// at once, the backend's request with it, as an h2 `RST_STREAM` does.
async fn request(
    resolver: Resolver,
    proxy: &Proxy,
    peer: &Peer,
    stops: &crate::h3_quic::Stops,
) -> Outcome {
    let (req, stream) = match resolver.resolve_request().await {
        Ok(r) => r,
        Err(e) if cancelled(&e) => return Outcome::Cancelled,
        Err(e) => {
            tracing::debug!(error = %e, peer = %peer.addr, "HTTP/3 request refused");
            return Outcome::Other;
        }
    };
    let client_gone = stops.take(stream.id());
    let (mut send, recv) = stream.split();
    let done = tokio::select! {
        biased;
        outcome = exchange(req, recv, &mut send, proxy, peer) => Some(outcome),
        () = client_gone => None,
    };
    done.unwrap_or_else(|| {
        send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
        Outcome::Cancelled
    })
}

/// The request through the request path and its answer back on `send`.
async fn exchange(
    req: http::Request<()>,
    recv: h3::server::RequestStream<crate::h3_quic::RecvSide, Bytes>,
    send: &mut SendHalf,
    proxy: &Proxy,
    peer: &Peer,
) -> Outcome {
    let (parts, ()) = req.into_parts();
    let length = crate::proxy::stated_length(&parts.headers);
    // A request that says it has no body is not forwarded with a stream: it can be
    // replayed on another backend (h3 cannot tell the end of a stream before reading).
    let bodiless = length == Some(0)
        || (length.is_none() && matches!(parts.method, http::Method::GET | http::Method::HEAD));
    let head_only = parts.method == http::Method::HEAD;
    let body = (!bodiless).then(|| ClientBody::stream(H3Body::new(recv, length)));
    let head = RequestHead::from_parts(parts);
    let answer = Box::pin(proxy.answer(head, body, None, peer)).await;
    let (mut parts, body) = answer.into_parts();
    crate::proxy::fit_head(&mut parts.headers, &body);
    let give_up = proxy.settings().send_timeout;
    let sent =
        match tokio::time::timeout(give_up, send.send_response(Response::from_parts(parts, ())))
            .await
        {
            Ok(Ok(())) if head_only => send.finish().await,
            Ok(Ok(())) => pipe(send, body, give_up).await,
            Ok(Err(e)) => Err(e),
            Err(_) => {
                send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
                return Outcome::Other;
            }
        };
    match sent {
        Ok(()) => Outcome::Answered,
        Err(e) if cancelled(&e) => Outcome::Cancelled,
        Err(e) => {
            tracing::debug!(error = %e, peer = %peer.addr, "HTTP/3 answer not sent whole");
            Outcome::Other
        }
    }
}

type SendHalf = h3::server::RequestStream<crate::h3_quic::SendSide<Bytes>, Bytes>;

/// Sends an answer's body: DATA frames as the client's window allows, then the
/// trailers (gRPC) or the stream's end; a body that breaks off resets the stream, and
/// so does a client that takes no byte for `give_up` (`send_timeout`).
async fn pipe(
    send: &mut SendHalf,
    mut body: RespBody,
    give_up: Duration,
) -> Result<(), h3::error::StreamError> {
    loop {
        match body.frame().await {
            None => return send.finish().await,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "an answer's body broke off");
                send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return Ok(());
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => match tokio::time::timeout(give_up, send.send_data(data)).await {
                    Ok(sent) => sent?,
                    Err(_) => {
                        send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
                        return Ok(());
                    }
                },
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        send.send_trailers(trailers).await?;
                        return send.finish().await;
                    }
                }
            },
        }
        if body.is_end_stream() {
            return send.finish().await;
        }
    }
}

/// The receiving half of an HTTP/3 request's stream.
type H3Recv = h3::server::RequestStream<crate::h3_quic::RecvSide, Bytes>;

/// Where an HTTP/3 request body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum H3State {
    Data,
    Trailers,
    Done,
}

/// An HTTP/3 request body: quinn gives the client's window back as the bytes are read.
struct H3Body {
    recv: H3Recv,
    /// What `Content-Length` says is left to come.
    left: Option<u64>,
    state: H3State,
}

impl std::fmt::Debug for H3Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H3Body")
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

impl http_body::Body for H3Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        use bytes::Buf as _;
        if this.state == H3State::Data {
            match std::task::ready!(this.recv.poll_recv_data(cx)) {
                Ok(Some(mut buf)) => {
                    let data = buf.copy_to_bytes(buf.remaining());
                    if let Some(left) = &mut this.left {
                        // RFC 9114 §4.1.2: more than the stated length is malformed.
                        let Some(rest) = left.checked_sub(data.len() as u64) else {
                            return Poll::Ready(Some(Err(
                                "the body is longer than its Content-Length".into(),
                            )));
                        };
                        *left = rest;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(None) if this.left.is_some_and(|l| l > 0) => {
                    return Poll::Ready(Some(Err(
                        "the body is shorter than its Content-Length".into()
                    )));
                }
                Ok(None) => this.state = H3State::Trailers,
                Err(e) => return Poll::Ready(Some(Err(Box::new(e)))),
            }
        }
        if this.state == H3State::Done {
            return Poll::Ready(None);
        }
        let trailers = std::task::ready!(this.recv.poll_recv_trailers(cx));
        this.state = H3State::Done;
        match trailers {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(Box::new(e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        // A stated length read whole is the end: hyper's client stops polling there.
        self.state == H3State::Done || self.left == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        self.left
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

impl H3Body {
    /// The body of the stream `recv`; `length` is the request's `Content-Length`, when
    /// it states one.
    fn new(recv: H3Recv, length: Option<u64>) -> H3Body {
        H3Body {
            recv,
            left: length,
            state: H3State::Data,
        }
    }
}

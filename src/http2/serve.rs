//! One client's HTTP/2 connection served: bytes read and split into frames for the
//! [`Conn`], each request it opens answered by a task polled here, inside the
//! connection's own future (no task spawned per stream, no lock), and what they answer
//! written back under the client's windows.
//!
//! A stream's task is woken through a flag of its own, so that one poll of the
//! connection polls only the streams that can go on: those woken, and those with
//! answer bytes waiting that the windows now let out.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Buf as _, Bytes, BytesMut};
use futures_util::task::AtomicWaker;
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};

use super::conn::{Conn, Incoming, MAX_FRAME};
use super::frame::{Head, HEAD_LEN};
use super::{hpack, Reason};
use crate::liveness::{Activity, Opened, Watched};
use crate::proxy::request_id::RequestId;
use crate::proxy::{ClientBody, Peer, Proxy, ProxyResponse, RequestFields, RequestHead, RespBody};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Bytes queued for the client past which no more is read or produced until some is
/// written: what a client that does not read can make this side hold.
const HIGH_WATER: usize = 256 * 1024;
/// Finished answer futures' boxes a connection keeps for its next requests.
const REUSABLE: usize = 8;

/// The error a connection ends with.
pub(crate) type ServeError = Box<dyn std::error::Error + Send + Sync>;

/// A client connection whose preface has been read.
pub(crate) struct Connection<T> {
    io: T,
}

/// Reads the client's preface; anything else is refused.
pub(crate) async fn handshake<T>(mut io: T) -> Result<Connection<T>, ServeError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    io.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err("not the HTTP/2 connection preface".into());
    }
    Ok(Connection { io })
}

/// How a stream's task is woken: a flag the connection reads, and the connection's
/// own waker.
struct Flag {
    woken: AtomicBool,
    connection: Arc<AtomicWaker>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.connection.wake();
    }
}

/// A request's answer on its way: the request path's future until the head comes, then
/// the body.
enum Phase<F> {
    Answering {
        future: Pin<Box<F>>,
        /// The request's id, for the answer's head.
        id: Option<RequestId>,
        head_only: bool,
        /// The stream's place in the connection's activity, moved to the body.
        opened: Option<Opened>,
    },
    Sending {
        body: Watched<RespBody>,
        /// Bytes of the body the windows have not let out yet, and whether they end
        /// it.
        pending: Option<(Bytes, bool)>,
    },
}

/// A stream's task.
pub(crate) struct Task<F> {
    flag: Arc<Flag>,
    waker: Waker,
    phase: Phase<F>,
}

/// What a task's poll left.
enum Left {
    /// It waits (woken, or on the windows).
    Waiting,
    /// Its stream is done.
    Done,
}

/// What serves a connection: `M` begins a request, making its answer future `F`
/// ([`Proxy::begin`]).
struct Server<'a, T, M, F> {
    io: T,
    peer: &'a Peer,
    conn: Conn<Task<F>>,
    make: M,
    /// The boxes of answer futures that finished, taken again by the next requests
    /// (`docs/performance.md`, "Where the TLS figures go"): at most [`REUSABLE`]. Not
    /// `crate::recycle`'s one spare block per thread: a connection's streams end and
    /// start in batches, and sharing that spare with the HTTP/1.1 fast path's futures
    /// moved the plain request's count (+30 instructions).
    reusable: Vec<Pin<Box<F>>>,
    /// Streams started since the connection was last idle: how many boxes it keeps then.
    started: usize,
    read: BytesMut,
    /// How much of `conn.out` is written.
    written: usize,
    activity: &'a Arc<Activity>,
    /// A scratch buffer for header blocks.
    block: Vec<u8>,
    /// A scratch list of stream ids.
    ids: Vec<u32>,
    eof: bool,
    /// The connection error it ends with, once its GOAWAY is written.
    failed: Option<ServeError>,
}

/// Serves a connection until it ends: `Ok` when it closed cleanly (a GOAWAY either way
/// and its last stream done, or the client closed its end). `close` asks for a graceful
/// close (RFC 9113 §6.8's two GOAWAYs); it is read at each poll, and the caller polls
/// this again after setting it.
pub(crate) async fn serve<T>(
    conn: Connection<T>,
    proxy: &Proxy,
    peer: &Peer,
    activity: &Arc<Activity>,
    close: &AtomicBool,
) -> Result<(), ServeError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut s = Server {
        io: conn.io,
        conn: Conn::new(crate::proxy::MAX_HEADER_BYTES),
        peer,
        make: move |head, body, id: &mut _| proxy.begin(head, body, None, peer, id),
        reusable: Vec::new(),
        started: 0,
        read: BytesMut::with_capacity(2 * (MAX_FRAME + HEAD_LEN)),
        written: 0,
        activity,
        block: Vec::new(),
        ids: Vec::new(),
        eof: false,
        failed: None,
    };
    poll_fn(|cx| {
        if close.load(Ordering::Relaxed) {
            s.conn.close_gracefully();
        }
        s.poll(cx)
    })
    .await
}

impl<'a, T, M, F> Server<'a, T, M, F>
where
    T: AsyncRead + AsyncWrite + Unpin,
    M: Fn(RequestHead, Option<ClientBody>, &mut Option<RequestId>) -> F,
    F: Future<Output = ProxyResponse>,
{
    /// Reads and acts on what came, runs the streams that can go on, writes what they
    /// produced; again while reading brings something.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ServeError>> {
        self.conn.waker.register(cx.waker());
        if self.failed.is_some() {
            return self.poll_failed(cx);
        }
        loop {
            let readable = self.backlog() < HIGH_WATER && !self.eof;
            let read = match readable {
                true => match self.poll_read(cx) {
                    Ok(read) => read,
                    Err(e) => {
                        self.failed = Some(e);
                        return self.poll_failed(cx);
                    }
                },
                false => false,
            };
            self.run_streams();
            if self.conn.is_idle() && self.started > 0 {
                // A connection going idle keeps as many boxes as it started streams since
                // it was last idle (at most [`REUSABLE`]): a client that keeps ten streams
                // open goes idle between its batches and starts ten again, and one sending
                // a request at a time needs one. Only the first idle pass trims: a PING or
                // a drained write wakes an idle connection again without a stream
                // (`docs/performance.md`, "A box per stream, kept").
                self.reusable.truncate(self.started);
                self.started = 0;
            }
            self.conn.give_back();
            let flushed = self.poll_write(cx)?;
            if flushed && (self.conn.is_done() || self.eof) {
                tracing::debug!(eof = self.eof, "HTTP/2 connection done");
                return Poll::Ready(Ok(()));
            }
            // Reading brought frames; or it was skipped (or streams were) for the
            // backlog, which is written now: go on, or nothing would wake this again.
            let drained = !readable && self.backlog() < HIGH_WATER && !self.eof;
            if !read && !drained {
                return Poll::Pending;
            }
        }
    }

    /// Writes the GOAWAY of a connection error if the socket takes it now, then ends
    /// with the error: a client that floods without reading is not waited for.
    fn poll_failed(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ServeError>> {
        let _ = self.poll_write(cx);
        let e = self.failed.take();
        Poll::Ready(Err(e.unwrap_or_else(|| "HTTP/2 connection error".into())))
    }

    /// Bytes queued and not yet written.
    fn backlog(&self) -> usize {
        self.conn.out.len() - self.written
    }

    /// Reads what the client sent and acts on each whole frame; `true` when something
    /// was read.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Result<bool, ServeError> {
        self.read.reserve(MAX_FRAME + HEAD_LEN);
        let spare = self.read.spare_capacity_mut();
        let mut buf = ReadBuf::uninit(spare);
        match Pin::new(&mut self.io).poll_read(cx, &mut buf) {
            Poll::Pending => return Ok(false),
            Poll::Ready(Err(e)) => return Err(e.into()),
            Poll::Ready(Ok(())) => {}
        }
        let n = buf.filled().len();
        if n == 0 {
            self.eof = true;
            return Ok(false);
        }
        // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity.
        unsafe { self.read.set_len(self.read.len() + n) };
        self.frames()?;
        Ok(true)
    }

    /// Acts on each whole frame read.
    fn frames(&mut self) -> Result<(), ServeError> {
        while self.read.len() >= HEAD_LEN {
            let head = Head::read(&self.read);
            if head.len > MAX_FRAME {
                self.conn.receive(head, &[]).map_err(connection_error)?;
            }
            if self.read.len() < HEAD_LEN + head.len {
                break;
            }
            let payload = &self.read[HEAD_LEN..HEAD_LEN + head.len];
            let incoming = self.conn.receive(head, payload).map_err(connection_error)?;
            self.read.advance(HEAD_LEN + head.len);
            if let Some(incoming) = incoming {
                self.start(incoming);
            }
        }
        Ok(())
    }

    /// Starts answering a request.
    fn start(&mut self, incoming: Incoming) {
        let Incoming {
            stream,
            request,
            body,
        } = incoming;
        let head_only = request.method == http::Method::HEAD;
        let head = RequestHead {
            method: request.method,
            uri: request.uri,
            version: http::Version::HTTP_2,
            fields: RequestFields::Spans(request.fields),
        };
        let body = body.map(ClientBody::stream);
        let mut id = None;
        let fresh = (self.make)(head, body, &mut id);
        self.started += 1;
        let future = match self.reusable.pop() {
            Some(mut reused) => {
                reused.set(fresh);
                reused
            }
            None => Box::pin(fresh),
        };
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            connection: Arc::clone(&self.conn.waker),
        });
        let task = Task {
            waker: Waker::from(Arc::clone(&flag)),
            flag,
            phase: Phase::Answering {
                future,
                id,
                head_only,
                opened: Some(self.activity.open()),
            },
        };
        if let Some(s) = self.conn.stream(stream) {
            s.task = Some(task);
        }
    }

    /// Polls each stream that can go on.
    fn run_streams(&mut self) {
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        ids.extend(self.conn.ids());
        for &id in &ids {
            if self.backlog() >= HIGH_WATER {
                break;
            }
            let Some(mut task) = self.conn.stream(id).and_then(|s| s.task.take()) else {
                continue;
            };
            let woken = task.flag.woken.swap(false, Ordering::Acquire);
            let unblocked = matches!(
                task.phase,
                Phase::Sending {
                    pending: Some(_),
                    ..
                }
            ) && self.conn.capacity(id) > 0;
            let left = match woken || unblocked {
                true => self.run(id, &mut task),
                false => Left::Waiting,
            };
            match (left, self.conn.stream(id)) {
                (Left::Waiting, Some(s)) => s.task = Some(task),
                (Left::Done, _) => self.recycle(task.phase),
                (Left::Waiting, None) => {}
            }
        }
        self.ids = ids;
    }

    /// Runs stream `id`'s task until it waits or is done.
    fn run(&mut self, id: u32, task: &mut Task<F>) -> Left {
        let mut cx = Context::from_waker(&task.waker);
        loop {
            let sent = match &mut task.phase {
                Phase::Answering {
                    future,
                    id: request_id,
                    head_only,
                    opened,
                } => match future.as_mut().poll(&mut cx) {
                    Poll::Pending => return Left::Waiting,
                    Poll::Ready(mut answer) => {
                        if let Some(request_id) = request_id.take() {
                            answer
                                .head
                                .stamp(request_id, self.peer, http::Version::HTTP_2);
                        }
                        match self.send_head(id, answer, *head_only, opened.take()) {
                            Some(phase) => {
                                let answered = std::mem::replace(&mut task.phase, phase);
                                self.recycle(answered);
                                continue;
                            }
                            None => return Left::Done,
                        }
                    }
                },
                Phase::Sending { body, pending } => self.send_body(id, body, pending, &mut cx),
            };
            return sent;
        }
    }

    /// Keeps the box of an answer future that finished for the next request: a box of
    /// over a kilobyte, which `malloc` serves from its slower bins and hands back cold
    /// (`docs/performance.md`, "Where the TLS figures go").
    fn recycle(&mut self, phase: Phase<F>) {
        if let Phase::Answering { future, .. } = phase {
            if self.reusable.len() < REUSABLE {
                self.reusable.push(future);
            }
        }
    }

    /// Writes an answer's head; the body's phase when a body follows.
    fn send_head(
        &mut self,
        id: u32,
        answer: ProxyResponse,
        head_only: bool,
        opened: Option<Opened>,
    ) -> Option<Phase<F>> {
        let ProxyResponse { head, body } = answer;
        let end = head_only || body.is_end_stream();
        self.block.clear();
        hpack::encode_head(&mut self.block, &head, &body);
        self.conn.send_head(id, &self.block, end);
        match (end, opened) {
            (false, Some(opened)) => Some(Phase::Sending {
                body: Watched::new(body, opened),
                pending: None,
            }),
            _ => None,
        }
    }

    /// Sends what the windows let out of an answer's body.
    fn send_body(
        &mut self,
        id: u32,
        body: &mut Watched<RespBody>,
        pending: &mut Option<(Bytes, bool)>,
        cx: &mut Context<'_>,
    ) -> Left {
        loop {
            if let Some((data, end)) = pending {
                if data.is_empty() && !*end {
                    *pending = None;
                    continue;
                }
                let n = self.conn.capacity(id).min(data.len());
                if n == 0 && !data.is_empty() {
                    return Left::Waiting;
                }
                let chunk = data.split_to(n);
                let last = *end && data.is_empty();
                self.conn.send_data(id, &chunk, last);
                if last {
                    return Left::Done;
                }
                if data.is_empty() {
                    *pending = None;
                }
                if self.backlog() >= HIGH_WATER {
                    // Not waiting on anything: the next poll goes on once some is
                    // written.
                    cx.waker().wake_by_ref();
                    return Left::Waiting;
                }
                continue;
            }
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending => return Left::Waiting,
                Poll::Ready(None) => {
                    self.conn.send_data(id, &[], true);
                    return Left::Done;
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(error = %e, "an answer's body broke off");
                    self.conn.reset(id, Reason::INTERNAL_ERROR);
                    return Left::Done;
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => *pending = Some((data, body.is_end_stream())),
                    Err(frame) => {
                        let trailers = frame.into_trailers().unwrap_or_default();
                        self.block.clear();
                        hpack::encode_fields(&mut self.block, &trailers);
                        self.conn.send_trailers(id, &self.block);
                        return Left::Done;
                    }
                },
            }
        }
    }

    /// Writes what is queued; `true` when all of it is written and flushed.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Result<bool, ServeError> {
        while self.written < self.conn.out.len() {
            let rest = &self.conn.out[self.written..];
            match Pin::new(&mut self.io).poll_write(cx, rest) {
                Poll::Pending => return Ok(false),
                Poll::Ready(Ok(0)) => return Err("the client took no more".into()),
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Ready(Err(e)) => return Err(e.into()),
            }
        }
        self.conn.out.clear();
        self.conn.written();
        self.written = 0;
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending => Ok(false),
            Poll::Ready(r) => r.map(|()| true).map_err(Into::into),
        }
    }
}

/// A connection error as the connection's end.
fn connection_error(reason: Reason) -> ServeError {
    format!("HTTP/2 connection error {reason:?}").into()
}

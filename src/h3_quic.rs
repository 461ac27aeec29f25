//! HTTP/3's QUIC streams for the `h3` crate, over quinn (`docs/tls.md`, "HTTP/3").
//!
//! `h3` reads and writes streams through its `quic` traits; `h3-quinn`, the adapter
//! that ships with it, keeps each quinn stream private, and `h3`'s request stream
//! offers no way to learn that the client sent STOP_SENDING: a request whose client
//! gave up while the backend was still thinking ran to its end. This adapter keeps, for
//! each request stream it accepts, quinn's `stopped()` signal ([`Stops`]), which the
//! request takes by its stream's id and races against its exchange. Everything else is
//! a plain mapping of each trait method onto quinn's stream of the same role.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};
use quinn::VarInt;

/// A future kept across polls.
type Pending<T> = Pin<Box<dyn Future<Output = T> + Send + Sync>>;

/// The client's STOP_SENDING of each request stream accepted and not yet taken by its
/// request (by stream id).
#[derive(Clone, Default)]
pub(crate) struct Stops(Arc<Mutex<HashMap<u64, Pending<()>>>>);

impl Stops {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Pending<()>>> {
        // Nothing panics while holding it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves once the client stops reading stream `id` (STOP_SENDING) or the
    /// connection is lost; never for a stream it does not know, nor for one answered
    /// whole.
    pub(crate) fn take(&self, id: StreamId) -> impl Future<Output = ()> + Send + 'static {
        let stopped = self.lock().remove(&id.into_inner());
        async move {
            match stopped {
                Some(s) => s.await,
                None => std::future::pending().await,
            }
        }
    }
}

/// What quinn's `stopped()` says, as "the client is gone": a STOP_SENDING or a lost
/// connection. A stream finished and acknowledged (`Ok(None)`) is not.
fn gone(send: &quinn::SendStream) -> Pending<()> {
    let stopped = send.stopped();
    Box::pin(async move {
        if let Ok(None) = stopped.await {
            std::future::pending::<()>().await;
        }
    })
}

/// A QUIC connection as `h3` reads it.
pub(crate) struct Conn {
    conn: quinn::Connection,
    stops: Stops,
    accepting_bidi:
        Option<Pending<Result<(quinn::SendStream, quinn::RecvStream), quinn::ConnectionError>>>,
    accepting_uni: Option<Pending<Result<quinn::RecvStream, quinn::ConnectionError>>>,
    opener: Opener,
}

impl Conn {
    /// `conn` for `h3`, and where its request streams' STOP_SENDING can be had.
    pub(crate) fn new(conn: quinn::Connection) -> (Conn, Stops) {
        let stops = Stops::default();
        let c = Conn {
            opener: Opener::new(conn.clone()),
            conn,
            stops: stops.clone(),
            accepting_bidi: None,
            accepting_uni: None,
        };
        (c, stops)
    }
}

/// Polls the future in `slot`, made by `start` when there is none, and empties the slot
/// once it is ready.
fn poll_slot<T>(
    slot: &mut Option<Pending<T>>,
    cx: &mut Context<'_>,
    start: impl FnOnce() -> Pending<T>,
) -> Poll<T> {
    let out = ready!(slot.get_or_insert_with(start).as_mut().poll(cx));
    *slot = None;
    Poll::Ready(out)
}

impl<B: Buf> quic::Connection<B> for Conn {
    type RecvStream = RecvSide;
    type OpenStreams = Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvSide, ConnectionErrorIncoming>> {
        let conn = self.conn.clone();
        let recv = ready!(poll_slot(&mut self.accepting_uni, cx, || {
            Box::pin(async move { conn.accept_uni().await })
        }));
        Poll::Ready(recv.map(RecvSide::new).map_err(connection_error))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Bidi<B>, ConnectionErrorIncoming>> {
        let conn = self.conn.clone();
        let (send, recv) = ready!(poll_slot(&mut self.accepting_bidi, cx, || {
            Box::pin(async move { conn.accept_bi().await })
        }))
        .map_err(connection_error)?;
        // Made now: a STOP_SENDING that comes before the request takes it is not missed.
        let id = u64::from(send.id());
        self.stops.lock().insert(id, gone(&send));
        let mut send = SendSide::new(send);
        send.registered = Some((self.stops.clone(), id));
        Poll::Ready(Ok(Bidi {
            send,
            recv: RecvSide::new(recv),
        }))
    }

    fn opener(&self) -> Opener {
        Opener::new(self.conn.clone())
    }
}

impl<B: Buf> quic::OpenStreams<B> for Conn {
    type BidiStream = Bidi<B>;
    type SendStream = SendSide<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Bidi<B>, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_bidi(&mut self.opener, cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendSide<B>, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_send(&mut self.opener, cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<B>::close(&mut self.opener, code, reason);
    }
}

/// Opens streams on a connection (h3's server opens its control and QPACK streams).
pub(crate) struct Opener {
    conn: quinn::Connection,
    opening_bidi:
        Option<Pending<Result<(quinn::SendStream, quinn::RecvStream), quinn::ConnectionError>>>,
    opening_uni: Option<Pending<Result<quinn::SendStream, quinn::ConnectionError>>>,
}

impl Opener {
    fn new(conn: quinn::Connection) -> Opener {
        Opener {
            conn,
            opening_bidi: None,
            opening_uni: None,
        }
    }
}

impl<B: Buf> quic::OpenStreams<B> for Opener {
    type BidiStream = Bidi<B>;
    type SendStream = SendSide<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Bidi<B>, StreamErrorIncoming>> {
        let conn = self.conn.clone();
        let (send, recv) = ready!(poll_slot(&mut self.opening_bidi, cx, || {
            Box::pin(async move { conn.open_bi().await })
        }))
        .map_err(|e| StreamErrorIncoming::ConnectionErrorIncoming {
            connection_error: connection_error(e),
        })?;
        Poll::Ready(Ok(Bidi {
            send: SendSide::new(send),
            recv: RecvSide::new(recv),
        }))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendSide<B>, StreamErrorIncoming>> {
        let conn = self.conn.clone();
        let send = ready!(poll_slot(&mut self.opening_uni, cx, || {
            Box::pin(async move { conn.open_uni().await })
        }));
        Poll::Ready(send.map(SendSide::new).map_err(|e| {
            StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error: connection_error(e),
            }
        }))
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        self.conn.close(varint(code.value()), reason);
    }
}

/// The sending half of a stream.
pub(crate) struct SendSide<B: Buf> {
    stream: quinn::SendStream,
    /// What `send_data` gave and `poll_ready` has not written yet.
    writing: Option<WriteBuf<B>>,
    /// Its entry in the connection's [`Stops`], taken out when it goes (a stream h3
    /// refused never reaches a request).
    registered: Option<(Stops, u64)>,
}

impl<B: Buf> SendSide<B> {
    fn new(stream: quinn::SendStream) -> SendSide<B> {
        SendSide {
            stream,
            writing: None,
            registered: None,
        }
    }
}

impl<B: Buf> Drop for SendSide<B> {
    fn drop(&mut self) {
        if let Some((stops, id)) = &self.registered {
            stops.lock().remove(id);
        }
    }
}

impl<B: Buf> quic::SendStream<B> for SendSide<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        if let Some(data) = &mut self.writing {
            while data.has_remaining() {
                let n = ready!(Pin::new(&mut self.stream).poll_write(cx, data.chunk()))
                    .map_err(write_error)?;
                data.advance(n);
            }
        }
        self.writing = None;
        Poll::Ready(Ok(()))
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        if self.writing.is_some() {
            // h3 waits for `poll_ready` before it sends more: this would be its bug.
            return Err(StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error: ConnectionErrorIncoming::InternalError(
                    "data sent before the last was written".into(),
                ),
            });
        }
        self.writing = Some(data.into());
        Ok(())
    }

    fn poll_finish(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        Poll::Ready((self.stream.finish()).map_err(|e| StreamErrorIncoming::Unknown(Box::new(e))))
    }

    fn reset(&mut self, reset_code: u64) {
        let _ = self.stream.reset(varint(reset_code));
    }

    fn send_id(&self) -> StreamId {
        stream_id(self.stream.id())
    }
}

/// The receiving half of a stream.
pub(crate) struct RecvSide {
    stream: quinn::RecvStream,
}

impl RecvSide {
    fn new(stream: quinn::RecvStream) -> RecvSide {
        RecvSide { stream }
    }
}

impl quic::RecvStream for RecvSide {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        // `read_chunk` is cancel-safe: a future made for each poll loses nothing.
        let read = std::pin::pin!(self.stream.read_chunk(usize::MAX, true));
        let chunk = ready!(read.poll(cx)).map_err(read_error)?;
        Poll::Ready(Ok(chunk.map(|c| c.bytes)))
    }

    fn stop_sending(&mut self, error_code: u64) {
        let _ = self.stream.stop(varint(error_code));
    }

    fn recv_id(&self) -> StreamId {
        stream_id(self.stream.id())
    }
}

/// Both halves of a request stream.
pub(crate) struct Bidi<B: Buf> {
    send: SendSide<B>,
    recv: RecvSide,
}

impl<B: Buf> quic::BidiStream<B> for Bidi<B> {
    type SendStream = SendSide<B>;
    type RecvStream = RecvSide;

    fn split(self) -> (SendSide<B>, RecvSide) {
        (self.send, self.recv)
    }
}

impl<B: Buf> quic::SendStream<B> for Bidi<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code);
    }

    fn send_id(&self) -> StreamId {
        self.send.send_id()
    }
}

impl<B: Buf> quic::RecvStream for Bidi<B> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.recv.recv_id()
    }
}

/// A code h3 gives (a QUIC varint by construction; the largest one otherwise).
fn varint(code: u64) -> VarInt {
    VarInt::from_u64(code).unwrap_or(VarInt::MAX)
}

fn stream_id(id: quinn::StreamId) -> StreamId {
    // A QUIC stream id is a varint, below 2^62 (the mask only makes that plain): h3's
    // check cannot fail.
    let v = u64::from(id) & ((1 << 62) - 1);
    match StreamId::try_from(v) {
        Ok(s) => s,
        Err(_) => unreachable!("{v} is below 2^62"),
    }
}

fn connection_error(e: quinn::ConnectionError) -> ConnectionErrorIncoming {
    match e {
        quinn::ConnectionError::ApplicationClosed(c) => ConnectionErrorIncoming::ApplicationClose {
            error_code: c.error_code.into_inner(),
        },
        quinn::ConnectionError::TimedOut => ConnectionErrorIncoming::Timeout,
        other => ConnectionErrorIncoming::Undefined(Arc::new(other)),
    }
}

/// A stream's error as h3 reads it: the peer's reset or STOP_SENDING is the stream
/// terminated, with its code.
fn stream_error(e: impl std::error::Error + Send + Sync + 'static) -> StreamErrorIncoming {
    StreamErrorIncoming::Unknown(Box::new(e))
}

fn write_error(e: quinn::WriteError) -> StreamErrorIncoming {
    match e {
        quinn::WriteError::Stopped(code) => StreamErrorIncoming::StreamTerminated {
            error_code: code.into_inner(),
        },
        quinn::WriteError::ConnectionLost(c) => StreamErrorIncoming::ConnectionErrorIncoming {
            connection_error: connection_error(c),
        },
        other => stream_error(other),
    }
}

fn read_error(e: quinn::ReadError) -> StreamErrorIncoming {
    match e {
        quinn::ReadError::Reset(code) => StreamErrorIncoming::StreamTerminated {
            error_code: code.into_inner(),
        },
        quinn::ReadError::ConnectionLost(c) => StreamErrorIncoming::ConnectionErrorIncoming {
            connection_error: connection_error(c),
        },
        other => stream_error(other),
    }
}

//! The server's side of one HTTP/2 connection as a state machine, without I/O: frames
//! in (RFC 9113 §5 and §6: stream states, windows, header blocks, SETTINGS, PING,
//! GOAWAY), frames out into [`Conn::out`], and each request whose head is complete
//! handed to the caller as an [`Incoming`].
//!
//! A stream carries a task of the caller's (`T`: the future answering it, then its
//! body); dropping the stream (the client reset it, the connection ended) drops the
//! task, and with it the request wherever it is.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use std::sync::Arc;

use super::body::{self, Inbox, RequestBody};
use super::frame::{self, kind, setting, Frame, Head, MAX_WINDOW};
use super::hpack::{self, BlockError, Decoder};
use super::{Error, Reason};

/// Streams a client may have open at once (nginx allows 128, HAProxy 100, hyper 200).
pub(crate) const MAX_STREAMS: u32 = 200;
/// Each stream's receive window: 1 MiB.
pub(crate) const WINDOW: u32 = 1 << 20;
/// The connection's receive window: sixteen streams' worth, so that one upload whose
/// backend has stopped reading does not hold up the others.
pub(crate) const CONNECTION_WINDOW: u32 = 16 << 20;
/// The largest frame this side takes (the protocol's default).
pub(crate) const MAX_FRAME: usize = 16_384;
/// The window every stream starts with before SETTINGS say otherwise (RFC 9113 §6.9.2).
const DEFAULT_WINDOW: i64 = 65_535;
/// A header block this side takes, compressed, however many frames it comes in: past
/// it, a client sending CONTINUATION frames without end is cut off.
const MAX_BLOCK: usize = 2 * crate::proxy::MAX_HEADER_BYTES;
/// CONTINUATION frames one header block may take (empty ones included, which the size
/// limit alone would never stop); a 64 KiB head in 16 KiB frames takes four.
const MAX_CONTINUATIONS: usize = 64;
/// Streams the client may reset before their answer, beyond those it let finish, before
/// the connection is closed (rapid reset, CVE-2023-44487).
const MAX_EARLY_RESETS: u32 = 100;
/// Acknowledgements (of PING and SETTINGS) this side may have queued and not yet
/// written: a client that floods either and does not read the answers is cut off
/// (CVE-2019-9512, CVE-2019-9515; nghttp2's limit).
const MAX_ACKS_OWED: u32 = 1000;
/// Closed streams remembered, to tell a frame on a closed stream from one on a stream
/// never opened.
const REMEMBERED: usize = 32;
/// The payload of the PING that follows a first GOAWAY (RFC 9113 §6.8).
const DRAIN_PING: [u8; 8] = *b"fulcrum!";

/// The streams' map hashes a stream id as itself: ids are the client's own, but a
/// client gains nothing by choosing them (it may only open 200 at once, in increasing
/// order), and SipHash cost about 100 instructions for each of the ten lookups a
/// request makes.
#[derive(Default)]
struct StreamIdHasher(u64);

impl Hasher for StreamIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u32(&mut self, id: u32) {
        // Spread over the high bits too: hashbrown takes its control byte from them.
        self.0 = u64::from(id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A request whose head is complete.
#[derive(Debug)]
pub(crate) struct Incoming {
    /// Its stream.
    pub(crate) stream: u32,
    /// Its head.
    pub(crate) request: hpack::Request,
    /// Its body (`None`: the HEADERS frame ended the stream).
    pub(crate) body: Option<RequestBody>,
}

/// One stream's state.
#[derive(Debug)]
pub(crate) struct Stream<T> {
    /// The client may still send on it (not half-closed (remote)).
    recv_open: bool,
    /// What the client may still send before a WINDOW_UPDATE.
    recv_window: i64,
    /// Body bytes the request path took that are not yet given back to the stream's
    /// window.
    released: usize,
    /// Body bytes handed to the request path and not yet given back to the
    /// connection's window (taken or not).
    unread: usize,
    /// Its answer's head went out.
    answered: bool,
    /// Its answer is done: what the client still sends is thrown away.
    discard: bool,
    /// What this side may still send.
    send_window: i64,
    /// `Content-Length`, when stated, and the body's bytes so far.
    length: Option<u64>,
    received: u64,
    /// Where the body's bytes go.
    inbox: Option<Inbox>,
    /// The caller's task.
    pub(crate) task: Option<T>,
}

/// A header block still coming in CONTINUATION frames.
#[derive(Debug)]
struct Block {
    stream: u32,
    bytes: Vec<u8>,
    end_stream: bool,
    /// CONTINUATION frames so far.
    frames: usize,
}

/// Where the connection stands on its way to a close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    No,
    /// A first GOAWAY (the last id possible) and a PING went out.
    Announced,
    /// The GOAWAY naming the real last stream went out: no new stream, the open ones
    /// finish.
    Final,
}

/// The connection.
pub(crate) struct Conn<T> {
    streams: HashMap<u32, Stream<T>, BuildHasherDefault<StreamIdHasher>>,
    decoder: Decoder,
    /// What is to be written to the client.
    pub(crate) out: Vec<u8>,
    /// The client's frame size limit, and the window its SETTINGS give new streams.
    max_frame: usize,
    initial_window: i64,
    /// The connection's windows: what this side may send, what the client may.
    send_window: i64,
    recv_window: i64,
    /// Connection-window bytes taken but not yet given back.
    released: usize,
    /// The highest stream id the client opened.
    last_id: u32,
    /// Streams closed lately, and whether this side reset them.
    closed: VecDeque<(u32, bool)>,
    block: Option<Block>,
    /// The client's first frame (its SETTINGS) has come.
    greeted: bool,
    closing: Closing,
    early_resets: u32,
    /// PING and SETTINGS acknowledgements queued since all that was queued was written.
    acks_owed: u32,
    /// Wakes the connection when a body is read from.
    pub(crate) waker: Arc<AtomicWaker>,
}

impl<T> Conn<T> {
    /// A connection whose client preface has been read: this side's SETTINGS and the
    /// connection window's raise are queued.
    pub(crate) fn new(max_header_list: usize) -> Conn<T> {
        let mut out = Vec::with_capacity(4096);
        frame::write_settings(
            &mut out,
            &[
                (setting::ENABLE_PUSH, 0),
                (setting::MAX_CONCURRENT_STREAMS, MAX_STREAMS),
                (setting::INITIAL_WINDOW_SIZE, WINDOW),
                (setting::MAX_HEADER_LIST_SIZE, max_header_list as u32),
            ],
        );
        frame::write_window_update(&mut out, 0, CONNECTION_WINDOW - DEFAULT_WINDOW as u32);
        Conn {
            streams: HashMap::default(),
            decoder: Decoder::new(max_header_list),
            out,
            max_frame: MAX_FRAME,
            initial_window: DEFAULT_WINDOW,
            send_window: DEFAULT_WINDOW,
            recv_window: i64::from(CONNECTION_WINDOW),
            released: 0,
            last_id: 0,
            closed: VecDeque::with_capacity(REMEMBERED),
            block: None,
            greeted: false,
            closing: Closing::No,
            early_resets: 0,
            acks_owed: 0,
            waker: Arc::new(AtomicWaker::new()),
        }
    }

    /// Takes one frame. `Ok(Some)` is a request to answer; an error is the
    /// connection's end (its GOAWAY is queued).
    pub(crate) fn receive(
        &mut self,
        head: Head,
        payload: &[u8],
    ) -> Result<Option<Incoming>, Reason> {
        match self.frame(head, payload) {
            Ok(opened) => Ok(opened),
            // No RST_STREAM for a stream never opened (RFC 9113 §5.1).
            Err(Error::Stream(id, _)) if id > self.last_id => {
                frame::write_goaway(&mut self.out, self.last_id, Reason::PROTOCOL_ERROR);
                Err(Reason::PROTOCOL_ERROR)
            }
            Err(Error::Stream(id, reason)) => {
                self.reset(id, reason);
                Ok(None)
            }
            Err(Error::Connection(reason)) => {
                frame::write_goaway(&mut self.out, self.last_id, reason);
                Err(reason)
            }
        }
    }

    /// One frame, its errors not yet acted on.
    fn frame(&mut self, head: Head, payload: &[u8]) -> Result<Option<Incoming>, Error> {
        if head.len > MAX_FRAME {
            return Err(Error::Connection(Reason::FRAME_SIZE_ERROR));
        }
        if !self.greeted {
            if head.kind != kind::SETTINGS || head.flags & 0x1 != 0 {
                return Err(Error::Connection(Reason::PROTOCOL_ERROR));
            }
            self.greeted = true;
        }
        if let Some(b) = &self.block {
            if head.kind != kind::CONTINUATION || head.stream != b.stream {
                return Err(Error::Connection(Reason::PROTOCOL_ERROR));
            }
        }
        match frame::parse(head, payload)? {
            Frame::Data {
                stream,
                data,
                end,
                flow,
            } => self.data(stream, data, end, flow).map(|()| None),
            Frame::Headers {
                stream,
                block,
                end_stream,
                end_headers,
            } => self.headers(stream, block, end_stream, end_headers),
            Frame::Continuation {
                stream,
                block,
                end_headers,
            } => self.continuation(stream, block, end_headers),
            Frame::Reset { stream, .. } => self.client_reset(stream).map(|()| None),
            Frame::Settings(params) => self.settings(params).map(|()| None),
            Frame::WindowUpdate { stream, increment } => {
                self.window_update(stream, increment).map(|()| None)
            }
            Frame::Ping(data) => {
                self.owe_ack()?;
                frame::write_ping(&mut self.out, data, true);
                Ok(None)
            }
            Frame::PingAck(data) => {
                if data == DRAIN_PING && self.closing == Closing::Announced {
                    self.close_final();
                }
                Ok(None)
            }
            // The client opens no more streams; it closes the connection when it is
            // done with the open ones (and the idle timeout closes it if it does not).
            Frame::GoAway { .. } => Ok(None),
            Frame::SettingsAck | Frame::Priority | Frame::Unknown => Ok(None),
        }
    }

    /// Whether `id` names a stream that was opened and is closed now, and whether this
    /// side closed it with a reset.
    fn was_closed(&self, id: u32) -> Option<bool> {
        self.closed.iter().find(|c| c.0 == id).map(|c| c.1)
    }

    /// Forgets stream `id`, remembering it as closed.
    fn close(&mut self, id: u32, by_reset: bool) {
        if let Some(s) = self.streams.remove(&id) {
            // Bytes of its body not yet taken go back to the connection's window.
            self.released += s.unread;
        }
        if self.closed.len() == REMEMBERED {
            self.closed.pop_front();
        }
        self.closed.push_back((id, by_reset));
    }

    /// Resets stream `id` (a stream error).
    pub(crate) fn reset(&mut self, id: u32, reason: Reason) {
        frame::write_reset(&mut self.out, id, reason);
        self.close(id, true);
    }

    /// A DATA frame (RFC 9113 §6.1).
    fn data(&mut self, id: u32, data: &[u8], end: bool, flow: u32) -> Result<(), Error> {
        let flow = i64::from(flow);
        if flow > self.recv_window {
            return Err(Error::Connection(Reason::FLOW_CONTROL_ERROR));
        }
        self.recv_window -= flow;
        // Padding is given back at once; the data when the request path takes it.
        let padding = (flow as usize) - data.len();
        self.released += padding;
        let Some(s) = self.streams.get_mut(&id).filter(|s| s.recv_open) else {
            self.released += data.len();
            return match (id > self.last_id, self.was_closed(id)) {
                (true, _) => Err(Error::Connection(Reason::PROTOCOL_ERROR)),
                // Frames sent before the client saw this side's reset.
                (false, Some(true)) => Ok(()),
                (false, _) => Err(Error::Stream(id, Reason::STREAM_CLOSED)),
            };
        };
        if flow > s.recv_window {
            self.released += data.len();
            return Err(Error::Stream(id, Reason::FLOW_CONTROL_ERROR));
        }
        s.recv_window -= flow;
        s.released += padding;
        s.received += data.len() as u64;
        if s.length
            .is_some_and(|n| s.received > n || (end && s.received != n))
        {
            self.released += data.len();
            return Err(Error::Stream(id, Reason::PROTOCOL_ERROR));
        }
        // Bytes nobody will read (the request path no longer holds the body) go back
        // at once.
        let kept = match &s.inbox {
            Some(inbox) if !data.is_empty() => inbox.data(Bytes::copy_from_slice(data)),
            _ => false,
        };
        match kept {
            true => s.unread += data.len(),
            false => {
                s.released += data.len();
                self.released += data.len();
            }
        }
        if end {
            self.end_of_request(id, None);
        }
        Ok(())
    }

    /// The client's side of stream `id` is done: its body ends (with `trailers`).
    fn end_of_request(&mut self, id: u32, trailers: Option<http::HeaderMap>) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.recv_open = false;
            if let Some(inbox) = &mut s.inbox {
                inbox.end(trailers);
            }
            if s.discard {
                self.close(id, false);
            }
        }
    }

    /// A HEADERS frame (RFC 9113 §6.2): a header block starts.
    fn headers(
        &mut self,
        id: u32,
        block: &[u8],
        end_stream: bool,
        end_headers: bool,
    ) -> Result<Option<Incoming>, Error> {
        if id % 2 == 0 {
            return Err(Error::Connection(Reason::PROTOCOL_ERROR));
        }
        if end_headers {
            return self.header_block(id, block, end_stream);
        }
        self.block = Some(Block {
            stream: id,
            bytes: block.to_vec(),
            end_stream,
            frames: 0,
        });
        Ok(None)
    }

    /// A CONTINUATION frame (RFC 9113 §6.10).
    fn continuation(
        &mut self,
        id: u32,
        fragment: &[u8],
        end_headers: bool,
    ) -> Result<Option<Incoming>, Error> {
        // Every error here ends the connection, so the block taken out is not put back.
        let Some(mut b) = self.block.take().filter(|b| b.stream == id) else {
            return Err(Error::Connection(Reason::PROTOCOL_ERROR));
        };
        b.frames += 1;
        if b.bytes.len() + fragment.len() > MAX_BLOCK || b.frames > MAX_CONTINUATIONS {
            return Err(Error::Connection(Reason::ENHANCE_YOUR_CALM));
        }
        b.bytes.extend_from_slice(fragment);
        if !end_headers {
            self.block = Some(b);
            return Ok(None);
        }
        self.header_block(id, &b.bytes, b.end_stream)
    }

    /// A whole header block on stream `id`: a request's head, or its trailers.
    fn header_block(
        &mut self,
        id: u32,
        block: &[u8],
        end_stream: bool,
    ) -> Result<Option<Incoming>, Error> {
        if let Some(s) = self.streams.get(&id) {
            let open = s.recv_open;
            // Trailers that end a body short of its stated length (RFC 9113 §8.1.1).
            let short = s.length.is_some_and(|n| n != s.received);
            // Decoded whatever comes of it: the tables must follow the client's.
            let trailers = self.decoder.trailers(block);
            return match (open, end_stream, trailers) {
                (false, _, _) => Err(Error::Stream(id, Reason::STREAM_CLOSED)),
                (true, _, Err(BlockError::Compression)) => {
                    Err(Error::Connection(Reason::COMPRESSION_ERROR))
                }
                (true, false, _) | (true, _, Err(_)) => {
                    Err(Error::Stream(id, Reason::PROTOCOL_ERROR))
                }
                (true, true, Ok(_)) if short => Err(Error::Stream(id, Reason::PROTOCOL_ERROR)),
                (true, true, Ok(t)) => {
                    self.end_of_request(id, Some(t));
                    Ok(None)
                }
            };
        }
        if id <= self.last_id {
            let _ = self.decoder.request(block);
            return match self.was_closed(id) {
                // Sent before the client saw this side's reset (RFC 9113 §5.1: ignored).
                Some(true) => Ok(None),
                Some(false) => Err(Error::Connection(Reason::STREAM_CLOSED)),
                None => Err(Error::Connection(Reason::PROTOCOL_ERROR)),
            };
        }
        self.last_id = id;
        let request = self.decoder.request(block);
        self.open(id, request, end_stream)
    }

    /// A new stream `id` whose head is `request`.
    fn open(
        &mut self,
        id: u32,
        request: Result<hpack::Request, BlockError>,
        end_stream: bool,
    ) -> Result<Option<Incoming>, Error> {
        let request = match request {
            Ok(r) => r,
            Err(BlockError::Compression) => {
                return Err(Error::Connection(Reason::COMPRESSION_ERROR))
            }
            Err(BlockError::Malformed(why)) => {
                tracing::debug!(stream = id, why, "a malformed HTTP/2 request");
                return Err(Error::Stream(id, Reason::PROTOCOL_ERROR));
            }
            Err(BlockError::TooLarge) => {
                self.answer_at_once(
                    id,
                    http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    end_stream,
                );
                return Ok(None);
            }
        };
        if self.closing == Closing::Final {
            // After the last GOAWAY: a stream this side said it would not act on.
            return Ok(None);
        }
        if self.streams.len() >= MAX_STREAMS as usize {
            return Err(Error::Stream(id, Reason::REFUSED_STREAM));
        }
        if request.extended_connect {
            self.answer_at_once(id, http::StatusCode::NOT_IMPLEMENTED, end_stream);
            return Ok(None);
        }
        let length = request.length;
        let (inbox, body) = match end_stream {
            true => (None, None),
            false => {
                let (i, b) = body::channel(length, &self.waker);
                (Some(i), Some(b))
            }
        };
        if end_stream && length.is_some_and(|n| n != 0) {
            return Err(Error::Stream(id, Reason::PROTOCOL_ERROR));
        }
        self.streams.insert(
            id,
            Stream {
                recv_open: !end_stream,
                recv_window: i64::from(WINDOW),
                released: 0,
                unread: 0,
                answered: false,
                discard: false,
                send_window: self.initial_window,
                length,
                received: 0,
                inbox,
                task: None,
            },
        );
        Ok(Some(Incoming {
            stream: id,
            request,
            body,
        }))
    }

    /// Answers stream `id` with `status` and no body, without the request path; a
    /// request still sending is told to stop (RFC 9113 §8.1).
    fn answer_at_once(&mut self, id: u32, status: http::StatusCode, end_stream: bool) {
        let mut block = Vec::new();
        hpack::encode_answer(&mut block, status, &http::HeaderMap::new());
        frame::write_headers(&mut self.out, id, &block, true, self.max_frame);
        match end_stream {
            true => self.close(id, false),
            false => self.reset(id, Reason::NO_ERROR),
        }
    }

    /// An RST_STREAM from the client (RFC 9113 §6.4).
    fn client_reset(&mut self, id: u32) -> Result<(), Error> {
        if id > self.last_id {
            return Err(Error::Connection(Reason::PROTOCOL_ERROR));
        }
        let Some(s) = self.streams.get(&id) else {
            return Ok(());
        };
        if !s.answered {
            self.early_resets += 1;
        }
        self.close(id, false);
        if self.early_resets > MAX_EARLY_RESETS {
            return Err(Error::Connection(Reason::ENHANCE_YOUR_CALM));
        }
        Ok(())
    }

    /// One more acknowledgement queued; too many unwritten is a flood.
    fn owe_ack(&mut self) -> Result<(), Error> {
        self.acks_owed += 1;
        match self.acks_owed > MAX_ACKS_OWED {
            true => Err(Error::Connection(Reason::ENHANCE_YOUR_CALM)),
            false => Ok(()),
        }
    }

    /// All that was queued has been written: no acknowledgement is owed.
    pub(crate) fn written(&mut self) {
        self.acks_owed = 0;
    }

    /// The client's SETTINGS (RFC 9113 §6.5.2), acknowledged.
    fn settings(&mut self, params: &[u8]) -> Result<(), Error> {
        self.owe_ack()?;
        for p in params.chunks_exact(6) {
            let (id, value) = frame::setting(p);
            match id {
                setting::ENABLE_PUSH if value > 1 => {
                    return Err(Error::Connection(Reason::PROTOCOL_ERROR))
                }
                setting::INITIAL_WINDOW_SIZE => self.initial_window_size(value)?,
                setting::MAX_FRAME_SIZE => {
                    if !(16_384..=16_777_215).contains(&value) {
                        return Err(Error::Connection(Reason::PROTOCOL_ERROR));
                    }
                    self.max_frame = value as usize;
                }
                // The encoder keeps no dynamic table: the size the client's decoder
                // allows does not matter (see `hpack`).
                setting::HEADER_TABLE_SIZE | setting::MAX_CONCURRENT_STREAMS => {}
                setting::MAX_HEADER_LIST_SIZE | setting::ENABLE_PUSH => {}
                _ => {}
            }
        }
        frame::write_settings_ack(&mut self.out);
        Ok(())
    }

    /// A new initial window: every stream's send window moves by the difference (RFC
    /// 9113 §6.9.2), and may go below zero.
    fn initial_window_size(&mut self, value: u32) -> Result<(), Error> {
        let value = i64::from(value);
        if value > MAX_WINDOW {
            return Err(Error::Connection(Reason::FLOW_CONTROL_ERROR));
        }
        let delta = value - self.initial_window;
        self.initial_window = value;
        for s in self.streams.values_mut() {
            s.send_window += delta;
            if s.send_window > MAX_WINDOW {
                return Err(Error::Connection(Reason::FLOW_CONTROL_ERROR));
            }
        }
        Ok(())
    }

    /// A WINDOW_UPDATE (RFC 9113 §6.9).
    fn window_update(&mut self, id: u32, increment: u32) -> Result<(), Error> {
        let increment = i64::from(increment);
        if id == 0 {
            self.send_window += increment;
            if self.send_window > MAX_WINDOW {
                return Err(Error::Connection(Reason::FLOW_CONTROL_ERROR));
            }
            return Ok(());
        }
        if id > self.last_id {
            return Err(Error::Connection(Reason::PROTOCOL_ERROR));
        }
        if let Some(s) = self.streams.get_mut(&id) {
            s.send_window += increment;
            if s.send_window > MAX_WINDOW {
                return Err(Error::Stream(id, Reason::FLOW_CONTROL_ERROR));
            }
        }
        Ok(())
    }

    /// Asks for a graceful close: a GOAWAY naming the last stream id possible and a
    /// PING; the GOAWAY naming the real last one follows the PING's answer (RFC 9113
    /// §6.8).
    pub(crate) fn close_gracefully(&mut self) {
        if self.closing == Closing::No {
            frame::write_goaway(&mut self.out, (1 << 31) - 1, Reason::NO_ERROR);
            frame::write_ping(&mut self.out, DRAIN_PING, false);
            self.closing = Closing::Announced;
        }
    }

    /// The GOAWAY naming the last stream this side acts on.
    fn close_final(&mut self) {
        frame::write_goaway(&mut self.out, self.last_id, Reason::NO_ERROR);
        self.closing = Closing::Final;
    }

    /// Whether no stream is open.
    pub(crate) fn is_idle(&self) -> bool {
        self.streams.is_empty()
    }

    /// Whether the connection is done: no stream will come (this side's last GOAWAY
    /// went out) and none is left.
    pub(crate) fn is_done(&self) -> bool {
        self.closing == Closing::Final && self.streams.is_empty()
    }

    /// The stream `id`, while it is open.
    pub(crate) fn stream(&mut self, id: u32) -> Option<&mut Stream<T>> {
        self.streams.get_mut(&id)
    }

    /// The ids of the open streams.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.streams.keys().copied()
    }

    /// Writes an answer's head (`block`, encoded) on stream `id`; `end` when it has no
    /// body.
    pub(crate) fn send_head(&mut self, id: u32, block: &[u8], end: bool) {
        frame::write_headers(&mut self.out, id, block, end, self.max_frame);
        if let Some(s) = self.streams.get_mut(&id) {
            s.answered = true;
        }
        if end {
            self.sent_end(id);
        }
    }

    /// Writes trailers on stream `id`, which end it.
    pub(crate) fn send_trailers(&mut self, id: u32, block: &[u8]) {
        self.send_head(id, block, true);
    }

    /// How many bytes of DATA stream `id` may send now.
    pub(crate) fn capacity(&self, id: u32) -> usize {
        let stream = self.streams.get(&id).map_or(0, |s| s.send_window);
        stream.min(self.send_window).clamp(0, self.max_frame as i64) as usize
    }

    /// Writes a DATA frame on stream `id` (no longer than [`Self::capacity`]).
    pub(crate) fn send_data(&mut self, id: u32, data: &[u8], end: bool) {
        frame::write_data(&mut self.out, id, data, end);
        let n = data.len() as i64;
        self.send_window -= n;
        if let Some(s) = self.streams.get_mut(&id) {
            s.send_window -= n;
        }
        if end {
            self.sent_end(id);
        }
    }

    /// This side's end of stream `id` went out: the stream closes or, while the client
    /// still sends, stays half-closed until it ends, what it sends given back at once
    /// (the request path no longer reads it). No RST_STREAM tells it to stop (RFC 9113
    /// §8.1 allows one): a reset that crosses the client's next frames is an error to it.
    fn sent_end(&mut self, id: u32) {
        self.early_resets = self.early_resets.saturating_sub(1);
        match self.streams.get_mut(&id) {
            Some(s) if s.recv_open => {
                s.task = None;
                s.inbox = None;
                s.released += s.unread;
                self.released += s.unread;
                s.unread = 0;
                s.answered = true;
                s.discard = true;
            }
            _ => self.close(id, false),
        }
    }

    /// Gives back to the client what the request path took of its bodies: a
    /// WINDOW_UPDATE for a stream, or the connection, once half a window is owed.
    pub(crate) fn give_back(&mut self) {
        let half = (WINDOW / 2) as usize;
        for (&id, s) in self.streams.iter_mut() {
            let taken = s.inbox.as_ref().map_or(0, Inbox::taken);
            s.released += taken;
            s.unread -= taken.min(s.unread);
            self.released += taken;
            if s.released >= half && s.recv_open {
                frame::write_window_update(&mut self.out, id, s.released as u32);
                s.recv_window += s.released as i64;
                s.released = 0;
            }
        }
        if self.released >= half {
            frame::write_window_update(&mut self.out, 0, self.released as u32);
            self.recv_window += self.released as i64;
            self.released = 0;
        }
    }
}

#[cfg(test)]
mod tests;

//! HTTP/2 frames (RFC 9113 §4 and §6): a frame's head read from nine bytes, its payload
//! checked and split into what the connection acts on, and the frames this side writes.
//!
//! Every rule here is about one frame alone (its length, its stream, its padding); the
//! rules between frames (stream states, windows, header blocks) are the connection's.

use super::{Error, Reason};

/// A frame's type (RFC 9113 §6).
pub(crate) mod kind {
    pub(crate) const DATA: u8 = 0x0;
    pub(crate) const HEADERS: u8 = 0x1;
    pub(crate) const PRIORITY: u8 = 0x2;
    pub(crate) const RST_STREAM: u8 = 0x3;
    pub(crate) const SETTINGS: u8 = 0x4;
    pub(crate) const PUSH_PROMISE: u8 = 0x5;
    pub(crate) const PING: u8 = 0x6;
    pub(crate) const GOAWAY: u8 = 0x7;
    pub(crate) const WINDOW_UPDATE: u8 = 0x8;
    pub(crate) const CONTINUATION: u8 = 0x9;
}

/// Flags.
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

/// The length of a frame's head.
pub(crate) const HEAD_LEN: usize = 9;

/// The largest window (RFC 9113 §6.9.1).
pub(crate) const MAX_WINDOW: i64 = (1 << 31) - 1;

/// A frame's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    /// The payload's length.
    pub(crate) len: usize,
    /// The frame's type.
    pub(crate) kind: u8,
    /// Its flags.
    pub(crate) flags: u8,
    /// Its stream (the reserved bit cleared, RFC 9113 §4.1).
    pub(crate) stream: u32,
}

impl Head {
    /// The head in `b` (at least [`HEAD_LEN`] bytes).
    pub(crate) fn read(b: &[u8]) -> Head {
        Head {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize,
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }
}

/// A frame the connection acts on, its payload checked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    /// DATA: its bytes (padding removed), whether it ends the stream, and how much of
    /// the window it takes (padding counted, RFC 9113 §6.1).
    Data {
        stream: u32,
        data: &'a [u8],
        end: bool,
        flow: u32,
    },
    /// HEADERS: the start of a header block.
    Headers {
        stream: u32,
        block: &'a [u8],
        end_stream: bool,
        end_headers: bool,
    },
    /// PRIORITY (parsed and ignored, RFC 9113 §5.3.2).
    Priority,
    /// RST_STREAM.
    Reset { stream: u32, code: u32 },
    /// SETTINGS (not an acknowledgement): its parameters, six bytes each.
    Settings(&'a [u8]),
    /// SETTINGS with ACK.
    SettingsAck,
    /// PING, to be answered.
    Ping([u8; 8]),
    /// PING with ACK: the answer to one of this side's.
    PingAck([u8; 8]),
    /// GOAWAY from the client.
    GoAway { code: u32 },
    /// WINDOW_UPDATE (stream 0: the connection's window).
    WindowUpdate { stream: u32, increment: u32 },
    /// CONTINUATION.
    Continuation {
        stream: u32,
        block: &'a [u8],
        end_headers: bool,
    },
    /// A frame of a type this side does not know, ignored (RFC 9113 §4.1).
    Unknown,
}

/// The frame of `head` and `payload` (`payload.len() == head.len`), or the error a
/// malformed one is.
pub(crate) fn parse(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let on_connection = head.stream == 0;
    match head.kind {
        kind::DATA => {
            if on_connection {
                return Err(Error::Connection(Reason::PROTOCOL_ERROR));
            }
            Ok(Frame::Data {
                stream: head.stream,
                data: unpad(head.flags, payload)?,
                end: head.flags & END_STREAM != 0,
                flow: payload.len() as u32,
            })
        }
        kind::HEADERS => headers(head, payload),
        kind::PRIORITY => priority(head, payload),
        kind::RST_STREAM => {
            if on_connection {
                return Err(Error::Connection(Reason::PROTOCOL_ERROR));
            }
            let code = word(payload).ok_or(Error::Connection(Reason::FRAME_SIZE_ERROR))?;
            Ok(Frame::Reset {
                stream: head.stream,
                code,
            })
        }
        kind::SETTINGS => settings(head, payload),
        kind::PUSH_PROMISE => Err(Error::Connection(Reason::PROTOCOL_ERROR)),
        kind::PING => ping(head, payload),
        kind::GOAWAY => goaway(head, payload),
        kind::WINDOW_UPDATE => window_update(head, payload),
        kind::CONTINUATION => {
            if on_connection {
                return Err(Error::Connection(Reason::PROTOCOL_ERROR));
            }
            Ok(Frame::Continuation {
                stream: head.stream,
                block: payload,
                end_headers: head.flags & END_HEADERS != 0,
            })
        }
        _ => Ok(Frame::Unknown),
    }
}

/// A PRIORITY frame (RFC 9113 §6.3).
fn priority(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    if head.stream == 0 {
        return Err(Error::Connection(Reason::PROTOCOL_ERROR));
    }
    if payload.len() != 5 {
        return Err(Error::Stream(head.stream, Reason::FRAME_SIZE_ERROR));
    }
    if dependency(payload) == head.stream {
        return Err(Error::Stream(head.stream, Reason::PROTOCOL_ERROR));
    }
    Ok(Frame::Priority)
}

/// A GOAWAY frame (RFC 9113 §6.8).
fn goaway(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    if head.stream != 0 {
        return Err(Error::Connection(Reason::PROTOCOL_ERROR));
    }
    if payload.len() < 8 {
        return Err(Error::Connection(Reason::FRAME_SIZE_ERROR));
    }
    let code = word(&payload[4..8]).unwrap_or(0);
    Ok(Frame::GoAway { code })
}

/// A WINDOW_UPDATE frame (RFC 9113 §6.9): an increment of 0 is an error of the stream
/// (or of the connection, on stream 0).
fn window_update(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    let w = word(payload).ok_or(Error::Connection(Reason::FRAME_SIZE_ERROR))?;
    let increment = w & 0x7fff_ffff;
    if increment == 0 {
        return Err(match head.stream {
            0 => Error::Connection(Reason::PROTOCOL_ERROR),
            id => Error::Stream(id, Reason::PROTOCOL_ERROR),
        });
    }
    Ok(Frame::WindowUpdate {
        stream: head.stream,
        increment,
    })
}

/// A HEADERS frame: padding and the priority fields taken off the block.
fn headers(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    if head.stream == 0 {
        return Err(Error::Connection(Reason::PROTOCOL_ERROR));
    }
    let mut block = unpad(head.flags, payload)?;
    if head.flags & PRIORITY_FLAG != 0 {
        if block.len() < 5 {
            return Err(Error::Connection(Reason::FRAME_SIZE_ERROR));
        }
        if dependency(block) == head.stream {
            return Err(Error::Stream(head.stream, Reason::PROTOCOL_ERROR));
        }
        block = &block[5..];
    }
    Ok(Frame::Headers {
        stream: head.stream,
        block,
        end_stream: head.flags & END_STREAM != 0,
        end_headers: head.flags & END_HEADERS != 0,
    })
}

/// A SETTINGS frame (RFC 9113 §6.5).
fn settings(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    if head.stream != 0 {
        return Err(Error::Connection(Reason::PROTOCOL_ERROR));
    }
    if head.flags & ACK != 0 {
        return match payload.is_empty() {
            true => Ok(Frame::SettingsAck),
            false => Err(Error::Connection(Reason::FRAME_SIZE_ERROR)),
        };
    }
    if payload.len() % 6 != 0 {
        return Err(Error::Connection(Reason::FRAME_SIZE_ERROR));
    }
    Ok(Frame::Settings(payload))
}

/// A PING frame (RFC 9113 §6.7).
fn ping(head: Head, payload: &[u8]) -> Result<Frame<'_>, Error> {
    if head.stream != 0 {
        return Err(Error::Connection(Reason::PROTOCOL_ERROR));
    }
    let data: [u8; 8] = payload
        .try_into()
        .map_err(|_| Error::Connection(Reason::FRAME_SIZE_ERROR))?;
    Ok(match head.flags & ACK != 0 {
        true => Frame::PingAck(data),
        false => Frame::Ping(data),
    })
}

/// The payload of a padded frame without its padding (RFC 9113 §6.1, §6.2): a padding
/// as long as the payload or longer is a connection error.
fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], Error> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let Some((&pad, rest)) = payload.split_first() else {
        return Err(Error::Connection(Reason::FRAME_SIZE_ERROR));
    };
    let keep = rest
        .len()
        .checked_sub(pad as usize)
        .ok_or(Error::Connection(Reason::PROTOCOL_ERROR))?;
    Ok(&rest[..keep])
}

/// The stream a priority block depends on.
fn dependency(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff
}

/// A four-byte payload as a number; `None` when it is not four bytes.
fn word(b: &[u8]) -> Option<u32> {
    let b: [u8; 4] = b.try_into().ok()?;
    Some(u32::from_be_bytes(b))
}

/// One SETTINGS parameter, as each six bytes of a SETTINGS frame give it.
pub(crate) fn setting(b: &[u8]) -> (u16, u32) {
    (
        u16::from_be_bytes([b[0], b[1]]),
        u32::from_be_bytes([b[2], b[3], b[4], b[5]]),
    )
}

/// SETTINGS parameters (RFC 9113 §6.5.2).
pub(crate) mod setting {
    pub(crate) const HEADER_TABLE_SIZE: u16 = 0x1;
    pub(crate) const ENABLE_PUSH: u16 = 0x2;
    pub(crate) const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub(crate) const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub(crate) const MAX_FRAME_SIZE: u16 = 0x5;
    pub(crate) const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Writes a frame's head.
pub(crate) fn write_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = (len as u32).to_be_bytes();
    let stream = stream.to_be_bytes();
    out.extend_from_slice(&[
        len[1], len[2], len[3], kind, flags, stream[0], stream[1], stream[2], stream[3],
    ]);
}

/// Writes a SETTINGS frame with `params`.
pub(crate) fn write_settings(out: &mut Vec<u8>, params: &[(u16, u32)]) {
    write_head(out, params.len() * 6, kind::SETTINGS, 0, 0);
    for (id, value) in params {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Writes the acknowledgement of the client's SETTINGS.
pub(crate) fn write_settings_ack(out: &mut Vec<u8>) {
    write_head(out, 0, kind::SETTINGS, ACK, 0);
}

/// Writes a PING (`ack`: the answer to the client's).
pub(crate) fn write_ping(out: &mut Vec<u8>, data: [u8; 8], ack: bool) {
    write_head(out, 8, kind::PING, if ack { ACK } else { 0 }, 0);
    out.extend_from_slice(&data);
}

/// Writes a GOAWAY naming `last` as the last stream this side may act on.
pub(crate) fn write_goaway(out: &mut Vec<u8>, last: u32, reason: Reason) {
    write_head(out, 8, kind::GOAWAY, 0, 0);
    out.extend_from_slice(&last.to_be_bytes());
    out.extend_from_slice(&reason.0.to_be_bytes());
}

/// Writes an RST_STREAM.
pub(crate) fn write_reset(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    write_head(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&reason.0.to_be_bytes());
}

/// Writes a WINDOW_UPDATE.
pub(crate) fn write_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    write_head(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&increment.to_be_bytes());
}

/// Writes a DATA frame.
pub(crate) fn write_data(out: &mut Vec<u8>, stream: u32, data: &[u8], end: bool) {
    write_head(
        out,
        data.len(),
        kind::DATA,
        if end { END_STREAM } else { 0 },
        stream,
    );
    out.extend_from_slice(data);
}

/// Writes a header block as a HEADERS frame and as many CONTINUATION frames as
/// `max_frame` asks for.
pub(crate) fn write_headers(
    out: &mut Vec<u8>,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let mut chunks = block.chunks(max_frame.max(1)).peekable();
    let first = chunks.next().unwrap_or_default();
    let end_headers = chunks.peek().is_none();
    let flags =
        (if end_stream { END_STREAM } else { 0 }) | (if end_headers { END_HEADERS } else { 0 });
    write_head(out, first.len(), kind::HEADERS, flags, stream);
    out.extend_from_slice(first);
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        write_head(
            out,
            chunk.len(),
            kind::CONTINUATION,
            if last { END_HEADERS } else { 0 },
            stream,
        );
        out.extend_from_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(kind: u8, flags: u8, stream: u32, len: usize) -> Head {
        Head {
            len,
            kind,
            flags,
            stream,
        }
    }

    #[test]
    fn a_head_reads_back_as_written_without_the_reserved_bit() {
        let mut out = Vec::new();
        write_head(&mut out, 0x01_0203, kind::HEADERS, 0x25, 7);
        out[5] |= 0x80;
        assert_eq!(Head::read(&out), head(kind::HEADERS, 0x25, 7, 0x01_0203));
    }

    #[test]
    fn padding_is_taken_off_and_too_much_of_it_is_a_connection_error() {
        let p = [2, b'a', b'b', 0, 0];
        let f = parse(head(kind::DATA, PADDED | END_STREAM, 1, 5), &p).unwrap();
        assert_eq!(
            f,
            Frame::Data {
                stream: 1,
                data: b"ab",
                end: true,
                flow: 5
            }
        );
        let bad = [5, 0, 0];
        assert_eq!(
            parse(head(kind::DATA, PADDED, 1, 3), &bad),
            Err(Error::Connection(Reason::PROTOCOL_ERROR))
        );
    }

    #[test]
    fn fixed_length_frames_of_another_length_are_refused() {
        let rst = parse(head(kind::RST_STREAM, 0, 1, 3), &[0, 0, 0]);
        assert_eq!(rst, Err(Error::Connection(Reason::FRAME_SIZE_ERROR)));
        let ping = parse(head(kind::PING, 0, 0, 6), &[0; 6]);
        assert_eq!(ping, Err(Error::Connection(Reason::FRAME_SIZE_ERROR)));
        let prio = parse(head(kind::PRIORITY, 0, 3, 4), &[0; 4]);
        assert_eq!(prio, Err(Error::Stream(3, Reason::FRAME_SIZE_ERROR)));
        let settings = parse(head(kind::SETTINGS, 0, 0, 5), &[0; 5]);
        assert_eq!(settings, Err(Error::Connection(Reason::FRAME_SIZE_ERROR)));
        let ack = parse(head(kind::SETTINGS, ACK, 0, 6), &[0; 6]);
        assert_eq!(ack, Err(Error::Connection(Reason::FRAME_SIZE_ERROR)));
    }

    #[test]
    fn a_stream_depending_on_itself_is_a_stream_error() {
        let p = [0, 0, 0, 3, 16];
        let f = parse(head(kind::PRIORITY, 0, 3, 5), &p);
        assert_eq!(f, Err(Error::Stream(3, Reason::PROTOCOL_ERROR)));
        let mut h = vec![0, 0, 0, 5, 16];
        h.push(0x82);
        let f = parse(head(kind::HEADERS, PRIORITY_FLAG, 5, h.len()), &h);
        assert_eq!(f, Err(Error::Stream(5, Reason::PROTOCOL_ERROR)));
    }

    #[test]
    fn a_long_header_block_goes_out_in_continuation_frames() {
        let block = vec![7u8; 40];
        let mut out = Vec::new();
        write_headers(&mut out, 1, &block, true, 16);
        let first = Head::read(&out);
        assert_eq!(first, head(kind::HEADERS, END_STREAM, 1, 16));
        let second = Head::read(&out[9 + 16..]);
        assert_eq!(second, head(kind::CONTINUATION, 0, 1, 16));
        let third = Head::read(&out[2 * (9 + 16)..]);
        assert_eq!(third, head(kind::CONTINUATION, END_HEADERS, 1, 8));
    }
}

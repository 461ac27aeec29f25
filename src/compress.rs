//! Compression of answers on a route with `compress` (`docs/policies.md`,
//! "Compression"): which coding a request accepts, which answers are worth it, and the
//! streaming encoder a body goes through.
//!
//! The encoders are async-compression's, writing into a `Vec` that each frame takes
//! whole: a body is compressed as it arrives, and flushed whenever its source has
//! nothing more yet, so that a slow stream's bytes are not held back.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use async_compression::tokio::write::{BrotliEncoder, GzipEncoder, ZstdEncoder};
use async_compression::Level;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWrite;

pub use crate::config::compress::Coding;

/// gzip's level: 1–9. Level 4 keeps most of level 6's ratio on JSON at over 300 MB/s
/// (`docs/performance.md`, "Basic auth and compression"); its state is about 300 KiB
/// whatever the level.
pub const GZIP_LEVEL: i32 = 4;
/// Brotli's quality: 0–11. Qualities 2 to 4 use hash tables of a fixed 0.5–1 MiB and
/// more that no parameter shrinks, over the 512 KiB an answer may hold; quality 1 holds
/// about 120 KiB (`docs/performance.md`, "Compression's memory").
pub const BROTLI_QUALITY: i32 = 1;
/// Zstandard's level: 1 (its "fast" strategy, which needs no chain table) with the
/// tables below compresses JSON better than level 3 with tables as small.
pub const ZSTD_LEVEL: i32 = 1;
/// Each encoder's window, as log2 of bytes: 64 KiB bounds a stream's memory (Brotli's
/// and Zstandard's defaults reach megabytes) and loses little on answers.
const WINDOW_LOG: u32 = 16;
/// Zstandard's hash table, as log2 of entries (4 bytes each): 64 KiB.
const ZSTD_HASH_LOG: u32 = 14;

/// Answers compressed at once when nothing says otherwise (`compress_max_in_flight`).
pub const MAX_IN_FLIGHT: usize = 1024;

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static MOST_IN_FLIGHT: AtomicUsize = AtomicUsize::new(MAX_IN_FLIGHT);

/// Sets how many answers may be compressed at once (`compress_max_in_flight`).
pub fn set_max_in_flight(most: usize) {
    MOST_IN_FLIGHT.store(most, Ordering::Relaxed);
}

/// One of the answers being compressed, counted until dropped: beyond
/// `compress_max_in_flight` of them, answers go out as they came, so that many clients
/// that stop reading cannot make fulcrum hold an encoder each without bound.
#[derive(Debug)]
pub struct Slot(());

impl Slot {
    /// A slot, when fewer than the most are taken.
    pub fn take() -> Option<Slot> {
        let most = MOST_IN_FLIGHT.load(Ordering::Relaxed);
        let taken = IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        if taken >= most {
            IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The coding to answer with: among `offered` (most preferred first), the one
/// `accept` (an `Accept-Encoding` value) gives the highest q-value above 0, ties going to
/// `offered`'s order. A coding not named takes the q-value of `*` when there is one.
pub fn negotiate(accept: &[u8], offered: &[Coding]) -> Option<Coding> {
    let mut best: Option<(Coding, u16)> = None;
    for &c in offered {
        let q = q_value(accept, c.name());
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((c, q));
        }
    }
    best.map(|(c, _)| c)
}

/// The q-value (in thousandths) `accept` gives `coding`: its own, else `*`'s, else 0.
fn q_value(accept: &[u8], coding: &str) -> u16 {
    let mut star = 0;
    for item in accept.split(|&b| b == b',') {
        let mut parts = item.split(|&b| b == b';');
        let name = parts.next().unwrap_or_default().trim_ascii();
        let q = parts
            .find_map(|p| {
                let p = p.trim_ascii();
                let v = p.strip_prefix(b"q=").or_else(|| p.strip_prefix(b"Q="))?;
                Some(thousandths(v))
            })
            .unwrap_or(1000);
        // `x-gzip` is gzip (RFC 9110 §8.4.1.3).
        if name.eq_ignore_ascii_case(coding.as_bytes())
            || (coding == "gzip" && name.eq_ignore_ascii_case(b"x-gzip"))
        {
            return q;
        }
        if name == b"*" {
            star = q;
        }
    }
    star
}

/// A q-value (`0`, `0.5`, `1.000`) in thousandths; anything else counts as 0.
fn thousandths(v: &[u8]) -> u16 {
    match v {
        [b'1'] | [b'1', b'.', ..] => 1000,
        [b'0'] => 0,
        [b'0', b'.', digits @ ..] if digits.len() <= 3 && digits.iter().all(u8::is_ascii_digit) => {
            let mut n = 0u16;
            for i in 0..3 {
                n = n * 10 + digits.get(i).map_or(0, |d| u16::from(d - b'0'));
            }
            n
        }
        _ => 0,
    }
}

/// Media types compressed on every route with `compress`, beside `text/*`.
const COMPRESSIBLE: [&str; 4] = [
    "application/json",
    "application/javascript",
    "application/xml",
    "image/svg+xml",
];

/// Whether an answer of `content_type` is compressed: `text/*` (not an event stream)
/// and the usual structured types, plus `extra` (exact, or `type/*`); never gRPC.
pub fn compressible(content_type: &[u8], extra: &[String]) -> bool {
    let essence = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let Ok(essence) = std::str::from_utf8(essence) else {
        return false;
    };
    let lower = essence.to_ascii_lowercase();
    if lower == "text/event-stream" || lower.starts_with("application/grpc") {
        return false;
    }
    let ty = lower.split('/').next().unwrap_or_default();
    lower.starts_with("text/")
        || COMPRESSIBLE.contains(&lower.as_str())
        || extra.iter().any(|e| {
            *e == lower
                || e.strip_suffix("/*")
                    .is_some_and(|t| t == ty && lower.contains('/'))
        })
}

/// One coding's encoder, writing into a `Vec`.
#[derive(Debug)]
enum Encoder {
    Zstd(ZstdEncoder<Vec<u8>>),
    /// Boxed: its state is kilobytes inline.
    Br(Box<BrotliEncoder<Vec<u8>>>),
    Gzip(GzipEncoder<Vec<u8>>),
}

impl Encoder {
    fn new(coding: Coding) -> Encoder {
        let out = Vec::new();
        match coding {
            Coding::Zstd => {
                use async_compression::zstd::CParameter;
                // Tables sized down with the window (`docs/policies.md`).
                let params = [
                    CParameter::window_log(WINDOW_LOG),
                    CParameter::hash_log(ZSTD_HASH_LOG),
                    CParameter::chain_log(ZSTD_HASH_LOG),
                ];
                let level = Level::Precise(ZSTD_LEVEL);
                Encoder::Zstd(ZstdEncoder::with_quality_and_params(out, level, &params))
            }
            Coding::Br => {
                let params = async_compression::brotli::EncoderParams::default()
                    .quality(Level::Precise(BROTLI_QUALITY))
                    .window_size(WINDOW_LOG as i32)
                    .text_mode();
                Encoder::Br(Box::new(BrotliEncoder::with_params(out, params)))
            }
            Coding::Gzip => {
                Encoder::Gzip(GzipEncoder::with_quality(out, Level::Precise(GZIP_LEVEL)))
            }
        }
    }

    fn writer(&mut self) -> Pin<&mut (dyn AsyncWrite + Unpin)> {
        match self {
            Encoder::Zstd(e) => Pin::new(e),
            Encoder::Br(e) => Pin::new(&mut **e),
            Encoder::Gzip(e) => Pin::new(e),
        }
    }

    /// What it has written so far, taken.
    fn take(&mut self) -> Option<Bytes> {
        let out = match self {
            Encoder::Zstd(e) => e.get_mut(),
            Encoder::Br(e) => e.get_mut(),
            Encoder::Gzip(e) => e.get_mut(),
        };
        (!out.is_empty()).then(|| Bytes::from(std::mem::take(out)))
    }

    /// Compresses all of `data`. Writing into a `Vec` never waits, so a pending write
    /// cannot happen; it is an error rather than a hang if it ever did.
    fn write(&mut self, cx: &mut Context<'_>, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            match self.writer().poll_write(cx, data) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => data = &data[n..],
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Err(io::ErrorKind::WouldBlock.into()),
            }
        }
        Ok(())
    }

    /// Flushes (`finish`: ends) the stream into the `Vec`.
    fn flush(&mut self, cx: &mut Context<'_>, finish: bool) -> io::Result<()> {
        let w = self.writer();
        let r = if finish {
            w.poll_shutdown(cx)
        } else {
            w.poll_flush(cx)
        };
        match r {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

/// A body compressed as it streams. Its trailers are dropped (a compressed answer's
/// length and digests are not the backend's any more).
#[derive(Debug)]
pub struct Compressed<B> {
    inner: B,
    /// `None` once the stream has been finished.
    encoder: Option<Encoder>,
    /// Data went in since the last flush.
    unflushed: bool,
    /// Its place among the answers compressed at once.
    _slot: Slot,
}

impl<B> Compressed<B> {
    /// `inner`, compressed with `coding`, holding `slot` while it lives.
    pub fn new(inner: B, coding: Coding, slot: Slot) -> Compressed<B> {
        Compressed {
            inner,
            encoder: Some(Encoder::new(coding)),
            unflushed: false,
            _slot: slot,
        }
    }
}

impl<B> Body for Compressed<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: From<io::Error>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        loop {
            let Some(enc) = this.encoder.as_mut() else {
                return Poll::Ready(None);
            };
            let out = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    enc.write(cx, &data)?;
                    this.unflushed |= !data.is_empty();
                    enc.take()
                }
                Poll::Ready(Some(Err(e))) => {
                    // Cut: the stream is never finished as if whole.
                    this.encoder = None;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    enc.flush(cx, true)?;
                    let last = enc.take();
                    this.encoder = None;
                    return Poll::Ready(last.map(|b| Ok(Frame::data(b))));
                }
                Poll::Pending if this.unflushed => {
                    // Nothing more yet: what came so far goes out now.
                    this.unflushed = false;
                    enc.flush(cx, false)?;
                    match enc.take() {
                        Some(b) => Some(b),
                        None => return Poll::Pending,
                    }
                }
                Poll::Pending => return Poll::Pending,
            };
            if let Some(b) = out {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.encoder.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[test]
    fn the_highest_q_value_wins_and_ties_go_to_the_configured_order() {
        let all = Coding::ALL;
        assert_eq!(negotiate(b"gzip, br, zstd", &all), Some(Coding::Zstd));
        assert_eq!(negotiate(b"gzip;q=1, br;q=0.9", &all), Some(Coding::Gzip));
        assert_eq!(
            negotiate(b"br;q=0.5, gzip;q=0.500", &[Coding::Gzip, Coding::Br]),
            Some(Coding::Gzip)
        );
        assert_eq!(negotiate(b"*;q=0.2, zstd;q=0", &all), Some(Coding::Br));
        assert_eq!(negotiate(b"identity", &all), None);
        assert_eq!(negotiate(b"", &all), None);
        assert_eq!(negotiate(b"gzip;q=0", &all), None);
        assert_eq!(negotiate(b"X-GZIP", &all), Some(Coding::Gzip));
        assert_eq!(
            negotiate(b"deflate, gzip ; q=0.8", &[Coding::Br, Coding::Gzip]),
            Some(Coding::Gzip)
        );
        assert_eq!(negotiate(b"gzip;q=bogus, br", &all), Some(Coding::Br));
    }

    #[test]
    fn text_and_structured_types_are_compressible_streams_and_grpc_are_not() {
        let none: &[String] = &[];
        for t in [
            "text/html; charset=utf-8",
            "TEXT/CSS",
            "application/json",
            "image/svg+xml",
        ] {
            assert!(compressible(t.as_bytes(), none), "{t}");
        }
        for t in [
            "text/event-stream",
            "application/grpc+proto",
            "image/png",
            "application/wasm",
            "",
        ] {
            assert!(!compressible(t.as_bytes(), none), "{t}");
        }
        let extra = vec!["application/wasm".to_string(), "font/*".to_string()];
        assert!(compressible(b"application/wasm", &extra));
        assert!(compressible(b"font/woff", &extra));
        assert!(!compressible(b"fontx/woff", &extra));
    }

    #[tokio::test]
    async fn a_compressed_body_decodes_to_the_original() {
        use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZstdDecoder};
        use tokio::io::AsyncReadExt;
        let text: Vec<u8> = (0..20_000)
            .flat_map(|i| format!("{{\"n\":{i}}},").into_bytes())
            .collect();
        for coding in Coding::ALL {
            let body =
                Full::new(Bytes::from(text.clone())).map_err(|e| -> io::Error { match e {} });
            let packed = Compressed::new(body, coding, Slot::take().unwrap())
                .collect()
                .await
                .unwrap()
                .to_bytes();
            assert!(
                packed.len() < text.len() / 4,
                "{coding:?}: {}",
                packed.len()
            );
            let mut out = Vec::new();
            match coding {
                Coding::Zstd => ZstdDecoder::new(&packed[..]).read_to_end(&mut out).await,
                Coding::Br => BrotliDecoder::new(&packed[..]).read_to_end(&mut out).await,
                Coding::Gzip => GzipDecoder::new(&packed[..]).read_to_end(&mut out).await,
            }
            .unwrap();
            assert_eq!(out, text, "{coding:?}");
        }
    }
}

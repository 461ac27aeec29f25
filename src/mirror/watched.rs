//! One mirrored request's two answers, brought together (`docs/traffic.md`, "Compare"):
//! each side reports its status, latency and body hash once its body has been read, and
//! the second report counts the pair. A side that ends without an answer (the mirror
//! failed, the client left before the primary answered) leaves the pair uncompared.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::digest::Digest;
use super::figures::Side;
use super::{Flight, Mirror};

/// The two sides of one request.
pub(crate) struct Pair {
    mirror: Arc<Mirror>,
    request_id: String,
    path: String,
    /// Each side's report once made: its answer, or `None` without one.
    sides: Mutex<[Option<Option<Side>>; 2]>,
    /// The copy's place under `max_in_flight`, held until both sides have reported.
    _flight: Flight,
}

/// The primary's side (the answer the client gets).
const PRIMARY: usize = 0;
/// The mirror's side.
const MIRROR: usize = 1;

impl Pair {
    /// A pair for the request `request_id` to `path`, holding the copy's place
    /// (`flight`); its two reports.
    pub(crate) fn reports(
        mirror: Arc<Mirror>,
        request_id: &[u8],
        path: &str,
        flight: Flight,
    ) -> [Report; 2] {
        let pair = Arc::new(Pair {
            mirror,
            request_id: String::from_utf8_lossy(request_id).into_owned(),
            path: path.to_string(),
            sides: Mutex::new([None, None]),
            _flight: flight,
        });
        [PRIMARY, MIRROR].map(|which| Report {
            pair: Arc::clone(&pair),
            which,
            done: false,
        })
    }

    fn put(&self, which: usize, side: Option<Side>) {
        let both = {
            let mut sides = self.sides.lock().unwrap_or_else(|e| e.into_inner());
            sides[which] = Some(side);
            match *sides {
                [Some(p), Some(m)] => Some((p, m)),
                _ => None,
            }
        };
        if let Some((Some(p), Some(m))) = both {
            self.mirror.compared((p, m), &self.request_id, &self.path);
        }
    }
}

/// One side's report; dropped unmade, it says the side had no answer.
pub(crate) struct Report {
    pair: Arc<Pair>,
    which: usize,
    done: bool,
}

impl Report {
    /// Reports the side's answer (`None`: it had none).
    pub(crate) fn send(mut self, side: Option<Side>) {
        self.done = true;
        self.pair.put(self.which, side);
    }

    /// A hash of a body, as this mirror compares them.
    pub(crate) fn digest(&self) -> Digest {
        let m = &self.pair.mirror;
        Digest::new(m.spec.body_limit, &m.ignored)
    }

    /// `digest`'s hash, finished.
    pub(crate) fn finish(&self, digest: Digest) -> Option<u64> {
        digest.finish(&self.pair.mirror.ignored)
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if !self.done {
            self.pair.put(self.which, None);
        }
    }
}

/// The primary's answer body on its way to the client, hashed as it passes.
pub(crate) struct Watched<B> {
    inner: B,
    digest: Option<Digest>,
    report: Option<Report>,
    status: u16,
    latency: Duration,
}

impl<B: Body<Data = Bytes> + Unpin> Watched<B> {
    /// Watches `inner`, the body of an answer of `status` whose head came after
    /// `latency`.
    pub(crate) fn new(inner: B, report: Report, status: u16, latency: Duration) -> Watched<B> {
        let mut w = Watched {
            digest: Some(report.digest()),
            inner,
            report: Some(report),
            status,
            latency,
        };
        // A body that has ended already may never be polled.
        if w.inner.is_end_stream() {
            w.end(true);
        }
        w
    }

    /// Reports the side: with its body's hash when it was read whole. A body kept to
    /// take `ignore_json`'s paths out is parsed in a task of its own, never in the
    /// client's way.
    fn end(&mut self, whole: bool) {
        let (Some(report), Some(digest)) = (self.report.take(), self.digest.take()) else {
            return;
        };
        let (status, latency) = (self.status, self.latency);
        let side = move |body| Side {
            status,
            latency,
            body,
        };
        match (whole, digest.is_kept()) {
            (false, _) => report.send(Some(side(None))),
            (true, false) => {
                let body = report.finish(digest);
                report.send(Some(side(body)));
            }
            (true, true) => {
                tokio::spawn(async move {
                    let body = report.finish(digest);
                    report.send(Some(side(body)));
                });
            }
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Watched<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(d), Some(data)) = (this.digest.as_mut(), frame.data_ref()) {
                    d.update(data);
                }
                if this.inner.is_end_stream() {
                    this.end(true);
                }
            }
            Poll::Ready(None) => this.end(true),
            Poll::Ready(Some(Err(_))) => this.end(false),
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Watched<B> {
    fn drop(&mut self) {
        // The client left before the body ended: the status and latency still count.
        if let Some(report) = self.report.take() {
            report.send(Some(Side {
                status: self.status,
                latency: self.latency,
                body: None,
            }));
        }
    }
}

impl<B> std::fmt::Debug for Watched<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("status", &self.status)
            .finish()
    }
}

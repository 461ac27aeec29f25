//! A request's body on its way from the connection to the request path.
//!
//! The connection pushes each DATA frame's bytes into the stream's [`Inbox`]; the
//! request path (or hyper's client connection, in a task of its own) takes them from
//! the [`RequestBody`]. What is taken is counted and the connection woken, so that the
//! window is given back to the client only as fast as the backend reads: a slow backend
//! holds at most one window of a client's upload in memory.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::HeaderMap;
use http_body::{Frame, SizeHint};
use tokio::sync::mpsc;

use crate::proxy::BodyError;

/// What the connection hands a body.
#[derive(Debug)]
enum Item {
    Data(Bytes),
    Trailers(HeaderMap),
    /// The stream was reset, or the connection ended, before the body's end.
    Broken,
}

/// The connection's end of a request body.
#[derive(Debug)]
pub(crate) struct Inbox {
    /// `None` once the body ended.
    tx: Option<mpsc::UnboundedSender<Item>>,
    shared: Arc<Shared>,
}

/// What both ends of a body see.
#[derive(Debug, Default)]
struct Shared {
    /// Bytes taken since the connection last looked.
    taken: AtomicUsize,
    /// The client's END_STREAM came: what is queued is all there is.
    ended: AtomicBool,
}

/// The request path's end: an [`http_body::Body`].
#[derive(Debug)]
pub(crate) struct RequestBody {
    rx: mpsc::UnboundedReceiver<Item>,
    shared: Arc<Shared>,
    connection: Arc<AtomicWaker>,
    /// What `Content-Length` says is left to come.
    left: Option<u64>,
    done: bool,
}

/// A body of `length` bytes when the request states it; taking from it wakes
/// `connection`.
pub(crate) fn channel(length: Option<u64>, connection: &Arc<AtomicWaker>) -> (Inbox, RequestBody) {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared::default());
    let inbox = Inbox {
        tx: Some(tx),
        shared: Arc::clone(&shared),
    };
    let body = RequestBody {
        rx,
        shared,
        connection: Arc::clone(connection),
        left: length,
        done: false,
    };
    (inbox, body)
}

impl Inbox {
    /// Hands over a DATA frame's bytes; `false` when nobody reads the body any more.
    pub(crate) fn data(&self, data: Bytes) -> bool {
        match &self.tx {
            Some(tx) => tx.send(Item::Data(data)).is_ok(),
            None => false,
        }
    }

    /// Ends the body, with `trailers` when the client sent some. What is taken of it
    /// after is still counted.
    pub(crate) fn end(&mut self, trailers: Option<HeaderMap>) {
        if let (Some(tx), Some(t)) = (self.tx.take(), trailers) {
            let _ = tx.send(Item::Trailers(t));
        }
        self.shared.ended.store(true, Ordering::Release);
    }

    /// The bytes taken from the body since the last call.
    pub(crate) fn taken(&self) -> usize {
        self.shared.taken.swap(0, Ordering::Relaxed)
    }
}

impl Drop for Inbox {
    /// A body not ended by its client (a reset, a connection gone) breaks off rather
    /// than ends: what came of it must not pass for all of it.
    fn drop(&mut self) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Item::Broken);
        }
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match std::task::ready!(this.rx.poll_recv(cx)) {
            Some(Item::Data(data)) => {
                this.shared.taken.fetch_add(data.len(), Ordering::Relaxed);
                this.connection.wake();
                if let Some(left) = &mut this.left {
                    *left = left.saturating_sub(data.len() as u64);
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Some(Item::Trailers(t)) => {
                this.done = true;
                Poll::Ready(Some(Ok(Frame::trailers(t))))
            }
            Some(Item::Broken) => {
                this.done = true;
                Poll::Ready(Some(Err("the client's HTTP/2 stream broke off".into())))
            }
            None => {
                this.done = true;
                Poll::Ready(None)
            }
        }
    }

    /// Done, or all of it queued and taken: a reader that stops at the stated length
    /// knows the body ended without polling it once more.
    fn is_end_stream(&self) -> bool {
        self.done || (self.shared.ended.load(Ordering::Acquire) && self.rx.is_empty())
    }

    fn size_hint(&self) -> SizeHint {
        self.left
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use http_body_util::BodyExt as _;

    #[tokio::test]
    async fn what_is_taken_is_counted_and_a_dropped_inbox_breaks_the_body() {
        let waker = Arc::new(AtomicWaker::new());
        let (inbox, mut body) = channel(Some(5), &waker);
        inbox.data(Bytes::from_static(b"abc"));
        let f = body.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "abc");
        assert_eq!(inbox.taken(), 3);
        assert_eq!(inbox.taken(), 0);
        assert_eq!(body.size_hint().exact(), Some(2));
        drop(inbox);
        assert!(body.frame().await.unwrap().is_err());
        let (mut inbox, mut body) = channel(None, &waker);
        let mut t = HeaderMap::new();
        t.insert("grpc-status", "0".parse().unwrap());
        inbox.end(Some(t));
        drop(inbox);
        let f = body.frame().await.unwrap().unwrap();
        assert!(f.is_trailers());
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none());
        let (mut inbox, mut body) = channel(Some(1), &waker);
        inbox.data(Bytes::from_static(b"x"));
        inbox.end(None);
        assert!(!body.is_end_stream(), "a byte still queued");
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.is_end_stream());
    }
}

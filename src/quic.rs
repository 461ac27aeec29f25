//! A worker's QUIC endpoint (`docs/tls.md`, "HTTP/3"): quinn's, on a UDP socket this
//! process can stop reading without closing it.
//!
//! At an upgrade the UDP sockets go to the new process, which reads them from then on.
//! The old process holds the same sockets: were it to go on reading, each datagram
//! would reach one of the two at random, and each would answer the other's packets
//! with stateless resets. quinn can swap an endpoint's socket but goes on reading the
//! old one until a packet arrives on the new; so the socket is wrapped here, and
//! [`Endpoint::hand_over`] turns its reading off: the old process only sends from then
//! on (its connections' closes), and every datagram is the new process's.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, Runtime as _, UdpPoller};

/// HTTP/3's `H3_NO_ERROR`: what a connection closed by the stop or the upgrade says.
const H3_NO_ERROR: u32 = 0x100;
/// How long the stop waits for the connections' closes to be sent.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// A worker's QUIC endpoint.
#[derive(Debug)]
pub(crate) struct Endpoint {
    endpoint: quinn::Endpoint,
    socket: Arc<Sealable>,
}

impl Endpoint {
    /// A server endpoint on `socket` with `config`.
    pub(crate) fn new(
        socket: std::net::UdpSocket,
        config: quinn::ServerConfig,
    ) -> io::Result<Endpoint> {
        let runtime = Arc::new(quinn::TokioRuntime);
        let socket = Arc::new(Sealable {
            inner: runtime.wrap_udp_socket(socket)?,
            sealed: AtomicBool::new(false),
        });
        let endpoint = quinn::Endpoint::new_with_abstract_socket(
            quinn::EndpointConfig::default(),
            Some(config),
            Arc::clone(&socket) as Arc<dyn AsyncUdpSocket>,
            runtime,
        )?;
        Ok(Endpoint { endpoint, socket })
    }

    /// The next connection attempt; `None` once the endpoint is closed.
    pub(crate) async fn accept(&self) -> Option<quinn::Incoming> {
        self.endpoint.accept().await
    }

    /// Refuses every new connection from now on (the worker stops): a client is told at
    /// once, as a TCP client meets a closed port, instead of waiting out its handshake.
    pub(crate) fn refuse_new(&self) {
        let endpoint = self.endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                incoming.refuse();
            }
        });
    }

    /// The sockets went to a new process: this one reads no more datagrams, and its
    /// QUIC connections are closed now (`H3_NO_ERROR`), so their clients open new ones,
    /// to the new process. Requests in flight on them are cut.
    pub(crate) fn hand_over(&self) {
        self.socket.sealed.store(true, Ordering::Relaxed);
        self.endpoint.close(H3_NO_ERROR.into(), b"upgrade");
    }

    /// Closes what connections are left and waits (a moment at most) for their closes
    /// to be sent.
    pub(crate) async fn close(self) {
        self.endpoint.close(H3_NO_ERROR.into(), b"stopping");
        let _ = tokio::time::timeout(CLOSE_WAIT, self.endpoint.wait_idle()).await;
    }
}

/// A UDP socket whose reading can be turned off for good; sending goes on.
struct Sealable {
    inner: Arc<dyn AsyncUdpSocket>,
    sealed: AtomicBool,
}

impl fmt::Debug for Sealable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealable")
            .field("sealed", &self.sealed.load(Ordering::Relaxed))
            .finish()
    }
}

impl AsyncUdpSocket for Sealable {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Arc::clone(&self.inner).create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        // Sealed, it is never woken for reading again: nothing here is to be read.
        if self.sealed.load(Ordering::Relaxed) {
            return Poll::Pending;
        }
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

//! A TCP pool's running counts (`docs/tcp.md`): connections taken and bytes each way,
//! read by the metrics at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};

/// A TCP pool's connections and bytes, since it was made.
#[derive(Debug, Default)]
pub(crate) struct TcpCounts {
    connections: AtomicU64,
    client_to_backend: AtomicU64,
    backend_to_client: AtomicU64,
}

impl TcpCounts {
    /// A connection taken by one of its listeners.
    pub(crate) fn connection(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes copied: `up` from the client to the backend, `down` back.
    pub(crate) fn bytes(&self, up: u64, down: u64) {
        if up > 0 {
            self.client_to_backend.fetch_add(up, Ordering::Relaxed);
        }
        if down > 0 {
            self.backend_to_client.fetch_add(down, Ordering::Relaxed);
        }
    }

    /// Connections taken.
    pub(crate) fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Bytes from the clients to the backends, and back.
    pub(crate) fn directions(&self) -> [(&'static str, u64); 2] {
        [
            (
                "client_to_backend",
                self.client_to_backend.load(Ordering::Relaxed),
            ),
            (
                "backend_to_client",
                self.backend_to_client.load(Ordering::Relaxed),
            ),
        ]
    }
}

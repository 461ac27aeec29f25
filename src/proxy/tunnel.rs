//! Upgrades: the client's half, whichever front end took it, joined with the backend's
//! into a tunnel of bytes.

use hyper_util::rt::TokioIo;

/// The client side's half of an upgrade: the client's connection, once the `101` has
/// been written to it. hyper's HTTP/1 server is the one front end that hands over
/// upgrades; another adds its own kind of connection inside this type.
#[derive(Debug)]
pub(crate) struct ClientUpgrade(hyper::upgrade::OnUpgrade);

impl ClientUpgrade {
    /// The upgrade of a request hyper's server read.
    pub(crate) fn hyper(on: hyper::upgrade::OnUpgrade) -> ClientUpgrade {
        ClientUpgrade(on)
    }
}

/// Joins an upgraded client connection with the upgraded backend connection. The
/// backend's in-flight slot and its connection's descriptor are held for as long as the
/// tunnel lives.
pub(crate) async fn tunnel(
    client: ClientUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    held: (
        crate::backend::RequestGuard,
        Option<crate::descriptors::Descriptor>,
    ),
) {
    let (c, u) = tokio::join!(client.0, upstream);
    match (c, u) {
        (Ok(c), Ok(u)) => {
            let mut c = TokioIo::new(c);
            let mut u = TokioIo::new(u);
            let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
        }
        (c, u) => tracing::debug!(
            client_ok = c.is_ok(),
            upstream_ok = u.is_ok(),
            "upgrade failed"
        ),
    }
    drop(held);
}

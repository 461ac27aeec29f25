//! The HTTP client instant-acme talks to the CA through.
//!
//! Written here rather than taking instant-acme's default (hyper-rustls with the
//! platform verifier): this one trusts what `[tls.acme] ca_file` names, or the system's
//! roots, through the same rustls configuration the `https://` backends use
//! ([`crate::fetch`]), and brings no second TLS stack.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use instant_acme::{BodyWrapper, BytesResponse, Error, HttpClient};
use rustls::ClientConfig;

/// One request to the CA, connection and answer's body included, takes at most this
/// long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// An answer's body is at most this large (a certificate chain is a few kilobytes).
const MAX_BODY: usize = 1 << 20;

/// Sends each request on a connection of its own.
pub(super) struct Client {
    tls: Arc<ClientConfig>,
}

impl Client {
    /// Trusts `ca_file`'s certificates, else the system's roots.
    pub(super) fn new(ca_file: Option<std::path::PathBuf>) -> Client {
        let settings = crate::config::BackendTransport {
            ca_file,
            ..Default::default()
        };
        Client {
            tls: crate::transport::client_config(&settings),
        }
    }
}

impl HttpClient for Client {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, Error>> + Send>> {
        let tls = Arc::clone(&self.tls);
        Box::pin(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, crate::fetch::send(tls, req, MAX_BODY))
                .await
            {
                Ok(Ok(answer)) => {
                    let (parts, body) = answer.into_parts();
                    Ok(BytesResponse {
                        parts,
                        body: Box::new(body),
                    })
                }
                Ok(Err(e)) => Err(Error::Other(e.into())),
                Err(_) => Err(Error::Str("the ACME CA did not answer within 30 s")),
            }
        })
    }
}

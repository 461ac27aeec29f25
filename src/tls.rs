//! TLS termination (`docs/tls.md`): the certificates, chosen by the client's SNI name,
//! and the rustls server configuration the HTTPS listener hands each handshake.
//!
//! The configuration is swapped whole on reload ([`Tls::reload`]): a handshake takes the
//! one current when it starts, so new handshakes get new certificates and open
//! connections keep theirs. The session-ticket key and the session cache outlive a
//! reload, so a client resumes across it (nginx and HAProxy keep theirs the same way).

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ProducesTickets, ResolvesServerCert, StoresServerSessions};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::config::pem::read_cert;
use crate::config::tls::CertPaths;

/// Sessions kept for resumption by id (TLS 1.2 clients without tickets), as nginx's
/// `ssl_session_cache` holds them; tickets need no memory here.
const SESSION_CACHE: usize = 4096;

/// The ALPN protocols offered, preferred first: HTTP/2, then HTTP/1.1.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// One certificate and the DNS names it is for (lowercase; `*.` for a wildcard).
#[derive(Debug)]
struct Served {
    names: Vec<String>,
    key: Arc<CertifiedKey>,
}

/// Chooses the certificate for a handshake: the first whose names hold the SNI name
/// exactly, else the first with a wildcard for it (`*.example.com` covers one label),
/// else the first certificate (the default, also for a client that sends no name).
#[derive(Debug)]
struct BySni {
    certs: Vec<Served>,
}

impl BySni {
    fn find(&self, name: &str) -> Option<&Served> {
        let name = name.to_ascii_lowercase();
        let exact = self.certs.iter().find(|c| c.names.contains(&name));
        exact.or_else(|| {
            let (_, parent) = name.split_once('.')?;
            let wildcard = format!("*.{parent}");
            self.certs.iter().find(|c| c.names.contains(&wildcard))
        })
    }
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let chosen = hello.server_name().and_then(|n| self.find(n));
        chosen.or(self.certs.first()).map(|c| Arc::clone(&c.key))
    }
}

/// What the HTTPS listener serves, swapped whole on reload.
pub(crate) struct Tls {
    config: ArcSwap<ServerConfig>,
    ticketer: Arc<dyn ProducesTickets>,
    sessions: Arc<dyn StoresServerSessions>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Loads `certs` (the default first).
    pub(crate) fn new(certs: &[CertPaths]) -> Result<Tls, String> {
        let ticketer = rustls::crypto::ring::Ticketer::new()
            .map_err(|e| format!("cannot make a session-ticket key: {e}"))?;
        let sessions: Arc<dyn StoresServerSessions> =
            rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
        let config = server_config(certs, &ticketer, &sessions)?;
        Ok(Tls {
            config: ArcSwap::from_pointee(config),
            ticketer,
            sessions,
        })
    }

    /// Reads `certs` again into a configuration for [`Self::install`]; the current one
    /// stays in force until then, and on an error.
    pub(crate) fn prepare(&self, certs: &[CertPaths]) -> Result<Arc<ServerConfig>, String> {
        server_config(certs, &self.ticketer, &self.sessions).map(Arc::new)
    }

    /// Serves `config` from the next handshake on; open connections keep theirs.
    pub(crate) fn install(&self, config: Arc<ServerConfig>) {
        self.config.store(config);
    }

    /// The acceptor for the next handshake.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.load_full())
    }
}

/// TLS 1.3 and 1.2 on the `ring` provider, the certificates by SNI, ALPN h2 and
/// http/1.1, tickets and the session cache.
fn server_config(
    certs: &[CertPaths],
    ticketer: &Arc<dyn ProducesTickets>,
    sessions: &Arc<dyn StoresServerSessions>,
) -> Result<ServerConfig, String> {
    let served = certs
        .iter()
        .map(|c| {
            read_cert(c)
                .map(|(names, key)| Served { names, key })
                .map_err(|e| format!("{}: {e}", c.origin))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(BySni { certs: served }));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    config.ticketer = Arc::clone(ticketer);
    config.session_storage = Arc::clone(sessions);
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(names: &[&str]) -> Served {
        let cert = rcgen::generate_simple_self_signed(
            names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        let key =
            rustls_pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let signer = rustls::crypto::ring::sign::any_supported_type(&key).unwrap();
        Served {
            names: names.iter().map(|s| s.to_string()).collect(),
            key: Arc::new(CertifiedKey::new(vec![cert.cert.der().clone()], signer)),
        }
    }

    #[test]
    fn exact_names_first_then_wildcards_then_nothing() {
        let sni = BySni {
            certs: vec![
                served(&["default.test"]),
                served(&["*.example.test"]),
                served(&["api.example.test"]),
            ],
        };
        let which = |n: &str| sni.find(n).map(|c| c.names[0].clone()).unwrap_or_default();
        assert_eq!(which("API.example.test"), "api.example.test");
        assert_eq!(which("www.example.test"), "*.example.test");
        assert_eq!(which("a.b.example.test"), "", "a wildcard covers one label");
        assert_eq!(which("example.test"), "");
        assert_eq!(which("default.test"), "default.test");
    }
}

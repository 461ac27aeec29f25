//! The certificate material the settings name (`docs/tls.md`): a chain and its key for
//! the HTTPS listener, checked to belong together, and a file of CA certificates for
//! `https://` backends. Read here, so that a bad file is a configuration error naming
//! it; the listener (`tls.rs`) and the backends' transport (`transport.rs`) build on
//! what this reads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// One certificate chain and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertPaths {
    /// The chain, leaf first.
    pub(crate) cert: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub(crate) key: PathBuf,
    /// Where it was set, for an error about it: `--tls-cert` or `FILE line N: tls.certs`.
    pub(crate) origin: String,
}

/// Reads a chain and its key and checks they belong together; returns the leaf's DNS
/// names (lower case) and the key ready to sign. The error names the file and what is
/// wrong.
pub(crate) fn read_cert(paths: &CertPaths) -> Result<(Vec<String>, Arc<CertifiedKey>), String> {
    let show = |p: &std::path::Path| p.display().to_string();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&paths.cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| format!("cannot read the certificate '{}': {e}", show(&paths.cert)))?;
    if chain.is_empty() {
        return Err(format!("no certificate in '{}'", show(&paths.cert)));
    }
    let key = PrivateKeyDer::from_pem_file(&paths.key)
        .map_err(|e| format!("cannot read the private key '{}': {e}", show(&paths.key)))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("the private key '{}': {e}", show(&paths.key)))?;
    let leaf = webpki::EndEntityCert::try_from(&chain[0])
        .map_err(|e| format!("the certificate '{}': {e:?}", show(&paths.cert)))?;
    let names = leaf
        .valid_dns_names()
        .map(str::to_ascii_lowercase)
        .collect();
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|e| {
        format!(
            "the private key '{}' does not belong to the certificate '{}': {e}",
            show(&paths.key),
            show(&paths.cert)
        )
    })?;
    Ok((names, Arc::new(certified)))
}

/// Checks one certificate and key as the listener would load them.
pub(crate) fn load_cert(paths: &CertPaths) -> Result<(), String> {
    read_cert(paths).map(|_| ())
}

/// Reads the CA certificates of `tls_ca_file`; the error names the file.
pub(crate) fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|c| c.collect::<Result<_, _>>())
        .map_err(|e| format!("cannot read the CA file '{}': {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "no certificate in the CA file '{}'",
            path.display()
        ));
    }
    Ok(certs)
}

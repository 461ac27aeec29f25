//! `[tls.client_auth]` (`docs/tls.md`, "Mutual TLS"): the CAs that sign client
//! certificates, whether one is required, and the CRLs that revoke them. Read and
//! checked here, so that a bad file is a configuration error naming it (at start, by
//! `fulcrum check`, and on a reload, which keeps the bundle in force); the listener
//! (`tls.rs`) builds its verifier on what [`load`] reads.

use std::path::PathBuf;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer};
use toml::de::DeValue;
use toml::Spanned;

use super::collector::Collector;
use super::options::FileType;

/// The keys of the table.
const KEYS: &str = "ca_file, mode, crl_files";

/// Whether a client must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Mode {
    /// A client may present one; one it presents must verify.
    #[default]
    Optional,
    /// No handshake without a verified client certificate.
    Require,
}

impl Mode {
    fn parse(text: &str) -> Result<Mode, String> {
        match text {
            "optional" => Ok(Mode::Optional),
            "require" => Ok(Mode::Require),
            _ => Err(format!("'{text}' (expected optional or require)")),
        }
    }
}

/// `[tls.client_auth]` as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientAuthSettings {
    /// The PEM bundle of the CAs that sign client certificates.
    pub(crate) ca_file: PathBuf,
    /// `optional` (the default) or `require`.
    pub(crate) mode: Mode,
    /// PEM CRLs, each issued by a CA of the bundle.
    pub(crate) crl_files: Vec<PathBuf>,
    /// Where the table is, for an error about its files: `FILE line N: tls.client_auth`.
    pub(crate) origin: String,
}

/// What the files of `[tls.client_auth]` hold.
#[derive(Debug, Clone)]
pub(crate) struct ClientAuthFiles {
    /// The CA certificates.
    pub(crate) cas: Vec<CertificateDer<'static>>,
    /// The CRLs.
    pub(crate) crls: Vec<CertificateRevocationListDer<'static>>,
}

/// Reads the files `s` names: every CA certificate of the bundle (at least one, each a
/// usable trust anchor) and every CRL, each issued by one of them. The error names the
/// file and what is wrong with it.
pub(crate) fn load(s: &ClientAuthSettings) -> Result<ClientAuthFiles, String> {
    let cas = super::pem::read_ca_file(&s.ca_file)?;
    let mut subjects = Vec::with_capacity(cas.len());
    for ca in &cas {
        let anchor = webpki::anchor_from_trusted_cert(ca).map_err(|e| {
            format!(
                "the CA file '{}': a certificate rustls cannot use: {e:?}",
                s.ca_file.display()
            )
        })?;
        subjects.push(anchor.subject.as_ref().to_vec());
    }
    let mut crls = Vec::new();
    for path in &s.crl_files {
        let shown = path.display();
        let found: Vec<CertificateRevocationListDer<'static>> =
            CertificateRevocationListDer::pem_file_iter(path)
                .and_then(|c| c.collect::<Result<_, _>>())
                .map_err(|e| format!("cannot read the CRL file '{shown}': {e}"))?;
        if found.is_empty() {
            return Err(format!("no CRL in '{shown}'"));
        }
        for crl in found {
            let parsed = webpki::BorrowedCertRevocationList::from_der(crl.as_ref())
                .map_err(|e| format!("the CRL file '{shown}': not a CRL rustls can read: {e:?}"))?;
            let issuer = webpki::CertRevocationList::from(parsed).issuer().to_vec();
            if !subjects.contains(&issuer) {
                return Err(format!(
                    "the CRL file '{shown}': issued by a CA that is not in '{}'",
                    s.ca_file.display()
                ));
            }
            crls.push(crl);
        }
    }
    Ok(ClientAuthFiles { cas, crls })
}

/// The file's `[tls.client_auth]` table.
pub(super) fn read_table(
    c: &mut Collector<'_>,
    value: &Spanned<DeValue<'_>>,
) -> Option<ClientAuthSettings> {
    let at = value.span().start;
    let Some(table) = value.get_ref().as_table() else {
        c.push(at, Some("tls.client_auth"), "expected a table".into());
        return None;
    };
    let (mut ca_file, mut mode, mut crl_files, mut bad) =
        (None, Mode::default(), Vec::new(), false);
    for (key, v) in table {
        let k = key.get_ref().as_ref();
        let shown = format!("tls.client_auth.{k}");
        let read = match k {
            "ca_file" => path_of(c, v, &shown).map(|p| ca_file = Some(p)),
            "mode" => (c.text_of(v, FileType::Str, &shown))
                .and_then(|t| report(c, v, &shown, Mode::parse(&t)))
                .map(|m| mode = m),
            "crl_files" => crl_list(c, v, &shown).map(|l| crl_files = l),
            _ => {
                let msg = format!("unknown key '{shown}' (valid: {KEYS})");
                c.push(key.span().start, None, msg);
                None
            }
        };
        bad |= read.is_none();
    }
    let Some(ca_file) = ca_file else {
        c.push(
            at,
            Some("tls.client_auth"),
            "missing field 'ca_file'".into(),
        );
        return None;
    };
    (!bad).then(|| ClientAuthSettings {
        ca_file,
        mode,
        crl_files,
        origin: c.origin_at(at, "tls.client_auth"),
    })
}

/// A non-empty path, relative to the file's directory.
fn path_of(c: &mut Collector<'_>, v: &Spanned<DeValue<'_>>, shown: &str) -> Option<PathBuf> {
    let text = c.text_of(v, FileType::Str, shown)?;
    let checked = match text.is_empty() {
        true => Err("the path is empty".to_string()),
        false => Ok(c.relative_to_file(&text)),
    };
    report(c, v, shown, checked)
}

/// `crl_files`: a list of paths.
fn crl_list(c: &mut Collector<'_>, v: &Spanned<DeValue<'_>>, shown: &str) -> Option<Vec<PathBuf>> {
    let Some(items) = v.get_ref().as_array() else {
        c.push(
            v.span().start,
            Some(shown),
            "expected a list of paths".into(),
        );
        return None;
    };
    items.iter().map(|item| path_of(c, item, shown)).collect()
}

/// `result`'s value, or its error pushed at `v`.
fn report<T>(
    c: &mut Collector<'_>,
    v: &Spanned<DeValue<'_>>,
    shown: &str,
    result: Result<T, String>,
) -> Option<T> {
    result
        .map_err(|e| c.push(v.span().start, Some(shown), e))
        .ok()
}

//! TLS termination settings (`docs/tls.md`): `tls_listen`, the certificates
//! (`[[tls.certs]]` in the file, `--tls-cert`/`--tls-key` on the command line),
//! `redirect_https` and `[tls.client_auth]`, checked together once every layer is
//! applied.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{ConfigError, Settings};

pub(crate) use super::pem::CertPaths;

/// The TLS listener's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    /// `tls_listen`: where HTTPS is served; `None` = no TLS listener.
    pub(crate) listen: Option<SocketAddr>,
    /// The certificates, the default (for a client without a known SNI name) first.
    pub(crate) certs: Vec<CertPaths>,
    /// `--tls-cert` and `--tls-key`, made the first certificate by [`finish`].
    pub(crate) cert_flag: Option<PathBuf>,
    pub(crate) key_flag: Option<PathBuf>,
    /// `redirect_https`: the plain listener answers 308 to the same URL on https.
    pub(crate) redirect_https: bool,
    /// `[tls.acme]`: a certificate obtained from an ACME CA.
    pub(crate) acme: Option<super::acme::AcmeSettings>,
    /// `http3`: QUIC and HTTP/3 on `listen`'s port, over UDP.
    pub(crate) http3: bool,
    /// `[tls.client_auth]`: client certificates verified against these CAs.
    pub(crate) client_auth: Option<super::client_auth::ClientAuthSettings>,
}

/// Puts the command line's certificate first and checks the settings against each
/// other and the certificate files themselves (read and parsed, so `fulcrum check` and a
/// reload find a bad file before it is served).
pub(crate) fn finish(s: &mut Settings, errors: &mut Vec<ConfigError>) {
    let err = |origin: &str, message: String| ConfigError {
        origin: origin.into(),
        message,
    };
    let t = &mut s.tls;
    match (t.cert_flag.take(), t.key_flag.take()) {
        (Some(cert), Some(key)) => t.certs.insert(
            0,
            CertPaths {
                cert,
                key,
                origin: "--tls-cert".into(),
            },
        ),
        (Some(_), None) => errors.push(err("--tls-cert", "it needs --tls-key FILE".into())),
        (None, Some(_)) => errors.push(err("--tls-key", "it needs --tls-cert FILE".into())),
        (None, None) => {}
    }
    if let Some(acme) = &t.acme {
        for (origin, e) in super::acme::check(acme, t.listen.is_some(), s.store.is_some()) {
            errors.push(err(&origin, e));
        }
    }
    match (t.listen, t.certs.first()) {
        (Some(_), None) if t.acme.is_none() => errors.push(err(
            "tls_listen",
            "it needs a certificate: --tls-cert FILE --tls-key FILE, [[tls.certs]] with cert and key, or [tls.acme]".into(),
        )),
        (None, Some(first)) => errors.push(err(
            &first.origin,
            "a certificate without tls_listen serves nothing: set tls_listen (--tls-listen ADDR)".into(),
        )),
        _ => {}
    }
    if t.http3 && t.listen.is_none() {
        errors.push(err(
            "http3",
            "it needs tls_listen: HTTP/3 is served on its port, over UDP".into(),
        ));
    }
    if !s.tls_passthrough.is_empty() && t.listen.is_none() {
        errors.push(err(
            "tls_passthrough",
            "it needs tls_listen: names are passed through on the HTTPS listener".into(),
        ));
    }
    if t.redirect_https && t.listen.is_none() {
        errors.push(err(
            "redirect_https",
            "it needs tls_listen: there is no https listener to redirect to".into(),
        ));
    }
    if t.listen.is_some_and(|a| a.port() != 0) && t.listen == Some(s.listen) {
        errors.push(err(
            "tls_listen",
            format!("{} is the plain listener's address too", s.listen),
        ));
    }
    for c in &t.certs {
        if let Err(e) = super::pem::load_cert(c) {
            errors.push(err(&c.origin, e));
        }
    }
    if let Some(auth) = &t.client_auth {
        if t.listen.is_none() {
            let msg = "it needs tls_listen: client certificates come in TLS handshakes";
            errors.push(err(&auth.origin, msg.into()));
        } else if let Err(e) = super::client_auth::load(auth) {
            errors.push(err(&auth.origin, e));
        }
    }
}

/// The file's `[tls]` table: `certs`, a list of `{ cert, key }` (`[[tls.certs]]`).
/// Relative paths are relative to the config file's directory, as nginx resolves them
/// against its prefix.
pub(super) fn read_table(
    s: &mut Settings,
    c: &mut super::collector::Collector<'_>,
    value: &toml::Spanned<toml::de::DeValue<'_>>,
) {
    let Some(table) = value.get_ref().as_table() else {
        c.push(value.span().start, Some("tls"), "expected a table".into());
        return;
    };
    for (key, v) in table {
        match key.get_ref().as_ref() {
            "certs" => {
                if let Some(list) = read_certs(c, v) {
                    s.tls.certs = list;
                }
            }
            "acme" => s.tls.acme = super::acme::read_table(c, v),
            "client_auth" => s.tls.client_auth = super::client_auth::read_table(c, v),
            "http3" => {
                let on = c.text_of(v, super::options::FileType::Switch, "tls.http3");
                match on.map(|t| super::values::parse_on_off(&t)) {
                    Some(Ok(b)) => s.tls.http3 = b,
                    Some(Err(e)) => c.push(v.span().start, Some("tls.http3"), e),
                    None => {}
                }
            }
            k => c.push(
                key.span().start,
                None,
                format!("unknown key 'tls.{k}' (valid: tls.certs, tls.acme, tls.client_auth, tls.http3)"),
            ),
        }
    }
}

fn read_certs(
    c: &mut super::collector::Collector<'_>,
    value: &toml::Spanned<toml::de::DeValue<'_>>,
) -> Option<Vec<CertPaths>> {
    let Some(list) = value.get_ref().as_array() else {
        let msg = "expected a list of tables ([[tls.certs]])".into();
        c.push(value.span().start, Some("tls.certs"), msg);
        return None;
    };
    let mut out = Vec::new();
    for entry in list {
        let at = entry.span().start;
        let Some(table) = entry.get_ref().as_table() else {
            c.push(at, Some("tls.certs"), "expected a table".into());
            continue;
        };
        let mut paths = (None, None);
        for (key, v) in table {
            let k = key.get_ref().as_ref();
            let slot = match k {
                "cert" => &mut paths.0,
                "key" => &mut paths.1,
                _ => {
                    let msg = format!("unknown key 'tls.certs.{k}' (valid: cert, key)");
                    c.push(key.span().start, None, msg);
                    continue;
                }
            };
            let shown = format!("tls.certs.{k}");
            let text = c.text_of(v, super::options::FileType::Str, &shown)?;
            match non_empty(&text) {
                Ok(()) => *slot = Some(c.relative_to_file(&text)),
                Err(e) => c.push(v.span().start, Some(&shown), e),
            }
        }
        match paths {
            (Some(cert), Some(key)) => out.push(CertPaths {
                cert,
                key,
                origin: c.origin_at(at, "tls.certs"),
            }),
            (None, _) => c.push(at, Some("tls.certs"), "missing field 'cert'".into()),
            (_, None) => c.push(at, Some("tls.certs"), "missing field 'key'".into()),
        }
    }
    Some(out)
}

fn non_empty(s: &str) -> Result<(), String> {
    if s.is_empty() {
        Err("the path is empty".into())
    } else {
        Ok(())
    }
}

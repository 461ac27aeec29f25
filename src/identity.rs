//! The verified client certificate a connection carries (`docs/tls.md`, "Mutual TLS"):
//! what a route's `client_cert` rule compares, what `X-Forwarded-Client-Cert` tells the
//! backend and what the access log names. Read once per connection, after its
//! handshake, and shared by every request on it.

use std::sync::Arc;

use http::HeaderValue;
use rustls::pki_types::CertificateDer;

use crate::x509::Names;

/// A client certificate rustls verified.
#[derive(Debug)]
pub(crate) struct ClientCert {
    /// Its subject (RFC 4514).
    pub(crate) subject: String,
    /// Its URI alternative names.
    pub(crate) uris: Vec<String>,
    /// Its DNS alternative names.
    pub(crate) dns: Vec<String>,
    /// The value of `X-Forwarded-Client-Cert` for it.
    pub(crate) xfcc: HeaderValue,
}

impl ClientCert {
    /// The identity of a verified chain (its first certificate), if there is one.
    pub(crate) fn of(chain: Option<&[CertificateDer<'_>]>) -> Option<Arc<ClientCert>> {
        let leaf = chain?.first()?;
        let cert = ClientCert::from_der(leaf).map(Arc::new);
        if cert.is_none() {
            tracing::warn!("a verified client certificate whose names cannot be written in X-Forwarded-Client-Cert (control characters): its connection carries no identity");
        }
        cert
    }

    /// The identity of the DER certificate `der`; `None` when it does not parse (rustls
    /// verified it, so it does).
    pub(crate) fn from_der(der: &[u8]) -> Option<ClientCert> {
        let names = Names::read(der)?;
        let hash = ring::digest::digest(&ring::digest::SHA256, der);
        let xfcc = xfcc_value(hash.as_ref(), &names);
        Some(ClientCert {
            xfcc: HeaderValue::from_str(&xfcc).ok()?,
            subject: names.subject,
            uris: names.uris,
            dns: names.dns,
        })
    }

    /// A certificate with only these alternative names (a URI when it has a `:`, else
    /// a DNS name): what `POST /admin/explain` is told a connection carries.
    pub(crate) fn named(sans: &[String]) -> ClientCert {
        let (uris, dns): (Vec<&String>, Vec<&String>) = sans.iter().partition(|s| s.contains(':'));
        ClientCert {
            subject: String::new(),
            uris: uris.into_iter().cloned().collect(),
            dns: dns.into_iter().map(|d| d.to_ascii_lowercase()).collect(),
            xfcc: HeaderValue::from_static(""),
        }
    }

    /// Whether one of its names is one `rules` takes ([`San`]); any name when `rules`
    /// is empty.
    pub(crate) fn matches(&self, rules: &[San]) -> bool {
        rules.is_empty() || rules.iter().any(|r| r.takes(self))
    }
}

/// `X-Forwarded-Client-Cert` as Envoy writes it: `Hash` (SHA-256 of the DER, lowercase
/// hex), `Subject` (always quoted: it holds `=`; its RFC 4514 form has escaped every `"`
/// and `\\` already), then one `URI=` and one `DNS=` per name, quoted when it holds
/// `,;="` or a backslash, with `\\` and `"` inside escaped: no name can end the quoted
/// value early and add a pair of its own.
fn xfcc_value(hash: &[u8], names: &Names) -> String {
    let mut out = String::with_capacity(96 + names.subject.len());
    out.push_str("Hash=");
    for b in hash {
        out.push_str(&format!("{b:02x}"));
    }
    out.push_str(";Subject=\"");
    out.push_str(&names.subject);
    out.push('"');
    let mut pair = |key: &str, value: &str| {
        out.push(';');
        out.push_str(key);
        out.push('=');
        if value.contains([',', ';', '=', '"', '\\']) {
            out.push('"');
            for c in value.chars() {
                if c == '"' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
        } else {
            out.push_str(value);
        }
    };
    for u in &names.uris {
        pair("URI", u);
    }
    for d in &names.dns {
        pair("DNS", d);
    }
    out
}

/// One entry of a route's `client_cert.sans`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum San {
    /// A URI name, compared byte for byte.
    Uri(String),
    /// A DNS name, compared ignoring case (kept lowercase).
    Dns(String),
    /// `*.SUFFIX`: a DNS name with one or more labels before `.SUFFIX` (kept lowercase).
    DnsBelow(String),
}

impl San {
    /// Reads an entry: a URI when it has a `:` (`spiffe://…`), `*.SUFFIX`, or a DNS name.
    pub(crate) fn parse(text: &str) -> Result<San, String> {
        if text.is_empty() || text.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(format!(
                "'{text}': expected a URI (spiffe://…), a DNS name or *.SUFFIX"
            ));
        }
        Ok(match (text.contains(':'), text.strip_prefix("*.")) {
            (true, _) => San::Uri(text.to_string()),
            (false, Some(suffix)) if !suffix.is_empty() && !suffix.contains('*') => {
                San::DnsBelow(suffix.to_ascii_lowercase())
            }
            (false, None) if !text.contains('*') => San::Dns(text.to_ascii_lowercase()),
            _ => return Err(format!("'{text}': a '*' only as a leading '*.'")),
        })
    }

    /// The entry as configured.
    pub(crate) fn to_text(&self) -> String {
        match self {
            San::Uri(u) => u.clone(),
            San::Dns(d) => d.clone(),
            San::DnsBelow(s) => format!("*.{s}"),
        }
    }

    /// Whether `cert` has a name this entry takes. A wildcard inside the certificate is
    /// compared as written.
    fn takes(&self, cert: &ClientCert) -> bool {
        match self {
            San::Uri(u) => cert.uris.iter().any(|n| n == u),
            San::Dns(d) => cert.dns.iter().any(|n| n.eq_ignore_ascii_case(d)),
            San::DnsBelow(suffix) => cert.dns.iter().any(|n| is_below(n, suffix)),
        }
    }
}

/// `name` is one or more labels, then `.` and `suffix` (any case).
fn is_below(name: &str, suffix: &str) -> bool {
    let (n, s) = (name.as_bytes(), suffix.as_bytes());
    n.len() > s.len() + 1
        && n[n.len() - s.len()..].eq_ignore_ascii_case(s)
        && n[n.len() - s.len() - 1] == b'.'
}

/// Reads `data` as a certificate, as a verified client's is read (`fuzzing::certificate`):
/// whatever the bytes, nothing panics, and a certificate whose names read has an XFCC
/// value (escaping keeps it a valid field value); any text is a rule or an error.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_certificate(data: &[u8]) {
    let _ = crate::x509::CertInfo::read(data);
    if let Some(names) = Names::read(data) {
        let cert = ClientCert::from_der(data);
        let plain = |s: &str| s.bytes().all(|b| b >= 0x20 && b != 0x7f);
        if plain(&names.subject) && names.uris.iter().chain(&names.dns).all(|n| plain(n)) {
            assert!(cert.is_some(), "no XFCC for {names:?}");
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(rule) = San::parse(text) {
            let _ = San::parse(&rule.to_text()).expect("a rule reads back");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(uris: &[&str], dns: &[&str]) -> ClientCert {
        ClientCert {
            subject: "CN=web".into(),
            uris: uris.iter().map(|s| s.to_string()).collect(),
            dns: dns.iter().map(|s| s.to_string()).collect(),
            xfcc: HeaderValue::from_static("x"),
        }
    }

    fn rules(entries: &[&str]) -> Vec<San> {
        entries.iter().map(|e| San::parse(e).unwrap()).collect()
    }

    #[test]
    fn names_match_exactly_or_below_a_wildcard() {
        let c = cert(
            &["spiffe://prod.example/web"],
            &["Web.Svc.Example", "*.edge.example"],
        );
        assert!(c.matches(&[]));
        assert!(c.matches(&rules(&["spiffe://prod.example/web"])));
        assert!(
            !c.matches(&rules(&["spiffe://prod.example/WEB"])),
            "URIs byte for byte"
        );
        assert!(c.matches(&rules(&["web.svc.example"])), "DNS ignoring case");
        assert!(c.matches(&rules(&["*.svc.example"])));
        assert!(c.matches(&rules(&["*.example"])), "one or more labels");
        assert!(!c.matches(&rules(&["*.web.svc.example"])));
        assert!(
            !c.matches(&rules(&["a.edge.example"])),
            "a wildcard SAN is as written"
        );
        assert!(
            c.matches(&rules(&["*.edge.example"])),
            "its label is a label"
        );
        let cn_only = cert(&[], &[]);
        assert!(!cn_only.matches(&rules(&["web"])));
    }

    #[test]
    fn bad_entries_are_refused() {
        for bad in ["", "a b", "*", "*.", "a.*.example", "**.example"] {
            assert!(San::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            San::parse("*.Svc.example").unwrap().to_text(),
            "*.svc.example"
        );
    }

    #[test]
    fn xfcc_is_envoys_form() {
        let names = Names {
            subject: "CN=web,O=Acme\\, Inc.".into(),
            uris: vec!["spiffe://prod.example/web".into()],
            dns: vec!["a.example".into(), "b.example".into()],
        };
        assert_eq!(
            xfcc_value(&[0xab, 0x01], &names),
            "Hash=ab01;Subject=\"CN=web,O=Acme\\, Inc.\";URI=spiffe://prod.example/web;DNS=a.example;DNS=b.example"
        );
        let plain = Names {
            subject: "CN=web".into(),
            ..Names::default()
        };
        assert_eq!(xfcc_value(&[0xff], &plain), "Hash=ff;Subject=\"CN=web\"");
        // A name cannot close its quotes and add a pair of its own.
        let sly = Names {
            subject: String::new(),
            uris: vec!["spiffe://x/\\\";URI=spiffe://prod.example/admin;z=\\".into()],
            dns: Vec::new(),
        };
        assert_eq!(
            xfcc_value(&[0xff], &sly),
            "Hash=ff;Subject=\"\";URI=\"spiffe://x/\\\\\\\";URI=spiffe://prod.example/admin;z=\\\\\""
        );
    }
}

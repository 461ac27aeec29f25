//! What fulcrum reads of a certificate beyond what rustls checks: its validity period
//! and its issuer's name, for `GET /admin/certificates` and for ACME's renewal time,
//! and a client certificate's subject and subject alternative names, for a route's
//! `client_cert` rule and `X-Forwarded-Client-Cert` (`docs/tls.md`).
//!
//! Read with yasna, the DER reader rcgen already brings: these fields need a walk of
//! `TBSCertificate` (RFC 5280 §4.1) and of one extension, not a full X.509 parser (which
//! would bring a parser-combinator stack into the build for four fields).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use yasna::models::ObjectIdentifier;
use yasna::{ASN1Result, BERReader, Tag};

/// The common name (2.5.4.3), else the organization (2.5.4.10), names the issuer.
const COMMON_NAME: [u64; 4] = [2, 5, 4, 3];
const ORGANIZATION: [u64; 4] = [2, 5, 4, 10];

/// A certificate's validity period and issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertInfo {
    /// `notBefore`.
    pub(crate) not_before: SystemTime,
    /// `notAfter`.
    pub(crate) not_after: SystemTime,
    /// The issuer's common name (else its organization; empty when it has neither).
    pub(crate) issuer: String,
}

impl CertInfo {
    /// Reads a DER certificate; `None` when it is not one.
    pub(crate) fn read(der: &[u8]) -> Option<CertInfo> {
        if !well_formed(der) {
            return None;
        }
        yasna::parse_der(der, |r| {
            r.read_sequence(|r| {
                let info = r.next().read_sequence(read_tbs)?;
                r.next().read_der()?; // signatureAlgorithm
                r.next().read_der()?; // signatureValue
                Ok(info)
            })
        })
        .ok()
    }

    /// How long it is valid in all.
    pub(crate) fn lifetime(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or_default()
    }
}

/// Whether `der` is a certificate webpki's strict DER reader takes, every length inside
/// its buffer: yasna adds a length to its position unchecked, so a length near
/// `usize::MAX` (a peer's garbage; the `certificate` fuzz target found one) must never
/// reach it.
fn well_formed(der: &[u8]) -> bool {
    let cert = rustls_pki_types::CertificateDer::from(der);
    webpki::EndEntityCert::try_from(&cert).is_ok()
}

/// `TBSCertificate`: version, serial, signature, issuer, validity, then the rest skipped.
fn read_tbs(r: &mut yasna::BERReaderSeq<'_, '_>) -> ASN1Result<CertInfo> {
    r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_der()))?;
    r.next().read_der()?; // serialNumber (up to 20 bytes: not an i64)
    r.next().read_der()?; // signature
    let issuer = issuer_name(r.next())?;
    let (not_before, not_after) = r
        .next()
        .read_sequence(|r| Ok((read_time(r.next())?, read_time(r.next())?)))?;
    while r.read_optional(|r| r.read_der())?.is_some() {}
    Ok(CertInfo {
        not_before,
        not_after,
        issuer,
    })
}

/// `Time`: UTCTime or GeneralizedTime, as a system time.
fn read_time(r: BERReader<'_, '_>) -> ASN1Result<SystemTime> {
    let secs = if r.lookahead_tag()? == yasna::tags::TAG_UTCTIME {
        r.read_utctime()?.datetime().unix_timestamp()
    } else {
        r.read_generalized_time()?.datetime().unix_timestamp()
    };
    Ok(match u64::try_from(secs) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => UNIX_EPOCH,
    })
}

/// The issuer's common name, else its organization, from `Name` as DER.
fn issuer_name(r: BERReader<'_, '_>) -> ASN1Result<String> {
    let (mut cn, mut org) = (None, None);
    r.read_sequence_of(|r| {
        r.read_set_of(|r| {
            r.read_sequence(|r| {
                let oid = r.next().read_oid()?;
                let value = r.next().read_tagged_der()?;
                let text = String::from_utf8_lossy(value.value()).into_owned();
                if oid == ObjectIdentifier::from_slice(&COMMON_NAME) {
                    cn = Some(text);
                } else if oid == ObjectIdentifier::from_slice(&ORGANIZATION) {
                    org = Some(text);
                }
                Ok(())
            })
        })
    })?;
    Ok(cn.or(org).unwrap_or_default())
}

/// Who a certificate names: its subject and its URI and DNS subject alternative names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Names {
    /// The subject in RFC 4514's string form (the last RDN first, `,` between them).
    pub(crate) subject: String,
    /// Its `uniformResourceIdentifier` alternative names, as written.
    pub(crate) uris: Vec<String>,
    /// Its `dNSName` alternative names, as written.
    pub(crate) dns: Vec<String>,
}

/// `subjectAltName` (2.5.29.17).
const SUBJECT_ALT_NAME: [u64; 4] = [2, 5, 29, 17];

impl Names {
    /// Reads a DER certificate's names; `None` when it is not a certificate.
    pub(crate) fn read(der: &[u8]) -> Option<Names> {
        if !well_formed(der) {
            return None;
        }
        yasna::parse_der(der, |r| {
            r.read_sequence(|r| {
                let names = r.next().read_sequence(read_names)?;
                r.next().read_der()?; // signatureAlgorithm
                r.next().read_der()?; // signatureValue
                Ok(names)
            })
        })
        .ok()
    }
}

/// `TBSCertificate` up to its subject, then its extensions for the alternative names.
fn read_names(r: &mut yasna::BERReaderSeq<'_, '_>) -> ASN1Result<Names> {
    r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_der()))?;
    for _ in 0..4 {
        r.next().read_der()?; // serialNumber, signature, issuer, validity
    }
    let mut names = Names {
        subject: rfc4514(r.next())?,
        ..Names::default()
    };
    r.next().read_der()?; // subjectPublicKeyInfo
                          // Then issuerUniqueID [1], subjectUniqueID [2], extensions [3], each optional.
    while let Some(tagged) = r.read_optional(|r| r.read_tagged_der())? {
        let tag = tagged.tag();
        if tag.tag_class == yasna::TagClass::ContextSpecific && tag.tag_number == 3 {
            yasna::parse_der(tagged.value(), |r| read_alt_names(r, &mut names))?;
        }
    }
    Ok(names)
}

/// `Extensions`: the URI and DNS names of `subjectAltName`, the others skipped.
fn read_alt_names(r: BERReader<'_, '_>, names: &mut Names) -> ASN1Result<()> {
    r.read_sequence_of(|r| {
        r.read_sequence(|r| {
            let oid = r.next().read_oid()?;
            r.read_optional(|r| r.read_bool())?; // critical
            let value = r.next().read_bytes()?;
            if oid == ObjectIdentifier::from_slice(&SUBJECT_ALT_NAME) {
                yasna::parse_der(&value, |r| {
                    r.read_sequence_of(|r| {
                        let tagged = r.read_tagged_der()?;
                        let text = || String::from_utf8_lossy(tagged.value()).into_owned();
                        match (tagged.tag().tag_class, tagged.tag().tag_number) {
                            (yasna::TagClass::ContextSpecific, 2) => names.dns.push(text()),
                            (yasna::TagClass::ContextSpecific, 6) => names.uris.push(text()),
                            _ => {}
                        }
                        Ok(())
                    })
                })?;
            }
            Ok(())
        })
    })
}

/// The short names RFC 4514 §3 gives attribute types (and `emailAddress`, as OpenSSL
/// writes it); any other type is written as its dotted OID.
const SHORT_NAMES: [(&[u64], &str); 10] = [
    (&[2, 5, 4, 3], "CN"),
    (&[2, 5, 4, 7], "L"),
    (&[2, 5, 4, 8], "ST"),
    (&[2, 5, 4, 10], "O"),
    (&[2, 5, 4, 11], "OU"),
    (&[2, 5, 4, 6], "C"),
    (&[2, 5, 4, 9], "STREET"),
    (&[0, 9, 2342, 19200300, 100, 1, 25], "DC"),
    (&[0, 9, 2342, 19200300, 100, 1, 1], "UID"),
    (&[1, 2, 840, 113549, 1, 9, 1], "emailAddress"),
];

/// A `Name` in RFC 4514's form: its RDNs last first, `,` between them and `+` inside
/// a multi-valued one; a string value escaped, any other written `#` and its DER in hex.
fn rfc4514(r: BERReader<'_, '_>) -> ASN1Result<String> {
    let mut rdns: Vec<String> = Vec::new();
    r.read_sequence_of(|r| {
        let mut parts = Vec::new();
        r.read_set_of(|r| {
            r.read_sequence(|r| {
                let oid = r.next().read_oid()?;
                let value = r.next().read_tagged_der()?;
                parts.push(attribute(&oid, &value));
                Ok(())
            })
        })?;
        rdns.push(parts.join("+"));
        Ok(())
    })?;
    rdns.reverse();
    Ok(rdns.join(","))
}

/// One `type=value` of a name.
fn attribute(oid: &ObjectIdentifier, value: &yasna::models::TaggedDerValue) -> String {
    let known = SHORT_NAMES
        .iter()
        .find(|(o, _)| oid.components().as_slice() == *o);
    let kind = match known {
        Some((_, name)) => (*name).to_string(),
        None => (oid.components().iter().map(u64::to_string))
            .collect::<Vec<_>>()
            .join("."),
    };
    // UTF8String, PrintableString, TeletexString, IA5String, VisibleString.
    let text = matches!(value.tag().tag_number, 12 | 19 | 20 | 22 | 26)
        && value.tag().tag_class == yasna::TagClass::Universal;
    match (known.is_some(), text) {
        (true, true) => format!(
            "{kind}={}",
            escaped(&String::from_utf8_lossy(value.value()))
        ),
        _ => {
            let der = yasna::construct_der(|w| w.write_tagged_der(value));
            let hex: String = der.iter().map(|b| format!("{b:02x}")).collect();
            format!("{kind}=#{hex}")
        }
    }
}

/// A value escaped as RFC 4514 §2.4 asks (and control characters as `\XX`, so the
/// result is always a valid header field value).
fn escaped(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        match c {
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' ' if i == 0 || i == last => out.push_str("\\ "),
            '#' if i == 0 => out.push_str("\\#"),
            c if c.is_ascii_control() => out.push_str(&format!("\\{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_subject_and_the_alternative_names_of_a_client_certificate() {
        let mut params =
            rcgen::CertificateParams::new(vec!["web.svc.example".to_string()]).unwrap();
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://prod.example/web".try_into().unwrap(),
        ));
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress([10, 0, 0, 1].into()));
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CountryName, "NL");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Acme, Inc.");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, " web#1");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let names = Names::read(cert.der()).unwrap();
        assert_eq!(names.subject, "CN=\\ web#1,O=Acme\\, Inc.,C=NL");
        assert_eq!(names.dns, ["web.svc.example"]);
        assert_eq!(names.uris, ["spiffe://prod.example/web"]);
        assert_eq!(Names::read(b"\x30\x03\x02\x01\x01"), None);
    }

    #[test]
    fn reads_the_validity_and_the_issuer_of_a_certificate_rcgen_made() {
        let mut params = rcgen::CertificateParams::new(vec!["a.test".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2026, 1, 2);
        params.not_after = rcgen::date_time_ymd(2026, 4, 2);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Test Issuer CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let info = CertInfo::read(cert.der()).unwrap();
        assert_eq!(info.issuer, "Test Issuer CA");
        let day = |y, m, d| {
            let t = rcgen::date_time_ymd(y, m, d).unix_timestamp();
            UNIX_EPOCH + Duration::from_secs(t as u64)
        };
        assert_eq!(info.not_before, day(2026, 1, 2));
        assert_eq!(info.not_after, day(2026, 4, 2));
        assert_eq!(info.lifetime(), Duration::from_secs(90 * 86_400));
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        assert_eq!(CertInfo::read(b"\x30\x03\x02\x01\x01"), None);
        assert_eq!(CertInfo::read(b""), None);
    }
}

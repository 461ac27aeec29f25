//! What fulcrum reads of a certificate beyond what rustls checks: its validity period
//! and its issuer's name, for `GET /admin/certificates` and for ACME's renewal time
//! (`docs/tls.md`).
//!
//! Read with yasna, the DER reader rcgen already brings: the two fields need a walk of
//! the first seven elements of `TBSCertificate` (RFC 5280 §4.1), not a full X.509 parser.

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

#[cfg(test)]
mod tests {
    use super::*;

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

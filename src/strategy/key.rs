//! Request keys of the hashing strategies, and the one hash function of placement.
//!
//! Placement must be identical on every machine and in every release, so that several
//! fulcrum instances in front of the same backends send a key to the same backend. The
//! hash is therefore fixed: **XXH3-64 with seed 0** (`xxhash_rust::xxh3::xxh3_64`) over
//! explicit bytes, never `std`'s randomly seeded `Hash` machinery.
//!
//! | what | bytes hashed |
//! |---|---|
//! | a ring point | the backend URL exactly as configured, `#`, the point number in decimal: `http://10.0.0.1:80#0` … `#149` |
//! | Maglev offset / skip | the backend URL, with seed 0 / seed 1 |
//! | client IP key | 4 bytes (IPv4, IPv4-mapped IPv6 included) or 16 bytes (IPv6), network order |
//! | `header:NAME` key | the header's value as received (first line if several) |
//! | `cookie:NAME` key | the cookie's value |

use std::net::IpAddr;

use http::header::{self, HeaderMap};
use ipnet::IpNet;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::config::HashKey;

/// Where a hashing strategy takes its request key from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// `--hash-key` (`consistent_hash`, `maglev`), falling back to the client IP.
    Configured,
    /// Always the client IP, `trust::client_ip` (`ip_hash`).
    ClientIp,
}

/// The placement hash of `bytes`.
#[inline]
pub(crate) fn placement_hash(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// The placement hash of `bytes` with `seed` (Maglev's second hash).
#[inline]
pub(crate) fn placement_hash_seeded(bytes: &[u8], seed: u64) -> u64 {
    xxh3_64_with_seed(bytes, seed)
}

/// The key of a client IP.
#[inline]
pub(crate) fn ip_key(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(v4) => placement_hash(&v4.octets()),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => placement_hash(&v4.octets()),
            None => placement_hash(&v6.octets()),
        },
    }
}

/// The request key of a hashing strategy. A request without the configured header or
/// cookie (or with an empty value) is keyed by its client IP, which is computed only
/// then.
pub fn request_key(
    source: KeySource,
    hash_key: &HashKey,
    headers: &HeaderMap,
    peer: IpAddr,
    trusted: &[IpNet],
) -> u64 {
    if source == KeySource::Configured {
        let value = match hash_key {
            HashKey::ClientIp => None,
            HashKey::Header(name) => headers.get(name).map(|v| v.as_bytes()),
            HashKey::Cookie(name) => cookie_value(headers, name),
        };
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            return placement_hash(v);
        }
    }
    ip_key(crate::trust::client_ip(headers, peer, trusted))
}

/// The value of cookie `name` (case-sensitive, RFC 6265), across every `Cookie` line.
fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    (headers.get_all(header::COOKIE).iter()).find_map(|line| cookie_in(line.as_bytes(), name))
}

/// The value of cookie `name` in one `Cookie` line.
pub(crate) fn cookie_in<'l>(line: &'l [u8], name: &str) -> Option<&'l [u8]> {
    line.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let eq = pair.iter().position(|&b| b == b'=')?;
        (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_hash_is_fixed() {
        // XXH3-64, seed 0: these values are part of the contract between instances and
        // releases; a change here moves every key.
        assert_eq!(placement_hash(b""), 0x2d06800538d394c2);
        assert_eq!(
            placement_hash(b"http://127.0.0.1:8001#0"),
            xxh3_64(b"http://127.0.0.1:8001#0")
        );
        assert_eq!(
            ip_key("::ffff:10.0.0.1".parse().unwrap()),
            ip_key("10.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn keys_come_from_the_configured_place_or_the_client_ip() {
        let peer: IpAddr = "10.0.0.9".parse().unwrap();
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let by_ip = |ip: &str| ip_key(ip.parse().unwrap());
        let h = headers(&[
            ("x-user", "alice"),
            ("cookie", "a=1; sid=s3cr3t ; b=2"),
            ("x-forwarded-for", "203.0.113.7"),
        ]);
        let header = HashKey::Header(http::HeaderName::from_static("x-user"));
        let cookie = HashKey::Cookie("sid".into());
        let k = |src, hk: &HashKey, h: &HeaderMap| request_key(src, hk, h, peer, &trusted);
        assert_eq!(
            k(KeySource::Configured, &header, &h),
            placement_hash(b"alice")
        );
        assert_eq!(
            k(KeySource::Configured, &cookie, &h),
            placement_hash(b"s3cr3t")
        );
        assert_eq!(
            k(KeySource::Configured, &HashKey::ClientIp, &h),
            by_ip("203.0.113.7")
        );
        // ip_hash ignores --hash-key.
        assert_eq!(k(KeySource::ClientIp, &header, &h), by_ip("203.0.113.7"));
        // Missing or empty: the client IP.
        let bare = headers(&[("x-user", ""), ("cookie", "sidx=1; xsid=2")]);
        assert_eq!(k(KeySource::Configured, &header, &bare), by_ip("10.0.0.9"));
        assert_eq!(k(KeySource::Configured, &cookie, &bare), by_ip("10.0.0.9"));
        // An untrusted peer cannot choose its key by forging X-Forwarded-For.
        let forged = request_key(
            KeySource::ClientIp,
            &HashKey::ClientIp,
            &h,
            "198.51.100.1".parse().unwrap(),
            &trusted,
        );
        assert_eq!(forged, by_ip("198.51.100.1"));
    }

    #[test]
    fn cookies_over_several_lines() {
        let h = headers(&[("cookie", "a=1"), ("cookie", "sid=x")]);
        assert_eq!(cookie_value(&h, "sid"), Some(&b"x"[..]));
        assert_eq!(cookie_value(&h, "SID"), None);
        assert_eq!(cookie_value(&h, "a"), Some(&b"1"[..]));
    }
}

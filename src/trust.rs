//! Which peers are believed (`--trusted-proxies`, `docs/architecture.md`, "Headers"):
//! the client address behind a trusted proxy's `X-Forwarded-For`, read the same way by
//! the request path and by the hashing strategies' `client_ip` key.

use std::net::IpAddr;

use http::header::HeaderMap;
use ipnet::IpNet;

/// `X-Forwarded-For`.
pub(crate) const X_FORWARDED_FOR: http::header::HeaderName =
    http::header::HeaderName::from_static("x-forwarded-for");

/// Whether `ip` is one of the trusted proxies.
pub(crate) fn is_trusted(trusted: &[IpNet], ip: IpAddr) -> bool {
    let ip = canonical(ip);
    trusted.iter().any(|n| n.contains(&ip))
}

/// IPv4-mapped IPv6 addresses are compared as IPv4.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Every entry of the `X-Forwarded-For` lines `values`, left to right across them; a
/// line that is not visible text (a `HeaderValue::to_str` would refuse it) counts for
/// none.
pub(crate) fn entries<'a>(
    values: impl Iterator<Item = &'a [u8]>,
) -> impl Iterator<Item = &'a [u8]> {
    values
        .filter(|v| v.iter().all(|&c| c == b'\t' || (0x20..0x7f).contains(&c)))
        .flat_map(|v| v.split(|&c| c == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|e| !e.is_empty())
}

/// Every `X-Forwarded-For` entry of `headers`, left to right across its lines.
pub(crate) fn forwarded_entries(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    let lines = headers.get_all(&X_FORWARDED_FOR).into_iter();
    // `entries` only yields visible ASCII.
    entries(lines.map(|v| v.as_bytes())).filter_map(|e| std::str::from_utf8(e).ok())
}

/// The client IP: the peer, unless the peer is trusted; then the right-most
/// `X-Forwarded-For` entry that is not itself trusted.
pub(crate) fn client_ip(headers: &HeaderMap, peer: IpAddr, trusted: &[IpNet]) -> IpAddr {
    let peer = canonical(peer);
    if !is_trusted(trusted, peer) {
        return peer;
    }
    let entries: Vec<&str> = forwarded_entries(headers).collect();
    let mut last_trusted = peer;
    for e in entries.iter().rev() {
        match e.parse::<IpAddr>() {
            Ok(ip) if is_trusted(trusted, ip) => last_trusted = canonical(ip),
            Ok(ip) => return canonical(ip),
            // An unparsable entry cannot be believed; stop at the last trusted hop.
            Err(_) => return last_trusted,
        }
    }
    last_trusted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ip_believes_only_trusted_peers() {
        let trusted = vec!["10.0.0.0/8".parse().unwrap()];
        let mut h = HeaderMap::new();
        h.insert(
            X_FORWARDED_FOR,
            "9.9.9.9, 8.8.8.8, 10.0.0.2".parse().unwrap(),
        );
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(client_ip(&h, ip("7.7.7.7"), &trusted), ip("7.7.7.7"));
        assert_eq!(client_ip(&h, ip("10.0.0.1"), &trusted), ip("8.8.8.8"));
        assert_eq!(
            client_ip(&HeaderMap::new(), ip("10.0.0.1"), &trusted),
            ip("10.0.0.1")
        );
    }
}

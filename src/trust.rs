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

/// Every `X-Forwarded-For` entry, left to right, across all header lines.
pub(crate) fn forwarded_entries(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
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

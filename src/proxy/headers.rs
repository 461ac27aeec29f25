//! The header rules of a proxy hop (§4.3).

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;

/// Hop-by-hop headers removed on every hop (besides those `Connection` names).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::PROXY_AUTHORIZATION,
];

/// `X-Forwarded-For`.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`.
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Whether `name` is hop-by-hop by itself (the fixed list, and `Upgrade`); fields that a
/// `Connection` header names are hop-by-hop too.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    *name == header::UPGRADE || HOP_BY_HOP.contains(name)
}

/// [`is_hop_by_hop`] for a name as it came off the wire, in any case.
pub fn is_hop_by_hop_name(name: &[u8]) -> bool {
    let is = |h: &HeaderName| h.as_str().as_bytes().eq_ignore_ascii_case(name);
    is(&header::UPGRADE) || HOP_BY_HOP.iter().any(is)
}

/// Whether the request asks for a protocol upgrade (`Connection: upgrade` + `Upgrade`).
pub fn is_upgrade_request(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_has(headers, "upgrade")
}

fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str()
            .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            .unwrap_or(false)
    })
}

/// Removes hop-by-hop headers. With `upgrade`, `Connection: upgrade` and `Upgrade`
/// stay, as the next hop needs them to switch protocols.
///
/// Runs on every request and every response, so the common cases stay cheap: one pass
/// over the names finds whether there is anything to remove at all, and the usual
/// `Connection: keep-alive`/`close` values name no header that needs looking up.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let present = headers.keys().any(is_hop_by_hop);
    if !present && !upgrade {
        return;
    }
    if headers.contains_key(header::CONNECTION) {
        let mut named: Vec<HeaderName> = Vec::new();
        for v in headers.get_all(header::CONNECTION) {
            let Ok(s) = v.to_str() else { continue };
            for t in s.split(',').map(str::trim) {
                if t.is_empty()
                    || t.eq_ignore_ascii_case("keep-alive")
                    || t.eq_ignore_ascii_case("close")
                {
                    continue; // Keep-Alive goes with the fixed list below
                }
                if let Ok(name) = HeaderName::from_bytes(t.as_bytes()) {
                    named.push(name);
                }
            }
        }
        for name in named {
            if !(upgrade && name == header::UPGRADE) {
                headers.remove(&name);
            }
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// HTTP/2 clients may split `Cookie` into several fields; an HTTP/1.1 backend expects
/// one line, joined with `; ` (RFC 9113 §8.2.3).
pub fn merge_cookies(headers: &mut HeaderMap) {
    if headers.get_all(header::COOKIE).iter().nth(1).is_none() {
        return;
    }
    let joined: Vec<&[u8]> = headers
        .get_all(header::COOKIE)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if let Ok(v) = HeaderValue::from_bytes(&joined.join(&b"; "[..])) {
        headers.insert(header::COOKIE, v);
    }
}

/// Whether `ip` is one of the trusted proxies.
pub fn is_trusted(trusted: &[IpNet], ip: IpAddr) -> bool {
    let ip = canonical(ip);
    trusted.iter().any(|n| n.contains(&ip))
}

/// IPv4-mapped IPv6 addresses are compared as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Every `X-Forwarded-For` entry, left to right, across all header lines.
fn forwarded_entries(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The client IP of §4.3: the peer, unless the peer is trusted; then the right-most
/// `X-Forwarded-For` entry that is not itself trusted.
pub fn client_ip(headers: &HeaderMap, peer: IpAddr, trusted: &[IpNet]) -> IpAddr {
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

/// The value this hop appends to `X-Forwarded-For` for `peer` (its IP, no port).
/// Computed once per client connection.
pub fn forwarded_value(peer: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&canonical(peer).to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Sets the forwarding headers of this hop: appends `peer` (see [`forwarded_value`]) to
/// `X-Forwarded-For` (merging several incoming lines into one), and sets
/// `X-Forwarded-Proto`/`X-Forwarded-Host` unless a trusted peer already did.
pub fn set_forwarded(
    headers: &mut HeaderMap,
    peer: &HeaderValue,
    peer_trusted: bool,
    host: Option<&HeaderValue>,
) {
    if headers.contains_key(&X_FORWARDED_FOR) {
        let mut xff = String::with_capacity(64);
        for e in forwarded_entries(headers) {
            xff.push_str(e);
            xff.push_str(", ");
        }
        xff.push_str(peer.to_str().unwrap_or("unknown"));
        if let Ok(v) = HeaderValue::from_str(&xff) {
            headers.insert(X_FORWARDED_FOR, v);
        }
    } else {
        headers.insert(X_FORWARDED_FOR, peer.clone());
    }
    if !(peer_trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if !(peer_trusted && headers.contains_key(&X_FORWARDED_HOST)) {
        match host {
            Some(h) => {
                headers.insert(X_FORWARDED_HOST, h.clone());
            }
            None => {
                headers.remove(&X_FORWARDED_HOST);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn removes_connection_named_and_fixed_headers() {
        let mut h = map(&[
            ("connection", "close, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic x"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, vec!["x-kept"]);
    }

    #[test]
    fn upgrade_keeps_its_headers() {
        let mut h = map(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert!(is_upgrade_request(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
    }

    #[test]
    fn forwarded_for_is_merged_and_appended() {
        let mut h = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2, 3.3.3.3"),
        ]);
        let peer = forwarded_value("127.0.0.1".parse().unwrap());
        set_forwarded(&mut h, &peer, false, None);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-proto"], "http");
    }

    #[test]
    fn split_cookies_are_joined() {
        let mut h = map(&[("cookie", "a=1"), ("cookie", "b=2")]);
        merge_cookies(&mut h);
        assert_eq!(h.get_all("cookie").iter().count(), 1);
        assert_eq!(h["cookie"], "a=1; b=2");
    }

    #[test]
    fn client_ip_believes_only_trusted_peers() {
        let trusted = vec!["10.0.0.0/8".parse().unwrap()];
        let h = map(&[("x-forwarded-for", "9.9.9.9, 8.8.8.8, 10.0.0.2")]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(client_ip(&h, ip("7.7.7.7"), &trusted), ip("7.7.7.7"));
        assert_eq!(client_ip(&h, ip("10.0.0.1"), &trusted), ip("8.8.8.8"));
        assert_eq!(
            client_ip(&HeaderMap::new(), ip("10.0.0.1"), &trusted),
            ip("10.0.0.1")
        );
    }
}

//! Where a split route sends a request (`docs/traffic.md`, "Splits"): the hash of its
//! `split_key`, read from the head in whichever form its fields are, with the placement
//! hash every fulcrum instance shares (`strategy::key`).

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderValue};
use ipnet::IpNet;

use super::message::{Peer, RequestFields, RequestHead};
use crate::config::HashKey;
use crate::strategy::key::{cookie_in, ip_key, placement_hash};
use crate::trust::X_FORWARDED_FOR;

/// The hash of `key` as the request gives it; `None` when it has no such field or
/// cookie (or an empty one): the split's round robin places it then.
pub(super) fn split_key(
    key: &HashKey,
    head: &RequestHead,
    client_ip: impl FnOnce() -> IpAddr,
) -> Option<u64> {
    let value = match key {
        HashKey::ClientIp => return Some(ip_key(client_ip())),
        HashKey::Header(name) => head.first_value(name),
        HashKey::Cookie(name) => cookie(head, name),
    };
    value.filter(|v| !v.is_empty()).map(placement_hash)
}

/// The client IP, `trusted_proxies` honoured.
pub(super) fn client_ip(
    head: &RequestHead,
    peer: &Peer,
    peer_trusted: bool,
    trusted: &[IpNet],
) -> IpAddr {
    let ip = peer.addr.ip();
    if !peer_trusted {
        return ip.to_canonical();
    }
    match &head.fields {
        RequestFields::Map(m) => crate::trust::client_ip(m, ip, trusted),
        RequestFields::Spans(_) => {
            let mut m = HeaderMap::new();
            head.any_value(&X_FORWARDED_FOR, |v| {
                if let Ok(v) = HeaderValue::from_bytes(v) {
                    m.append(X_FORWARDED_FOR, v);
                }
                false
            });
            crate::trust::client_ip(&m, ip, trusted)
        }
    }
}

/// The value of the cookie `name` in any `Cookie` field.
fn cookie<'h>(head: &'h RequestHead, name: &str) -> Option<&'h [u8]> {
    match &head.fields {
        RequestFields::Map(m) => {
            (m.get_all(header::COOKIE).iter()).find_map(|line| cookie_in(line.as_bytes(), name))
        }
        RequestFields::Spans(f) => (f.iter())
            .filter(|(n, _)| n.eq_ignore_ascii_case(b"cookie"))
            .find_map(|(_, line)| cookie_in(line, name)),
    }
}

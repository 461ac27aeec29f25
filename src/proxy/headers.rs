//! The header rules of a proxy hop (`docs/architecture.md`, "Headers"); the
//! hop-by-hop rules themselves are in [`super::hop`].

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::hop;

pub(crate) use crate::trust::X_FORWARDED_FOR;
use crate::trust::{canonical, forwarded_entries};
/// `X-Forwarded-Proto`.
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`.
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Whether the request asks for a protocol upgrade (`Connection: upgrade` + `Upgrade`).
/// A `Connection` value with bytes outside visible ASCII asks for none: such a request is
/// forwarded as an ordinary one, its `Connection` and `Upgrade` dropped (the fast path
/// hands any request naming `upgrade` to this check).
pub(crate) fn is_upgrade_request(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| hop::tokens(s.as_bytes()).any(|t| t.is_upgrade()))
        })
}

/// Leaves in `Upgrade` only the protocols of `allowed` (lower-case names; a protocol's
/// `/version` is not compared); whether any is left, so that the request is an upgrade.
pub(crate) fn keep_upgrades(headers: &mut HeaderMap, allowed: &[String]) -> bool {
    let is_allowed = |p: &str| protocol_allowed(p, allowed);
    let offered: Vec<&str> = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if !offered.is_empty() && offered.iter().all(|p| is_allowed(p)) {
        return true;
    }
    let kept: Vec<&str> = offered.into_iter().filter(|p| is_allowed(p)).collect();
    match HeaderValue::from_str(&kept.join(", ")) {
        Ok(v) if !kept.is_empty() => {
            headers.insert(header::UPGRADE, v);
            true
        }
        _ => false,
    }
}

/// Whether a `101` answer switches to a protocol of `allowed` (its `Upgrade` names one).
pub(crate) fn switches_to_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| protocol_allowed(p, allowed))
}

/// Whether the protocol `p` of an `Upgrade` field (`name[/version]`) is one of `allowed`
/// (lower-case names; the version is not compared).
fn protocol_allowed(p: &str, allowed: &[String]) -> bool {
    let name = p.split('/').next().unwrap_or("").trim();
    allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Removes hop-by-hop headers ([`hop`]'s rules). With `upgrade`, `Connection: upgrade`
/// and `Upgrade` stay, as the next hop needs them to switch protocols.
///
/// Runs on every request and every response of the header-map path, so the common case
/// stays cheap: one pass over the names finds whether there is anything to remove.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let present = headers
        .keys()
        .any(|k| hop::is_hop_by_hop(k.as_str().as_bytes()));
    if !present && !upgrade {
        return;
    }
    let doomed: Vec<HeaderName> = {
        let mut named = hop::Named::default();
        for v in headers.get_all(header::CONNECTION) {
            named.add(v.as_bytes());
        }
        headers
            .keys()
            .filter(|k| hop::is_dropped(k.as_str().as_bytes(), &named, upgrade))
            .cloned()
            .collect()
    };
    for name in doomed {
        headers.remove(&name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// HTTP/2 clients may split `Cookie` into several fields; an HTTP/1.1 backend expects
/// one line, joined with `; ` (RFC 9113 §8.2.3).
pub(crate) fn merge_cookies(headers: &mut HeaderMap) {
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

/// The value this hop appends to `X-Forwarded-For` for `peer` (its IP, no port).
/// Computed once per client connection.
pub(crate) fn forwarded_value(peer: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&canonical(peer).to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Sets the forwarding headers of this hop: appends `peer` (see [`forwarded_value`]) to
/// `X-Forwarded-For` (merging several incoming lines into one), and sets
/// `X-Forwarded-Proto` (`https` for a request that came over TLS) and
/// `X-Forwarded-Host` unless a trusted peer already did.
pub(crate) fn set_forwarded(
    headers: &mut HeaderMap,
    peer: &HeaderValue,
    peer_trusted: bool,
    host: Option<&HeaderValue>,
    https: bool,
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
        let proto = if https { "https" } else { "http" };
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
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

/// Appends one `name: value` header line.
#[inline]
pub(crate) fn put_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// [`put_field`] with the name in lower case, as a header map writes names (HTTP/1.1
/// names are case-insensitive), for names copied from a head as they were spelled.
#[inline]
pub(crate) fn put_field_lowercase(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend(name.iter().map(u8::to_ascii_lowercase));
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Header fields as spans of a head's own bytes (as httparse found them, names and
/// values checked against the grammar), with no copies and no header map.
#[derive(Debug, Default)]
pub(crate) struct Spans {
    head: bytes::Bytes,
    /// Name offset, name length, value offset, value length.
    spans: Vec<(u32, u32, u32, u32)>,
}

impl Spans {
    /// The fields at `spans` of `head`; every span must lie inside `head`.
    pub(crate) fn new(head: bytes::Bytes, spans: Vec<(u32, u32, u32, u32)>) -> Spans {
        debug_assert!(spans
            .iter()
            .all(|&(n, nl, v, vl)| (n + nl) as usize <= head.len()
                && (v + vl) as usize <= head.len()));
        Spans { head, spans }
    }

    /// Name (as spelled in the head) and value of each field, in order.
    #[inline]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter().map(|&(ns, nl, vs, vl)| {
            let (ns, nl, vs, vl) = (ns as usize, nl as usize, vs as usize, vl as usize);
            (&self.head[ns..ns + nl], &self.head[vs..vs + vl])
        })
    }

    /// The value of the first field named `name` (lower case), as a slice of the head.
    pub(crate) fn value(&self, name: &[u8]) -> Option<HeaderValue> {
        let &(_, _, vs, vl) = self.spans.iter().find(|&&(ns, nl, _, _)| {
            self.head[ns as usize..(ns + nl) as usize].eq_ignore_ascii_case(name)
        })?;
        HeaderValue::from_maybe_shared(self.head.slice(vs as usize..(vs + vl) as usize)).ok()
    }

    /// The fields as a header map (values still slices of the head), with room for
    /// `more`.
    pub(crate) fn to_map(&self, more: usize) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.spans.len() + more);
        for &(ns, nl, vs, vl) in &self.spans {
            let (ns, nl, vs, vl) = (ns as usize, nl as usize, vs as usize, vl as usize);
            // httparse has checked both against the grammar `http` checks: nothing is
            // dropped here.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&self.head[ns..ns + nl]),
                HeaderValue::from_maybe_shared(self.head.slice(vs..vs + vl)),
            ) {
                map.append(name, value);
            }
        }
        map
    }
}

/// The header fields of a request read by the client-side fast path.
///
/// Plain `GET`s are nearly all of a proxy's traffic, and for them the fields only need
/// to be copied to the backend with this hop's rules applied ([`Self::write_forwarded`]);
/// building a header map (a name lookup, a shared slice and a hashed insert per field,
/// three more inserts for `X-Forwarded-*`, then tearing it down) cost more than the
/// rest of the request's header work together. A map is made only when a hashing
/// strategy needs one to read its key from ([`Self::forwarded_map`]).
#[derive(Debug)]
pub(crate) struct ClientFields(Spans);

impl ClientFields {
    /// The request's fields.
    pub(crate) fn new(fields: Spans) -> ClientFields {
        ClientFields(fields)
    }

    /// Name (as spelled) and value of each field, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.0.iter()
    }

    /// The first `Host` value (no copy).
    pub(crate) fn host(&self) -> Option<HeaderValue> {
        self.0.value(b"host")
    }

    /// The value of the first field named `name` (lower case; no copy).
    pub(crate) fn value(&self, name: &[u8]) -> Option<HeaderValue> {
        self.0.value(name)
    }

    /// What the fields count toward the request head limit (as a header map's would).
    pub(crate) fn size(&self) -> usize {
        self.iter().map(|(n, v)| n.len() + v.len() + 4).sum()
    }

    /// The fields as a header map, as they came (with room for `X-Forwarded-*`).
    pub(crate) fn to_map(&self) -> HeaderMap {
        self.0.to_map(3)
    }

    /// The fields as forwarded, as a header map: [`strip_hop_by_hop`] and
    /// [`set_forwarded`] applied to [`Self::to_map`].
    pub(crate) fn forwarded_map(
        &self,
        peer: &HeaderValue,
        peer_trusted: bool,
        host: Option<&HeaderValue>,
    ) -> HeaderMap {
        let mut map = self.to_map();
        strip_hop_by_hop(&mut map, false);
        // Span fields are read from plain connections only (the fast path).
        set_forwarded(&mut map, peer, peer_trusted, host, false);
        map
    }

    /// Writes the fields as this hop forwards them, one `name: value` line each (names
    /// in lower case, as a header map writes them): without hop-by-hop fields and those
    /// `Connection` names, with `X-Forwarded-*` set as [`set_forwarded`] sets them, and
    /// `host: default_host` when no `Host` field is left (HTTP/1.1 requires one), and
    /// `x-request-id: request_id` in place of any the client sent. The fields of
    /// [`Self::forwarded_map`] plus that `Host` and that id, in another order.
    pub(crate) fn write_forwarded(
        &self,
        out: &mut Vec<u8>,
        peer: &HeaderValue,
        peer_trusted: bool,
        host: Option<&HeaderValue>,
        default_host: &str,
        request_id: &[u8],
    ) {
        let mut named = hop::Named::default();
        for (name, value) in self.iter() {
            if hop::is_connection(name) {
                named.add(value);
            }
        }
        let mut has_xff = false;
        let mut proto_kept = false;
        let mut host_kept = false;
        let mut has_host = false;
        for (name, value) in self.iter() {
            if hop::is_dropped(name, &named, false) || super::request_id::is_request_id(name) {
                continue;
            }
            has_host |= name.eq_ignore_ascii_case(b"host");
            if name.eq_ignore_ascii_case(X_FORWARDED_FOR.as_str().as_bytes()) {
                has_xff = true;
                continue; // merged into one line below
            }
            if name.eq_ignore_ascii_case(X_FORWARDED_PROTO.as_str().as_bytes()) {
                if !peer_trusted {
                    continue;
                }
                proto_kept = true;
            } else if name.eq_ignore_ascii_case(X_FORWARDED_HOST.as_str().as_bytes()) {
                if !peer_trusted {
                    continue;
                }
                host_kept = true;
            }
            put_field_lowercase(out, name, value);
        }
        out.extend_from_slice(b"x-forwarded-for: ");
        if has_xff {
            // Every entry received, left to right across the lines, as
            // `forwarded_entries` reads them (values that are not visible ASCII skipped).
            for (name, value) in self.iter() {
                if !name.eq_ignore_ascii_case(X_FORWARDED_FOR.as_str().as_bytes())
                    || !value
                        .iter()
                        .all(|&c| c == b'\t' || (0x20..0x7f).contains(&c))
                {
                    continue;
                }
                for e in value.split(|&c| c == b',').map(<[u8]>::trim_ascii) {
                    if !e.is_empty() {
                        out.extend_from_slice(e);
                        out.extend_from_slice(b", ");
                    }
                }
            }
        }
        out.extend_from_slice(peer.as_bytes());
        out.extend_from_slice(b"\r\n");
        if !proto_kept {
            put_field(out, b"x-forwarded-proto", b"http");
        }
        if let (false, Some(h)) = (host_kept, host) {
            put_field(out, b"x-forwarded-host", h.as_bytes());
        }
        put_field(out, b"x-request-id", request_id);
        if !has_host {
            put_field(out, b"host", default_host.as_bytes());
        }
    }
}

/// The fields a backend gets from the fast path's writer and from the map path, each as
/// sorted `(name, value)` lines: the two must agree (the property test and the
/// `header_rewrite` fuzz target check it).
#[cfg(any(fuzzing, test))]
pub(crate) fn both_rewrites(f: &ClientFields, trusted: bool) -> (Lines, Lines) {
    let peer = HeaderValue::from_static("127.0.0.1");
    let host = f.host();
    let mut out = Vec::new();
    f.write_forwarded(
        &mut out,
        &peer,
        trusted,
        host.as_ref(),
        "backend:80",
        b"id-1",
    );
    // The map path: the same rules, then the backend's authority as Host when no Host
    // is left (what `wire::write_head` is given), and the id as `Proxy::prepare` sets it.
    let mut map = f.forwarded_map(&peer, trusted, host.as_ref());
    map.insert(
        super::request_id::X_REQUEST_ID,
        HeaderValue::from_static("id-1"),
    );
    if !map.contains_key(header::HOST) {
        map.insert(header::HOST, HeaderValue::from_static("backend:80"));
    }
    (sorted_lines(&out), sorted_map(&map))
}

/// Header lines as `(name, value)`, sorted.
#[cfg(any(fuzzing, test))]
pub(crate) type Lines = Vec<(String, String)>;

/// The `name: value` lines of `text`, sorted.
#[cfg(any(fuzzing, test))]
fn sorted_lines(text: &[u8]) -> Lines {
    let text = String::from_utf8_lossy(text);
    let mut v: Lines = text
        .split_terminator("\r\n")
        .map(|l| match l.split_once(": ") {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect();
    v.sort();
    v
}

#[cfg(any(fuzzing, test))]
fn sorted_map(map: &HeaderMap) -> Lines {
    let mut v: Lines = map
        .iter()
        .map(|(k, v)| {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (k.as_str().to_string(), v)
        })
        .collect();
    v.sort();
    v
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

    /// `ClientFields` over a head made of `lines` (`name: value` each).
    fn client_fields(lines: &[(String, String)]) -> ClientFields {
        let mut head = Vec::new();
        let mut spans = Vec::new();
        for (n, v) in lines {
            let ns = head.len() as u32;
            head.extend_from_slice(n.as_bytes());
            head.extend_from_slice(b": ");
            let vs = head.len() as u32;
            head.extend_from_slice(v.as_bytes());
            head.extend_from_slice(b"\r\n");
            spans.push((ns, n.len() as u32, vs, v.len() as u32));
        }
        ClientFields::new(Spans::new(bytes::Bytes::from(head), spans))
    }

    proptest::proptest! {
        /// Writing the fast path's fields straight out forwards exactly what applying
        /// the hop's rules to a header map does.
        #[test]
        fn written_fields_match_the_forwarded_map(
            lines in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "Host", "x-forwarded-for", "X-Forwarded-For", "x-forwarded-proto",
                        "X-Forwarded-Host", "Connection", "Keep-Alive", "TE", "Upgrade",
                        "x-secret", "X-Other", "cookie", "Proxy-Authorization", "accept",
                    ]),
                    proptest::sample::select(vec![
                        "a", "1.1.1.1", "2.2.2.2, 3.3.3.3", " , 4.4.4.4 ,", "close",
                        "keep-alive, x-secret", "x-other", "https", "h.example", "",
                        "keep-alive, host", "x-secret, caf\u{e9}", "5.5.5.5, \u{e9}",
                    ]),
                ),
                0..10,
            ),
            trusted in proptest::bool::ANY,
        ) {
            let lines: Vec<(String, String)> =
                lines.into_iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
            let f = client_fields(&lines);
            let (written, mapped) = both_rewrites(&f, trusted);
            proptest::prop_assert_eq!(written, mapped);
        }
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
    fn only_the_allowed_protocols_are_upgraded_to() {
        let ws = vec!["websocket".to_string()];
        let mut h = map(&[("upgrade", "h2c")]);
        assert!(!keep_upgrades(&mut h, &ws), "h2c is not tunnelled");
        let mut h = map(&[("upgrade", "WebSocket")]);
        assert!(keep_upgrades(&mut h, &ws));
        assert_eq!(h["upgrade"], "WebSocket", "left as sent");
        let mut h = map(&[("upgrade", "h2c, websocket/13")]);
        assert!(keep_upgrades(&mut h, &ws));
        assert_eq!(
            h["upgrade"], "websocket/13",
            "only what is allowed is offered"
        );
        let mut h = map(&[("upgrade", "websocket")]);
        assert!(!keep_upgrades(&mut h, &[]), "an empty list tunnels nothing");
        assert!(switches_to_allowed(&map(&[("upgrade", "websocket")]), &ws));
        assert!(!switches_to_allowed(&map(&[("upgrade", "h2c")]), &ws));
        assert!(!switches_to_allowed(&HeaderMap::new(), &ws));
    }

    #[test]
    fn upgrade_keeps_its_headers() {
        let mut odd = HeaderMap::new();
        odd.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        odd.insert(
            header::CONNECTION,
            HeaderValue::from_bytes(b"upgrade, caf\xe9").unwrap(),
        );
        assert!(
            !is_upgrade_request(&odd),
            "a value that is not text asks for none"
        );
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
        set_forwarded(&mut h, &peer, false, None, false);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-proto"], "http");
        set_forwarded(&mut h, &peer, false, None, true);
        assert_eq!(h["x-forwarded-proto"], "https");
    }

    #[test]
    fn split_cookies_are_joined() {
        let mut h = map(&[("cookie", "a=1"), ("cookie", "b=2")]);
        merge_cookies(&mut h);
        assert_eq!(h.get_all("cookie").iter().count(), 1);
        assert_eq!(h["cookie"], "a=1; b=2");
    }
}

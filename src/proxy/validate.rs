//! What a request head must be before anything of it reaches a backend: a method this
//! proxy serves, unambiguous framing, and one valid `Host` (RFC 9112 §3.2, §6.1; RFC 9113
//! §8.3.1). The rules read the head through [`RequestHead`], so they hold for both forms
//! of its fields; `docs/operations.md` ("Hardening") lists them next to HAProxy's and
//! nginx's.

use http::header;
use http::{Method, StatusCode, Version};

use super::answer::ProxyResponse;
use super::message::{RequestFields, RequestHead};
use crate::loops::names_us;

/// Why a request head is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invalid {
    /// `CONNECT`: fulcrum is a reverse proxy, not a forward proxy.
    Connect,
    /// `Content-Length` together with `Transfer-Encoding`: the framing is ambiguous, the
    /// shape request smuggling takes.
    LengthAndCoding,
    /// An HTTP/1.1 request without `Host`, or an HTTP/2 one with neither `Host` nor
    /// `:authority`.
    NoHost,
    /// More than one `Host` field.
    SeveralHosts,
    /// A `Host` that is not `host[:port]`.
    BadHost,
    /// An HTTP/2 request whose `Host` names another authority than `:authority`.
    HostNotAuthority,
    /// Its `Via` names this process: it went round (`crate::loops`).
    Loop,
}

/// The methods a client may use, for a 405's `Allow`.
const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, TRACE";

impl Invalid {
    /// The answer: 405 with `Allow` for `CONNECT`, 508 for a loop, else 400; each
    /// closes the connection
    /// (what follows a refused head cannot be trusted to be framed as it says).
    pub(crate) fn answer(self) -> ProxyResponse {
        let (status, text) = match self {
            Invalid::Connect => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed: CONNECT is not proxied\n",
            ),
            Invalid::LengthAndCoding => (
                StatusCode::BAD_REQUEST,
                "bad request: Content-Length with Transfer-Encoding\n",
            ),
            Invalid::NoHost => (StatusCode::BAD_REQUEST, "bad request: no Host\n"),
            Invalid::SeveralHosts => (
                StatusCode::BAD_REQUEST,
                "bad request: several Host fields\n",
            ),
            Invalid::BadHost => (StatusCode::BAD_REQUEST, "bad request: invalid Host\n"),
            Invalid::HostNotAuthority => (
                StatusCode::BAD_REQUEST,
                "bad request: Host differs from :authority\n",
            ),
            Invalid::Loop => (
                StatusCode::LOOP_DETECTED,
                "loop detected: this request went through this fulcrum before\n",
            ),
        };
        let mut r = ProxyResponse::own(status, text)
            .with_field(header::CONNECTION, http::HeaderValue::from_static("close"));
        if self == Invalid::Connect {
            r = r.with_field(header::ALLOW, http::HeaderValue::from_static(ALLOW));
        }
        r
    }
}

/// Checks `head`; `Err` names the first rule it breaks.
#[inline]
pub(crate) fn check(head: &RequestHead) -> Result<(), Invalid> {
    if head.method == Method::CONNECT {
        return Err(Invalid::Connect);
    }
    let mut hosts = Hosts::new(head);
    match &head.fields {
        RequestFields::Map(m) => {
            // hyper drops `Content-Length` from a head that also has `Transfer-Encoding`
            // (and closes the connection after it): a map never carries both. The first
            // head of a connection is read by the fast path, which sees both.
            m.get_all(header::HOST)
                .iter()
                .for_each(|v| hosts.see(v.as_bytes()));
            if m.get_all(header::VIA)
                .iter()
                .any(|v| names_us(v.as_bytes()))
            {
                return Err(Invalid::Loop);
            }
        }
        RequestFields::Spans(f) => {
            let (mut length, mut coding, mut looped) = (false, false, false);
            // Every request on the fast path comes here: names are told apart by their
            // length before any comparison.
            for (n, v) in f.iter() {
                match n.len() {
                    3 if n.eq_ignore_ascii_case(b"via") => looped |= names_us(v),
                    4 if n.eq_ignore_ascii_case(HOST) => hosts.see(v),
                    14 if n.eq_ignore_ascii_case(b"content-length") => length = true,
                    17 if n.eq_ignore_ascii_case(b"transfer-encoding") => coding = true,
                    _ => {}
                }
            }
            if length && coding {
                return Err(Invalid::LengthAndCoding);
            }
            if looped {
                return Err(Invalid::Loop);
            }
        }
    }
    hosts.verdict(head.version)
}

/// The `Host` fields of a head as they are seen: one, valid, required on HTTP/1.1
/// (HTTP/2 carries `:authority`, and HTTP/1.0 may leave it out), and on HTTP/2 naming
/// the same authority.
struct Hosts<'a> {
    count: usize,
    valid: bool,
    same_as_authority: bool,
    authority: Option<&'a [u8]>,
}

impl<'a> Hosts<'a> {
    fn new(head: &'a RequestHead) -> Self {
        Hosts {
            count: 0,
            valid: true,
            same_as_authority: true,
            authority: head.uri.authority().map(|a| a.as_str().as_bytes()),
        }
    }

    fn see(&mut self, v: &[u8]) {
        self.count += 1;
        // The authority's own bytes (HTTP/2's `host`, made from `:authority`): the same
        // authority, and valid when it is, which `verdict` checks (about 200 instructions
        // a request spared; `docs/performance.md`, "The target shared with its block").
        if self.authority == Some(v) {
            return;
        }
        self.valid &= is_valid_host(v);
        self.same_as_authority &= self.authority.is_none_or(|a| same_authority(a, v));
    }

    /// The verdict (HTTP/3 as HTTP/2: RFC 9114 §4.3.1 has the same rule). The target's authority (absolute form, or HTTP/2's `:authority`) is
    /// held to the same grammar as `Host`: it becomes the `Host` the backend sees.
    fn verdict(&self, version: Version) -> Result<(), Invalid> {
        if self.authority.is_some_and(|a| !is_valid_host(a)) {
            return Err(Invalid::BadHost);
        }
        match self.count {
            // RFC 9112 §3.2: even with an absolute-form target.
            0 if version == Version::HTTP_11 => Err(Invalid::NoHost),
            // RFC 9113 §8.3.1: an HTTP/2 request names its authority in `:authority` or
            // `host`; without either, which host is asked for is anyone's guess.
            0 if multiplexed(version) && self.authority.is_none() => Err(Invalid::NoHost),
            0 => Ok(()),
            1 if !self.valid => Err(Invalid::BadHost),
            1 if !self.same_as_authority && multiplexed(version) => Err(Invalid::HostNotAuthority),
            1 => Ok(()),
            _ => Err(Invalid::SeveralHosts),
        }
    }
}

/// Whether two authorities name the same one: case-insensitively, and with the default
/// ports (80, 443) left out, as RFC 9113 §8.3.1 asks an intermediary to compare them.
fn same_authority(a: &[u8], b: &[u8]) -> bool {
    without_default_port(a).eq_ignore_ascii_case(without_default_port(b))
}

fn without_default_port(v: &[u8]) -> &[u8] {
    v.strip_suffix(b":80")
        .or_else(|| v.strip_suffix(b":443"))
        .unwrap_or(v)
}

const HOST: &[u8] = b"host";

/// Whether `v` is `uri-host [ ":" port ]` (RFC 9110 §7.2): a registered name, an IPv4
/// address or a bracketed IP literal, then optional digits; no user info, no path, no
/// space. Checked by hand over the bytes: parsing it into an `Authority` would copy it.
fn is_valid_host(v: &[u8]) -> bool {
    let (host, port) = if v.first() == Some(&b'[') {
        match v.iter().position(|&c| c == b']') {
            Some(i) => v.split_at(i + 1),
            None => return false,
        }
    } else {
        match v.iter().rposition(|&c| c == b':') {
            Some(i) => v.split_at(i),
            None => (v, &v[v.len()..]),
        }
    };
    let port_ok = port.is_empty() || (port[0] == b':' && port[1..].iter().all(u8::is_ascii_digit));
    let host_ok = match host {
        [] => false,
        [b'[', inner @ .., b']'] => {
            !inner.is_empty()
                && inner
                    .iter()
                    .all(|&c| c.is_ascii_hexdigit() || c == b':' || c == b'.')
        }
        _ => host.iter().all(|&c| REG_NAME[c as usize]),
    };
    port_ok && host_ok
}

/// The bytes of a registered name (RFC 3986: unreserved, sub-delims, `%`), by byte.
static REG_NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b'%'
            );
        c += 1;
    }
    t
};

/// HTTP/2 and HTTP/3: the authority comes in `:authority`, and `host` must agree.
fn multiplexed(version: Version) -> bool {
    version == Version::HTTP_2 || version == Version::HTTP_3
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, Uri};

    fn map_head(version: Version, uri: &'static str, hosts: &[&'static str]) -> RequestHead {
        let mut m = HeaderMap::new();
        for h in hosts {
            m.append(header::HOST, HeaderValue::from_static(h));
        }
        RequestHead {
            method: Method::GET,
            uri: Uri::from_static(uri),
            version,
            fields: RequestFields::Map(m),
        }
    }

    #[test]
    fn http2_host_must_name_the_authority() {
        let h2 = Version::HTTP_2;
        let ok = map_head(h2, "http://a.example/x", &["A.example"]);
        assert_eq!(check(&ok), Ok(()));
        let none = map_head(h2, "http://a.example/x", &[]);
        assert_eq!(check(&none), Ok(()), ":authority is enough");
        let other = map_head(h2, "http://a.example/x", &["b.example"]);
        assert_eq!(check(&other), Err(Invalid::HostNotAuthority));
        let bare = map_head(h2, "/x", &[]);
        assert_eq!(check(&bare), Err(Invalid::NoHost), "no authority at all");
        let host_only = map_head(h2, "/x", &["a.example"]);
        assert_eq!(check(&host_only), Ok(()), "host is enough");
        let port = map_head(h2, "http://a.example:80/x", &["a.example"]);
        assert_eq!(check(&port), Ok(()), "the default port is left out");
        let userinfo = map_head(Version::HTTP_11, "http://evil@a.example/x", &["ok"]);
        assert_eq!(
            check(&userinfo),
            Err(Invalid::BadHost),
            "the target's authority too"
        );
        let absolute = map_head(Version::HTTP_11, "http://a.example/x", &[]);
        assert_eq!(
            check(&absolute),
            Err(Invalid::NoHost),
            "HTTP/1.1 sends Host anyway"
        );
        let two = map_head(Version::HTTP_11, "/x", &["a", "a"]);
        assert_eq!(check(&two), Err(Invalid::SeveralHosts));
        let old = map_head(Version::HTTP_10, "/x", &[]);
        assert_eq!(check(&old), Ok(()), "HTTP/1.0 may leave Host out");
    }

    #[test]
    fn hosts_are_host_and_port_only() {
        for ok in [
            "a.example",
            "a.example:8080",
            "127.0.0.1:1",
            "[::1]:80",
            "[::1]",
            "x:",
        ] {
            assert!(is_valid_host(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "user@evil/x",
            "a/b",
            "[::1",
            "a:b",
            ":80x",
            "[]",
            "a\tb",
        ] {
            assert!(!is_valid_host(bad.as_bytes()), "{bad}");
        }
    }
}

//! Loops (`docs/operations.md`, "Loops"): a backend that is this fulcrum itself (a
//! static URL equal to a listener, a wildcard DNS record naming the balancer). Such a
//! backend is refused where it is named ([`own_backend`]), and every request fulcrum sends a
//! backend — forwarded, a health probe — names this process in `Via` (RFC 9110
//! §7.6.3), so one that comes back all the same is seen and answered `508` instead of
//! going round until descriptors and memory run out.

use std::net::{IpAddr, SocketAddr};
use std::sync::{OnceLock, RwLock};

use http::Version;

/// This process in `Via`: its pseudonym `fulcrum-ID`, and the element each client
/// protocol forwards (`1.1 fulcrum-ID`).
struct Own {
    token: Box<[u8]>,
    elements: [Box<[u8]>; 4],
    /// The same elements as field values, for a request without `Via` of its own.
    values: [http::HeaderValue; 4],
}

static OWN: OnceLock<Own> = OnceLock::new();

fn own() -> &'static Own {
    OWN.get_or_init(|| made(&format!("{:08x}", fastrand::u32(..))))
}

fn made(id: &str) -> Own {
    let token = format!("fulcrum-{id}");
    let element = |v: &str| format!("{v} {token}").into_bytes().into_boxed_slice();
    let elements = [element("1.0"), element("1.1"), element("2"), element("3")];
    // A token of checked bytes after a version: always a field value.
    let value = |e: &[u8]| {
        http::HeaderValue::from_bytes(e).unwrap_or(http::HeaderValue::from_static("1.1 fulcrum"))
    };
    Own {
        values: [
            value(&elements[0]),
            value(&elements[1]),
            value(&elements[2]),
            value(&elements[3]),
        ],
        elements,
        token: token.into_bytes().into_boxed_slice(),
    }
}

/// This process's instance id (§19a): the fleet instance's name, else the random one
/// `Via` carries.
pub(crate) fn instance() -> String {
    let token = &own().token;
    String::from_utf8_lossy(token.strip_prefix(b"fulcrum-").unwrap_or(token)).into_owned()
}

/// Names this process `id` (the fleet instance's name; else a random one is drawn on
/// first use). Only the first call counts; an id that is not a token is not taken.
pub(crate) fn set_instance(id: &str) {
    let token = |c: u8| c.is_ascii_alphanumeric() || b"-._~".contains(&c);
    if !id.is_empty() && id.bytes().all(token) {
        let _ = OWN.set(made(id));
    }
}

fn index(version: Version) -> usize {
    match version {
        Version::HTTP_10 | Version::HTTP_09 => 0,
        Version::HTTP_2 => 2,
        Version::HTTP_3 => 3,
        _ => 1,
    }
}

/// This hop's `Via` element for a request the client sent over `version`.
pub(crate) fn element(version: Version) -> &'static [u8] {
    &own().elements[index(version)]
}

/// [`element`] as a field value, when the element is the whole field (a shared value:
/// cloning it copies nothing).
pub(crate) fn value_of(element: &[u8]) -> Option<&'static http::HeaderValue> {
    let own = own();
    (own.elements.iter().position(|e| **e == *element)).map(|i| &own.values[i])
}

/// The element a health probe sends (it speaks HTTP/1.1 or h2 to the backend; it
/// names the hop all the same).
pub(crate) fn probe_element() -> &'static str {
    // Made of a token and digits: always text.
    std::str::from_utf8(element(Version::HTTP_11)).unwrap_or("1.1 fulcrum")
}

/// [`probe_element`] as a field value (a shared value: cloning it copies nothing), for
/// the requests fulcrum makes of its own: probes, auth subrequests, key-set fetches.
pub(crate) fn probe_value() -> http::HeaderValue {
    own().values[index(Version::HTTP_11)].clone()
}

/// Whether a `Via` line names this process as one of its hops: the request went
/// through here before.
pub(crate) fn names_us(value: &[u8]) -> bool {
    let token = &*own().token;
    value.split(|&b| b == b',').any(|element| {
        let mut parts = element
            .split(u8::is_ascii_whitespace)
            .filter(|p| !p.is_empty());
        parts.nth(1) == Some(token)
    })
}

/// The proxy listeners' addresses, as bound (a port of 0 resolved).
static LISTENERS: RwLock<Vec<SocketAddr>> = RwLock::new(Vec::new());

/// Records the addresses the proxy listeners are bound to.
pub(crate) fn set_listeners(addrs: &[SocketAddr]) {
    let mut l = LISTENERS.write().unwrap_or_else(|e| e.into_inner());
    *l = addrs.to_vec();
}

/// Whether `addr` reaches one of `listeners`: one's address, or any local address on
/// the port of one bound to every address.
pub(crate) fn reaches(listeners: &[SocketAddr], addr: SocketAddr) -> bool {
    let ip = canonical(addr.ip());
    listeners.iter().any(|l| {
        l.port() == addr.port()
            && l.port() != 0
            && (canonical(l.ip()) == ip || (l.ip().is_unspecified() && is_local(ip)))
    })
}

/// An IPv4-mapped IPv6 address as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` is one of this host's own addresses: loopback, unspecified, or one the
/// kernel routes to itself — a UDP socket connected to it (no packet is sent) takes it
/// as its own source address. (Binding to it would prove nothing on a host that allows
/// binding to foreign addresses, as VRRP pairs do: `ip_nonlocal_bind`.)
fn is_local(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    let any: SocketAddr = match ip {
        IpAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let Ok(sock) = std::net::UdpSocket::bind(any) else {
        return false;
    };
    sock.connect(SocketAddr::new(ip, 9)).is_ok()
        && sock.local_addr().is_ok_and(|a| canonical(a.ip()) == ip)
}

/// Why a backend is this fulcrum's own listener, if it is: the address it is reached
/// at (`resolved`, as SRV and A/AAAA discovery give it, else the URL's own IP or
/// `localhost`). A host name resolved at each connect is not looked up here: a request
/// that comes back through it is answered 508.
pub(crate) fn own_backend(
    listeners: &[SocketAddr],
    authority: &str,
    resolved: Option<SocketAddr>,
) -> Option<String> {
    let addr = resolved.or_else(|| literal(authority))?;
    reaches(listeners, addr).then(|| {
        format!("{authority} is this fulcrum's own listener {addr}: a backend that is fulcrum itself would send every request round again")
    })
}

/// [`own_backend`] for a service's `url` (an auth service, a key set), its port the
/// scheme's when it names none.
pub(crate) fn own_url(listeners: &[SocketAddr], url: &http::Uri) -> Option<String> {
    let a = url.authority()?;
    let https = url.scheme_str() == Some("https");
    let port = a.port_u16().unwrap_or(if https { 443 } else { 80 });
    own_backend(listeners, &format!("{}:{port}", a.host()), None)
}

/// The address of an authority that names one without a lookup: an IP and a port, or
/// `localhost` and a port.
fn literal(authority: &str) -> Option<SocketAddr> {
    if let Ok(a) = authority.parse() {
        return Some(a);
    }
    let (host, port) = authority.rsplit_once(':')?;
    let port = port.parse().ok()?;
    host.eq_ignore_ascii_case("localhost")
        .then(|| SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port))
}

/// [`own_url`] against the listeners this process has bound.
pub(crate) fn own_url_now(url: &http::Uri) -> Option<String> {
    let l = LISTENERS.read().unwrap_or_else(|e| e.into_inner());
    own_url(&l, url)
}

/// [`own_backend`] against the listeners this process has bound.
pub(crate) fn own_backend_now(authority: &str, resolved: Option<SocketAddr>) -> Option<String> {
    let l = LISTENERS.read().unwrap_or_else(|e| e.into_inner());
    own_backend(&l, authority, resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_naming_this_process_anywhere_is_a_loop() {
        let me = std::str::from_utf8(element(Version::HTTP_11))
            .unwrap()
            .to_string();
        let token = me.split(' ').nth(1).unwrap().to_string();
        assert!(me.starts_with("1.1 fulcrum-"));
        assert!(std::str::from_utf8(element(Version::HTTP_2))
            .unwrap()
            .starts_with("2 "));
        assert!(names_us(me.as_bytes()));
        assert!(names_us(
            format!("1.0 squid, 2 {token} (fulcrum)").as_bytes()
        ));
        assert!(names_us(format!("1.1 a,1.1  {token}").as_bytes()));
        assert!(!names_us(b"1.1 fulcrum-0000000g"));
        assert!(!names_us(format!("1.1 {token}x").as_bytes()));
        assert!(!names_us(format!("{token} 1.1").as_bytes()));
        assert!(!names_us(b""));
    }

    #[test]
    fn a_backend_on_a_listener_or_on_a_wildcards_port_is_ours() {
        let l: Vec<SocketAddr> = vec![
            "127.0.0.1:8080".parse().unwrap(),
            "0.0.0.0:8443".parse().unwrap(),
        ];
        let own =
            |a: &str, r: Option<&str>| own_backend(&l, a, r.map(|r| r.parse().unwrap())).is_some();
        assert!(own("127.0.0.1:8080", None));
        assert!(own("localhost:8080", None));
        assert!(own("[::ffff:127.0.0.1]:8080", None));
        assert!(
            own("127.0.0.2:8443", None),
            "any local address on the wildcard's port"
        );
        assert!(own("api.test:8443", Some("127.0.0.1:8443")));
        assert!(
            !own("127.0.0.2:8080", None),
            "another address on the plain listener's port"
        );
        assert!(!own("127.0.0.1:9090", None));
        assert!(
            !own("api.test:8080", None),
            "a name is checked once resolved"
        );
        assert!(!own("192.0.2.1:8443", None), "not this host's");
    }
}

//! The PROXY protocol (HAProxy's `proxy-protocol.txt`, versions 1 and 2;
//! `docs/tls.md`, "PROXY protocol"): read in front of a client connection with
//! `accept_proxy_protocol`, written in front of a backend connection with a pool's
//! `send_proxy_protocol`. Written here: it is a few dozen bytes of framing, and the
//! crates that parse it buffer the connection's first bytes, where the listeners need
//! every byte after the header left in the socket for the fast path or the TLS
//! handshake.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// How long a peer that sent only the first bytes of a signature is waited for.
const AMBIGUOUS_FOR: Duration = Duration::from_millis(128);

/// Version 2's signature.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The longest version 1 header, CRLF included.
const V1_MAX: usize = 107;
/// The shortest header of either version (`PROXY UNKNOWN\r\n`; version 2 has 16 bytes
/// or more): reading this many first never reads past a header.
const MIN_HEADER: usize = 15;

/// Which version to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Version {
    /// The text form.
    V1,
    /// The binary form.
    V2,
}

/// Why a connection's header was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// Not a PROXY header, or a malformed one.
    Invalid(&'static str),
    /// It did not arrive whole in time.
    Timeout,
    /// The connection failed or closed first.
    Closed,
}

/// The two ends a header names: the client, and the address it reached.
pub(crate) type Ends = (SocketAddr, SocketAddr);

/// Reads the PROXY header at the start of `stream`, leaving every byte after it in the
/// socket. `Ok(Some(ends))`: the client the header names and the address it reached;
/// `Ok(None)`: a header that names none (`UNKNOWN`, `LOCAL`, a family other than TCP
/// over IPv4 or IPv6), so the connection's own ends stand.
pub(crate) async fn read_header(
    stream: &mut TcpStream,
    limit: Duration,
) -> Result<Option<Ends>, HeaderError> {
    match tokio::time::timeout(limit, read_any(stream)).await {
        Ok(r) => r,
        Err(_) => Err(HeaderError::Timeout),
    }
}

/// Whether `stream` starts with a PROXY header (either version's signature), seen
/// without taking anything from the socket: what a peer that may not send one is
/// checked for. `Err` when it closes, or sends nothing that tells within `limit`.
pub(crate) async fn starts_with_header(
    stream: &TcpStream,
    limit: Duration,
) -> Result<bool, HeaderError> {
    const V1_SIGNATURE: &[u8] = b"PROXY ";
    let look = async {
        let mut first = [0u8; V2_SIGNATURE.len()];
        let mut pause = Duration::from_millis(2);
        loop {
            let n = stream
                .peek(&mut first)
                .await
                .map_err(|_| HeaderError::Closed)?;
            let seen = &first[..n];
            if n == 0 {
                return Err(HeaderError::Closed);
            }
            let is = |sig: &[u8]| seen.starts_with(sig);
            let may_be = |sig: &[u8]| seen.len() < sig.len() && sig.starts_with(seen);
            if is(V1_SIGNATURE) || is(&V2_SIGNATURE) {
                return Ok(true);
            }
            // A few bytes that could start either (a `P` of `PUT`, a bare CRLF): the
            // socket stays readable with them, so wait a little for the rest, longer each
            // time. A peer still at a prefix after 0.25 s is taken as sending none (a
            // header that follows is then a malformed request).
            if (!may_be(V1_SIGNATURE) && !may_be(&V2_SIGNATURE)) || pause > AMBIGUOUS_FOR {
                return Ok(false);
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    };
    tokio::time::timeout(limit, look)
        .await
        .unwrap_or(Err(HeaderError::Timeout))
}

async fn read_any(stream: &mut TcpStream) -> Result<Option<Ends>, HeaderError> {
    let mut head = [0u8; MIN_HEADER];
    stream
        .read_exact(&mut head)
        .await
        .map_err(|_| HeaderError::Closed)?;
    if head[..12] == V2_SIGNATURE {
        read_v2(stream, &head).await
    } else if head.starts_with(b"PROXY ") {
        read_v1(stream, &head).await
    } else {
        Err(HeaderError::Invalid("no PROXY header"))
    }
}

/// The rest of a version 1 header after its first bytes `start`: up to CRLF, at most
/// [`V1_MAX`] bytes in all. What follows is only peeked at, so nothing past the CRLF is
/// taken from the socket.
async fn read_v1(stream: &mut TcpStream, start: &[u8]) -> Result<Option<Ends>, HeaderError> {
    let mut line = start.to_vec();
    let crlf = |b: &[u8]| b.windows(2).position(|w| w == b"\r\n");
    if crlf(&line).is_some_and(|at| at + 2 != line.len()) {
        return Err(HeaderError::Invalid("a version 1 header cut short"));
    }
    let mut peeked = [0u8; V1_MAX];
    while !line.ends_with(b"\r\n") {
        if line.len() >= V1_MAX {
            return Err(HeaderError::Invalid("a version 1 header without its CRLF"));
        }
        let want = V1_MAX - line.len();
        let n = stream
            .peek(&mut peeked[..want])
            .await
            .map_err(|_| HeaderError::Closed)?;
        if n == 0 {
            return Err(HeaderError::Closed);
        }
        // Up to the CRLF if it is there (its '\r' may be the last byte read already),
        // else one byte, so that a header sent in pieces still makes progress. `line`
        // holds no CRLF, so one found from its last byte on ends after it.
        let from = line.len() - 1;
        let joined: Vec<u8> = line[from..].iter().chain(&peeked[..n]).copied().collect();
        let take = match crlf(&joined) {
            Some(at) => from + at + 2 - line.len(),
            None => 1,
        };
        let mut part = vec![0u8; take];
        stream
            .read_exact(&mut part)
            .await
            .map_err(|_| HeaderError::Closed)?;
        line.extend(part);
    }
    parse_v1(&line)
}

/// Parses a whole version 1 line (`PROXY TCP4 SRC DST SPORT DPORT\r\n`).
pub(crate) fn parse_v1(line: &[u8]) -> Result<Option<Ends>, HeaderError> {
    let bad = HeaderError::Invalid("a malformed version 1 header");
    let text = std::str::from_utf8(line).map_err(|_| HeaderError::Invalid("not text"))?;
    let text = text
        .strip_suffix("\r\n")
        .ok_or(HeaderError::Invalid("no CRLF"))?;
    let mut words = text.split(' ');
    if words.next() != Some("PROXY") {
        return Err(bad);
    }
    let family = words.next().ok_or(HeaderError::Invalid("no family"))?;
    if family == "UNKNOWN" {
        return Ok(None);
    }
    let parts: Vec<&str> = words.collect();
    let [src, dst, sport, dport] = parts[..] else {
        return Err(bad);
    };
    let src: IpAddr = src
        .parse()
        .map_err(|_| HeaderError::Invalid("a bad source address"))?;
    let dst: IpAddr = dst
        .parse()
        .map_err(|_| HeaderError::Invalid("a bad destination address"))?;
    let port = |p: &str| {
        // Decimal without leading zeros, as the specification writes them.
        (!p.is_empty() && (p == "0" || !p.starts_with('0')))
            .then(|| p.parse::<u16>().ok())
            .flatten()
            .ok_or(HeaderError::Invalid("a bad port"))
    };
    let (sport, dport) = (port(sport)?, port(dport)?);
    match (family, src, dst) {
        ("TCP4", IpAddr::V4(_), IpAddr::V4(_)) | ("TCP6", IpAddr::V6(_), IpAddr::V6(_)) => Ok(
            Some((SocketAddr::new(src, sport), SocketAddr::new(dst, dport))),
        ),
        _ => Err(HeaderError::Invalid("an address of the wrong family")),
    }
}

/// The rest of a version 2 header after its first bytes `start` (15 of its 16 fixed
/// ones): the last fixed byte, then the length it gives, exactly.
async fn read_v2(stream: &mut TcpStream, start: &[u8]) -> Result<Option<Ends>, HeaderError> {
    let mut fixed = [0u8; 16];
    fixed[..MIN_HEADER].copy_from_slice(start);
    stream
        .read_exact(&mut fixed[MIN_HEADER..])
        .await
        .map_err(|_| HeaderError::Closed)?;
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    let mut rest = vec![0u8; len];
    stream
        .read_exact(&mut rest)
        .await
        .map_err(|_| HeaderError::Closed)?;
    parse_v2(&fixed, &rest)
}

/// Parses a version 2 header: its 16 fixed bytes and the `len` bytes after them.
pub(crate) fn parse_v2(fixed: &[u8; 16], rest: &[u8]) -> Result<Option<Ends>, HeaderError> {
    if fixed[12] >> 4 != 2 {
        return Err(HeaderError::Invalid("not version 2"));
    }
    match fixed[12] & 0x0f {
        0 => return Ok(None), // LOCAL: the proxy's own connection (a health check)
        1 => {}
        _ => return Err(HeaderError::Invalid("an unknown command")),
    }
    let need = match fixed[13] {
        0x11 => 12, // TCP over IPv4
        0x21 => 36, // TCP over IPv6
        _ => return Ok(None),
    };
    if rest.len() < need {
        return Err(HeaderError::Invalid("a length too short for its addresses"));
    }
    let port = |at: usize| u16::from_be_bytes([rest[at], rest[at + 1]]);
    let ends = if need == 12 {
        let ip =
            |at: usize| IpAddr::from(<[u8; 4]>::try_from(&rest[at..at + 4]).unwrap_or_default());
        (
            SocketAddr::new(ip(0), port(8)),
            SocketAddr::new(ip(4), port(10)),
        )
    } else {
        let ip =
            |at: usize| IpAddr::from(<[u8; 16]>::try_from(&rest[at..at + 16]).unwrap_or_default());
        (
            SocketAddr::new(ip(0), port(32)),
            SocketAddr::new(ip(16), port(34)),
        )
    };
    Ok(Some(ends))
}

/// The header naming a connection from `src` to `dst`, in `version`.
pub(crate) fn header(version: Version, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    // Both ends in one family: an IPv4 end beside an IPv6 one is written mapped.
    let (src, dst) = match (src, dst) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) | (SocketAddr::V6(_), SocketAddr::V6(_)) => {
            (src, dst)
        }
        _ => (to_v6(src), to_v6(dst)),
    };
    match version {
        Version::V1 => {
            let family = if src.is_ipv4() { "TCP4" } else { "TCP6" };
            format!(
                "PROXY {family} {} {} {} {}\r\n",
                src.ip(),
                dst.ip(),
                src.port(),
                dst.port()
            )
            .into_bytes()
        }
        Version::V2 => {
            let mut out = V2_SIGNATURE.to_vec();
            out.push(0x21); // version 2, PROXY
            match (src, dst) {
                (SocketAddr::V4(s), SocketAddr::V4(d)) => {
                    out.extend([0x11, 0, 12]);
                    out.extend(s.ip().octets());
                    out.extend(d.ip().octets());
                }
                (s, d) => {
                    out.extend([0x21, 0, 36]);
                    out.extend(to_v6_ip(s.ip()).octets());
                    out.extend(to_v6_ip(d.ip()).octets());
                }
            }
            out.extend(src.port().to_be_bytes());
            out.extend(dst.port().to_be_bytes());
            out
        }
    }
}

/// The header of a connection fulcrum makes for itself (a health probe): version 1's
/// `UNKNOWN`, version 2's `LOCAL`; the backend then keeps the connection's own peer.
pub(crate) fn local_header(version: Version) -> Vec<u8> {
    match version {
        Version::V1 => b"PROXY UNKNOWN\r\n".to_vec(),
        Version::V2 => {
            let mut out = V2_SIGNATURE.to_vec();
            out.extend([0x20, 0x00, 0, 0]);
            out
        }
    }
}

fn to_v6(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(to_v6_ip(a.ip())), a.port())
}

fn to_v6_ip(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_1_lines() {
        let ok = parse_v1(b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 80\r\n").unwrap();
        let ends = |a: &str, b: &str| Some((a.parse().unwrap(), b.parse().unwrap()));
        assert_eq!(ok, ends("203.0.113.7:5555", "10.0.0.1:80"));
        let v6 = parse_v1(b"PROXY TCP6 2001:db8::1 2001:db8::2 1 2\r\n").unwrap();
        assert_eq!(v6, ends("[2001:db8::1]:1", "[2001:db8::2]:2"));
        assert_eq!(parse_v1(b"PROXY UNKNOWN\r\n"), Ok(None));
        for bad in [
            &b"PROXY TCP4 203.0.113.7 10.0.0.1 5555\r\n"[..],
            b"PROXY TCP4 2001:db8::1 10.0.0.1 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 70000 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2",
        ] {
            assert!(parse_v1(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn what_is_written_is_read_back() {
        let (s4, d4): (SocketAddr, SocketAddr) = (
            "198.51.100.9:40000".parse().unwrap(),
            "10.1.2.3:443".parse().unwrap(),
        );
        let v1 = header(Version::V1, s4, d4);
        assert_eq!(v1, b"PROXY TCP4 198.51.100.9 10.1.2.3 40000 443\r\n");
        assert_eq!(parse_v1(&v1), Ok(Some((s4, d4))));
        let v2 = header(Version::V2, s4, d4);
        assert_eq!(v2.len(), 16 + 12);
        let fixed: [u8; 16] = v2[..16].try_into().unwrap();
        assert_eq!(parse_v2(&fixed, &v2[16..]), Ok(Some((s4, d4))));
        let s6: SocketAddr = "[2001:db8::7]:9".parse().unwrap();
        let v2 = header(Version::V2, s6, d4);
        let fixed: [u8; 16] = v2[..16].try_into().unwrap();
        assert_eq!((fixed[13], v2.len()), (0x21, 16 + 36));
        let mapped = SocketAddr::new(IpAddr::V6(to_v6_ip(d4.ip())), d4.port());
        assert_eq!(parse_v2(&fixed, &v2[16..]), Ok(Some((s6, mapped))));
    }

    /// What `read_header` makes of `pieces` sent one after the other, and the bytes it
    /// left in the socket.
    async fn read_sent(pieces: &[&[u8]]) -> (Result<Option<Ends>, HeaderError>, Vec<u8>) {
        use tokio::io::AsyncWriteExt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut server, _) = l.accept().await.unwrap();
        let owned: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
        let writer = tokio::spawn(async move {
            for p in owned {
                client.write_all(&p).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            client
        });
        let r = read_header(&mut server, Duration::from_secs(2)).await;
        drop(writer.await.unwrap());
        let mut rest = Vec::new();
        let _ = server.read_to_end(&mut rest).await;
        (r, rest)
    }

    #[tokio::test]
    async fn a_header_in_pieces_is_read_exactly_and_a_short_line_is_refused() {
        let line = b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 80\r\nGET";
        for cut in [15, 20, 39, 40] {
            let (r, rest) = read_sent(&[&line[..cut], &line[cut..]]).await;
            let (src, _) = r.unwrap().unwrap();
            assert_eq!(src.to_string(), "203.0.113.7:5555", "cut at {cut}");
            assert_eq!(rest, b"GET", "cut at {cut}");
        }
        let (r, _) = read_sent(&[b"PROXY X\r\nGET / HTTP/1.1\r\n"]).await;
        assert!(matches!(r, Err(HeaderError::Invalid(_))), "{r:?}");
        let (r, rest) = read_sent(&[b"PROXY UNKNOWN\r\nGET"]).await;
        assert_eq!((r, rest), (Ok(None), b"GET".to_vec()));
    }

    #[test]
    fn version_2_refuses_a_length_short_of_its_addresses() {
        let mut fixed = [0u8; 16];
        fixed[..12].copy_from_slice(&V2_SIGNATURE);
        fixed[12] = 0x21;
        fixed[13] = 0x11;
        assert!(parse_v2(&fixed, &[0; 4]).is_err());
        fixed[12] = 0x20;
        assert_eq!(parse_v2(&fixed, &[]), Ok(None), "LOCAL");
        fixed[12] = 0x31;
        assert!(parse_v2(&fixed, &[0; 12]).is_err());
    }
}

//! The server name of a TLS ClientHello, read without terminating TLS (`docs/tcp.md`,
//! "TLS passthrough"): the handshake records' fragments joined (a ClientHello may span
//! several records, and arrive in several segments), then the `server_name` extension
//! (RFC 6066 §3) found in it. rustls reads a ClientHello only while it handshakes; here
//! nothing is answered and every byte is passed on as it came, so the few fields needed
//! are read by hand.

/// The longest ClientHello read (with its record headers): past it the connection is
/// closed.
pub(crate) const MAX_HELLO: usize = 64 * 1024;

/// What the bytes of a connection's start say.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// The ClientHello is not whole yet: nothing new can be learnt before this many
    /// bytes (from the start) have come.
    More(usize),
    /// A whole ClientHello, and the name it asks for: lowercase, a valid host name;
    /// `None` without one (or with one that is not a name).
    Name(Option<String>),
    /// Not a TLS handshake's start, or a broken one: terminated as before (rustls
    /// answers it).
    NotTls,
    /// Longer than [`MAX_HELLO`].
    TooLong,
}

/// A TLS record's header: type, version, length.
const RECORD_HEADER: usize = 5;
/// The content type of handshake records.
const HANDSHAKE: u8 = 22;
/// The handshake type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// The longest record fragment TLS allows (2^14, plus what a compressed or protected
/// one may add; a ClientHello is neither).
const MAX_FRAGMENT: usize = 16384 + 2048;

/// Reads the server name from `bytes`, the start of a connection.
pub(crate) fn server_name(bytes: &[u8]) -> Hello {
    let mut handshake = Vec::new();
    let mut at = 0;
    loop {
        let Some(header) = bytes.get(at..at + RECORD_HEADER) else {
            return more_or_too_long(bytes, at + RECORD_HEADER);
        };
        if header[0] != HANDSHAKE || header[1] != 3 {
            return Hello::NotTls;
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_FRAGMENT {
            return Hello::NotTls;
        }
        let end = at + RECORD_HEADER + len;
        let Some(fragment) = bytes.get(at + RECORD_HEADER..end) else {
            return more_or_too_long(bytes, end);
        };
        handshake.extend_from_slice(fragment);
        at = end;
        match whole_hello(&handshake) {
            Some(Ok(body)) => return Hello::Name(name_in(body)),
            Some(Err(h)) => return h,
            None => {}
        }
    }
}

/// `More(need)` while the limit allows more.
fn more_or_too_long(bytes: &[u8], need: usize) -> Hello {
    if bytes.len() >= MAX_HELLO {
        Hello::TooLong
    } else {
        Hello::More(need.min(MAX_HELLO))
    }
}

/// The ClientHello's body once the joined fragments hold it whole; `None` before.
fn whole_hello(handshake: &[u8]) -> Option<Result<&[u8], Hello>> {
    let header = handshake.get(..4)?;
    if header[0] != CLIENT_HELLO {
        return Some(Err(Hello::NotTls));
    }
    let len = usize::from(header[1]) << 16 | usize::from(header[2]) << 8 | usize::from(header[3]);
    if len + 4 > MAX_HELLO {
        return Some(Err(Hello::TooLong));
    }
    handshake.get(4..4 + len).map(Ok)
}

/// A cursor over a ClientHello's fields.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A field led by its length in `width` bytes.
    fn vector(&mut self, width: usize) -> Option<&'a [u8]> {
        let n = if width == 1 { self.u8()? } else { self.u16()? };
        self.take(n)
    }
}

/// The host name the ClientHello `body` asks for, if a valid one.
fn name_in(body: &[u8]) -> Option<String> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    r.vector(1)?; // legacy_session_id
    r.vector(2)?; // cipher_suites
    r.vector(1)?; // legacy_compression_methods
    let mut extensions = Reader(r.vector(2)?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vector(2)?;
        if kind == 0 {
            return host_name(data);
        }
    }
    None
}

/// The `host_name` entry of a `server_name` extension's list, if a valid name.
fn host_name(data: &[u8]) -> Option<String> {
    let mut list = Reader(Reader(data).vector(2)?);
    while !list.0.is_empty() {
        let kind = list.u8()?;
        let name = list.vector(2)?;
        if kind == 0 {
            let name = std::str::from_utf8(name).ok()?.to_ascii_lowercase();
            let name = name.strip_suffix('.').unwrap_or(&name).to_string();
            return valid_name(&name).then_some(name);
        }
    }
    None
}

/// A host name: dot-separated labels of letters, digits, `-` and `_`, each 1 to 63
/// long, 253 at most in all.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        })
}

/// The `client_hello` fuzz target's checks (`src/fuzzing.rs`).
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz(data: &[u8]) {
    check_name(&server_name(data));
    // `data` as a handshake message, in one record and in records of 7 bytes.
    if data.is_empty() || data.len() > MAX_FRAGMENT {
        return;
    }
    let framed = |size: usize| {
        let mut out = Vec::new();
        for chunk in data.chunks(size) {
            out.extend([HANDSHAKE, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    };
    let (whole, cut) = (server_name(&framed(MAX_FRAGMENT)), server_name(&framed(7)));
    check_name(&whole);
    match (&whole, &cut) {
        (_, Hello::TooLong) | (Hello::More(_), Hello::More(_)) => {}
        _ => assert_eq!(whole, cut, "the records a hello comes in change nothing"),
    }
}

#[cfg(any(fuzzing, test))]
fn check_name(h: &Hello) {
    if let Hello::Name(Some(n)) = h {
        assert!(
            valid_name(n) && !n.bytes().any(|c| c.is_ascii_uppercase()),
            "{n:?}"
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ClientHello's handshake message naming `name` (raw bytes, any), with a few
    /// other extensions around it.
    pub(crate) fn hello_message(name: Option<&[u8]>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        let mut ext = Vec::new();
        ext.extend([0, 10, 0, 4, 0, 2, 0, 29]); // supported_groups
        if let Some(name) = name {
            let n = name.len() as u16;
            ext.extend([0, 0]);
            ext.extend((n + 5).to_be_bytes());
            ext.extend((n + 3).to_be_bytes());
            ext.push(0);
            ext.extend(n.to_be_bytes());
            ext.extend(name);
        }
        ext.extend([0, 43, 0, 3, 2, 3, 4]); // supported_versions
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut msg = vec![1];
        msg.extend(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend(body);
        msg
    }

    /// `msg` in records of at most `size` bytes each.
    pub(crate) fn records(msg: &[u8], size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in msg.chunks(size) {
            out.extend([22, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    }

    #[test]
    fn the_name_of_a_hello_in_one_record() {
        let bytes = records(&hello_message(Some(b"DB.Example.com")), 16384);
        assert_eq!(
            server_name(&bytes),
            Hello::Name(Some("db.example.com".into()))
        );
    }

    #[test]
    fn a_hello_over_several_records_and_segments() {
        let bytes = records(&hello_message(Some(b"db.example.com")), 20);
        for cut in [0, 3, 5, 24, bytes.len() - 1] {
            let Hello::More(need) = server_name(&bytes[..cut]) else {
                panic!("cut at {cut}");
            };
            assert!(need > cut && need <= bytes.len(), "cut at {cut}: {need}");
        }
        // What a peek needs next: a record's header, then its fragment.
        assert_eq!(server_name(&bytes[..3]), Hello::More(5));
        assert_eq!(server_name(&bytes[..5]), Hello::More(25));
        assert_eq!(
            server_name(&bytes),
            Hello::Name(Some("db.example.com".into()))
        );
    }

    #[test]
    fn no_name_a_bad_name_and_no_tls() {
        let bytes = records(&hello_message(None), 16384);
        assert_eq!(server_name(&bytes), Hello::Name(None));
        for bad in [&b"a..b"[..], b"a b.com", b"\xff.com", b""] {
            let bytes = records(&hello_message(Some(bad)), 16384);
            assert_eq!(server_name(&bytes), Hello::Name(None), "{bad:?}");
        }
        assert_eq!(server_name(b"GET / HTTP/1.1\r\n\r\n"), Hello::NotTls);
        assert_eq!(server_name(&[22, 3, 1, 0, 0]), Hello::NotTls);
        // A handshake message that is not a ClientHello.
        assert_eq!(server_name(&records(&[2, 0, 0, 0], 100)), Hello::NotTls);
    }

    #[test]
    fn a_hello_past_the_limit() {
        let claims = |n: u32| {
            let mut msg = vec![1];
            msg.extend(&n.to_be_bytes()[1..]);
            msg
        };
        assert_eq!(server_name(&records(&claims(70_000), 100)), Hello::TooLong);
        // One that may fit waits for more, until the bytes read reach the limit.
        let mut msg = claims(60_000);
        msg.extend(vec![0; 30_000]);
        assert!(matches!(server_name(&records(&msg, 16384)), Hello::More(_)));
        let mut msg = claims(65_500);
        msg.extend(vec![0; 66_000]);
        let bytes = records(&msg, 16384);
        assert_eq!(server_name(&bytes[..MAX_HELLO]), Hello::TooLong);
    }

    #[test]
    fn truncated_fields_name_nothing() {
        let msg = hello_message(Some(b"db.example.com"));
        for cut in 4..msg.len() {
            let mut m = msg[..cut].to_vec();
            let len = (cut - 4) as u32;
            m[1..4].copy_from_slice(&len.to_be_bytes()[1..]);
            // Whatever it says, it says it without panicking.
            let _ = server_name(&records(&m, 16384));
        }
    }
}

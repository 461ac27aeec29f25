//! The hop-by-hop rules of HTTP/1.1 (RFC 9110 §7.6.1), in one place.
//!
//! Which fields belong to one connection only, and what a `Connection` field says, are
//! the rules request smuggling lives on: every reader of a head — the header-map path
//! and the span path of [`super::headers`], the upstream response parser
//! ([`super::wire`]) and the client-side fast path's close/upgrade check
//! ([`crate::front`]) — asks this module, so they cannot drift apart. Property tests tie
//! all four together (in `headers.rs`, `wire.rs` and `front.rs`, over the generator of
//! [`props`]). Values are read as bytes, never as text: a token next to
//! bytes outside ASCII still means what it says.

/// Fields that are hop-by-hop by themselves, in lower case. The fields a `Connection`
/// field names are hop-by-hop too. `Upgrade` is kept only on an upgrade.
pub(crate) const FIXED: [&[u8]; 8] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"proxy-authorization",
    b"upgrade",
];

/// Fields a `Connection` field cannot make hop-by-hop (`docs/architecture.md`,
/// "Headers"). `Transfer-Encoding` is hop-by-hop by itself all the same.
const NEVER_NAMED: [&[u8]; 3] = [b"host", b"content-length", b"transfer-encoding"];

/// Whether a field `name` (in any case) is hop-by-hop by itself.
#[inline]
pub(crate) fn is_hop_by_hop(name: &[u8]) -> bool {
    // Every fixed name is 2..=19 bytes long: most names are ruled out by their length.
    (2..=19).contains(&name.len()) && FIXED.iter().any(|f| f.eq_ignore_ascii_case(name))
}

/// Whether `name` (in any case) is `Connection`.
#[inline]
pub(crate) fn is_connection(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"connection")
}

/// One token of a `Connection` field's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Token<'a> {
    /// `close`: the sender closes the connection after this message.
    Close,
    /// `keep-alive`: HTTP/1.0's way to keep the connection (it names `Keep-Alive`,
    /// which is hop-by-hop anyway).
    KeepAlive,
    /// Any other token names a field that is hop-by-hop for this message; `upgrade`
    /// ([`Token::is_upgrade`]) also asks for a protocol switch.
    Names(&'a [u8]),
}

impl Token<'_> {
    /// Whether the token is `upgrade`.
    #[inline]
    pub(crate) fn is_upgrade(&self) -> bool {
        matches!(self, Token::Names(n) if n.eq_ignore_ascii_case(b"upgrade"))
    }
}

/// The tokens of one `Connection` value, empty list elements left out.
#[inline]
pub(crate) fn tokens(value: &[u8]) -> impl Iterator<Item = Token<'_>> {
    value
        .split(|&c| c == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
        .map(|t| {
            if t.eq_ignore_ascii_case(b"close") {
                Token::Close
            } else if t.eq_ignore_ascii_case(b"keep-alive") {
                Token::KeepAlive
            } else {
                Token::Names(t)
            }
        })
}

/// The field names the `Connection` values of a head name, as slices of it.
#[derive(Debug, Default)]
pub(crate) struct Named<'a>(Vec<&'a [u8]>);

impl<'a> Named<'a> {
    /// Adds the names one `Connection` value names. A nomination of a field that says
    /// where the message goes or how it is framed ([`NEVER_NAMED`]) is ignored, as
    /// HAProxy does: dropping `Host` would send the backend its own address instead of
    /// the client's name, dropping a length would change the framing.
    pub(crate) fn add(&mut self, connection_value: &'a [u8]) {
        for t in tokens(connection_value) {
            match t {
                Token::Names(n) if !NEVER_NAMED.iter().any(|f| f.eq_ignore_ascii_case(n)) => {
                    self.0.push(n);
                }
                _ => {}
            }
        }
    }

    /// Whether there are none (the usual case: `keep-alive` or `close` only).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `name` (in any case) is one of them.
    pub(crate) fn contains(&self, name: &[u8]) -> bool {
        self.0.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
}

/// Whether a field is dropped on this hop: hop-by-hop by itself, or named by
/// `Connection` (`named`). With `upgrade`, `Upgrade` stays.
#[inline]
pub(crate) fn is_dropped(name: &[u8], named: &Named<'_>, upgrade: bool) -> bool {
    if upgrade && name.eq_ignore_ascii_case(b"upgrade") {
        return false;
    }
    is_hop_by_hop(name) || (!named.is_empty() && named.contains(name))
}

/// What the property tests of every reader of a head share: a generator of header
/// lines full of hop-by-hop traps, and what the header-map path makes of them.
#[cfg(test)]
pub(crate) mod props {
    use http::header::{HeaderMap, HeaderName, HeaderValue};
    use proptest::prelude::*;

    /// Up to 10 `name: value` lines drawn from names and values that exercise the
    /// hop-by-hop rules (`Connection` naming fields, tokens in odd case, bytes outside
    /// ASCII). No line frames a body: each reader treats those on its own.
    pub(crate) fn lines() -> impl Strategy<Value = Vec<(String, String)>> {
        proptest::collection::vec(
            (
                proptest::sample::select(vec![
                    "Host",
                    "x-forwarded-for",
                    "Connection",
                    "connection",
                    "Keep-Alive",
                    "TE",
                    "Trailer",
                    "Proxy-Connection",
                    "x-secret",
                    "X-Other",
                    "Date",
                    "cookie",
                    "Proxy-Authorization",
                    "accept",
                    "X-Forwarded-Proto",
                    "x-forwarded-host",
                    "X-Request-Id",
                ]),
                proptest::sample::select(vec![
                    "a",
                    "close",
                    "Close",
                    "keep-alive",
                    "keep-alive, x-secret",
                    "X-Other",
                    "upgrade",
                    "x-secret, caf\u{e9}",
                    " , close ,",
                    "",
                    "keep-alive, host",
                    "te, date",
                    "x-forwarded-for, x-forwarded-proto",
                    "1.1.1.1",
                    "\u{e9}, close",
                ]),
            ),
            0..10,
        )
        .prop_map(|v| {
            v.into_iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        })
    }

    /// The lines as a header map, in order, each value without the whitespace around
    /// it (which is not part of a field value, RFC 9110 §5.5, and no parser keeps).
    pub(crate) fn map_of(lines: &[(String, String)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in lines {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(n.as_bytes()),
                HeaderValue::from_bytes(v.trim().as_bytes()),
            ) {
                map.append(n, v);
            }
        }
        map
    }

    /// The `name: value` pairs the header-map path forwards (names in lower case),
    /// sorted.
    pub(crate) fn kept_by_map(lines: &[(String, String)]) -> Vec<(String, String)> {
        let mut map = map_of(lines);
        super::super::headers::strip_hop_by_hop(&mut map, false);
        sorted(
            map.iter()
                .map(|(k, v)| (k.as_str().as_bytes(), v.as_bytes())),
        )
    }

    /// `(name, value)` pairs as lower-case names and text, sorted.
    pub(crate) fn sorted<'a>(
        fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = fields
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).to_ascii_lowercase(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Whether the lines ask to close the connection, read the way RFC 9110 §7.6.1
    /// words it (a `close` connection option in any `Connection` field), written
    /// independently of [`super::tokens`].
    pub(crate) fn says_close(lines: &[(String, String)]) -> bool {
        lines.iter().any(|(n, v)| {
            n.eq_ignore_ascii_case("connection")
                && v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_read_as_bytes_in_any_case() {
        let t: Vec<Token> = tokens(b" Keep-Alive ,, CLOSE, x-a,upgrade , caf\xc3\xa9").collect();
        assert_eq!(
            t,
            vec![
                Token::KeepAlive,
                Token::Close,
                Token::Names(b"x-a"),
                Token::Names(b"upgrade"),
                Token::Names(b"caf\xc3\xa9"),
            ]
        );
        assert!(t[3].is_upgrade() && !t[2].is_upgrade());
    }

    #[test]
    fn the_fixed_list_and_the_named_fields_are_dropped() {
        let mut named = Named::default();
        named.add(b"keep-alive, X-Secret");
        for n in [&b"TE"[..], b"Connection", b"transfer-encoding", b"x-secret"] {
            assert!(is_dropped(n, &named, false), "{n:?}");
        }
        assert!(!is_dropped(b"x-kept", &named, false));
        // Where the message goes and how long it is stay, whatever Connection names.
        let mut framing = Named::default();
        framing.add(b"close, Host, content-length, Transfer-Encoding");
        assert!(framing.is_empty());
        assert!(!is_dropped(b"host", &framing, false));
        assert!(!is_dropped(b"Content-Length", &framing, false));
        assert!(is_dropped(b"upgrade", &named, false));
        assert!(!is_dropped(b"Upgrade", &named, true));
    }
}

//! The header rules of a proxy hop (`docs/architecture.md`, "Headers"); the
//! hop-by-hop rules themselves are in [`super::hop`].

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::hop;

use crate::backend::observe;
use crate::trust::canonical;
pub(crate) use crate::trust::X_FORWARDED_FOR;
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

/// Readies a backend's answer given as a header map for the client: its hop-by-hop
/// fields removed, and each field fulcrum keeps for itself (`backend::observe`) taken
/// out and returned in its slot. One pass over the names finds whether any is there.
pub(crate) fn strip_answer(headers: &mut HeaderMap) -> [Option<HeaderValue>; observe::COUNT] {
    let (mut hop, mut observed, mut alt_svc) = (false, false, false);
    for k in headers.keys() {
        hop |= hop::is_hop_by_hop(k.as_str().as_bytes());
        observed |= observe::which(k.as_str().as_bytes()).is_some();
        alt_svc |= k == header::ALT_SVC;
    }
    // A backend's `Alt-Svc` names its own services, never fulcrum's: it goes no further
    // on any front end (`docs/tls.md`, "HTTP/3").
    if alt_svc {
        headers.remove(header::ALT_SVC);
    }
    let mut values = [const { None }; observe::COUNT];
    if observed {
        for (slot, o) in values.iter_mut().zip(observe::OBSERVED) {
            *slot = headers.remove(o.field);
        }
    }
    if hop {
        strip_hop_by_hop(headers, false);
    }
    values
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

/// This hop, as a request's forwarding fields speak of it.
#[derive(Clone, Copy)]
pub(crate) struct Hop<'a> {
    /// The peer as `X-Forwarded-For` appends it ([`forwarded_value`]).
    pub(crate) peer: &'a HeaderValue,
    /// The peer is a trusted proxy: its `X-Forwarded-Proto` and `X-Forwarded-Host`
    /// stand.
    pub(crate) peer_trusted: bool,
    /// The authority the request is for: `X-Forwarded-Host` unless a trusted peer set
    /// one (none when it has none).
    pub(crate) host: Option<&'a HeaderValue>,
    /// It came over TLS: `X-Forwarded-Proto: https`.
    pub(crate) https: bool,
    /// Its `X-Request-Id`, in place of any the client sent.
    pub(crate) request_id: &'a [u8],
    /// This hop's `Via` element (`crate::loops::element`), after the client's.
    pub(crate) via: &'a [u8],
    /// The verified client certificate's `X-Forwarded-Client-Cert`, in place of any the
    /// client sent (`docs/tls.md`, "Mutual TLS").
    pub(crate) client_cert: Option<&'a HeaderValue>,
    /// A traced request's `traceparent` for this try, in place of the caller's
    /// (`docs/tracing.md`).
    pub(crate) traceparent: Option<&'a [u8]>,
}

/// `X-Forwarded-Client-Cert` (Envoy's name and form): the verified client
/// certificate's identity; a client's own is always removed.
pub(crate) const X_FORWARDED_CLIENT_CERT: HeaderName =
    HeaderName::from_static("x-forwarded-client-cert");

/// `X-Fulcrum-Mirror: 1` marks a mirror's copy of a request (`docs/traffic.md`,
/// "Mirrors"); a client's own is always removed.
pub(crate) const X_FULCRUM_MIRROR: HeaderName = HeaderName::from_static("x-fulcrum-mirror");

/// What this hop does to a request's fields (`docs/architecture.md`, "Headers"),
/// decided once from the fields as they came, whatever form they are in, and carried out
/// either on a header map ([`Forwarding::apply`]) or while the fields are written out
/// ([`Forwarding::write`]), so that no rule exists twice:
///
/// - hop-by-hop fields go, and those `Connection` names ([`hop`]); an upgrade keeps
///   `Connection: upgrade` and `Upgrade`;
/// - `X-Forwarded-For` becomes one line: every entry received, then the peer;
/// - `Via` becomes one line: every element received, then this hop's;
/// - `X-Forwarded-Proto` and `X-Forwarded-Host` are this hop's unless a trusted peer
///   set them;
/// - `X-Request-Id` is the request's.
pub(crate) struct Forwarding<'a, 'f> {
    sets: Sets<'a>,
    /// What `Connection` names.
    named: hop::Named<'f>,
    upgrade: bool,
    /// The name lengths of the fields this hop may leave out (bit `n`: length `n`):
    /// [`DROPPED_LENGTHS`], and `traceparent`'s when a try replaces it.
    lengths: u32,
}

/// The lengths of the names of every field a [`Forwarding`] may leave out by itself:
/// the hop-by-hop ones (`te`; `trailer`, `upgrade`; `connection`, `keep-alive`;
/// `proxy-connection`; `transfer-encoding`; `proxy-authorization`) and those this hop
/// sets (`via`, `x-request-id`, `x-forwarded-for`, `x-forwarded-host`,
/// `x-forwarded-proto`, `x-forwarded-client-cert`) or never lets through
/// (`x-fulcrum-mirror`). A test holds it to the names.
const DROPPED_LENGTHS: [usize; 10] = [2, 3, 7, 10, 12, 15, 16, 17, 19, 23];

/// The length of `traceparent`, which a traced request's try replaces.
const TRACEPARENT_LENGTH: usize = 11;

/// [`DROPPED_LENGTHS`] as bits (every length is under 32).
const DROPPED_MASK: u32 = {
    let mut mask = 0;
    let mut i = 0;
    while i < DROPPED_LENGTHS.len() {
        mask |= 1 << DROPPED_LENGTHS[i];
        i += 1;
    }
    mask
};

/// The fields this hop sets.
#[derive(Clone, Copy)]
struct Sets<'a> {
    hop: Hop<'a>,
    /// The trusted peer's `X-Forwarded-Proto` stays.
    proto_kept: bool,
    /// The trusted peer's `X-Forwarded-Host` stays.
    host_kept: bool,
}

/// A request's header fields, in whatever form: each name as spelled, and its value, in
/// order, as often as asked.
pub(crate) trait FieldList<'f>: Copy {
    /// The fields, in order.
    fn fields(self) -> impl Iterator<Item = (&'f [u8], &'f [u8])>;
}

impl<'f> FieldList<'f> for &'f HeaderMap {
    fn fields(self) -> impl Iterator<Item = (&'f [u8], &'f [u8])> {
        self.iter()
            .map(|(k, v)| (k.as_str().as_bytes(), v.as_bytes()))
    }
}

impl<'f> FieldList<'f> for &'f ClientFields {
    fn fields(self) -> impl Iterator<Item = (&'f [u8], &'f [u8])> {
        self.iter()
    }
}

/// Whether `name` is `known`, in any case.
#[inline]
fn is(name: &[u8], known: &HeaderName) -> bool {
    name.eq_ignore_ascii_case(known.as_str().as_bytes())
}

impl<'a, 'f> Forwarding<'a, 'f> {
    /// Decides from `fields` (each name as spelled, and its value) as they came;
    /// `upgrade` when the request switches protocols.
    pub(crate) fn decide(
        fields: impl FieldList<'f>,
        hop: Hop<'a>,
        upgrade: bool,
    ) -> Forwarding<'a, 'f> {
        let mut named = hop::Named::default();
        for (name, value) in fields.fields() {
            if hop::is_connection(name) {
                named.add(value);
            }
        }
        let mut f = Forwarding {
            sets: Sets {
                hop,
                proto_kept: false,
                host_kept: false,
            },
            named,
            upgrade,
            lengths: match hop.traceparent {
                Some(_) => DROPPED_MASK | 1 << TRACEPARENT_LENGTH,
                None => DROPPED_MASK,
            },
        };
        if hop.peer_trusted {
            for (name, _) in fields.fields() {
                if !f.is_hop_by_hop(name) {
                    f.sets.proto_kept |= is(name, &X_FORWARDED_PROTO);
                    f.sets.host_kept |= is(name, &X_FORWARDED_HOST);
                }
            }
        }
        f
    }

    fn is_hop_by_hop(&self, name: &[u8]) -> bool {
        hop::is_dropped(name, &self.named, self.upgrade)
    }

    /// Whether the field `name` goes on as it came.
    #[inline]
    pub(crate) fn keeps(&self, name: &[u8]) -> bool {
        // Most fields are kept, and most are known to be by their length alone: no
        // field this hop drops or sets has it (unless `Connection` names it).
        let len = name.len();
        if self.named.is_empty() && (len >= 32 || self.lengths & (1 << len) == 0) {
            return true;
        }
        let traced = self.sets.hop.traceparent.is_some();
        !(self.is_hop_by_hop(name)
            || (traced && is(name, &super::request_id::TRACEPARENT))
            || super::request_id::is_request_id(name)
            || is(name, &X_FORWARDED_FOR)
            || is(name, &header::VIA)
            || is(name, &X_FORWARDED_CLIENT_CERT)
            || is(name, &X_FULCRUM_MIRROR)
            || (is(name, &X_FORWARDED_PROTO) && !self.sets.proto_kept)
            || (is(name, &X_FORWARDED_HOST) && !self.sets.host_kept))
    }

    /// Writes `fields` as this hop forwards them, one `name: value` line each (names in
    /// lower case, as a header map writes them), then the fields it sets.
    pub(crate) fn write(&self, fields: impl FieldList<'f>, out: &mut Vec<u8>) {
        for (name, value) in fields.fields().filter(|(n, _)| self.keeps(n)) {
            put_field_lowercase(out, name, value);
        }
        let sets = self.sets;
        sets.each(|name, v| {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            match v {
                Added::ForwardedFor => self.write_xff(fields, out),
                Added::Via => self.write_via(fields, out),
                Added::Value(v) => out.extend_from_slice(v.as_bytes()),
                Added::Raw(v) => out.extend_from_slice(v),
                Added::RequestId => out.extend_from_slice(sets.hop.request_id),
            }
            out.extend_from_slice(b"\r\n");
        });
    }
}

impl<'a> Forwarding<'a, '_> {
    /// Carries the rules out on `map`, the request's fields as they came.
    pub(crate) fn apply(map: &mut HeaderMap, hop: Hop<'a>, upgrade: bool) {
        let (sets, doomed, xff, via) = {
            let fields: &HeaderMap = map;
            let f = Forwarding::decide(fields, hop, upgrade);
            let doomed: Vec<HeaderName> = (map.keys())
                .filter(|k| !f.keeps(k.as_str().as_bytes()))
                .cloned()
                .collect();
            let mut xff = Vec::with_capacity(64);
            f.write_xff(fields, &mut xff);
            // Without a `Via` of the request's own, the field is this hop's element,
            // shared: no buffer made.
            let via = match fields.contains_key(header::VIA) {
                true => {
                    let mut v = Vec::with_capacity(64);
                    f.write_via(fields, &mut v);
                    HeaderValue::from_maybe_shared(bytes::Bytes::from(v)).ok()
                }
                false => (crate::loops::value_of(hop.via).cloned())
                    .or_else(|| HeaderValue::from_bytes(hop.via).ok()),
            };
            (f.sets, doomed, xff, via)
        };
        for name in doomed {
            map.remove(&name);
        }
        if upgrade {
            map.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        }
        let xff = HeaderValue::from_maybe_shared(bytes::Bytes::from(xff));
        sets.each(|name, v| {
            let value = match (v, &xff) {
                (Added::ForwardedFor, Ok(x)) => x.clone(),
                (Added::ForwardedFor, Err(_)) => hop.peer.clone(),
                // The client's elements passed the field grammar, and this hop's is a
                // token: always a value.
                // Never left out (a loop would go unseen): this hop's element alone if
                // the client's could not be joined to it.
                (Added::Via, _) => match &via {
                    Some(v) => v.clone(),
                    None => match HeaderValue::from_bytes(hop.via) {
                        Ok(v) => v,
                        Err(_) => return,
                    },
                },
                (Added::Value(v), _) => v.clone(),
                (Added::Raw(v), _) => match HeaderValue::from_bytes(v) {
                    Ok(v) => v,
                    Err(_) => return,
                },
                (Added::RequestId, _) => super::request_id::field_value(hop.request_id),
            };
            map.insert(name.clone(), value);
        });
    }
}

impl<'f> Forwarding<'_, 'f> {
    /// The value of `X-Forwarded-For` into `out`: every entry the request's lines hold,
    /// left to right across them (as the client-IP rule reads them), then the peer. Lines
    /// `Connection` names are hop-by-hop and count for nothing.
    fn write_xff(&self, fields: impl FieldList<'f>, out: &mut Vec<u8>) {
        let lines = fields
            .fields()
            .filter(|(n, _)| is(n, &X_FORWARDED_FOR) && !self.is_hop_by_hop(n))
            .map(|(_, v)| v);
        for e in crate::trust::entries(lines) {
            out.extend_from_slice(e);
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(self.sets.hop.peer.as_bytes());
    }

    /// The value of `Via` into `out`: the request's lines, left to right, then this
    /// hop's element (RFC 9110 §7.6.3). Lines `Connection` names count for nothing.
    fn write_via(&self, fields: impl FieldList<'f>, out: &mut Vec<u8>) {
        let lines = fields
            .fields()
            .filter(|(n, _)| is(n, &header::VIA) && !self.is_hop_by_hop(n))
            .map(|(_, v)| v.trim_ascii());
        for line in lines.filter(|l| !l.is_empty()) {
            out.extend_from_slice(line);
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(self.sets.hop.via);
    }
}

impl Sets<'_> {
    /// Each field this hop sets, after those that go on: `Via`, `X-Forwarded-For`,
    /// `X-Forwarded-Proto` and `X-Forwarded-Host` unless kept, `X-Request-Id`.
    fn each(self, mut put: impl FnMut(&HeaderName, Added<'_>)) {
        put(&header::VIA, Added::Via);
        put(&X_FORWARDED_FOR, Added::ForwardedFor);
        if !self.proto_kept {
            let proto = if self.hop.https { "https" } else { "http" };
            put(
                &X_FORWARDED_PROTO,
                Added::Value(&HeaderValue::from_static(proto)),
            );
        }
        if let (false, Some(h)) = (self.host_kept, self.hop.host) {
            put(&X_FORWARDED_HOST, Added::Value(h));
        }
        put(&super::request_id::X_REQUEST_ID, Added::RequestId);
        if let Some(cert) = self.hop.client_cert {
            put(&X_FORWARDED_CLIENT_CERT, Added::Value(cert));
        }
        if let Some(parent) = self.hop.traceparent {
            put(&super::request_id::TRACEPARENT, Added::Raw(parent));
        }
    }
}

/// A field [`Forwarding`] sets.
enum Added<'v> {
    /// `X-Forwarded-For`, made from the request's lines.
    ForwardedFor,
    /// `Via`, made from the request's lines.
    Via,
    /// This value.
    Value(&'v HeaderValue),
    /// This value, as bytes valid in a field (a `traceparent`: hex digits and dashes).
    Raw(&'v [u8]),
    /// The request's id.
    RequestId,
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

    /// The head's length on the wire, request line included.
    pub(crate) fn head_len(&self) -> usize {
        self.head.len()
    }

    /// `len` bytes of the head from `at` (inside the head: a span it was made with).
    pub(crate) fn bytes(&self, at: usize, len: usize) -> &[u8] {
        self.head.get(at..at + len).unwrap_or_default()
    }

    /// Name (as spelled in the head) and value of each field, in order.
    #[inline]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        self.spans.iter().map(|&(ns, nl, vs, vl)| {
            let (ns, nl, vs, vl) = (ns as usize, nl as usize, vs as usize, vl as usize);
            (&self.head[ns..ns + nl], &self.head[vs..vs + vl])
        })
    }

    /// The value of the first field named `name` (lower case), borrowed: the names
    /// compared only where their lengths agree.
    #[inline]
    pub(crate) fn value_bytes(&self, name: &[u8]) -> Option<&[u8]> {
        let &(_, _, vs, vl) = self.spans.iter().find(|s| self.is_named(s, name))?;
        self.head.get(vs as usize..(vs + vl) as usize)
    }

    /// [`Self::value_bytes`], and whether another field of that name follows.
    #[inline]
    pub(crate) fn sole_value_bytes(&self, name: &[u8]) -> Option<(&[u8], bool)> {
        let i = self.spans.iter().position(|s| self.is_named(s, name))?;
        let (_, _, vs, vl) = self.spans[i];
        let more = self.spans[i + 1..].iter().any(|s| self.is_named(s, name));
        Some((self.head.get(vs as usize..(vs + vl) as usize)?, more))
    }

    /// Whether the field at `span` is named `name` (lower case).
    #[inline(always)]
    fn is_named(&self, &(ns, nl, _, _): &(u32, u32, u32, u32), name: &[u8]) -> bool {
        // Most clients send names in lower case (HTTP/2 and 3 must): a plain comparison
        // first, the case-blind one only when that fails.
        nl as usize == name.len()
            && (self.head.get(ns as usize..(ns + nl) as usize))
                .is_some_and(|n| n == name || n.eq_ignore_ascii_case(name))
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
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        self.0.iter()
    }

    /// The first `Host` value (no copy).
    pub(crate) fn host(&self) -> Option<HeaderValue> {
        self.0.value(b"host")
    }

    /// The head's length on the wire, request line included.
    pub(crate) fn head_len(&self) -> usize {
        self.0.head_len()
    }

    /// The value of the first field named `name` (lower case; no copy).
    pub(crate) fn value(&self, name: &[u8]) -> Option<HeaderValue> {
        self.0.value(name)
    }

    /// The value of the first field named `name` (lower case), borrowed.
    #[inline]
    pub(crate) fn value_bytes(&self, name: &[u8]) -> Option<&[u8]> {
        self.0.value_bytes(name)
    }

    /// The value of the first field named `name` (lower case), borrowed, and whether
    /// another field of that name follows.
    #[inline]
    pub(crate) fn sole_value_bytes(&self, name: &[u8]) -> Option<(&[u8], bool)> {
        self.0.sole_value_bytes(name)
    }

    /// What the fields count toward the request head limit (as a header map's would).
    pub(crate) fn size(&self) -> usize {
        self.iter().map(|(n, v)| n.len() + v.len() + 4).sum()
    }

    /// The fields as a header map, as they came (with room for `X-Forwarded-*`).
    pub(crate) fn to_map(&self) -> HeaderMap {
        self.0.to_map(3)
    }

    /// The fields as forwarded, as a header map (a hashing strategy reads its key from
    /// it): [`Forwarding`] carried out on [`Self::to_map`].
    pub(crate) fn forwarded_map(&self, hop: Hop<'_>) -> HeaderMap {
        let mut map = self.to_map();
        Forwarding::apply(&mut map, hop, false);
        map
    }

    /// Writes the fields as this hop forwards them ([`Forwarding::write`]), and
    /// `host: default_host` when the request has no `Host` (HTTP/1.1 requires one).
    pub(crate) fn write_forwarded(&self, out: &mut Vec<u8>, hop: Hop<'_>, default_host: &str) {
        Forwarding::decide(self, hop, false).write(self, out);
        if hop.host.is_none() {
            put_field(out, b"host", default_host.as_bytes());
        }
    }
}

/// The fields a backend gets when [`Forwarding`] writes span fields out and when it is
/// carried out on their header map, each as sorted `(name, value)` lines: the two must
/// agree (the property test and the `header_rewrite` fuzz target check it).
#[cfg(any(fuzzing, test))]
pub(crate) fn both_rewrites(f: &ClientFields, trusted: bool, https: bool) -> (Lines, Lines) {
    let peer = HeaderValue::from_static("127.0.0.1");
    let host = f.host();
    let hop = Hop {
        peer: &peer,
        peer_trusted: trusted,
        host: host.as_ref(),
        https,
        request_id: b"id-1",
        via: b"1.1 fulcrum-test",
        client_cert: None,
        traceparent: None,
    };
    let mut out = Vec::new();
    f.write_forwarded(&mut out, hop, "backend:80");
    // The map path, then the backend's authority as Host when there is none (what
    // `wire::write_head` is given).
    let mut map = f.forwarded_map(hop);
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

    #[test]
    fn an_answer_map_gives_up_what_fulcrum_keeps_and_its_hop_fields() {
        let mut h = HeaderMap::new();
        h.insert(
            "endpoint-load-metrics",
            HeaderValue::from_static("TEXT cpu_utilization=0.5"),
        );
        h.insert(header::ALT_SVC, HeaderValue::from_static("h3=\":1\""));
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let kept = strip_answer(&mut h);
        assert_eq!(
            kept[0].as_ref().map(|v| v.as_bytes()),
            Some(&b"TEXT cpu_utilization=0.5"[..])
        );
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key(header::CONTENT_TYPE));
        let mut plain = HeaderMap::new();
        plain.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert!(strip_answer(&mut plain).iter().all(Option::is_none));
    }

    #[test]
    fn every_field_left_out_has_a_length_the_quick_check_looks_at() {
        let set = [
            X_FORWARDED_FOR,
            X_FORWARDED_PROTO,
            X_FORWARDED_HOST,
            X_FORWARDED_CLIENT_CERT,
            X_FULCRUM_MIRROR,
            super::super::request_id::X_REQUEST_ID,
        ];
        let names = hop::FIXED
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned());
        for name in names.chain(set.iter().map(|n| n.as_str().to_string())) {
            assert!(DROPPED_LENGTHS.contains(&name.len()), "{name}");
        }
    }

    #[test]
    fn a_copied_name_is_lowered_and_its_value_left_alone() {
        let mut out = b"GET / HTTP/1.1\r\n".to_vec();
        put_field_lowercase(&mut out, b"X-Trace-ID", b"AbC");
        assert_eq!(out, b"GET / HTTP/1.1\r\nx-trace-id: AbC\r\n");
    }

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
            for https in [false, true] {
                let (written, mapped) = both_rewrites(&f, trusted, https);
                proptest::prop_assert_eq!(written, mapped);
            }
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
            ("x-forwarded-proto", "https"),
            ("x-request-id", "theirs"),
        ]);
        let peer = forwarded_value("127.0.0.1".parse().unwrap());
        let hop = Hop {
            peer: &peer,
            peer_trusted: false,
            host: None,
            https: false,
            request_id: b"ours",
            via: b"2 fulcrum-test",
            client_cert: None,
            traceparent: None,
        };
        Forwarding::apply(&mut h, hop, false);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(
            h["x-forwarded-proto"], "http",
            "an untrusted peer's is replaced"
        );
        assert_eq!(h["x-request-id"], "ours");
        let mut h = map(&[("x-forwarded-proto", "http")]);
        let trusted = Hop {
            peer_trusted: true,
            ..hop
        };
        Forwarding::apply(&mut h, trusted, false);
        assert_eq!(h["x-forwarded-proto"], "http", "a trusted peer's stands");
        let mut h = HeaderMap::new();
        let tls = Hop { https: true, ..hop };
        Forwarding::apply(&mut h, tls, false);
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        // Lines `Connection` names are hop-by-hop: their entries go nowhere.
        let mut h = map(&[
            ("connection", "x-forwarded-for"),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        Forwarding::apply(&mut h, trusted, false);
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    }

    #[test]
    fn split_cookies_are_joined() {
        let mut h = map(&[("cookie", "a=1"), ("cookie", "b=2")]);
        merge_cookies(&mut h);
        assert_eq!(h.get_all("cookie").iter().count(), 1);
        assert_eq!(h["cookie"], "a=1; b=2");
    }
}

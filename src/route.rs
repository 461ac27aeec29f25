//! Routes: which pool a request goes to. Routes are tried in the order the config lists
//! them and the first that matches wins, as HAProxy's `use_backend` lines and Traefik's
//! routers are; but the table is precomputed by host, so a match costs one hash lookup
//! (or one per label for a wildcard) and a scan of the few routes that can apply to
//! that host, not a scan of all of them.
//!
//! A route's conditions are all optional: a host, exact (`api.example.com`) or a
//! wildcard (`*.example.com`: any name below it, at any depth, not the name itself, as
//! nginx's `server_name` reads it), compared without case and without the port; a path
//! prefix, segment-aware (`/v1` takes `/v1` and `/v1/…`, never `/v1x`); methods; and
//! header values, each present with exactly that value.

use std::collections::HashMap;

use http::header::{HeaderName, HeaderValue};
use http::Method;
use std::hash::BuildHasherDefault;

use xxhash_rust::xxh3::xxh3_64;

/// The longest host name looked up (DNS allows 253 characters); a longer one matches
/// only routes without a host condition.
const MAX_HOST: usize = 255;

/// A route's host condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This name exactly (lowercase).
    Exact(String),
    /// Any name that ends with `.` + this one (lowercase), at any depth.
    Below(String),
}

impl HostPattern {
    /// Reads `api.example.com` or `*.example.com`; a port, an empty name, a `*` elsewhere
    /// than a leading `*.`, or a byte a host name cannot hold is refused.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let lower = text.to_ascii_lowercase();
        let (name, below) = match lower.strip_prefix("*.") {
            Some(rest) => (rest.to_string(), true),
            None => (lower, false),
        };
        let valid_label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        };
        if name.is_empty() || name.len() > MAX_HOST || !name.split('.').all(valid_label) {
            return Err(format!(
                "invalid host '{text}' (expected a name such as api.example.com or *.example.com, without a port)"
            ));
        }
        Ok(if below {
            HostPattern::Below(name)
        } else {
            HostPattern::Exact(name)
        })
    }

    /// The pattern as it reads in a config: `api.example.com` or `*.example.com`.
    pub fn to_text(&self) -> String {
        match self {
            HostPattern::Exact(n) => n.clone(),
            HostPattern::Below(n) => format!("*.{n}"),
        }
    }

    /// Whether `host` (lowercase, without a port) is one this pattern takes.
    pub(crate) fn takes(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(n) => host == n,
            HostPattern::Below(n) => is_below(host, n),
        }
    }
}

/// `host` ends with `.` + `name`.
fn is_below(host: &str, name: &str) -> bool {
    host.len() > name.len()
        && host.ends_with(name)
        && host.as_bytes()[host.len() - name.len() - 1] == b'.'
}

/// A path prefix, checked when it is made: it starts with `/` and holds no query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPrefix(String);

impl PathPrefix {
    /// Reads a prefix such as `/v1`; a trailing `/` is dropped (`/v1/` is `/v1`), and
    /// `/` alone takes every path.
    pub fn parse(text: &str) -> Result<PathPrefix, String> {
        let ok = text.starts_with('/')
            && !text
                .bytes()
                .any(|c| c == b'?' || c == b'#' || c.is_ascii_whitespace() || c.is_ascii_control());
        if !ok {
            return Err(format!(
                "invalid path prefix '{text}' (expected a path such as /v1, without a query)"
            ));
        }
        Ok(PathPrefix(text.trim_end_matches('/').to_string()))
    }

    /// The prefix as it reads in a config (`/` for the one that takes every path).
    pub fn as_str(&self) -> &str {
        if self.0.is_empty() {
            "/"
        } else {
            &self.0
        }
    }

    /// Whether `path` (without its query) is this prefix or lies below it.
    fn takes(&self, path: &[u8]) -> bool {
        let p = self.0.as_bytes();
        path.starts_with(p) && (path.len() == p.len() || path[p.len()] == b'/')
    }
}

/// One route: its conditions and where it sends what it takes.
#[derive(Debug, Clone)]
pub struct Route {
    /// The pool's index in the pool list.
    pub pool: usize,
    /// The host condition, if any.
    pub host: Option<HostPattern>,
    /// The path condition, if any.
    pub path_prefix: Option<PathPrefix>,
    /// The methods taken; empty takes any.
    pub methods: Vec<Method>,
    /// Fields that must be present with exactly these values.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Forward the path without the prefix.
    pub strip_path_prefix: bool,
}

impl Route {
    /// A route without conditions, to `pool`.
    pub fn catch_all(pool: usize) -> Route {
        Route {
            pool,
            host: None,
            path_prefix: None,
            methods: Vec::new(),
            headers: Vec::new(),
            strip_path_prefix: false,
        }
    }

    /// Whether it has no condition at all (it takes every request).
    pub fn is_catch_all(&self) -> bool {
        self.host.is_none()
            && self.path_prefix.is_none()
            && self.methods.is_empty()
            && self.headers.is_empty()
    }

    /// Whether the conditions other than the host hold.
    fn takes_rest(&self, req: &Request<'_>) -> bool {
        self.path_prefix.as_ref().is_none_or(|p| p.takes(req.path))
            && (self.methods.is_empty() || self.methods.contains(req.method))
            && self
                .headers
                .iter()
                .all(|(name, value)| (req.has_field)(name, value.as_bytes()))
    }

    /// The target as forwarded: with the prefix stripped when the route says so
    /// (`/v1/users?x` → `/users?x`, `/v1` → `/`), else `None` (unchanged).
    pub fn rewrite(&self, target: &str) -> Option<String> {
        let prefix = self
            .path_prefix
            .as_ref()
            .filter(|_| self.strip_path_prefix)?;
        let rest = target.get(prefix.0.len()..)?;
        Some(if rest.is_empty() || rest.starts_with('?') {
            format!("/{rest}")
        } else {
            rest.to_string()
        })
    }
}

/// What a route looks at in a request.
pub struct Request<'a> {
    /// The authority (`Host`, or the target's), with or without a port.
    pub host: Option<&'a [u8]>,
    /// The path, without its query.
    pub path: &'a [u8],
    /// The method.
    pub method: &'a Method,
    /// Whether the request has a field `name` with exactly `value`.
    pub has_field: &'a dyn Fn(&HeaderName, &[u8]) -> bool,
}

/// Route indexes by host name, keyed by the name's xxh3 hash computed in one pass
/// (std's `Hash` for `str` would feed a streaming hasher twice per lookup, which costs
/// more than the rest of a match).
#[derive(Debug, Default)]
struct Names(HashMap<u64, Slot, BuildHasherDefault<Prehashed>>);

/// The names sharing a hash (nearly always one), each with its routes.
type Slot = Vec<(Box<str>, Box<[u32]>)>;

impl Names {
    fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    fn insert(&mut self, name: &str, routes: Box<[u32]>) {
        let slot = self.0.entry(xxh3_64(name.as_bytes())).or_default();
        slot.push((name.into(), routes));
    }

    fn get(&self, name: &str) -> Option<&[u32]> {
        let slot = self.0.get(&xxh3_64(name.as_bytes()))?;
        slot.iter().find(|(n, _)| &**n == name).map(|(_, r)| &**r)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.0.values().flatten().map(|(n, _)| &**n)
    }
}

/// The hasher of a map whose keys are hashes already: it passes the key through.
#[derive(Debug, Default)]
pub(crate) struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); fold anything else in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The routes, in order, and for each host the routes that can apply to it.
#[derive(Debug)]
pub struct RouteTable {
    routes: Vec<Route>,
    /// By exact name: the routes with that name, those whose wildcard takes it, and
    /// those without a host, in route order.
    exact: Names,
    /// By a wildcard's name: the routes whose wildcard takes every name below it
    /// (that one and the shorter ones above it), and those without a host, in order.
    below: Names,
    /// The routes without a host, in order.
    any: Box<[u32]>,
    /// Which name lengths `exact` and `below` hold: a suffix of another length is not
    /// looked up at all.
    exact_lengths: Lengths,
    below_lengths: Lengths,
}

/// A set of name lengths, 0 to 255.
#[derive(Debug, Default)]
struct Lengths([u64; 4]);

impl Lengths {
    fn insert(&mut self, n: usize) {
        if n <= MAX_HOST {
            self.0[n / 64] |= 1 << (n % 64);
        }
    }

    fn has(&self, n: usize) -> bool {
        n <= MAX_HOST && self.0[n / 64] & (1 << (n % 64)) != 0
    }
}

impl RouteTable {
    /// Precomputes the table for `routes`, in their order.
    pub fn new(routes: Vec<Route>) -> RouteTable {
        let in_order = |keep: &dyn Fn(&Route) -> bool| -> Box<[u32]> {
            routes
                .iter()
                .enumerate()
                .filter(|(_, r)| keep(r))
                .map(|(i, _)| i as u32)
                .collect()
        };
        let mut exact = Names::default();
        let mut below = Names::default();
        for r in &routes {
            match &r.host {
                Some(HostPattern::Exact(name)) if !exact.contains(name) => {
                    let list = in_order(&|o| o.host.as_ref().is_none_or(|h| h.takes(name)));
                    exact.insert(name, list);
                }
                Some(HostPattern::Below(name)) if !below.contains(name) => {
                    // A name below `name` is below every wildcard `name` equals or is below.
                    let list = in_order(&|o| match &o.host {
                        None => true,
                        Some(HostPattern::Exact(_)) => false,
                        Some(HostPattern::Below(n)) => n == name || is_below(name, n),
                    });
                    below.insert(name, list);
                }
                _ => {}
            }
        }
        let any = in_order(&|o| o.host.is_none());
        let (mut exact_lengths, mut below_lengths) = (Lengths::default(), Lengths::default());
        exact.names().for_each(|k| exact_lengths.insert(k.len()));
        below.names().for_each(|k| below_lengths.insert(k.len()));
        RouteTable {
            routes,
            exact,
            below,
            any,
            exact_lengths,
            below_lengths,
        }
    }

    /// The routes, in order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The first route that takes `req`, with its index.
    pub fn find(&self, req: &Request<'_>) -> Option<(usize, &Route)> {
        let candidates = self.candidates(req.host);
        candidates.iter().find_map(|&i| {
            let r = &self.routes[i as usize];
            r.takes_rest(req).then_some((i as usize, r))
        })
    }

    /// The routes that can apply to `host`, in order.
    fn candidates(&self, host: Option<&[u8]>) -> &[u32] {
        if self.exact.is_empty() && self.below.is_empty() {
            return &self.any;
        }
        let Some(host) = host else {
            return &self.any;
        };
        // The buffer is only filled (and zeroed) for a name with capitals.
        let mut buf;
        let name = if host.iter().any(u8::is_ascii_uppercase) {
            buf = [0u8; MAX_HOST];
            lowercase_name(host, &mut buf)
        } else {
            bare_name(host).and_then(|n| std::str::from_utf8(n).ok())
        };
        let Some(name) = name else {
            return &self.any;
        };
        if self.exact_lengths.has(name.len()) {
            if let Some(list) = self.exact.get(name) {
                return list;
            }
        }
        // The longest wildcard first: its list holds the shorter ones that take it.
        let mut rest = name;
        while let Some(dot) = rest.find('.') {
            rest = &rest[dot + 1..];
            if self.below_lengths.has(rest.len()) {
                if let Some(list) = self.below.get(rest) {
                    return list;
                }
            }
        }
        &self.any
    }
}

/// `host` without its port and a final dot; `None` when it is longer than a host name.
fn bare_name(host: &[u8]) -> Option<&[u8]> {
    let name = match host.first() {
        // An IPv6 literal keeps its brackets: no route names one but an exact match.
        Some(b'[') => match host.iter().position(|&c| c == b']') {
            Some(end) => &host[..=end],
            None => host,
        },
        _ => match host.iter().rposition(|&c| c == b':') {
            Some(colon) => &host[..colon],
            None => host,
        },
    };
    let name = name.strip_suffix(b".").unwrap_or(name);
    (name.len() <= MAX_HOST).then_some(name)
}

/// `host` as a route names it: without its port, in lowercase (copied into `buf` only
/// when it has capitals); `None` when it does not fit or is not text.
fn lowercase_name<'b>(host: &'b [u8], buf: &'b mut [u8; MAX_HOST]) -> Option<&'b str> {
    let name = bare_name(host)?;
    if !name.iter().any(u8::is_ascii_uppercase) {
        return std::str::from_utf8(name).ok();
    }
    let out = &mut buf[..name.len()];
    for (o, c) in out.iter_mut().zip(name) {
        *o = c.to_ascii_lowercase();
    }
    std::str::from_utf8(out).ok()
}

/// The first route in order that takes `req`, by a plain scan: what the table must
/// agree with (the property test and the `route` fuzz target check it).
#[cfg(any(fuzzing, test))]
pub(crate) fn scan(routes: &[Route], req: &Request<'_>) -> Option<usize> {
    let mut buf = [0u8; MAX_HOST];
    let name = req
        .host
        .and_then(|h| lowercase_name(h, &mut buf))
        .map(str::to_string);
    routes.iter().position(|route| {
        let host_ok = match (&route.host, &name) {
            (None, _) => true,
            (Some(p), Some(n)) => p.takes(n),
            (Some(_), None) => false,
        };
        host_ok && route.takes_rest(req)
    })
}

/// The route matcher's fuzz entry: each line of `data` but the last is a route
/// (`HOST PREFIX`, `-` for none), the last a request (`HOST PATH`); the table must find
/// what a scan finds.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_find(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines: Vec<&str> = text.lines().collect();
    let Some(last) = lines.pop() else {
        return;
    };
    fn field(s: Option<&str>) -> Option<&str> {
        s.filter(|w| *w != "-")
    }
    let routes: Vec<Route> = lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let mut w = line.split(' ');
            let (host, prefix) = (field(w.next()), field(w.next()));
            Route {
                host: host.and_then(|h| HostPattern::parse(h).ok()),
                path_prefix: prefix.and_then(|p| PathPrefix::parse(p).ok()),
                ..Route::catch_all(i)
            }
        })
        .collect();
    let mut w = last.split(' ');
    let (host, path) = (w.next().unwrap_or(""), w.next().unwrap_or("/"));
    let method = Method::GET;
    let req = Request {
        host: Some(host.as_bytes()),
        path: path.as_bytes(),
        method: &method,
        has_field: &|_, _| false,
    };
    let table = RouteTable::new(routes.clone());
    assert_eq!(table.find(&req).map(|(i, _)| i), scan(&routes, &req));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(pool: usize, host: Option<&str>, prefix: Option<&str>) -> Route {
        Route {
            host: host.map(|h| HostPattern::parse(h).unwrap()),
            path_prefix: prefix.map(|p| PathPrefix::parse(p).unwrap()),
            ..Route::catch_all(pool)
        }
    }

    fn req<'a>(host: &'a str, path: &'a str, method: &'a Method) -> Request<'a> {
        Request {
            host: Some(host.as_bytes()),
            path: path.as_bytes(),
            method,
            has_field: &|_, _| false,
        }
    }

    #[test]
    fn hosts_match_exactly_or_below_a_wildcard_without_case_or_port() {
        let t = RouteTable::new(vec![
            route(0, Some("api.example.com"), None),
            route(1, Some("*.example.com"), None),
            route(2, None, None),
        ]);
        let get = Method::GET;
        let pool = |h: &str| t.find(&req(h, "/", &get)).map(|(_, r)| r.pool);
        assert_eq!(pool("API.Example.com:8443"), Some(0));
        assert_eq!(pool("api.example.com."), Some(0));
        assert_eq!(pool("www.example.com"), Some(1));
        assert_eq!(pool("a.b.example.com"), Some(1));
        assert_eq!(
            pool("example.com"),
            Some(2),
            "a wildcard is not its own name"
        );
        assert_eq!(pool("badexample.com"), Some(2));
        assert_eq!(pool("[::1]:80"), Some(2));
    }

    #[test]
    fn the_first_route_in_order_wins_whatever_its_kind() {
        // A catch-all before a host route shadows it, as in HAProxy and Traefik.
        let t = RouteTable::new(vec![
            route(0, None, Some("/v1")),
            route(1, Some("api.example.com"), None),
            route(2, Some("*.example.com"), Some("/v2")),
            route(3, Some("*.a.example.com"), None),
        ]);
        let get = Method::GET;
        let pool = |h: &str, p: &str| t.find(&req(h, p, &get)).map(|(_, r)| r.pool);
        assert_eq!(pool("api.example.com", "/v1/x"), Some(0));
        assert_eq!(pool("api.example.com", "/other"), Some(1));
        assert_eq!(
            pool("x.a.example.com", "/v2"),
            Some(2),
            "the shorter wildcard comes first"
        );
        assert_eq!(pool("x.a.example.com", "/v3"), Some(3));
        assert_eq!(pool("elsewhere", "/v3"), None);
    }

    #[test]
    fn prefixes_are_segment_aware_and_strip_keeps_the_query() {
        let p = PathPrefix::parse("/v1/").unwrap();
        assert!(p.takes(b"/v1") && p.takes(b"/v1/users"));
        assert!(!p.takes(b"/v1x") && !p.takes(b"/v"));
        assert!(PathPrefix::parse("/").unwrap().takes(b"/anything"));
        let r = Route {
            strip_path_prefix: true,
            ..route(0, None, Some("/v1"))
        };
        assert_eq!(r.rewrite("/v1/users?id=2").as_deref(), Some("/users?id=2"));
        assert_eq!(r.rewrite("/v1").as_deref(), Some("/"));
        assert_eq!(r.rewrite("/v1?x").as_deref(), Some("/?x"));
        assert_eq!(route(0, None, Some("/v1")).rewrite("/v1/users"), None);
        for bad in ["v1", "/a?b", "/a b", ""] {
            assert!(PathPrefix::parse(bad).is_err(), "{bad}");
        }
        for bad in ["", "*", "a.*.com", "*.", "a..b", "a:80", "a b", "user@x"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn methods_and_fields_must_all_hold() {
        let canary = Route {
            methods: vec![Method::GET, Method::POST],
            headers: vec![(
                HeaderName::from_static("x-canary"),
                HeaderValue::from_static("1"),
            )],
            ..route(0, None, None)
        };
        let t = RouteTable::new(vec![canary, route(1, None, None)]);
        let with = |method: &Method, canary: bool| {
            let has = move |n: &HeaderName, v: &[u8]| canary && n == "x-canary" && v == b"1";
            let r = Request {
                host: None,
                path: b"/",
                method,
                has_field: &has,
            };
            t.find(&r).map(|(_, r)| r.pool)
        };
        assert_eq!(with(&Method::GET, true), Some(0));
        assert_eq!(with(&Method::DELETE, true), Some(1));
        assert_eq!(with(&Method::POST, false), Some(1));
    }

    proptest::proptest! {
        /// The table finds exactly what a scan of the routes in order finds.
        #[test]
        fn the_table_agrees_with_a_scan_in_order(
            specs in proptest::collection::vec(
                (
                    proptest::option::of(proptest::sample::select(vec![
                        "example.com", "*.example.com", "a.example.com", "*.a.example.com",
                        "b.a.example.com", "other.org", "*.org",
                    ])),
                    proptest::option::of(proptest::sample::select(vec!["/", "/v1", "/v1/x", "/v2"])),
                    proptest::bool::ANY,
                ),
                0..12,
            ),
            host in proptest::sample::select(vec![
                "example.com", "a.example.com", "B.A.example.com:80", "c.b.a.example.com",
                "x.example.com", "other.org", "y.other.org", "nothing", "",
            ]),
            path in proptest::sample::select(vec!["/", "/v1", "/v1/x/y", "/v2x", "/v1x"]),
        ) {
            let routes: Vec<Route> = specs
                .iter()
                .enumerate()
                .map(|(i, (h, p, post_only))| Route {
                    methods: if *post_only { vec![Method::POST] } else { vec![] },
                    ..route(i, *h, *p)
                })
                .collect();
            let table = RouteTable::new(routes.clone());
            for method in [Method::GET, Method::POST] {
                let r = req(host, path, &method);
                proptest::prop_assert_eq!(table.find(&r).map(|(i, _)| i), scan(&routes, &r));
            }
        }
    }
}

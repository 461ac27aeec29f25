//! A route's policies as one chain of steps (`docs/policies.md`, `docs/architecture.md`,
//! "The policy chain"): each step is one file under the one [`Step`] trait, and the
//! chain a route runs holds only the steps its policies use, in the order of
//! [`STEPS`]. The request path runs the chain's `before` hooks ahead of the pool, its
//! `forward` hooks on the fields as they go to the backend and its `after` hooks on the
//! answer; `POST /admin/explain` asks the same steps what they would do, so no rule is
//! written twice.
//!
//! A new step is one file here and one line in [`STEPS`].

mod access;
mod basic_auth;
mod client_cert;
mod compress;
mod edits;
mod forward_auth;
mod jwt;
mod rate_limit;
mod redirect;
mod request_headers;
mod response_headers;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;

pub(super) use forward_auth::AUX_IDS;

use super::answer::ProxyResponse;
use super::message::{Peer, RateLimitFields, RequestFields, RequestHead};
use super::request_id::RequestId;
use crate::clock::Stamp;
use crate::compress::Coding;
use crate::config::policy::Policies;
use crate::site::RoutePolicy;

/// Builds a route's step from its policies; `None` when the route does not use it.
type Build = fn(&Policies) -> Option<Box<dyn Step>>;

/// Every step, in the order a request meets them: before the pool — redirect, allow and
/// deny, rate limit, client certificate, basic auth, bearer token, forward auth; on the
/// fields to the backend — request headers; on the answer — response headers,
/// compression.
const STEPS: &[Build] = &[
    redirect::build,
    access::build,
    rate_limit::build,
    client_cert::build,
    basic_auth::build,
    jwt::build,
    forward_auth::build,
    request_headers::build,
    response_headers::build,
    compress::build,
];

/// What a step's `before` says.
pub(super) enum Next<'s> {
    /// On to the next step.
    Go,
    /// The request is answered here.
    Answer(Box<ProxyResponse>),
    /// On once this finishes; `Err` answers the request. Boxed once more, so that a
    /// `Next` is two words, returned in registers by every step on every request.
    Wait(Box<Waiting<'s>>),
}

impl<'s> Next<'s> {
    /// Waits for `f` before going on.
    pub(super) fn wait(
        f: impl Future<Output = Result<Grant, ProxyResponse>> + Send + 's,
    ) -> Next<'s> {
        Next::Wait(Box::new(Box::pin(f)))
    }
}

/// A step's wait: on once it finishes, with what it grants; `Err` answers the request.
pub(super) type Waiting<'s> =
    Pin<Box<dyn Future<Output = Result<Grant, ProxyResponse>> + Send + 's>>;

/// What a step that waited lets the request on with: fields set on the request
/// (replacing any of their names) and fields added to its answer.
#[derive(Debug, Default)]
pub(super) struct Grant {
    pub(super) request: Vec<(HeaderName, HeaderValue)>,
    pub(super) answer: Vec<(HeaderName, HeaderValue)>,
}

/// What [`Chain::run`] says.
pub(super) enum Ran<'s> {
    /// Every step let the request on.
    Done,
    /// The request is answered here, by the step named.
    Answer(Box<ProxyResponse>, &'static str),
    /// A step waits; the steps from `.0` on run once it finishes.
    Wait(usize, Box<Waiting<'s>>),
}

/// One policy of a route, on the request path and in `explain`.
pub(super) trait Step: Send + Sync + std::fmt::Debug {
    /// The step as `POST /admin/explain` names it (`"step"`): its route key (`allow`
    /// for the client lists, deny included).
    fn name(&self) -> &'static str;

    /// Before the pool: on, or the answer that ends the request here.
    fn before<'s>(&'s self, _cx: &mut Before<'_>) -> Next<'s> {
        Next::Go
    }

    /// Whether [`Self::forward`] edits the fields (the request then gets them as a
    /// map).
    fn edits_request(&self) -> bool {
        false
    }

    /// The request's fields as they go to the backend, this hop's rules applied.
    fn forward(&self, _map: &mut HeaderMap, _vars: &Vars<'_>) {}

    /// Whether [`Self::after`] changes answers (a chain whose steps do not skips it).
    fn edits_answer(&self) -> bool {
        false
    }

    /// The answer on its way to the client.
    fn after(&self, _cx: &After<'_>, _r: &mut ProxyResponse) {}

    /// What `before` would do with the request, without changing anything it keeps:
    /// `Some` with one sentence when it would end the request here.
    fn explain(&self, _cx: &Explain<'_>) -> Option<String> {
        None
    }

    /// The addresses the step lets by when it decides by the client's address alone
    /// (allow/deny): as a chain's first step, it is asked through this [`Gate`] before
    /// the request's context is built (`docs/performance.md`, "Who may come in").
    fn gate(&self) -> Option<Gate> {
        None
    }
}

/// A first step that lets an untrusted IPv4 peer by on its address alone: the chain
/// skips the step for a client it admits, and asks the step's `before` (which refuses,
/// counts and answers) for every other one. A request on a route whose chain is only
/// this pays for a lookup in the list, not for the context the steps see.
#[derive(Debug)]
pub(super) struct Gate(pub(super) std::sync::Arc<crate::ipset::Admission>);

impl Gate {
    /// Whether the peer (untrusted, IPv4) is surely admitted.
    #[inline(always)]
    fn passes(&self, peer: &Peer, trusted: bool) -> bool {
        untrusted_v4(peer, trusted).is_some_and(|x| self.0.admits_v4(x))
    }
}

/// What the steps found about a request that its answer needs.
#[derive(Debug, Default)]
pub(super) struct Found {
    /// The client's IP, trusted proxies honoured, once a step needed it.
    pub(super) client_ip: Option<IpAddr>,
    /// What the rate limit said, for the answer's fields.
    pub(super) limit: Option<RateLimitFields>,
    /// The coding the answer may be compressed with (`None`: none the client takes).
    pub(super) coding: Option<Coding>,
    /// Fields a step granted the answer (an auth service's `Set-Cookie`).
    pub(super) answer_fields: Vec<(HeaderName, HeaderValue)>,
}

/// A request before the pool, as the steps see it.
pub(super) struct Before<'a> {
    pub(super) head: &'a mut RequestHead,
    /// The worker's backend connections (an auth service's subrequest takes one).
    pub(super) upstreams: &'static super::upstream::Upstreams,
    /// The client, as its connection knows it.
    pub(super) peer: &'a Peer,
    /// Whether the peer is a trusted proxy (its forwarding fields are believed).
    pub(super) peer_trusted: bool,
    /// `trusted_proxies`.
    pub(super) trusted_proxies: &'a [IpNet],
    /// When it arrived.
    pub(super) now: Stamp,
    /// The route's policies and counters.
    pub(super) route: &'a RoutePolicy,
    pub(super) found: &'a mut Found,
}

impl Before<'_> {
    /// Removes the fields named `remove`, then sets `set` (each replacing its name's):
    /// fields a step writes into the request. Nothing to do leaves the fields' form.
    pub(super) fn set_fields(&mut self, remove: &[HeaderName], set: &[(HeaderName, HeaderValue)]) {
        if remove.is_empty() && set.is_empty() {
            return;
        }
        self.head.make_map();
        if let RequestFields::Map(m) = &mut self.head.fields {
            for n in remove {
                m.remove(n);
            }
            // A name given twice keeps both values (an auth service's multi-valued field).
            for (i, (n, v)) in set.iter().enumerate() {
                match set[..i].iter().any(|(seen, _)| seen == n) {
                    true => m.append(n.clone(), v.clone()),
                    false => m.insert(n.clone(), v.clone()).is_some(),
                };
            }
        }
    }

    /// Takes what a waiting step granted.
    pub(super) fn grant(&mut self, g: Grant) {
        self.set_fields(&[], &g.request);
        self.found.answer_fields.extend(g.answer);
    }

    /// The client's IP, `trusted_proxies` honoured: from an untrusted peer, the peer's
    /// address (no field is read, nothing kept: it is as cheap to read again); from a
    /// trusted one, what its forwarding fields say, kept for the answer's steps.
    #[inline(always)]
    pub(super) fn client_ip(&mut self) -> IpAddr {
        if !self.peer_trusted {
            return peer_ip(self.peer);
        }
        match self.found.client_ip {
            Some(ip) => ip,
            None => self.forwarded_client_ip(),
        }
    }

    /// The client's IPv4 address as a number when it is the peer's own (an untrusted
    /// IPv4 peer, the common case): a list is searched by it without an [`IpAddr`] built
    /// and matched on again (`docs/performance.md`, "Who may come in").
    #[inline(always)]
    pub(super) fn peer_v4(&self) -> Option<u32> {
        untrusted_v4(self.peer, self.peer_trusted)
    }

    /// The client's IP as a trusted peer's forwarding fields give it, kept.
    #[inline(never)]
    fn forwarded_client_ip(&mut self) -> IpAddr {
        self.head.make_map();
        let ip = match &self.head.fields {
            RequestFields::Map(m) => {
                crate::trust::client_ip(m, self.peer.addr.ip(), self.trusted_proxies)
            }
            RequestFields::Spans(_) => self.peer.addr.ip().to_canonical(),
        };
        self.found.client_ip = Some(ip);
        ip
    }
}

/// The peer's IPv4 address as a number when the peer is the client (not a trusted proxy).
#[inline(always)]
fn untrusted_v4(peer: &Peer, trusted: bool) -> Option<u32> {
    match (trusted, peer.addr) {
        (false, SocketAddr::V4(a)) => Some(u32::from(*a.ip())),
        _ => None,
    }
}

/// The peer's address as a client IP (an IPv4-mapped IPv6 address as its IPv4 one).
#[inline(always)]
fn peer_ip(peer: &Peer) -> IpAddr {
    match peer.addr {
        SocketAddr::V4(a) => IpAddr::V4(*a.ip()),
        SocketAddr::V6(a) => a.ip().to_canonical(),
    }
}

/// What a policy's `{…}` stand for, for one request.
pub(super) struct Vars<'a> {
    /// The client's IP (trusted proxies honoured).
    pub(super) client_ip: IpAddr,
    /// Its `X-Request-Id`.
    pub(super) request_id: &'a [u8],
    /// The authority it is for.
    pub(super) host: Option<&'a HeaderValue>,
}

/// An answer on its way back, as the steps see it.
pub(super) struct After<'a> {
    pub(super) found: &'a Found,
    pub(super) peer: &'a Peer,
    pub(super) id: &'a RequestId,
    /// The authority the request was for.
    pub(super) host: Option<&'a HeaderValue>,
}

impl After<'_> {
    /// What a policy's `{…}` stand for: the client's IP a step found, else the peer's.
    pub(super) fn vars(&self) -> Vars<'_> {
        Vars {
            client_ip: (self.found.client_ip).unwrap_or_else(|| peer_ip(self.peer)),
            request_id: self.id.as_bytes(),
            host: self.host,
        }
    }
}

/// A request `explain` asks about.
pub(super) struct Explain<'a> {
    pub(super) head: &'a RequestHead,
    /// Its client's IP, trusted proxies honoured.
    pub(super) client_ip: IpAddr,
    /// Its route's index.
    pub(super) index: usize,
    /// Its route's policies and what they hold (a key set).
    pub(super) route: &'a RoutePolicy,
    /// The verified client certificate the question names, if any.
    pub(super) client_cert: Option<&'a crate::identity::ClientCert>,
}

/// The steps a route runs, in order; built once per routing table, on the first
/// request that needs it.
#[derive(Debug)]
pub(super) struct Chain {
    steps: Vec<Box<dyn Step>>,
    /// The first step's [`Gate`], when it has one.
    gate: Option<Gate>,
    edits_request: bool,
    edits_answer: bool,
}

impl Chain {
    /// The chain of the route whose policies are `route`, built the first time.
    #[inline]
    pub(super) fn of(route: &RoutePolicy) -> &Chain {
        // SAFETY: this is the only call of `Kept::get_or_init` on `RoutePolicy::steps`,
        // and it names `Chain` (a second caller must name `Chain` too).
        unsafe { route.steps.get_or_init(|| Chain::build(&route.spec)) }
    }

    fn build(spec: &Policies) -> Chain {
        let steps: Vec<Box<dyn Step>> = STEPS.iter().filter_map(|build| build(spec)).collect();
        Chain {
            gate: steps.first().and_then(|s| s.gate()),
            edits_request: steps.iter().any(|s| s.edits_request()),
            edits_answer: steps.iter().any(|s| s.edits_answer()),
            steps,
        }
    }

    /// The name of step `i`.
    pub(super) fn step_name(&self, i: usize) -> Option<&'static str> {
        self.steps.get(i).map(|s| s.name())
    }

    /// The first step whose `before` is to run: past the first when its [`Gate`] lets the
    /// peer by. When it is the chain's length, the request goes on with no step run.
    #[inline(always)]
    pub(super) fn first_to_run(&self, peer: &Peer, trusted: bool) -> usize {
        match &self.gate {
            Some(g) if g.passes(peer, trusted) => 1,
            _ => 0,
        }
    }

    /// The number of steps.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.steps.len()
    }

    /// Runs the steps' `before` in order from the step `from` on, up to the first that
    /// answers or waits. Not an `async fn`: the steps that wait are few, and a request
    /// on a route without them pays for no future (the caller awaits a [`Ran::Wait`]
    /// and runs on from its `next`).
    #[inline]
    pub(super) fn run(&self, from: usize, cx: &mut Before<'_>) -> Ran<'_> {
        let mut next = from;
        for step in self.steps.get(from..).unwrap_or_default() {
            next += 1;
            match step.before(cx) {
                Next::Go => {}
                Next::Answer(r) => return Ran::Answer(r, step.name()),
                Next::Wait(wait) => return Ran::Wait(next, wait),
            }
        }
        Ran::Done
    }

    /// Whether a step edits the fields to the backend.
    #[inline]
    pub(super) fn edits_request(&self) -> bool {
        self.edits_request
    }

    /// Runs every step's `forward` on the fields to the backend.
    pub(super) fn forward(&self, map: &mut HeaderMap, vars: &Vars<'_>) {
        for step in &self.steps {
            step.forward(map, vars);
        }
    }

    /// Whether the answer is changed on its way: a step edits answers, or one granted
    /// fields to this one (`found`).
    #[inline]
    pub(super) fn edits_answer(&self, found: &Found) -> bool {
        self.edits_answer || !found.answer_fields.is_empty()
    }

    /// Runs every step's `after` on the answer, in order, then adds the fields steps
    /// granted it.
    pub(super) fn after(&self, cx: &After<'_>, r: &mut ProxyResponse) {
        if self.edits_answer {
            for step in &self.steps {
                step.after(cx, r);
            }
        }
        for (n, v) in &cx.found.answer_fields {
            r.head.append_field(n.clone(), v.clone());
        }
    }

    /// The first step that would end the request: its name and its words; `None`: it
    /// goes on to the pool.
    pub(super) fn explain(&self, cx: &Explain<'_>) -> Option<(&'static str, String)> {
        (self.steps.iter()).find_map(|s| Some((s.name(), s.explain(cx)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chain(keys: serde_json::Value) -> Chain {
        let mut p = Policies::default();
        for (k, v) in keys.as_object().unwrap() {
            p.set(k, v).unwrap();
        }
        Chain::build(&p)
    }

    fn peer(addr: &str) -> Peer {
        let local = "127.0.0.1:80".parse().unwrap();
        Peer::new(addr.parse().unwrap(), local, false, -1)
    }

    #[test]
    fn the_gate_lets_an_admitted_untrusted_ipv4_peer_past_the_first_step_only() {
        let c = chain(json!({"deny": ["192.0.2.0/24"], "rate_limit": {"rate": 1, "per": "1s"}}));
        assert_eq!(c.len(), 2);
        assert_eq!(c.first_to_run(&peer("198.51.100.1:9"), false), 1);
        // Denied, trusted (its forwarding fields decide) or IPv6: the step itself asks.
        assert_eq!(c.first_to_run(&peer("192.0.2.7:9"), false), 0);
        assert_eq!(c.first_to_run(&peer("198.51.100.1:9"), true), 0);
        assert_eq!(c.first_to_run(&peer("[2001:db8::1]:9"), false), 0);
    }

    #[test]
    fn only_a_first_step_is_a_gate() {
        let redirect =
            json!({"redirect": {"to": "https://example.com{path}"}, "deny": ["192.0.2.0/24"]});
        let c = chain(redirect);
        assert_eq!(c.first_to_run(&peer("198.51.100.1:9"), false), 0);
        let open = chain(json!({"rate_limit": {"rate": 1, "per": "1s"}}));
        assert_eq!(open.first_to_run(&peer("198.51.100.1:9"), false), 0);
    }
}

//! `allow` and `deny`: the client addresses a route takes (`docs/policies.md`, "Who may
//! come in"). The client IP is §4.3's (the peer, or what a trusted proxy's
//! `X-Forwarded-For` names); deny wins, then a non-empty allow list must hold it; else
//! `403 forbidden`, counted, and nothing reaches a backend. First of the steps after a
//! redirect: a refused client costs nothing more.

use std::sync::Arc;

use http::StatusCode;

use super::{Before, Explain, Gate, Next, Step};
use crate::config::policy::Policies;
use crate::ipset::Admission;
use crate::proxy::answer::ProxyResponse;

#[derive(Debug)]
struct Access(Arc<Admission>);

impl Access {
    /// Whether the client (any address, `trusted_proxies` honoured) may come in.
    #[inline(never)]
    fn admits(&self, cx: &mut Before<'_>) -> bool {
        self.0.admits(cx.client_ip())
    }
}

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    let access = Admission {
        deny: p.deny.clone().unwrap_or_default(),
        allow: p.allow.clone().unwrap_or_default(),
    };
    (!access.is_open()).then(|| Box::new(Access(Arc::new(access))) as Box<dyn Step>)
}

impl Step for Access {
    fn name(&self) -> &'static str {
        "allow"
    }

    fn before<'s>(&'s self, cx: &mut Before<'_>) -> Next<'s> {
        let admitted = match cx.peer_v4() {
            Some(x) => self.0.admits_v4(x),
            None => self.admits(cx),
        };
        match admitted {
            true => Next::Go,
            false => refuse(),
        }
    }

    fn explain(&self, cx: &Explain<'_>) -> Option<String> {
        let index = cx.index;
        let ip = cx.client_ip;
        match self.0.admits(ip) {
            true => None,
            false => Some(format!(
                "route {index} does not let client {ip} in (allow/deny): 403"
            )),
        }
    }

    fn gate(&self) -> Option<Gate> {
        Some(Gate(Arc::clone(&self.0)))
    }
}

/// `403 forbidden`, counted: out of the admitted request's way (`docs/performance.md`,
/// "Who may come in").
#[cold]
#[inline(never)]
fn refuse() -> Next<'static> {
    crate::stats::client_denied(crate::stats::Denied::Route);
    Next::Answer(Box::new(ProxyResponse::own(
        StatusCode::FORBIDDEN,
        "forbidden\n",
    )))
}

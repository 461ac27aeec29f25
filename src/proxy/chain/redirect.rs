//! `redirect`: a route that answers with a redirect and has no pool
//! (`docs/policies.md`, "Redirects").

use http::header::{self, HeaderValue};
use http::StatusCode;

use super::{Before, Explain, Next, Step};
use crate::config::policy::{LocationPart, Policies, Redirect};
use crate::proxy::answer::ProxyResponse;
use crate::proxy::message::RequestHead;

#[derive(Debug)]
struct RedirectStep(Redirect);

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    Some(Box::new(RedirectStep(p.redirect.clone()?)))
}

impl Step for RedirectStep {
    fn name(&self) -> &'static str {
        "redirect"
    }

    fn before<'s>(&'s self, cx: &mut Before<'_>) -> Next<'s> {
        Next::Answer(Box::new(answer(&self.0, cx.head, cx.peer.tls)))
    }

    fn explain(&self, cx: &Explain<'_>) -> Option<String> {
        let answer = answer(&self.0, cx.head, false);
        let to = answer.head.field(&header::LOCATION);
        let to = to.as_ref().map_or("", |v| v.to_str().unwrap_or(""));
        Some(format!(
            "route {} redirects it: {} to {to}",
            cx.index, self.0.status
        ))
    }
}

/// The answer of a redirect route: its status, and `Location` from its template with
/// the request's scheme, host, path (as received) and query.
fn answer(r: &Redirect, head: &RequestHead, tls: bool) -> ProxyResponse {
    let mut to = Vec::with_capacity(128);
    for part in &r.parts {
        match part {
            LocationPart::Text(t) => to.extend_from_slice(t.as_bytes()),
            LocationPart::Scheme => to.extend_from_slice(if tls { b"https" } else { b"http" }),
            LocationPart::Host => match head.host() {
                Some(h) => to.extend_from_slice(h.as_bytes()),
                // An HTTP/1.0 request may name no host: `https:///path` would send the
                // client nowhere (docs/policies.md, "Redirects").
                None => return ProxyResponse::own(StatusCode::BAD_REQUEST, "bad request\n"),
            },
            LocationPart::Path => to.extend_from_slice(head.uri.path().as_bytes()),
            LocationPart::Query => {
                if let Some(q) = head.uri.query() {
                    to.push(b'?');
                    to.extend_from_slice(q.as_bytes());
                }
            }
        }
    }
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::PERMANENT_REDIRECT);
    match HeaderValue::from_bytes(&to) {
        Ok(location) => ProxyResponse::own(status, "").with_field(header::LOCATION, location),
        // Every part is a valid field value already; a host with a byte that is not
        // cannot pass the head's checks.
        Err(_) => ProxyResponse::own(StatusCode::BAD_REQUEST, "bad request\n"),
    }
}

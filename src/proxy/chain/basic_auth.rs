//! `basic_auth`: users and their bcrypt hashes; a request without good credentials is
//! answered `401` (`docs/policies.md`, "Basic authentication"). After the rate limit,
//! so that guessing is limited too, and before anything reaches a backend.

use http::header::{self, HeaderValue};
use http::StatusCode;

use super::{Before, Explain, Next, Step};
use crate::basic_auth::{Check, Gate, Verified};
use crate::config::policy::Policies;
use crate::proxy::answer::ProxyResponse;

#[derive(Debug)]
struct BasicAuthStep {
    /// The users and the credentials verified before, kept while the routing table
    /// lives.
    gate: Gate,
}

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    let spec = p.basic_auth.as_ref()?;
    Some(Box::new(BasicAuthStep {
        gate: Gate::new(spec),
    }))
}

impl Step for BasicAuthStep {
    fn name(&self) -> &'static str {
        "basic_auth"
    }

    /// A credential not verified before is checked off the worker
    /// (`basic_auth::verify`), then remembered; with every core busy and a queue full of
    /// checks, `503` for a second.
    fn before<'s>(&'s self, cx: &mut Before<'_>) -> Next<'s> {
        let field = cx.head.field(&header::AUTHORIZATION);
        match self.gate.check(field.as_ref().map(HeaderValue::as_bytes)) {
            Check::Known => Next::Go,
            Check::Missing => Next::Answer(Box::new(self.unauthorized())),
            Check::Verify(attempt) => Next::wait(async move {
                match crate::basic_auth::verify(attempt).await {
                    Verified::Yes(field) => {
                        self.gate.remember(field);
                        Ok(Default::default())
                    }
                    Verified::No => Err(self.unauthorized()),
                    Verified::Busy => Err(ProxyResponse::own(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "busy\n",
                    )
                    .with_field(header::RETRY_AFTER, HeaderValue::from_static("1"))),
                }
            }),
        }
    }

    fn explain(&self, cx: &Explain<'_>) -> Option<String> {
        let field = cx.head.field(&header::AUTHORIZATION);
        let index = cx.index;
        match self.gate.check(field.as_ref().map(HeaderValue::as_bytes)) {
            Check::Missing => Some(format!(
                "route {index} asks for credentials and these are missing: 401"
            )),
            // Explain checks no password, nor says which were verified before: it would
            // be an oracle no rate limit guards.
            Check::Known | Check::Verify(_) => Some(format!(
                "route {index} asks for credentials: basic auth would verify these (explain checks no password); wrong ones get 401"
            )),
        }
    }
}

impl BasicAuthStep {
    /// `401` with the realm.
    fn unauthorized(&self) -> ProxyResponse {
        ProxyResponse::own(StatusCode::UNAUTHORIZED, "unauthorized\n")
            .with_field(header::WWW_AUTHENTICATE, self.gate.challenge.clone())
    }
}

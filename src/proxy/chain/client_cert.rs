//! `client_cert`: a request on the route must come over a connection whose client
//! certificate `[tls.client_auth]` verified, with one of the names the rule lists; else
//! `403` (`docs/tls.md`, "Mutual TLS"). After the rate limit, before basic auth.

use http::StatusCode;

use super::{Before, Explain, Next, Step};
use crate::config::policy::{ClientCertRule, Policies};
use crate::proxy::answer::ProxyResponse;

#[derive(Debug)]
struct ClientCertStep(ClientCertRule);

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    Some(Box::new(ClientCertStep(p.client_cert.clone()?)))
}

impl Step for ClientCertStep {
    fn name(&self) -> &'static str {
        "client_cert"
    }

    fn before<'s>(&'s self, cx: &mut Before<'_>) -> Next<'s> {
        match &cx.peer.client_cert {
            Some(cert) if cert.matches(&self.0.sans) => Next::Go,
            _ => Next::Answer(Box::new(ProxyResponse::own(
                StatusCode::FORBIDDEN,
                "client certificate required\n",
            ))),
        }
    }

    fn explain(&self, cx: &Explain<'_>) -> Option<String> {
        if cx.client_cert.is_some_and(|c| c.matches(&self.0.sans)) {
            return None;
        }
        let index = cx.index;
        let names = match self.0.sans.is_empty() {
            true => "any name".to_string(),
            false => (self.0.sans.iter().map(|s| s.to_text()))
                .collect::<Vec<_>>()
                .join(", "),
        };
        Some(format!(
            "route {index} asks for a verified client certificate ({names}); {}: 403",
            match cx.client_cert {
                Some(_) => "the one given has none of those names",
                None => "none is given (\"client_cert\": {\"sans\": […]})",
            }
        ))
    }
}

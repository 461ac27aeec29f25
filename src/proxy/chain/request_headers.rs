//! `request_headers`: fields set or removed on the way to the backend, after this hop's
//! own rules, so a route's value wins (`docs/policies.md`, "Headers").

use http::header::HeaderMap;

use super::edits::edit;
use super::{Step, Vars};
use crate::config::policy::{HeaderEdits, Policies};

#[derive(Debug)]
struct RequestHeaders(HeaderEdits);

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    Some(Box::new(RequestHeaders(p.request_headers.clone()?)))
}

impl Step for RequestHeaders {
    fn name(&self) -> &'static str {
        "request_headers"
    }

    fn edits_request(&self) -> bool {
        true
    }

    fn forward(&self, map: &mut HeaderMap, vars: &Vars<'_>) {
        edit(map, &self.0, vars);
    }
}

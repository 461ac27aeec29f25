//! `response_headers`: fields set or removed on the backend's answer
//! (`docs/policies.md`, "Headers").

use super::edits::edit;
use super::{After, Step};
use crate::config::policy::{HeaderEdits, Policies};
use crate::proxy::answer::ProxyResponse;

#[derive(Debug)]
struct ResponseHeaders(HeaderEdits);

pub(super) fn build(p: &Policies) -> Option<Box<dyn Step>> {
    Some(Box::new(ResponseHeaders(p.response_headers.clone()?)))
}

impl Step for ResponseHeaders {
    fn name(&self) -> &'static str {
        "response_headers"
    }

    fn edits_answer(&self) -> bool {
        true
    }

    fn after(&self, cx: &After<'_>, r: &mut ProxyResponse) {
        let vars = cx.vars();
        r.head.edit_fields(|map| edit(map, &self.0, &vars));
    }
}

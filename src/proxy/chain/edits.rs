//! Fields set or removed, shared by `request_headers` and `response_headers`
//! (`docs/policies.md`, "Headers").

use std::io::Write;

use http::header::{HeaderMap, HeaderValue};

use super::Vars;
use crate::config::policy::{HeaderEdits, Part, Template};

/// Removes, then sets, the fields `edits` names.
pub(super) fn edit(map: &mut HeaderMap, edits: &HeaderEdits, vars: &Vars<'_>) {
    for name in &edits.remove {
        map.remove(name);
    }
    for (name, t) in &edits.set {
        if let Some(v) = render(t, vars) {
            map.insert(name.clone(), v);
        }
    }
}

/// The value of `t` for this request; `None` when what it names makes no field value
/// (it cannot: each part is one already).
fn render(t: &Template, vars: &Vars<'_>) -> Option<HeaderValue> {
    if let Some(v) = t.fixed() {
        return Some(v.clone());
    }
    let mut out = Vec::with_capacity(64);
    for p in &t.parts {
        match p {
            Part::Text(v) => out.extend_from_slice(v.as_bytes()),
            Part::ClientIp => {
                let _ = write!(out, "{}", vars.client_ip);
            }
            Part::RequestId => out.extend_from_slice(vars.request_id),
            Part::Host => out.extend_from_slice(vars.host.map_or(&b""[..], |h| h.as_bytes())),
        }
    }
    HeaderValue::from_bytes(&out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::policy::Policies;

    #[test]
    fn fields_are_removed_then_set_with_the_request_in_them() {
        let mut p = Policies::default();
        let v = serde_json::json!({"set": {"x-env": "prod", "x-who": "{client_ip}/{request_id}/{host}"}, "remove": ["x-debug", "x-env"]});
        p.set("request_headers", &v).unwrap();
        let mut map = HeaderMap::new();
        map.insert("x-debug", HeaderValue::from_static("1"));
        map.insert("x-env", HeaderValue::from_static("dev"));
        let host = HeaderValue::from_static("api.example.com");
        let vars = Vars {
            client_ip: "192.0.2.7".parse().unwrap(),
            request_id: b"abc",
            host: Some(&host),
        };
        edit(&mut map, p.request_headers.as_ref().unwrap(), &vars);
        assert!(map.get("x-debug").is_none());
        assert_eq!(map["x-env"], "prod");
        assert_eq!(map["x-who"], "192.0.2.7/abc/api.example.com");
    }
}

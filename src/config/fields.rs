//! The field names a route's policies may write: not the hop's own, nor the message's
//! framing, which fulcrum writes itself (`docs/policies.md`, "Headers").

use http::header::HeaderName;

/// Field names a policy may neither set nor remove: the hop's own and the message's
/// framing, which fulcrum writes itself (`docs/policies.md`, "Headers").
const REFUSED: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
    "x-request-id",
];

/// A field name a policy may touch.
pub(super) fn field_name(key: &str, name: &str) -> Result<HeaderName, String> {
    let n = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{key}: invalid header name '{name}'"))?;
    if REFUSED.contains(&n.as_str()) {
        return Err(format!(
            "{key}: '{n}' cannot be set or removed (fulcrum writes the hop's and the message's framing fields itself)"
        ));
    }
    // A request's `Via` is how a loop is seen (`docs/operations.md`, "Loops").
    if key.starts_with("request_headers") && n == http::header::VIA {
        return Err(format!(
            "{key}: 'via' cannot be set or removed (fulcrum names itself there to see loops)"
        ));
    }
    // Only a mirror's copy carries it (`docs/traffic.md`, "Mirrors").
    if key.starts_with("request_headers") && n.as_str() == "x-fulcrum-mirror" {
        return Err(format!(
            "{key}: 'x-fulcrum-mirror' cannot be set or removed (it marks a mirror's copies)"
        ));
    }
    Ok(n)
}

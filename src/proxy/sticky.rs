//! Cookie-insert stickiness (`docs/operations.md`, "Sticky sessions"), as HAProxy's
//! `cookie NAME insert indirect`: an answer to a request without a valid cookie sets
//! one naming the backend that served it; a request with one goes back to that backend
//! while it is eligible or draining; the cookie itself never reaches a backend.
//!
//! The value is the backend's own ([`crate::backend::sticky_value`]), written as 16 hex
//! digits.

use http::header::{self, HeaderMap, HeaderValue};

use crate::config::StickySettings;

/// Takes the cookie `name` out of the request's `Cookie` fields (joined into one by
/// then) and returns its value when it is one of ours; the other cookies go on, byte
/// for byte (a value need not be ASCII).
pub(crate) fn take(fields: &mut HeaderMap, name: &str) -> Option<u64> {
    let line = fields.get(header::COOKIE)?.as_bytes().to_vec();
    let mut found = None;
    let mut rest: Vec<&[u8]> = Vec::new();
    for pair in line.split(|&c| c == b';').map(<[u8]>::trim_ascii) {
        if pair.is_empty() {
            continue;
        }
        let eq = pair.iter().position(|&c| c == b'=');
        match eq.map(|i| (pair[..i].trim_ascii(), &pair[i + 1..])) {
            Some((n, v)) if n == name.as_bytes() => {
                found = found.or_else(|| parse_value(v.trim_ascii()));
            }
            _ => rest.push(pair),
        }
    }
    if rest.is_empty() {
        fields.remove(header::COOKIE);
    } else if let Ok(v) = HeaderValue::from_bytes(&rest.join(&b"; "[..])) {
        fields.insert(header::COOKIE, v);
    }
    found
}

/// Our value: exactly 16 lowercase hex digits.
fn parse_value(v: &[u8]) -> Option<u64> {
    let hex = |c: &u8| c.is_ascii_digit() || (b'a'..=b'f').contains(c);
    if v.len() != 16 || !v.iter().all(hex) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(v).ok()?, 16).ok()
}

/// The `Set-Cookie` value that sends the client back to the backend with `value`
/// (none when the pool is not sticky).
pub(crate) fn set_cookie(s: &StickySettings, value: u64) -> Option<HeaderValue> {
    let cookie = s.cookie.as_deref()?;
    let mut text = format!("{cookie}={value:016x}; Path=/; HttpOnly; SameSite=Lax");
    let age = s.max_age;
    if !age.is_zero() {
        // Rounded up: `Max-Age=0` would delete the cookie.
        let secs = age.as_secs() + u64::from(age.subsec_nanos() > 0);
        text.push_str(&format!("; Max-Age={secs}"));
    }
    HeaderValue::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_cookie_is_taken_out_and_the_others_stay() {
        let v = crate::backend::sticky_value("web", "http://127.0.0.1:3001");
        let mut h = HeaderMap::new();
        let line = format!("a=1; FULCRUM={v:016x}; b=2");
        h.insert(header::COOKIE, HeaderValue::from_str(&line).unwrap());
        assert_eq!(take(&mut h, "FULCRUM"), Some(v));
        assert_eq!(h[header::COOKIE], "a=1; b=2");
        let line = format!("n=caf\u{e9}; FULCRUM={v:016x}");
        h.insert(
            header::COOKIE,
            HeaderValue::from_bytes(line.as_bytes()).unwrap(),
        );
        assert_eq!(
            take(&mut h, "FULCRUM"),
            Some(v),
            "beside a value that is not ASCII"
        );
        assert_eq!(h[header::COOKIE].as_bytes(), "n=caf\u{e9}".as_bytes());
        h.insert(header::COOKIE, HeaderValue::from_static("FULCRUM=zz"));
        assert_eq!(take(&mut h, "FULCRUM"), None, "not one of ours");
        assert!(h.get(header::COOKIE).is_none(), "and still not forwarded");
    }

    #[test]
    fn values_depend_on_pool_and_url_only() {
        let a = crate::backend::sticky_value("web", "http://10.0.0.1:80");
        assert_eq!(a, crate::backend::sticky_value("web", "http://10.0.0.1:80"));
        assert_ne!(a, crate::backend::sticky_value("api", "http://10.0.0.1:80"));
        assert_ne!(a, crate::backend::sticky_value("web", "http://10.0.0.2:80"));
        let s = StickySettings {
            cookie: Some("SRV".into()),
            max_age: std::time::Duration::from_secs(3600),
        };
        let c = set_cookie(&s, 0xab).unwrap();
        assert_eq!(
            c,
            "SRV=00000000000000ab; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600"
        );
    }
}

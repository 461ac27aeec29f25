//! A route's `mirror` as configured (`docs/traffic.md`, "Mirrors"): the pool a share of
//! its requests is copied to, and whether the copies' answers are compared with the
//! client's. Read the same way from the file and from `PUT /admin/routes` (as JSON).

use serde_json::{json, Value};

/// `body_limit`'s default: 1 MiB.
pub(crate) const DEFAULT_BODY_LIMIT: u64 = 1 << 20;

/// `max_in_flight`'s default.
pub(crate) const DEFAULT_MAX_IN_FLIGHT: u32 = 100;

/// The largest `body_limit`: 64 MiB (at most `max_in_flight` copies hold one each).
const MAX_BODY_LIMIT: u64 = 64 << 20;

/// The highest `max_in_flight`.
const MAX_IN_FLIGHT: u64 = 100_000;

/// The most `ignore_json` paths.
const MAX_IGNORED: usize = 64;

/// A whole route's share, in parts per million.
pub(crate) const ALL: u32 = 1_000_000;

/// The keys a `mirror` table takes.
const KEYS: [&str; 5] = ["pool", "percent", "compare", "body_limit", "max_in_flight"];

/// A route's mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MirrorSpec {
    /// The pool the copies go to.
    pub(crate) pool: String,
    /// The share of the route's requests copied, in parts per million (`percent` ×
    /// 10 000).
    pub(crate) share: u32,
    /// Whether (and how) the answers are compared.
    pub(crate) compare: Option<CompareSpec>,
    /// The largest body copied (and hashed for the comparison).
    pub(crate) body_limit: u64,
    /// The most copies on their way at once.
    pub(crate) max_in_flight: u32,
}

/// How the answers are compared.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CompareSpec {
    /// Dotted paths taken out of a JSON body on both sides before hashing.
    pub(crate) ignore_json: Vec<String>,
}

impl MirrorSpec {
    /// As it is given (`PUT /admin/routes` takes it back).
    pub(crate) fn to_json(&self) -> Value {
        let compare = match &self.compare {
            None => Value::Bool(false),
            Some(c) if c.ignore_json.is_empty() => Value::Bool(true),
            Some(c) => json!({ "ignore_json": c.ignore_json }),
        };
        json!({
            "pool": self.pool,
            "percent": self.percent(),
            "compare": compare,
            "body_limit": self.body_limit,
            "max_in_flight": self.max_in_flight,
        })
    }

    /// The share as a percentage.
    pub(crate) fn percent(&self) -> f64 {
        f64::from(self.share) / 10_000.0
    }
}

/// The mirror `v` gives (`{ pool = "shadow", percent = 10, compare = true }`); the message
/// names what is wrong. Its pool's name is checked with the route's (`config::pools`).
pub(crate) fn parse(v: &Value) -> Result<MirrorSpec, String> {
    let Value::Object(m) = v else {
        return Err(
            "invalid mirror: expected a table, such as { pool = \"shadow\", percent = 10 }".into(),
        );
    };
    if let Some(k) = m.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(format!(
            "invalid mirror: unknown key '{k}' (valid: {})",
            KEYS.join(", ")
        ));
    }
    let pool = match m.get("pool") {
        Some(Value::String(p)) => p.clone(),
        _ => return Err("invalid mirror: it names its pool (pool = \"NAME\")".into()),
    };
    Ok(MirrorSpec {
        pool,
        share: m.get("percent").map_or(Ok(ALL), share)?,
        compare: m.get("compare").map_or(Ok(None), compare)?,
        body_limit: m
            .get("body_limit")
            .map_or(Ok(DEFAULT_BODY_LIMIT), body_limit)?,
        max_in_flight: m
            .get("max_in_flight")
            .map_or(Ok(DEFAULT_MAX_IN_FLIGHT), max_in_flight)?,
    })
}

/// `percent`: 0–100, fractions allowed.
fn share(v: &Value) -> Result<u32, String> {
    match v.as_f64() {
        Some(p) if (0.0..=100.0).contains(&p) => Ok((p * 10_000.0).round() as u32),
        _ => Err("invalid mirror: percent must be a number from 0 to 100".into()),
    }
}

/// `compare`: `true`, `false` or `{ ignore_json = [PATH, …] }`.
fn compare(v: &Value) -> Result<Option<CompareSpec>, String> {
    let bad = "invalid mirror: compare is true, false or { ignore_json = [\"PATH\", …] }";
    match v {
        Value::Bool(on) => Ok(on.then(CompareSpec::default)),
        Value::Object(m) => {
            if m.keys().any(|k| k != "ignore_json") {
                return Err(bad.into());
            }
            let Some(Value::Array(paths)) = m.get("ignore_json") else {
                return Err(bad.into());
            };
            let paths: Option<Vec<String>> = paths
                .iter()
                .map(|p| p.as_str().map(str::to_string))
                .collect();
            let paths = paths.ok_or(bad)?;
            if paths.len() > MAX_IGNORED {
                return Err(format!(
                    "invalid mirror: at most {MAX_IGNORED} ignore_json paths"
                ));
            }
            if let Some(p) = paths.iter().find(|p| !json_path(p)) {
                return Err(format!(
                    "invalid mirror: ignore_json path '{p}' (dotted names, * for every element: items.*.etag)"
                ));
            }
            Ok(Some(CompareSpec { ignore_json: paths }))
        }
        _ => Err(bad.into()),
    }
}

/// Whether `p` is a dotted path of non-empty names.
fn json_path(p: &str) -> bool {
    !p.is_empty() && p.len() <= 256 && p.split('.').all(|s| !s.is_empty())
}

/// `body_limit`: a size (`1m`, `65536`); 0 copies only bodiless requests.
fn body_limit(v: &Value) -> Result<u64, String> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return Err("invalid mirror: body_limit is a size, such as \"1m\"".into()),
    };
    let size = super::values::parse_size(&text)
        .map_err(|e| format!("invalid mirror: body_limit: {e}"))?
        .unwrap_or(0);
    if size > MAX_BODY_LIMIT {
        return Err("invalid mirror: body_limit is at most 64m".into());
    }
    Ok(size)
}

/// `max_in_flight`: 1–100 000.
fn max_in_flight(v: &Value) -> Result<u32, String> {
    match v.as_u64() {
        Some(n) if (1..=MAX_IN_FLIGHT).contains(&n) => Ok(n as u32),
        _ => Err(format!(
            "invalid mirror: max_in_flight must be a whole number from 1 to {MAX_IN_FLIGHT}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_values() {
        let m = parse(&json!({"pool": "shadow"})).unwrap();
        assert_eq!(m.share, ALL);
        assert_eq!(m.compare, None);
        assert_eq!(m.body_limit, DEFAULT_BODY_LIMIT);
        assert_eq!(m.max_in_flight, DEFAULT_MAX_IN_FLIGHT);
        let m = parse(&json!({"pool": "s", "percent": 2.5, "compare": true, "body_limit": "64k", "max_in_flight": 7})).unwrap();
        assert_eq!(m.share, 25_000);
        assert_eq!(m.compare, Some(CompareSpec::default()));
        assert_eq!((m.body_limit, m.max_in_flight), (65_536, 7));
        assert_eq!(parse(&m.to_json()).unwrap(), m);
        let m = parse(&json!({"pool": "s", "compare": {"ignore_json": ["a.b", "items.*.etag"]}}));
        let m = m.unwrap();
        assert_eq!(m.compare.as_ref().unwrap().ignore_json.len(), 2);
        assert_eq!(parse(&m.to_json()).unwrap(), m);
    }

    #[test]
    fn bad_values_are_named() {
        for (v, says) in [
            (json!({"pool": "s", "percent": 101}), "percent"),
            (json!({"pool": "s", "percent": -1}), "percent"),
            (json!({"pool": "s", "percent": "ten"}), "percent"),
            (json!({"percent": 10}), "pool"),
            (json!({"pool": "s", "compare": "yes"}), "compare"),
            (
                json!({"pool": "s", "compare": {"ignore_json": ["a..b"]}}),
                "ignore_json",
            ),
            (json!({"pool": "s", "body_limit": "lots"}), "body_limit"),
            (json!({"pool": "s", "body_limit": "65m"}), "body_limit"),
            (json!({"pool": "s", "max_in_flight": 0}), "max_in_flight"),
            (json!({"pool": "s", "speed": 1}), "speed"),
            (json!("shadow"), "table"),
        ] {
            let e = parse(&v).unwrap_err();
            assert!(e.contains(says), "{v}: {e}");
        }
    }
}

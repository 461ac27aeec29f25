//! A route's `split` and `split_key` as configured (`docs/traffic.md`, "Splits"): the
//! pools a route shares its requests among, by weight, and what keeps one client on one
//! side. Read the same way from the file and from `PUT /admin/routes` (both as JSON).

use serde_json::Value;

use super::HashKey;

/// The highest weight a side may have.
pub(crate) const MAX_WEIGHT: u32 = 1000;

/// The most sides a split may have.
pub(crate) const MAX_SIDES: usize = 16;

/// One side of a split: a pool and its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Side {
    /// The pool's name.
    pub(crate) pool: String,
    /// 0–1000; 0 sends it nothing.
    pub(crate) weight: u32,
}

/// A route's split: its sides and, when set, the key that places a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SplitSpec {
    /// The sides, in order, at least one with a weight above 0.
    pub(crate) sides: Vec<Side>,
    /// `split_key`: a request that has it goes to the side its hash picks.
    pub(crate) key: Option<HashKey>,
}

impl SplitSpec {
    /// The sides as JSON, as they are given.
    pub(crate) fn sides_json(&self) -> Value {
        let sides = (self.sides.iter())
            .map(|s| serde_json::json!({ "pool": s.pool, "weight": s.weight }))
            .collect();
        Value::Array(sides)
    }
}

/// The sides `v` gives (`[{ pool = "v1", weight = 95 }, …]`); the message names what is
/// wrong.
pub(crate) fn sides(v: &Value) -> Result<Vec<Side>, String> {
    let Value::Array(items) = v else {
        return Err(
            "invalid split: expected a list of sides, such as [{ pool = \"v1\", weight = 95 }]"
                .into(),
        );
    };
    if items.is_empty() || items.len() > MAX_SIDES {
        return Err(format!("invalid split: 1 to {MAX_SIDES} sides"));
    }
    let mut out: Vec<Side> = Vec::with_capacity(items.len());
    for item in items {
        let side = side(item)?;
        if out.iter().any(|s| s.pool == side.pool) {
            return Err(format!("invalid split: pool '{}' twice", side.pool));
        }
        out.push(side);
    }
    if out.iter().all(|s| s.weight == 0) {
        return Err("invalid split: every weight is 0 (at least one must be above 0)".into());
    }
    Ok(out)
}

/// One side (its pool's name is checked with the route's, `config::pools`).
fn side(item: &Value) -> Result<Side, String> {
    let Value::Object(m) = item else {
        return Err("invalid split: a side is a table { pool, weight }".into());
    };
    if let Some(k) = m.keys().find(|k| !matches!(k.as_str(), "pool" | "weight")) {
        return Err(format!(
            "invalid split: unknown key '{k}' (valid: pool, weight)"
        ));
    }
    let pool = match m.get("pool") {
        Some(Value::String(p)) => p.clone(),
        _ => return Err("invalid split: a side names its pool (pool = \"NAME\")".into()),
    };
    let weight = match m.get("weight").map(Value::as_u64) {
        Some(Some(w)) if w <= u64::from(MAX_WEIGHT) => w as u32,
        Some(_) => {
            return Err(format!(
            "invalid split: the weight of '{pool}' must be a whole number from 0 to {MAX_WEIGHT}"
        ))
        }
        None => return Err(format!("invalid split: the side '{pool}' has no weight")),
    };
    Ok(Side { pool, weight })
}

/// `split_key`'s value.
pub(crate) fn key(v: &Value) -> Result<HashKey, String> {
    let Value::String(s) = v else {
        return Err("invalid split_key: expected client_ip, header:NAME or cookie:NAME".into());
    };
    super::values::parse_hash_key(s).map_err(|e| format!("invalid split_key: {e}"))
}

/// The key's text, as it is given.
pub(crate) fn key_text(k: &HashKey) -> String {
    match k {
        HashKey::ClientIp => "client_ip".into(),
        HashKey::Header(n) => format!("header:{n}"),
        HashKey::Cookie(c) => format!("cookie:{c}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sides_are_checked() {
        let ok = sides(&json!([{"pool": "v1", "weight": 95}, {"pool": "v2", "weight": 5}]));
        assert_eq!(ok.unwrap().len(), 2);
        assert!(sides(&json!([{"pool": "v1", "weight": 0}, {"pool": "v2", "weight": 1}])).is_ok());
        for (bad, says) in [
            (json!([]), "1 to 16"),
            (json!("v1"), "list of sides"),
            (json!([{"pool": "v1", "weight": 0}]), "every weight is 0"),
            (json!([{"pool": "v1", "weight": 1001}]), "0 to 1000"),
            (json!([{"pool": "v1", "weight": -1}]), "0 to 1000"),
            (json!([{"pool": "v1", "weight": 1.5}]), "0 to 1000"),
            (json!([{"pool": "v1"}]), "no weight"),
            (json!([{"weight": 1}]), "names its pool"),
            (
                json!([{"pool": "v1", "weight": 1, "x": 2}]),
                "unknown key 'x'",
            ),
            (
                json!([{"pool": "v1", "weight": 1}, {"pool": "v1", "weight": 2}]),
                "twice",
            ),
        ] {
            let e = sides(&bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn keys_read_and_print_back() {
        for text in ["client_ip", "header:x-user", "cookie:session"] {
            assert_eq!(key_text(&key(&json!(text)).unwrap()), text);
        }
        assert!(key(&json!("path")).unwrap_err().contains("split_key"));
        assert!(key(&json!(3)).is_err());
    }
}

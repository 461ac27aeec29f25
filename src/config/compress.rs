//! A route's `compress` and `compress_types` as configured (`docs/policies.md`,
//! "Compression"): which codings it offers, in its order of preference, and which media
//! types beyond the usual text ones it compresses.

use serde_json::Value;

/// A content coding fulcrum compresses with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// Zstandard (RFC 8878).
    Zstd,
    /// Brotli (RFC 7932).
    Br,
    /// gzip (RFC 1952).
    Gzip,
}

impl Coding {
    /// Every coding, in the default order of preference.
    pub const ALL: [Coding; 3] = [Coding::Zstd, Coding::Br, Coding::Gzip];

    /// Its name in `Accept-Encoding` and `Content-Encoding`.
    pub fn name(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Br => "br",
            Coding::Gzip => "gzip",
        }
    }

    fn parse(name: &str) -> Option<Coding> {
        Coding::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The codings a route offers, most preferred first (never empty).
pub(crate) fn codings_from_json(v: &Value) -> Result<Option<Vec<Coding>>, String> {
    const HOW: &str =
        "compress: expected true, false or a list such as [\"zstd\", \"br\", \"gzip\"]";
    match v {
        Value::Bool(false) => Ok(None),
        Value::Bool(true) => Ok(Some(Coding::ALL.to_vec())),
        Value::Array(names) if !names.is_empty() => {
            let mut out = Vec::with_capacity(names.len());
            for n in names {
                let Value::String(n) = n else {
                    return Err(HOW.into());
                };
                let c = Coding::parse(n).ok_or_else(|| {
                    format!("compress: unknown coding '{n}' (valid: zstd, br, gzip)")
                })?;
                if out.contains(&c) {
                    return Err(format!("compress: '{n}' given twice"));
                }
                out.push(c);
            }
            Ok(Some(out))
        }
        _ => Err(HOW.into()),
    }
}

/// How the codings are shown: `true` for the default list, else the list.
pub(crate) fn codings_to_json(codings: &[Coding]) -> Value {
    if codings == Coding::ALL {
        return Value::Bool(true);
    }
    Value::Array(codings.iter().map(|c| Value::from(c.name())).collect())
}

/// Media types (`type/subtype`, or `type/*`), lowercase, compressed beside the usual ones.
pub(crate) fn types_from_json(v: &Value) -> Result<Vec<String>, String> {
    const HOW: &str =
        "compress_types: expected a list of media types such as [\"application/wasm\"]";
    let Value::Array(items) = v else {
        return Err(HOW.into());
    };
    let mut out = Vec::with_capacity(items.len());
    for t in items {
        let Value::String(t) = t else {
            return Err(HOW.into());
        };
        let lower = t.trim().to_ascii_lowercase();
        let token = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
        };
        match lower.split_once('/') {
            Some((ty, sub)) if token(ty) && (sub == "*" || token(sub)) => out.push(lower),
            _ => {
                return Err(format!(
                    "compress_types: '{}' is not a media type (type/subtype or type/*)",
                    t.escape_default()
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn codings_are_read_in_order_and_shown_as_given() {
        assert_eq!(
            codings_from_json(&json!(true)).unwrap(),
            Some(Coding::ALL.to_vec())
        );
        assert_eq!(codings_from_json(&json!(false)).unwrap(), None);
        let l = codings_from_json(&json!(["gzip", "br"])).unwrap().unwrap();
        assert_eq!(l, vec![Coding::Gzip, Coding::Br]);
        assert_eq!(codings_to_json(&l), json!(["gzip", "br"]));
        assert_eq!(codings_to_json(&Coding::ALL), json!(true));
        for bad in [json!([]), json!(["lz4"]), json!(["gzip", "gzip"]), json!(1)] {
            assert!(codings_from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn media_types_are_checked() {
        let t = types_from_json(&json!(["Application/WASM", "font/*"])).unwrap();
        assert_eq!(t, vec!["application/wasm", "font/*"]);
        for bad in [
            json!(["wasm"]),
            json!(["a/b c"]),
            json!("a/b"),
            json!(["/x"]),
        ] {
            assert!(types_from_json(&bad).is_err(), "{bad}");
        }
    }
}

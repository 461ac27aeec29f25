//! A route's `jwt` and `forward_auth` as configured (`docs/policies.md`, "Bearer tokens
//! (JWT)" and "Forward auth"): each a table, checked here with one message per mistake.
//! A `jwks_file` is read and checked now (start, reload, `PUT /admin/routes`), so a file
//! that is not a key set stops the configuration, not a request.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::Uri;
use serde_json::{Map, Value};

use super::values::{duration_text, parse_positive_duration};
use crate::jwt::{Claims, KeySet};

/// Where a route's keys come from.
#[derive(Debug, Clone)]
pub(crate) enum Jwks {
    /// A file, read with the configuration.
    File {
        /// As given.
        path: PathBuf,
        /// Its keys.
        set: Arc<KeySet>,
        /// Its text, to tell a changed file from the same one.
        text: Arc<[u8]>,
    },
    /// A URL fetched at start, every `refresh`, and on an unknown `kid`.
    Url {
        /// `https://…`, or `http://` on a loopback address.
        url: Uri,
        /// How often the set is fetched again (`jwks_refresh`).
        refresh: Duration,
    },
}

impl PartialEq for Jwks {
    fn eq(&self, other: &Jwks) -> bool {
        match (self, other) {
            (
                Jwks::File { path, text, .. },
                Jwks::File {
                    path: p, text: t, ..
                },
            ) => path == p && text == t,
            (Jwks::Url { url, refresh }, Jwks::Url { url: u, refresh: r }) => {
                url == u && refresh == r
            }
            _ => false,
        }
    }
}

/// `jwks_refresh`'s default.
pub(crate) const JWKS_REFRESH: Duration = Duration::from_secs(600);

/// A route's bearer-token check.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Jwt {
    /// The keys.
    pub(crate) keys: Jwks,
    /// `issuer` and `audiences`.
    pub(crate) claims: Claims,
    /// Claims copied into request fields: (claim, field).
    pub(crate) claims_to_headers: Vec<(String, HeaderName)>,
    /// A cookie the token is also taken from when `Authorization` has none.
    pub(crate) token_cookie: Option<String>,
}

const JWT_KEYS: [&str; 8] = [
    "algorithms",
    "jwks_file",
    "jwks_url",
    "jwks_refresh",
    "issuer",
    "audiences",
    "claims_to_headers",
    "token_cookie",
];

/// `key` of table `m` as a string, if there.
fn text(m: &Map<String, Value>, policy: &str, key: &str) -> Result<Option<String>, String> {
    match m.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{policy}.{key}: expected a string")),
    }
}

/// The table of `policy`, its keys among `valid`.
fn table<'v>(
    policy: &str,
    v: &'v Value,
    valid: &[&str],
    example: &str,
) -> Result<&'v Map<String, Value>, String> {
    let Value::Object(m) = v else {
        return Err(format!("{policy}: expected a table such as {example}"));
    };
    if let Some(k) = m.keys().find(|k| !valid.contains(&k.as_str())) {
        let valid = valid.join(", ");
        return Err(format!("unknown key '{policy}.{k}' (valid: {valid})"));
    }
    Ok(m)
}

impl Jwt {
    /// `{ jwks_file | jwks_url, … }`; a file is read and checked now.
    pub(super) fn from_json(v: &Value) -> Result<Jwt, String> {
        let example = "{ jwks_file = \"/etc/fulcrum/jwks.json\", issuer = \"https://id.example\" }";
        let m = table("jwt", v, &JWT_KEYS, example)?;
        let keys = match (text(m, "jwt", "jwks_file")?, text(m, "jwt", "jwks_url")?) {
            (Some(f), None) => {
                if m.contains_key("jwks_refresh") {
                    return Err("jwt.jwks_refresh: only with jwks_url".into());
                }
                read_jwks(PathBuf::from(f))?
            }
            (None, Some(u)) => Jwks::Url {
                url: jwks_url(&u)?,
                refresh: match text(m, "jwt", "jwks_refresh")? {
                    Some(d) => jwks_refresh(&d)?,
                    None => JWKS_REFRESH,
                },
            },
            _ => return Err("jwt: give exactly one of jwks_file and jwks_url".into()),
        };
        let audiences = match m.get("audiences") {
            None => Vec::new(),
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or("jwt.audiences: expected a list of strings")?,
            Some(_) => return Err("jwt.audiences: expected a non-empty list of strings".into()),
        };
        let token_cookie = text(m, "jwt", "token_cookie")?;
        if let Some(c) = &token_cookie {
            let token = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
            if c.is_empty() || !c.bytes().all(token) {
                return Err(format!(
                    "jwt.token_cookie: '{}' is not a cookie name",
                    c.escape_default()
                ));
            }
        }
        Ok(Jwt {
            keys,
            claims: Claims {
                issuer: text(m, "jwt", "issuer")?,
                audiences,
                algorithms: algorithms(m.get("algorithms"))?,
            },
            claims_to_headers: claims_to_headers(m.get("claims_to_headers"))?,
            token_cookie,
        })
    }

    /// As `GET /admin/routes` shows it.
    pub(super) fn to_json(&self) -> Value {
        let mut m = Map::new();
        match &self.keys {
            Jwks::File { path, .. } => {
                m.insert("jwks_file".into(), path.display().to_string().into());
            }
            Jwks::Url { url, refresh } => {
                m.insert("jwks_url".into(), url.to_string().into());
                m.insert("jwks_refresh".into(), duration_text(*refresh).into());
            }
        }
        if !self.claims.algorithms.is_empty() {
            let names = self.claims.algorithms.iter().map(|a| format!("{a:?}"));
            m.insert("algorithms".into(), names.collect::<Vec<_>>().into());
        }
        if let Some(i) = &self.claims.issuer {
            m.insert("issuer".into(), i.clone().into());
        }
        if !self.claims.audiences.is_empty() {
            m.insert("audiences".into(), self.claims.audiences.clone().into());
        }
        if !self.claims_to_headers.is_empty() {
            let pairs = self.claims_to_headers.iter();
            let t = pairs.map(|(c, h)| (c.clone(), Value::from(h.as_str())));
            m.insert("claims_to_headers".into(), Value::Object(t.collect()));
        }
        if let Some(c) = &self.token_cookie {
            m.insert("token_cookie".into(), c.clone().into());
        }
        Value::Object(m)
    }
}

/// Reads a JWK set file.
pub(crate) fn read_jwks(path: PathBuf) -> Result<Jwks, String> {
    let shown = path.display();
    let text =
        std::fs::read(&path).map_err(|e| format!("jwt.jwks_file: cannot read '{shown}': {e}"))?;
    let set = KeySet::parse(&text).map_err(|e| format!("jwt.jwks_file '{shown}': {e}"))?;
    Ok(Jwks::File {
        path,
        set: Arc::new(set),
        text: text.into(),
    })
}

/// A `jwks_url`: `https://`, or `http://` to a loopback address.
fn jwks_url(u: &str) -> Result<Uri, String> {
    let bad = |why: &str| format!("jwt.jwks_url: '{u}' {why}");
    let uri: Uri = u.parse().map_err(|_| bad("is not a URL"))?;
    let host = uri.host().ok_or_else(|| bad("has no host"))?;
    let loopback = host == "localhost"
        || (host.trim_matches(['[', ']']).parse::<std::net::IpAddr>())
            .is_ok_and(|ip| ip.is_loopback());
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if loopback => Ok(uri),
        Some("http") => Err(bad("must be https (http only to a loopback address)")),
        _ => Err(bad("must be an https:// URL")),
    }
}

/// `algorithms = ["RS256", …]`: those of [`crate::jwt::ALGORITHMS`] a route takes.
fn algorithms(v: Option<&Value>) -> Result<Vec<jsonwebtoken::Algorithm>, String> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let taken = || {
        let all = crate::jwt::ALGORITHMS.iter().map(|a| format!("{a:?}"));
        all.collect::<Vec<_>>().join(", ")
    };
    let list = v.as_array().filter(|l| !l.is_empty()).ok_or_else(|| {
        format!(
            "jwt.algorithms: expected a non-empty list such as [\"RS256\"] (of {})",
            taken()
        )
    })?;
    list.iter()
        .map(|a| {
            let name = a.as_str().map_or_else(|| a.to_string(), str::to_string);
            crate::jwt::ALGORITHMS
                .into_iter()
                .find(|x| format!("{x:?}") == name)
                .ok_or_else(|| {
                    format!(
                        "jwt.algorithms: '{name}' is not an algorithm fulcrum takes ({})",
                        taken()
                    )
                })
        })
        .collect()
}

/// The shortest `jwks_refresh`: a typo such as `"10ms"` must not turn into a flood of
/// fetches at the key server (`docs/policies.md`, "Bearer tokens (JWT)").
const MIN_JWKS_REFRESH: Duration = Duration::from_secs(1);

/// `jwks_refresh = "DURATION"`, at least [`MIN_JWKS_REFRESH`].
fn jwks_refresh(d: &str) -> Result<Duration, String> {
    let refresh = parse_positive_duration(d).map_err(|e| format!("jwt.jwks_refresh: {e}"))?;
    if refresh < MIN_JWKS_REFRESH {
        return Err(format!(
            "jwt.jwks_refresh: '{d}' is under 1s: a key server is polled at most once a second"
        ));
    }
    Ok(refresh)
}

/// `claims_to_headers = { CLAIM = "FIELD", … }`.
fn claims_to_headers(v: Option<&Value>) -> Result<Vec<(String, HeaderName)>, String> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let m = v
        .as_object()
        .ok_or("jwt.claims_to_headers: expected a table such as { sub = \"x-user-id\" }")?;
    m.iter()
        .map(|(claim, field)| {
            let field = field
                .as_str()
                .ok_or_else(|| format!("jwt.claims_to_headers.{claim}: expected a field name"))?;
            let name = request_field("jwt.claims_to_headers", field)?;
            // The token goes on unchanged: a claim cannot take its place.
            if name == http::header::AUTHORIZATION || name == http::header::COOKIE {
                return Err(format!("jwt.claims_to_headers.{claim}: '{name}' carries the token, which goes to the backend unchanged: name another field"));
            }
            Ok((claim.clone(), name))
        })
        .collect()
}

/// A field a policy writes into the request: neither framing nor hop-by-hop (the
/// framing and hop fields `field_name` refuses, and `Proxy-Authorization`), nor `Via`.
fn request_field(key: &str, name: &str) -> Result<HeaderName, String> {
    let n = super::fields::field_name(key, name)?;
    if n == http::header::PROXY_AUTHORIZATION || n == http::header::VIA {
        return Err(format!("{key}: '{n}' is a hop-by-hop field"));
    }
    Ok(n)
}

/// A route's forward auth.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ForwardAuth {
    /// Where the subrequest goes.
    pub(crate) url: Uri,
    /// Fields taken from a `2xx` answer into the request.
    pub(crate) copy_headers: Vec<HeaderName>,
    /// How long the auth service may take.
    pub(crate) timeout: Duration,
}

/// `forward_auth.timeout`'s default.
pub(crate) const FORWARD_AUTH_TIMEOUT: Duration = Duration::from_secs(5);

impl ForwardAuth {
    /// `{ url, copy_headers, timeout }`.
    pub(super) fn from_json(v: &Value) -> Result<ForwardAuth, String> {
        let example = "{ url = \"http://127.0.0.1:9100/check\", copy_headers = [\"x-user\"] }";
        let m = table(
            "forward_auth",
            v,
            &["url", "copy_headers", "timeout"],
            example,
        )?;
        let url = text(m, "forward_auth", "url")?.ok_or("forward_auth: missing 'url'")?;
        let bad = || format!("forward_auth.url: '{url}' is not an http:// or https:// URL");
        let uri: Uri = url.parse().map_err(|_| bad())?;
        let has_host = uri.host().is_some_and(|h| !h.is_empty());
        if !matches!(uri.scheme_str(), Some("http" | "https")) || !has_host {
            return Err(bad());
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(format!(
                "forward_auth.url: '{url}' has user info (not supported)"
            ));
        }
        let copy_headers = match m.get("copy_headers") {
            None => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    let name = x
                        .as_str()
                        .ok_or("forward_auth.copy_headers: expected a list of field names")?;
                    request_field("forward_auth.copy_headers", name)
                })
                .collect::<Result<_, String>>()?,
            Some(_) => {
                return Err("forward_auth.copy_headers: expected a list of field names".into())
            }
        };
        let timeout = match text(m, "forward_auth", "timeout")? {
            Some(t) => {
                parse_positive_duration(&t).map_err(|e| format!("forward_auth.timeout: {e}"))?
            }
            None => FORWARD_AUTH_TIMEOUT,
        };
        Ok(ForwardAuth {
            url: uri,
            copy_headers,
            timeout,
        })
    }

    /// As `GET /admin/routes` shows it.
    pub(super) fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("url".into(), self.url.to_string().into());
        let names = self.copy_headers.iter().map(|n| Value::from(n.as_str()));
        m.insert("copy_headers".into(), Value::Array(names.collect()));
        m.insert("timeout".into(), duration_text(self.timeout).into());
        Value::Object(m)
    }
}

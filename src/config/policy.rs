//! A route's policies as configured (`docs/policies.md`): the steps a request on that
//! route goes through beside the pool. The file's tables, `PUT /admin/routes`' and the
//! store's JSON all come down to a JSON value per key, checked here, so each key has
//! one parser and one message.
//!
//! Today: `redirect`, `allow`, `deny`, `rate_limit`, `client_cert`, `basic_auth`, `jwt`,
//! `forward_auth`, `request_headers`, `response_headers`, `compress` and `compress_types`.

use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

pub(crate) use super::auth::{ForwardAuth, Jwt};
pub(crate) use super::compress::Coding;
use super::fields::field_name;
use crate::identity::San;
use crate::ipset::IpSet;

/// The policy keys a route takes.
pub(crate) const KEYS: [&str; 12] = [
    "redirect",
    "allow",
    "deny",
    "rate_limit",
    "client_cert",
    "basic_auth",
    "jwt",
    "forward_auth",
    "request_headers",
    "response_headers",
    "compress",
    "compress_types",
];

/// A route's policies; each is optional, and a route without any runs none.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Policies {
    /// An answer sending the client elsewhere: the route has no pool.
    pub(crate) redirect: Option<Redirect>,
    /// Client addresses taken (others get `403`).
    pub(crate) allow: Option<IpSet>,
    /// Client addresses refused with `403`.
    pub(crate) deny: Option<IpSet>,
    /// Requests per key and time, over which a request is answered `429`.
    pub(crate) rate_limit: Option<RateLimit>,
    /// A verified client certificate, with one of these names: else `403`.
    pub(crate) client_cert: Option<ClientCertRule>,
    /// Users and their bcrypt hashes: a request without good credentials gets `401`.
    pub(crate) basic_auth: Option<BasicAuth>,
    /// A bearer token verified against a key set: else `401`.
    pub(crate) jwt: Option<Jwt>,
    /// An auth service asked first: its refusal is the answer.
    pub(crate) forward_auth: Option<ForwardAuth>,
    /// Fields set or removed on the way to the backend.
    pub(crate) request_headers: Option<HeaderEdits>,
    /// Fields set or removed on the backend's answer.
    pub(crate) response_headers: Option<HeaderEdits>,
    /// The codings answers are compressed with, most preferred first.
    pub(crate) compress: Option<Vec<Coding>>,
    /// Media types compressed beside the usual ones (`compress` needed).
    pub(crate) compress_types: Vec<String>,
}

impl Policies {
    /// Why a service the route's steps call (`forward_auth.url`, `jwt.jwks_url`) is
    /// this fulcrum's own listener (as `own` tells), if one is: its calls would come back as requests
    /// naming this hop, each answered `508` (`docs/operations.md`, "Loops").
    pub(crate) fn own_service(&self, own: impl Fn(&http::Uri) -> Option<String>) -> Option<String> {
        let jwks = self.jwt.as_ref().and_then(|j| match &j.keys {
            super::auth::Jwks::Url { url, .. } => Some(("jwt.jwks_url", url)),
            super::auth::Jwks::File { .. } => None,
        });
        let auth = (self.forward_auth.as_ref()).map(|f| ("forward_auth.url", &f.url));
        auth.into_iter().chain(jwks).find_map(|(key, url)| {
            let why = own(url)?;
            Some(format!("{key}: {why}"))
        })
    }

    /// Whether the route has none.
    pub(crate) fn is_empty(&self) -> bool {
        self.redirect.is_none()
            && self.allow.is_none()
            && self.deny.is_none()
            && self.rate_limit.is_none()
            && self.client_cert.is_none()
            && self.basic_auth.is_none()
            && self.jwt.is_none()
            && self.forward_auth.is_none()
            && self.request_headers.is_none()
            && self.response_headers.is_none()
            && self.compress.is_none()
            && self.compress_types.is_empty()
    }

    /// Reads the policy `key` (one of [`KEYS`]) from its value; the message names what
    /// is wrong.
    pub(crate) fn set(&mut self, key: &str, v: &Value) -> Result<(), String> {
        match key {
            "redirect" => self.redirect = Some(Redirect::from_json(v)?),
            "allow" | "deny" => {
                let set = ip_list(key, v)?;
                match key {
                    "allow" => self.allow = Some(set),
                    _ => self.deny = Some(set),
                }
            }
            "rate_limit" => self.rate_limit = Some(RateLimit::from_json(v)?),
            "client_cert" => self.client_cert = Some(ClientCertRule::from_json(v)?),
            "basic_auth" => self.basic_auth = Some(BasicAuth::from_json(v)?),
            "jwt" => self.jwt = Some(Jwt::from_json(v)?),
            "forward_auth" => self.forward_auth = Some(ForwardAuth::from_json(v)?),
            "request_headers" => self.request_headers = Some(HeaderEdits::from_json(key, v)?),
            "response_headers" => self.response_headers = Some(HeaderEdits::from_json(key, v)?),
            "compress" => self.compress = super::compress::codings_from_json(v)?,
            "compress_types" => self.compress_types = super::compress::types_from_json(v)?,
            _ => {
                return Err(format!(
                    "unknown policy '{key}' (valid: {})",
                    KEYS.join(", ")
                ))
            }
        }
        Ok(())
    }

    /// Policies that cannot go together on one route: `basic_auth` with `jwt` or
    /// `forward_auth` (each wants `Authorization`).
    pub(crate) fn conflict(&self) -> Option<&'static str> {
        match (&self.basic_auth, &self.jwt, &self.forward_auth) {
            (Some(_), Some(_), _) => {
                Some("basic_auth and jwt cannot go on one route: both read Authorization")
            }
            (Some(_), _, Some(_)) => {
                Some("basic_auth and forward_auth cannot go on one route: both read Authorization")
            }
            _ => None,
        }
    }

    /// The policies as configured, by key: what `GET /admin/routes` shows and the
    /// store keeps.
    pub(crate) fn to_json(&self) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if let Some(r) = &self.redirect {
            out.push(("redirect", r.to_json()));
        }
        for (key, set) in [("allow", &self.allow), ("deny", &self.deny)] {
            if let Some(set) = set {
                let entries = set.entries().iter().map(|e| Value::from(e.as_str()));
                out.push((key, Value::Array(entries.collect())));
            }
        }
        if let Some(r) = &self.rate_limit {
            out.push(("rate_limit", r.to_json()));
        }
        if let Some(c) = &self.client_cert {
            out.push(("client_cert", c.to_json()));
        }
        if let Some(a) = &self.basic_auth {
            out.push(("basic_auth", a.to_json()));
        }
        if let Some(j) = &self.jwt {
            out.push(("jwt", j.to_json()));
        }
        if let Some(f) = &self.forward_auth {
            out.push(("forward_auth", f.to_json()));
        }
        if let Some(e) = &self.request_headers {
            out.push(("request_headers", e.to_json()));
        }
        if let Some(e) = &self.response_headers {
            out.push(("response_headers", e.to_json()));
        }
        if let Some(c) = &self.compress {
            out.push(("compress", super::compress::codings_to_json(c)));
        }
        if !self.compress_types.is_empty() {
            let types = self.compress_types.iter().map(|t| Value::from(t.as_str()));
            out.push(("compress_types", Value::Array(types.collect())));
        }
        out
    }
}

/// `allow` or `deny`: a list of IP addresses and CIDRs.
fn ip_list(key: &str, v: &Value) -> Result<IpSet, String> {
    let expected =
        || format!("{key}: expected a list of IP addresses or CIDRs, such as [\"10.0.0.0/8\"]");
    let list = v.as_array().ok_or_else(expected)?;
    let entries = list
        .iter()
        .map(|e| e.as_str().ok_or_else(expected))
        .collect::<Result<Vec<_>, _>>()?;
    IpSet::parse(&entries).map_err(|e| format!("{key}: {e}"))
}

/// A route's client certificate rule (`docs/tls.md`, "Mutual TLS"): the connection must
/// carry a certificate `[tls.client_auth]` verified and, when `sans` has entries, one of
/// its URI or DNS names must be one of them (exactly, or below a `*.SUFFIX`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientCertRule {
    /// The names taken; empty: any verified certificate.
    pub(crate) sans: Vec<San>,
}

impl ClientCertRule {
    fn from_json(v: &Value) -> Result<ClientCertRule, String> {
        let Some(table) = v.as_object() else {
            return Err("client_cert: expected a table such as { sans = [\"spiffe://prod.example/web\", \"*.svc.example\"] } or {}".into());
        };
        let mut sans = Vec::new();
        for (k, v) in table {
            if k != "sans" {
                return Err(format!("unknown key 'client_cert.{k}' (valid: sans)"));
            }
            let list = v
                .as_array()
                .ok_or("client_cert.sans: expected a list of strings")?;
            for item in list {
                let text = item
                    .as_str()
                    .ok_or("client_cert.sans: expected a list of strings")?;
                sans.push(San::parse(text).map_err(|e| format!("client_cert.sans: {e}"))?);
            }
        }
        Ok(ClientCertRule { sans })
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if !self.sans.is_empty() {
            let sans = self.sans.iter().map(|s| Value::from(s.to_text()));
            m.insert("sans".into(), Value::Array(sans.collect()));
        }
        Value::Object(m)
    }
}

/// Basic authentication (`docs/policies.md`, "Basic auth"): the users of an htpasswd
/// file, read when the configuration is (start, reload, `PUT /admin/routes`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BasicAuth {
    /// What `WWW-Authenticate` names.
    pub(crate) realm: String,
    /// The htpasswd file, as given.
    pub(crate) users_file: std::path::PathBuf,
    /// Each user's bcrypt hash.
    pub(crate) users: std::collections::BTreeMap<String, String>,
}

impl BasicAuth {
    /// `{ realm, users_file }`; the file is read and checked now.
    fn from_json(v: &Value) -> Result<BasicAuth, String> {
        let Value::Object(m) = v else {
            return Err("basic_auth: expected a table such as { realm = \"ops\", users_file = \"/etc/fulcrum/htpasswd\" }".into());
        };
        if let Some(k) = m
            .keys()
            .find(|k| !["realm", "users_file"].contains(&k.as_str()))
        {
            return Err(format!(
                "unknown key 'basic_auth.{k}' (valid: realm, users_file)"
            ));
        }
        let text = |k: &str| match m.get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(format!("basic_auth.{k}: expected a string")),
            None => Err(format!("basic_auth: missing '{k}'")),
        };
        let realm = text("realm")?;
        let quotable = |c: char| !c.is_control() && c != '"' && c != '\\';
        if realm.is_empty() || !realm.chars().all(quotable) {
            return Err(format!(
                "basic_auth.realm: '{}' (1 or more printable characters, no quotes or backslashes)",
                realm.escape_default()
            ));
        }
        let users_file = std::path::PathBuf::from(text("users_file")?);
        let users = read_htpasswd(&users_file)?;
        Ok(BasicAuth {
            realm,
            users_file,
            users,
        })
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("realm".into(), Value::String(self.realm.clone()));
        let file = self.users_file.display().to_string();
        m.insert("users_file".into(), Value::String(file));
        Value::Object(m)
    }
}

/// The users of an htpasswd file: `USER:HASH` lines, bcrypt hashes only (`$2y$`,
/// `$2b$`, `$2a$`); blank lines and `#` comments are skipped. Another hash kind is
/// refused with its line: fulcrum checks only what it can check well.
fn read_htpasswd(
    path: &std::path::Path,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("basic_auth.users_file: cannot read '{shown}': {e}"))?;
    let mut users = std::collections::BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("basic_auth.users_file '{shown}' line {}", i + 1);
        let (user, hash) = line
            .split_once(':')
            .ok_or_else(|| format!("{}: expected USER:HASH", at()))?;
        let bcrypt =
            ["$2y$", "$2b$", "$2a$"].iter().any(|p| hash.starts_with(p)) && hash.len() == 60;
        if !bcrypt {
            return Err(format!(
                "{}: user '{user}' has a hash that is not bcrypt ($2y$, $2b$ or $2a$; make one with htpasswd -B)",
                at()
            ));
        }
        if user.is_empty() || users.insert(user.to_string(), hash.to_string()).is_some() {
            return Err(format!("{}: user '{user}' is empty or listed twice", at()));
        }
    }
    Ok(users)
}

/// The statuses a redirect may answer with.
const REDIRECT_STATUSES: [u16; 5] = [301, 302, 303, 307, 308];

/// A redirect: `status` with `Location` made from `to`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Redirect {
    /// The `Location` template, as written.
    pub(crate) to: String,
    /// Its pieces.
    pub(crate) parts: Vec<LocationPart>,
    /// 301, 302, 303, 307 or 308.
    pub(crate) status: u16,
}

/// A piece of a redirect's `Location`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LocationPart {
    /// Written as it is.
    Text(String),
    /// `http` or `https`, as the request came.
    Scheme,
    /// The authority the request is for.
    Host,
    /// The path as received.
    Path,
    /// `?` and the query, or nothing.
    Query,
}

impl Redirect {
    /// `{ to, status? }`.
    fn from_json(v: &Value) -> Result<Redirect, String> {
        let Value::Object(m) = v else {
            return Err(
                "redirect: expected a table such as { to = \"https://{host}{path}{query}\" }"
                    .into(),
            );
        };
        if let Some(k) = m.keys().find(|k| !["to", "status"].contains(&k.as_str())) {
            return Err(format!("unknown key 'redirect.{k}' (valid: to, status)"));
        }
        let to = match m.get("to") {
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err("redirect.to: expected a string".into()),
            None => return Err("redirect: missing 'to'".into()),
        };
        let status = match m.get("status") {
            None => 308,
            Some(Value::Number(n)) => match n.as_u64().map(|s| s as u16) {
                Some(s) if REDIRECT_STATUSES.contains(&s) => s,
                _ => {
                    return Err(format!(
                        "redirect.status: {n} is not one of 301, 302, 303, 307, 308"
                    ))
                }
            },
            Some(_) => return Err("redirect.status: expected 301, 302, 303, 307 or 308".into()),
        };
        let parts = location_parts(&to)?;
        Ok(Redirect { to, parts, status })
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("to".into(), Value::String(self.to.clone()));
        m.insert("status".into(), Value::from(self.status));
        Value::Object(m)
    }
}

/// The pieces of a `Location` template: text a field value may hold, and `{scheme}`,
/// `{host}`, `{path}`, `{query}`.
fn location_parts(to: &str) -> Result<Vec<LocationPart>, String> {
    let mut parts = Vec::new();
    let mut rest = to;
    while !rest.is_empty() {
        let i = rest.find('{').unwrap_or(rest.len());
        if i > 0 {
            let lit = &rest[..i];
            if HeaderValue::from_str(lit).is_err() || lit.contains(' ') {
                return Err(format!(
                    "redirect.to: '{}' is not a URL",
                    to.escape_default()
                ));
            }
            parts.push(LocationPart::Text(lit.to_string()));
        }
        rest = &rest[i..];
        if rest.is_empty() {
            break;
        }
        let end = rest
            .find('}')
            .ok_or_else(|| format!("redirect.to: an unclosed '{{' in '{to}'"))?;
        parts.push(match &rest[1..end] {
            "scheme" => LocationPart::Scheme,
            "host" => LocationPart::Host,
            "path" => LocationPart::Path,
            "query" => LocationPart::Query,
            other => {
                return Err(format!(
                    "redirect.to: unknown '{{{other}}}' (valid: {{scheme}}, {{host}}, {{path}}, {{query}})"
                ))
            }
        });
        rest = &rest[end + 1..];
    }
    if parts.is_empty() {
        return Err("redirect.to: empty".into());
    }
    Ok(parts)
}

/// The most keys a rate limit may keep.
const MAX_KEYS: u64 = 10_000_000;

/// A rate limit (GCRA: `docs/policies.md`, "Rate limits").
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RateLimit {
    /// Requests allowed per `per`, steadily.
    pub(crate) rate: u32,
    /// The period of `rate`.
    pub(crate) per: Duration,
    /// Requests allowed at once beyond the steady rate.
    pub(crate) burst: u32,
    /// What counts as one client.
    pub(crate) key: LimitKey,
    /// The most keys kept; the least recently seen goes first.
    pub(crate) max_keys: usize,
}

/// What a rate limit counts by.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LimitKey {
    /// The client's IP, trusted proxies honoured.
    ClientIp,
    /// A request field's value (a request without it counts by its client IP).
    Header(HeaderName),
    /// The whole route: one bucket.
    Route,
}

impl RateLimit {
    /// `{ rate, per?, burst?, key?, max_keys? }`.
    fn from_json(v: &Value) -> Result<RateLimit, String> {
        let Value::Object(m) = v else {
            return Err("rate_limit: expected a table such as { rate = 100, per = \"1s\" }".into());
        };
        let int = |k: &str, min: u64, max: u64| -> Result<Option<u64>, String> {
            match m.get(k) {
                None => Ok(None),
                Some(Value::Number(n)) => match n.as_u64() {
                    Some(x) if (min..=max).contains(&x) => Ok(Some(x)),
                    _ => Err(format!(
                        "rate_limit.{k}: {n} is not an integer from {min} to {max}"
                    )),
                },
                Some(_) => Err(format!("rate_limit.{k}: expected an integer")),
            }
        };
        if let Some(k) = m
            .keys()
            .find(|k| !["rate", "per", "burst", "key", "max_keys"].contains(&k.as_str()))
        {
            return Err(format!(
                "unknown key 'rate_limit.{k}' (valid: rate, per, burst, key, max_keys)"
            ));
        }
        let rate = int("rate", 1, 1_000_000_000)?.ok_or("rate_limit: missing 'rate'")?;
        let per = match m.get("per") {
            None => Duration::from_secs(1),
            Some(Value::String(s)) => super::values::parse_positive_duration(s)
                .map_err(|e| format!("rate_limit.per: {e}"))?,
            Some(_) => return Err("rate_limit.per: expected a duration such as \"1s\"".into()),
        };
        let key = match m.get("key") {
            None => LimitKey::ClientIp,
            Some(Value::String(s)) => LimitKey::parse(s)?,
            Some(_) => {
                return Err("rate_limit.key: expected client_ip, header:NAME or route".into())
            }
        };
        Ok(RateLimit {
            rate: rate as u32,
            per,
            burst: int("burst", 0, 1_000_000_000)?.unwrap_or(0) as u32,
            key,
            max_keys: int("max_keys", 1, MAX_KEYS)?.unwrap_or(100_000) as usize,
        })
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("rate".into(), Value::from(self.rate));
        m.insert(
            "per".into(),
            Value::String(super::values::duration_text(self.per)),
        );
        m.insert("burst".into(), Value::from(self.burst));
        m.insert("key".into(), Value::String(self.key.to_text()));
        m.insert("max_keys".into(), Value::from(self.max_keys as u64));
        Value::Object(m)
    }
}

impl LimitKey {
    fn parse(s: &str) -> Result<LimitKey, String> {
        match s {
            "client_ip" => Ok(LimitKey::ClientIp),
            "route" => Ok(LimitKey::Route),
            _ => match s
                .strip_prefix("header:")
                .map(|n| HeaderName::from_bytes(n.as_bytes()))
            {
                Some(Ok(n)) => Ok(LimitKey::Header(n)),
                _ => Err(format!(
                    "invalid rate_limit.key '{s}' (valid: client_ip, header:NAME, route)"
                )),
            },
        }
    }

    fn to_text(&self) -> String {
        match self {
            LimitKey::ClientIp => "client_ip".into(),
            LimitKey::Header(n) => format!("header:{n}"),
            LimitKey::Route => "route".into(),
        }
    }
}

/// Fields to set (replacing any of the same name) and to remove.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HeaderEdits {
    /// Removed first.
    pub(crate) remove: Vec<HeaderName>,
    /// Then set, in order.
    pub(crate) set: Vec<(HeaderName, Template)>,
}

impl HeaderEdits {
    /// `{ "set": { NAME: VALUE, … }, "remove": [NAME, …] }`, both optional.
    fn from_json(key: &str, v: &Value) -> Result<HeaderEdits, String> {
        let Value::Object(m) = v else {
            return Err(format!(
                "{key}: expected a table such as {{ set = {{ \"x-env\" = \"prod\" }}, remove = [\"x-debug\"] }}"
            ));
        };
        let mut edits = HeaderEdits {
            remove: Vec::new(),
            set: Vec::new(),
        };
        for (k, v) in m {
            match (k.as_str(), v) {
                ("set", Value::Object(fields)) => {
                    for (name, value) in fields {
                        let Value::String(text) = value else {
                            return Err(format!("{key}.set.{name}: expected a string"));
                        };
                        let name = field_name(key, name)?;
                        let t =
                            Template::parse(text).map_err(|e| format!("{key}.set.{name}: {e}"))?;
                        edits.set.push((name, t));
                    }
                }
                ("remove", Value::Array(names)) => {
                    for n in names {
                        let Value::String(n) = n else {
                            return Err(format!("{key}.remove: expected a list of names"));
                        };
                        edits.remove.push(field_name(key, n)?);
                    }
                }
                ("set", _) => {
                    return Err(format!("{key}.set: expected a table of names and values"))
                }
                ("remove", _) => return Err(format!("{key}.remove: expected a list of names")),
                (other, _) => {
                    return Err(format!("unknown key '{key}.{other}' (valid: set, remove)"))
                }
            }
        }
        Ok(edits)
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if !self.set.is_empty() {
            let set = (self.set.iter())
                .map(|(n, t)| (n.to_string(), Value::String(t.text.clone())))
                .collect();
            m.insert("set".into(), Value::Object(set));
        }
        if !self.remove.is_empty() {
            let names = self.remove.iter().map(|n| Value::String(n.to_string()));
            m.insert("remove".into(), Value::Array(names.collect()));
        }
        Value::Object(m)
    }
}

/// A field value with `{client_ip}`, `{request_id}` and `{host}` in it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Template {
    /// As written.
    text: String,
    /// The pieces, in order.
    pub(crate) parts: Vec<Part>,
}

/// A piece of a [`Template`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Part {
    /// Written as it is.
    Text(HeaderValue),
    /// The client's IP (as the forwarding fields name it, trusted proxies honoured).
    ClientIp,
    /// The request's `X-Request-Id`.
    RequestId,
    /// The authority the request is for.
    Host,
}

impl Template {
    /// Reads a value; an unknown `{name}` or a byte a field value cannot hold is refused.
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let (lit, after) = match rest.find('{') {
                Some(i) => (&rest[..i], Some(&rest[i..])),
                None => (rest, None),
            };
            if !lit.is_empty() {
                let v = HeaderValue::from_str(lit)
                    .map_err(|_| format!("invalid header value '{}'", text.escape_default()))?;
                parts.push(Part::Text(v));
            }
            let Some(after) = after else { break };
            let end = after
                .find('}')
                .ok_or_else(|| format!("an unclosed '{{' in '{text}'"))?;
            parts.push(match &after[1..end] {
                "client_ip" => Part::ClientIp,
                "request_id" => Part::RequestId,
                "host" => Part::Host,
                other => {
                    return Err(format!(
                        "unknown '{{{other}}}' (valid: {{client_ip}}, {{request_id}}, {{host}})"
                    ))
                }
            });
            rest = &after[end + 1..];
        }
        Ok(Template {
            text: text.to_string(),
            parts,
        })
    }

    /// The value as written, when it holds no `{…}`.
    pub(crate) fn fixed(&self) -> Option<&HeaderValue> {
        match self.parts.as_slice() {
            [Part::Text(v)] => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn header_edits_are_checked_and_shown_as_given() {
        let mut p = Policies::default();
        let v = json!({"set": {"x-env": "prod", "x-client": "{client_ip} via {host}"}, "remove": ["Server"]});
        p.set("response_headers", &v).unwrap();
        let e = p.response_headers.as_ref().unwrap();
        assert_eq!(e.remove, [HeaderName::from_static("server")]);
        // In name order (a JSON object's).
        assert_eq!(e.set[1].1.fixed(), Some(&HeaderValue::from_static("prod")));
        assert_eq!(
            e.set[0].1.parts[1..],
            [Part::Text(HeaderValue::from_static(" via ")), Part::Host]
        );
        let shown = p.to_json();
        assert_eq!(shown[0].1["set"]["x-env"], "prod");
        let mut again = Policies::default();
        again.set("response_headers", &shown[0].1).unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn framing_fields_and_bad_templates_are_refused() {
        for (v, why) in [
            (json!({"set": {"content-length": "1"}}), "cannot be set"),
            (json!({"remove": ["Via"]}), "'via' cannot be set or removed"),
            (
                json!({"set": {"X-Fulcrum-Mirror": "1"}}),
                "'x-fulcrum-mirror' cannot be set",
            ),
            (
                json!({"remove": ["Transfer-Encoding"]}),
                "cannot be set or removed",
            ),
            (json!({"set": {"x-a": "{nope}"}}), "unknown '{nope}'"),
            (json!({"set": {"x-a": "{host"}}), "unclosed"),
            (json!({"set": {"x a": "1"}}), "invalid header name"),
            (json!({"add": {}}), "request_headers.add"),
            (json!("x"), "expected a table"),
        ] {
            let e = Policies::default().set("request_headers", &v).unwrap_err();
            assert!(e.contains(why), "{v}: {e}");
        }
        assert!(Policies::default().set("limit", &json!({})).is_err());
    }

    #[test]
    fn redirects_are_checked_and_shown_as_given() {
        let mut p = Policies::default();
        let v = json!({"to": "https://new.example.com{path}{query}"});
        p.set("redirect", &v).unwrap();
        let r = p.redirect.clone().unwrap();
        assert_eq!(r.status, 308);
        assert_eq!(r.parts[1..], [LocationPart::Path, LocationPart::Query]);
        let mut again = Policies::default();
        again.set("redirect", &p.to_json()[0].1).unwrap();
        assert_eq!(again, p);
        for (v, why) in [
            (json!({"to": "x", "status": 200}), "redirect.status"),
            (json!({"to": "{nope}"}), "unknown '{nope}'"),
            (json!({"status": 301}), "missing 'to'"),
            (json!({"to": "a b"}), "not a URL"),
            (json!({"to": "x", "code": 301}), "redirect.code"),
        ] {
            let e = Policies::default().set("redirect", &v).unwrap_err();
            assert!(e.contains(why), "{v}: {e}");
        }
    }

    #[test]
    fn rate_limits_are_checked_and_shown_as_given() {
        let mut p = Policies::default();
        let v = json!({"rate": 100, "per": "1s", "burst": 50, "key": "header:X-Api-Key"});
        p.set("rate_limit", &v).unwrap();
        let r = p.rate_limit.clone().unwrap();
        assert_eq!((r.rate, r.burst, r.max_keys), (100, 50, 100_000));
        assert_eq!(
            r.key,
            LimitKey::Header(HeaderName::from_static("x-api-key"))
        );
        let mut again = Policies::default();
        again.set("rate_limit", &p.to_json()[0].1).unwrap();
        assert_eq!(again, p);
        for (v, why) in [
            (json!({"rate": 0}), "rate_limit.rate"),
            (json!({"per": "1s"}), "missing 'rate'"),
            (json!({"rate": 1, "per": "1 s"}), "rate_limit.per"),
            (json!({"rate": 1, "per": "0s"}), "greater than zero"),
            (json!({"rate": 1, "key": "cookie:x"}), "rate_limit.key"),
            (json!({"rate": 1, "max_keys": 0}), "rate_limit.max_keys"),
            (json!({"rate": 1, "burts": 2}), "rate_limit.burts"),
        ] {
            let e = Policies::default().set("rate_limit", &v).unwrap_err();
            assert!(e.contains(why), "{v}: {e}");
        }
    }
}

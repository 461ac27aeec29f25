//! Pools and routes as configured (`docs/routing.md`).
//!
//! A `[[pools]]` entry names a pool and gives the settings it has of its own; every key
//! it leaves out takes the top-level value (file, then flags), then the built-in
//! default. So an entry is kept as a [`PoolDraft`] — its own values, already checked —
//! and made into a [`PoolSpec`] once the top-level values are final. Without
//! `[[pools]]` the top-level settings form the one pool `default`, with a route that
//! takes everything: the single-pool form.

use http::header::{HeaderName, HeaderValue};
use http::Method;

use serde::{Deserialize, Serialize};

use super::options;
pub(crate) use super::pool_settings::PoolSettings;
use super::tcp::PoolMode;
use super::{BackendSpec, RawFlags, Settings};
use crate::route::{HostPattern, PathPrefix, Route};

/// The pool of the single-pool form.
pub(crate) const DEFAULT_POOL: &str = "default";

/// The most routes a list may hold: building the table costs routes × host names, and
/// it is built on the admin thread, beside the health checks.
pub(crate) const MAX_ROUTES: usize = 4096;

/// Longest pool name.
const MAX_POOL_NAME: usize = 64;

/// A pool: its name, its settings, its backends in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolSpec {
    /// `[a-z0-9_-]{1,64}`, unique.
    pub(crate) name: String,
    /// Its own settings.
    pub(crate) settings: PoolSettings,
    /// Its backends, in order.
    pub(crate) backends: Vec<BackendSpec>,
    /// Where its backends come from instead (`docs/discovery.md`).
    pub(crate) discover: Option<super::DiscoverSpec>,
}

/// A `[[pools]]` entry before the top-level values it builds on are final.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolDraft {
    /// The pool's name.
    pub(crate) name: String,
    /// Its own option values (keys of the options table), each already checked.
    pub(crate) values: Vec<(&'static str, String)>,
    /// Its backends.
    pub(crate) backends: Vec<BackendSpec>,
    /// Where its backends come from instead.
    pub(crate) discover: Option<super::DiscoverSpec>,
    /// What it carries (`mode`), and the keys that go with it.
    pub(crate) modes: super::tcp::ModeKeys,
}

/// A route as configured: conditions and the pool they send to, by name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RouteSpec {
    /// The pool's name; empty for a redirect route, which has none, and for a split
    /// route, whose pools are its sides'.
    pub(crate) pool: String,
    /// The pools it shares its requests among instead (`docs/traffic.md`, "Splits").
    pub(crate) split: Option<super::split::SplitSpec>,
    /// The pool a share of its requests is copied to (`docs/traffic.md`, "Mirrors").
    pub(crate) mirror: Option<super::mirror::MirrorSpec>,
    /// Host condition.
    pub(crate) host: Option<HostPattern>,
    /// Path condition.
    pub(crate) path_prefix: Option<PathPrefix>,
    /// Methods taken; empty takes any.
    pub(crate) methods: Vec<Method>,
    /// Fields that must be present with exactly these values.
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    /// Forward the path without the prefix.
    pub(crate) strip_path_prefix: bool,
    /// What a request on it goes through beside the pool (`docs/policies.md`).
    pub(crate) policies: super::policy::Policies,
}

impl RouteSpec {
    /// The names of the pools it sends to: its pool, or its split's sides (none for a
    /// redirect), then its mirror's.
    pub(crate) fn pools(&self) -> impl Iterator<Item = &str> {
        let sides = self.split.iter().flat_map(|s| s.sides.iter());
        let pool = (!self.pool.is_empty()).then_some(self.pool.as_str());
        let mirror = self.mirror.iter().map(|m| m.pool.as_str());
        pool.into_iter()
            .chain(sides.map(|s| s.pool.as_str()))
            .chain(mirror)
    }

    /// Whether it sends to the pool `name`.
    pub(crate) fn names_pool(&self, name: &str) -> bool {
        self.pools().any(|p| p == name)
    }

    /// Whether `other` has the same conditions (what keeps a route's running figures
    /// across a change of the routes).
    pub(crate) fn same_conditions(&self, other: &RouteSpec) -> bool {
        self.host == other.host
            && self.path_prefix == other.path_prefix
            && self.methods == other.methods
            && self.headers == other.headers
    }

    /// A route without conditions, to `pool`.
    pub(crate) fn catch_all(pool: &str) -> RouteSpec {
        RouteSpec {
            pool: pool.to_string(),
            split: None,
            mirror: None,
            host: None,
            path_prefix: None,
            methods: Vec::new(),
            headers: Vec::new(),
            strip_path_prefix: false,
            policies: Default::default(),
        }
    }

    /// The route to the pool at index `pool`.
    pub(crate) fn to_route(&self, pool: usize) -> Route {
        Route {
            pool,
            host: self.host.clone(),
            path_prefix: self.path_prefix.clone(),
            methods: self.methods.clone(),
            headers: self.headers.clone(),
            strip_path_prefix: self.strip_path_prefix,
        }
    }
}

/// The raw conditions of a route, as the file or the admin API gives them.
#[derive(Debug, Default)]
pub(crate) struct RouteText {
    /// The pool's name.
    pub(crate) pool: String,
    /// `split`'s sides.
    pub(crate) split: Option<Vec<super::split::Side>>,
    /// `split_key`.
    pub(crate) split_key: Option<super::HashKey>,
    /// `mirror`.
    pub(crate) mirror: Option<super::mirror::MirrorSpec>,
    /// `api.example.com` or `*.example.com`.
    pub(crate) host: Option<String>,
    /// `/v1`.
    pub(crate) path_prefix: Option<String>,
    /// Method names.
    pub(crate) methods: Vec<String>,
    /// Field name → exact value.
    pub(crate) headers: Vec<(String, String)>,
    /// Strip the prefix when forwarding.
    pub(crate) strip_path_prefix: bool,
    /// Its policies, each already checked.
    pub(crate) policies: super::policy::Policies,
}

/// Why a route with both `redirect` and `pool` is refused.
pub(crate) const REDIRECT_AND_POOL: &str =
    "a route with a redirect has no pool: it answers every request itself";

/// Why a route with a redirect and another policy is refused.
const REDIRECT_ALONE: &str =
    "a route with a redirect answers every request itself: no other policy runs on it";

/// `p` with its redirect alone.
fn only_redirect(p: &super::policy::Policies) -> super::policy::Policies {
    super::policy::Policies {
        redirect: p.redirect.clone(),
        ..Default::default()
    }
}

/// Why a route with both `pool` and `split` is refused.
pub(crate) const SPLIT_AND_POOL: &str =
    "a route with a split has no pool: its sides name the pools (split = [{ pool, weight }, …])";

/// Checks a route's conditions; the message names what is wrong.
pub(crate) fn route_spec(t: RouteText) -> Result<RouteSpec, String> {
    // A redirect answers itself: its route names no pool and runs no other step.
    let redirect = t.policies.redirect.is_some();
    match (redirect, t.pool.is_empty(), t.split.is_some()) {
        (true, false, _) | (true, _, true) => return Err(REDIRECT_AND_POOL.into()),
        (true, true, false) if t.mirror.is_some() => return Err(REDIRECT_ALONE.into()),
        (true, true, false) if t.policies != only_redirect(&t.policies) => {
            return Err(REDIRECT_ALONE.into());
        }
        (true, true, false) => {}
        (false, false, true) => return Err(SPLIT_AND_POOL.into()),
        (false, true, true) => {}
        (false, _, false) => check_pool_name(&t.pool)?,
    }
    if t.split_key.is_some() && t.split.is_none() {
        return Err("split_key needs a split".into());
    }
    for side in t.split.iter().flatten() {
        check_pool_name(&side.pool).map_err(|e| format!("invalid split: {e}"))?;
    }
    if let Some(m) = &t.mirror {
        check_pool_name(&m.pool).map_err(|e| format!("invalid mirror: {e}"))?;
    }
    let host = t.host.as_deref().map(HostPattern::parse).transpose()?;
    let path_prefix = t
        .path_prefix
        .as_deref()
        .map(PathPrefix::parse)
        .transpose()?;
    if let Some(why) = t.policies.conflict() {
        return Err(why.into());
    }
    if !t.policies.compress_types.is_empty() && t.policies.compress.is_none() {
        return Err("compress_types needs compress".into());
    }
    if t.strip_path_prefix && path_prefix.is_none() {
        return Err("strip_path_prefix needs a path_prefix".into());
    }
    let methods = check_methods(&t.methods)?;
    let headers = check_fields(&t.headers)?;
    let split = (t.split).map(|sides| super::split::SplitSpec {
        sides,
        key: t.split_key,
    });
    Ok(RouteSpec {
        pool: t.pool,
        split,
        mirror: t.mirror,
        host,
        path_prefix,
        methods,
        headers,
        strip_path_prefix: t.strip_path_prefix,
        policies: t.policies,
    })
}

/// Method names, in any case.
pub(crate) fn check_methods(names: &[String]) -> Result<Vec<Method>, String> {
    names
        .iter()
        .map(|m| {
            let upper = m.to_ascii_uppercase();
            Method::from_bytes(upper.as_bytes()).map_err(|_| format!("invalid method '{m}'"))
        })
        .collect()
}

/// Header names and the exact values a route wants.
pub(crate) fn check_fields(
    fields: &[(String, String)],
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    fields
        .iter()
        .map(|(n, v)| {
            let name = HeaderName::from_bytes(n.as_bytes())
                .map_err(|_| format!("invalid header name '{n}'"))?;
            let value =
                HeaderValue::from_str(v).map_err(|_| format!("invalid value of header '{n}'"))?;
            Ok((name, value))
        })
        .collect()
}

/// `[a-z0-9_-]{1,64}`.
pub(crate) fn check_pool_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_POOL_NAME
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid pool name '{name}' (expected 1 to {MAX_POOL_NAME} characters of a-z, 0-9, _ and -)"
        ))
    }
}

/// The option `key` names, when a pool may set it.
pub(crate) fn pool_option(key: &str) -> Option<&'static options::Opt> {
    options::find(key).filter(|o| o.per_pool())
}

/// The message for a key, written `shown`, that a pool may not set.
pub(crate) fn not_per_pool(shown: &str) -> String {
    let keys: Vec<&str> = options::pool_options().map(|o| o.key).collect();
    format!(
        "'{shown}' is not a per-pool key (valid: name, {}, health, outlier, sticky, hedge, backends, discover, mode, idle_timeout)",
        keys.join(", ")
    )
}

/// Checks a pool's own values (per-pool keys of the options table) as a `[[pools]]` entry or
/// `POST /admin/pools` gives them; returns the first problem, naming the key.
pub(crate) fn check_pool_value(key: &str, value: &str) -> Result<&'static str, String> {
    let o = pool_option(key).ok_or_else(|| not_per_pool(key))?;
    let mut scratch = Settings::default();
    (o.set)(&mut scratch, value)?;
    Ok(o.key)
}

/// A route as the API shows and takes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouteView {
    /// Left out for a redirect route, which has none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pool: String,
    /// The pools it shares its requests among instead (`docs/traffic.md`, "Splits").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    split: Option<serde_json::Value>,
    /// What keeps a client on one side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    split_key: Option<serde_json::Value>,
    /// The pool a share of its requests is copied to (`docs/traffic.md`, "Mirrors").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mirror: Option<serde_json::Value>,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    path_prefix: Option<String>,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    strip_path_prefix: bool,
    /// The answer it sends instead of a pool (`docs/policies.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redirect: Option<serde_json::Value>,
    /// Client addresses taken (others get 403).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allow: Option<serde_json::Value>,
    /// Client addresses refused with 403.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deny: Option<serde_json::Value>,
    /// Requests per key and time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rate_limit: Option<serde_json::Value>,
    /// The client certificate it asks for (`docs/tls.md`, "Mutual TLS").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_cert: Option<serde_json::Value>,
    /// Its realm and users file (never the file's content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    basic_auth: Option<serde_json::Value>,
    /// Its bearer-token check (`docs/policies.md`, "Bearer tokens (JWT)").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jwt: Option<serde_json::Value>,
    /// Its auth service (`docs/policies.md`, "Forward auth").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    forward_auth: Option<serde_json::Value>,
    /// Fields set or removed on the way to the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request_headers: Option<serde_json::Value>,
    /// Fields set or removed on the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    response_headers: Option<serde_json::Value>,
    /// The codings answers are compressed with (`true`: zstd, br, gzip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compress: Option<serde_json::Value>,
    /// Media types compressed beside the usual ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compress_types: Option<serde_json::Value>,
    /// Requests it took (shown; ignored when given).
    #[serde(default)]
    requests: u64,
    /// Requests its rate limit answered `429` (shown for a route with one; ignored when
    /// given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rate_limited: Option<u64>,
    /// What its `jwt` and `forward_auth` did (shown for a route with either; ignored
    /// when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    access: Option<serde_json::Value>,
    /// Requests each side of its split took, by pool (shown for a split route; ignored
    /// when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    split_taken: Option<std::collections::BTreeMap<String, u64>>,
    /// What its mirror did and, with `compare`, its figures and verdict (shown for a
    /// mirrored route, as `GET /admin/routes/{index}/mirror`; ignored when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mirror_figures: Option<serde_json::Value>,
}

impl RouteView {
    /// The view of `r`, which took `requests`.
    pub(crate) fn of(r: &RouteSpec, requests: u64) -> RouteView {
        let split = r.split.as_ref();
        RouteView {
            pool: r.pool.clone(),
            split: split.map(|s| s.sides_json()),
            split_key: (split.and_then(|s| s.key.as_ref()))
                .map(|k| super::split::key_text(k).into()),
            mirror: r.mirror.as_ref().map(super::mirror::MirrorSpec::to_json),
            host: r.host.as_ref().map(|h| h.to_text()),
            path_prefix: r.path_prefix.as_ref().map(|p| p.as_str().to_string()),
            methods: r.methods.iter().map(|m| m.as_str().to_string()).collect(),
            headers: r
                .headers
                .iter()
                .map(|(n, v)| {
                    let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                    (n.as_str().to_string(), value)
                })
                .collect(),
            strip_path_prefix: r.strip_path_prefix,
            redirect: None,
            allow: None,
            deny: None,
            rate_limit: None,
            client_cert: None,
            basic_auth: None,
            jwt: None,
            forward_auth: None,
            request_headers: None,
            response_headers: None,
            compress: None,
            compress_types: None,
            requests,
            rate_limited: None,
            access: None,
            split_taken: None,
            mirror_figures: None,
        }
        .with_policies(&r.policies)
    }

    /// With the count of requests its rate limit refused, when it has one.
    pub(crate) fn with_rate_limited(mut self, n: u64) -> RouteView {
        if self.rate_limit.is_some() {
            self.rate_limited = Some(n);
        }
        self
    }

    /// With the requests each side of its split took (`None`: it does not split).
    pub(crate) fn with_split_taken(mut self, taken: Option<Vec<(&str, u64)>>) -> RouteView {
        self.split_taken = taken.map(|t| t.into_iter().map(|(p, n)| (p.to_string(), n)).collect());
        self
    }

    /// With what its mirror did (`None`: it has none).
    pub(crate) fn with_mirror_figures(mut self, figures: Option<serde_json::Value>) -> RouteView {
        self.mirror_figures = figures;
        self
    }

    /// With what its access steps did (`None`: it has none that count).
    pub(crate) fn with_access(mut self, access: Option<serde_json::Value>) -> RouteView {
        self.access = access;
        self
    }

    fn with_policies(mut self, p: &super::policy::Policies) -> RouteView {
        for (key, v) in p.to_json() {
            match key {
                "redirect" => self.redirect = Some(v),
                "allow" => self.allow = Some(v),
                "deny" => self.deny = Some(v),
                "rate_limit" => self.rate_limit = Some(v),
                "client_cert" => self.client_cert = Some(v),
                "basic_auth" => self.basic_auth = Some(v),
                "jwt" => self.jwt = Some(v),
                "forward_auth" => self.forward_auth = Some(v),
                "request_headers" => self.request_headers = Some(v),
                "response_headers" => self.response_headers = Some(v),
                "compress" => self.compress = Some(v),
                _ => self.compress_types = Some(v),
            }
        }
        self
    }

    /// The route it describes, checked.
    pub(crate) fn spec(self) -> Result<RouteSpec, String> {
        let mut policies = super::policy::Policies::default();
        for (key, v) in [
            ("redirect", &self.redirect),
            ("allow", &self.allow),
            ("deny", &self.deny),
            ("rate_limit", &self.rate_limit),
            ("client_cert", &self.client_cert),
            ("basic_auth", &self.basic_auth),
            ("jwt", &self.jwt),
            ("forward_auth", &self.forward_auth),
            ("request_headers", &self.request_headers),
            ("response_headers", &self.response_headers),
            ("compress", &self.compress),
            ("compress_types", &self.compress_types),
        ] {
            if let Some(v) = v {
                policies.set(key, v)?;
            }
        }
        route_spec(RouteText {
            pool: self.pool,
            split: self.split.as_ref().map(super::split::sides).transpose()?,
            split_key: self.split_key.as_ref().map(super::split::key).transpose()?,
            mirror: self.mirror.as_ref().map(super::mirror::parse).transpose()?,
            host: self.host,
            path_prefix: self.path_prefix,
            methods: self.methods,
            headers: self.headers.into_iter().collect(),
            strip_path_prefix: self.strip_path_prefix,
            policies,
        })
    }
}

/// A pool's own values from a JSON object (a `POST /admin/pools` body, a pool's value
/// in the store), checked as the file's would be; the keys in `skip` are the caller's.
/// The `health`, `outlier` and `sticky` tables may be nested objects, as in the file.
pub(crate) fn values_of_json(
    fields: &serde_json::Map<String, serde_json::Value>,
    skip: &[&str],
) -> Result<Vec<(&'static str, String)>, String> {
    use serde_json::Value;
    let mut values = Vec::new();
    for (key, v) in fields {
        match key.as_str() {
            k if skip.contains(&k) => {}
            table @ ("health" | "outlier" | "sticky" | "hedge") => {
                let Value::Object(h) = v else {
                    return Err(format!("invalid {table}: expected an object"));
                };
                for (k, hv) in h {
                    let o = options::find_in(table, k).ok_or_else(|| {
                        options::unknown_table_key(table, &format!("{table}.{k}"))
                    })?;
                    values.push(json_value(o.key, hv)?);
                }
            }
            k => values.push(json_value(k, v)?),
        }
    }
    Ok(values)
}

/// One per-pool value given in JSON, checked.
fn json_value(key: &str, v: &serde_json::Value) -> Result<(&'static str, String), String> {
    use serde_json::Value;
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Object(m) => object_pairs(m)
            .ok_or_else(|| format!("invalid {key}: expected an object of strings and numbers"))?,
        _ => return Err(format!("invalid {key}: expected a string or a number")),
    };
    let k = check_pool_value(key, &text).map_err(|e| format!("{key}: {e}"))?;
    Ok((k, text))
}

/// An object of plain values as `key=value` pairs joined with commas (what a
/// `FileType::Pairs` option parses); `None` when a value is not a string, a number or a
/// boolean, or holds a comma.
fn object_pairs(m: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    use serde_json::Value;
    let mut out = Vec::new();
    for (k, v) in m {
        let text = match v {
            Value::String(s) if !s.contains(',') => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => return None,
        };
        out.push(format!("{k}={text}"));
    }
    Some(out.join(","))
}

/// The pool `draft` over the top-level settings `top`.
pub(crate) fn pool_spec(top: &Settings, draft: &PoolDraft) -> PoolSpec {
    let mut s = top.clone();
    for (key, value) in &draft.values {
        if let Some(o) = options::find(key) {
            // Checked when the draft was made (`check_pool_value`).
            let _ = (o.set)(&mut s, value);
        }
    }
    let m = &draft.modes;
    s.pool.mode = m.mode;
    s.pool.idle_timeout = m.idle_timeout.unwrap_or(super::tcp::DEFAULT_IDLE_TIMEOUT);
    // A TCP pool checks by connecting unless it says otherwise.
    s.pool.health.kind = m.health_kind.unwrap_or(match m.mode {
        super::tcp::PoolMode::Http => super::tcp::HealthKind::Http,
        super::tcp::PoolMode::Tcp => super::tcp::HealthKind::Tcp,
    });
    PoolSpec {
        name: draft.name.clone(),
        settings: s.pool,
        backends: draft.backends.clone(),
        discover: draft.discover.clone(),
    }
}

/// Makes `s.pools` and `s.routes` from the drafts and the final top-level values:
/// the single-pool form without `[[pools]]`. `--backend` and `--strategy` apply to the
/// first pool.
pub(crate) fn materialize(s: &mut Settings, flags: &RawFlags) {
    if s.pool_drafts.is_empty() {
        s.pools = vec![PoolSpec {
            name: DEFAULT_POOL.into(),
            settings: s.pool.clone(),
            backends: s.backends.clone(),
            discover: s.discover.clone(),
        }];
    } else {
        s.pools = s.pool_drafts.iter().map(|d| pool_spec(s, d)).collect();
        if let Some(first) = s.pools.first_mut() {
            if !flags.backend.is_empty() {
                first.backends = s.backends.clone();
            }
            if flags.discover.is_some() {
                first.discover = s.discover.clone();
            }
            if flags.values.iter().any(|(k, _)| *k == "strategy") {
                first.settings.strategy = s.pool.strategy;
            }
        }
    }
    if s.routes.is_empty() {
        // TCP pools take connections, never routes.
        let http = s.pools.iter().find(|p| p.settings.mode == PoolMode::Http);
        if let Some(first) = http {
            s.routes = vec![RouteSpec::catch_all(&first.name)];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StrategyKind;

    #[test]
    fn pool_names() {
        for ok in ["api", "web-1", "a_b", &"x".repeat(64)] {
            assert!(check_pool_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Api", "a b", "a.b", &"x".repeat(65)] {
            let e = check_pool_name(bad).unwrap_err();
            assert!(e.contains("a-z"), "{e}");
        }
    }

    #[test]
    fn routes_are_checked_whole() {
        let t = |f: &dyn Fn(&mut RouteText)| {
            let mut r = RouteText {
                pool: "api".into(),
                ..Default::default()
            };
            f(&mut r);
            route_spec(r)
        };
        assert!(t(&|_| {}).is_ok());
        assert!(t(&|r| r.host = Some("*.example.com".into())).is_ok());
        assert!(t(&|r| r.host = Some("a.example.com:80".into())).is_err());
        assert!(t(&|r| r.path_prefix = Some("v1".into())).is_err());
        assert!(t(&|r| r.strip_path_prefix = true).is_err());
        assert!(t(&|r| r.methods = vec!["get".into()]).is_ok());
        assert!(t(&|r| r.methods = vec!["G T".into()]).is_err());
        assert!(t(&|r| r.headers = vec![("x y".into(), "1".into())]).is_err());
        let side = |pool: &str| super::super::split::Side {
            pool: pool.into(),
            weight: 1,
        };
        let split = |r: &mut RouteText, p: &str| {
            r.pool.clear();
            r.split = Some(vec![side(p)]);
        };
        assert!(t(&|r| split(r, "v1")).is_ok());
        assert!(t(&|r| split(r, "V 1")).unwrap_err().contains("a-z"));
        let m = t(&|r| r.methods = vec!["get".into()]).unwrap();
        assert_eq!(m.methods, [Method::GET]);
    }

    #[test]
    fn a_pool_takes_the_top_level_values_it_does_not_set() {
        let mut top = Settings::default();
        top.pool.retries = 5;
        top.pool.strategy = StrategyKind::LeastConnections;
        let d = PoolDraft {
            name: "api".into(),
            values: vec![("retries", "1".into())],
            backends: vec![],
            discover: None,
            modes: Default::default(),
        };
        let p = pool_spec(&top, &d);
        assert_eq!(p.settings.retries, 1);
        assert_eq!(p.settings.strategy, StrategyKind::LeastConnections);
        assert!(check_pool_value("listen", "127.0.0.1:1").is_err());
        assert!(check_pool_value("retries", "x").is_err());
        assert_eq!(check_pool_value("health_path", "/hz"), Ok("health_path"));
    }
}

//! The config file's `[[pools]]` and `[[routes]]` lists (`docs/routing.md`), each value
//! checked with its line, and the checks that concern them together: a route naming an
//! unknown pool, a pool no route names, several pools and no routes, a name twice.

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::collector::Collector;
use super::file_backends::{read_backends, read_discover};
use super::options::{self, FileType};
use super::pools::MAX_ROUTES;
use super::pools::{self, PoolDraft, RouteText, DEFAULT_POOL};
use super::Settings;
use crate::route::{HostPattern, PathPrefix};

/// Keys of a `[[routes]]` entry, beside its policies ([`super::policy::KEYS`]).
const ROUTE_KEYS: [&str; 9] = [
    "pool",
    "split",
    "split_key",
    "mirror",
    "host",
    "path_prefix",
    "methods",
    "headers",
    "strip_path_prefix",
];

/// Whether `key` is one a `[[routes]]` entry takes.
fn route_key(key: &str) -> bool {
    ROUTE_KEYS.contains(&key) || super::policy::KEYS.contains(&key)
}

/// Where the file put what the whole-file checks look at (byte offsets).
#[derive(Debug, Default)]
pub(super) struct Layout {
    /// The top-level `backends` key.
    pub(super) backends_at: Option<usize>,
    /// The top-level `discover` key.
    pub(super) discover_at: Option<usize>,
    /// Each pool's name and where it is.
    pub(super) pools: Vec<(String, usize)>,
    /// Each route's pool and where it is named.
    pub(super) routes: Vec<(String, usize)>,
    /// The first route's `client_cert`, which needs `[tls.client_auth]`.
    pub(super) client_cert_at: Option<usize>,
    /// The names of the TCP pools (`mode = "tcp"`).
    pub(super) tcp_pools: Vec<String>,
    /// Each TCP listener's and passthrough name's pool, where it is named, and which
    /// of the two names it.
    pub(super) tcp_users: Vec<(String, usize, &'static str)>,
}

/// The `[[pools]]` list: each entry becomes a [`PoolDraft`].
pub(super) fn apply_pools(
    s: &mut Settings,
    c: &mut Collector<'_>,
    value: &Spanned<DeValue<'_>>,
    layout: &mut Layout,
) {
    let Some(list) = value.get_ref().as_array() else {
        let msg = "expected a list of tables ([[pools]])".into();
        c.push(value.span().start, Some("pools"), msg);
        return;
    };
    for entry in list {
        let Some(table) = entry.get_ref().as_table() else {
            c.push(entry.span().start, Some("pools"), "expected a table".into());
            continue;
        };
        let (draft, named) = read_pool(c, entry.span().start, table);
        let tcp = mode_of(table) == Some(super::tcp::PoolMode::Tcp);
        if let (Some((name, _)), true) = (&named, tcp) {
            layout.tcp_pools.push(name.clone());
        }
        // A pool with a bad value still has its name: routes to it are not "unknown".
        if let Some(named) = named {
            layout.pools.push(named);
        }
        if let Some(draft) = draft {
            s.pool_drafts.push(draft);
        }
    }
}

/// One `[[pools]]` entry when every value is good; and its name and where it is, when
/// the name is good.
fn read_pool(
    c: &mut Collector<'_>,
    at: usize,
    table: &DeTable<'_>,
) -> (Option<PoolDraft>, Option<(String, usize)>) {
    let mut draft = PoolDraft {
        name: String::new(),
        values: Vec::new(),
        backends: Vec::new(),
        discover: None,
        modes: Default::default(),
    };
    let mut name_at = None;
    let mut ok = true;
    for (key, v) in table {
        let k = key.get_ref().as_ref();
        match k {
            "name" => match c.text_of(v, FileType::Str, "pools.name") {
                Some(text) => match pools::check_pool_name(&text) {
                    Ok(()) => {
                        draft.name = text;
                        name_at = Some(v.span().start);
                    }
                    Err(e) => {
                        c.push(v.span().start, Some("pools.name"), e);
                        ok = false;
                    }
                },
                None => ok = false,
            },
            "backends" => match read_backends(c, v, "pools.backends") {
                Some(list) => draft.backends = list,
                None => ok = false,
            },
            "discover" => match read_discover(c, v, "pools.discover") {
                Some(spec) => draft.discover = Some(spec),
                None => ok = false,
            },
            "mode" | "idle_timeout" => {
                ok &= super::file_tcp::read_mode_key(c, k, v, &mut draft.modes)
            }
            t @ ("health" | "outlier" | "sticky" | "hedge") => {
                ok &= read_pool_table(c, t, v, &mut draft)
            }
            _ => ok &= read_pool_value(c, key.span().start, k, v, &mut draft),
        }
    }
    ok &= backends_fit(c, table, &draft);
    if let Some((k, _)) = table
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == "discover")
    {
        let misfit = (draft.discover.as_ref()).and_then(|d| d.fits(draft.modes.mode).err());
        if let Some(e) = misfit {
            c.push(k.span().start, Some("pools.discover"), e);
            ok = false;
        }
        if has_key(table, "backends") {
            c.push(
                k.span().start,
                Some("pools.discover"),
                super::discover::WITH_BACKENDS.into(),
            );
            ok = false;
        }
    }
    let Some(name_at) = name_at else {
        if !has_key(table, "name") {
            c.push(at, Some("pools"), "missing field 'name'".into());
        }
        return (None, None);
    };
    let named = Some((draft.name.clone(), name_at));
    (ok.then_some(draft), named)
}

/// A pool's `mode` as its entry gives it (`None`: a bad one).
fn mode_of(table: &DeTable<'_>) -> Option<super::tcp::PoolMode> {
    match table.iter().find(|(k, _)| k.get_ref().as_ref() == "mode") {
        Some((_, v)) => super::tcp::PoolMode::parse(v.get_ref().as_str()?).ok(),
        None => Some(super::tcp::PoolMode::Http),
    }
}

/// Whether every backend of the entry fits its pool's mode: `tcp://` in a TCP pool,
/// `http(s)://` in an HTTP one (each misfit recorded where the backends are).
fn backends_fit(c: &mut Collector<'_>, table: &DeTable<'_>, draft: &PoolDraft) -> bool {
    let Some((_, v)) = table
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == "backends")
    else {
        return true;
    };
    let mut ok = true;
    for b in &draft.backends {
        if let Err(e) = super::tcp::url_fits(&b.url, draft.modes.mode) {
            c.push(v.span().start, Some("pools.backends"), e);
            ok = false;
        }
    }
    ok
}

/// A pool's `health`, `outlier` or `sticky` table.
fn read_pool_table(
    c: &mut Collector<'_>,
    table_name: &str,
    v: &Spanned<DeValue<'_>>,
    draft: &mut PoolDraft,
) -> bool {
    let shown = format!("pools.{table_name}");
    let Some(table) = v.get_ref().as_table() else {
        c.push(v.span().start, Some(&shown), "expected a table".into());
        return false;
    };
    let mut ok = true;
    for (key, tv) in table {
        let k = key.get_ref().as_ref();
        if (table_name, k) == ("health", "kind") {
            ok &= super::file_tcp::read_health_kind(c, tv, &mut draft.modes);
            continue;
        }
        let Some(o) = options::find_in(table_name, k) else {
            let msg = options::unknown_table_key(table_name, &format!("{shown}.{k}"));
            c.push(key.span().start, None, msg);
            ok = false;
            continue;
        };
        ok &= read_pool_value(c, key.span().start, o.key, tv, draft);
    }
    ok
}

/// One of a pool's own values (a per-pool key of the options table).
fn read_pool_value(
    c: &mut Collector<'_>,
    key_at: usize,
    key: &str,
    v: &Spanned<DeValue<'_>>,
    draft: &mut PoolDraft,
) -> bool {
    let Some(o) = pools::pool_option(key) else {
        c.push(key_at, None, pools::not_per_pool(&format!("pools.{key}")));
        return false;
    };
    let shown = format!("pools.{key}");
    let Some(text) = c.text_of(v, o.file_type, &shown) else {
        return false;
    };
    match pools::check_pool_value(o.key, &text) {
        Ok(k) => {
            draft.values.push((k, text));
            true
        }
        Err(e) => {
            c.push(v.span().start, Some(&shown), e);
            false
        }
    }
}

/// The `[[routes]]` list, in order.
pub(super) fn apply_routes(
    s: &mut Settings,
    c: &mut Collector<'_>,
    value: &Spanned<DeValue<'_>>,
    layout: &mut Layout,
) {
    let Some(list) = value.get_ref().as_array() else {
        let msg = "expected a list of tables ([[routes]])".into();
        c.push(value.span().start, Some("routes"), msg);
        return;
    };
    for entry in list {
        let Some(table) = entry.get_ref().as_table() else {
            c.push(
                entry.span().start,
                Some("routes"),
                "expected a table".into(),
            );
            continue;
        };
        let at = entry.span().start;
        if let Some((_, v)) = table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == "client_cert")
        {
            layout.client_cert_at = layout.client_cert_at.or(Some(v.span().start));
        }
        let (text, named) = read_route(c, at, table);
        // A route with a bad value still names its pools: they are not "unreached".
        layout.routes.extend(named);
        let Some(text) = text else {
            continue;
        };
        if s.routes.len() == MAX_ROUTES {
            c.push(at, Some("routes"), format!("more than {MAX_ROUTES} routes"));
            continue;
        }
        match pools::route_spec(text) {
            Ok(r) => s.routes.push(r),
            Err(e) => c.push(at, Some("routes"), e),
        }
    }
}

/// One `[[routes]]` entry's values when every one is good, each checked where it is;
/// and the names of its pools (its pool's, or its split's sides') and where they are,
/// when they are good.
fn read_route(
    c: &mut Collector<'_>,
    at: usize,
    table: &DeTable<'_>,
) -> (Option<RouteText>, Vec<(String, usize)>) {
    let mut t = RouteText::default();
    let mut pool_at = None;
    let mut ok = true;
    for (key, v) in table {
        let k = key.get_ref().as_ref();
        if !route_key(k) {
            let valid: Vec<&str> = ROUTE_KEYS
                .iter()
                .chain(&super::policy::KEYS)
                .copied()
                .collect();
            let msg = format!("unknown key 'routes.{k}' (valid: {})", valid.join(", "));
            c.push(key.span().start, None, msg);
            ok = false;
            continue;
        }
        match read_route_value(c, k, v, &mut t) {
            Ok(()) if k == "pool" || k == "split" => pool_at = Some(v.span().start),
            Ok(()) => {}
            Err(e) => {
                if let Some(e) = e {
                    c.push(v.span().start, Some(&format!("routes.{k}")), e);
                }
                ok = false;
            }
        }
        if k == "strip_path_prefix" && t.strip_path_prefix && !has_key(table, "path_prefix") {
            let msg = "strip_path_prefix needs a path_prefix".into();
            c.push(v.span().start, Some("routes.strip_path_prefix"), msg);
            ok = false;
        }
    }
    let Some(pool_at) = pool_at else {
        // A redirect route has no pool.
        if has_key(table, "redirect") {
            return (ok.then_some(t), Vec::new());
        }
        if !has_key(table, "pool") && !has_key(table, "split") {
            c.push(at, Some("routes"), "missing field 'pool'".into());
        }
        return (None, Vec::new());
    };
    let sides = t.split.iter().flatten().map(|s| s.pool.clone());
    let pool = (!t.pool.is_empty()).then(|| t.pool.clone());
    let mirror = t.mirror.as_ref().map(|m| m.pool.clone());
    let named = pool
        .into_iter()
        .chain(sides)
        .chain(mirror)
        .map(|p| (p, pool_at))
        .collect();
    (ok.then_some(t), named)
}

fn has_key(table: &DeTable<'_>, key: &str) -> bool {
    table.iter().any(|(k, _)| k.get_ref().as_ref() == key)
}

/// One value of a route, `key` of [`ROUTE_KEYS`], into `t`. `Err(Some(why))` for a bad
/// value; `Err(None)` when the problem is recorded already (a value of the wrong type).
fn read_route_value(
    c: &mut Collector<'_>,
    key: &str,
    v: &Spanned<DeValue<'_>>,
    t: &mut RouteText,
) -> Result<(), Option<String>> {
    let shown = format!("routes.{key}");
    let text = |c: &mut Collector<'_>| c.text_of(v, FileType::Str, &shown).ok_or(None);
    if super::policy::KEYS.contains(&key) {
        // The message names the policy and what in it is wrong.
        return (t.policies.set(key, &json_of(v.get_ref()))).map_err(|e| {
            c.push(v.span().start, Some("routes"), e);
            None
        });
    }
    match key {
        "pool" => {
            t.pool = text(c)?;
            pools::check_pool_name(&t.pool).map_err(Some)
        }
        "split" => {
            t.split = Some(super::split::sides(&json_of(v.get_ref())).map_err(Some)?);
            Ok(())
        }
        "split_key" => {
            t.split_key = Some(super::split::key(&json_of(v.get_ref())).map_err(Some)?);
            Ok(())
        }
        "mirror" => {
            t.mirror = Some(super::mirror::parse(&json_of(v.get_ref())).map_err(Some)?);
            Ok(())
        }
        "host" => {
            let h = text(c)?;
            HostPattern::parse(&h).map_err(Some)?;
            t.host = Some(h);
            Ok(())
        }
        "path_prefix" => {
            let p = text(c)?;
            PathPrefix::parse(&p).map_err(Some)?;
            t.path_prefix = Some(p);
            Ok(())
        }
        "methods" => {
            t.methods =
                string_list(v).ok_or_else(|| Some("expected a list of method names".into()))?;
            pools::check_methods(&t.methods).map(drop).map_err(Some)
        }
        "headers" => {
            t.headers = string_table(v).ok_or_else(|| {
                Some(
                    "expected a table of header names and values, such as { \"x-canary\" = \"1\" }"
                        .into(),
                )
            })?;
            pools::check_fields(&t.headers).map(drop).map_err(Some)
        }
        _ => match v.get_ref() {
            DeValue::Boolean(b) => {
                t.strip_path_prefix = *b;
                Ok(())
            }
            _ => Err(Some("expected true or false".into())),
        },
    }
}

/// A TOML value as JSON: the policies read both the same way
/// ([`super::policy::Policies::set`]). A date has no JSON form and becomes its text.
fn json_of(v: &DeValue<'_>) -> serde_json::Value {
    use serde_json::Value;
    match v {
        DeValue::String(s) => Value::String(s.to_string()),
        DeValue::Integer(i) => {
            (i64::from_str_radix(i.as_str(), i.radix()).ok()).map_or(Value::Null, Value::from)
        }
        DeValue::Float(f) => (f.as_str().parse::<f64>().ok()).map_or(Value::Null, Value::from),
        DeValue::Boolean(b) => Value::Bool(*b),
        DeValue::Datetime(d) => Value::String(d.to_string()),
        DeValue::Array(items) => Value::Array(items.iter().map(|i| json_of(i.get_ref())).collect()),
        DeValue::Table(t) => Value::Object(
            t.iter()
                .map(|(k, v)| (k.get_ref().to_string(), json_of(v.get_ref())))
                .collect(),
        ),
    }
}

fn string_list(v: &Spanned<DeValue<'_>>) -> Option<Vec<String>> {
    v.get_ref()
        .as_array()?
        .iter()
        .map(|i| i.get_ref().as_str().map(str::to_string))
        .collect()
}

fn string_table(v: &Spanned<DeValue<'_>>) -> Option<Vec<(String, String)>> {
    v.get_ref()
        .as_table()?
        .iter()
        .map(|(k, v)| Some((k.get_ref().to_string(), v.get_ref().as_str()?.to_string())))
        .collect()
}

/// The checks on pools and routes together, each at the line it is about.
pub(super) fn check_layout(c: &mut Collector<'_>, layout: &Layout) {
    let mut names: Vec<&str> = Vec::new();
    for (name, at) in &layout.pools {
        if names.contains(&name.as_str()) {
            c.push(
                *at,
                Some("pools.name"),
                format!("duplicate pool name '{name}'"),
            );
        }
        names.push(name);
    }
    if names.is_empty() {
        names.push(DEFAULT_POOL);
        if let (Some(at), Some(_)) = (layout.discover_at, layout.backends_at) {
            c.push(at, Some("discover"), super::discover::WITH_BACKENDS.into());
        }
    } else {
        if let Some(at) = layout.backends_at {
            let msg = "top-level backends and [[pools]] together: put the backends in a pool ([[pools.backends]])".into();
            c.push(at, Some("backends"), msg);
        }
        if let Some(at) = layout.discover_at {
            let msg = "top-level discover and [[pools]] together: put discover in a pool".into();
            c.push(at, Some("discover"), msg);
        }
    }
    let tcp = |name: &str| layout.tcp_pools.iter().any(|p| p == name);
    for (pool, at) in &layout.routes {
        if !names.contains(&pool.as_str()) {
            let msg = format!(
                "route names the unknown pool '{pool}' (pools: {})",
                names.join(", ")
            );
            c.push(*at, Some("routes.pool"), msg);
        } else if tcp(pool) {
            let msg = format!("route names the TCP pool '{pool}': a route sends HTTP requests, to a pool with mode = \"http\"");
            c.push(*at, Some("routes.pool"), msg);
        }
    }
    check_tcp_users(c, layout, &names);
    let http_pools: Vec<&(String, usize)> =
        (layout.pools.iter()).filter(|(n, _)| !tcp(n)).collect();
    if layout.routes.is_empty() {
        if let Some((_, at)) = http_pools.get(1) {
            let msg = "several pools and no [[routes]]: say which requests go to which pool".into();
            c.push(*at, Some("pools"), msg);
        }
        return;
    }
    for (name, at) in http_pools {
        if !layout.routes.iter().any(|(p, _)| p == name) {
            c.push(
                *at,
                Some("pools.name"),
                format!("no route reaches pool '{name}'"),
            );
        }
    }
}

/// The pools of `[[tcp_listeners]]` and `[[tls_passthrough]]`: known, and TCP pools;
/// and each TCP pool reached by one of them.
fn check_tcp_users(c: &mut Collector<'_>, layout: &Layout, names: &[&str]) {
    for (pool, at, user) in &layout.tcp_users {
        let key = format!("{user}.pool");
        if !names.contains(&pool.as_str()) {
            let msg = format!("unknown pool '{pool}' (pools: {})", names.join(", "));
            c.push(*at, Some(&key), msg);
        } else if !layout.tcp_pools.contains(pool) {
            let msg =
                format!("'{pool}' is an HTTP pool: [[{user}]] needs a pool with mode = \"tcp\"");
            c.push(*at, Some(&key), msg);
        }
    }
    for (name, at) in &layout.pools {
        let reached = layout.tcp_users.iter().any(|(p, _, _)| p == name);
        if layout.tcp_pools.contains(name) && !reached {
            let msg = format!(
                "no [[tcp_listeners]] or [[tls_passthrough]] reaches the TCP pool '{name}'"
            );
            c.push(*at, Some("pools.name"), msg);
        }
    }
}

//! The config file's `[[pools]]` and `[[routes]]` lists (`docs/routing.md`), each value
//! checked with its line, and the checks that concern them together: a route naming an
//! unknown pool, a pool no route names, several pools and no routes, a name twice.

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::file::{read_backends, Collector};
use super::options::{self, FileType};
use super::pools::{self, PoolDraft, RouteText, DEFAULT_POOL, POOL_OPTIONS};
use super::Settings;
use crate::route::{HostPattern, PathPrefix};

/// Keys of a `[[routes]]` entry.
const ROUTE_KEYS: [&str; 6] = [
    "pool",
    "host",
    "path_prefix",
    "methods",
    "headers",
    "strip_path_prefix",
];

/// Where the file put what the whole-file checks look at (byte offsets).
#[derive(Debug, Default)]
pub(super) struct Layout {
    /// The top-level `backends` key.
    pub(super) backends_at: Option<usize>,
    /// Each pool's name and where it is.
    pub(super) pools: Vec<(String, usize)>,
    /// Each route's pool and where it is named.
    pub(super) routes: Vec<(String, usize)>,
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
        if let Some((draft, at)) = read_pool(c, entry.span().start, table) {
            layout.pools.push((draft.name.clone(), at));
            s.pool_drafts.push(draft);
        }
    }
}

/// One `[[pools]]` entry, and where its name is.
fn read_pool(c: &mut Collector<'_>, at: usize, table: &DeTable<'_>) -> Option<(PoolDraft, usize)> {
    let mut draft = PoolDraft {
        name: String::new(),
        values: Vec::new(),
        backends: Vec::new(),
    };
    let mut name_at = None;
    let mut ok = true;
    for (key, v) in table {
        let k = key.get_ref().as_ref();
        match k {
            "name" => {
                let text = c.text_of(v, FileType::Str, "pools.name")?;
                if let Err(e) = pools::check_pool_name(&text) {
                    c.push(v.span().start, Some("pools.name"), e);
                    return None;
                }
                draft.name = text;
                name_at = Some(v.span().start);
            }
            "backends" => match read_backends(c, v, "pools.backends") {
                Some(list) => draft.backends = list,
                None => ok = false,
            },
            "health" => ok &= read_pool_health(c, v, &mut draft),
            _ => ok &= read_pool_value(c, key.span().start, k, v, &mut draft),
        }
    }
    let Some(name_at) = name_at else {
        c.push(at, Some("pools"), "missing field 'name'".into());
        return None;
    };
    ok.then_some((draft, name_at))
}

/// A pool's `health` table.
fn read_pool_health(
    c: &mut Collector<'_>,
    v: &Spanned<DeValue<'_>>,
    draft: &mut PoolDraft,
) -> bool {
    let Some(table) = v.get_ref().as_table() else {
        c.push(
            v.span().start,
            Some("pools.health"),
            "expected a table".into(),
        );
        return false;
    };
    let mut ok = true;
    for (key, hv) in table {
        let k = key.get_ref().as_ref();
        let Some(o) = options::find_health(k) else {
            let msg = format!("unknown key 'pools.health.{k}' (valid: path, interval, timeout, healthy_threshold, unhealthy_threshold)");
            c.push(key.span().start, None, msg);
            ok = false;
            continue;
        };
        ok &= read_pool_value(c, key.span().start, o.key, hv, draft);
    }
    ok
}

/// One of a pool's own values (a key of [`POOL_OPTIONS`]).
fn read_pool_value(
    c: &mut Collector<'_>,
    key_at: usize,
    key: &str,
    v: &Spanned<DeValue<'_>>,
    draft: &mut PoolDraft,
) -> bool {
    let Some(o) = options::find(key).filter(|o| POOL_OPTIONS.contains(&o.key)) else {
        let msg = format!(
            "'pools.{key}' is not a per-pool key (valid: name, {}, health, backends)",
            POOL_OPTIONS.join(", ")
        );
        c.push(key_at, None, msg);
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
        let Some((text, pool_at)) = read_route(c, at, table) else {
            continue;
        };
        let pool = text.pool.clone();
        match pools::route_spec(text) {
            Ok(r) => {
                s.routes.push(r);
                layout.routes.push((pool, pool_at));
            }
            Err(e) => c.push(at, Some("routes"), e),
        }
    }
}

/// One `[[routes]]` entry's values, each checked where it is; also where its pool is
/// named.
fn read_route(c: &mut Collector<'_>, at: usize, table: &DeTable<'_>) -> Option<(RouteText, usize)> {
    let mut t = RouteText::default();
    let mut pool_at = None;
    let mut ok = true;
    for (key, v) in table {
        let k = key.get_ref().as_ref();
        let shown = format!("routes.{k}");
        let start = v.span().start;
        let mut check = |c: &mut Collector<'_>, r: Result<(), String>| {
            if let Err(e) = r {
                c.push(start, Some(&shown), e);
                ok = false;
            }
        };
        match k {
            "pool" => {
                let Some(p) = c.text_of(v, FileType::Str, &shown) else {
                    ok = false;
                    continue;
                };
                check(c, pools::check_pool_name(&p));
                t.pool = p;
                pool_at = Some(start);
            }
            "host" => {
                let Some(h) = c.text_of(v, FileType::Str, &shown) else {
                    ok = false;
                    continue;
                };
                check(c, HostPattern::parse(&h).map(drop));
                t.host = Some(h);
            }
            "path_prefix" => {
                let Some(p) = c.text_of(v, FileType::Str, &shown) else {
                    ok = false;
                    continue;
                };
                check(c, PathPrefix::parse(&p).map(drop));
                t.path_prefix = Some(p);
            }
            "methods" => match string_list(v) {
                Some(list) => t.methods = list,
                None => check(c, Err("expected a list of method names".into())),
            },
            "headers" => match string_table(v) {
                Some(fields) => t.headers = fields,
                None => check(c, Err("expected a table of header names and values, such as { \"x-canary\" = \"1\" }".into())),
            },
            "strip_path_prefix" => match v.get_ref() {
                DeValue::Boolean(b) => t.strip_path_prefix = *b,
                _ => check(c, Err("expected true or false".into())),
            },
            _ => {
                let msg = format!("unknown key 'routes.{k}' (valid: {})", ROUTE_KEYS.join(", "));
                c.push(key.span().start, None, msg);
                ok = false;
            }
        }
    }
    let Some(pool_at) = pool_at else {
        c.push(at, Some("routes"), "missing field 'pool'".into());
        return None;
    };
    ok.then_some((t, pool_at))
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
    } else if let Some(at) = layout.backends_at {
        let msg = "top-level backends and [[pools]] together: put the backends in a pool ([[pools.backends]])".into();
        c.push(at, Some("backends"), msg);
    }
    for (pool, at) in &layout.routes {
        if !names.contains(&pool.as_str()) {
            let msg = format!(
                "route names the unknown pool '{pool}' (pools: {})",
                names.join(", ")
            );
            c.push(*at, Some("routes.pool"), msg);
        }
    }
    if layout.routes.is_empty() {
        if let Some((_, at)) = layout.pools.get(1) {
            let msg = "several pools and no [[routes]]: say which requests go to which pool".into();
            c.push(*at, Some("pools"), msg);
        }
        return;
    }
    for (name, at) in &layout.pools {
        if !layout.routes.iter().any(|(p, _)| p == name) {
            c.push(
                *at,
                Some("pools.name"),
                format!("no route reaches pool '{name}'"),
            );
        }
    }
}

//! What fleet mode keeps in etcd (`docs/fleet.md`, "What is in etcd"): one JSON value
//! per object, under the store's prefix.
//!
//! - `pools/NAME`: the pool's own settings, as `POST /admin/pools` takes them
//!   (`{"strategy": "least_connections", "health": {"path": "/up"}}`);
//! - `backends/POOL/NAME`: `{"url", "name", "weight", "state", "max_conns", "backup"}`
//!   (`max_conns` -1 is `auto`);
//! - `routes`: the route list, as `PUT /admin/routes` takes it;
//! - `instances/ID`: one per running instance, kept by its lease.
//!
//! A [`Mirror`] holds the last good version of each object, parsed: a value that does
//! not parse is skipped and the version before it stays, as an xDS client NACKs a bad
//! update. [`Mirror::desired`] turns the objects into the pools and routes to apply.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::etcd::Kv;
use crate::config::pools::{self, PoolDraft, RouteView};
use crate::config::{BackendSpec, PoolSpec, RouteSpec, Settings, DEFAULT_POOL};
use crate::pool::AdminState;

/// The key of pool `name`, below the prefix.
pub(crate) fn pool_key(name: &str) -> String {
    format!("pools/{name}")
}

/// The key of backend `name` of pool `pool`, below the prefix.
pub(crate) fn backend_key(pool: &str, name: &str) -> String {
    format!("backends/{pool}/{name}")
}

/// Where the backends of pool `pool` are, below the prefix.
pub(crate) fn backends_of(pool: &str) -> String {
    format!("backends/{pool}/")
}

/// The key of the route list, below the prefix.
pub(crate) const ROUTES_KEY: &str = "routes";

/// Where the instances register, below the prefix.
pub(crate) const INSTANCES: &str = "instances/";

/// ACME's account, certificates, lock and challenge answers, below the prefix
/// (`store/acme.rs`): not configuration.
pub(crate) const ACME: &str = "acme/";

/// A key every admin write moves (its value names the instance that wrote): its
/// revision is that of the newest change, deletes included, where a read of the prefix
/// could not otherwise tell a delete; and a write that must not race any other (the
/// removal of a pool) compares on it.
pub(crate) const GENERATION: &str = "generation";

/// A backend's value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct BackendObject {
    pub(crate) url: String,
    pub(crate) name: String,
    #[serde(default = "one")]
    pub(crate) weight: i64,
    #[serde(default = "active")]
    pub(crate) state: String,
    #[serde(default)]
    pub(crate) max_conns: i64,
    #[serde(default)]
    pub(crate) backup: bool,
}

/// `max_conns = "auto"` as the store keeps it: -1, where a number of requests would be.
const AUTO_IN_STORE: i64 = -1;

fn one() -> i64 {
    1
}

fn active() -> String {
    "active".into()
}

impl BackendObject {
    /// The value of a backend as the API adds it.
    pub(crate) fn of(spec: &BackendSpec, state: AdminState) -> BackendObject {
        BackendObject {
            url: spec.url.clone(),
            name: spec.name.clone(),
            weight: i64::from(spec.weight),
            state: state_name(state).into(),
            max_conns: match spec.max_conns {
                crate::config::AUTO_CONNS => AUTO_IN_STORE,
                n => i64::from(n),
            },
            backup: spec.backup,
        }
    }

    /// The backend it describes, checked as the API checks one.
    fn spec(&self) -> Result<(BackendSpec, AdminState), String> {
        let weight = u32::try_from(self.weight)
            .ok()
            .filter(|w| (1..=crate::config::MAX_WEIGHT).contains(w))
            .ok_or_else(|| format!("invalid weight {}", self.weight))?;
        let mut spec = crate::config::backend_spec(&self.url, Some(weight), Some(&self.name))?;
        spec.backup = self.backup;
        spec.max_conns = match self.max_conns {
            AUTO_IN_STORE => crate::config::AUTO_CONNS,
            n => crate::config::parse_max_conns(&n.to_string())?,
        };
        let state = AdminState::parse(&self.state)
            .ok_or_else(|| format!("invalid state '{}'", self.state))?;
        Ok((spec, state))
    }
}

/// The name the API and the store give a state.
pub(crate) fn state_name(s: AdminState) -> &'static str {
    match s {
        AdminState::Active => "active",
        AdminState::Draining => "draining",
        AdminState::Maintenance => "maintenance",
    }
}

/// An instance's registry value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Instance {
    /// Unique in the fleet.
    pub(crate) id: String,
    /// Its proxy listener.
    pub(crate) listen: String,
    /// The store revision whose configuration it applied last.
    pub(crate) revision: i64,
}

/// An object, parsed.
#[derive(Debug, Clone)]
pub(crate) enum Object {
    /// A pool's own settings.
    Pool(PoolDraft),
    /// A backend of pool `pool`.
    Backend {
        pool: String,
        spec: BackendSpec,
        state: AdminState,
    },
    /// The route list.
    Routes(Vec<RouteSpec>),
    /// The generation key.
    Generation,
    /// A value that never parsed: only its revisions are kept, for writes to compare on.
    Malformed,
}

/// One object of the mirror: its last good version and the store's revisions of it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) object: Object,
    /// The value it was parsed from.
    pub(crate) raw: Value,
    /// The key's last change (a malformed one included): what a write compares on.
    pub(crate) mod_revision: i64,
    /// When the key was created: a backend's id on every instance.
    pub(crate) create_revision: i64,
}

/// Parses the value of `key` (below the prefix).
pub(crate) fn parse(key: &str, value: &[u8]) -> Result<(Object, Value), String> {
    // The generation key's value is whatever instance id wrote it, not JSON: only its
    // revisions matter, and a key fulcrum writes itself is never reported as bad.
    if key == GENERATION {
        return Ok((Object::Generation, Value::Null));
    }
    let raw: Value = serde_json::from_slice(value).map_err(|e| format!("not a JSON value: {e}"))?;
    let object = if let Some(name) = key.strip_prefix("pools/") {
        pools::check_pool_name(name)?;
        let Value::Object(fields) = &raw else {
            return Err("a pool's value is a JSON object".into());
        };
        Object::Pool(PoolDraft {
            name: name.to_string(),
            values: pools::values_of_json(fields, &["discover"])?,
            backends: Vec::new(),
            // Fleet mode keeps HTTP pools (TCP pools come from the file): a `tcp` scheme
            // does not fit one.
            discover: (fields.get("discover"))
                .map(|v| {
                    let d = crate::config::DiscoverSpec::from_json(v)?;
                    d.fits(Default::default()).map(|()| d)
                })
                .transpose()?,
            modes: Default::default(),
        })
    } else if let Some(rest) = key.strip_prefix("backends/") {
        let (pool, name) = rest
            .split_once('/')
            .ok_or("a backend's key is backends/POOL/NAME")?;
        let b: BackendObject =
            serde_json::from_value(raw.clone()).map_err(|e| format!("invalid backend: {e}"))?;
        if b.name != name {
            return Err(format!("the key names '{name}', the value '{}'", b.name));
        }
        let (spec, state) = b.spec()?;
        Object::Backend {
            pool: pool.to_string(),
            spec,
            state,
        }
    } else if key == ROUTES_KEY {
        let list: Vec<RouteView> =
            serde_json::from_value(raw.clone()).map_err(|e| format!("invalid routes: {e}"))?;
        let specs = list
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.spec().map_err(|e| format!("route {i}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if specs.len() > crate::site::MAX_ROUTES {
            return Err(format!(
                "{} routes: at most {} are allowed",
                specs.len(),
                crate::site::MAX_ROUTES
            ));
        }
        Object::Routes(specs)
    } else {
        return Err("not a key fulcrum knows".into());
    };
    Ok((object, raw))
}

/// The JSON value of a route list for the store.
pub(crate) fn routes_value(routes: &[RouteSpec]) -> Value {
    let list = routes
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(RouteView::of(r, 0)).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut v {
                m.remove("requests");
                m.remove("rate_limited");
            }
            v
        })
        .collect();
    Value::Array(list)
}

/// The JSON value of a pool's own settings for the store.
pub(crate) fn pool_value(draft: &PoolDraft) -> Value {
    let map: Map<String, Value> = draft
        .values
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.clone())))
        .chain((draft.discover.as_ref()).map(|d| ("discover".to_string(), d.to_json())))
        .collect();
    Value::Object(map)
}

/// A pool to apply: its spec (without backends) and its backends with their ids.
#[derive(Debug, Clone)]
pub(crate) struct DesiredPool {
    pub(crate) spec: PoolSpec,
    pub(crate) backends: Vec<(u64, BackendSpec, AdminState)>,
}

/// What the store says the site should be.
#[derive(Debug, Clone)]
pub(crate) struct Desired {
    /// In the order they were created: the first is the one the single-pool admin
    /// routes address.
    pub(crate) pools: Vec<DesiredPool>,
    pub(crate) routes: Vec<RouteSpec>,
    /// Objects left out, with why (a backend of a pool that does not exist, a route to
    /// one, a URL or name twice in a pool).
    pub(crate) left_out: Vec<(String, String)>,
    /// The key of each backend, by id.
    pub(crate) keys: std::collections::HashMap<u64, String>,
}

/// The last good version of every object under the prefix, by key below it, and the
/// instances registered.
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    pub(crate) entries: BTreeMap<String, Entry>,
    pub(crate) instances: BTreeMap<String, Instance>,
}

impl Mirror {
    /// Takes in the key `key` (below the prefix) written as `kv`; a value that does not
    /// parse is an error, and the entry keeps its last good version.
    pub(crate) fn put(&mut self, key: &str, kv: &Kv) -> Result<(), String> {
        if let Some(id) = key.strip_prefix(INSTANCES) {
            let i: Instance =
                serde_json::from_slice(&kv.value).map_err(|e| format!("invalid instance: {e}"))?;
            self.instances.insert(id.to_string(), i);
            return Ok(());
        }
        match parse(key, &kv.value) {
            Ok((object, raw)) => {
                self.entries.insert(
                    key.to_string(),
                    Entry {
                        object,
                        raw,
                        mod_revision: kv.mod_revision,
                        create_revision: kv.create_revision,
                    },
                );
                Ok(())
            }
            Err(e) => {
                match self.entries.get_mut(key) {
                    Some(old) => old.mod_revision = kv.mod_revision,
                    None => {
                        self.entries.insert(
                            key.to_string(),
                            Entry {
                                object: Object::Malformed,
                                raw: Value::Null,
                                mod_revision: kv.mod_revision,
                                create_revision: kv.create_revision,
                            },
                        );
                    }
                }
                Err(e)
            }
        }
    }

    /// Takes the key `key` out.
    pub(crate) fn delete(&mut self, key: &str) {
        match key.strip_prefix(INSTANCES) {
            Some(id) => {
                self.instances.remove(id);
            }
            None => {
                self.entries.remove(key);
            }
        }
    }

    /// The backend whose id is `id`: its key and entry.
    pub(crate) fn backend(&self, id: u64) -> Option<(&String, &Entry)> {
        self.entries.iter().find(|(_, e)| {
            matches!(e.object, Object::Backend { .. }) && e.create_revision as u64 == id
        })
    }

    /// The pools, backends and routes to apply; the pools take their defaults from
    /// `top`. Without any pool, the site is the embedded default: the pool `default`,
    /// empty, and a route that takes everything to it.
    pub(crate) fn desired(&self, top: &Settings) -> Desired {
        let mut left_out = Vec::new();
        let mut drafts: Vec<(&PoolDraft, i64)> = Vec::new();
        let mut routes = None;
        for e in self.entries.values() {
            match &e.object {
                Object::Pool(d) => drafts.push((d, e.create_revision)),
                Object::Routes(r) => routes = Some(r),
                Object::Backend { .. } | Object::Generation | Object::Malformed => {}
            }
        }
        drafts.sort_by_key(|(_, rev)| *rev);
        let mut pools: Vec<DesiredPool> = drafts
            .iter()
            .map(|(d, _)| DesiredPool {
                spec: pools::pool_spec(top, d),
                backends: Vec::new(),
            })
            .collect();
        if pools.is_empty() {
            pools.push(DesiredPool {
                spec: pools::pool_spec(top, &empty_draft(DEFAULT_POOL)),
                backends: Vec::new(),
            });
        }
        let mut keys = std::collections::HashMap::new();
        self.place_backends(&mut pools, &mut left_out, &mut keys);
        let routes = match routes {
            Some(list) => list
                .iter()
                .enumerate()
                .filter(|(i, r)| {
                    let unknown = r.pools().find(|&n| pools.iter().all(|p| p.spec.name != n));
                    if let Some(n) = unknown {
                        left_out.push((
                            ROUTES_KEY.to_string(),
                            format!("route {i} names the unknown pool '{n}'"),
                        ));
                    }
                    unknown.is_none()
                })
                .map(|(_, r)| r.clone())
                .collect(),
            None => vec![RouteSpec::catch_all(&pools[0].spec.name)],
        };
        Desired {
            pools,
            routes,
            left_out,
            keys,
        }
    }

    /// Puts each backend in its pool, in the order they were created.
    fn place_backends(
        &self,
        pools: &mut [DesiredPool],
        left_out: &mut Vec<(String, String)>,
        keys: &mut std::collections::HashMap<u64, String>,
    ) {
        let mut list: Vec<(&String, &Entry)> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.object, Object::Backend { .. }))
            .collect();
        list.sort_by_key(|(_, e)| e.create_revision);
        let mut last = None;
        for (key, e) in list {
            let Object::Backend { pool, spec, state } = &e.object else {
                continue;
            };
            // Sorted by id: a shared one is the previous backend's.
            let id = e.create_revision as u64;
            if last.replace(id) == Some(id) {
                left_out.push((
                    key.clone(),
                    "created in one transaction with another backend: a backend's id is the revision that created it, so write each in a transaction of its own".into(),
                ));
                continue;
            }
            let Some(p) = pools.iter_mut().find(|p| p.spec.name == *pool) else {
                left_out.push((key.clone(), format!("no pool named '{pool}'")));
                continue;
            };
            if p.backends.iter().any(|(_, b, _)| b.url == spec.url) {
                left_out.push((key.clone(), format!("duplicate backend URL '{}'", spec.url)));
                continue;
            }
            p.backends.push((id, spec.clone(), *state));
            keys.insert(id, key.clone());
        }
    }
}

/// A pool with no values of its own.
pub(crate) fn empty_draft(name: &str) -> PoolDraft {
    PoolDraft {
        name: name.to_string(),
        values: Vec::new(),
        backends: Vec::new(),
        discover: None,
        modes: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, rev: i64) -> Kv {
        Kv {
            key: key.to_string(),
            value: value.as_bytes().to_vec(),
            mod_revision: rev,
            create_revision: rev,
        }
    }

    fn put(m: &mut Mirror, k: &str, v: &str, rev: i64) -> Result<(), String> {
        m.put(k, &kv(k, v, rev))
    }

    #[test]
    fn the_generation_key_is_taken_whatever_instance_wrote_it() {
        let mut m = Mirror::default();
        put(&mut m, GENERATION, "f3a9-instance-7", 9).unwrap();
        assert_eq!(m.entries[GENERATION].mod_revision, 9);
        assert!(matches!(m.entries[GENERATION].object, Object::Generation));
    }

    #[test]
    fn a_bad_value_keeps_the_last_good_version_and_its_revision_moves() {
        let mut m = Mirror::default();
        put(&mut m, "pools/web", r#"{"strategy": "maglev"}"#, 2).unwrap();
        let ok = r#"{"url": "http://127.0.0.1:9001", "name": "a", "weight": 3}"#;
        put(&mut m, "backends/web/a", ok, 3).unwrap();
        let e = put(&mut m, "backends/web/a", r#"{"url": 1}"#, 4).unwrap_err();
        assert!(e.contains("invalid backend"), "{e}");
        let entry = &m.entries["backends/web/a"];
        assert_eq!(entry.mod_revision, 4, "a write compares on the newest");
        assert!(matches!(&entry.object, Object::Backend { spec, .. } if spec.weight == 3));
        // A key that never parsed is kept for its revisions alone.
        assert!(put(&mut m, "routes", "[", 5).is_err());
        assert!(matches!(m.entries["routes"].object, Object::Malformed));
        let d = m.desired(&Settings::default());
        assert_eq!(d.pools.len(), 1);
        assert_eq!(d.pools[0].backends.len(), 1);
        assert!(d.routes.is_empty() || d.routes[0].pool == "web");
    }

    #[test]
    fn backends_are_placed_and_what_cannot_be_is_left_out() {
        let mut m = Mirror::default();
        put(&mut m, "pools/web", "{}", 2).unwrap();
        let b = |name: &str, port: u16| {
            format!(r#"{{"url": "http://127.0.0.1:{port}", "name": "{name}"}}"#)
        };
        put(&mut m, "backends/web/a", &b("a", 9001), 3).unwrap();
        put(&mut m, "backends/web/dup", &b("dup", 9001), 4).unwrap();
        put(&mut m, "backends/gone/x", &b("x", 9002), 5).unwrap();
        // Two created by one transaction share a revision, so an id.
        let twin = kv("backends/web/twin", &b("twin", 9003), 3);
        m.put("backends/web/twin", &twin).unwrap();
        assert!(put(&mut m, "backends/web/other", &b("else", 9004), 6).is_err());
        put(
            &mut m,
            "routes",
            r#"[{"pool": "web"}, {"pool": "nope"}]"#,
            7,
        )
        .unwrap();
        let d = m.desired(&Settings::default());
        let ids: Vec<u64> = d.pools[0].backends.iter().map(|(id, ..)| *id).collect();
        assert_eq!(ids, [3]);
        let mut why: Vec<&str> = d.left_out.iter().map(|(k, _)| k.as_str()).collect();
        why.sort_unstable();
        assert_eq!(
            why,
            [
                "backends/gone/x",
                "backends/web/dup",
                "backends/web/twin",
                "routes"
            ]
        );
        assert_eq!(d.routes.len(), 1);
        assert_eq!(d.keys[&3], "backends/web/a");
    }
}

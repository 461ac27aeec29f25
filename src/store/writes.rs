//! Admin writes in fleet mode (`docs/fleet.md`, "Writes"): each one is an etcd
//! transaction compared on the `mod_revision` of the objects it is based on, as this
//! instance knows them. A write based on a stale revision changes nothing and gets the
//! current value back; one that succeeds is answered once this instance has applied
//! it through the watch, like every other instance.

use std::time::Duration;

use serde_json::Value;

use super::etcd::{Op, Written};
use super::fleet::Fleet;
use super::model::{self, BackendObject, Object, ROUTES_KEY};
use crate::config::pools::PoolDraft;
use crate::config::{BackendSpec, RouteSpec};
use crate::pool::AdminState;
use crate::strategy::StrategyKind;

/// How long a write waits to see itself applied here.
const APPLY_WAIT: Duration = Duration::from_secs(5);

/// Why a write did not happen.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WriteError {
    /// etcd cannot be reached: nothing is written (503).
    Unavailable(String),
    /// The object changed since this instance read it (409): its current value, if
    /// it still exists.
    Stale(String, Option<Value>),
    /// It does not exist (404).
    NotFound(String),
    /// It would clash with what exists (409).
    Conflict(String),
    /// What was asked is wrong (400).
    Invalid(String),
    /// Written at this revision, but not applied here in time (504).
    NotApplied(i64),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Unavailable(e) => write!(f, "the store (etcd) is unreachable, nothing was changed: {e}"),
            WriteError::Stale(what, _) => write!(f, "{what} was changed meanwhile (through another instance?): nothing was written; its current value is in 'current'"),
            WriteError::NotFound(e) | WriteError::Conflict(e) | WriteError::Invalid(e) => f.write_str(e),
            WriteError::NotApplied(rev) => write!(f, "written to the store at revision {rev}, but not yet applied here"),
        }
    }
}

impl From<super::etcd::StoreError> for WriteError {
    fn from(e: super::etcd::StoreError) -> Self {
        WriteError::Unavailable(format!("{e:?}"))
    }
}

impl Fleet {
    /// Refuses a write while etcd is lost.
    fn check_connected(&self) -> Result<(), WriteError> {
        if self.connected() {
            Ok(())
        } else {
            Err(WriteError::Unavailable("not connected".into()))
        }
    }

    /// Runs a transaction, then waits until it is applied here; its revision.
    async fn commit(
        &self,
        what: &str,
        compares: &[(&str, i64)],
        ops: &[Op],
    ) -> Result<i64, WriteError> {
        match self.etcd.txn(compares, ops).await? {
            Written::Done(rev) => {
                if self.applied_up_to(rev, APPLY_WAIT).await {
                    Ok(rev)
                } else {
                    Err(WriteError::NotApplied(rev))
                }
            }
            Written::Conflict(current) => {
                let value = current.and_then(|kv| serde_json::from_slice(&kv.value).ok());
                Err(WriteError::Stale(what.to_string(), value))
            }
        }
    }

    /// The entry of pool `name`: its key and revision.
    fn pool_entry(&self, name: &str) -> Result<(String, i64, Value), WriteError> {
        let m = self.mirror();
        let key = model::pool_key(name);
        let e = m
            .entries
            .get(&key)
            .ok_or_else(|| WriteError::NotFound(format!("no pool named '{name}'")))?;
        Ok((self.key(&key), e.mod_revision, e.raw.clone()))
    }

    /// Adds a backend to pool `pool`; its id.
    pub(crate) async fn add_backend(
        &self,
        pool: &str,
        spec: &BackendSpec,
    ) -> Result<u64, WriteError> {
        self.check_connected()?;
        let pool_rev = self.pools_now().await?.into_iter().find(|(n, _)| n == pool);
        let Some((_, pool_rev)) = pool_rev else {
            return Err(WriteError::NotFound(format!("no pool named '{pool}'")));
        };
        if let Some(b) = self.backends_in(pool).iter().find(|b| b.url == spec.url) {
            return Err(WriteError::Conflict(format!(
                "backend URL '{}' is in pool '{pool}' already (as '{}')",
                b.url, b.name
            )));
        }
        let key = self.key(&model::backend_key(pool, &spec.name));
        let value =
            serde_json::to_vec(&BackendObject::of(spec, AdminState::Active)).unwrap_or_default();
        let what = format!("backend '{}' of pool '{pool}'", spec.name);
        let pool_key = self.key(&model::pool_key(pool));
        let compares = [(key.as_str(), 0), (pool_key.as_str(), pool_rev)];
        match self
            .commit(&what, &compares, &[Op::Put(key.clone(), value)])
            .await
        {
            Ok(rev) => Ok(rev as u64),
            Err(WriteError::Stale(..)) => Err(WriteError::Conflict(format!(
                "duplicate backend name '{}' in pool '{pool}'",
                spec.name
            ))),
            Err(e) => Err(e),
        }
    }

    /// Every pool's name and revision, read from etcd now.
    async fn pools_now(&self) -> Result<Vec<(String, i64)>, WriteError> {
        let (_, kvs) = self.etcd.range_prefix(&self.key("pools/")).await?;
        Ok(kvs
            .into_iter()
            .filter_map(|kv| {
                let name = self.relative(&kv.key)?.strip_prefix("pools/")?.to_string();
                Some((name, kv.mod_revision))
            })
            .collect())
    }

    /// The backends of pool `pool` in the mirror.
    fn backends_in(&self, pool: &str) -> Vec<BackendSpec> {
        self.mirror()
            .entries
            .values()
            .filter_map(|e| match &e.object {
                Object::Backend { pool: p, spec, .. } if p == pool => Some(spec.clone()),
                _ => None,
            })
            .collect()
    }

    /// Changes weight, state and/or `max_conns` of backend `id`.
    pub(crate) async fn update_backend(
        &self,
        id: u64,
        weight: Option<u32>,
        state: Option<AdminState>,
        max_conns: Option<u32>,
    ) -> Result<(), WriteError> {
        self.check_connected()?;
        let (key, rev, mut b) = self.backend_entry(id)?;
        if let Some(w) = weight {
            b.weight = i64::from(w);
        }
        if let Some(s) = state {
            b.state = model::state_name(s).into();
        }
        if let Some(n) = max_conns {
            b.max_conns = i64::from(n);
        }
        let value = serde_json::to_vec(&b).unwrap_or_default();
        let what = format!("backend {id}");
        self.commit(&what, &[(&key, rev)], &[Op::Put(key.clone(), value)])
            .await
            .map(|_| ())
    }

    /// Removes backend `id`.
    pub(crate) async fn remove_backend(&self, id: u64) -> Result<(), WriteError> {
        self.check_connected()?;
        let (key, rev, _) = self.backend_entry(id)?;
        let what = format!("backend {id}");
        self.commit(&what, &[(&key, rev)], &[Op::Delete(key.clone())])
            .await
            .map(|_| ())
    }

    /// Backend `id`'s full key, revision and value.
    fn backend_entry(&self, id: u64) -> Result<(String, i64, BackendObject), WriteError> {
        let m = self.mirror();
        let (key, e) = m
            .backend(id)
            .ok_or_else(|| WriteError::NotFound(format!("no backend with id {id}")))?;
        let b: BackendObject = serde_json::from_value(e.raw.clone())
            .map_err(|x| WriteError::Invalid(format!("backend {id} in the store: {x}")))?;
        Ok((self.key(key), e.mod_revision, b))
    }

    /// Switches pool `pool` to `kind`.
    pub(crate) async fn set_strategy(
        &self,
        pool: &str,
        kind: StrategyKind,
    ) -> Result<(), WriteError> {
        self.check_connected()?;
        let (key, rev, mut raw) = self.pool_entry(pool)?;
        if let Value::Object(m) = &mut raw {
            m.insert("strategy".into(), Value::String(kind.name().into()));
        }
        let what = format!("pool '{pool}'");
        self.commit(
            &what,
            &[(&key, rev)],
            &[Op::Put(key.clone(), raw.to_string().into())],
        )
        .await
        .map(|_| ())
    }

    /// Adds the pool `draft`, then each of its backends in a transaction of its own:
    /// a backend's id is the revision that created it, so two created at once would
    /// share one.
    pub(crate) async fn add_pool(&self, draft: &PoolDraft) -> Result<(), WriteError> {
        self.check_connected()?;
        let key = self.key(&model::pool_key(&draft.name));
        let put = [Op::Put(
            key.clone(),
            model::pool_value(draft).to_string().into(),
        )];
        let what = format!("pool '{}'", draft.name);
        match self.commit(&what, &[(&key, 0)], &put).await {
            Err(WriteError::Stale(..)) => {
                return Err(WriteError::Conflict(format!(
                    "a pool named '{}' exists already",
                    draft.name
                )))
            }
            r => r?,
        };
        for b in &draft.backends {
            self.add_backend(&draft.name, b).await?;
        }
        Ok(())
    }

    /// Removes pool `name` and its backends; refused while a route names it, or if it
    /// is the last one.
    pub(crate) async fn remove_pool(&self, name: &str) -> Result<(), WriteError> {
        self.check_connected()?;
        let (key, rev, _) = self.pool_entry(name)?;
        let (routes_rev, naming, pools) = {
            let m = self.mirror();
            let routes = m.entries.get(ROUTES_KEY);
            let naming: Vec<usize> = match routes.map(|e| &e.object) {
                Some(Object::Routes(list)) => {
                    (0..list.len()).filter(|&i| list[i].pool == name).collect()
                }
                _ => Vec::new(),
            };
            let pools = m.entries.keys().filter(|k| k.starts_with("pools/")).count();
            (routes.map_or(0, |e| e.mod_revision), naming, pools)
        };
        if !naming.is_empty() {
            return Err(WriteError::Conflict(format!(
                "pool '{name}' is named by routes {naming:?}: change the routes first (PUT /admin/routes)"
            )));
        }
        if pools == 1 {
            return Err(WriteError::Conflict(
                "the last pool cannot be removed".into(),
            ));
        }
        let routes_key = self.key(ROUTES_KEY);
        let ops = [
            Op::Delete(key.clone()),
            Op::DeletePrefix(self.key(&model::backends_of(name))),
        ];
        let what = format!("pool '{name}' (or the routes)");
        self.commit(&what, &[(&key, rev), (&routes_key, routes_rev)], &ops)
            .await
            .map(|_| ())
    }

    /// Replaces the route list; every route must name a pool of the store.
    pub(crate) async fn set_routes(&self, routes: &[RouteSpec]) -> Result<(), WriteError> {
        self.check_connected()?;
        // The pools as etcd has them now: one just added through another instance
        // may not have reached this one yet. Each pool named is compared too, so that
        // none goes meanwhile.
        let pools = self.pools_now().await?;
        let mut named: Vec<(String, i64)> = Vec::new();
        for (i, r) in routes.iter().enumerate() {
            let Some((_, rev)) = pools.iter().find(|(n, _)| *n == r.pool) else {
                return Err(WriteError::Invalid(format!(
                    "route {i} names the unknown pool '{}'",
                    r.pool
                )));
            };
            let key = self.key(&model::pool_key(&r.pool));
            if !named.iter().any(|(k, _)| *k == key) {
                named.push((key, *rev));
            }
        }
        let rev = self
            .mirror()
            .entries
            .get(ROUTES_KEY)
            .map_or(0, |e| e.mod_revision);
        if routes.len() > crate::site::MAX_ROUTES {
            return Err(WriteError::Invalid(format!(
                "{} routes: at most {} are allowed",
                routes.len(),
                crate::site::MAX_ROUTES
            )));
        }
        let key = self.key(ROUTES_KEY);
        let value = model::routes_value(routes).to_string();
        let mut compares = vec![(key.as_str(), rev)];
        compares.extend(named.iter().map(|(k, r)| (k.as_str(), *r)));
        let put = [Op::Put(key.clone(), value.into())];
        self.commit("the route list (or a pool it names)", &compares, &put)
            .await
            .map(|_| ())
    }
}

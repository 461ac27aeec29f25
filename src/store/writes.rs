//! Admin writes in fleet mode (`docs/fleet.md`, "How changes travel"): each one is an etcd
//! transaction compared on the `mod_revision` of the objects it is based on, as this
//! instance knows them. A write based on a stale revision changes nothing and gets the
//! current value back; one that succeeds is answered once this instance has applied
//! it through the watch, like every other instance.

use std::time::Duration;

use serde_json::Value;

use super::etcd::{Compare, Kv, Op, Written};
use super::fleet::Fleet;
use super::model::{self, BackendObject, Object, GENERATION, ROUTES_KEY};
use crate::config::pools::PoolDraft;
use crate::config::{BackendSpec, RouteSpec};
use crate::pool::AdminState;
use crate::strategy::StrategyKind;

/// How long a write waits to see itself applied here.
const APPLY_WAIT: Duration = Duration::from_secs(5);

/// How many times a backend's addition is tried when other backends of its pool
/// changed between its read and its transaction.
const ADD_TRIES: usize = 3;

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

    /// Runs a transaction (which also moves the generation key: see
    /// [`model::GENERATION`]), then waits until it is applied here; its revision. On a
    /// conflict, the current value of the first key that differs.
    async fn commit(
        &self,
        compares: &[Compare<'_>],
        ops: &[Op],
    ) -> Result<i64, Result<Option<Kv>, WriteError>> {
        let mut all = ops.to_vec();
        all.push(Op::Put(self.key(GENERATION), self.id.clone().into_bytes()));
        match self.etcd.txn(compares, &all).await {
            Err(e) => Err(Err(e.into())),
            Ok(Written::Conflict(current)) => Err(Ok(current)),
            Ok(Written::Done(rev)) => {
                if self.applied_up_to(rev, APPLY_WAIT).await {
                    Ok(rev)
                } else {
                    Err(Err(WriteError::NotApplied(rev)))
                }
            }
        }
    }

    /// [`Self::commit`] for a write whose conflict is a stale read of `what`.
    async fn commit_on(
        &self,
        what: &str,
        compares: &[Compare<'_>],
        ops: &[Op],
    ) -> Result<i64, WriteError> {
        self.commit(compares, ops).await.map_err(|e| match e {
            Ok(current) => {
                let value = current.and_then(|kv| serde_json::from_slice(&kv.value).ok());
                WriteError::Stale(what.to_string(), value)
            }
            Err(e) => e,
        })
    }

    /// The entry of pool `name`: its full key, revision and value.
    fn pool_entry(&self, name: &str) -> Result<(String, i64, Value), WriteError> {
        let m = self.mirror();
        let key = model::pool_key(name);
        match m.entries.get(&key) {
            Some(e) if matches!(e.object, Object::Pool(_)) => {
                Ok((self.key(&key), e.mod_revision, e.raw.clone()))
            }
            _ => Err(WriteError::NotFound(format!("no pool named '{name}'"))),
        }
    }

    /// Adds a backend to pool `pool`; its id. Its name and URL must be new in the pool
    /// as etcd has it, which the transaction checks: no backend of the pool written
    /// since the read. One that is left out when applied is taken out again.
    pub(crate) async fn add_backend(
        &self,
        pool: &str,
        spec: &BackendSpec,
    ) -> Result<u64, WriteError> {
        self.check_connected()?;
        let key = self.key(&model::backend_key(pool, &spec.name));
        let value =
            serde_json::to_vec(&BackendObject::of(spec, AdminState::Active)).unwrap_or_default();
        for _ in 0..ADD_TRIES {
            let pool_rev = self.pool_revision(pool).await?;
            let siblings = self.key(&model::backends_of(pool));
            let (read_at, kvs) = self.etcd.range_prefix(&siblings).await?;
            if let Some(b) = kvs
                .iter()
                .filter_map(|kv| serde_json::from_slice::<BackendObject>(&kv.value).ok())
                .find(|b| b.url == spec.url)
            {
                return Err(WriteError::Conflict(format!(
                    "backend URL '{}' is in pool '{pool}' already (as '{}')",
                    b.url, b.name
                )));
            }
            let pool_key = self.key(&model::pool_key(pool));
            let compares = [
                Compare::Mod(&key, 0),
                Compare::Mod(&pool_key, pool_rev),
                Compare::UnchangedSince(&siblings, read_at),
            ];
            match self
                .commit(&compares, &[Op::Put(key.clone(), value.clone())])
                .await
            {
                Ok(rev) => return self.check_applied(&key, rev).await,
                Err(Ok(Some(kv))) if kv.key == key => {
                    return Err(WriteError::Conflict(format!(
                        "duplicate backend name '{}' in pool '{pool}'",
                        spec.name
                    )))
                }
                // The pool or another of its backends changed meanwhile: read again.
                Err(Ok(_)) => continue,
                Err(Err(e)) => return Err(e),
            }
        }
        Err(WriteError::Conflict(format!(
            "pool '{pool}' kept changing while the backend was added: try again"
        )))
    }

    /// Pool `name`'s revision as etcd has it now: one just added through another
    /// instance may not have reached this one yet.
    async fn pool_revision(&self, name: &str) -> Result<i64, WriteError> {
        self.pools_now()
            .await?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, rev)| rev)
            .ok_or_else(|| WriteError::NotFound(format!("no pool named '{name}'")))
    }

    /// A backend just written at `rev` is in the site as id `rev`; if applying left it
    /// out (another backend of the pool has its URL), it is taken out of etcd again.
    async fn check_applied(&self, key: &str, rev: i64) -> Result<u64, WriteError> {
        let id = rev as u64;
        if self.site.backend(id).is_ok() {
            return Ok(id);
        }
        let why = self
            .left_out_reason(key)
            .unwrap_or_else(|| "it was not applied".into());
        // Only if nobody changed it since.
        let _ = self
            .etcd
            .txn(&[Compare::Mod(key, rev)], &[Op::Delete(key.to_string())])
            .await;
        Err(WriteError::Conflict(format!("backend not added: {why}")))
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
        self.commit_on(
            &what,
            &[Compare::Mod(&key, rev)],
            &[Op::Put(key.clone(), value)],
        )
        .await
        .map(|_| ())
    }

    /// Removes backend `id`; its name.
    pub(crate) async fn remove_backend(&self, id: u64) -> Result<String, WriteError> {
        self.check_connected()?;
        let (key, rev, b) = self.backend_entry(id)?;
        let what = format!("backend {id}");
        self.commit_on(
            &what,
            &[Compare::Mod(&key, rev)],
            &[Op::Delete(key.clone())],
        )
        .await
        .map(|_| b.name)
    }

    /// Backend `id`'s full key, revision and value, from the mirror (whether or not
    /// applying took it in).
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
        let put = [Op::Put(key.clone(), raw.to_string().into())];
        self.commit_on(&what, &[Compare::Mod(&key, rev)], &put)
            .await
            .map(|_| ())
    }

    /// Adds the pool `draft`, then each of its backends in a transaction of its own (a
    /// backend's id is the revision that created it, so two created at once would
    /// share one). If a backend cannot be added, the pool goes again: all or nothing.
    pub(crate) async fn add_pool(&self, draft: &PoolDraft) -> Result<(), WriteError> {
        self.check_connected()?;
        let key = self.key(&model::pool_key(&draft.name));
        let put = [Op::Put(
            key.clone(),
            model::pool_value(draft).to_string().into(),
        )];
        match self.commit(&[Compare::Mod(&key, 0)], &put).await {
            Ok(_) => {}
            Err(Ok(_)) => {
                return Err(WriteError::Conflict(format!(
                    "a pool named '{}' exists already",
                    draft.name
                )))
            }
            Err(Err(e)) => return Err(e),
        }
        for b in &draft.backends {
            if let Err(e) = self.add_backend(&draft.name, b).await {
                let gone = [
                    Op::Delete(key.clone()),
                    Op::DeletePrefix(self.key(&model::backends_of(&draft.name))),
                ];
                let _ = self.commit(&[], &gone).await;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Removes pool `name` and its backends; refused while a route names it, or if it
    /// is the last one. Compared on the generation key, so that two instances cannot
    /// each remove one of the last two pools.
    pub(crate) async fn remove_pool(&self, name: &str) -> Result<(), WriteError> {
        self.check_connected()?;
        let (key, rev, _) = self.pool_entry(name)?;
        let (routes_rev, naming, generation) = {
            let m = self.mirror();
            let routes = m.entries.get(ROUTES_KEY);
            let naming: Vec<usize> = match routes.map(|e| &e.object) {
                Some(Object::Routes(list)) => (0..list.len())
                    .filter(|&i| list[i].names_pool(name))
                    .collect(),
                _ => Vec::new(),
            };
            let generation = m.entries.get(GENERATION).map_or(0, |e| e.mod_revision);
            (routes.map_or(0, |e| e.mod_revision), naming, generation)
        };
        if !naming.is_empty() {
            return Err(WriteError::Conflict(format!(
                "pool '{name}' is named by routes {naming:?}: change the routes first (PUT /admin/routes)"
            )));
        }
        if self.pools_now().await?.len() <= 1 {
            return Err(WriteError::Conflict(
                "the last pool cannot be removed".into(),
            ));
        }
        let (routes_key, generation_key) = (self.key(ROUTES_KEY), self.key(GENERATION));
        let ops = [
            Op::Delete(key.clone()),
            Op::DeletePrefix(self.key(&model::backends_of(name))),
        ];
        let compares = [
            Compare::Mod(&key, rev),
            Compare::Mod(&routes_key, routes_rev),
            Compare::Mod(&generation_key, generation),
        ];
        let what = format!("the configuration (pool '{name}', the routes, or another write)");
        self.commit_on(&what, &compares, &ops).await.map(|_| ())
    }

    /// Replaces the route list; every route must name a pool etcd has, and each of
    /// them is compared too, so that none goes meanwhile.
    pub(crate) async fn set_routes(&self, routes: &[RouteSpec]) -> Result<(), WriteError> {
        self.check_connected()?;
        if routes.len() > crate::site::MAX_ROUTES {
            return Err(WriteError::Invalid(format!(
                "{} routes: at most {} are allowed",
                routes.len(),
                crate::site::MAX_ROUTES
            )));
        }
        let pools = self.pools_now().await?;
        let mut named: Vec<(String, i64)> = Vec::new();
        // A split route names each of its sides' pools.
        let names = routes
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.pools().map(move |p| (i, p)));
        for (i, pool) in names {
            let Some((_, rev)) = pools.iter().find(|(n, _)| n == pool) else {
                return Err(WriteError::Invalid(format!(
                    "route {i} names the unknown pool '{pool}'"
                )));
            };
            let key = self.key(&model::pool_key(pool));
            if !named.iter().any(|(k, _)| *k == key) {
                named.push((key, *rev));
            }
        }
        let rev = self
            .mirror()
            .entries
            .get(ROUTES_KEY)
            .map_or(0, |e| e.mod_revision);
        let key = self.key(ROUTES_KEY);
        let value = model::routes_value(routes).to_string();
        let mut compares = vec![Compare::Mod(&key, rev)];
        compares.extend(named.iter().map(|(k, r)| Compare::Mod(k, *r)));
        let put = [Op::Put(key.clone(), value.into())];
        self.commit_on("the route list (or a pool it names)", &compares, &put)
            .await
            .map(|_| ())
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
}

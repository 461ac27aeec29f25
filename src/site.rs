//! Every pool and the routes to them (`docs/routing.md`).
//!
//! The request path reads one immutable [`Routing`] — the pools in order and the route
//! table over them — through `arc-swap`, as it reads a pool's [`crate::pool::Snapshot`];
//! a change of pools or routes (the admin API, a reload) builds a new one and publishes
//! it whole, so a request sees either the old routes and pools or the new ones. A
//! request holds the pool that took it until it ends: a pool removed meanwhile finishes
//! its requests in flight.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::config::policy::Policies;
use crate::config::{PoolSpec, RouteSpec};
use crate::mirror::Mirror;
use crate::pool::{Backend, Hub, Pool, PoolError, Source};
use crate::route::{Route, RouteTable};
use crate::split::Splitter;

pub(crate) use crate::config::pools::MAX_ROUTES;

/// Route counters are kept for at least this many routes, so a route list that grows a
/// little does not move them.
const MIN_ROUTE_COUNTERS: usize = 64;

/// What the request path reads: the pools and the routes to them.
#[derive(Debug)]
pub(crate) struct Routing {
    /// The pools, in order; the first is the one the single-pool admin routes address.
    pub(crate) pools: Vec<Arc<Pool>>,
    /// The routes as given, in order.
    pub(crate) routes: Vec<RouteSpec>,
    table: RouteTable,
    /// Requests taken, by route index.
    hits: Arc<[AtomicU64]>,
    /// The pool and policies of a single route without conditions (the single-pool
    /// form): every request goes there without a lookup.
    only: Option<(Arc<Pool>, Option<Arc<RoutePolicy>>)>,
    /// Each route's policies, by route index; `None` for a route without any, which
    /// runs none (`docs/policies.md`).
    policies: Vec<Option<Arc<RoutePolicy>>>,
    /// Each split route's sides, by route index (`docs/traffic.md`, "Splits").
    splits: Vec<Option<Splitter>>,
    /// Each mirrored route's mirror, by route index (`docs/traffic.md`, "Mirrors").
    mirrors: Vec<Option<Arc<Mirror>>>,
}

/// A route's policies with what they keep while the routing table lives, and after it
/// for a route that keeps its index, conditions and policies in the next table.
pub(crate) struct RoutePolicy {
    /// As configured.
    pub(crate) spec: Policies,
    /// Requests its rate limit answered `429`.
    pub(crate) limited: AtomicU64,
    /// What its `jwt` refused and how its `forward_auth` ended.
    pub(crate) access: Arc<crate::stats::AccessCounts>,
    /// The keys of its `jwt` when they come from a `jwks_url` (shared by every route
    /// and routing table naming the URL).
    pub(crate) jwks: Option<Arc<crate::jwks::Source>>,
    /// The steps as the request path runs them, with what each keeps (a rate limit's
    /// buckets, basic auth's verified credentials): built by the request core
    /// (`proxy/chain/`) from `spec` the first time a request needs them, opaque here.
    pub(crate) steps: Kept,
}

impl std::fmt::Debug for RoutePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutePolicy")
            .field("spec", &self.spec)
            .field("limited", &self.limited)
            .finish_non_exhaustive()
    }
}

impl RoutePolicy {
    fn new(spec: &Policies) -> RoutePolicy {
        RoutePolicy {
            spec: spec.clone(),
            limited: AtomicU64::new(0),
            access: Default::default(),
            jwks: match spec.jwt.as_ref().map(|j| &j.keys) {
                Some(crate::config::auth::Jwks::Url { url, refresh }) => {
                    Some(crate::jwks::source(url, *refresh))
                }
                _ => None,
            },
            steps: Kept::default(),
        }
    }
}

/// A value of a type this module does not name, built the first time it is asked for:
/// what the request core keeps for a route. Read without `Any`'s check, a call through
/// the value's table and a 16-byte comparison on every request of a route with a policy
/// (`docs/performance.md`, "Who may come in"): its one reader builds it, and always as
/// the same type.
#[derive(Default)]
pub(crate) struct Kept {
    cell: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl Kept {
    /// The value, built by `init` the first time.
    ///
    /// # Safety
    ///
    /// Every call for one `Kept` names the same `T` (checked in debug builds).
    #[inline]
    pub(crate) unsafe fn get_or_init<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> &T {
        let value = self.cell.get_or_init(|| Box::new(init()));
        debug_assert!(value.is::<T>(), "a route's kept steps read as another type");
        let value: *const (dyn Any + Send + Sync) = &**value;
        // SAFETY: the value was built by `init` of a call that named `T`, as this one
        // does (the caller's promise).
        unsafe { &*(value as *const T) }
    }
}

/// The pool, policies, split and mirror of the single-pool form's one route.
pub(crate) type Only<'r> = (
    &'r Arc<Pool>,
    Option<&'r Arc<RoutePolicy>>,
    Option<&'r Splitter>,
    Option<&'r Arc<Mirror>>,
);

/// What the first route that takes a request says.
#[derive(Debug)]
pub(crate) struct Hit<'r> {
    /// The route.
    pub(crate) route: &'r Route,
    /// Its pool.
    pub(crate) pool: &'r Arc<Pool>,
    /// Its policies, when it has any.
    pub(crate) policies: Option<&'r Arc<RoutePolicy>>,
    /// Its sides, when it splits its requests among pools (then `pool` is the first
    /// side's; [`Routing::side`] picks).
    pub(crate) split: Option<&'r Splitter>,
    /// Its mirror, when it has one.
    pub(crate) mirror: Option<&'r Arc<Mirror>>,
    /// Its place in the routing table.
    pub(crate) index: usize,
}

impl Routing {
    /// The ids of every backend of every pool (a backend connection to any other is
    /// no longer needed).
    pub(crate) fn backend_ids(&self) -> std::collections::HashSet<u64> {
        let ids = |p: &Arc<Pool>| {
            p.snapshot()
                .backends
                .iter()
                .map(|b| b.id)
                .collect::<Vec<_>>()
        };
        self.pools.iter().flat_map(ids).collect()
    }

    /// The pool (and the route's policies) every request goes to, when one route
    /// without conditions is all there is; counts the request for it. A split route
    /// without conditions is such a route too: its splitter comes with it.
    #[inline]
    pub(crate) fn only(&self) -> Option<Only<'_>> {
        let (pool, policy) = self.only.as_ref()?;
        self.hits[0].fetch_add(1, Ordering::Relaxed);
        let split = self.splits.first().and_then(Option::as_ref);
        let mirror = self.mirrors.first().and_then(Option::as_ref);
        Some((pool, policy.as_ref(), split, mirror))
    }

    /// The first route that takes `req`, its pool and policies; counts the request for
    /// it.
    pub(crate) fn find(&self, req: &crate::route::Request<'_>) -> Option<Hit<'_>> {
        let (i, r) = self.table.find(req)?;
        self.hits[i].fetch_add(1, Ordering::Relaxed);
        Some(self.hit(i, r))
    }

    fn hit<'r>(&'r self, i: usize, r: &'r Route) -> Hit<'r> {
        Hit {
            route: r,
            pool: &self.pools[r.pool],
            policies: self.policies.get(i).and_then(Option::as_ref),
            split: self.splits.get(i).and_then(Option::as_ref),
            mirror: self.mirrors.get(i).and_then(Option::as_ref),
            index: i,
        }
    }

    /// Route `i`'s mirror, when it has one.
    pub(crate) fn mirror(&self, i: usize) -> Option<&Arc<Mirror>> {
        self.mirrors.get(i)?.as_ref()
    }

    /// Each mirror, in route order.
    pub(crate) fn mirrors(&self) -> impl Iterator<Item = &Arc<Mirror>> {
        self.mirrors.iter().flatten()
    }

    /// The pool a split route's next request goes to, whose key hashed to `key`;
    /// counted.
    #[inline]
    pub(crate) fn side(&self, split: &Splitter, key: Option<u64>) -> &Arc<Pool> {
        let i = split.pick(key);
        self.pools.get(i).unwrap_or(&self.pools[0])
    }

    /// Each split route's index and its sides' pool names and counts.
    pub(crate) fn split_counts(&self) -> Vec<(usize, Vec<(&str, u64)>)> {
        (0..self.splits.len())
            .filter_map(|i| Some((i, self.split_taken(i)?)))
            .collect()
    }

    /// The sides' pool names and counts of route `i`, when it splits.
    pub(crate) fn split_taken(&self, i: usize) -> Option<Vec<(&str, u64)>> {
        Some(self.splits.get(i)?.as_ref()?.taken())
    }

    /// What [`Self::find`] would say, with the route's index, without counting anything
    /// (`POST /admin/explain`).
    pub(crate) fn peek(&self, req: &crate::route::Request<'_>) -> Option<(usize, Hit<'_>)> {
        let (i, r) = self.table.find(req)?;
        Some((i, self.hit(i, r)))
    }

    /// Requests each route's rate limit answered `429`, in route order (0 for a route
    /// without one).
    pub(crate) fn rate_limited(&self) -> Vec<u64> {
        (self.policies.iter())
            .map(|p| p.as_ref().map_or(0, |p| p.limited.load(Ordering::Relaxed)))
            .collect()
    }

    /// Each route's policies and what they keep, in route order (`None`: none).
    pub(crate) fn route_policies(&self) -> &[Option<Arc<RoutePolicy>>] {
        &self.policies
    }

    /// Requests each route took, in route order.
    pub(crate) fn route_requests(&self) -> Vec<u64> {
        (0..self.routes.len())
            .map(|i| self.hits[i].load(Ordering::Relaxed))
            .collect()
    }

    /// The indices of the routes to `pool`.
    pub(crate) fn routes_to(&self, pool: &str) -> Vec<usize> {
        (0..self.routes.len())
            .filter(|&i| self.routes[i].names_pool(pool))
            .collect()
    }
}

/// Why a change of pools or routes was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SiteError {
    /// No pool has that name.
    NoSuchPool(String),
    /// A pool of that name exists already.
    PoolExists(String),
    /// Routes still send requests to the pool.
    PoolInUse(String, Vec<usize>),
    /// The last pool cannot go.
    LastPool,
    /// A route names a pool that does not exist.
    UnknownPool(usize, String),
    /// More than [`MAX_ROUTES`] routes.
    TooManyRoutes(usize),
}

impl std::fmt::Display for SiteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SiteError::NoSuchPool(n) => write!(f, "no pool named '{n}'"),
            SiteError::PoolExists(n) => write!(f, "a pool named '{n}' exists already"),
            SiteError::PoolInUse(n, routes) => write!(
                f,
                "pool '{n}' is named by routes {routes:?}: change the routes first (PUT /admin/routes)"
            ),
            SiteError::LastPool => f.write_str("the last pool cannot be removed"),
            SiteError::UnknownPool(i, n) => write!(f, "route {i} names the unknown pool '{n}'"),
            SiteError::TooManyRoutes(n) => {
                write!(f, "{n} routes: at most {MAX_ROUTES} are allowed")
            }
        }
    }
}

impl std::error::Error for SiteError {}

/// Where the pools' health checks and upkeep run.
#[derive(Debug, Clone)]
struct Tasks {
    rt: tokio::runtime::Handle,
    stop: watch::Receiver<bool>,
    resolvers: crate::discovery::Resolvers,
}

#[derive(Debug)]
struct Control {
    hits: Arc<[AtomicU64]>,
    tasks: Option<Tasks>,
}

/// The pools and routes, and the one place that changes them.
#[derive(Debug)]
pub(crate) struct Site {
    /// What every pool shares.
    pub(crate) hub: Arc<Hub>,
    /// The DNS servers the pools' discovery asks (`docs/discovery.md`).
    pub(crate) resolvers: crate::discovery::Resolvers,
    /// `deny_clients`/`allow_clients`, which a reload replaces; `clients_open` says
    /// whether they refuse anybody, so that a listener without lists reads one flag.
    pub(crate) clients: ArcSwap<crate::ipset::Admission>,
    clients_open: std::sync::atomic::AtomicBool,
    control: Mutex<Control>,
    routing: ArcSwap<Routing>,
}

impl Site {
    /// The pools of `pools` and the routes of `routes`; every route must name one of
    /// the pools.
    pub(crate) fn new(pools: &[PoolSpec], routes: &[RouteSpec]) -> Result<Site, SiteError> {
        let hub = Arc::new(Hub::new());
        let pools: Vec<Arc<Pool>> = pools
            .iter()
            .map(|p| Arc::new(Pool::new(p, Arc::clone(&hub), Source::Config)))
            .collect();
        let hits = counters(routes.len(), None);
        let routing = build(pools, routes.to_vec(), Arc::clone(&hits), None)?;
        Ok(Site {
            hub,
            resolvers: Default::default(),
            clients: ArcSwap::from_pointee(crate::ipset::Admission::default()),
            clients_open: std::sync::atomic::AtomicBool::new(true),
            control: Mutex::new(Control { hits, tasks: None }),
            routing: ArcSwap::from_pointee(routing),
        })
    }

    /// Sets `deny_clients`/`allow_clients` for the connections accepted from now on.
    pub(crate) fn set_clients(&self, clients: &crate::ipset::Admission) {
        let open = clients.is_open();
        self.clients.store(Arc::new(clients.clone()));
        self.clients_open
            .store(open, std::sync::atomic::Ordering::Release);
    }

    /// Whether a connection from `ip` may come in (`deny_clients`, `allow_clients`);
    /// one refused is counted.
    #[inline]
    pub(crate) fn admits_client(&self, ip: std::net::IpAddr) -> bool {
        if self.clients_open.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        let admitted = self.clients.load().admits(ip);
        if !admitted {
            crate::stats::client_denied(crate::stats::Denied::Accept);
        }
        admitted
    }

    fn lock(&self) -> MutexGuard<'_, Control> {
        // Nothing panics while holding it; the state stays consistent either way.
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The routing the request path reads (lock-free).
    #[inline]
    pub(crate) fn routing(&self) -> arc_swap::Guard<Arc<Routing>> {
        self.routing.load()
    }

    /// The pools, in order.
    pub(crate) fn pools(&self) -> Vec<Arc<Pool>> {
        self.routing.load().pools.clone()
    }

    /// The first pool, which the single-pool admin routes address.
    pub(crate) fn first(&self) -> Option<Arc<Pool>> {
        self.routing.load().pools.first().cloned()
    }

    /// The pool named `name`.
    pub(crate) fn pool(&self, name: &str) -> Result<Arc<Pool>, SiteError> {
        self.routing
            .load()
            .pools
            .iter()
            .find(|p| &*p.name == name)
            .cloned()
            .ok_or_else(|| SiteError::NoSuchPool(name.to_string()))
    }

    /// The backend `id`, in whichever pool, with its pool.
    pub(crate) fn backend(&self, id: u64) -> Result<(Arc<Pool>, Arc<Backend>), PoolError> {
        self.routing
            .load()
            .pools
            .iter()
            .find_map(|p| p.get(id).ok().map(|b| (Arc::clone(p), b)))
            .ok_or(PoolError::NotFound(id))
    }

    /// The backend `id` if a pool has it, read from the routing tables (lock-free: for
    /// the request path's failure records).
    pub(crate) fn live_backend(&self, id: u64) -> Option<Arc<Backend>> {
        self.routing
            .load()
            .pools
            .iter()
            .find_map(|p| p.snapshot().backends.iter().find(|b| b.id == id).cloned())
    }

    /// Runs every pool's health checks and upkeep on `rt` until `stop` flips (or the
    /// pool is removed); pools added later get theirs there too.
    pub(crate) fn start_tasks(&self, rt: tokio::runtime::Handle, stop: watch::Receiver<bool>) {
        let mut c = self.lock();
        let tasks = Tasks {
            rt,
            stop,
            resolvers: self.resolvers.clone(),
        };
        for p in &self.routing.load().pools {
            spawn_tasks(&tasks, p);
        }
        c.tasks = Some(tasks);
    }

    /// Adds the pool `spec` at the end, its backends owned by `source`; no route reaches
    /// it until the routes say so.
    pub(crate) fn add_pool(&self, spec: &PoolSpec, source: Source) -> Result<Arc<Pool>, SiteError> {
        let mut c = self.lock();
        let current = self.routing.load();
        if current.pools.iter().any(|p| *p.name == *spec.name) {
            return Err(SiteError::PoolExists(spec.name.clone()));
        }
        let pool = Arc::new(Pool::new(spec, Arc::clone(&self.hub), source));
        let mut pools = current.pools.clone();
        pools.push(Arc::clone(&pool));
        self.publish(&mut c, pools, current.routes.clone())?;
        if let Some(t) = &c.tasks {
            spawn_tasks(t, &pool);
        }
        Ok(pool)
    }

    /// Removes the pool `name`, which no route may name; its requests in flight finish.
    pub(crate) fn remove_pool(&self, name: &str) -> Result<Arc<Pool>, SiteError> {
        let mut c = self.lock();
        let current = self.routing.load();
        let pos = current
            .pools
            .iter()
            .position(|p| &*p.name == name)
            .ok_or_else(|| SiteError::NoSuchPool(name.to_string()))?;
        let naming = current.routes_to(name);
        if !naming.is_empty() {
            return Err(SiteError::PoolInUse(name.to_string(), naming));
        }
        if current.pools.len() == 1 {
            return Err(SiteError::LastPool);
        }
        let mut pools = current.pools.clone();
        let pool = pools.remove(pos);
        self.publish(&mut c, pools, current.routes.clone())?;
        pool.retire();
        Ok(pool)
    }

    /// Replaces the routes, all or nothing.
    pub(crate) fn set_routes(&self, routes: Vec<RouteSpec>) -> Result<(), SiteError> {
        let mut c = self.lock();
        let pools = self.routing.load().pools.clone();
        self.publish(&mut c, pools, routes)
    }

    /// Replaces pools and routes in one change (a reload). `arrive` is given the pools
    /// now and returns the pools to publish; it runs under the control lock, so no
    /// admin change can come in between. Pools that are new get their tasks, pools no
    /// longer listed are retired. Returns the pools as they were.
    pub(crate) fn replace(
        &self,
        arrive: impl FnOnce(&[Arc<Pool>]) -> Vec<Arc<Pool>>,
        routes: Vec<RouteSpec>,
    ) -> Result<Vec<Arc<Pool>>, SiteError> {
        let mut c = self.lock();
        let before = self.routing.load().pools.clone();
        let pools = arrive(&before);
        self.publish(&mut c, pools.clone(), routes)?;
        let listed = |p: &Arc<Pool>, list: &[Arc<Pool>]| list.iter().any(|q| Arc::ptr_eq(p, q));
        for p in &before {
            if !listed(p, &pools) {
                p.retire();
            }
        }
        if let Some(t) = &c.tasks {
            for p in &pools {
                if !listed(p, &before) {
                    spawn_tasks(t, p);
                }
            }
        }
        Ok(before)
    }

    /// Builds and publishes the routing of `pools` and `routes`, or changes nothing.
    fn publish(
        &self,
        c: &mut Control,
        pools: Vec<Arc<Pool>>,
        routes: Vec<RouteSpec>,
    ) -> Result<(), SiteError> {
        // Counters grow (keeping their counts) when the list outgrows them; a request
        // counted on the old ones in between is the price of a rare change.
        let hits = if routes.len() > c.hits.len() {
            counters(routes.len(), Some(&c.hits))
        } else {
            Arc::clone(&c.hits)
        };
        let n = routes.len();
        let routing = build(pools, routes, Arc::clone(&hits), Some(&self.routing()))?;
        self.routing.store(Arc::new(routing));
        // A route that takes an index later starts from zero, not from the count of the
        // route that had it before.
        for h in hits.iter().skip(n) {
            h.store(0, Ordering::Relaxed);
        }
        c.hits = hits;
        Ok(())
    }
}

/// Route counters for at least `n` routes, starting from `old`'s counts.
fn counters(n: usize, old: Option<&Arc<[AtomicU64]>>) -> Arc<[AtomicU64]> {
    let len = n.max(MIN_ROUTE_COUNTERS).next_power_of_two();
    (0..len)
        .map(|i| {
            let v = old
                .and_then(|o| o.get(i))
                .map_or(0, |c| c.load(Ordering::Relaxed));
            AtomicU64::new(v)
        })
        .collect()
}

/// The routing of `pools` and `routes`; every route must name pools among them. A split
/// route goes on from its place in `old` when it keeps its index and conditions.
fn build(
    pools: Vec<Arc<Pool>>,
    routes: Vec<RouteSpec>,
    hits: Arc<[AtomicU64]>,
    old: Option<&Routing>,
) -> Result<Routing, SiteError> {
    if routes.len() > MAX_ROUTES {
        return Err(SiteError::TooManyRoutes(routes.len()));
    }
    let mut table = Vec::with_capacity(routes.len());
    let mut splits = Vec::with_capacity(routes.len());
    let mut mirrors = Vec::with_capacity(routes.len());
    for (i, r) in routes.iter().enumerate() {
        let index = |name: &str| {
            (pools.iter())
                .position(|p| *p.name == *name)
                .ok_or_else(|| SiteError::UnknownPool(i, name.to_string()))
        };
        // A redirect route answers itself: its pool index is never read.
        let named: Vec<usize> = r.pools().map(index).collect::<Result<_, _>>()?;
        table.push(r.to_route(named.first().copied().unwrap_or(0)));
        let kept = old.filter(|o| o.routes.get(i).is_some_and(|o| o.same_conditions(r)));
        let before = kept.and_then(|o| o.mirrors.get(i)?.as_deref());
        let mirror = (r.mirror.as_ref())
            .map(|m| {
                Ok::<_, SiteError>(Arc::new(Mirror::new(
                    i,
                    m,
                    Arc::clone(&pools[index(&m.pool)?]),
                    before,
                )))
            })
            .transpose()?;
        mirrors.push(mirror);
        let before = kept.and_then(|o| o.splits.get(i)?.as_ref());
        splits.push((r.split.as_ref()).map(|s| Splitter::new(s, named, before)));
    }
    let policies: Vec<Option<Arc<RoutePolicy>>> = (routes.iter().enumerate())
        .map(|(i, r)| policy_of(i, r, old))
        .collect();
    let only = match (table.as_slice(), policies.as_slice(), splits.as_slice()) {
        // `pools[r.pool]` is the first side's when the route splits.
        ([r], [p], [_]) if r.is_catch_all() => Some((Arc::clone(&pools[r.pool]), p.clone())),
        _ => None,
    };
    Ok(Routing {
        pools,
        routes,
        table: RouteTable::new(table),
        hits,
        only,
        policies,
        splits,
        mirrors,
    })
}

/// Route `i`'s policies and what they keep: `old`'s when the route there had the same
/// conditions and policies (its rate limit's buckets, its counts and remembered
/// credentials go on across a change of the routes or a reload, `docs/traffic.md`), else
/// afresh. `None` for a route without any.
fn policy_of(i: usize, r: &RouteSpec, old: Option<&Routing>) -> Option<Arc<RoutePolicy>> {
    if r.policies.is_empty() {
        return None;
    }
    let kept = old.and_then(|o| {
        let before = o.routes.get(i)?;
        let same = before.same_conditions(r) && before.policies == r.policies;
        same.then(|| o.policies.get(i)?.clone())?
    });
    Some(kept.unwrap_or_else(|| Arc::new(RoutePolicy::new(&r.policies))))
}

/// Starts `pool`'s health checks, upkeep and discovery.
fn spawn_tasks(t: &Tasks, pool: &Arc<Pool>) {
    t.rt.spawn(crate::health::run(Arc::clone(pool), t.stop.clone()));
    t.rt.spawn(crate::discovery::run(
        Arc::clone(pool),
        t.resolvers.clone(),
        t.stop.clone(),
    ));
    t.rt.spawn(crate::pool::maintenance::run(
        Arc::clone(pool),
        t.stop.clone(),
    ));
}

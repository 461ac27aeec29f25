//! The admin routes of pools and routes (`docs/admin-api.md`, "Pools and routes"):
//! `/admin/pools…` and `/admin/routes`. A pool's strategy and backends routes answer as
//! their single-pool twins do, for that pool.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{add_to, strategy_of, switch_strategy, AdminCtx, ApiError, ApiResult};
use crate::config::pools::{self, PoolDraft, RouteView};
use crate::config::tcp::PoolMode;
use crate::config::BackendEntry;
use crate::pool::{BackendView, Mode, Pool};
use crate::site::{Routing, Site};

/// A pool as the API shows it.
#[derive(Debug, Serialize)]
pub(crate) struct PoolView {
    name: String,
    strategy: &'static str,
    backends: Vec<BackendView>,
    /// Indices of the routes to it.
    routes: Vec<usize>,
    /// What it carries: `http` requests or `tcp` connections (`docs/tcp.md`).
    mode: &'static str,
    /// What it picks from: `primaries`, `backups` (no primary is eligible) or `panic`.
    picking: &'static str,
    /// A TCP pool's connections taken and bytes copied each way; `null` for an HTTP
    /// pool.
    tcp: Option<TcpView>,
    /// Requests waiting in its queue for a backend under its `max_conns`.
    queue_length: usize,
    /// Where discovery finds its backends and how the last lookup went; `null` for a
    /// pool without `discover`.
    discovery: Option<DiscoveryView>,
}

/// A pool's `discovery` object (`docs/discovery.md`, "The admin API and the dashboard").
#[derive(Debug, Serialize)]
pub(crate) struct DiscoveryView {
    /// `srv`, `dns` or `file`.
    kind: &'static str,
    /// The name looked up or the file read.
    target: String,
    /// Backends it found that are in the pool.
    backends: usize,
    /// When a lookup last succeeded (RFC 3339).
    updated_at: Option<String>,
    /// When the next lookup is due (RFC 3339).
    next_at: Option<String>,
    /// Why the last lookup failed; `null` when it succeeded.
    error: Option<String>,
}

fn discovery_view(pool: &Pool) -> Option<DiscoveryView> {
    let spec = pool.discover()?;
    let st = pool.discovery().clone();
    let rfc3339 = |t: std::time::SystemTime| humantime::format_rfc3339_millis(t).to_string();
    Some(DiscoveryView {
        kind: spec.kind(),
        target: spec.target_text(),
        backends: pool.discovered_count(),
        updated_at: st.updated_at.map(rfc3339),
        next_at: st.next_at.map(rfc3339),
        error: st.error,
    })
}

fn view(routing: &Routing, pool: &Pool) -> PoolView {
    PoolView {
        name: pool.name.to_string(),
        strategy: pool.strategy().name(),
        backends: super::views(pool),
        routes: routing.routes_to(&pool.name),
        mode: pool.settings.mode.as_str(),
        picking: match pool.snapshot().mode {
            Mode::Primaries => "primaries",
            Mode::Backups => "backups",
            Mode::Panic => "panic",
        },
        queue_length: pool.queue.len(),
        discovery: discovery_view(pool),
        tcp: (pool.settings.mode == PoolMode::Tcp).then(|| {
            let [(_, bytes_in), (_, bytes_out)] = pool.tcp.directions();
            TcpView {
                connections: pool.tcp.connections(),
                bytes_in,
                bytes_out,
            }
        }),
    }
}

/// A TCP pool's `tcp` object (`docs/tcp.md`).
#[derive(Debug, Serialize)]
pub(crate) struct TcpView {
    /// Client connections taken.
    connections: u64,
    /// Bytes from the clients to the backends.
    bytes_in: u64,
    /// Bytes from the backends to the clients.
    bytes_out: u64,
}

/// Every pool, in order, with its routes from the same routing.
pub(crate) fn views(site: &Site) -> Vec<PoolView> {
    let routing = site.routing();
    routing.pools.iter().map(|p| view(&routing, p)).collect()
}

fn pool_named(ctx: &AdminCtx, name: &str) -> ApiResult<Arc<Pool>> {
    Ok(ctx.site.pool(name)?)
}

/// `GET /admin/pools`.
pub(crate) async fn list(State(ctx): State<AdminCtx>) -> Json<Vec<PoolView>> {
    Json(views(&ctx.site))
}

/// `GET /admin/pools/{name}`.
pub(crate) async fn one(
    State(ctx): State<AdminCtx>,
    Path(name): Path<String>,
) -> ApiResult<Json<PoolView>> {
    let pool = pool_named(&ctx, &name)?;
    Ok(Json(view(&ctx.site.routing(), &pool)))
}

/// `POST /admin/pools`: 201 POOL; the keys a `[[pools]]` entry takes, the others from
/// the running top-level settings.
pub(crate) async fn create(State(ctx): State<AdminCtx>, body: Bytes) -> ApiResult<Response> {
    let fields: Map<String, Value> = super::parse_body(&body)?;
    let draft = draft_of(&fields)?;
    let spec = pools::pool_spec(&ctx.reloader.settings(), &draft);
    if let Some(dup) = crate::config::duplicate_backends(&spec.backends).first() {
        return Err(ApiError::bad(dup.clone()));
    }
    if let Some(over) = crate::config::over_max_backends(&spec) {
        return Err(ApiError::bad(over));
    }
    let own = (spec.backends.iter())
        .find_map(|b| crate::loops::own_backend_now(b.authority.as_str(), b.addr));
    if let Some(why) = own {
        return Err(ApiError::bad(why));
    }
    let o = &spec.settings.outlier;
    if o.base_ejection > o.max_ejection {
        return Err(ApiError::bad(format!(
            "outlier: base_ejection {:?} is longer than max_ejection {:?}",
            o.base_ejection, o.max_ejection
        )));
    }
    let pool = match &ctx.fleet {
        Some(f) => {
            f.add_pool(&draft).await?;
            ctx.site.pool(&draft.name)?
        }
        None => ctx.site.add_pool(&spec, crate::pool::Source::Admin)?,
    };
    tracing::info!(pool = %pool.name, strategy = pool.strategy().name(), "pool added");
    Ok((StatusCode::CREATED, Json(view(&ctx.site.routing(), &pool))).into_response())
}

/// A pool's name and own values from a `POST /admin/pools` body.
fn draft_of(fields: &Map<String, Value>) -> ApiResult<PoolDraft> {
    let name = match fields.get("name") {
        Some(Value::String(n)) => n.clone(),
        Some(_) => return Err(ApiError::bad("invalid name: expected a string")),
        None => return Err(ApiError::bad("missing field 'name'")),
    };
    pools::check_pool_name(&name).map_err(ApiError::bad)?;
    match fields.get("mode") {
        None => {}
        Some(Value::String(m)) if m == "http" => {}
        Some(_) => {
            let why = "mode: the admin API makes HTTP pools (\"http\"); TCP pools come from the config file";
            return Err(ApiError::bad(why));
        }
    }
    let values = pools::values_of_json(fields, &["name", "backends", "discover", "mode"])
        .map_err(ApiError::bad)?;
    let backends = match fields.get("backends") {
        Some(v) => backends_of(v)?,
        None => Vec::new(),
    };
    let discover = (fields.get("discover"))
        .map(crate::config::DiscoverSpec::from_json)
        .transpose()
        .map_err(ApiError::bad)?;
    if let Some(d) = &discover {
        d.fits(Default::default()).map_err(ApiError::bad)?;
    }
    if discover.is_some() && !backends.is_empty() {
        return Err(ApiError::bad(crate::config::discover::WITH_BACKENDS));
    }
    // The admin API makes HTTP pools; TCP pools come from the file.
    for b in &backends {
        crate::config::tcp::url_fits(&b.url, Default::default()).map_err(ApiError::bad)?;
    }
    Ok(PoolDraft {
        name,
        values,
        backends,
        discover,
        modes: Default::default(),
    })
}

/// A pool's `backends` list.
fn backends_of(v: &Value) -> ApiResult<Vec<crate::config::BackendSpec>> {
    let list: Vec<BackendEntry> = serde_json::from_value(v.clone())
        .map_err(|e| ApiError::bad(format!("invalid backends: {e}")))?;
    (list.into_iter().map(BackendEntry::spec))
        .collect::<Result<_, _>>()
        .map_err(ApiError::bad)
}

/// `DELETE /admin/pools/{name}`: 204; refused while a route names it.
pub(crate) async fn remove(
    State(ctx): State<AdminCtx>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    if let Some(f) = &ctx.fleet {
        f.remove_pool(&name).await?;
        tracing::info!(pool = %name, "pool removed");
        return Ok(StatusCode::NO_CONTENT);
    }
    let pool = ctx.site.remove_pool(&name)?;
    for b in pool.backends() {
        crate::spawn::Spawner::stop_when_idle(&b);
    }
    tracing::info!(pool = %pool.name, "pool removed");
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /admin/pools/{name}/strategy`.
pub(crate) async fn get_strategy(
    State(ctx): State<AdminCtx>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(strategy_of(&*pool_named(&ctx, &name)?))
}

/// `POST /admin/pools/{name}/strategy`.
pub(crate) async fn set_strategy(
    State(ctx): State<AdminCtx>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    switch_strategy(&ctx, &*pool_named(&ctx, &name)?, &body).await
}

/// `GET /admin/pools/{name}/backends`.
pub(crate) async fn list_backends(
    State(ctx): State<AdminCtx>,
    Path(name): Path<String>,
) -> ApiResult<Json<Vec<BackendView>>> {
    Ok(Json(super::views(&*pool_named(&ctx, &name)?)))
}

/// `POST /admin/pools/{name}/backends`.
pub(crate) async fn add_backend(
    State(ctx): State<AdminCtx>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    add_to(&ctx, &*pool_named(&ctx, &name)?, &body).await
}

/// `GET /admin/routes`: the routes in order.
pub(crate) async fn routes(State(ctx): State<AdminCtx>) -> Json<Vec<RouteView>> {
    let routing = ctx.site.routing();
    let counts = routing.route_requests();
    let limited = routing.rate_limited();
    let policies = routing.route_policies();
    Json(
        routing
            .routes
            .iter()
            .zip(counts.into_iter().zip(limited))
            .enumerate()
            .map(|(i, (r, (n, l)))| {
                let access = policies.get(i).and_then(|p| access_view(p.as_deref()?));
                RouteView::of(r, n)
                    .with_rate_limited(l)
                    .with_access(access)
                    .with_split_taken(routing.split_taken(i))
                    .with_mirror_figures(routing.mirror(i).map(|m| m.to_json()))
            })
            .collect(),
    )
}

/// `GET /admin/routes/{index}/mirror`: the route's mirror, its counts and, with
/// `compare`, its running comparison (`docs/traffic.md`, "Compare"); `404` for a route
/// without one.
pub(crate) async fn mirror(
    State(ctx): State<AdminCtx>,
    Path(index): Path<String>,
) -> ApiResult<Json<Value>> {
    let routing = ctx.site.routing();
    Ok(Json(mirror_of(&routing, &index)?.to_json()))
}

/// `DELETE /admin/routes/{index}/mirror`: its counts and figures start afresh; answers
/// them.
pub(crate) async fn reset_mirror(
    State(ctx): State<AdminCtx>,
    Path(index): Path<String>,
) -> ApiResult<Json<Value>> {
    let routing = ctx.site.routing();
    let m = mirror_of(&routing, &index)?;
    m.reset();
    tracing::info!(route = m.route, "mirror figures reset");
    Ok(Json(m.to_json()))
}

/// Route `index`'s mirror; `404` naming what is missing.
fn mirror_of<'r>(routing: &'r Routing, index: &str) -> ApiResult<&'r Arc<crate::mirror::Mirror>> {
    let i: usize = (index.parse()).map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no route '{index}' (routes are numbered from 0)"),
        )
    })?;
    if i >= routing.routes.len() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no route {i}"),
        ));
    }
    (routing.mirror(i))
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("route {i} has no mirror")))
}

/// What a route's `jwt` and `forward_auth` did: refusals, the key set held and its
/// failed fetches, the auth service's outcomes (`docs/policies.md`).
fn access_view(p: &crate::site::RoutePolicy) -> Option<serde_json::Value> {
    use crate::stats::{AuthResult, JwtRefusal};
    let mut m = serde_json::Map::new();
    if p.spec.jwt.is_some() {
        let by: serde_json::Map<_, _> = (JwtRefusal::ALL.iter().zip(p.access.jwt()))
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (k.to_string(), n.into()))
            .collect();
        m.insert("jwt_refused".into(), by.into());
    }
    if let Some(s) = &p.jwks {
        m.insert("jwks_keys".into(), s.keys().map_or(0, |k| k.len()).into());
        m.insert("jwks_fetch_failures".into(), s.failures().into());
    }
    if p.spec.forward_auth.is_some() {
        let by: serde_json::Map<_, _> = (AuthResult::ALL.iter().zip(p.access.forward_auths()))
            .map(|(k, n)| (k.to_string(), n.into()))
            .collect();
        m.insert("forward_auth".into(), by.into());
    }
    (!m.is_empty()).then_some(serde_json::Value::Object(m))
}

/// `PUT /admin/routes`: replaces the list, all valid or nothing changed.
pub(crate) async fn set_routes(
    State(ctx): State<AdminCtx>,
    body: Bytes,
) -> ApiResult<Json<Vec<RouteView>>> {
    let list: Vec<RouteView> = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad(format!("invalid JSON body: expected a list of routes: {e}")))?;
    if list.is_empty() {
        return Err(ApiError::bad(
            "an empty route list would answer every request 404: give at least one route",
        ));
    }
    let specs = list
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.spec()
                .map_err(|e| ApiError::bad(format!("route {i}: {e}")))
        })
        .collect::<ApiResult<Vec<_>>>()?;
    let own = (specs.iter().enumerate())
        .find_map(|(i, r)| Some((i, r.policies.own_service(crate::loops::own_url_now)?)));
    if let Some((i, why)) = own {
        return Err(ApiError::bad(format!("route {i}: {why}")));
    }
    let verifies = ctx.reloader.tls().is_some_and(|t| t.asks_client_certs());
    if let Some(i) = specs.iter().position(|r| r.policies.client_cert.is_some()) {
        if !verifies {
            return Err(ApiError::bad(format!(
                "route {i}: client_cert needs [tls.client_auth]: no client certificate is verified without it"
            )));
        }
    }
    match &ctx.fleet {
        Some(f) => f.set_routes(&specs).await?,
        None => ctx.site.set_routes(specs)?,
    }
    tracing::info!(routes = ctx.site.routing().routes.len(), "routes replaced");
    Ok(routes(State(ctx)).await)
}

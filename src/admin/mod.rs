//! The admin API (`docs/admin-api.md`): JSON in and out, errors as `{"error": "…"}`.
//!
//! Every route here calls the same pool operations; none of them touches the request
//! path beyond publishing a new routing table.

mod fleet;
mod lab;
mod listener;
mod pools;

use std::future::Future;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use crate::config::{backend_spec, BackendEntry, MAX_WEIGHT};
use crate::pool::{AdminState as BackendState, Backend, BackendView, Hub, Pool, PoolError};
use crate::site::{Site, SiteError};
use crate::spawn::{SpawnError, SpawnRequest, Spawner};
use crate::store::fleet::Fleet;
use crate::strategy::StrategyKind;
use crate::traffic::{Plan, Progress, StartError, Traffic, MAX_RPS, MAX_SECONDS};

/// What the admin handlers share.
#[derive(Clone)]
pub(crate) struct AdminCtx {
    site: Arc<Site>,
    token: Option<Arc<str>>,
    spawner: Arc<Spawner>,
    traffic: Arc<Traffic>,
    reloader: Arc<crate::reload::Reloader>,
    /// The proxy listener.
    listen: std::net::SocketAddr,
    /// Fleet mode: where writes go.
    fleet: Option<Arc<Fleet>>,
    /// The strategy lab's runs.
    lab: Arc<crate::lab::runner::LabRunner>,
}

impl AdminCtx {
    /// Admin state over the pools of `site`; with a token, every route needs it.
    pub(crate) fn new(
        site: Arc<Site>,
        token: Option<String>,
        spawner: Arc<Spawner>,
        traffic: Arc<Traffic>,
        reloader: Arc<crate::reload::Reloader>,
    ) -> Self {
        AdminCtx {
            site,
            token: token.map(Into::into),
            spawner,
            listen: traffic.target(),
            traffic,
            reloader,
            fleet: None,
            lab: Arc::new(crate::lab::runner::LabRunner::new()),
        }
    }

    /// The same, serving `listen`, in fleet mode when `fleet` is given.
    pub(crate) fn in_fleet(
        mut self,
        listen: std::net::SocketAddr,
        fleet: Option<Arc<Fleet>>,
    ) -> Self {
        self.listen = listen;
        self.fleet = fleet;
        self
    }
}

/// An error answer: status plus `{"error": message}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    /// A stale write's object as it is now (fleet mode), sent as `current`.
    current: Option<serde_json::Value>,
}

impl ApiError {
    fn new(status: StatusCode, message: String) -> Self {
        ApiError {
            status,
            message,
            current: None,
        }
    }

    fn bad(msg: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, msg.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.current {
            Some(current) => json!({ "error": self.message, "current": current }),
            None => json!({ "error": self.message }),
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<SpawnError> for ApiError {
    fn from(e: SpawnError) -> Self {
        let status = match e {
            SpawnError::Conflict(_) => StatusCode::CONFLICT,
            SpawnError::NotHealthy(_) => StatusCode::GATEWAY_TIMEOUT,
            SpawnError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl AdminCtx {
    /// The first pool, which the single-pool routes address.
    fn first(&self) -> ApiResult<Arc<Pool>> {
        self.site
            .first()
            .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "there is no pool".into()))
    }

    /// The backend `raw` names (an id), in whichever pool.
    fn backend(&self, raw: &str) -> ApiResult<Arc<Backend>> {
        Ok(self.site.backend(parse_id(raw)?)?.1)
    }
}

impl From<SiteError> for ApiError {
    fn from(e: SiteError) -> Self {
        let status = match e {
            SiteError::NoSuchPool(_) => StatusCode::NOT_FOUND,
            SiteError::PoolExists(_) | SiteError::PoolInUse(..) | SiteError::LastPool => {
                StatusCode::CONFLICT
            }
            SiteError::UnknownPool(..) | SiteError::TooManyRoutes(_) => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<PoolError> for ApiError {
    fn from(e: PoolError) -> Self {
        let status = match e {
            PoolError::NotFound(_) => StatusCode::NOT_FOUND,
            PoolError::Own(_) => StatusCode::BAD_REQUEST,
            PoolError::DuplicateUrl(_)
            | PoolError::DuplicateName(_)
            | PoolError::Retired(_)
            | PoolError::Full(_) => StatusCode::CONFLICT,
        };
        ApiError::new(status, e.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Parses a JSON body ourselves, so every malformed body is a 400 with a JSON error.
///
/// Only a JSON object is accepted: serde would also take an array, filling the fields
/// in order, which is not what anybody means.
fn parse_body<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad("invalid JSON body: expected an object"));
    }
    serde_json::from_value(v).map_err(|e| ApiError::bad(format!("invalid JSON body: {e}")))
}

/// True for a body with nothing but JSON's own whitespace (RFC 8259 §2: space, tab,
/// LF, CR), which an endpoint with an optional body reads as "no body". A form feed or
/// any other byte is not JSON and gets the usual 400.
fn is_json_blank(body: &[u8]) -> bool {
    body.iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

fn parse_id(raw: &str) -> ApiResult<u64> {
    raw.bytes()
        .all(|c| c.is_ascii_digit())
        .then(|| raw.parse().ok())
        .flatten()
        .ok_or_else(|| {
            ApiError::bad(format!(
                "invalid backend id '{raw}' (expected a non-negative integer)"
            ))
        })
}

fn check_weight(w: i64) -> ApiResult<u32> {
    if (1..=MAX_WEIGHT as i64).contains(&w) {
        Ok(w as u32)
    } else {
        Err(ApiError::bad(format!(
            "invalid weight {w} (expected an integer from 1 to {MAX_WEIGHT})"
        )))
    }
}

async fn status(State(ctx): State<AdminCtx>) -> ApiResult<Json<serde_json::Value>> {
    let first = ctx.first()?;
    let backends = views(&first);
    let pools = pools::views(&ctx.site);
    let protocols: serde_json::Map<String, serde_json::Value> = (crate::stats::PROTOCOLS.iter())
        .zip(crate::stats::protocol_totals())
        .map(|(name, n)| (name.to_string(), n.into()))
        .collect();
    let mut body = json!({
        "strategy": first.strategy().name(),
        "backends": backends,
        "pools": pools,
        "protocols": protocols,
    });
    if let Some(f) = &ctx.fleet {
        body["store"] = fleet::status(f);
    }
    Ok(Json(body))
}

/// The backends of `pool` as the API shows them, in pool order.
fn views(pool: &Pool) -> Vec<BackendView> {
    pool.backends().iter().map(|b| BackendView::of(b)).collect()
}

/// `GET /admin/certificates`: every certificate the HTTPS listener serves, the client
/// CA bundle, and each pool's client certificate.
async fn certificates(State(ctx): State<AdminCtx>) -> Json<Vec<crate::tls::CertView>> {
    let mut list = (ctx.reloader.tls())
        .map(|t| t.certificates())
        .unwrap_or_default();
    for pool in ctx.site.pools() {
        let Some(pair) = pool.settings.transport.client_pair() else {
            continue;
        };
        let source = format!("pool:{}", pool.name);
        let leaf = crate::transport::client_cert_leaf(&pair);
        list.extend(leaf.and_then(|der| crate::tls::CertView::of_der(&der, &source)));
    }
    Json(list)
}

async fn get_strategy(State(ctx): State<AdminCtx>) -> ApiResult<Json<serde_json::Value>> {
    Ok(strategy_of(&*ctx.first()?))
}

/// `{"strategy": …}` of `pool`.
fn strategy_of(pool: &Pool) -> Json<serde_json::Value> {
    Json(json!({ "strategy": pool.strategy().name() }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StrategyBody {
    strategy: String,
}

async fn set_strategy(
    State(ctx): State<AdminCtx>,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    switch_strategy(&ctx, &*ctx.first()?, &body).await
}

/// Switches the strategy of `pool` as `body` asks.
async fn switch_strategy(
    ctx: &AdminCtx,
    pool: &Pool,
    body: &Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    let b: StrategyBody = parse_body(body)?;
    let kind = StrategyKind::parse(&b.strategy).ok_or_else(|| {
        ApiError::bad(format!(
            "unknown strategy '{}' (valid: {})",
            b.strategy,
            StrategyKind::canonical_names().join(", ")
        ))
    })?;
    let before = pool.strategy();
    match &ctx.fleet {
        Some(f) => f.set_strategy(&pool.name, kind).await?,
        None => pool.set_strategy(kind),
    }
    tracing::info!(pool = %pool.name, from = before.name(), to = kind.name(), "strategy switched");
    Ok(Json(json!({ "strategy": kind.name() })))
}

async fn list_backends(State(ctx): State<AdminCtx>) -> ApiResult<Json<Vec<BackendView>>> {
    Ok(Json(views(&*ctx.first()?)))
}

async fn add_backend(State(ctx): State<AdminCtx>, body: Bytes) -> ApiResult<Response> {
    add_to(&ctx, &*ctx.first()?, &body).await
}

/// `409` when discovery finds `pool`'s backends: they are added and removed there
/// (`docs/discovery.md`).
fn not_discovered(pool: &Pool) -> ApiResult<()> {
    match pool.discover() {
        None => Ok(()),
        Some(d) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "pool '{}' finds its backends through {} '{}' (discover): add and remove them there",
                pool.name,
                d.kind(),
                d.target_text()
            ),
        )),
    }
}

/// Adds the backend `body` describes to `pool`: 201 BACKEND.
async fn add_to(ctx: &AdminCtx, pool: &Pool, body: &Bytes) -> ApiResult<Response> {
    not_discovered(pool)?;
    let spec = (parse_body::<BackendEntry>(body)?.spec()).map_err(ApiError::bad)?;
    crate::config::tcp::url_fits(&spec.url, pool.settings.mode).map_err(ApiError::bad)?;
    if pool.backends().len() >= pool.settings.max_backends {
        return Err(PoolError::Full(pool.settings.max_backends).into());
    }
    if let Some(why) = crate::loops::own_backend_now(spec.authority.as_str(), spec.addr) {
        return Err(ApiError::bad(why));
    }
    let added = match &ctx.fleet {
        Some(f) => {
            let id = f.add_backend(&pool.name, &spec).await?;
            ctx.site.backend(id)?.1
        }
        None => pool.add(spec)?,
    };
    tracing::info!(pool = %pool.name, id = added.id, name = %added.name, url = %added.url, "backend added");
    Ok((StatusCode::CREATED, Json(BackendView::of(&added))).into_response())
}

async fn get_backend(
    State(ctx): State<AdminCtx>,
    Path(id): Path<String>,
) -> ApiResult<Json<BackendView>> {
    Ok(Json(BackendView::of(&*ctx.backend(&id)?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchBody {
    weight: Option<i64>,
    state: Option<String>,
    max_conns: Option<i64>,
}

/// A `max_conns` given over the API: 0 (no limit) or more.
fn check_max_conns(n: i64) -> ApiResult<u32> {
    crate::config::parse_max_conns(&n.to_string()).map_err(ApiError::bad)
}

async fn patch_backend(
    State(ctx): State<AdminCtx>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<BackendView>> {
    let id = parse_id(&id)?;
    let p: PatchBody = parse_body(&body)?;
    let weight = p.weight.map(check_weight).transpose()?;
    let state = p
        .state
        .as_deref()
        .map(|s| {
            BackendState::parse(s).ok_or_else(|| {
                ApiError::bad(format!(
                    "invalid state '{s}' (valid: active, draining, maintenance)"
                ))
            })
        })
        .transpose()?;
    let max_conns = p.max_conns.map(check_max_conns).transpose()?;
    // A discovered backend is this instance's own, in fleet mode too.
    let local = (ctx.site.backend(id).ok()).filter(|(_, b)| b.control.source().is_discovered());
    let b = match (&ctx.fleet, local) {
        (Some(f), None) => {
            // The store's object, whether or not this instance took it in.
            f.update_backend(id, weight, state, max_conns).await?;
            ctx.site.backend(id)?.1
        }
        (_, Some((pool, _))) => pool.update(id, weight, state, max_conns)?,
        (None, None) => {
            let (pool, _) = ctx.site.backend(id)?;
            pool.update(id, weight, state, max_conns)?
        }
    };
    tracing::info!(id, name = %b.name, weight = b.control.weight(), state = ?b.control.state(), "backend updated");
    Ok(Json(BackendView::of(&b)))
}

async fn delete_backend(
    State(ctx): State<AdminCtx>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = parse_id(&id)?;
    // What discovery found is taken out there; another backend of the pool (added
    // before it had `discover`) may go.
    if let Ok((pool, b)) = ctx.site.backend(id) {
        if b.control.source().is_discovered() {
            not_discovered(&pool)?;
        }
    }
    let name = match &ctx.fleet {
        Some(f) => f.remove_backend(id).await?,
        None => ctx.spawner.remove(id).await?.name.clone(),
    };
    tracing::info!(id, name = %name, "backend removed");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DegradeBody {
    latency_ms: Option<i64>,
    error_rate: Option<f64>,
}

/// Longest injectable latency.
const MAX_INJECTED_LATENCY_MS: i64 = 60_000;

async fn degrade_backend(
    State(ctx): State<AdminCtx>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<BackendView>> {
    let id = parse_id(&id)?;
    let d: DegradeBody = parse_body(&body)?;
    if let Some(ms) = d.latency_ms {
        if !(0..=MAX_INJECTED_LATENCY_MS).contains(&ms) {
            return Err(ApiError::bad(format!(
                "invalid latency_ms {ms} (expected an integer from 0 to {MAX_INJECTED_LATENCY_MS})"
            )));
        }
    }
    if let Some(r) = d.error_rate {
        if !(0.0..=1.0).contains(&r) {
            return Err(ApiError::bad(format!(
                "invalid error_rate {r} (expected a number from 0 to 1)"
            )));
        }
    }
    let b = ctx.site.backend(id)?.1;
    b.degrade(d.latency_ms.map(|ms| ms as u32), d.error_rate);
    tracing::warn!(id, name = %b.name, latency_ms = ?d.latency_ms, error_rate = ?d.error_rate, "faults injected");
    Ok(Json(BackendView::of(&b)))
}

async fn recover_backend(
    State(ctx): State<AdminCtx>,
    Path(id): Path<String>,
) -> ApiResult<Json<BackendView>> {
    let b = ctx.backend(&id)?;
    b.recover();
    tracing::info!(id = b.id, name = %b.name, "faults cleared, latency average cleared");
    Ok(Json(BackendView::of(&b)))
}

/// `GET /metrics`.
async fn metrics(State(ctx): State<AdminCtx>) -> ApiResult<Response> {
    let text = crate::metrics::render(&ctx.site).map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode metrics".into(),
        )
    })?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        )],
        text,
    )
        .into_response())
}

/// The OpenAPI document of this API (kept in the repository next to this file).
const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        OPENAPI,
    )
        .into_response()
}

/// Keeps `request` events flowing while a subscriber is connected.
struct Subscriber(Arc<Hub>);

impl Subscriber {
    fn new(hub: Arc<Hub>) -> Self {
        hub.sampler.subscribe();
        Subscriber(hub)
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.0.sampler.unsubscribe();
    }
}

/// `GET /admin/events`: server-sent events, one JSON object per event. A subscriber
/// that reads too slowly misses events (it gets a `dropped` event saying how many)
/// instead of slowing anything down.
async fn events(State(ctx): State<AdminCtx>) -> Response {
    use axum::response::sse::{Event as Sse, KeepAlive};
    use tokio::sync::broadcast::error::RecvError;
    let rx = ctx.site.hub.subscribe();
    let sub = Subscriber::new(Arc::clone(&ctx.site.hub));
    let stream = futures_util::stream::unfold((rx, sub), |(mut rx, sub)| async move {
        let data = match rx.recv().await {
            Ok(e) => serde_json::to_string(&e).unwrap_or_default(),
            Err(RecvError::Lagged(n)) => {
                sub.0
                    .stats
                    .events_dropped
                    .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                json!({ "type": "dropped", "count": n }).to_string()
            }
            Err(RecvError::Closed) => return None,
        };
        Some((
            Ok::<_, std::convert::Infallible>(Sse::default().data(data)),
            (rx, sub),
        ))
    });
    axum::response::Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
        .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpawnBody {
    weight: Option<i64>,
    latency_ms: Option<i64>,
    name: Option<String>,
    /// The pool it joins; the first pool when left out.
    pool: Option<String>,
}

async fn spawn_backend(State(ctx): State<AdminCtx>, body: Bytes) -> ApiResult<Response> {
    if ctx.fleet.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "spawned backends are processes of one instance: in fleet mode (--store), add backends with POST /admin/backends".into(),
        ));
    }
    // An empty body means all defaults.
    let b: SpawnBody = if body.is_empty() {
        SpawnBody {
            weight: None,
            latency_ms: None,
            name: None,
            pool: None,
        }
    } else {
        parse_body(&body)?
    };
    let weight = b.weight.map(check_weight).transpose()?;
    let latency_ms = match b.latency_ms {
        None => 0,
        Some(ms) if (0..=MAX_INJECTED_LATENCY_MS).contains(&ms) => ms as u64,
        Some(ms) => {
            return Err(ApiError::bad(format!(
                "invalid latency_ms {ms} (expected an integer from 0 to {MAX_INJECTED_LATENCY_MS})"
            )))
        }
    };
    if let Some(n) = &b.name {
        // The same rule as every other backend name.
        backend_spec("http://127.0.0.1:1", None, Some(n)).map_err(ApiError::bad)?;
    }
    let pool = match &b.pool {
        Some(name) => ctx.site.pool(name)?,
        None => ctx.first()?,
    };
    not_discovered(&pool)?;
    let added = ctx
        .spawner
        .spawn(
            &pool,
            SpawnRequest {
                weight,
                latency_ms,
                name: b.name,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(BackendView::of(&added))).into_response())
}

async fn kill_backend(
    State(ctx): State<AdminCtx>,
    Path(id): Path<String>,
) -> ApiResult<Json<BackendView>> {
    let b = ctx.backend(&id)?;
    ctx.spawner.kill(&b)?;
    Ok(Json(BackendView::of(&b)))
}

async fn revive_backend(
    State(ctx): State<AdminCtx>,
    Path(id): Path<String>,
) -> ApiResult<Json<BackendView>> {
    let b = ctx.backend(&id)?;
    ctx.spawner.revive(Arc::clone(&b)).await?;
    Ok(Json(BackendView::of(&b)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TrafficBody {
    rps: i64,
    seconds: i64,
    path: Option<String>,
}

async fn start_traffic(State(ctx): State<AdminCtx>, body: Bytes) -> ApiResult<Response> {
    let t: TrafficBody = parse_body(&body)?;
    if !(1..=MAX_RPS as i64).contains(&t.rps) {
        return Err(ApiError::bad(format!(
            "invalid rps {} (expected an integer from 1 to {MAX_RPS})",
            t.rps
        )));
    }
    if !(1..=MAX_SECONDS as i64).contains(&t.seconds) {
        return Err(ApiError::bad(format!(
            "invalid seconds {} (expected an integer from 1 to {MAX_SECONDS})",
            t.seconds
        )));
    }
    let path = t.path.unwrap_or_else(|| "/".into());
    if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
        return Err(ApiError::bad(format!(
            "invalid path '{path}' (expected an origin-form path starting with /)"
        )));
    }
    let plan = Plan {
        rps: t.rps as u64,
        seconds: t.seconds as u64,
        path,
        more_paths: Vec::new(),
    };
    match ctx.traffic.start(plan) {
        Ok(p) => {
            tracing::info!(
                rps = t.rps,
                seconds = t.seconds,
                "traffic generator started"
            );
            Ok((StatusCode::CREATED, Json(p)).into_response())
        }
        Err(StartError::Busy) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "a traffic run is already going on (DELETE /admin/traffic stops it)".into(),
        )),
    }
}

async fn get_traffic(State(ctx): State<AdminCtx>) -> Json<Progress> {
    Json(ctx.traffic.progress())
}

async fn stop_traffic(State(ctx): State<AdminCtx>) -> Json<Progress> {
    Json(ctx.traffic.stop())
}

/// `POST /admin/reload`: the same as `SIGHUP`.
async fn reload(State(ctx): State<AdminCtx>) -> ApiResult<Json<crate::reload::Report>> {
    use crate::reload::ReloadError;
    ctx.reloader.reload().map(Json).map_err(|e| match e {
        ReloadError::NoConfigFile => ApiError::new(StatusCode::CONFLICT, e.to_string()),
        ReloadError::Invalid(_) => ApiError::bad(e.to_string()),
    })
}

/// `POST /admin/explain`: what fulcrum would do with the request described, changing
/// nothing (`docs/operations.md`, "Why this backend?").
async fn explain(
    State(ctx): State<AdminCtx>,
    body: Bytes,
) -> ApiResult<Json<crate::proxy::explain::Explanation>> {
    let q = match is_json_blank(&body) {
        true => Default::default(),
        false => parse_body(&body)?,
    };
    let trusted = ctx.reloader.settings().trusted_proxies;
    let routing = arc_swap::Guard::into_inner(ctx.site.routing());
    crate::proxy::explain::explain(routing, &trusted, q)
        .await
        .map(Json)
        .map_err(ApiError::bad)
}

/// The dashboard: one self-contained page, kept next to this file.
const DASHBOARD: &str = include_str!("dashboard.html");

async fn dashboard() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'",
                ),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        ],
        DASHBOARD,
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route".into())
}

/// Gives every error answer a JSON body: axum's own ones (405 with `Allow`, a path that
/// is not UTF-8, a body over the size limit) come as plain text.
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (mut parts, _) = resp.into_parts();
    let reason = status
        .canonical_reason()
        .unwrap_or("error")
        .to_ascii_lowercase();
    let body = json!({ "error": reason }).to_string();
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// With a token set, every `/admin/*` route and `/metrics` need
/// `Authorization: Bearer <token>`, compared in constant time.
async fn auth(State(ctx): State<AdminCtx>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let guarded = path == "/metrics" || path == "/admin" || path.starts_with("/admin/");
    if let (Some(token), true) = (&ctx.token, guarded) {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim())
            .unwrap_or("");
        use subtle::ConstantTimeEq;
        let ok: bool = given.as_bytes().ct_eq(token.as_bytes()).into();
        if !ok {
            let mut r = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token".into(),
            )
            .into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    if ctx.token.is_none() && !loopback_host(&req) {
        // Without a token the admin API trusts loopback only; a page that rebinds its own
        // domain name to 127.0.0.1 still sends that name as the Host.
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "without an admin token only loopback host names are accepted (127.0.0.1, [::1], localhost)".into(),
        )
        .into_response();
    }
    if !same_origin(&req) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "cross-origin requests may not change anything".into(),
        )
        .into_response();
    }
    next.run(req).await
}

/// Whether the request names a loopback host (or none: HTTP/1.0 clients).
fn loopback_host(req: &Request) -> bool {
    let Some(host) = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase)
    else {
        return true;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A state-changing request sent by a browser page from another origin is refused (the
/// admin API answers no CORS preflight either, so such a page cannot read answers). The
/// browser says where a request comes from in `Origin` and `Sec-Fetch-Site`; clients
/// that are not browsers (curl, scripts) send neither.
fn same_origin(req: &Request) -> bool {
    use axum::http::Method;
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return true;
    }
    let h = req.headers();
    if let Some(site) = h.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return false;
        }
    }
    match (h.get(header::ORIGIN), h.get(header::HOST)) {
        (None, _) => true,
        (Some(origin), Some(host)) => origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .is_some_and(|(_, authority)| authority.as_bytes() == host.as_bytes()),
        (Some(_), None) => false,
    }
}

/// The admin router.
pub(crate) fn router(ctx: AdminCtx) -> Router {
    Router::new()
        .route("/admin/status", get(status))
        .route("/admin/strategy", get(get_strategy).post(set_strategy))
        .route("/admin/backends", get(list_backends).post(add_backend))
        .route(
            "/admin/backends/{id}",
            get(get_backend).patch(patch_backend).delete(delete_backend),
        )
        .route("/admin/backends/{id}/degrade", post(degrade_backend))
        .route("/admin/backends/{id}/recover", post(recover_backend))
        .route("/admin/backends/spawn", post(spawn_backend))
        .route("/admin/backends/{id}/kill", post(kill_backend))
        .route("/admin/backends/{id}/revive", post(revive_backend))
        .route("/admin/events", get(events))
        .route(
            "/admin/traffic",
            get(get_traffic).post(start_traffic).delete(stop_traffic),
        )
        .route("/admin/reload", post(reload))
        .route("/admin/explain", post(explain))
        .route("/admin/certificates", get(certificates))
        .route("/admin/pools", get(pools::list).post(pools::create))
        .route("/admin/pools/{name}", get(pools::one).delete(pools::remove))
        .route(
            "/admin/pools/{name}/strategy",
            get(pools::get_strategy).post(pools::set_strategy),
        )
        .route(
            "/admin/pools/{name}/backends",
            get(pools::list_backends).post(pools::add_backend),
        )
        .route("/admin/routes", get(pools::routes).put(pools::set_routes))
        .route(
            "/admin/routes/{index}/mirror",
            get(pools::mirror).delete(pools::reset_mirror),
        )
        .route("/admin/fleet", get(fleet::list))
        .route(
            "/admin/lab",
            get(lab::status).post(lab::start).delete(lab::stop),
        )
        .route("/", get(dashboard))
        .route("/admin/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(ctx.clone(), auth))
        .with_state(ctx)
}

/// Serves the admin API until `stop` resolves, with at most `max_connections` open.
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    ctx: AdminCtx,
    max_connections: usize,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot use the admin listener");
            return;
        }
    };
    listener::serve(listener, router(ctx), max_connections, stop).await;
}

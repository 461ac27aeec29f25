//! The strategy lab's admin routes (`docs/lab.md`, "From the dashboard"):
//! `POST /admin/lab` starts a run, `GET /admin/lab` shows its progress and result,
//! `DELETE /admin/lab` stops it.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{parse_body, AdminCtx, ApiError, ApiResult};
use crate::lab::runner::{LabStartError, LabStatus};

/// The strategies to compare: `"all"`, `"a,b"` or `["a", "b"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Strategies {
    Text(String),
    List(Vec<String>),
}

/// `POST /admin/lab`'s body; everything but the scenario as `fulcrum lab` defaults it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LabBody {
    scenario: String,
    strategies: Option<Strategies>,
    seconds: Option<u32>,
    rps: Option<u32>,
    seed: Option<u64>,
}

/// `POST /admin/lab`: starts a run; 202 with its status, 409 while one runs.
pub(super) async fn start(State(ctx): State<AdminCtx>, body: Bytes) -> ApiResult<Response> {
    let b: LabBody = parse_body(&body)?;
    let strategies = match b.strategies {
        None => "all".to_string(),
        Some(Strategies::Text(t)) => t,
        Some(Strategies::List(l)) if l.is_empty() => {
            return Err(ApiError::bad(
                "strategies: expected \"all\" or at least one strategy name",
            ))
        }
        Some(Strategies::List(l)) => l.join(","),
    };
    let plan = crate::lab::Plan::new(
        &b.scenario,
        &strategies,
        b.seconds.unwrap_or(crate::lab::DEFAULT_SECONDS),
        b.rps,
        b.seed.unwrap_or(crate::lab::DEFAULT_SEED),
    )
    .map_err(ApiError::bad)?;
    match ctx.lab.start(&plan, &strategies) {
        Ok(status) => {
            tracing::info!(
                scenario = plan.scenario.name(),
                strategies = plan.variants.len(),
                seconds = plan.seconds,
                "lab run started"
            );
            Ok((StatusCode::ACCEPTED, Json(status)).into_response())
        }
        Err(LabStartError::Busy) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "a lab run is already going on (DELETE /admin/lab stops it)".into(),
        )),
        Err(LabStartError::Failed(e)) => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e)),
    }
}

/// `GET /admin/lab`: the current or last run.
pub(super) async fn status(State(ctx): State<AdminCtx>) -> Json<LabStatus> {
    Json(ctx.lab.status())
}

/// `DELETE /admin/lab`: stops the run going on, if any.
pub(super) async fn stop(State(ctx): State<AdminCtx>) -> Json<LabStatus> {
    Json(ctx.lab.stop().await)
}

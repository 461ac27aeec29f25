//! Fleet mode's admin routes and answers (`docs/fleet.md`): `GET /admin/fleet`, the
//! `store` part of `/admin/status`, and the statuses of writes that go through etcd.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use super::{AdminCtx, ApiError};
use crate::store::fleet::Fleet;
use crate::store::writes::WriteError;

impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> Self {
        let status = match &e {
            WriteError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            WriteError::Stale(..) | WriteError::Conflict(_) => StatusCode::CONFLICT,
            WriteError::NotFound(_) => StatusCode::NOT_FOUND,
            WriteError::Invalid(_) => StatusCode::BAD_REQUEST,
            WriteError::NotApplied(_) => StatusCode::GATEWAY_TIMEOUT,
        };
        let mut err = ApiError::new(status, e.to_string());
        if let WriteError::Stale(_, current) = e {
            err.current = Some(current.unwrap_or(Value::Null));
        }
        err
    }
}

/// `"store"` of `/admin/status`.
pub(crate) fn status(f: &Fleet) -> Value {
    json!({ "connected": f.connected(), "revision": f.applied() })
}

/// An instance as `GET /admin/fleet` shows it.
#[derive(Debug, Serialize)]
pub(crate) struct Member {
    id: String,
    listen: String,
    revision: i64,
    #[serde(rename = "self")]
    me: bool,
}

/// `GET /admin/fleet`: every instance registered, this one first; without a store,
/// this one alone (a fleet of one).
pub(crate) async fn list(State(ctx): State<AdminCtx>) -> Json<Vec<Member>> {
    let Some(f) = &ctx.fleet else {
        return Json(vec![Member {
            id: "local".into(),
            listen: ctx.listen.to_string(),
            revision: 0,
            me: true,
        }]);
    };
    let mut out = vec![Member {
        id: f.id.clone(),
        listen: f.listen.clone(),
        revision: f.applied(),
        me: true,
    }];
    let m = f.mirror();
    for (id, i) in &m.instances {
        if *id != f.id {
            out.push(Member {
                id: i.id.clone(),
                listen: i.listen.clone(),
                revision: i.revision,
                me: false,
            });
        }
    }
    Json(out)
}

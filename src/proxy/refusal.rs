//! The answers that refuse a request before any backend is tried, and those that end a
//! request whose tries failed (`docs/operations.md`).

use http::header::{self, HeaderValue};
use http::StatusCode;

use super::answer::ProxyResponse;
use super::message::RequestHead;
use super::upstream::Failure;
use super::validate;
use crate::pool::Pool;

impl Failure {
    /// What the client is answered when a try ends in this failure and no other follows.
    pub(super) fn answer(&self) -> ProxyResponse {
        match self {
            Failure::Connect => ProxyResponse::own(
                StatusCode::BAD_GATEWAY,
                "bad gateway: backend unreachable\n",
            ),
            Failure::Broken => ProxyResponse::own(StatusCode::BAD_GATEWAY, "bad gateway\n"),
            Failure::Timeout => {
                ProxyResponse::own(StatusCode::GATEWAY_TIMEOUT, "gateway timeout\n")
            }
            // Nobody is left to read it; hyper needs some answer all the same.
            Failure::ClientGone => {
                ProxyResponse::own(StatusCode::BAD_REQUEST, "request body broke off\n")
            }
            // As nginx's `client_body_timeout`: 408, and the connection ends (the rest of
            // the body may still come).
            Failure::ClientStalled => ProxyResponse::own(
                StatusCode::REQUEST_TIMEOUT,
                "request timeout: the request body stopped arriving\n",
            )
            .with_field(header::CONNECTION, HeaderValue::from_static("close")),
            // As shedding answers (`--max-inflight`).
            Failure::NoDescriptor => Refusal::Overloaded.answer(),
            Failure::BodyTooLarge => Refusal::BodyTooLarge.answer(),
        }
    }
}

/// Why a request is refused before any pick.
#[derive(Debug, Clone, Copy)]
pub(super) enum Refusal {
    /// The head is over the head-size limit (`MAX_HEADER_BYTES`).
    TooLarge,
    /// The proxy is over `--max-inflight`.
    Overloaded,
    /// No route takes it.
    NoRoute,
    /// Its body is over its pool's `max_request_body` (nginx's `client_max_body_size`).
    BodyTooLarge,
    /// The head breaks a rule of [`super::validate`].
    Invalid(validate::Invalid),
}

impl Refusal {
    /// The answer that refuses.
    pub(super) fn answer(self) -> ProxyResponse {
        match self {
            Refusal::TooLarge => ProxyResponse::own(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request header fields too large\n",
            ),
            Refusal::Overloaded => {
                ProxyResponse::own(StatusCode::SERVICE_UNAVAILABLE, "overloaded, retry later\n")
                    .with_field(header::RETRY_AFTER, HeaderValue::from_static("1"))
            }
            Refusal::NoRoute => ProxyResponse::own(StatusCode::NOT_FOUND, "no route\n"),
            // The rest of the body may still come: the connection ends.
            Refusal::BodyTooLarge => {
                ProxyResponse::own(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n")
                    .with_field(header::CONNECTION, HeaderValue::from_static("close"))
            }
            Refusal::Invalid(why) => why.answer(),
        }
    }
}

/// A request whose stated length is over its pool's `max_request_body` is refused
/// before anything of it is forwarded (a body without a stated length is counted as it
/// streams: `ReqBody`).
#[inline]
pub(super) fn within_body_limit(head: &RequestHead, pool: &Pool) -> Result<(), Refusal> {
    let Some(limit) = pool.settings.max_request_body else {
        return Ok(());
    };
    let stated = head
        .field(&header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    match stated {
        Some(n) if n > limit => Err(Refusal::BodyTooLarge),
        _ => Ok(()),
    }
}

//! What the plain listener answers itself before any route (`docs/tls.md`): the ACME
//! CA's `http-01` requests and `redirect_https`.

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::StatusCode;

use super::answer::{ProxyResponse, RespBody};
use super::message::RequestHead;

/// What the plain listener answers before any route.
#[derive(Debug, Default)]
pub(crate) struct PlainFirst {
    /// `[tls.acme]`: the CA's `http-01` requests.
    pub(crate) acme: Option<Arc<crate::obtained::Obtained>>,
    /// `redirect_https`: the HTTPS listener's port, to which plain requests are sent
    /// with a 308.
    pub(crate) redirect_https: Option<u16>,
}

impl PlainFirst {
    /// The answer for a plain request `head`, if it is one of these.
    pub(super) fn answer(&self, head: &RequestHead) -> Option<ProxyResponse> {
        if let Some(r) = self.acme.as_ref().and_then(|a| http01_answer(head, a)) {
            return Some(r);
        }
        self.redirect_https.map(|port| to_https(head, port))
    }
}

/// `http-01` (RFC 8555 §8.3): the key authorization for a token the ACME task is
/// proving, before any route and any redirect; `None` for every other request, which
/// goes on as usual (an unknown token too, as Caddy passes it on).
fn http01_answer(head: &RequestHead, acme: &crate::obtained::Obtained) -> Option<ProxyResponse> {
    let token = head
        .uri
        .path()
        .strip_prefix(crate::obtained::HTTP01_PREFIX)?;
    if head.method != http::Method::GET {
        return None;
    }
    let answer = acme.http_answer(token)?;
    let mut fields = http::HeaderMap::with_capacity(1);
    fields.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    let body = RespBody::full(bytes::Bytes::from(answer));
    Some(ProxyResponse::new(StatusCode::OK, fields, body))
}

/// `redirect_https`: `308 Permanent Redirect` to the same URL on https (the method and
/// body are kept by a 308, unlike a 301), on the HTTPS listener's `port` (left out when it
/// is 443). A request without a usable host gets `400`.
fn to_https(head: &RequestHead, port: u16) -> ProxyResponse {
    let host = head.host();
    let name = host
        .as_ref()
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<http::uri::Authority>().ok());
    let Some(name) = name else {
        return ProxyResponse::own(
            StatusCode::BAD_REQUEST,
            "bad request: no host to redirect to\n",
        );
    };
    let target = head.uri.path_and_query().map_or("/", |p| p.as_str());
    let location = match port {
        443 => format!("https://{}{target}", name.host()),
        p => format!("https://{}:{p}{target}", name.host()),
    };
    match HeaderValue::from_str(&location) {
        Ok(v) => ProxyResponse::own(StatusCode::PERMANENT_REDIRECT, "redirecting to https\n")
            .with_field(header::LOCATION, v),
        Err(_) => ProxyResponse::own(
            StatusCode::BAD_REQUEST,
            "bad request: no host to redirect to\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &str, path: &str) -> RequestHead {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "a.test")
            .body(())
            .unwrap();
        RequestHead::from_parts(req.into_parts().0)
    }

    #[test]
    fn http01_answers_a_known_token_to_get_only_before_the_redirect() {
        let acme = Arc::new(crate::obtained::Obtained::new(vec!["a.test".into()]));
        acme.answer_token("tok", "tok.thumb");
        let first = PlainFirst {
            acme: Some(Arc::clone(&acme)),
            redirect_https: Some(443),
        };
        let r = first
            .answer(&head("GET", "/.well-known/acme-challenge/tok"))
            .unwrap();
        assert_eq!(r.head.status, StatusCode::OK);
        // Anything else on the plain listener is redirected, an unknown token too.
        for (m, p) in [
            ("POST", "/.well-known/acme-challenge/tok"),
            ("GET", "/.well-known/acme-challenge/other"),
            ("GET", "/"),
        ] {
            let r = first.answer(&head(m, p)).unwrap();
            assert_eq!(r.head.status, StatusCode::PERMANENT_REDIRECT, "{m} {p}");
        }
        // Without redirect_https, they go on to the routes.
        let only = PlainFirst {
            acme: Some(acme),
            redirect_https: None,
        };
        assert!(only.answer(&head("GET", "/")).is_none());
        assert!(only
            .answer(&head("GET", "/.well-known/acme-challenge/x"))
            .is_none());
    }
}

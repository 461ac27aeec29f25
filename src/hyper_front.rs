//! hyper's server as a front end of the request path: the HTTP/1 connections the fast
//! path ([`crate::front`]) hands over (requests with a body, upgrades). A request hyper
//! parsed becomes the request path's own head, body and upgrade half; the answer goes
//! back as an `http::Response`. HTTP/2 has its own front end ([`crate::http2`]). See
//! `docs/architecture.md`, "A request's walk".

use http::{Request, Response, Version};
use http_body::Body as _;
use hyper::body::Incoming;

use crate::proxy::headers;
use crate::proxy::{ClientBody, ClientUpgrade, Peer, Proxy, RequestHead, RespBody};

/// Proxies one request hyper's server parsed; `peer` is the connection's client.
pub(crate) async fn handle(
    proxy: &Proxy,
    mut req: Request<Incoming>,
    peer: Peer,
) -> Response<RespBody> {
    // Only the protocols `upgrade_protocols` names are tunnelled; any other `Upgrade` is
    // dropped with the hop-by-hop fields, and the request goes on as plain HTTP (an
    // `h2c` tunnel would carry requests past every rule of this hop).
    let upgrade = req.version() == Version::HTTP_11
        && headers::is_upgrade_request(req.headers())
        && headers::keep_upgrades(req.headers_mut(), &proxy.settings().upgrade_protocols);
    let client_upgrade = upgrade.then(|| ClientUpgrade::hyper(hyper::upgrade::on(&mut req)));
    let (parts, body) = req.into_parts();
    // An empty body is not forwarded as a stream: such a request can be replayed.
    let body = (!body.is_end_stream()).then(|| ClientBody::hyper(body));
    let head = RequestHead::from_parts(parts);
    proxy.answer(head, body, client_upgrade, &peer).await
}

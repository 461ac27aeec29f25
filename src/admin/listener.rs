//! The admin API's accept loop, with limits of its own (`docs/operations.md`,
//! "Hardening"): a client that connects and sends nothing, or many of them, must not
//! hold the admin thread's descriptors and memory, nor take the proxy's.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

/// A request head must arrive within this time, and so must the next one on a
/// keep-alive connection (hyper arms one timer for both, as HAProxy uses
/// `timeout http-request` when `timeout http-keep-alive` is unset).
pub(crate) const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `stop` resolves, with at most `max_connections`
/// open at once. At the cap the loop stops accepting: further clients wait in the
/// kernel's queue, as HAProxy's `maxconn` makes them wait, instead of costing a
/// descriptor each.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    max_connections: usize,
    stop: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(ADMIN_HEADER_TIMEOUT)
        .keep_alive(true);
    let mut backoff = crate::listeners::AcceptBackoff::default();
    tokio::pin!(stop);
    loop {
        let slot = tokio::select! {
            s = Arc::clone(&slots).acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            _ = &mut stop => break,
        };
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((stream, _)) => stream,
                Err(e) => {
                    backoff.failed(&e, "admin").await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let svc = TowerToHyperService::new(router.clone());
        let conn = http.serve_connection(TokioIo::new(stream), svc);
        let watched = graceful.watch(conn);
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = watched.await {
                tracing::debug!(error = %e, "admin connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

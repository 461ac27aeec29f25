//! The demo backend and what `fulcrum demo` starts.
//!
//! `fulcrum demo` runs the balancer with two pools and no configured backend: `web`,
//! the first, takes every request but those under `/api`, which go to `api`. It spawns
//! the demo backends of both through the same [`Spawner`](crate::spawn::Spawner) as
//! `POST /admin/backends/spawn` (so they can be killed and revived from the
//! dashboard), and starts the traffic generator at a modest rate over both.

pub(crate) mod backend;
pub(crate) mod tcp_backend;

use crate::config::{PoolSpec, RouteSpec, Settings};
use crate::route::PathPrefix;
use crate::server::Running;
use crate::spawn::SpawnRequest;

/// The first pool: everything the other routes do not take.
const WEB_POOL: &str = "web";
/// The second pool, behind [`API_PREFIX`].
const API_POOL: &str = "api";
/// The path prefix of the `api` pool.
const API_PREFIX: &str = "/api";
/// Name and latency of the `api` pool's backends.
const API_BACKENDS: [(&str, u64); 2] = [("api-a", 15), ("api-b", 60)];

/// Latencies of the demo backends, cycled: one fast, one middling, one slow.
const DEMO_LATENCIES_MS: [u64; 3] = [10, 40, 120];

/// Requests per second the demo's traffic generator sends.
pub(crate) const DEMO_RPS: u64 = 40;

/// Name and latency of the `i`-th demo backend: `backend-a` 10 ms, `backend-b` 40 ms,
/// `backend-c` 120 ms, then again.
pub(crate) fn backend_plan(i: usize) -> (String, u64) {
    let latency = DEMO_LATENCIES_MS[i % DEMO_LATENCIES_MS.len()];
    let name = format!("backend-{}", (b'a' + (i % 26) as u8) as char);
    (name, latency)
}

/// Lays out the demo's pools and routes over the settings of `s`: `web` and `api`,
/// both with the demo's strategy (round robin unless told otherwise; the dashboard
/// switches each on its own), `/api` to `api` and the rest to `web`.
pub(crate) fn lay_out(s: &mut Settings) {
    let web = s.pool.clone();
    let api = web.clone();
    s.pools = vec![
        PoolSpec {
            name: WEB_POOL.into(),
            settings: web,
            backends: Vec::new(),
            discover: None,
        },
        PoolSpec {
            name: API_POOL.into(),
            settings: api,
            backends: Vec::new(),
            discover: None,
        },
    ];
    s.routes = vec![
        RouteSpec {
            path_prefix: PathPrefix::parse(API_PREFIX).ok(),
            ..RouteSpec::catch_all(API_POOL)
        },
        RouteSpec::catch_all(WEB_POOL),
    ];
}

/// Spawns `n` backends into `web` and those of `api`; returns a line about each.
pub(crate) fn spawn_backends(r: &Running, n: usize) -> Result<Vec<String>, String> {
    let web = (0..n).map(|i| {
        let (name, latency) = backend_plan(i);
        (WEB_POOL, name, latency)
    });
    let api = API_BACKENDS
        .iter()
        .map(|(name, latency)| (API_POOL, name.to_string(), *latency));
    let mut lines = Vec::new();
    for (pool_name, name, latency_ms) in web.chain(api) {
        let pool = r.site.pool(pool_name).map_err(|e| e.to_string())?;
        let req = SpawnRequest {
            weight: None,
            latency_ms,
            name: Some(name),
        };
        let b = r
            .admin_rt
            .block_on(r.spawner.spawn(&pool, req))
            .map_err(|e| format!("demo backend: {e}"))?;
        lines.push(format!(
            "  backend: {} at {} ({latency_ms} ms, pool {pool_name})",
            b.name, b.url
        ));
    }
    Ok(lines)
}

/// The paths the demo's traffic asks for in turn: two for `web`, one for `api`.
pub(crate) fn traffic_paths() -> (String, Vec<String>) {
    (
        "/".into(),
        vec![format!("{API_PREFIX}/items"), "/shop".into()],
    )
}

/// The demo's self-signed certificate, written to a directory of its own.
pub(crate) struct SelfSigned {
    /// The certificate (PEM).
    pub(crate) cert: std::path::PathBuf,
    /// Its private key (PEM).
    pub(crate) key: std::path::PathBuf,
    /// SHA-256 of the certificate, as browsers show it (`AB:CD:…`).
    pub(crate) fingerprint: String,
}

/// Makes a self-signed ECDSA P-256 certificate for `localhost` and 127.0.0.1, valid
/// from now, under the temporary directory.
pub(crate) fn self_signed() -> Result<SelfSigned, String> {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let made = rcgen::generate_simple_self_signed(names).map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("fulcrum-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let cert = dir.join("demo.pem");
    let key = dir.join("demo.key");
    // Readable by this user only, as a private key should be.
    let write = |p: &std::path::Path, text: String| {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(p)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    write(&cert, made.cert.pem())?;
    write(&key, made.signing_key.serialize_pem())?;
    let digest = ring::digest::digest(&ring::digest::SHA256, made.cert.der());
    let fingerprint = digest
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":");
    Ok(SelfSigned {
        cert,
        key,
        fingerprint,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn plans_cycle_latencies() {
        assert_eq!(super::backend_plan(0), ("backend-a".into(), 10));
        assert_eq!(super::backend_plan(4), ("backend-e".into(), 40));
    }
}

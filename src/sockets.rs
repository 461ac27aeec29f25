//! The listening sockets a start serves on (`docs/architecture.md`, "Listeners and
//! workers"): bound here, or received from the running process at an upgrade and checked
//! against the settings; the HTTPS ones with their certificates and QUIC's UDP sockets;
//! the `[[tcp_listeners]]` ones dealt out to the workers. Apart from `server`, which
//! runs the workers over them: what sockets there are changes for other reasons than how
//! they are served.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::tcp::TcpListenerSpec;
use crate::config::Settings;
use crate::listeners::bind_workers;
use crate::obtained::Obtained;
use crate::upgrade::{Listeners, Successor};

/// A worker's sockets of `[[tcp_listeners]]`, each with its entry.
pub(crate) type TcpSockets = Vec<(std::net::TcpListener, Arc<TcpListenerSpec>)>;

/// One worker's HTTPS listening socket and what it serves.
pub(crate) struct HttpsListener {
    /// The socket, on `tls_listen`.
    pub(crate) listener: std::net::TcpListener,
    /// The certificates and the TLS settings.
    pub(crate) tls: Arc<crate::tls::Tls>,
    /// With `http3`: the worker's UDP socket on the same port, and QUIC's settings.
    pub(crate) quic: Option<(std::net::UdpSocket, quinn::ServerConfig)>,
}

impl HttpsListener {
    /// The listener on this worker's runtime, and its QUIC endpoint (none if it cannot
    /// be made: TLS over TCP serves on).
    pub(crate) fn into_tokio(self) -> std::io::Result<(Https1, Option<crate::quic::Endpoint>)> {
        let quic = self.quic.and_then(|(socket, config)| {
            crate::quic::Endpoint::new(socket, config)
                .inspect_err(|e| tracing::error!(error = %e, "cannot serve HTTP/3 on this worker"))
                .ok()
        });
        Ok(((TcpListener::from_std(self.listener)?, self.tls), quic))
    }
}

/// A worker's HTTPS listener and its certificates.
pub(crate) type Https1 = (TcpListener, Arc<crate::tls::Tls>);

/// Each `[[tcp_listeners]]` entry's address, in order.
fn tcp_addresses(settings: &Settings) -> Vec<SocketAddr> {
    settings.tcp_listeners.iter().map(|l| l.listen).collect()
}

/// The `[[tcp_listeners]]` sockets (each entry's, one per worker, in order) dealt out:
/// each worker's, each with its entry.
pub(crate) fn tcp_per_worker(
    sockets: Vec<std::net::TcpListener>,
    settings: &Settings,
    workers: usize,
) -> (Vec<TcpSockets>, Vec<(SocketAddr, String)>) {
    let specs = &settings.tcp_listeners;
    // Each entry's address as bound (port 0 resolved) and its pool, for the log.
    let addrs = (sockets.iter().step_by(workers.max(1)))
        .zip(specs)
        .map(|(l, spec)| (l.local_addr().unwrap_or(spec.listen), spec.pool.clone()))
        .collect();
    let mut each: Vec<TcpSockets> = (0..workers).map(|_| Vec::new()).collect();
    let specs: Vec<Arc<TcpListenerSpec>> = specs.iter().cloned().map(Arc::new).collect();
    for (k, socket) in sockets.into_iter().enumerate() {
        let (entry, worker) = (k / workers.max(1), k % workers.max(1));
        if let (Some(spec), Some(mine)) = (specs.get(entry), each.get_mut(worker)) {
            mine.push((socket, Arc::clone(spec)));
        }
    }
    (each, addrs)
}

/// The proxy's and the admin API's listening sockets: bound here, or received from the
/// running process with `--upgrade` (plus a successor to tell it when this one serves).
pub(crate) fn open_listeners(
    settings: &Settings,
    upgrade: bool,
) -> Result<(Listeners, Option<Successor>), String> {
    let path = match (&settings.upgrade_socket, upgrade) {
        (Some(path), true) => path,
        _ => return Ok((bind_listeners(settings)?, None)),
    };
    let (mut listeners, successor) = crate::upgrade::inherit(path)?;
    same_address(&listeners.proxy[0], settings.listen, "listen")?;
    same_address(&listeners.admin, settings.admin, "admin")?;
    match (settings.tls.listen, listeners.tls.first()) {
        (Some(want), Some(got)) if listeners.tls.len() == listeners.proxy.len() => {
            same_address(got, want, "tls_listen")?;
        }
        (None, None) => {}
        _ => return Err(
            "--upgrade: tls_listen differs from the running process's; a change takes a restart"
                .into(),
        ),
    }
    // One worker per received socket, whatever `--workers` says: a socket closed here
    // would drop the connections waiting in its queue, and one added would take
    // connections the old process could not give back if this one failed.
    if listeners.proxy.len() != settings.workers {
        tracing::warn!(
            "--workers {}: an upgrade keeps the running process's {} listening sockets, one worker each; a new count takes a restart",
            settings.workers,
            listeners.proxy.len()
        );
    }
    let kept = std::mem::take(&mut listeners.quic);
    listeners.quic = udp_sockets(settings, &listeners.tls, kept, false)?;
    let kept = std::mem::take(&mut listeners.tcp);
    let workers = listeners.proxy.len();
    let tcp = crate::listeners::tcp_after_upgrade(&tcp_addresses(settings), kept, workers)?;
    listeners.tcp = tcp.into_iter().flatten().collect();
    Ok((listeners, Some(successor)))
}

fn bind_listeners(settings: &Settings) -> Result<Listeners, String> {
    let proxy = bind_workers(settings.listen, settings.workers)
        .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
    let tls = match settings.tls.listen {
        Some(addr) => bind_workers(addr, settings.workers)
            .map_err(|e| format!("cannot listen on {addr} (tls_listen): {e}"))?,
        None => Vec::new(),
    };
    let quic = udp_sockets(settings, &tls, Vec::new(), true)?;
    let tcp = crate::listeners::bind_tcp(&tcp_addresses(settings), settings.workers)?;
    let admin = bind_workers(settings.admin, 1)
        .map(|mut v| v.remove(0))
        .map_err(|e| format!("cannot listen on {} (admin): {e}", settings.admin))?;
    Ok(Listeners {
        proxy,
        tls,
        quic,
        admin,
        tcp,
    })
}

/// With `http3`, one UDP socket per HTTPS listener on its port: those `kept` (received
/// at an upgrade), then new ones, first checked (`probe`, at a first start) for a socket
/// already there, this process's kind or not. At an upgrade nothing is checked: a
/// predecessor that did not hand its UDP sockets over holds them with `SO_REUSEPORT`,
/// and new ones bind beside them. Any beyond one per HTTPS listener are closed unused
/// (`https_listeners`); without `http3` there are none, and any received are closed.
fn udp_sockets(
    settings: &Settings,
    tls: &[std::net::TcpListener],
    kept: Vec<std::net::UdpSocket>,
    probe: bool,
) -> Result<Vec<std::net::UdpSocket>, String> {
    let Some(first) = tls.first().filter(|_| settings.tls.http3) else {
        return Ok(Vec::new());
    };
    let addr = first
        .local_addr()
        .map_err(|e| format!("https listener: {e}"))?;
    let mut sockets = kept;
    let more = tls.len().saturating_sub(sockets.len());
    sockets.extend(
        crate::listeners::bind_udp_workers(addr, more, probe)
            .map_err(|e| format!("cannot listen on {addr} (http3, udp): {e}"))?,
    );
    Ok(sockets)
}

/// The workers' HTTPS listeners with the certificates they serve, their address, and
/// the certificates again for reloads; nothing without `tls_listen`.
type Https = (
    Vec<HttpsListener>,
    Option<SocketAddr>,
    Option<Arc<crate::tls::Tls>>,
);

pub(crate) fn https_listeners(
    settings: &Settings,
    sockets: Vec<std::net::TcpListener>,
    udp: Vec<std::net::UdpSocket>,
    obtained: Option<Arc<Obtained>>,
) -> Result<Https, String> {
    if settings.tls.listen.is_none() || sockets.is_empty() {
        return Ok((Vec::new(), None, None));
    }
    let tls = Arc::new(crate::tls::Tls::new(&settings.tls, obtained)?);
    let addr = sockets[0]
        .local_addr()
        .map_err(|e| format!("https listener: {e}"))?;
    let mut quic = if udp.is_empty() {
        Vec::new()
    } else {
        quic_configured(&tls, addr, udp)?
    }
    .into_iter();
    let https = sockets
        .into_iter()
        .map(|listener| HttpsListener {
            listener,
            tls: Arc::clone(&tls),
            quic: quic.next(),
        })
        .collect();
    Ok((https, Some(addr), Some(tls)))
}

/// The workers' UDP sockets on the HTTPS listener's port, each with QUIC's settings;
/// from now on answers over TLS say `Alt-Svc`.
fn quic_configured(
    tls: &crate::tls::Tls,
    addr: SocketAddr,
    sockets: Vec<std::net::UdpSocket>,
) -> Result<Vec<(std::net::UdpSocket, quinn::ServerConfig)>, String> {
    let mut config = quinn::ServerConfig::with_crypto(tls.quic_crypto()?);
    config.transport_config(Arc::new(crate::h3_front::transport()));
    // Each worker's socket gets a client's packets by their addresses: a client that
    // moves would land on another worker's endpoint, so it is not followed.
    config.migration(false);
    crate::proxy::advertise_h3(addr.port());
    Ok(sockets.into_iter().map(|s| (s, config.clone())).collect())
}

/// A received socket must be on the address this process is set to (port 0 takes any).
fn same_address(
    got: &std::net::TcpListener,
    want: SocketAddr,
    key: &str,
) -> Result<SocketAddr, String> {
    let addr = got.local_addr().map_err(|e| format!("--upgrade: {e}"))?;
    let matches = addr == want || (want.port() == 0 && addr.ip() == want.ip());
    if matches {
        Ok(addr)
    } else {
        Err(format!(
            "--upgrade: the running process's {key} socket is on {addr}, but {key} is set to {want}"
        ))
    }
}

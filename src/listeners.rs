//! The listening sockets and what they may hold (`docs/operations.md`, "Limits"):
//! binding (several workers on one port, a port already answering refused), the
//! connection caps and the descriptor budget drawn from the open-file limit, and the
//! pause after a failed accept. Shared by the proxy's workers and the admin API.

use std::net::SocketAddr;
use std::time::Duration;

/// Descriptors kept out of the connection caps: logs, the health checker's probes,
/// the upgrade socket, spawned children's pipes.
const RESERVED_FDS: usize = 64;

/// The admin API's connection cap, at most (see `ConnectionCaps`).
const ADMIN_MAX_CONNECTIONS: usize = 256;

/// How long an accept loop pauses after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(20);

/// Binds a listener with `SO_REUSEADDR` and `SO_REUSEPORT`, so several workers can
/// share one port and a restart does not wait for TIME_WAIT.
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Binds one listener per worker on the same port (the first decides an ephemeral port).
///
/// `SO_REUSEPORT` would let a second process of the same user join a port silently and
/// take half its traffic. A listener already answering on the address makes the port an
/// error instead, as nginx and HAProxy report it.
pub(crate) fn bind_workers(
    addr: SocketAddr,
    workers: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    if addr.port() != 0 {
        let mut probe = addr;
        if probe.ip().is_unspecified() {
            probe.set_ip(if addr.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        if std::net::TcpStream::connect_timeout(&probe, Duration::from_millis(200)).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "address already in use",
            ));
        }
    }
    let first = bind(addr)?;
    let actual = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..workers {
        all.push(bind(actual)?);
    }
    Ok(all)
}

/// Binds one UDP socket per worker on `addr` (HTTP/3), with `SO_REUSEPORT`: the kernel
/// keeps a client's packets on one socket (by their addresses), so each QUIC connection
/// stays with one worker. With `probe`, a socket already on the address, this process's
/// kind or not, makes it an error first, as [`bind_workers`] does for TCP (a successor
/// taking over from a running fulcrum binds beside its sockets instead).
pub(crate) fn bind_udp_workers(
    addr: SocketAddr,
    workers: usize,
    probe: bool,
) -> std::io::Result<Vec<std::net::UdpSocket>> {
    use socket2::{Domain, Protocol, Socket, Type};
    // Without SO_REUSEPORT, a bind fails on any socket there, shared or not.
    if probe {
        drop(std::net::UdpSocket::bind(addr)?);
    }
    let bind = || -> std::io::Result<std::net::UdpSocket> {
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        Ok(socket.into())
    };
    (0..workers).map(|_| bind()).collect()
}

/// Binds `[[tcp_listeners]]` (`docs/tcp.md`): one socket per worker for each entry, in
/// the entries' order, each entry's checked for a listener already there as
/// [`bind_workers`] does.
pub(crate) fn bind_tcp(
    addrs: &[SocketAddr],
    workers: usize,
) -> Result<Vec<std::net::TcpListener>, String> {
    let mut all = Vec::new();
    for &addr in addrs {
        let bound = bind_workers(addr, workers)
            .map_err(|e| format!("cannot listen on {addr} (tcp_listeners): {e}"))?;
        all.extend(bound);
    }
    Ok(all)
}

/// The `[[tcp_listeners]]` sockets after an upgrade: for each entry, the received
/// sockets on its address, one per worker (an entry on port 0 takes, in order, the
/// received sockets on its IP that no entry names by port: the old process's, when the
/// entries did not change), else new ones bound beside the old process's (an entry
/// added); received sockets no entry wants are closed. Each entry's sockets in order,
/// one per worker.
pub(crate) fn tcp_after_upgrade(
    addrs: &[SocketAddr],
    mut received: Vec<std::net::TcpListener>,
    workers: usize,
) -> Result<Vec<Vec<std::net::TcpListener>>, String> {
    let mut each: Vec<Vec<std::net::TcpListener>> = addrs.iter().map(|_| Vec::new()).collect();
    // Named ports first, so that an entry on port 0 cannot take another's sockets.
    let order = (addrs.iter().enumerate()).filter(|(_, a)| a.port() != 0);
    let ephemeral = (addrs.iter().enumerate()).filter(|(_, a)| a.port() == 0);
    for (i, &want) in order.chain(ephemeral) {
        let on_it = |l: &std::net::TcpListener| {
            l.local_addr().is_ok_and(|a| match want.port() {
                0 => a.ip() == want.ip(),
                _ => a == want,
            })
        };
        let mut mine = Vec::new();
        let mut rest = Vec::new();
        for l in received {
            match mine.len() < workers && on_it(&l) {
                true => mine.push(l),
                false => rest.push(l),
            }
        }
        received = rest;
        if mine.len() < workers {
            let bind_one =
                || bind(want).map_err(|e| format!("cannot listen on {want} (tcp_listeners): {e}"));
            mine = (0..workers).map(|_| bind_one()).collect::<Result<_, _>>()?;
        }
        each[i] = mine;
    }
    Ok(each)
}

/// How many connections each listener holds at most, and the descriptors the proxy
/// side may hold (`docs/operations.md`, "Limits"). All come out of the
/// open-file limit, apart, so neither listener, nor the backend connections, can take
/// the descriptors the admin API and the health checks need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionCaps {
    /// Client connections on the proxy listener, all workers together.
    pub(crate) proxy: usize,
    /// Connections on the admin listener.
    pub(crate) admin: usize,
    /// Descriptors for client connections and backend connections together
    /// ([`crate::descriptors`]).
    pub(crate) descriptors: usize,
}

impl ConnectionCaps {
    /// The admin API gets a sixteenth of the descriptors (4 to 256); the proxy gets
    /// half of the rest, as each of its connections may hold an upstream one too
    /// (HAProxy derives its default `maxconn` the same way), unless `max_connections`
    /// sets its cap.
    pub(crate) fn new(open_files: u64, max_connections: usize) -> ConnectionCaps {
        let files = usize::try_from(open_files).unwrap_or(usize::MAX);
        let admin = (files / 16).clamp(4, ADMIN_MAX_CONNECTIONS);
        let descriptors = files.saturating_sub(RESERVED_FDS + admin).max(2);
        let proxy = if max_connections > 0 {
            max_connections
        } else {
            (descriptors / 2).max(1)
        };
        ConnectionCaps {
            proxy,
            admin,
            descriptors,
        }
    }
}

/// Pauses an accept loop after a failed accept. Out of descriptors, the connection
/// stays queued and the listener stays readable: retrying at once would spin. The
/// warning is written at most once a second.
#[derive(Debug, Default)]
pub(crate) struct AcceptBackoff {
    last_warning: Option<std::time::Instant>,
    quiet: u64,
}

impl AcceptBackoff {
    /// Records a failed accept on `listener` and sleeps.
    pub(crate) async fn failed(&mut self, e: &std::io::Error, listener: &'static str) {
        let now = std::time::Instant::now();
        if self
            .last_warning
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            tracing::warn!(error = %e, listener, repeated = self.quiet, "accept failed; pausing");
            self.last_warning = Some(now);
            self.quiet = 0;
        } else {
            self.quiet += 1;
        }
        tokio::time::sleep(ACCEPT_PAUSE).await;
    }
}

/// Raises the soft limit on open files to the hard one, as HAProxy does by itself and
/// nginx with `worker_rlimit_nofile`: every proxied connection holds two descriptors,
/// and the usual soft limit of 1024 would refuse connections long before the machine
/// runs out.
/// Returns the soft limit in force afterwards.
pub(crate) fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            } else {
                tracing::debug!("cannot raise the open-file limit");
            }
        }
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_caps_leave_each_listener_its_descriptors() {
        // The usual soft limit, this machine's kind, a large server's.
        assert_eq!(
            ConnectionCaps::new(1024, 0),
            ConnectionCaps {
                proxy: 448,
                admin: 64,
                descriptors: 896,
            }
        );
        assert_eq!(ConnectionCaps::new(20_000, 0).admin, 256);
        assert_eq!(ConnectionCaps::new(20_000, 0).proxy, 9_840);
        assert_eq!(ConnectionCaps::new(1 << 20, 0).proxy, 524_128);
        // A tiny limit still leaves each listener something.
        assert_eq!(
            ConnectionCaps::new(10, 0),
            ConnectionCaps {
                proxy: 1,
                admin: 4,
                descriptors: 2,
            }
        );
        // The setting wins for the proxy's connections, never for the descriptors.
        let set = ConnectionCaps::new(20_000, 50_000);
        assert_eq!((set.proxy, set.descriptors), (50_000, 19_680));
    }
}

/// `max_connections_per_client` (`docs/policies.md`, "Connections per client"): the
/// connections each client IP holds open, on every listener and worker together. A
/// client at its cap has a new connection closed at once, as HAProxy's `src_conn_cur`
/// check or nginx's `limit_conn` does.
#[derive(Debug)]
pub(crate) struct PerClient {
    cap: u32,
    shards: Box<[std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, u32>>]>,
}

/// A connection counted for its client; uncounted when dropped.
#[derive(Debug)]
pub(crate) struct ClientSlot {
    owner: std::sync::Arc<PerClient>,
    ip: std::net::IpAddr,
}

impl PerClient {
    /// Clients of at most `cap` connections each.
    pub(crate) fn new(cap: u32) -> PerClient {
        PerClient {
            cap,
            shards: (0..16).map(|_| Default::default()).collect(),
        }
    }

    fn shard(
        &self,
        ip: std::net::IpAddr,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<std::net::IpAddr, u32>> {
        let h = match ip {
            std::net::IpAddr::V4(a) => u32::from(a) as usize,
            std::net::IpAddr::V6(a) => (u128::from(a) as usize) ^ ((u128::from(a) >> 64) as usize),
        };
        let m = &self.shards[(h ^ (h >> 8) ^ (h >> 16)) & (self.shards.len() - 1)];
        // Nothing panics while holding it.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new connection of `ip`, or `None` when the client holds its cap
    /// already.
    pub(crate) fn admit(self: &std::sync::Arc<Self>, ip: std::net::IpAddr) -> Option<ClientSlot> {
        let ip = ip.to_canonical();
        let mut m = self.shard(ip);
        let n = m.entry(ip).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            owner: std::sync::Arc::clone(self),
            ip,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut m = self.owner.shard(self.ip);
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod per_client_tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_client_holds_at_most_its_cap_and_gets_slots_back() {
        let p = Arc::new(PerClient::new(2));
        let ip: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let a = p.admit(ip).unwrap();
        let _b = p.admit(ip).unwrap();
        assert!(p.admit(ip).is_none());
        assert!(
            p.admit("192.0.2.2".parse().unwrap()).is_some(),
            "another client"
        );
        drop(a);
        assert!(p.admit(ip).is_some());
    }
}

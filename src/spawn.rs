//! Backends fulcrum starts itself: `fulcrum backend` child processes for the demo, the
//! dashboard and rehearsals (`POST /admin/backends/spawn`, `kill`, `revive`).
//!
//! The port is found by binding it here and handing the bound socket to the child (as
//! file descriptor 3), so no other process can take it between choosing and listening.
//! Every child runs in its own process group, is reaped by a task that waits for it, gets
//! `SIGTERM` when fulcrum's admin thread ends (`PR_SET_PDEATHSIG`, so even a killed
//! fulcrum leaves nothing behind), and is stopped explicitly on a normal exit.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::backend_spec;
use crate::pool::{Backend, Pool, PoolError, SpawnInfo};
use crate::site::Site;

/// How long a new child has to answer its health check.
pub(crate) const HEALTH_DEADLINE: Duration = Duration::from_secs(5);
/// Spawned backends running at once: the demo's 64 (`fulcrum demo --backends`, all in
/// its first pool) and the two of its `api` pool fit.
pub(crate) const MAX_SPAWNED: usize = 66;
/// The descriptor a child finds its listening socket on.
pub(crate) const CHILD_LISTEN_FD: i32 = 3;

/// What can go wrong while spawning.
#[derive(Debug)]
pub(crate) enum SpawnError {
    /// Too many spawned backends, not spawned, already running, port taken…
    Conflict(String),
    /// The child did not answer its health check in time (it has been stopped).
    NotHealthy(String),
    /// The system refused (no executable, no socket…).
    Failed(String),
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnError::Conflict(m) | SpawnError::NotHealthy(m) | SpawnError::Failed(m) => {
                f.write_str(m)
            }
        }
    }
}

/// What a spawned backend is asked to be.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpawnRequest {
    /// Pool weight.
    pub(crate) weight: Option<u32>,
    /// The demo backend's latency.
    pub(crate) latency_ms: u64,
    /// Display name (default `spawned-PORT`).
    pub(crate) name: Option<String>,
}

/// Starts, stops and reaps spawned backends.
#[derive(Debug)]
pub(crate) struct Spawner {
    site: Arc<Site>,
    exe: Option<PathBuf>,
    /// Serialises spawns so the limit and port choices are not raced.
    lock: tokio::sync::Mutex<()>,
}

/// Binds `port` on 127.0.0.1 (0 = the kernel picks) without `SO_REUSEPORT`, so a port
/// another process listens on is refused.
pub(crate) fn bind_loopback(port: u16) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// Starts `fulcrum backend` (the executable `exe`) serving on `listener` as `name`,
/// with `args` on its command line and `stdin`; it dies with this process.
pub(crate) fn backend_process(
    exe: &std::path::Path,
    listener: std::net::TcpListener,
    name: &str,
    args: &[String],
    stdin: std::process::Stdio,
) -> std::io::Result<tokio::process::Child> {
    let addr = listener.local_addr()?;
    let fd: OwnedFd = listener.into();
    let raw = fd.as_raw_fd();
    let mut cmd = tokio::process::Command::new(exe);
    // `--name=…` in one argument: a name starting with '-' stays a value.
    cmd.args([
        "backend",
        "--listen",
        &addr.to_string(),
        &format!("--name={name}"),
    ])
    .args(args)
    .args(["--listen-fd", &CHILD_LISTEN_FD.to_string()])
    .stdin(stdin)
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .process_group(0)
    .kill_on_drop(true);
    dies_with_this_thread(&mut cmd);
    // SAFETY: between fork and exec only async-signal-safe calls: dup2, fcntl.
    unsafe {
        cmd.pre_exec(move || {
            if raw == CHILD_LISTEN_FD {
                // dup2 onto itself keeps close-on-exec; clear it instead.
                let flags = libc::fcntl(raw, libc::F_GETFD);
                libc::fcntl(raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            } else if libc::dup2(raw, CHILD_LISTEN_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(fd);
    Ok(child)
}

/// Has the child of `cmd` get `SIGTERM` when the thread that starts it ends
/// (`PR_SET_PDEATHSIG`), so even a killed fulcrum leaves no child behind.
pub(crate) fn dies_with_this_thread(cmd: &mut tokio::process::Command) {
    // SAFETY: between fork and exec only an async-signal-safe call: prctl.
    unsafe {
        cmd.pre_exec(|| {
            #[cfg(target_os = "linux")]
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
}

/// Whether `addr` answers `GET /health` with a 2xx before `deadline`.
pub(crate) async fn answers_health(addr: SocketAddr, deadline: Instant) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    while Instant::now() < deadline {
        let attempt = async {
            let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
            s.write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut buf = [0u8; 12];
            s.read_exact(&mut buf).await.ok()?;
            Some(buf.starts_with(b"HTTP/1.1 2"))
        };
        if let Ok(Some(true)) = tokio::time::timeout(Duration::from_millis(500), attempt).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// Sends `sig` to the process group led by `pid`.
fn signal_group(pid: u32, sig: i32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals that process group; no memory is
        // involved.
        unsafe {
            libc::kill(-pid, sig);
        }
    }
}

impl Spawner {
    /// A spawner adding to the pools of `site`; children run this same executable.
    pub(crate) fn new(site: Arc<Site>) -> Spawner {
        Spawner {
            site,
            exe: std::env::current_exe().ok(),
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// Starts `fulcrum backend` on `listener` and waits for its health; the child is
    /// stopped again when it does not answer in time.
    async fn start_child(
        &self,
        listener: std::net::TcpListener,
        name: &str,
        latency_ms: u64,
    ) -> Result<tokio::process::Child, SpawnError> {
        let exe = self
            .exe
            .as_ref()
            .ok_or_else(|| SpawnError::Failed("cannot find fulcrum's own executable".into()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| SpawnError::Failed(format!("listener: {e}")))?;
        let args = [
            "--latency-ms".to_string(),
            latency_ms.to_string(),
            "--jitter-ms".to_string(),
            (latency_ms / 5).to_string(),
        ];
        let mut child = backend_process(exe, listener, name, &args, std::process::Stdio::null())
            .map_err(|e| SpawnError::Failed(format!("cannot start a backend: {e}")))?;
        if answers_health(addr, Instant::now() + HEALTH_DEADLINE).await {
            Ok(child)
        } else {
            let _ = child.kill().await;
            Err(SpawnError::NotHealthy(format!(
                "backend on {addr} did not answer its health check within {} s; stopped",
                HEALTH_DEADLINE.as_secs()
            )))
        }
    }

    /// Reaps `child` when it ends and notes that the backend's process is gone.
    fn watch(b: Arc<Backend>, mut child: tokio::process::Child) {
        let Some(pid) = child.id() else { return };
        if let Some(s) = &b.spawn {
            s.set_pid(pid);
        }
        tokio::spawn(async move {
            let status = child.wait().await;
            if let Some(s) = &b.spawn {
                s.clear_pid(pid);
            }
            tracing::info!(backend = %b.name, pid, status = ?status.ok(), "spawned backend exited");
        });
    }

    fn spawned_running(&self) -> usize {
        self.site
            .pools()
            .iter()
            .flat_map(|p| p.backends())
            .filter(|b| b.spawn.as_ref().is_some_and(|s| s.pid().is_some()))
            .count()
    }

    /// Starts a new backend and adds it to `pool` once its health answers.
    pub(crate) async fn spawn(
        &self,
        pool: &Pool,
        req: SpawnRequest,
    ) -> Result<Arc<Backend>, SpawnError> {
        let _serial = self.lock.lock().await;
        if self.spawned_running() >= MAX_SPAWNED {
            return Err(SpawnError::Conflict(format!(
                "at most {MAX_SPAWNED} spawned backends may run at once"
            )));
        }
        let listener =
            bind_loopback(0).map_err(|e| SpawnError::Failed(format!("no free port: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| SpawnError::Failed(format!("listener: {e}")))?
            .port();
        let name = req.name.unwrap_or_else(|| format!("spawned-{port}"));
        let url = format!("http://127.0.0.1:{port}");
        let spec = backend_spec(&url, req.weight, Some(&name)).map_err(SpawnError::Failed)?;
        let child = self.start_child(listener, &name, req.latency_ms).await?;
        match pool.add_from(
            crate::pool::Source::Spawn,
            spec,
            Some(SpawnInfo::new(
                port,
                req.latency_ms,
                child.id().unwrap_or(0),
            )),
        ) {
            Ok(b) => {
                Self::watch(Arc::clone(&b), child);
                tracing::info!(backend = %b.name, port, "spawned backend added");
                Ok(b)
            }
            Err(e) => {
                // `child` is killed on drop.
                Err(match e {
                    PoolError::NotFound(_) => SpawnError::Failed(e.to_string()),
                    _ => SpawnError::Conflict(e.to_string()),
                })
            }
        }
    }

    /// Kills a spawned backend's process (the health checks then notice).
    pub(crate) fn kill(&self, b: &Backend) -> Result<(), SpawnError> {
        let s = b.spawn.as_ref().ok_or_else(|| {
            SpawnError::Conflict(format!("backend {} was not spawned by fulcrum", b.id))
        })?;
        let pid = s
            .pid()
            .ok_or_else(|| SpawnError::Conflict(format!("backend {} is not running", b.id)))?;
        signal_group(pid, libc::SIGKILL);
        s.clear_pid(pid);
        tracing::warn!(backend = %b.name, pid, "spawned backend killed");
        Ok(())
    }

    /// Starts a killed spawned backend again on its port.
    pub(crate) async fn revive(&self, b: Arc<Backend>) -> Result<(), SpawnError> {
        let _serial = self.lock.lock().await;
        let s = b.spawn.as_ref().ok_or_else(|| {
            SpawnError::Conflict(format!("backend {} was not spawned by fulcrum", b.id))
        })?;
        if s.pid().is_some() {
            return Err(SpawnError::Conflict(format!(
                "backend {} is already running",
                b.id
            )));
        }
        if self.spawned_running() >= MAX_SPAWNED {
            return Err(SpawnError::Conflict(format!(
                "at most {MAX_SPAWNED} spawned backends may run at once"
            )));
        }
        // A process killed a moment ago may still hold the port while it exits.
        let deadline = Instant::now() + Duration::from_secs(1);
        let listener = loop {
            match bind_loopback(s.port) {
                Ok(l) => break l,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    return Err(SpawnError::Conflict(format!(
                        "port {} cannot be bound again: {e}",
                        s.port
                    )))
                }
            }
        };
        let child = self.start_child(listener, &b.name, s.latency_ms).await?;
        if !self
            .site
            .backend(b.id)
            .is_ok_and(|(_, p)| Arc::ptr_eq(&p, &b))
        {
            // Removed while its child was starting: do not leave that child behind
            // (`child` is killed on drop).
            return Err(SpawnError::Conflict(format!(
                "backend {} was removed meanwhile",
                b.id
            )));
        }
        tracing::info!(backend = %b.name, port = s.port, "spawned backend revived");
        Self::watch(b, child);
        Ok(())
    }

    /// Removes a backend from the pool; a spawned one's process is stopped once its
    /// requests in flight have finished (at most 10 s later).
    pub(crate) async fn remove(&self, id: u64) -> Result<Arc<Backend>, PoolError> {
        let _serial = self.lock.lock().await;
        let (pool, _) = self.site.backend(id)?;
        let b = pool.remove(id)?;
        Self::stop_when_idle(&b);
        Ok(b)
    }

    /// Stops a spawned backend's process once its requests in flight have finished
    /// (at most 10 s later); a backend fulcrum did not start is left alone.
    ///
    /// A thread of its own does the waiting: a reload that removes a pool comes from the
    /// signal handler's thread, which has no runtime.
    pub(crate) fn stop_when_idle(b: &Arc<Backend>) {
        if b.spawn.is_none() {
            return;
        }
        let gone = Arc::clone(b);
        let waiting = std::thread::Builder::new()
            .name("fulcrum-stop".into())
            .spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(10);
                while gone.in_flight() > 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Self::stop(&gone);
            });
        if waiting.is_err() {
            Self::stop(b);
        }
    }

    /// Stops the process of a spawned backend now.
    pub(crate) fn stop(b: &Backend) {
        if let Some(pid) = b.spawn.as_ref().and_then(|s| s.pid()) {
            signal_group(pid, libc::SIGTERM);
        }
    }

    /// Stops every spawned process (fulcrum is exiting).
    pub(crate) fn stop_all(&self) {
        for b in self.site.pools().iter().flat_map(|p| p.backends()) {
            Self::stop(&b);
        }
    }
}

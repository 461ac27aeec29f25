//! The demo backend and `fulcrum demo`.

pub mod backend;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Latencies of the demo backends, cycled: one fast, one middling, one slow.
const DEMO_LATENCIES_MS: [u64; 3] = [10, 40, 120];

/// A `fulcrum backend` child process, killed and reaped when dropped.
#[derive(Debug)]
pub struct ChildBackend {
    /// The child.
    pub child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its name.
    pub name: String,
}

impl Drop for ChildBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Finds a free loopback port by binding it (the kernel picks it) and releasing it.
pub fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Starts `fulcrum backend` as a child of this process. The child dies with its parent
/// (`PR_SET_PDEATHSIG`), so even a killed parent leaves nothing behind.
pub fn spawn_backend(name: &str, latency_ms: u64, jitter_ms: u64) -> Result<ChildBackend, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let port = free_port().map_err(|e| format!("no free port: {e}"))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut cmd = Command::new(exe);
    cmd.args([
        "backend",
        "--listen",
        &addr.to_string(),
        "--name",
        name,
        "--latency-ms",
        &latency_ms.to_string(),
        "--jitter-ms",
        &jitter_ms.to_string(),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start backend {name}: {e}"))?;
    Ok(ChildBackend {
        child,
        addr,
        name: name.to_string(),
    })
}

/// Waits until `addr` answers `GET /health` with 200, up to `limit`.
pub fn wait_healthy(addr: SocketAddr, limit: Duration) -> bool {
    use std::io::{Read, Write};
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
            if s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .is_ok()
            {
                let mut buf = [0u8; 16];
                if let Ok(n) = s.read(&mut buf) {
                    if buf[..n].starts_with(b"HTTP/1.1 200") {
                        return true;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

/// Starts `n` demo backends with different latencies and waits for each to answer.
pub fn start_demo_backends(n: usize) -> Result<Vec<ChildBackend>, String> {
    let mut children = Vec::with_capacity(n);
    for i in 0..n {
        let latency = DEMO_LATENCIES_MS[i % DEMO_LATENCIES_MS.len()];
        let name = format!("backend-{}", (b'a' + (i % 26) as u8) as char);
        children.push(spawn_backend(&name, latency, latency / 5)?);
    }
    for c in &children {
        if !wait_healthy(c.addr, Duration::from_secs(5)) {
            return Err(format!(
                "demo backend {} did not answer on {} within 5 s",
                c.name, c.addr
            ));
        }
    }
    Ok(children)
}

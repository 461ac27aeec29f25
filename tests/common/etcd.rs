//! A real etcd for the fleet tests: its own process on ephemeral ports with a data
//! directory of its own, and a TCP relay that cuts one client off.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::free_port;

/// A running etcd; killed, its data directory removed, on drop.
pub struct Etcd {
    child: Option<Child>,
    dir: std::path::PathBuf,
    /// `127.0.0.1:PORT` of its client listener.
    pub client: String,
    peer: u16,
}

impl Etcd {
    /// Starts one on fresh ports and waits until it answers.
    pub fn start(tag: &str) -> Etcd {
        // In memory where there is /dev/shm: etcd syncs every write to disk, which on a
        // busy 2-core machine costs more than the test measures.
        let shm = std::path::Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("fulcrum-test-etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut e = Etcd {
            child: None,
            dir,
            client: format!("127.0.0.1:{}", free_port()),
            peer: free_port(),
        };
        e.restart();
        e
    }

    /// Starts it again (same ports, same data) after [`Etcd::kill`].
    pub fn restart(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let client = format!("http://{}", self.client);
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(&self.dir)
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run etcd ({e}): the fleet tests need it (Debian: apt-get install etcd-server)")
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.post("/v3/kv/range", r#"{"key":"AA=="}"#).is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd did not answer on {}", self.client);
    }

    /// Kills it (SIGKILL): no goodbye to its clients.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// POSTs `body` to its JSON gateway; the answer's body on a 200.
    pub fn post(&self, path: &str, body: &str) -> Option<String> {
        let mut s = TcpStream::connect(&self.client).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.client,
            body.len()
        );
        s.write_all(req.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_string())
    }

    /// Writes `value` at `key` directly, as an operator's `etcdctl put` would.
    pub fn put(&self, key: &str, value: &str) {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::STANDARD;
        let body = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            b.encode(key),
            b.encode(value)
        );
        self.post("/v3/kv/put", &body).expect("etcd put");
    }

    /// The store URL of prefix `prefix` through this etcd.
    pub fn store(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.client)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP relay to `target` on a port of its own: closing it cuts its clients off, as
/// a network partition would; opening it again on the same port heals it.
pub struct Relay {
    pub addr: SocketAddr,
    target: String,
    open: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    pub fn start(target: &str) -> Relay {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let r = Relay {
            addr,
            target: target.to_string(),
            open: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(Mutex::new(Vec::new())),
        };
        r.open();
        r
    }

    /// Accepts and relays again.
    pub fn open(&self) {
        let listener = TcpListener::bind(self.addr).expect("relay port");
        listener.set_nonblocking(true).unwrap();
        self.open.store(true, Ordering::SeqCst);
        let (open, conns, target) = (
            Arc::clone(&self.open),
            Arc::clone(&self.conns),
            self.target.clone(),
        );
        std::thread::spawn(move || {
            while open.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        if let Ok(server) = TcpStream::connect(&target) {
                            pipe(&client, &server, &conns);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
    }

    /// Stops accepting and cuts every relayed connection.
    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        // The accept loop notices within a few milliseconds and drops the listener.
        std::thread::sleep(Duration::from_millis(50));
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The store URL of prefix `prefix` through this relay.
    pub fn store(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.addr)
    }
}

/// Copies both ways between `a` and `b`, keeping both to cut them later.
fn pipe(a: &TcpStream, b: &TcpStream, conns: &Arc<Mutex<Vec<TcpStream>>>) {
    for (from, to) in [(a, b), (b, a)] {
        let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Both);
        });
    }
    let mut c = conns.lock().unwrap();
    c.push(a.try_clone().unwrap());
    c.push(b.try_clone().unwrap());
}

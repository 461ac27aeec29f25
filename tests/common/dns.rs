//! A real DNS server for the discovery tests: Debian's dnsmasq, in the foreground on
//! 127.0.0.1 and an ephemeral port, answering from a hosts file (A/AAAA, re-read on
//! SIGHUP) and from SRV records in its config file (read at start).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// One SRV record: the name's target, port, priority and weight.
#[derive(Debug, Clone)]
pub struct Srv {
    pub name: String,
    pub target: String,
    pub port: u16,
    pub priority: u16,
    pub weight: u16,
}

/// A running dnsmasq; killed, its files removed, on drop.
pub struct Dnsmasq {
    child: Option<Child>,
    dir: PathBuf,
    /// Its UDP and TCP port on 127.0.0.1.
    pub port: u16,
}

impl Dnsmasq {
    /// Starts one answering `hosts` (lines of `ADDRESS NAME`) and `srv`; records live
    /// for 1 s (`--local-ttl`).
    pub fn start(tag: &str, hosts: &str, srv: &[Srv]) -> Dnsmasq {
        let dir = std::env::temp_dir().join(format!("fulcrum-dns-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut d = Dnsmasq {
            child: None,
            dir,
            port: free_udp_port(),
        };
        d.write_hosts(hosts);
        d.write_srv(srv);
        d.restart();
        d
    }

    /// `127.0.0.1:PORT`, for `--resolvers`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn write_hosts(&self, hosts: &str) {
        // Written whole, then renamed: dnsmasq never reads half a file.
        let tmp = self.dir.join("hosts.tmp");
        std::fs::write(&tmp, hosts).unwrap();
        std::fs::rename(&tmp, self.dir.join("hosts")).unwrap();
    }

    fn write_srv(&self, srv: &[Srv]) {
        let text: String = srv
            .iter()
            .map(|s| {
                format!(
                    "srv-host={},{},{},{},{}\n",
                    s.name, s.target, s.port, s.priority, s.weight
                )
            })
            .collect();
        std::fs::write(self.dir.join("dnsmasq.conf"), text).unwrap();
    }

    /// Replaces the hosts file and tells dnsmasq (SIGHUP re-reads it).
    pub fn set_hosts(&self, hosts: &str) {
        self.write_hosts(hosts);
        if let Some(c) = &self.child {
            let st = Command::new("kill")
                .args(["-HUP", &c.id().to_string()])
                .status()
                .unwrap();
            assert!(st.success());
        }
    }

    /// Replaces the SRV records: dnsmasq reads them at start, so it restarts.
    pub fn set_srv(&mut self, srv: &[Srv]) {
        self.write_srv(srv);
        self.stop();
        self.restart();
    }

    /// Stops it (SIGKILL): its port answers nothing until [`Dnsmasq::restart`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it (again) on the same port with the files as they are.
    pub fn restart(&mut self) {
        let child = Command::new("dnsmasq")
            .args([
                // In the foreground, and forking for a TCP query as a deployed dnsmasq
                // does (`--no-daemon` is debug mode: one TCP client stalls every query).
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                "--local-ttl=1",
                "--pid-file=",
                "--local=/test/",
            ])
            .arg(format!("--port={}", self.port))
            .arg(format!("--addn-hosts={}", self.dir.join("hosts").display()))
            .arg(format!("--conf-file={}", self.dir.join("dnsmasq.conf").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run dnsmasq ({e}): the discovery tests need it (Debian: apt-get install dnsmasq-base)")
            });
        self.child = Some(child);
        // Up once its port is taken.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::UdpSocket::bind(("127.0.0.1", self.port)).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("dnsmasq did not start on port {}", self.port);
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port free for UDP and TCP on 127.0.0.1 a moment ago.
fn free_udp_port() -> u16 {
    loop {
        let p = free_port();
        if std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
}

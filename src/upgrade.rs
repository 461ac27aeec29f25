//! Binary upgrade without a refused connection (`docs/operations.md`, "Upgrading the
//! binary").
//!
//! The running process listens on a Unix socket (`--upgrade-socket`, mode 0600, peers
//! of another user refused). A new process started with `--upgrade` connects, says
//! `hello`, and receives the listening sockets themselves (SCM_RIGHTS), not copies
//! bound again: the kernel's accept queues pass with them, so a connection that arrives
//! during the hand-over waits in a queue both processes accept from and is never
//! refused. The new process starts serving and says `ready`; the old one answers `ok`,
//! stops accepting, drains and exits; the new one then takes the Unix socket's path
//! over. Until `ok` both serve, so a new binary that fails to start, or is too slow to
//! say `ready`, changes nothing: the old one goes on, and a successor without its `ok`
//! stops. HAProxy's `-x` and Pingora's upgrade pass their sockets the same way.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::sync::watch;

/// First word of the message that carries the sockets; a new process refuses anything
/// else (an older or newer format, another program on the path).
const MAGIC: &str = "fulcrum-upgrade/1";
/// What the new process says first: a connection without it (a liveness probe, say)
/// gets nothing.
const HELLO: &[u8] = b"fulcrum-upgrade/1 hello\n";
/// What the new process says once it serves.
const READY: &[u8] = b"ready\n";
/// The old process's answer to `ready`: it stops accepting now.
const OK: &[u8] = b"ok\n";
pub(crate) use crate::config::MAX_SOCKETS;
/// How long the old process waits for `hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long either side waits for the other's next step. A new process binds nothing
/// and only starts threads before it says `ready`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a listening socket is for, as the hand-over names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Proxy,
    Tls,
    /// A worker's UDP socket on the TLS port (HTTP/3).
    Quic,
    Admin,
    /// A worker's socket of a `[[tcp_listeners]]` entry.
    Tcp,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Proxy => "proxy",
            Role::Tls => "tls",
            Role::Quic => "quic",
            Role::Admin => "admin",
            Role::Tcp => "tcp",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        match s {
            "proxy" => Some(Role::Proxy),
            "tls" => Some(Role::Tls),
            "quic" => Some(Role::Quic),
            "admin" => Some(Role::Admin),
            "tcp" => Some(Role::Tcp),
            _ => None,
        }
    }
}

/// The listening sockets a process serves on.
#[derive(Debug)]
pub(crate) struct Listeners {
    /// One per worker, all on the proxy address.
    pub(crate) proxy: Vec<TcpListener>,
    /// One per worker on the HTTPS address (`tls_listen`), or none.
    pub(crate) tls: Vec<TcpListener>,
    /// One per worker on the HTTPS port with `http3`, or none.
    pub(crate) quic: Vec<UdpSocket>,
    /// The admin API's.
    pub(crate) admin: TcpListener,
    /// The `[[tcp_listeners]]` sockets, one per worker each, in the order of the
    /// entries (after an upgrade `listeners::tcp_after_upgrade` sorts them out by address;
    /// `server::tcp_per_worker` deals them out).
    pub(crate) tcp: Vec<TcpListener>,
}

impl Listeners {
    /// Second descriptors of the same sockets, kept to be handed over later.
    pub(crate) fn try_clone(&self) -> std::io::Result<Listeners> {
        Ok(Listeners {
            proxy: self
                .proxy
                .iter()
                .map(TcpListener::try_clone)
                .collect::<Result<_, _>>()?,
            tls: self
                .tls
                .iter()
                .map(TcpListener::try_clone)
                .collect::<Result<_, _>>()?,
            quic: self
                .quic
                .iter()
                .map(UdpSocket::try_clone)
                .collect::<Result<_, _>>()?,
            admin: self.admin.try_clone()?,
            tcp: (self.tcp.iter())
                .map(TcpListener::try_clone)
                .collect::<Result<_, _>>()?,
        })
    }

    fn roles(&self) -> impl Iterator<Item = (Role, BorrowedFd<'_>)> {
        self.proxy
            .iter()
            .map(|l| (Role::Proxy, l.as_fd()))
            .chain(self.tls.iter().map(|l| (Role::Tls, l.as_fd())))
            .chain(self.quic.iter().map(|s| (Role::Quic, s.as_fd())))
            .chain(std::iter::once((Role::Admin, self.admin.as_fd())))
            .chain(self.tcp.iter().map(|l| (Role::Tcp, l.as_fd())))
    }
}

/// The new process's side: connects to the running process at `path` and receives its
/// listening sockets. The returned [`Successor`] says `ready` once they are served.
pub(crate) fn inherit(path: &Path) -> Result<(Listeners, Successor), String> {
    let fail = |e: &dyn std::fmt::Display| {
        format!(
            "--upgrade: cannot take over from the process at {}: {e}",
            path.display()
        )
    };
    let mut stream = UnixStream::connect(path).map_err(|e| fail(&e))?;
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| fail(&e))?;
    stream.write_all(HELLO).map_err(|e| fail(&e))?;
    let (text, fds) = receive(&stream).map_err(|e| fail(&e))?;
    if text.is_empty() {
        return Err(fail(
            &"the running process closed the connection (another upgrade under way?)",
        ));
    }
    let listeners = decode(&text, fds).map_err(|e| fail(&e))?;
    Ok((listeners, Successor { stream }))
}

/// Reads the one message that carries the sockets.
fn receive(stream: &UnixStream) -> std::io::Result<(String, Vec<OwnedFd>)> {
    let mut data = [0u8; 8192];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(&mut data)];
    let got = rustix::net::recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    let text = String::from_utf8_lossy(&data[..got.bytes]).into_owned();
    Ok((text, fds))
}

/// Turns the message's text (`MAGIC` and one role per socket) and its sockets into
/// listeners.
fn decode(text: &str, fds: Vec<OwnedFd>) -> Result<Listeners, String> {
    let mut words = text.split_ascii_whitespace();
    if words.next() != Some(MAGIC) {
        return Err("the other side does not speak this hand-over".into());
    }
    let roles: Vec<&str> = words.collect();
    if roles.len() != fds.len() {
        return Err(format!(
            "{} sockets named but {} received",
            roles.len(),
            fds.len()
        ));
    }
    let (mut proxy, mut tls, mut quic, mut tcp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut admin = None;
    for (name, fd) in roles.into_iter().zip(fds) {
        let role = Role::parse(name).ok_or_else(|| format!("unknown socket role {name:?}"))?;
        let nonblocking = |fd: OwnedFd| {
            rustix::io::ioctl_fionbio(&fd, true)
                .map(|()| fd)
                .map_err(|e| format!("socket {name}: {e}"))
        };
        let fd = nonblocking(fd)?;
        match role {
            Role::Proxy => proxy.push(TcpListener::from(fd)),
            Role::Tls => tls.push(TcpListener::from(fd)),
            Role::Quic => quic.push(UdpSocket::from(fd)),
            Role::Admin => admin = Some(TcpListener::from(fd)),
            Role::Tcp => tcp.push(TcpListener::from(fd)),
        }
    }
    match admin {
        Some(admin) if !proxy.is_empty() => Ok(Listeners {
            proxy,
            tls,
            quic,
            admin,
            tcp,
        }),
        _ => Err("the hand-over lacks the proxy or the admin socket".into()),
    }
}

/// The new process's end of the hand-over, until it says `ready`.
#[derive(Debug)]
pub(crate) struct Successor {
    stream: UnixStream,
}

impl Successor {
    /// The old process's pid, as its socket's credentials give it.
    pub(crate) fn old_pid(&self) -> Option<u32> {
        let cred = rustix::net::sockopt::socket_peercred(&self.stream).ok()?;
        u32::try_from(cred.pid.as_raw_pid()).ok()
    }

    /// Tells the old process that this one serves and waits for its `ok`: from then on
    /// it stops accepting and drains. Without the `ok` (it gave up waiting, it went
    /// away) this process must not go on serving beside it.
    pub(crate) fn ready(mut self) -> Result<(), String> {
        let fail = |e: &dyn std::fmt::Display| format!("--upgrade: {e}; the old process serves on");
        self.stream.write_all(READY).map_err(|e| fail(&e))?;
        let mut got = [0u8; 3];
        self.stream.read_exact(&mut got).map_err(|e| fail(&e))?;
        if got == OK {
            Ok(())
        } else {
            Err(fail(&"the old process did not agree to stop"))
        }
    }
}

/// The upgrade socket of a running process, and what it hands over.
#[derive(Debug)]
pub(crate) struct Handover {
    path: PathBuf,
    listener: UnixListener,
    /// The file's inode: at a stop the path is removed only if it is still this socket
    /// (after a hand-over it is the successor's).
    inode: u64,
    sockets: Listeners,
    /// Set once a successor has taken the sockets: the path is its to keep.
    handed_over: bool,
}

impl Drop for Handover {
    /// At a stop without a hand-over the path goes with the process, however the task
    /// that served it ended (its runtime may end it first).
    fn drop(&mut self) {
        if !self.handed_over && std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Handover {
    /// Listens on `path`. A successor (`taking_over`, once the old process has said
    /// `ok`) binds beside the path and renames its socket over it, so the path never
    /// leads nowhere; a first process removes a stale file but refuses a path a live
    /// process answers on. Only this user may connect.
    pub(crate) fn bind(
        path: &Path,
        sockets: Listeners,
        taking_over: bool,
    ) -> Result<Handover, String> {
        let fail = |e: &dyn std::fmt::Display| format!("upgrade socket {}: {e}", path.display());
        let private =
            |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600));
        let listener = if taking_over {
            let tmp = path.with_extension(format!("new-{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            let l = UnixListener::bind(&tmp).map_err(|e| fail(&e))?;
            private(&tmp).map_err(|e| fail(&e))?;
            std::fs::rename(&tmp, path).map_err(|e| fail(&e))?;
            l
        } else {
            let l = bind_fresh(path).map_err(|e| fail(&e))?;
            private(path).map_err(|e| fail(&e))?;
            l
        };
        listener.set_nonblocking(true).map_err(|e| fail(&e))?;
        let inode = std::fs::metadata(path).map_err(|e| fail(&e))?.ino();
        Ok(Handover {
            path: path.to_path_buf(),
            listener,
            inode,
            sockets,
            handed_over: false,
        })
    }

    /// Serves hand-overs until one succeeds (then `upgraded` turns true) or `stop`
    /// flips. A failed one is logged and the process goes on serving.
    pub(crate) async fn run(
        mut self,
        upgraded: watch::Sender<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let listener = match self
            .listener
            .try_clone()
            .and_then(tokio::net::UnixListener::from_std)
        {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "upgrade socket unusable; no upgrade can reach this process");
                return;
            }
        };
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "upgrade socket: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = stop.changed() => break,
            };
            let outcome = tokio::select! {
                o = self.hand_over(stream) => o,
                _ = stop.changed() => break,
            };
            match outcome {
                Ok(()) => {
                    tracing::info!("upgrade: the new process serves; draining");
                    self.handed_over = true;
                    let _ = upgraded.send(true);
                    return;
                }
                Err(Refusal::NotAnUpgrade) => {}
                Err(Refusal::Failed(e)) => {
                    tracing::error!("upgrade failed: {e}; this process goes on serving");
                }
            }
        }
    }

    /// One hand-over: `hello`, the sockets, `ready`, `ok`.
    async fn hand_over(&self, mut stream: tokio::net::UnixStream) -> Result<(), Refusal> {
        use tokio::io::AsyncWriteExt;
        let own = rustix::process::geteuid().as_raw();
        match stream.peer_cred() {
            Ok(c) if c.uid() == own => {}
            Ok(c) => {
                return Err(Refusal::Failed(format!(
                    "a process of user {} asked; refused",
                    c.uid()
                )))
            }
            Err(e) => return Err(Refusal::Failed(format!("cannot tell who asked: {e}"))),
        }
        read_line(&mut stream, HELLO, HELLO_TIMEOUT)
            .await
            .map_err(|_| Refusal::NotAnUpgrade)?;
        self.send_sockets(&stream).await.map_err(Refusal::Failed)?;
        read_line(&mut stream, READY, HANDSHAKE_TIMEOUT)
            .await
            .map_err(|e| Refusal::Failed(format!("the new process {e}")))?;
        stream.write_all(OK).await.map_err(|e| {
            Refusal::Failed(format!(
                "the new process went away before it was told to serve: {e}"
            ))
        })
    }

    /// Sends the sockets and their roles in one message.
    async fn send_sockets(&self, stream: &tokio::net::UnixStream) -> Result<(), String> {
        let mut text = String::from(MAGIC);
        for (role, _) in self.sockets.roles() {
            text.push(' ');
            text.push_str(role.name());
        }
        text.push('\n');
        let fds: Vec<_> = self.sockets.roles().map(|(_, fd)| fd).collect();
        let send = || {
            let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(std::io::Error::other("too many sockets for one message"));
            }
            let iov = [IoSlice::new(text.as_bytes())];
            rustix::net::sendmsg(stream, &iov, &mut control, SendFlags::empty())
                .map_err(std::io::Error::from)
        };
        let timed = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            loop {
                stream.writable().await?;
                match stream.try_io(tokio::io::Interest::WRITABLE, send) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    other => break other,
                }
            }
        });
        match timed.await {
            Ok(Ok(n)) if n == text.len() => Ok(()),
            Ok(Ok(_)) => Err("the sockets' message was cut short".into()),
            Ok(Err(e)) => Err(format!("cannot send the sockets: {e}")),
            Err(_) => Err("the new process did not take the sockets".into()),
        }
    }
}

/// Why a hand-over did not happen.
enum Refusal {
    /// The peer never said `hello` (a liveness probe, a stray client): not logged.
    NotAnUpgrade,
    /// It started and failed.
    Failed(String),
}

/// Reads exactly `want` from `stream` within `limit`; the error says what happened.
async fn read_line(
    stream: &mut tokio::net::UnixStream,
    want: &[u8],
    limit: Duration,
) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let mut got = vec![0u8; want.len()];
    match tokio::time::timeout(limit, stream.read_exact(&mut got)).await {
        Ok(Ok(_)) if got == want => Ok(()),
        Ok(Ok(_)) => Err("said something else than expected".into()),
        Ok(Err(_)) => Err("ended before it served".into()),
        Err(_) => Err("did not say it serves in time".into()),
    }
}

/// Binds `path`, removing a stale socket file first; a path a live process answers on
/// is refused.
fn bind_fresh(path: &Path) -> std::io::Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "a running fulcrum listens there (start the new one with --upgrade)",
            ));
        }
        std::fs::remove_file(path)?;
    }
    UnixListener::bind(path)
}

//! Listeners, worker threads and shutdown.
//!
//! Each worker is one OS thread with its own single-threaded runtime, its own
//! `SO_REUSEPORT` listener and its own upstream connection pool: a connection and
//! everything it does stay on one core, and workers share nothing on the request path
//! but the routing table (one atomic load) and the backends' counters.

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::descriptors;
use crate::driver::DRAIN_TIMEOUT;
use crate::driver::{hold_for, Accepted, Connections};
use crate::listeners::{raise_fd_limit, AcceptBackoff, ConnectionCaps};
use crate::liveness::Stopping;
use crate::obtained::Obtained;

use crate::config::tcp::TcpListenerSpec;
use crate::config::Settings;
use crate::proxy::{Proxy, ProxySettings};
use crate::site::Site;
use crate::sockets::{https_listeners, open_listeners, tcp_per_worker};
use crate::sockets::{Https1, HttpsListener, TcpSockets};
use crate::upgrade::{Handover, Listeners, Successor};

/// Period of the worker heartbeat (see `worker`).
const HEARTBEAT: Duration = Duration::from_millis(100);
/// Idle upstream connections are swept every this many heartbeats (15 s).
const SWEEP_EVERY_BEATS: u32 = 150;

/// Runs one worker until the stop, then drains its connections.
async fn worker(
    listener: std::net::TcpListener,
    https: Option<HttpsListener>,
    tcp: TcpSockets,
    proxy: &'static Proxy,
    slots: Arc<Semaphore>,
    stop: Stopping,
    pulse: (crate::notify::Pulses, usize),
) {
    let Some((listener, https, quic)) = on_this_runtime(listener, https) else {
        return;
    };
    let (tcp, mut tcp_first) = (tcp_on_this_runtime(tcp), 0);
    let verifier = https.as_ref().map(|(_, tls)| tls.client_verifier());
    let handshakes = Arc::new(crate::h3_front::Handshakes::new(verifier));
    let conns = Connections::new(proxy, stop.clone());
    // The addresses the listeners are bound to: what a PROXY header to a backend says
    // the client reached (without a syscall per connection).
    let unbound = SocketAddr::from(([0, 0, 0, 0], 0));
    let plain_local = listener.local_addr().unwrap_or(unbound);
    let tls_local = (https.as_ref())
        .and_then(|(l, _)| l.local_addr().ok())
        .unwrap_or(unbound);
    // A short heartbeat keeps the timer wheel's next wake-up near. tokio wakes its own
    // driver through an eventfd whenever a timer is armed earlier than that wake-up;
    // connections re-arm their `Deadline`s now and then (and hyper's connections arm a
    // header timer per request): without the heartbeat each of those is one extra
    // syscall and one extra loop turn. The heartbeat also flushes the access log,
    // sweeps idle upstream connections now and then, and gives memory back after a
    // flood of connections.
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beats = 0u32;
    let mut backoff = AcceptBackoff::default();
    let mut shutdown = stop.receiver();
    // A connection accepted at the cap, waiting for a slot or a descriptor: the worker
    // accepts no more meanwhile, but its heartbeat goes on.
    let mut waiting: Option<Accepted> = None;
    loop {
        tokio::select! {
            _ = heartbeat.tick() => {
                beats = beats.wrapping_add(1);
                beat(beats, &pulse, proxy, &conns);
            }
            held = hold_for(&slots), if waiting.is_some() => {
                if let Some(a) = waiting.take() {
                    conns.spawn(a, held);
                }
            }
            accepted = listener.accept(), if waiting.is_none() => match accepted {
                Ok((stream, peer)) => {
                    let a = Accepted { stream, peer, local: plain_local, tls: None, tcp: None };
                    waiting = conns.spawn_or_wait(a, &slots);
                }
                Err(e) => backoff.failed(&e, "proxy").await,
            },
            accepted = accept_https(&https), if waiting.is_none() => match (accepted, &https) {
                (Ok((stream, peer)), Some((_, tls))) => {
                    let a = Accepted { stream, peer, local: tls_local, tls: Some(tls.acceptor()), tcp: None };
                    waiting = conns.spawn_or_wait(a, &slots);
                }
                (Err(e), _) => backoff.failed(&e, "https").await,
                (Ok(_), None) => {}
            },
            accepted = accept_tcp(&tcp, &mut tcp_first), if waiting.is_none() => match accepted {
                Ok(a) => waiting = conns.spawn_or_wait(a, &slots),
                Err(e) => backoff.failed(&e, "tcp").await,
            },
            incoming = accept_quic(&quic) => conns.spawn_quic(incoming, &slots, &handshakes, tls_local),
            _ = shutdown.changed() => break,
        }
    }
    // A connection still waiting for its slot is closed: it was never served.
    drop(waiting);
    drop(listener);
    drop(https);
    drop(tcp);
    wind_down(conns, quic, proxy.settings().tcp_drain_timeout).await;
}

/// A worker's TCP listeners on its own runtime, each with the address it is bound to
/// and its entry; one that cannot be used is left out (logged).
fn tcp_on_this_runtime(tcp: TcpSockets) -> Vec<(TcpListener, SocketAddr, Arc<TcpListenerSpec>)> {
    let usable = |(l, spec): (std::net::TcpListener, Arc<TcpListenerSpec>)| {
        // Accepted connections inherit `TCP_NODELAY` from their listener (Linux): one
        // system call per listener, not one per connection (`docs/performance.md`, "TCP").
        let _ = socket2::SockRef::from(&l).set_tcp_nodelay(true);
        let l = TcpListener::from_std(l)
            .inspect_err(|e| tracing::error!(error = %e, "cannot use a TCP listener"))
            .ok()?;
        let local = l.local_addr().unwrap_or(spec.listen);
        Some((l, local, spec))
    };
    tcp.into_iter().filter_map(usable).collect()
}

/// The next connection on any of the worker's TCP listeners, with its listener's
/// entry; never, without one. The listeners are asked in turn from `first`, which moves
/// on past the one that answered: a busy listener does not starve the others.
async fn accept_tcp(
    tcp: &[(TcpListener, SocketAddr, Arc<TcpListenerSpec>)],
    first: &mut usize,
) -> std::io::Result<Accepted> {
    std::future::poll_fn(|cx| {
        for k in 0..tcp.len() {
            let i = (*first + k) % tcp.len();
            let (l, local, spec) = &tcp[i];
            if let std::task::Poll::Ready(r) = l.poll_accept(cx) {
                *first = i + 1;
                return std::task::Poll::Ready(r.map(|(stream, peer)| Accepted {
                    stream,
                    peer,
                    local: *local,
                    tls: None,
                    tcp: Some(Arc::clone(spec)),
                }));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Lets a worker's connections finish after the stop, up to the drain timeout. At an
/// upgrade the UDP socket is the new process's from now on: QUIC connections are closed
/// at once; at a stop they finish their requests as TCP ones do (`docs/tls.md`,
/// "HTTP/3").
async fn wind_down(conns: Connections, quic: Option<crate::quic::Endpoint>, tcp_drain: Duration) {
    match quic.as_ref() {
        Some(endpoint) if conns.stop.is_handed_over() => endpoint.hand_over(),
        Some(endpoint) => endpoint.refuse_new(),
        None => {}
    }
    // TCP pools' connections outlive an upgrade (`docs/tcp.md`); at a stop they are
    // cut with the rest.
    let tcp_grace = match conns.stop.is_handed_over() {
        true => tcp_drain,
        false => DRAIN_TIMEOUT,
    };
    conns.drain(tcp_grace).await;
    if let Some(endpoint) = quic {
        endpoint.close().await;
    }
}

/// One heartbeat of a worker (the `beats`th): tells the watchdog it is alive, flushes
/// the access log and hands on the spans gathered, sweeps idle upstream connections now
/// and then, and gives memory back after a flood of connections.
fn beat(beats: u32, pulse: &(crate::notify::Pulses, usize), proxy: &Proxy, conns: &Connections) {
    pulse.0.beat(pulse.1);
    crate::logging::flush_this_thread();
    crate::trace::flush_this_thread();
    if beats % SWEEP_EVERY_BEATS == 0 {
        proxy.sweep_idle();
    }
    conns.trim_after_flood();
}

/// A worker's listeners on its own runtime: the plain one, the HTTPS one and its QUIC
/// endpoint; `None` (logged) when a socket cannot be used.
fn on_this_runtime(
    listener: std::net::TcpListener,
    https: Option<HttpsListener>,
) -> Option<(TcpListener, Option<Https1>, Option<crate::quic::Endpoint>)> {
    let listener = TcpListener::from_std(listener)
        .inspect_err(|e| tracing::error!(error = %e, "cannot use the proxy listener"))
        .ok()?;
    match https.map(HttpsListener::into_tokio).transpose() {
        Ok(Some((h, q))) => Some((listener, Some(h), q)),
        Ok(None) => Some((listener, None, None)),
        Err(e) => {
            tracing::error!(error = %e, "cannot use the HTTPS listener");
            None
        }
    }
}

/// The next QUIC connection; never, without HTTP/3 (or once its endpoint is closed).
async fn accept_quic(quic: &Option<crate::quic::Endpoint>) -> quinn::Incoming {
    match quic {
        Some(e) => match e.accept().await {
            Some(incoming) => incoming,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// The next connection on the HTTPS listener; never, without one.
async fn accept_https(
    https: &Option<(TcpListener, Arc<crate::tls::Tls>)>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match https {
        Some((l, _)) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// A running balancer: its addresses and the handle that stops it.
pub(crate) struct Running {
    /// Proxy listener address (after binding, so port 0 is resolved).
    pub(crate) listen: SocketAddr,
    /// The HTTPS listener's address, with `tls_listen`.
    pub(crate) tls_listen: Option<SocketAddr>,
    /// Each `[[tcp_listeners]]` entry's address (port 0 resolved), in order.
    pub(crate) tcp_listen: Vec<SocketAddr>,
    /// Admin listener address.
    pub(crate) admin: SocketAddr,
    /// The pools and routes.
    pub(crate) site: Arc<Site>,
    /// Starts and stops spawned backends.
    pub(crate) spawner: Arc<crate::spawn::Spawner>,
    /// The traffic generator.
    pub(crate) traffic: Arc<crate::traffic::Traffic>,
    /// Applies the config file again (`SIGHUP`).
    pub(crate) reloader: Arc<crate::reload::Reloader>,
    /// The admin thread's runtime, where spawned children are supervised.
    pub(crate) admin_rt: tokio::runtime::Handle,
    shutdown: watch::Sender<bool>,
    /// What the workers' connections read of the stop.
    stopping: Stopping,
    /// The workers, then the admin thread (last).
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Tells the admin thread that the workers have drained.
    workers_done: watch::Sender<bool>,
    /// Turns true when a new process has taken the listening sockets over.
    pub(crate) upgraded: watch::Receiver<bool>,
}

impl Running {
    /// Stops accepting, lets requests in flight finish (≤ 10 s) and waits for every thread.
    ///
    /// Spawned backends are stopped once the workers have drained, so requests in flight
    /// to them finish first; the admin thread, which supervises them, ends last.
    pub(crate) fn stop(self) {
        self.finish(true);
    }

    /// Stops as [`Self::stop`] does, without telling systemd: a successor whose take-over
    /// failed was never the service.
    pub(crate) fn stop_quietly(self) {
        self.finish(false);
    }

    fn finish(mut self, announce: bool) {
        let handed_over = *self.upgraded.borrow();
        // After a hand-over the new process is the service: it is not stopping.
        if announce && !handed_over {
            crate::notify::stopping();
        }
        self.stopping.stop(&self.shutdown, handed_over);
        let admin = self.threads.pop();
        for t in self.threads {
            let _ = t.join();
        }
        self.spawner.stop_all();
        // The spans of the requests just finished go out too.
        crate::trace::flush(TRACE_FLUSH);
        let _ = self.workers_done.send(true);
        if let Some(t) = admin {
            let _ = t.join();
        }
    }
}

/// How long a runtime's end waits for its blocking tasks (a file read, a password
/// check) before the thread goes on without them: a stop never hangs on one
/// (`docs/operations.md`, "Limits": the drain).
const BLOCKING_GRACE: Duration = Duration::from_secs(1);

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Starts one worker thread per proxy listener (see `docs/architecture.md`, "Listeners
/// and workers").
fn spawn_workers(
    listeners: Vec<std::net::TcpListener>,
    (https, tcp): (Vec<HttpsListener>, Vec<TcpSockets>),
    site: &Arc<Site>,
    proxy_settings: ProxySettings,
    caps: ConnectionCaps,
    stop: &Stopping,
    pulses: &crate::notify::Pulses,
) -> Result<Vec<std::thread::JoinHandle<()>>, String> {
    let slots = Arc::new(Semaphore::new(caps.proxy.min(Semaphore::MAX_PERMITS)));
    descriptors::set_limit(caps.descriptors);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    let mut https = https.into_iter();
    let mut tcp = tcp.into_iter();
    for (i, l) in listeners.into_iter().enumerate() {
        let h = https.next();
        let tcp = tcp.next().unwrap_or_default();
        let rt = runtime().map_err(|e| format!("cannot start a worker: {e}"))?;
        let site = Arc::clone(site);
        let ps = proxy_settings.clone();
        let inf = Arc::clone(&in_flight);
        let stop = stop.clone();
        let slots = Arc::clone(&slots);
        let pulse = (pulses.clone(), i);
        let t = std::thread::Builder::new()
            .name(format!("fulcrum-worker-{i}"))
            .spawn(move || {
                // Each worker's proxy lives as long as the process: leaking it gives the
                // connection tasks a `'static` reference without a refcount per request.
                let proxy: &'static Proxy =
                    rt.block_on(async move { Box::leak(Box::new(Proxy::new(site, ps, inf))) });
                crate::logging::batch_this_thread();
                crate::trace::batch_this_thread();
                rt.block_on(worker(l, h, tcp, proxy, slots, stop, pulse));
                proxy.close_idle();
                // Connections still open after the drain end with the runtime; their
                // access log lines go into the batch, so flush after it. A blocking task
                // (a password check) is not waited for past a moment.
                rt.shutdown_timeout(BLOCKING_GRACE);
                crate::logging::flush_this_thread();
                crate::trace::flush_this_thread();
            })
            .map_err(|e| format!("cannot start a worker: {e}"))?;
        threads.push(t);
    }
    Ok(threads)
}

/// Starts the admin thread: the admin API, the pools' health checkers and
/// maintenance, off the request path. It keeps spawned children until `done_rx` says
/// the workers have drained.
fn spawn_admin(
    admin_listener: std::net::TcpListener,
    admin: AdminStart,
    site: &Arc<Site>,
    rx: &watch::Receiver<bool>,
    mut done_rx: watch::Receiver<bool>,
    fleet: Option<FleetStart>,
) -> Result<(std::thread::JoinHandle<()>, tokio::runtime::Handle), String> {
    let site = Arc::clone(site);
    let tasks_stop = rx.clone();
    let rt = runtime().map_err(|e| format!("cannot start the admin API: {e}"))?;
    let admin_rt = rt.handle().clone();
    let mut arx = rx.clone();
    let thread = std::thread::Builder::new()
            .name("fulcrum-admin".into())
            .spawn(move || {
                rt.block_on(async move {
                    // The health checkers share this thread with the admin API: neither
                    // belongs on the request path's workers.
                    let registry = fleet.map(|f| f.spawn(&tasks_stop));
                    site.start_tasks(tokio::runtime::Handle::current(), tasks_stop);
                    let mut arx2 = arx.clone();
                    let stop = async move {
                        let _ = arx.changed().await;
                    };
                    // An admin client that never finishes its request must not hold the
                    // process past the drain time.
                    let deadline = async move {
                        let _ = arx2.changed().await;
                        tokio::time::sleep(DRAIN_TIMEOUT).await;
                    };
                    let AdminStart { ctx, max_connections, mut ready } = admin;
                    let serving = async move {
                        let _ = ready.wait_for(|r| *r).await;
                        crate::admin::serve(admin_listener, ctx, max_connections, stop).await
                    };
                    tokio::select! {
                        _ = serving => {}
                        _ = deadline => tracing::warn!("admin connections still open after the drain timeout; closing them"),
                    }
                    // Spawned children are supervised here: keep them until the workers
                    // have drained (the runtime's end stops any that are left).
                    let _ = tokio::time::timeout(
                        DRAIN_TIMEOUT + Duration::from_secs(2),
                        done_rx.wait_for(|d| *d),
                    )
                    .await;
                    // The registry takes this instance's entry out before the end.
                    if let Some(r) = registry {
                        let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
                    }
                });
                // A discovery read or a lookup stuck in the kernel (a hung mount) would
                // hold a plain drop for good: the process exits without it.
                rt.shutdown_timeout(BLOCKING_GRACE);
            })
            .map_err(|e| format!("cannot start the admin API: {e}"))?;
    Ok((thread, admin_rt))
}

/// Binds the listeners (or takes them over from the running process, `--upgrade`) and
/// starts the workers, the admin API and the upgrade socket.
///
/// `flags` are the command line's, kept so a reload reads the file again with the same
/// flags on top.
/// How long a stop waits for the spans still queued to be exported.
const TRACE_FLUSH: Duration = Duration::from_secs(5);

pub(crate) fn start(
    settings: &Settings,
    flags: &crate::config::RawFlags,
) -> Result<Running, String> {
    crate::trace::install(settings.tracing.as_ref());
    if let crate::config::AccessLog::File(path) = &settings.access_log {
        crate::logging::access_to_file(path)?;
    }
    let caps = ConnectionCaps::new(raise_fd_limit(), settings.max_connections);
    let (listeners, successor) = open_listeners(settings, flags.upgrade)?;
    // Second descriptors of the listening sockets, to hand over later.
    let kept = match &settings.upgrade_socket {
        Some(_) => Some(
            listeners
                .try_clone()
                .map_err(|e| format!("upgrade socket: {e}"))?,
        ),
        None => None,
    };
    // A first process takes the upgrade socket's path before it serves (a path a live
    // process holds is an error); a successor only once the old process has let go.
    let (handover, kept) = match (&settings.upgrade_socket, successor.is_some(), kept) {
        (Some(path), false, Some(kept)) => (Some(Handover::bind(path, kept, false)?), None),
        (_, _, kept) => (None, kept),
    };
    let (running, stop_rx, upgraded_tx) = launch(settings, flags, listeners, caps)?;
    let handover = match successor {
        Some(s) => {
            let old = s.old_pid();
            crate::notify::taking_over();
            match take_over(s, settings, kept) {
                Ok(h) => h,
                Err(e) => {
                    if let Some(pid) = old {
                        crate::notify::handed_back(pid);
                    }
                    running.stop_quietly();
                    return Err(e);
                }
            }
        }
        None => {
            // Serving the real configuration now, on every listener (`docs/install.md`).
            crate::notify::ready();
            handover
        }
    };
    if let Some(h) = handover {
        running.admin_rt.spawn(h.run(upgraded_tx, stop_rx));
    }
    Ok(running)
}

/// Notes the proxy listeners' addresses: a backend on one of them is this fulcrum
/// itself, refused wherever it is named (`crate::loops`).
/// The proxy's and the admin API's addresses, as bound.
fn addresses(listeners: &Listeners) -> Result<(SocketAddr, SocketAddr), String> {
    let listen = listeners.proxy[0]
        .local_addr()
        .map_err(|e| format!("proxy listener: {e}"))?;
    let admin = (listeners.admin.local_addr()).map_err(|e| format!("admin listener: {e}"))?;
    Ok((listen, admin))
}

/// Logs the listeners' addresses once everything serves (what a supervisor, and the
/// tests, wait for).
fn announce(
    listen: SocketAddr,
    tls_listen: Option<SocketAddr>,
    admin: SocketAddr,
    tcp: &[(SocketAddr, String)],
) {
    tracing::info!("proxy listening on {listen}");
    if let Some(addr) = tls_listen {
        tracing::info!("https listening on {addr}");
    }
    for (addr, pool) in tcp {
        tracing::info!("tcp listening on {addr} for pool {pool}");
    }
    tracing::info!("admin listening on {admin}");
}

fn note_own_listeners(listeners: &Listeners) {
    let own: Vec<SocketAddr> = (listeners
        .proxy
        .iter()
        .chain(&listeners.tls)
        .chain(&listeners.tcp))
    .filter_map(|l| l.local_addr().ok())
    .collect();
    crate::loops::set_listeners(&own);
}

/// Starts the workers on `listeners.proxy` and the admin thread on `listeners.admin`;
/// also returns the stop signal's receiver and the sender that reports a hand-over.
fn launch(
    settings: &Settings,
    flags: &crate::config::RawFlags,
    listeners: Listeners,
    caps: ConnectionCaps,
) -> Result<(Running, watch::Receiver<bool>, watch::Sender<bool>), String> {
    let (listen, admin) = addresses(&listeners)?;
    note_own_listeners(&listeners);
    let site = site_of(settings)?;
    let (shutdown, rx) = watch::channel(false);
    let obtained = (settings.tls.acme.as_ref()).map(|a| Arc::new(Obtained::new(a.domains.clone())));
    let (https, tls_listen, tls) =
        https_listeners(settings, listeners.tls, listeners.quic, obtained.clone())?;
    let mut proxy_settings = ProxySettings::from_settings(settings);
    crate::compress::set_max_in_flight(settings.compress_max_in_flight);
    proxy_settings.plain_first = plain_first(settings, &obtained, tls_listen);
    let control = Control::new(settings, flags, &site, listen, tls);
    let fleet = control.fleet;
    let acme = match (&settings.tls.acme, obtained) {
        (Some(a), Some(obtained)) => Some(acme_keeper(a, obtained, &site, fleet.as_deref())?),
        _ => None,
    };
    let (workers_done, done_rx) = watch::channel(false);
    let (loaded_tx, loaded) = std::sync::mpsc::channel();
    let start = fleet.clone().map(|fleet| FleetStart { fleet, loaded_tx });
    let (ready_tx, ready) = watch::channel(false);
    let (admin_thread, admin_rt) = spawn_admin(
        listeners.admin,
        AdminStart {
            ctx: control.admin,
            max_connections: caps.admin,
            ready,
        },
        &site,
        &rx,
        done_rx,
        start,
    )?;
    crate::jwks::start(&admin_rt);
    in_force(fleet.as_deref(), &loaded, &site);
    if let Some(tasks) = acme {
        start_acme(tasks, &admin_rt, &rx);
    }
    let stopping = Stopping::new(rx.clone());
    let pulses = crate::notify::Pulses::new(listeners.proxy.len());
    let (tcp, tcp_addrs) = tcp_per_worker(listeners.tcp, settings, listeners.proxy.len());
    let mut threads = spawn_workers(
        listeners.proxy,
        (https, tcp),
        &site,
        proxy_settings,
        caps,
        &stopping,
        &pulses,
    )?;
    threads.push(admin_thread);
    ready_tx.send_replace(true);
    admin_rt.spawn(crate::notify::watchdog(pulses, rx.clone()));
    let (upgraded_tx, upgraded) = watch::channel(false);
    announce(listen, tls_listen, admin, &tcp_addrs);
    let running = Running {
        listen,
        tls_listen,
        tcp_listen: tcp_addrs.iter().map(|(a, _)| *a).collect(),
        admin,
        site,
        spawner: control.spawner,
        traffic: control.traffic,
        reloader: control.reloader,
        admin_rt,
        shutdown,
        stopping,
        threads,
        workers_done,
        upgraded,
    };
    Ok((running, rx, upgraded_tx))
}

/// The pools and routes of `settings`, with their resolvers and client lists.
fn site_of(settings: &Settings) -> Result<Arc<Site>, String> {
    let site = Site::new(&settings.pools, &settings.routes).map_err(|e| format!("routes: {e}"))?;
    site.resolvers.set(settings.resolvers.clone());
    site.set_clients(&settings.clients);
    Ok(Arc::new(site))
}

/// What controls a running balancer from outside the request path.
struct Control {
    spawner: Arc<crate::spawn::Spawner>,
    traffic: Arc<crate::traffic::Traffic>,
    reloader: Arc<crate::reload::Reloader>,
    /// Fleet mode's link to the store.
    fleet: Option<Arc<crate::store::fleet::Fleet>>,
    /// The admin API's state over all of the above.
    admin: crate::admin::AdminCtx,
}

impl Control {
    fn new(
        settings: &Settings,
        flags: &crate::config::RawFlags,
        site: &Arc<Site>,
        listen: SocketAddr,
        tls: Option<Arc<crate::tls::Tls>>,
    ) -> Control {
        let spawner = Arc::new(crate::spawn::Spawner::new(Arc::clone(site)));
        let traffic = Arc::new(crate::traffic::Traffic::new(listen));
        let reloader = Arc::new(crate::reload::Reloader::new(
            flags.clone(),
            settings.clone(),
            Arc::clone(site),
            tls,
        ));
        let fleet = settings.store.as_ref().map(|spec| {
            site.hub.ids_from(crate::store::LOCAL_IDS);
            Arc::new(crate::store::fleet::Fleet::new(
                spec,
                Arc::clone(site),
                Arc::clone(&reloader),
                listen,
            ))
        });
        let admin = crate::admin::AdminCtx::new(
            Arc::clone(site),
            settings.admin_token.clone(),
            Arc::clone(&spawner),
            Arc::clone(&traffic),
            Arc::clone(&reloader),
        )
        .in_fleet(listen, fleet.clone());
        Control {
            spawner,
            traffic,
            reloader,
            fleet,
            admin,
        }
    }
}

/// The admin API as the admin thread starts it.
struct AdminStart {
    ctx: crate::admin::AdminCtx,
    /// Its connection cap.
    max_connections: usize,
    /// Turns true once the process serves its real configuration: the admin listener
    /// accepts nothing before.
    ready: watch::Receiver<bool>,
}

/// Fleet mode's tasks, for the admin thread to start.
struct FleetStart {
    fleet: Arc<crate::store::fleet::Fleet>,
    /// Hears once, after the first load.
    loaded_tx: std::sync::mpsc::Sender<i64>,
}

impl FleetStart {
    /// Starts following the store and registering this instance; the registry's task,
    /// to wait for at the end (it takes the entry out).
    fn spawn(self, stop: &watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(Arc::clone(&self.fleet).run(stop.clone(), self.loaded_tx));
        tokio::spawn(crate::store::registry::run(self.fleet, stop.clone()))
    }
}

/// Waits until the real configuration is in force: nothing is accepted, on any
/// listener, before (connections wait in the kernel's queue meanwhile; docs/fleet.md,
/// "Starting"): the store's first load in fleet mode, then the first discovery.
fn in_force(
    fleet: Option<&crate::store::fleet::Fleet>,
    loaded: &std::sync::mpsc::Receiver<i64>,
    site: &Site,
) {
    if let Some(f) = fleet {
        wait_for_store(f, loaded);
    }
    wait_for_discovery(site);
    crate::jwks::wait_first_fetches();
}

/// Waits until every pool with `discover` has looked its backends up once (at most
/// [`FIRST_LOAD_WAIT`]), so that the first requests find them; a lookup that fails
/// counts, and the pool starts empty and keeps trying (`docs/discovery.md`).
fn wait_for_discovery(site: &Site) {
    let until = std::time::Instant::now() + FIRST_LOAD_WAIT;
    let pending = || {
        site.pools().iter().any(|p| {
            let st = p.discovery();
            p.discover().is_some() && st.updated_at.is_none() && st.errors == 0
        })
    };
    while pending() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for the first load (at most [`FIRST_LOAD_WAIT`]), so that an instance serves
/// the store's configuration from its first connection; nothing is accepted meanwhile.
/// Without etcd it then starts with the embedded default and keeps trying
/// (`docs/fleet.md`, "Starting" and "Losing etcd").
fn wait_for_store(fleet: &crate::store::fleet::Fleet, loaded: &std::sync::mpsc::Receiver<i64>) {
    if loaded.recv_timeout(FIRST_LOAD_WAIT).is_err() {
        tracing::warn!(
            prefix = %fleet.prefix,
            "store: not read within {FIRST_LOAD_WAIT:?}; serving the embedded default until it can be"
        );
    }
}

/// How long a start waits for the store's configuration.
const FIRST_LOAD_WAIT: Duration = Duration::from_secs(5);

/// A successor, serving already, tells the old process and takes the upgrade socket's
/// path over. Without the old process's `ok` it must not serve beside it: the error
/// makes it stop (what it accepted meanwhile drains) and the old one goes on.
fn take_over(
    successor: Successor,
    settings: &Settings,
    kept: Option<Listeners>,
) -> Result<Option<Handover>, String> {
    successor.ready()?;
    tracing::info!("upgrade: serving; the old process drains");
    let (Some(path), Some(kept)) = (&settings.upgrade_socket, kept) else {
        return Ok(None);
    };
    // A failure here only costs the next upgrade.
    match Handover::bind(path, kept, true) {
        Ok(h) => Ok(Some(h)),
        Err(e) => {
            tracing::error!("{e}; no further upgrade can reach this process");
            Ok(None)
        }
    }
}

/// `[tls.acme]`'s keeper, over its storage directory (made 0700 if missing), or in
/// fleet mode over the store, with the task that follows the store's `acme/` keys.
fn acme_keeper(
    settings: &crate::config::acme::AcmeSettings,
    obtained: Arc<Obtained>,
    site: &Site,
    fleet: Option<&crate::store::fleet::Fleet>,
) -> Result<AcmeTasks, String> {
    use crate::acme::storage::{Disk, Storage};
    let (storage, follower): (Arc<dyn Storage>, _) = match fleet {
        Some(f) => {
            let fa = Arc::new(crate::store::acme::FleetAcme::new(f, Arc::clone(&obtained)));
            (Arc::clone(&fa) as Arc<dyn Storage>, Some(fa))
        }
        None => {
            let disk = Disk::open(settings.storage.clone())
                .map_err(|e| format!("{}: storage: {e}", settings.origin))?;
            (Arc::new(disk), None)
        }
    };
    let keeper = crate::acme::Acme::new(settings.clone(), obtained, storage, Arc::clone(&site.hub));
    Ok((keeper, follower))
}

/// What the plain listener answers before any route (`http-01`, `redirect_https`);
/// `None` when neither is on.
fn plain_first(
    settings: &Settings,
    obtained: &Option<Arc<Obtained>>,
    tls_listen: Option<SocketAddr>,
) -> Option<Arc<crate::proxy::PlainFirst>> {
    let first = crate::proxy::PlainFirst {
        acme: obtained.clone(),
        redirect_https: tls_listen
            .filter(|_| settings.tls.redirect_https)
            .map(|a| a.port()),
    };
    (first.acme.is_some() || first.redirect_https.is_some()).then(|| Arc::new(first))
}

/// How long the start waits for ACME's stored certificate to be read.
const ACME_LOAD_WAIT: Duration = Duration::from_secs(5);

/// Starts ACME's tasks on the admin runtime; waits (at most [`ACME_LOAD_WAIT`]) until
/// the stored certificate is served, so that a restart or an upgrade serves it from
/// its first handshake.
fn start_acme(
    (keeper, follower): AcmeTasks,
    admin_rt: &tokio::runtime::Handle,
    stop: &watch::Receiver<bool>,
) {
    if let Some(f) = follower {
        admin_rt.spawn(f.follow(stop.clone()));
    }
    let (loaded, wait) = std::sync::mpsc::channel();
    let stop = stop.clone();
    admin_rt.spawn(async move {
        keeper.load_stored().await;
        let _ = loaded.send(());
        keeper.run(stop).await;
    });
    if wait.recv_timeout(ACME_LOAD_WAIT).is_err() {
        tracing::warn!("acme: the stored certificate was not read within {ACME_LOAD_WAIT:?}; serving without it meanwhile");
    }
}

/// The ACME keeper and, in fleet mode, its follower of the store.
type AcmeTasks = (
    crate::acme::Acme,
    Option<Arc<crate::store::acme::FleetAcme>>,
);

/// SIGTERM/SIGINT/SIGHUP/SIGUSR1 handlers, installed before anything listens so that a stop
/// signal arriving early still drains instead of killing the process.
pub(crate) struct Signals {
    rt: tokio::runtime::Runtime,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers.
    pub(crate) fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let rt = runtime()?;
        let (term, int, hup, usr1) = rt.block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
                signal(SignalKind::hangup())?,
                signal(SignalKind::user_defined1())?,
            ))
        })?;
        Ok(Signals {
            rt,
            term,
            int,
            hup,
            usr1,
        })
    }

    /// Blocks until SIGTERM or SIGINT, or until a new process has taken the sockets
    /// over (`upgraded`); SIGHUP calls `on_hup` (the config reload), SIGUSR1 reopens the
    /// access log's file.
    pub(crate) fn wait(mut self, on_hup: impl Fn(), mut upgraded: watch::Receiver<bool>) {
        self.rt.block_on(async {
            // No upgrade socket: the sender is gone at once, and that is no hand-over.
            let handed_over = async {
                if upgraded.wait_for(|u| *u).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::pin!(handed_over);
            loop {
                tokio::select! {
                    _ = &mut handed_over => { tracing::info!("handed over to the new process: draining"); return; }
                    _ = self.term.recv() => { tracing::info!("SIGTERM: draining"); return; }
                    _ = self.int.recv() => { tracing::info!("SIGINT: draining"); return; }
                    _ = self.hup.recv() => {
                        tracing::info!("SIGHUP: reloading the configuration");
                        on_hup();
                    }
                    _ = self.usr1.recv() => match crate::logging::reopen_access_file() {
                        Ok(true) => tracing::info!("SIGUSR1: access log reopened"),
                        Ok(false) => tracing::info!("SIGUSR1: the access log has no file to reopen"),
                        Err(e) => tracing::error!("SIGUSR1: {e}"),
                    },
                }
            }
        });
    }
}

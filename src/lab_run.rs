//! The strategy lab's run (`docs/lab.md`): every strategy of a [`Plan`] in turn, each
//! through a fresh fulcrum started in this process in front of fresh demo backends.
//!
//! Everything runs on 127.0.0.1: the backends are `fulcrum backend` processes on
//! loopback ports, the fulcrum under test listens on a loopback port, and the driver
//! refuses any other target.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::RawFlags;
use crate::lab::load::{self, Schedule};
use crate::lab::report::{self, Report, StrategyResult};
use crate::lab::scenario::{self, BackendPlan};
use crate::lab::sessions;
use crate::lab::{stopping, Phase, Plan, Progress, Tweak, Variant};

/// Runs `plan`: every strategy in turn on the same schedule; `progress` hears how far
/// it is. A strategy whose run fails gets a row with its error, and the others go on.
pub(crate) fn run(plan: &Plan, progress: &mut dyn FnMut(&Progress)) -> Result<Report, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find fulcrum's own executable: {e}"))?;
    let schedule = Schedule::new(plan.rps, plan.seconds, plan.seed, plan.scenario.clients());
    let sockets = Sockets::bind(&plan.scenario.backends(plan.seconds))?;
    let mut results = Vec::new();
    for (index, &row) in plan.variants.iter().enumerate() {
        if stopping() {
            break;
        }
        let strategy = row.label();
        let mut tick = |phase: Phase, elapsed: Duration| {
            progress(&Progress {
                index,
                of: plan.variants.len(),
                strategy: strategy.clone(),
                phase,
                elapsed: elapsed.as_secs_f64(),
            })
        };
        let run = Run {
            plan,
            schedule: &schedule,
            exe: &exe,
            sockets: &sockets,
        };
        match run.one(row, &mut tick) {
            Ok(Some(r)) => results.push(r),
            // Cut short by a stop: nothing measured is worth a row.
            Ok(None) => break,
            Err(e) => results.push(StrategyResult::failed(strategy.clone(), e)),
        }
    }
    Ok(Report {
        scenario: plan.scenario.name(),
        seed: plan.seed,
        rps: plan.rps,
        seconds: plan.seconds,
        results,
    })
}

/// Every backend's listening socket, bound once for the whole run: each strategy's
/// fresh backend processes serve on the same ports, so the hashing strategies (which
/// hash a backend's address) place keys the same way in every row.
struct Sockets(Vec<(String, std::net::TcpListener)>);

impl Sockets {
    fn bind(plans: &[BackendPlan]) -> Result<Sockets, String> {
        plans
            .iter()
            .map(|p| {
                crate::spawn::bind_loopback(0)
                    .map(|l| (p.name.clone(), l))
                    .map_err(|e| format!("cannot bind a backend: {e}"))
            })
            .collect::<Result<_, _>>()
            .map(Sockets)
    }

    /// A second descriptor of `name`'s socket, for its process.
    fn of(&self, name: &str) -> Result<std::net::TcpListener, String> {
        let (_, l) = self
            .0
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| format!("no socket for backend {name}"))?;
        l.try_clone()
            .map_err(|e| format!("cannot hand backend {name} its socket: {e}"))
    }
}

/// How often a wait looks whether the lab has been asked to stop.
const STOP_POLL: Duration = Duration::from_millis(50);

/// A demo backend of the run: its plan, its address, its process.
struct Started {
    plan: BackendPlan,
    addr: SocketAddr,
    child: tokio::process::Child,
}

impl Started {
    /// Starts its script's clock (`--clock-on-stdin`): now.
    async fn start_clock(&mut self) {
        use tokio::io::AsyncWriteExt as _;
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = stdin.write_all(b"\n").await;
        }
    }
}

/// What every strategy's run shares.
struct Run<'a> {
    plan: &'a Plan,
    schedule: &'a Schedule,
    exe: &'a Path,
    sockets: &'a Sockets,
}

impl Run<'_> {
    /// One strategy's run: fresh backends, a fresh fulcrum, the schedule, the results;
    /// `None` when a stop cut it short.
    fn one(
        &self,
        row: Variant,
        tick: &mut dyn FnMut(Phase, Duration),
    ) -> Result<Option<StrategyResult>, String> {
        tick(Phase::Starting, Duration::ZERO);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the lab's runtime: {e}"))?;
        let plans = self.plan.scenario.backends(self.plan.seconds);
        let names: Vec<String> = plans.iter().map(|p| p.name.clone()).collect();
        let (joiners, first): (Vec<BackendPlan>, Vec<BackendPlan>) =
            plans.into_iter().partition(|p| p.joins_at.is_some());
        let mut started = Vec::new();
        let outcome = rt.block_on(async {
            for p in first {
                started.push(start_backend(self.exe, self.sockets, p).await?);
            }
            Ok::<_, String>(())
        });
        let samples = match outcome {
            Ok(()) => self.load(&rt, row, &mut started, joiners.clone(), tick),
            Err(e) => Err(e),
        };
        rt.block_on(reap(started));
        let Some((samples, joined_at)) = samples? else {
            return Ok(None);
        };
        let mut r = report::summarize(row.label(), &samples, &names);
        if let (Some(j), Some(from)) = (joiners.first(), joined_at) {
            // The seconds left after the join, rounded: a join a little late still gets
            // its last, nearly whole, second.
            let left = Duration::from_secs(u64::from(self.plan.seconds)).saturating_sub(from);
            let n = (left.as_secs_f64().round() as u32).clamp(1, 5);
            r.joiner_share_per_second = Some(report::share_per_second(&samples, &j.name, from, n));
        }
        if self.plan.scenario.keyed() {
            let (over, affinity) = report::balance_and_affinity(&r, &samples);
            r.max_share_over_fair = Some(over);
            r.key_affinity = Some(affinity);
        }
        Ok(Some(r))
    }

    /// Starts fulcrum over `started`, starts the scripts' clocks and the schedule at
    /// the same instant, adds `joiners` on time (into `started` too), and sends the
    /// schedule. The samples, and when (from the start) the first joiner entered the
    /// pool; `None` when a stop cut the run short.
    fn load(
        &self,
        rt: &tokio::runtime::Runtime,
        row: Variant,
        started: &mut Vec<Started>,
        joiners: Vec<BackendPlan>,
        tick: &mut dyn FnMut(Phase, Duration),
    ) -> Result<Option<Measured>, String> {
        let flags = match self.plan.scenario.tcp() {
            true => tcp_flags(self.plan, row, started)?,
            false => fulcrum_flags(self.plan, row, started),
        };
        let settings = crate::config::build(&flags).map_err(|e| {
            e.first()
                .map_or_else(|| "invalid settings".to_string(), |e| e.to_string())
        })?;
        let running = crate::server::start(&settings, &flags)?;
        let pool = running.site.first();
        let start = rt.block_on(async {
            for b in started.iter_mut() {
                b.start_clock().await;
            }
            tokio::time::Instant::now()
        });
        let late = Joiners {
            exe: self.exe.to_path_buf(),
            sockets: self.sockets,
            plans: joiners,
            pool,
            start,
        };
        let mut joined = Vec::new();
        let tcp = running.tcp_listen.first().copied();
        let (samples, joined_at) = rt.block_on(async {
            let drive = async {
                match tcp {
                    Some(target) => {
                        let queries = scenario::SESSION_QUERIES;
                        sessions::drive(target, self.schedule, start, queries, tick).await
                    }
                    None => load::drive(running.listen, self.schedule, start, tick).await,
                }
            };
            tokio::join!(drive, late.join(&mut joined))
        });
        started.extend(joined);
        if stopping() {
            // Requests still waiting on a backend would hold fulcrum's drain.
            for b in started.iter_mut() {
                let _ = b.child.start_kill();
            }
        }
        running.stop();
        let joined_at = joined_at?;
        Ok(samples?.map(|s| (s, joined_at)))
    }
}

/// A strategy's samples, and when (from the start) the first joiner entered the pool.
type Measured = (Vec<load::Sample>, Option<Duration>);

/// Stops every backend and waits for each to be gone.
async fn reap(started: Vec<Started>) {
    for mut b in started {
        let _ = b.child.kill().await;
    }
}

/// fulcrum's settings for one row's run, over `backends`.
fn fulcrum_flags(plan: &Plan, row: Variant, backends: &[Started]) -> RawFlags {
    let mut flags = RawFlags::default()
        .with("listen", "127.0.0.1:0")
        .with("admin", "127.0.0.1:0")
        .with("access_log", "off")
        .with("workers", "1")
        .with("strategy", row.kind.name());
    for (k, v) in plan.scenario.fulcrum_options() {
        flags = flags.with(k, v);
    }
    match row.tweak {
        Tweak::Bounded(f) => flags = flags.with("hash_balance_factor", f.to_string()),
        Tweak::AutoLimit => flags = flags.with("max_conns", "auto".to_string()),
        Tweak::SuccessRate => {
            flags = flags.with("outlier_success_rate", scenario::SUCCESS_RATE.to_string())
        }
        Tweak::Hedge => flags = flags.with("hedge_after", scenario::HEDGE_AFTER.to_string()),
        Tweak::NoLimit | Tweak::None => {}
    }
    // A row that sets the limit its own way leaves out the scenario's fixed one.
    let fixed = matches!(
        row.tweak,
        Tweak::None | Tweak::Bounded(_) | Tweak::SuccessRate | Tweak::Hedge
    );
    flags.backend = backends
        .iter()
        .map(|b| backend_flag(&b.plan, b.addr, fixed))
        .collect();
    flags
}

/// fulcrum's settings for one row's run of a TCP scenario: a file with one TCP pool
/// over `backends` (a TCP pool is a file's) and its listener, written beside the
/// others of this run.
fn tcp_flags(plan: &Plan, row: Variant, backends: &[Started]) -> Result<RawFlags, String> {
    let list: Vec<String> = (backends.iter())
        .map(|b| {
            format!(
                "{{ url = \"tcp://{}\", name = \"{}\" }}",
                b.addr, b.plan.name
            )
        })
        .collect();
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\naccess_log = \"off\"\nworkers = 1\n\
         [[pools]]\nname = \"lab\"\nmode = \"tcp\"\nstrategy = \"{}\"\n\
         health = {{ interval = \"1s\" }}\nbackends = [{}]\n\
         [[tcp_listeners]]\nlisten = \"127.0.0.1:0\"\npool = \"lab\"\n",
        row.kind.name(),
        list.join(", ")
    );
    let dir = std::env::temp_dir().join(format!("fulcrum-lab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot write the lab's config: {e}"))?;
    let file = dir.join(format!("{}.toml", plan.scenario.name()));
    std::fs::write(&file, text).map_err(|e| format!("cannot write the lab's config: {e}"))?;
    Ok(RawFlags {
        config: Some(file),
        ..Default::default()
    })
}

/// `--backend` for a demo backend at `addr`, with its `max_conns` when `fixed`.
fn backend_flag(p: &BackendPlan, addr: SocketAddr, fixed: bool) -> String {
    let mut s = format!("http://{addr},weight={},name={}", p.weight, p.name);
    if p.max_conns > 0 && fixed {
        s.push_str(&format!(",max_conns={}", p.max_conns));
    }
    s
}

/// Starts the demo backend `p` on its socket and waits for its health; its script's
/// clock waits for [`Started::start_clock`].
async fn start_backend(exe: &Path, sockets: &Sockets, p: BackendPlan) -> Result<Started, String> {
    let listener = sockets.of(&p.name)?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mut args = p.args.clone();
    args.push("--clock-on-stdin".into());
    let mut child =
        crate::spawn::backend_process(exe, listener, &p.name, &args, std::process::Stdio::piped())
            .map_err(|e| format!("cannot start backend {}: {e}", p.name))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    if !crate::spawn::answers_health(addr, deadline).await {
        let _ = child.kill().await;
        return Err(format!("backend {} did not start on {addr}", p.name));
    }
    Ok(Started {
        plan: p,
        addr,
        child,
    })
}

/// The backends that join the pool during the run.
struct Joiners<'a> {
    exe: PathBuf,
    sockets: &'a Sockets,
    plans: Vec<BackendPlan>,
    pool: Option<std::sync::Arc<crate::pool::Pool>>,
    /// The schedule's start.
    start: tokio::time::Instant,
}

impl Joiners<'_> {
    /// Starts each at its time (into `out`, to be reaped whatever happens next) and
    /// adds it to the pool, its cold start beginning then; when (from the start) the
    /// first was added.
    async fn join(self, out: &mut Vec<Started>) -> Result<Option<Duration>, String> {
        let mut first_at = None;
        for p in self.plans {
            let at = self.start + p.joins_at.unwrap_or_default();
            while tokio::time::Instant::now() < at {
                if stopping() {
                    return Ok(first_at);
                }
                tokio::time::sleep_until(at.min(tokio::time::Instant::now() + STOP_POLL)).await;
            }
            out.push(start_backend(&self.exe, self.sockets, p).await?);
            let Some(b) = out.last_mut() else { break };
            let spec = crate::config::parse_backend_spec(&backend_flag(&b.plan, b.addr, true))?;
            if let Some(pool) = &self.pool {
                pool.add(spec).map_err(|e| e.to_string())?;
            }
            b.start_clock().await;
            first_at.get_or_insert(self.start.elapsed());
        }
        Ok(first_at)
    }
}

//! The strategy lab (`docs/lab.md`): the same open-loop workload, made from a seed,
//! through a fresh fulcrum per strategy in front of demo backends whose behaviour a
//! scenario scripts (slow, failing in bursts, smaller, cold, under a hot key, over
//! capacity); one row of results per strategy.
//!
//! Everything runs on 127.0.0.1: the backends are `fulcrum backend` processes on
//! loopback ports, the fulcrum under test runs in this process on a loopback port, and
//! the driver refuses any other target.

pub(crate) mod load;
pub(crate) mod report;
pub(crate) mod scenario;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use self::load::Schedule;
use self::report::{Report, StrategyResult};
use self::scenario::{BackendPlan, Scenario};
use crate::config::RawFlags;
use crate::strategy::StrategyKind;

/// The longest run per strategy.
pub(crate) const MAX_SECONDS: u32 = 120;
/// The most requests per second offered.
pub(crate) const MAX_RPS: u32 = 5000;
/// Seconds per strategy unless `--seconds` says otherwise: ten strategies finish
/// within two minutes.
pub(crate) const DEFAULT_SECONDS: u32 = 8;

/// A run to make, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    pub(crate) scenario: Scenario,
    /// Each strategy, with a hash balance factor where the scenario compares one.
    pub(crate) variants: Vec<(StrategyKind, Option<f64>)>,
    pub(crate) seconds: u32,
    pub(crate) rps: u32,
    pub(crate) seed: u64,
}

/// A strategy's name in the results: `maglev+bounded` with a balance factor.
pub(crate) fn label(kind: StrategyKind, factor: Option<f64>) -> String {
    match factor {
        Some(_) => format!("{}+bounded", kind.name()),
        None => kind.name().to_string(),
    }
}

impl Plan {
    /// Checks what the command line (or the admin API) asked; the error names the
    /// value and the valid ones.
    pub(crate) fn new(
        scenario: &str,
        strategies: &str,
        seconds: u32,
        rps: Option<u32>,
        seed: u64,
    ) -> Result<Plan, String> {
        let sc = Scenario::parse(scenario).ok_or_else(|| {
            format!(
                "unknown scenario '{scenario}' (valid: {})",
                Scenario::names().join(", ")
            )
        })?;
        let variants = if strategies == "all" {
            sc.default_strategies()
        } else {
            let mut v = Vec::new();
            for name in strategies.split(',').map(str::trim) {
                let kind = StrategyKind::parse(name).ok_or_else(|| {
                    format!(
                        "unknown strategy '{name}' (valid: all, {})",
                        StrategyKind::canonical_names().join(", ")
                    )
                })?;
                v.push((kind, None));
                if sc.keyed() {
                    v.push((kind, Some(scenario::HOT_KEY_FACTOR)));
                }
            }
            v
        };
        if !(1..=MAX_SECONDS).contains(&seconds) {
            return Err(format!(
                "invalid seconds {seconds} (expected an integer from 1 to {MAX_SECONDS})"
            ));
        }
        let rps = rps.unwrap_or(sc.default_rps());
        if !(1..=MAX_RPS).contains(&rps) {
            return Err(format!(
                "invalid rps {rps} (expected an integer from 1 to {MAX_RPS})"
            ));
        }
        Ok(Plan {
            scenario: sc,
            variants,
            seconds,
            rps,
            seed,
        })
    }
}

/// Where a run stands, for a progress line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Progress {
    /// The strategy running (0-based) and how many there are.
    pub(crate) index: usize,
    pub(crate) of: usize,
    pub(crate) strategy: String,
    /// Seconds into its run.
    pub(crate) elapsed: f64,
}

/// Runs `plan`: every strategy in turn on the same schedule; `progress` hears how far
/// it is.
pub(crate) fn run(plan: &Plan, progress: &mut dyn FnMut(&Progress)) -> Result<Report, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find fulcrum's own executable: {e}"))?;
    let keys = plan.scenario.keyed().then_some(scenario::HOT_KEYS);
    let schedule = Schedule::new(plan.rps, plan.seconds, plan.seed, keys);
    let mut results = Vec::new();
    for (index, &(kind, factor)) in plan.variants.iter().enumerate() {
        let strategy = label(kind, factor);
        let mut tick = |elapsed: Duration| {
            progress(&Progress {
                index,
                of: plan.variants.len(),
                strategy: strategy.clone(),
                elapsed: elapsed.as_secs_f64(),
            })
        };
        results.push(run_one(plan, (kind, factor), &schedule, &exe, &mut tick)?);
    }
    Ok(Report {
        scenario: plan.scenario.name(),
        seed: plan.seed,
        rps: plan.rps,
        seconds: plan.seconds,
        results,
    })
}

/// A demo backend of the run: its plan, its address, its process.
struct Started {
    plan: BackendPlan,
    addr: SocketAddr,
    _child: tokio::process::Child,
}

/// One strategy's run: fresh backends, a fresh fulcrum, the schedule, the results.
fn run_one(
    plan: &Plan,
    (kind, factor): (StrategyKind, Option<f64>),
    schedule: &Schedule,
    exe: &Path,
    tick: &mut dyn FnMut(Duration),
) -> Result<StrategyResult, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the lab's runtime: {e}"))?;
    let plans = plan.scenario.backends(plan.seconds);
    let names: Vec<String> = plans.iter().map(|p| p.name.clone()).collect();
    let mut started = Vec::new();
    for p in plans.iter().filter(|p| p.joins_at.is_none()) {
        started.push(rt.block_on(start_backend(exe, p.clone()))?);
    }
    let flags = fulcrum_flags(plan, kind, factor, &started);
    let settings = crate::config::build(&flags).map_err(|e| {
        e.first()
            .map_or_else(|| "invalid settings".to_string(), |e| e.to_string())
    })?;
    let running = crate::server::start(&settings, &flags)?;
    let joiners: Vec<BackendPlan> = plans.into_iter().filter(|p| p.joins_at.is_some()).collect();
    let joined = rt.spawn(join_later(
        exe.to_path_buf(),
        joiners.clone(),
        running.site.first(),
    ));
    let samples = rt.block_on(load::drive(
        running.listen,
        schedule,
        plan.scenario.keyed(),
        tick,
    ));
    running.stop();
    let late = rt.block_on(joined).map_err(|e| e.to_string())??;
    drop((started, late));
    let samples = samples?;
    let mut r = report::summarize(label(kind, factor), &samples, &names);
    if let Some(j) = joiners.first() {
        let from = j.joins_at.unwrap_or_default();
        let left = plan.seconds.saturating_sub(from.as_secs() as u32).max(1);
        r.joiner_share_per_second = Some(report::share_per_second(
            &samples,
            &j.name,
            from,
            left.min(5),
        ));
    }
    if plan.scenario.keyed() {
        let (over, affinity) = report::balance_and_affinity(&r, &samples);
        r.max_share_over_fair = Some(over);
        r.key_affinity = Some(affinity);
    }
    Ok(r)
}

/// fulcrum's settings for one strategy's run, over `backends`.
fn fulcrum_flags(
    plan: &Plan,
    kind: StrategyKind,
    factor: Option<f64>,
    backends: &[Started],
) -> RawFlags {
    let mut flags = RawFlags::default()
        .with("listen", "127.0.0.1:0")
        .with("admin", "127.0.0.1:0")
        .with("access_log", "off")
        .with("workers", "1")
        .with("strategy", kind.name());
    for (k, v) in plan.scenario.fulcrum_options() {
        flags = flags.with(k, v);
    }
    if let Some(f) = factor {
        flags = flags.with("hash_balance_factor", f.to_string());
    }
    flags.backend = backends
        .iter()
        .map(|b| backend_flag(&b.plan, b.addr))
        .collect();
    flags
}

/// `--backend` for a demo backend at `addr`.
fn backend_flag(p: &BackendPlan, addr: SocketAddr) -> String {
    let mut s = format!("http://{addr},weight={},name={}", p.weight, p.name);
    if p.max_conns > 0 {
        s.push_str(&format!(",max_conns={}", p.max_conns));
    }
    s
}

/// Starts the demo backend `p` on a loopback port and waits for its health.
async fn start_backend(exe: &Path, p: BackendPlan) -> Result<Started, String> {
    let listener =
        crate::spawn::bind_loopback(0).map_err(|e| format!("cannot bind a backend: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let child = crate::spawn::backend_process(exe, listener, &p.name, &p.args)
        .map_err(|e| format!("cannot start backend {}: {e}", p.name))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    if !crate::spawn::answers_health(addr, deadline).await {
        return Err(format!("backend {} did not start on {addr}", p.name));
    }
    Ok(Started {
        plan: p,
        addr,
        _child: child,
    })
}

/// Starts each of `joiners` at its time and adds it to `pool` (its cold start begins
/// then).
async fn join_later(
    exe: PathBuf,
    joiners: Vec<BackendPlan>,
    pool: Option<std::sync::Arc<crate::pool::Pool>>,
) -> Result<Vec<Started>, String> {
    let start = tokio::time::Instant::now();
    let mut out = Vec::new();
    for p in joiners {
        tokio::time::sleep_until(start + p.joins_at.unwrap_or_default()).await;
        let b = start_backend(&exe, p).await?;
        let flag = backend_flag(&b.plan, b.addr);
        let spec = crate::config::parse_backend_spec(&flag)?;
        if let Some(pool) = &pool {
            pool.add(spec).map_err(|e| e.to_string())?;
        }
        out.push(b);
    }
    Ok(out)
}

/// Writes `text` to `path`, naming it on failure.
pub(crate) fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write '{}': {e}", path.display()))
}

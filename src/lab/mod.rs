//! The strategy lab (`docs/lab.md`): the same open-loop workload, made from a seed,
//! through a fresh fulcrum per strategy in front of demo backends whose behaviour a
//! scenario scripts (slow, failing in bursts, smaller, cold, under a hot key, over
//! capacity); one row of results per strategy.
//!
//! This module holds what a run is (its plan, scenarios, schedule, load driver and
//! report) and the admin API's runner of a child `fulcrum lab`; the run itself, which
//! starts a fulcrum in this process, is `lab_run`, above the server.

pub(crate) mod load;
pub(crate) mod report;
pub(crate) mod runner;
pub(crate) mod scenario;

use std::path::Path;

use self::scenario::Scenario;
use crate::strategy::StrategyKind;

/// The longest run per strategy.
pub(crate) const MAX_SECONDS: u32 = 120;
/// The most requests per second offered.
pub(crate) const MAX_RPS: u32 = 5000;
/// Seconds per strategy unless `--seconds` says otherwise: ten strategies finish
/// within two minutes.
pub(crate) const DEFAULT_SECONDS: u32 = 8;
/// The schedule's seed unless `--seed` says otherwise.
pub(crate) const DEFAULT_SEED: u64 = 1;

/// Set when the lab is asked to stop (`SIGINT`, `SIGTERM`): the strategy running ends
/// at once, its backends are stopped and reaped, and the rows finished are reported.
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the lab has been asked to stop.
pub(crate) fn stopping() -> bool {
    STOP.load(std::sync::atomic::Ordering::Relaxed)
}

/// Has `SIGINT` and `SIGTERM` stop the lab (see [`stopping`]) instead of killing it
/// with its backends' clean-up undone; a second signal exits at once.
pub(crate) fn stop_on_signals() -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot watch for signals: {e}"))?;
    let (mut int, mut term) = rt
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        })
        .map_err(|e| format!("cannot watch for signals: {e}"))?;
    std::thread::Builder::new()
        .name("lab-signals".into())
        .spawn(move || {
            rt.block_on(async {
                for second in [false, true] {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                    if second {
                        // Asked twice: no more waiting for the clean-up.
                        std::process::exit(130);
                    }
                    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
        })
        .map(|_| ())
        .map_err(|e| format!("cannot watch for signals: {e}"))
}

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
                if sc.keyed() && kind.key_source().is_some() {
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

/// What a strategy's run is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Phase {
    /// Its backends and its fulcrum are starting.
    Starting,
    /// The schedule is being sent.
    Load,
    /// Every request is sent; the last answers are awaited.
    Draining,
}

impl Phase {
    /// Its name, as the JSON progress spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Load => "load",
            Phase::Draining => "draining",
        }
    }
}

/// Where a run stands, for a progress line.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Progress {
    /// The strategy running (0-based) and how many there are.
    pub(crate) index: usize,
    pub(crate) of: usize,
    pub(crate) strategy: String,
    pub(crate) phase: Phase,
    /// Seconds into its schedule.
    pub(crate) elapsed: f64,
}

/// Writes `text` to `path`, naming it on failure.
pub(crate) fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write '{}': {e}", path.display()))
}

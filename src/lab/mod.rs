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
pub(crate) mod sessions;

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
    /// Each row: a strategy, with what it changes of the scenario.
    pub(crate) variants: Vec<Variant>,
    pub(crate) seconds: u32,
    pub(crate) rps: u32,
    pub(crate) seed: u64,
}

/// One row of a run: a strategy, and what the row changes of its scenario's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Variant {
    pub(crate) kind: StrategyKind,
    pub(crate) tweak: Tweak,
}

/// What a row changes of its scenario's settings (`docs/lab.md`, "Rows").
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Tweak {
    /// Nothing.
    None,
    /// Bounded load with this balance factor (`+bounded`).
    Bounded(f64),
    /// `max_conns = "auto"` instead of the scenario's fixed limit (`+auto`).
    AutoLimit,
    /// No `max_conns` at all (`+unlimited`).
    NoLimit,
    /// Success-rate ejection on (`+success_rate`).
    SuccessRate,
    /// Hedged requests on (`+hedge`): a second try after [`scenario::HEDGE_AFTER`].
    Hedge,
}

impl Tweak {
    /// The suffixes of the rows' names, and what they mean.
    const SUFFIXES: [(&'static str, Tweak); 5] = [
        ("bounded", Tweak::Bounded(scenario::HOT_KEY_FACTOR)),
        ("auto", Tweak::AutoLimit),
        ("unlimited", Tweak::NoLimit),
        ("success_rate", Tweak::SuccessRate),
        ("hedge", Tweak::Hedge),
    ];

    fn suffix(self) -> Option<&'static str> {
        (Self::SUFFIXES.iter())
            .find(|(_, t)| std::mem::discriminant(t) == std::mem::discriminant(&self))
            .map(|(s, _)| *s)
    }
}

impl Variant {
    /// `kind` as the scenario sets it up.
    pub(crate) fn plain(kind: StrategyKind) -> Variant {
        Variant {
            kind,
            tweak: Tweak::None,
        }
    }

    /// `kind` with `tweak`.
    pub(crate) fn with(kind: StrategyKind, tweak: Tweak) -> Variant {
        Variant { kind, tweak }
    }

    /// Its name in the results: the strategy's, with `+bounded`, `+auto`, `+unlimited`,
    /// `+success_rate` or `+hedge` after it for a row that changes the scenario.
    pub(crate) fn label(&self) -> String {
        match self.tweak.suffix() {
            Some(s) => format!("{}+{s}", self.kind.name()),
            None => self.kind.name().to_string(),
        }
    }

    /// Reads a row's name as [`Self::label`] writes it (the strategy by any of its
    /// names); the error names the valid ones.
    fn parse(text: &str) -> Result<Variant, String> {
        let (name, suffix) = match text.split_once('+') {
            Some((n, s)) => (n, Some(s)),
            None => (text, None),
        };
        let kind = StrategyKind::parse(name).ok_or_else(|| {
            format!(
                "unknown strategy '{name}' (valid: all, {})",
                StrategyKind::canonical_names().join(", ")
            )
        })?;
        let tweak = match suffix {
            None => Tweak::None,
            Some(s) => (Tweak::SUFFIXES.iter().find(|(n, _)| *n == s))
                .map(|(_, t)| *t)
                .ok_or_else(|| {
                    format!(
                        "unknown row '{text}' (after '+': bounded, auto, unlimited, success_rate, hedge)"
                    )
                })?,
        };
        Ok(Variant { kind, tweak })
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
                let row = Variant::parse(name)?;
                v.push(row);
                let hashing = row.kind.key_source().is_some();
                if sc.keyed() && hashing && row.tweak == Tweak::None {
                    v.push(Variant::with(
                        row.kind,
                        Tweak::Bounded(scenario::HOT_KEY_FACTOR),
                    ));
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

//! A lab run started from a running fulcrum (`POST /admin/lab`, the dashboard's Lab
//! view; `docs/lab.md`, "From the dashboard"): the same `fulcrum lab` as on the command
//! line, as a child process of this one. A child keeps the lab's fulcrums, backends
//! and load apart from the instance serving traffic: what the lab leaks or breaks ends
//! with the child, and the instance's own pools are never touched.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use super::{Plan, Progress};

/// Where a lab run stands, as `GET /admin/lab` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct LabStatus {
    /// `idle` (never run), `running`, `done`, `failed` or `stopped`.
    pub(crate) state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) scenario: Option<&'static str>,
    /// Each row's strategy, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) strategies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) seconds: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rps: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) seed: Option<u64>,
    /// Seconds since the run started (until it ended).
    pub(crate) elapsed_s: f64,
    /// The strategy running and how far it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) progress: Option<Progress>,
    /// The report (`fulcrum lab --json`) once the run is over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) report: Option<serde_json::Value>,
    /// The table `fulcrum lab` prints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) table: Option<String>,
    /// The chart (`fulcrum lab --svg`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) svg: Option<String>,
    /// Why the run failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// Why a run cannot start.
#[derive(Debug, PartialEq)]
pub(crate) enum LabStartError {
    /// Another run is going on.
    Busy,
    /// The child could not be started.
    Failed(String),
}

/// The current or last run.
struct Current {
    status: LabStatus,
    started: Instant,
    ended: Option<Instant>,
    /// Its number: a finished run's task must not touch a newer run.
    id: u64,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Runs one lab at a time.
pub(crate) struct LabRunner {
    current: Mutex<Option<Current>>,
    runs: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for LabRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LabRunner")
    }
}

impl LabRunner {
    pub(crate) fn new() -> LabRunner {
        LabRunner {
            current: Mutex::new(None),
            runs: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `plan` (`strategies` as the request named them) in a child process, in
    /// the current tokio runtime.
    pub(crate) fn start(
        self: &Arc<Self>,
        plan: &Plan,
        strategies: &str,
    ) -> Result<LabStatus, LabStartError> {
        let mut slot = self.lock();
        if slot.as_ref().is_some_and(|c| c.ended.is_none()) {
            return Err(LabStartError::Busy);
        }
        let id = 1 + self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fulcrum-lab-{}-{id}", std::process::id()));
        let child = spawn_child(plan, strategies, &dir).map_err(LabStartError::Failed)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        *slot = Some(Current {
            status: LabStatus {
                state: "running",
                scenario: Some(plan.scenario.name()),
                strategies: plan
                    .variants
                    .iter()
                    .map(|&(k, f)| super::label(k, f))
                    .collect(),
                seconds: Some(plan.seconds),
                rps: Some(plan.rps),
                seed: Some(plan.seed),
                ..idle()
            },
            started: Instant::now(),
            ended: None,
            id,
            stop: Some(stop_tx),
        });
        drop(slot);
        let me = Arc::clone(self);
        tokio::spawn(async move { me.follow(id, child, dir, stop_rx).await });
        Ok(self.status())
    }

    /// Stops the running run, if any; the status after.
    pub(crate) async fn stop(&self) -> LabStatus {
        let stop = self.lock().as_mut().and_then(|c| c.stop.take());
        if let Some(stop) = stop {
            let _ = stop.send(());
            // The run's task marks it stopped once the child is gone.
            for _ in 0..300 {
                if self.lock().as_ref().is_some_and(|c| c.ended.is_some()) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        self.status()
    }

    /// The current or last run's status.
    pub(crate) fn status(&self) -> LabStatus {
        match self.lock().as_ref() {
            None => idle(),
            Some(c) => LabStatus {
                elapsed_s: c
                    .ended
                    .unwrap_or_else(Instant::now)
                    .duration_since(c.started)
                    .as_secs_f64(),
                ..c.status.clone()
            },
        }
    }

    /// Changes run `id`'s status, if it is still the current run.
    fn update(&self, id: u64, f: impl FnOnce(&mut Current)) {
        if let Some(c) = self.lock().as_mut().filter(|c| c.id == id) {
            f(c);
        }
    }

    /// Follows run `id`'s child: its progress lines, its table, its end.
    async fn follow(
        self: Arc<Self>,
        id: u64,
        mut child: tokio::process::Child,
        dir: PathBuf,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let me = Arc::clone(&self);
        let errors = tokio::spawn(async move { me.read_progress(id, stderr).await });
        let table = tokio::spawn(read_all(stdout));
        let outcome = tokio::select! {
            st = child.wait() => Some(st),
            _ = stop => None,
        };
        if outcome.is_none() {
            stop_child(&mut child).await;
        }
        let last_error = errors.await.unwrap_or_default();
        let table = table.await.unwrap_or_default();
        let report = std::fs::read_to_string(dir.join("report.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        let svg = std::fs::read_to_string(dir.join("chart.svg")).ok();
        let _ = std::fs::remove_dir_all(&dir);
        self.update(id, |c| {
            let s = &mut c.status;
            s.state = match &outcome {
                None => "stopped",
                Some(Ok(st)) if st.success() => "done",
                Some(_) => "failed",
            };
            if let Some(Err(e)) = &outcome {
                s.error = Some(format!("cannot wait for the lab: {e}"));
            } else if s.state == "failed" {
                s.error = Some(last_error.unwrap_or_else(|| "the lab ended with an error".into()));
            }
            s.report = report;
            s.svg = svg;
            s.table = (!table.is_empty()).then_some(table);
            c.ended = Some(Instant::now());
            c.stop = None;
        });
    }

    /// Reads the child's stderr: each progress line updates run `id`; the last error
    /// line is returned.
    async fn read_progress(
        &self,
        id: u64,
        stderr: Option<tokio::process::ChildStderr>,
    ) -> Option<String> {
        let mut lines = BufReader::new(stderr?).lines();
        let mut last_error = None;
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(p) = serde_json::from_str::<Progress>(&line) {
                self.update(id, |c| c.status.progress = Some(p));
            } else if let Some(e) = line.trim().strip_prefix("error: ") {
                last_error = Some(e.to_string());
            }
        }
        last_error
    }
}

/// The status before any run.
fn idle() -> LabStatus {
    LabStatus {
        state: "idle",
        scenario: None,
        strategies: Vec::new(),
        seconds: None,
        rps: None,
        seed: None,
        elapsed_s: 0.0,
        progress: None,
        report: None,
        table: None,
        svg: None,
        error: None,
    }
}

/// Starts `fulcrum lab` for `plan`, writing its report and chart into `dir`.
fn spawn_child(
    plan: &Plan,
    strategies: &str,
    dir: &std::path::Path,
) -> Result<tokio::process::Child, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find fulcrum's own executable: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create '{}': {e}", dir.display()))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("lab")
        .args(["--scenario", plan.scenario.name()])
        .args(["--strategies", strategies])
        .args(["--seconds", &plan.seconds.to_string()])
        .args(["--rps", &plan.rps.to_string()])
        .args(["--seed", &plan.seed.to_string()])
        .arg("--json")
        .arg(dir.join("report.json"))
        .arg("--svg")
        .arg(dir.join("chart.svg"))
        .arg("--progress-json")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    crate::spawn::dies_with_this_thread(&mut cmd);
    cmd.spawn()
        .map_err(|e| format!("cannot start the lab: {e}"))
}

/// How long a stopped lab has to stop its backends and exit before it is killed.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Asks the lab to stop (`SIGTERM`: it stops and reaps its backends), and kills it if
/// it has not exited within [`STOP_GRACE`].
async fn stop_child(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) on the pid of a child not yet reaped (so not reused); no
        // memory is involved.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// Everything `pipe` gives until it closes.
async fn read_all(pipe: Option<tokio::process::ChildStdout>) -> String {
    let mut out = String::new();
    if let Some(mut p) = pipe {
        let _ = p.read_to_string(&mut out).await;
    }
    out
}

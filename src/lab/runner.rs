//! A lab run started from a running fulcrum (`POST /admin/lab`, the dashboard's Lab
//! view; `docs/lab.md`, "From the dashboard"): the same `fulcrum lab` as on the command
//! line, as a child process of this one. A child keeps the lab's fulcrums, backends
//! and load apart from the instance serving traffic: what the lab leaks or breaks ends
//! with the child, and the instance's own pools are never touched.

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
        if self.lock().as_ref().is_some_and(|c| c.ended.is_none()) {
            return Err(LabStartError::Busy);
        }
        let output = Output::create().map_err(LabStartError::Failed)?;
        let mut slot = self.lock();
        if slot.as_ref().is_some_and(|c| c.ended.is_none()) {
            return Err(LabStartError::Busy);
        }
        let id = 1 + self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let child = spawn_child(plan, strategies, &output).map_err(LabStartError::Failed)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        *slot = Some(Current {
            status: LabStatus {
                state: "running",
                scenario: Some(plan.scenario.name()),
                strategies: plan.variants.iter().map(super::Variant::label).collect(),
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
        tokio::spawn(async move { me.follow(id, child, output, stop_rx).await });
        Ok(self.status())
    }

    /// Stops the running run, if any; the status after.
    pub(crate) async fn stop(&self) -> LabStatus {
        let stop = self
            .lock()
            .as_mut()
            .and_then(|c| Some((c.id, c.stop.take()?)));
        if let Some((id, stop)) = stop {
            let _ = stop.send(());
            // The run's task marks it stopped once the child is gone.
            let deadline = Instant::now() + STOP_GRACE + PIPE_GRACE;
            while Instant::now() < deadline {
                let over = self
                    .lock()
                    .as_ref()
                    .is_none_or(|c| c.id != id || c.ended.is_some());
                if over {
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
        output: Output,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let me = Arc::clone(&self);
        let said = tokio::spawn(async move { me.read_progress(id, stderr).await });
        let table = tokio::spawn(read_all(stdout));
        let (exit, stopped) = tokio::select! {
            biased;
            st = child.wait() => (st, false),
            _ = stop => (stop_child(&mut child).await, true),
        };
        // Once the child is gone its pipes close; a grandchild holding one must not
        // keep the run "running".
        let said = tokio::time::timeout(PIPE_GRACE, said)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let table = tokio::time::timeout(PIPE_GRACE, table)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        // Files, off the admin API's thread.
        let (report, svg) = tokio::task::spawn_blocking(move || output.take())
            .await
            .unwrap_or_default();
        self.update(id, |c| {
            let s = &mut c.status;
            s.state = match &exit {
                Ok(st) if st.success() => "done",
                _ if stopped => "stopped",
                _ => "failed",
            };
            if s.state == "failed" {
                s.error = Some(failure(&exit, &said));
            }
            s.report = report;
            s.svg = svg;
            s.table = (!table.is_empty()).then_some(table);
            c.ended = Some(Instant::now());
            c.stop = None;
        });
    }

    /// Reads the child's stderr to its end: each progress line updates run `id`; the
    /// last lines of anything else are returned.
    async fn read_progress(
        &self,
        id: u64,
        stderr: Option<tokio::process::ChildStderr>,
    ) -> Vec<String> {
        let Some(stderr) = stderr else {
            return Vec::new();
        };
        let mut said = std::collections::VecDeque::new();
        let mut reader = BufReader::new(stderr);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&buf);
            let line = text.trim();
            if let Ok(p) = serde_json::from_str::<Progress>(line) {
                self.update(id, |c| c.status.progress = Some(p));
            } else if !line.is_empty() {
                said.push_back(line.to_string());
                if said.len() > KEPT_LINES {
                    said.pop_front();
                }
            }
        }
        said.into()
    }
}

/// Lines of the lab's stderr kept to explain a failure.
const KEPT_LINES: usize = 5;
/// How long the lab's pipes may stay open once it has exited.
const PIPE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Why the lab failed: its last `error:` line, or else its last words and how it
/// ended.
fn failure(exit: &std::io::Result<std::process::ExitStatus>, said: &[String]) -> String {
    if let Some(e) = said.iter().rev().find_map(|l| l.strip_prefix("error: ")) {
        return e.to_string();
    }
    let status = match exit {
        Ok(st) => st.to_string(),
        Err(e) => format!("cannot wait for the lab: {e}"),
    };
    match said.last() {
        Some(last) => format!("the lab ended ({status}): {last}"),
        None => format!("the lab ended ({status})"),
    }
}

/// One run's report and chart: two files without a name, which the lab child writes
/// through its descriptors 3 and 4 (`--json /dev/fd/3 --svg /dev/fd/4`). Nothing of a
/// run is ever on disk under a name, so nothing stays behind whatever ends the parent
/// (a `SIGKILL` included): the files go with their last descriptor.
struct Output {
    report: std::fs::File,
    chart: std::fs::File,
}

/// Where the child finds the report's file, and the chart's.
const OUTPUT_FDS: [i32; 2] = [3, 4];

impl Output {
    fn create() -> Result<Output, String> {
        Ok(Output {
            report: unnamed_file()?,
            chart: unnamed_file()?,
        })
    }

    /// The report and the chart the lab wrote, if it did.
    fn take(mut self) -> (Option<serde_json::Value>, Option<String>) {
        let read = |f: &mut std::fs::File| {
            use std::io::{Read, Seek};
            let mut text = String::new();
            f.rewind().ok()?;
            f.read_to_string(&mut text).ok()?;
            (!text.is_empty()).then_some(text)
        };
        let report = read(&mut self.report).and_then(|t| serde_json::from_str(&t).ok());
        (report, read(&mut self.chart))
    }

    /// Has the child find the two files at [`OUTPUT_FDS`].
    fn hand_to(&self, cmd: &mut tokio::process::Command) {
        use std::os::fd::AsRawFd;
        let fds = [self.report.as_raw_fd(), self.chart.as_raw_fd()];
        // SAFETY: between fork and exec only async-signal-safe calls (fcntl, dup2,
        // close), on descriptors this process owns.
        unsafe {
            cmd.pre_exec(move || {
                // Both copied above the targets first, so that neither target can
                // overwrite the other's source (the chart's file may be fd 3).
                let mut high = [0; 2];
                for (h, from) in high.iter_mut().zip(fds) {
                    *h = libc::fcntl(from, libc::F_DUPFD, 10);
                    if *h < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for (h, to) in high.into_iter().zip(OUTPUT_FDS) {
                    if libc::dup2(h, to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::close(h);
                }
                Ok(())
            });
        }
    }
}

/// A file of this user's alone with no name: `O_TMPFILE` where the file system has it,
/// else a random name removed at once.
fn unnamed_file() -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let base = std::env::temp_dir();
    let mut open = std::fs::OpenOptions::new();
    open.read(true).write(true).mode(0o600);
    if let Ok(f) = open.clone().custom_flags(libc::O_TMPFILE).open(&base) {
        return Ok(f);
    }
    let path = base.join(format!("fulcrum-lab-{:016x}", fastrand::u64(..)));
    let f = open
        .create_new(true)
        .open(&path)
        .map_err(|e| format!("cannot create a file in '{}': {e}", base.display()))?;
    let _ = std::fs::remove_file(&path);
    Ok(f)
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

/// Starts `fulcrum lab` for `plan`, writing its report and chart into `output`.
fn spawn_child(
    plan: &Plan,
    strategies: &str,
    output: &Output,
) -> Result<tokio::process::Child, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find fulcrum's own executable: {e}"))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("lab")
        .args(["--scenario", plan.scenario.name()])
        .args(["--strategies", strategies])
        .args(["--seconds", &plan.seconds.to_string()])
        .args(["--rps", &plan.rps.to_string()])
        .args(["--seed", &plan.seed.to_string()])
        .arg("--json")
        .arg(format!("/dev/fd/{}", OUTPUT_FDS[0]))
        .arg("--svg")
        .arg(format!("/dev/fd/{}", OUTPUT_FDS[1]))
        .arg("--progress-json")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    crate::spawn::dies_with_this_thread(&mut cmd);
    output.hand_to(&mut cmd);
    cmd.spawn()
        .map_err(|e| format!("cannot start the lab: {e}"))
}

/// How long a stopped lab has to stop its backends and exit before it is killed.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Asks the lab to stop (`SIGTERM`: it stops and reaps its backends), and kills it if
/// it has not exited within [`STOP_GRACE`]; how it ended.
async fn stop_child(
    child: &mut tokio::process::Child,
) -> std::io::Result<std::process::ExitStatus> {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) on the pid of a child not yet reaped (so not reused); no
        // memory is involved.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(st) => st,
        Err(_) => {
            let _ = child.kill().await;
            child.wait().await
        }
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

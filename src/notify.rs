//! systemd's notification protocol (`docs/install.md`, "systemd"): what a `Type=notify`
//! service tells its manager — ready, reloading, stopping, a new main process after an
//! upgrade — and the watchdog's keep-alive, sent only while every worker answers.
//! Without `NOTIFY_SOCKET` (not under systemd) each call does nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;

/// Sends `states`; a failure is logged, never fatal (the manager is an observer).
fn send(states: &[NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("systemd notify: {e}");
    }
}

/// The process serves its real configuration (§ readiness in `docs/install.md`).
pub(crate) fn ready() {
    send(&[NotifyState::Ready]);
}

/// This process, started by `--upgrade`, serves and is about to take over: the
/// service's main process from now, said before the old one is told to drain (were it
/// said after, the old one could be gone first, and the service with it).
pub(crate) fn taking_over() {
    send(&[NotifyState::MainPid(std::process::id()), NotifyState::Ready]);
}

/// The take-over failed: the old process (`pid`) serves on, and is the main one again.
pub(crate) fn handed_back(pid: u32) {
    send(&[NotifyState::MainPid(pid), NotifyState::Ready]);
}

/// A reload starts: the manager waits for the next `ready`.
pub(crate) fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// The process stops (not a hand-over: the new process is the service then).
pub(crate) fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// Each worker's heartbeat count, which it bumps on every beat; the watchdog sends its
/// keep-alive only when every count moved since the last look.
#[derive(Debug, Clone)]
pub(crate) struct Pulses(Arc<[AtomicU64]>);

impl Pulses {
    /// Counts for `workers` workers.
    pub(crate) fn new(workers: usize) -> Pulses {
        Pulses((0..workers).map(|_| AtomicU64::new(0)).collect())
    }

    /// Worker `i` is alive.
    pub(crate) fn beat(&self, i: usize) {
        if let Some(p) = self.0.get(i) {
            p.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn snapshot(&self) -> Vec<u64> {
        self.0.iter().map(|p| p.load(Ordering::Relaxed)).collect()
    }
}

/// Sends `WATCHDOG=1` every half of systemd's `WATCHDOG_USEC` while every worker's
/// heartbeat moves; a worker stuck for a whole half-period stops it, and systemd
/// restarts the service. Nothing when the watchdog is off. Runs until `stop` turns true.
pub(crate) async fn watchdog(pulses: Pulses, mut stop: tokio::sync::watch::Receiver<bool>) {
    let Some(period) = sd_notify::watchdog_enabled() else {
        return;
    };
    // At least a few worker heartbeats (100 ms) per look, so that a worker between two
    // beats is not taken for a stuck one.
    let half = (period / 2).max(Duration::from_millis(300));
    let mut last = pulses.snapshot();
    // The first look a whole period after this one; a late look is not made up for.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + half, half);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let now = pulses.snapshot();
        let stuck: Vec<usize> = (0..now.len()).filter(|&i| now[i] == last[i]).collect();
        if stuck.is_empty() {
            send(&[NotifyState::Watchdog]);
        } else {
            tracing::error!(workers = ?stuck, "a worker has not answered for {half:?}: no watchdog keep-alive");
        }
        last = now;
    }
}

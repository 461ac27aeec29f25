//! Faults injected through the admin API (`degrade`, `recover`) to rehearse a sick
//! backend: added latency and a share of requests answered 503 by the proxy itself.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Faults injected on one backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Faults {
    /// Added before the request is forwarded.
    pub(crate) latency: Duration,
    /// Share of requests answered 503 by the proxy itself, 0..=1.
    pub(crate) error_rate: f64,
}

/// Where a backend keeps its faults: two words, both zero when there are none.
#[derive(Debug, Default)]
pub(crate) struct FaultCells {
    /// Injected latency, milliseconds.
    latency_ms: AtomicU32,
    /// Injected error rate, in millionths.
    error_ppm: AtomicU32,
}

impl FaultCells {
    /// The injected faults, `None` when there are none (the common case: two loads).
    #[inline]
    pub(crate) fn get(&self) -> Option<Faults> {
        let ms = self.latency_ms.load(Ordering::Relaxed);
        let ppm = self.error_ppm.load(Ordering::Relaxed);
        (ms != 0 || ppm != 0).then(|| Faults {
            latency: Duration::from_millis(ms as u64),
            error_rate: ppm as f64 / 1e6,
        })
    }

    /// Sets injected faults; `None` leaves that one as it is.
    pub(crate) fn set(&self, latency_ms: Option<u32>, error_rate: Option<f64>) {
        if let Some(ms) = latency_ms {
            self.latency_ms.store(ms, Ordering::Relaxed);
        }
        if let Some(r) = error_rate {
            self.error_ppm
                .store((r.clamp(0.0, 1.0) * 1e6).round() as u32, Ordering::Relaxed);
        }
    }

    /// Clears every fault.
    pub(crate) fn clear(&self) {
        self.latency_ms.store(0, Ordering::Relaxed);
        self.error_ppm.store(0, Ordering::Relaxed);
    }
}

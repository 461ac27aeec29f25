//! The demo backend and what `fulcrum demo` starts.
//!
//! `fulcrum demo` runs the balancer with no configured backend, spawns its demo
//! backends through the same [`Spawner`](crate::spawn::Spawner) as
//! `POST /admin/backends/spawn` (so they can be killed and revived from the dashboard),
//! and starts the traffic generator at a modest rate.

pub(crate) mod backend;

/// Latencies of the demo backends, cycled: one fast, one middling, one slow.
const DEMO_LATENCIES_MS: [u64; 3] = [10, 40, 120];

/// Requests per second the demo's traffic generator sends.
pub(crate) const DEMO_RPS: u64 = 40;

/// Name and latency of the `i`-th demo backend: `backend-a` 10 ms, `backend-b` 40 ms,
/// `backend-c` 120 ms, then again.
pub(crate) fn backend_plan(i: usize) -> (String, u64) {
    let latency = DEMO_LATENCIES_MS[i % DEMO_LATENCIES_MS.len()];
    let name = format!("backend-{}", (b'a' + (i % 26) as u8) as char);
    (name, latency)
}

#[cfg(test)]
mod tests {
    #[test]
    fn plans_cycle_latencies() {
        assert_eq!(super::backend_plan(0), ("backend-a".into(), 10));
        assert_eq!(super::backend_plan(4), ("backend-e".into(), 40));
    }
}

//! The load a backend reports about itself (`docs/strategies.md`, "Reported load"): the
//! ORCA `endpoint-load-metrics` field of its answers, in its TEXT form, as gRPC's and
//! Envoy's client-side weighted round robin read it. The proxy takes the field off every
//! answer before the client sees it and leaves its value here; the `reported_load`
//! strategy reads the latest report when its weights are recomputed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A report older than this is not used: the backend gets the mean weight instead.
pub const FRESH_FOR: Duration = Duration::from_secs(180);

/// The name of the field, in lower case.
pub const FIELD: &str = "endpoint-load-metrics";

/// What one `endpoint-load-metrics` value says.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Report {
    /// `application_utilization`, else `cpu_utilization`: the share of its capacity in use.
    pub utilization: Option<f64>,
    /// `rps_fractional`: the requests per second it serves.
    pub rps: Option<f64>,
}

/// Reads a value in the TEXT form: `TEXT key=value, key=value…`. Keys other than
/// `cpu_utilization`, `application_utilization` and `rps_fractional` (ORCA's named
/// metrics, memory, queries and errors per second) are allowed and not used. `None` for
/// anything else: another form, a pair without `=`, a value that is not a finite number
/// of at least zero. Written by hand: the form is one line of a handful of pairs, and
/// parsing it is on the path of every answer that carries it.
pub fn parse_report(value: &[u8]) -> Option<Report> {
    let rest = value.trim_ascii().strip_prefix(b"TEXT")?;
    if !rest.first().is_some_and(u8::is_ascii_whitespace) {
        return None;
    }
    let (mut cpu, mut app, mut rps) = (None, None, None);
    for pair in rest.split(|&c| c == b',') {
        let pair = pair.trim_ascii();
        if pair.is_empty() {
            continue;
        }
        let eq = pair.iter().position(|&c| c == b'=')?;
        let (key, number) = (pair[..eq].trim_ascii(), pair[eq + 1..].trim_ascii());
        let n: f64 = std::str::from_utf8(number).ok()?.parse().ok()?;
        if !n.is_finite() || n < 0.0 {
            return None;
        }
        match key {
            b"cpu_utilization" => cpu = Some(n),
            b"application_utilization" => app = Some(n),
            b"rps_fractional" => rps = Some(n),
            _ => {}
        }
    }
    Some(Report {
        utilization: app.filter(|&u| u > 0.0).or(cpu),
        rps,
    })
}

/// A number kept in an atomic word; NaN is "none".
const NONE: u64 = f64::NAN.to_bits();

/// A backend's latest report and how many it could not read.
#[derive(Debug)]
pub(crate) struct LoadReports {
    utilization: AtomicU64,
    rps: AtomicU64,
    /// When it came ([`super::clock_ns`]); 0: never.
    at: AtomicU64,
    malformed: AtomicU64,
}

impl Default for LoadReports {
    fn default() -> Self {
        LoadReports {
            utilization: AtomicU64::new(NONE),
            rps: AtomicU64::new(NONE),
            at: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
        }
    }
}

impl LoadReports {
    /// Keeps the report in `value`, read at `now`; a value that cannot be read is
    /// counted and clears the last one: the backend's load is unknown again, so its
    /// weight goes back to the pool's mean (`docs/strategies.md`, "reported_load").
    pub(crate) fn note(&self, value: &[u8], now: u64) {
        let Some(r) = parse_report(value) else {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            self.at.store(0, Ordering::Release);
            return;
        };
        let bits = |v: Option<f64>| v.map_or(NONE, f64::to_bits);
        self.utilization
            .store(bits(r.utilization), Ordering::Relaxed);
        self.rps.store(bits(r.rps), Ordering::Relaxed);
        self.at.store(now.max(1), Ordering::Release);
    }

    /// The latest report when it is no older than [`FRESH_FOR`] at `now`.
    pub(crate) fn fresh(&self, now: u64) -> Option<Report> {
        let at = self.at.load(Ordering::Acquire);
        if at == 0 || now.saturating_sub(at) > FRESH_FOR.as_nanos() as u64 {
            return None;
        }
        let get =
            |a: &AtomicU64| Some(f64::from_bits(a.load(Ordering::Relaxed))).filter(|v| !v.is_nan());
        Some(Report {
            utilization: get(&self.utilization),
            rps: get(&self.rps),
        })
    }

    /// Values it could not read.
    pub(crate) fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_is_read_application_utilization_first() {
        let r = parse_report(
            b"TEXT cpu_utilization=0.42, application_utilization=0.5, rps_fractional=120",
        )
        .unwrap();
        assert_eq!((r.utilization, r.rps), (Some(0.5), Some(120.0)));
        let r = parse_report(b"TEXT cpu_utilization=0.42,named_metrics.queue=3").unwrap();
        assert_eq!((r.utilization, r.rps), (Some(0.42), None));
        let r = parse_report(b" TEXT  rps_fractional=7 ").unwrap();
        assert_eq!((r.utilization, r.rps), (None, Some(7.0)));
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            &b""[..],
            b"TEXT",
            b"TEXTcpu_utilization=1",
            b"JSON {\"cpu_utilization\": 0.4}",
            b"TEXT cpu_utilization",
            b"TEXT cpu_utilization=high",
            b"TEXT cpu_utilization=-1",
            b"TEXT cpu_utilization=inf",
            b"TEXT cpu_utilization=NaN",
            b"\xff\xfe",
        ] {
            assert_eq!(
                parse_report(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_report_is_fresh_for_three_minutes_and_a_bad_one_clears_it() {
        let r = LoadReports::default();
        assert_eq!(r.fresh(5), None);
        r.note(b"TEXT cpu_utilization=0.25", 10);
        assert_eq!(r.fresh(20).unwrap().utilization, Some(0.25));
        assert_eq!(r.fresh(10 + FRESH_FOR.as_nanos() as u64 + 1), None);
        r.note(b"TEXT cpu_utilization=oops", 30);
        assert_eq!(r.malformed(), 1);
        assert_eq!(
            r.fresh(31),
            None,
            "an unreadable report clears the last one"
        );
    }
}

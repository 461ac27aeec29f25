//! The success-rate table of a pool's passive checks (`outlier.success_rate`,
//! `docs/operations.md`, "Success-rate outliers"), written as a table in the file, an
//! object in JSON and `key=value` pairs on the command line.

use std::time::Duration;

use super::values::{parse_positive_duration, parse_uint};

/// Success-rate outlier detection (Envoy's algorithm): every `interval`, a backend with
/// at least `min_requests` answers in it whose success rate is below the mean of the
/// qualifying backends less `stdev_factor` standard deviations is ejected, when at least
/// `min_hosts` backends qualify.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SuccessRate {
    /// How often the rates are compared (and the window they are counted over).
    pub(crate) interval: Duration,
    /// Fewest qualifying backends for any ejection.
    pub(crate) min_hosts: u32,
    /// Fewest answers in an interval for a backend to qualify.
    pub(crate) min_requests: u32,
    /// How many standard deviations below the mean a rate must be.
    pub(crate) stdev_factor: f64,
}

/// The values a table leaves out: Envoy's interval and factor; fewer hosts and requests
/// than Envoy's 5 and 100, so that a small pool under light traffic is judged at all.
pub(crate) const DEFAULTS: SuccessRate = SuccessRate {
    interval: Duration::from_secs(10),
    min_hosts: 3,
    min_requests: 20,
    stdev_factor: 1.9,
};

/// The keys of the table, for messages.
const KEYS: &str = "interval, min_hosts, min_requests, stdev_factor";

/// Parses `interval=10s,min_hosts=3,…` (any subset; the rest from [`DEFAULTS`]), or
/// `off`. The file's table and the API's object reach here in that form.
pub(crate) fn parse_success_rate(s: &str) -> Result<Option<SuccessRate>, String> {
    let t = s.trim();
    if t == "off" {
        return Ok(None);
    }
    let mut sr = DEFAULTS;
    for pair in t.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!(
                "invalid success_rate '{pair}' (expected key=value with a key of: {KEYS})"
            ));
        };
        let (k, v) = (k.trim(), v.trim());
        let named = |e: String| format!("success_rate.{k}: {e}");
        match k {
            "interval" => sr.interval = parse_interval(v).map_err(named)?,
            "min_hosts" => sr.min_hosts = parse_uint(v, 1u32, 10_000).map_err(named)?,
            "min_requests" => sr.min_requests = parse_uint(v, 1u32, 1_000_000).map_err(named)?,
            "stdev_factor" => sr.stdev_factor = parse_factor(v).map_err(named)?,
            _ => return Err(format!("unknown key 'success_rate.{k}' (valid: {KEYS})")),
        }
    }
    Ok(Some(sr))
}

/// A window's length: above zero, at most an hour (a window's counts are 32 bits).
fn parse_interval(v: &str) -> Result<Duration, String> {
    let d = parse_positive_duration(v)?;
    if d > Duration::from_secs(3600) {
        return Err(format!("invalid duration '{v}' (at most 1h)"));
    }
    Ok(d)
}

/// A standard-deviation factor: a number greater than 0 (at most 100).
fn parse_factor(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 100.0 => Ok(f),
        _ => Err(format!(
            "invalid value '{v}' (expected a number greater than 0, at most 100)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_takes_the_defaults_for_what_it_leaves_out() {
        let sr = parse_success_rate("interval=2s, stdev_factor=1")
            .unwrap()
            .unwrap();
        assert_eq!(sr.interval, Duration::from_secs(2));
        assert_eq!(
            (sr.min_hosts, sr.min_requests, sr.stdev_factor),
            (3, 20, 1.0)
        );
        assert_eq!(parse_success_rate("").unwrap(), Some(DEFAULTS));
        assert_eq!(parse_success_rate("off").unwrap(), None);
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, named) in [
            ("stdev_factor=0", "success_rate.stdev_factor"),
            ("stdev_factor=-1", "success_rate.stdev_factor"),
            ("min_hosts=0", "success_rate.min_hosts"),
            ("interval=0s", "success_rate.interval"),
            ("speed=3", "success_rate.speed"),
            ("interval", "key=value"),
        ] {
            let e = parse_success_rate(text).unwrap_err();
            assert!(e.contains(named), "{text}: {e}");
        }
    }
}

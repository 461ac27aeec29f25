//! `retry_on` (`docs/traffic.md`, "Retries"): what sends a request to another backend of
//! its pool — a failure before any answer (`connect`, always; `reset`; `timeout`) or an
//! answer whose status is listed (`503`, or a class such as `5xx`).

/// A listed status: one code, or a class (`5xx`: 500–599).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusRule {
    /// One status code, 100–599.
    Code(u16),
    /// Every status of a hundred (`5` for `5xx`).
    Class(u8),
}

impl StatusRule {
    fn takes(self, status: u16) -> bool {
        match self {
            StatusRule::Code(c) => c == status,
            StatusRule::Class(c) => status / 100 == u16::from(c),
        }
    }

    /// As written in `retry_on` (and in the metric's `reason`).
    pub(crate) fn label(self) -> String {
        match self {
            StatusRule::Code(c) => c.to_string(),
            StatusRule::Class(c) => format!("{c}xx"),
        }
    }
}

/// A pool's `retry_on`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RetryOn {
    /// A connection reset (or closed) before any answer byte.
    pub(crate) reset: bool,
    /// No answer head within `upstream_timeout` (or `try_timeout`).
    pub(crate) timeout: bool,
    /// Answers sent to another backend, in the order given.
    pub(crate) statuses: Vec<StatusRule>,
}

impl Default for RetryOn {
    /// `["connect", "reset", "timeout"]`: a failure before any answer, never an answer.
    fn default() -> RetryOn {
        RetryOn {
            reset: true,
            timeout: true,
            statuses: Vec::new(),
        }
    }
}

/// What `retry_on` accepts, for its messages.
const VALID: &str = "a status 100-599, 5xx (a class), connect, reset or timeout";

impl RetryOn {
    /// Reads `retry_on`: entries joined with commas (a list in the file).
    pub(crate) fn parse(text: &str) -> Result<RetryOn, String> {
        let mut on = RetryOn {
            reset: false,
            timeout: false,
            statuses: Vec::new(),
        };
        for entry in text.split(',').map(str::trim) {
            match entry {
                // Always on: nothing was sent.
                "connect" => {}
                "reset" => on.reset = true,
                "timeout" => on.timeout = true,
                e => {
                    let rule = status_rule(e).ok_or_else(|| format!("'{e}' is not {VALID}"))?;
                    if !on.statuses.contains(&rule) {
                        on.statuses.push(rule);
                    }
                }
            }
        }
        Ok(on)
    }

    /// The index among [`Self::statuses`] of the entry that sends an answer of `status`
    /// to another backend: its own code before a class that holds it.
    pub(crate) fn entry_for(&self, status: u16) -> Option<usize> {
        let code = (self.statuses.iter()).position(|r| *r == StatusRule::Code(status));
        code.or_else(|| self.statuses.iter().position(|r| r.takes(status)))
    }
}

fn status_rule(e: &str) -> Option<StatusRule> {
    let b = e.as_bytes();
    if b.len() != 3 || !(b'1'..=b'5').contains(&b[0]) {
        return None;
    }
    if b[1..].eq_ignore_ascii_case(b"xx") {
        return Some(StatusRule::Class(b[0] - b'0'));
    }
    let code: u16 = e.parse().ok()?;
    Some(StatusRule::Code(code))
}

/// When a hedge goes out (`hedge.after`): a fixed delay, or a percentile of the pool's
/// recent answer-head latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum HedgeAfter {
    /// After this long without an answer head.
    Fixed(std::time::Duration),
    /// After the pool's `pNN` (this percentile, above 0 and below 100) of its last
    /// answer heads.
    Percentile(f64),
}

impl HedgeAfter {
    /// Reads `hedge.after`: a duration (`50ms`) or `pNN` (`p95`, `p99.9`).
    pub(crate) fn parse(text: &str) -> Result<HedgeAfter, String> {
        let bad = || format!("'{text}' is neither a duration (50ms) nor a percentile (p95)");
        if let Some(n) = text.strip_prefix('p') {
            let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit() || b == b'.');
            let q: f64 = n.parse().ok().filter(|_| digits).ok_or_else(bad)?;
            return match q > 0.0 && q < 100.0 {
                true => Ok(HedgeAfter::Percentile(q)),
                false => Err(bad()),
            };
        }
        super::values::parse_positive_duration(text)
            .map(HedgeAfter::Fixed)
            .map_err(|_| bad())
    }
}

impl std::fmt::Display for HedgeAfter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HedgeAfter::Fixed(d) => write!(f, "{}", super::values::duration_text(*d)),
            HedgeAfter::Percentile(q) => write!(f, "p{q}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_and_the_code_comes_before_its_class() {
        let on = RetryOn::parse("502, 5xx,503,reset").unwrap();
        assert!(on.reset && !on.timeout);
        assert_eq!(on.entry_for(503), Some(2));
        assert_eq!(on.entry_for(500), Some(1));
        assert_eq!(on.entry_for(502), Some(0));
        assert_eq!(on.entry_for(404), None);
        assert_eq!(on.statuses[1].label(), "5xx");
        assert_eq!(
            RetryOn::parse("connect").unwrap(),
            RetryOn {
                reset: false,
                timeout: false,
                statuses: Vec::new()
            }
        );
    }

    #[test]
    fn anything_else_is_refused_naming_it() {
        for bad in [
            "600", "099", "5x", "6xx", "50", "5000", "", "retry", "+503", "5 3",
        ] {
            let e = RetryOn::parse(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
    }

    #[test]
    fn hedge_after_is_a_duration_or_a_percentile() {
        use std::time::Duration;
        assert_eq!(
            HedgeAfter::parse("50ms").unwrap(),
            HedgeAfter::Fixed(Duration::from_millis(50))
        );
        assert_eq!(
            HedgeAfter::parse("p95").unwrap(),
            HedgeAfter::Percentile(95.0)
        );
        assert_eq!(
            HedgeAfter::parse("p99.9").unwrap(),
            HedgeAfter::Percentile(99.9)
        );
        for bad in [
            "p100", "p0", "p", "p-5", "pfast", "95", "0s", "soon", "p9 5", "pinf",
        ] {
            let e = HedgeAfter::parse(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
    }
}

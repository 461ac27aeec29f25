//! What a backend's answers say about the backend itself: fields meant for fulcrum, not
//! for the client (`docs/architecture.md`, "Where a change goes"). The proxy takes each
//! one off an answer as it reads the head, wherever the head was read (the inline
//! parser or a header map), and hands its value here once; nothing else in the request
//! path knows what the fields mean. A new kind of feedback is one entry in [`OBSERVED`].

use super::{report, Backend};

/// A field of backends' answers that fulcrum keeps for itself.
pub(crate) struct Observed {
    /// Its name, lower case.
    pub(crate) field: &'static str,
    /// What the backend does with its value.
    note: fn(&Backend, &[u8]),
}

/// Every field fulcrum keeps for itself: today the ORCA load report
/// (`docs/strategies.md`, "Reported load").
pub(crate) const OBSERVED: &[Observed] = &[Observed {
    field: report::FIELD,
    note: Backend::note_load_report,
}];

/// How many fields [`OBSERVED`] names: a head keeps one slot for each.
pub(crate) const COUNT: usize = OBSERVED.len();

/// Which of [`OBSERVED`] the field `name` is (any case).
#[inline]
pub(crate) fn which(name: &[u8]) -> Option<usize> {
    OBSERVED
        .iter()
        .position(|o| name.eq_ignore_ascii_case(o.field.as_bytes()))
}

/// Hands the value of the field `which` ([`which`]) to the backend that answered.
pub(crate) fn hand(b: &Backend, which: usize, value: &[u8]) {
    if let Some(o) = OBSERVED.get(which) {
        (o.note)(b, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_report_is_observed_in_any_case() {
        assert_eq!(which(b"Endpoint-Load-Metrics"), Some(0));
        assert_eq!(which(b"endpoint-load-metric"), None);
        assert_eq!(which(b"content-type"), None);
    }
}

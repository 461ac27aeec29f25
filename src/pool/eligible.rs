//! Which backends a strategy may pick (`docs/operations.md`, "Backups and panic mode"):
//! the eligible primaries; the eligible backups when no primary is eligible (HAProxy's
//! `backup` with `allbackups`); and, in panic mode, every primary, healthy or not
//! (Envoy's panic threshold), when too few primaries are eligible and no backup is.

use std::sync::Arc;

use crate::backend::{AdminState, Backend};

/// The set a pool picks from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The eligible primaries (or nothing, when none is and there is no backup).
    Primaries,
    /// No primary is eligible: the eligible backups.
    Backups,
    /// Fewer than the threshold of primaries are eligible and no backup is: every
    /// primary an operator has left active, healthy or not.
    Panic,
}

/// The backends to pick from, in pool order, and how they were chosen; `panic_threshold`
/// is a percentage (0 = never panic).
pub(crate) fn select(backends: &[Arc<Backend>], panic_threshold: u32) -> (Vec<Arc<Backend>>, Mode) {
    let of = |keep: &dyn Fn(&Backend) -> bool| -> Vec<Arc<Backend>> {
        backends.iter().filter(|b| keep(b)).cloned().collect()
    };
    let primaries = of(&|b| !b.backup && b.eligible());
    let total = backends.iter().filter(|b| !b.backup).count();
    // `eligible / total < threshold %`, in integers; never with the threshold at 0.
    let too_few = primaries.len() * 100 < panic_threshold as usize * total;
    if !primaries.is_empty() && !too_few {
        return (primaries, Mode::Primaries);
    }
    let backups = of(&|b| b.backup && b.eligible());
    if primaries.is_empty() && !backups.is_empty() {
        return (backups, Mode::Backups);
    }
    if too_few && backups.is_empty() {
        let active = of(&|b| !b.backup && b.control.state() == AdminState::Active);
        return (active, Mode::Panic);
    }
    (primaries, Mode::Primaries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::backend_spec;

    fn backends(n: usize, backups: usize) -> Vec<Arc<Backend>> {
        (0..n + backups)
            .map(|i| {
                let mut s =
                    backend_spec(&format!("http://127.0.0.1:{}", 3000 + i), None, None).unwrap();
                s.backup = i >= n;
                Arc::new(Backend::new(i as u64, s, 0.1))
            })
            .collect()
    }

    fn ids(v: &[Arc<Backend>]) -> Vec<u64> {
        v.iter().map(|b| b.id).collect()
    }

    #[test]
    fn backups_only_while_no_primary_is_eligible() {
        let b = backends(2, 2);
        let (set, mode) = select(&b, 0);
        assert_eq!((ids(&set), mode), (vec![0, 1], Mode::Primaries));
        b[0].control.set_healthy(false);
        assert_eq!(ids(&select(&b, 0).0), [1]);
        b[1].control.set_healthy(false);
        let (set, mode) = select(&b, 0);
        assert_eq!((ids(&set), mode), (vec![2, 3], Mode::Backups));
        b[1].control.set_healthy(true);
        assert_eq!(
            ids(&select(&b, 0).0),
            [1],
            "a primary back takes it all back"
        );
    }

    #[test]
    fn panic_below_the_threshold_without_backups() {
        let b = backends(4, 0);
        b[0].control.set_healthy(false);
        b[1].control.set_healthy(false);
        // 2 of 4 eligible: 50 % is not below 50 %.
        assert_eq!(select(&b, 50).1, Mode::Primaries);
        b[2].control.set_healthy(false);
        let (set, mode) = select(&b, 50);
        assert_eq!((ids(&set), mode), (vec![0, 1, 2, 3], Mode::Panic));
        assert_eq!(select(&b, 0).1, Mode::Primaries, "0 = off");
        b[3].control.set_state(AdminState::Maintenance);
        assert_eq!(
            ids(&select(&b, 50).0),
            [0, 1, 2],
            "an operator's maintenance holds"
        );
    }

    #[test]
    fn an_eligible_backup_comes_before_panic() {
        let b = backends(2, 1);
        b[0].control.set_healthy(false);
        b[1].control.set_healthy(false);
        assert_eq!(
            (ids(&select(&b, 50).0), select(&b, 50).1),
            (vec![2], Mode::Backups)
        );
        b[2].control.set_healthy(false);
        assert_eq!(select(&b, 50).1, Mode::Panic);
    }
}

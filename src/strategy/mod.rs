//! Balancing strategies.
//!
//! A strategy is a pure function of a [`Snapshot`](crate::pool::Snapshot)'s eligible
//! backends: [`Picker::build`] turns them into a picker holding whatever per-strategy
//! state it needs (the smooth-WRR schedule, a rotation counter). When membership,
//! health, weight or the strategy changes, the pool builds a new picker and swaps it in;
//! nothing holds a strategy across time except the routing table itself. Measurements
//! (in-flight counts, latency averages) live on the [`Backend`], never in a picker, so
//! they survive a switch.

mod least_conn;
mod round_robin;
mod wrr;

use std::sync::Arc;

use crate::pool::Backend;

pub use least_conn::LeastConnections;
pub use round_robin::RoundRobin;
pub use wrr::SmoothWeightedRoundRobin;

/// The strategies fulcrum knows, by canonical name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StrategyKind {
    /// Rotate over eligible backends, ignoring weights.
    RoundRobin,
    /// nginx's smooth weighted round robin.
    WeightedRoundRobin,
    /// Fewest requests in flight, ties to the lowest index.
    LeastConnections,
}

/// Canonical names and their accepted aliases.
const NAMES: &[(StrategyKind, &str, &[&str])] = &[
    (
        StrategyKind::RoundRobin,
        "round_robin",
        &["roundrobin", "round-robin", "rr"],
    ),
    (
        StrategyKind::WeightedRoundRobin,
        "weighted_round_robin",
        &["weighted-round-robin", "wrr"],
    ),
    (
        StrategyKind::LeastConnections,
        "least_connections",
        &["leastconn", "least-connections", "lc"],
    ),
];

impl StrategyKind {
    /// Parses a canonical name or an alias (case-insensitive).
    pub fn parse(s: &str) -> Option<StrategyKind> {
        let s = s.trim().to_ascii_lowercase();
        NAMES
            .iter()
            .find(|(_, canon, aliases)| *canon == s || aliases.contains(&s.as_str()))
            .map(|(k, _, _)| *k)
    }

    /// The canonical snake_case name.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(k, _, _)| *k == self)
            .map(|(_, n, _)| *n)
            .unwrap_or("unknown")
    }

    /// Every canonical name, in a stable order.
    pub fn canonical_names() -> Vec<&'static str> {
        NAMES.iter().map(|(_, n, _)| *n).collect()
    }
}

/// What a pick may depend on besides the snapshot.
#[derive(Debug, Default, Clone, Copy)]
pub struct PickCtx<'a> {
    /// Backend ids already tried for this request (retries go elsewhere).
    pub tried: &'a [u64],
}

impl PickCtx<'_> {
    #[inline]
    fn allows(&self, b: &Backend) -> bool {
        !self.tried.contains(&b.id)
    }
}

/// A strategy's routing state over one set of eligible backends.
#[derive(Debug)]
pub enum Picker {
    /// See [`RoundRobin`].
    RoundRobin(RoundRobin),
    /// See [`SmoothWeightedRoundRobin`].
    WeightedRoundRobin(SmoothWeightedRoundRobin),
    /// See [`LeastConnections`].
    LeastConnections(LeastConnections),
}

impl Picker {
    /// Builds the picker of `kind` over `eligible` (pool order).
    pub fn build(kind: StrategyKind, eligible: &[Arc<Backend>]) -> Picker {
        match kind {
            StrategyKind::RoundRobin => Picker::RoundRobin(RoundRobin::new()),
            StrategyKind::WeightedRoundRobin => {
                let weights: Vec<u32> = eligible
                    .iter()
                    .map(|b| b.effective_weight_whole())
                    .collect();
                Picker::WeightedRoundRobin(SmoothWeightedRoundRobin::new(&weights))
            }
            StrategyKind::LeastConnections => Picker::LeastConnections(LeastConnections),
        }
    }

    /// Carries a round-robin rotation (and a smooth-WRR sequence whose weights did not
    /// change) over from the picker this one replaces, so a pool change does not send
    /// the next requests back to the first backends.
    pub fn continuing(self, previous: Option<&Picker>) -> Picker {
        match (self, previous) {
            (Picker::RoundRobin(_), Some(Picker::RoundRobin(prev))) => {
                Picker::RoundRobin(RoundRobin::starting_at(prev.position()))
            }
            (Picker::WeightedRoundRobin(p), Some(Picker::WeightedRoundRobin(prev))) => {
                Picker::WeightedRoundRobin(p.continuing(prev))
            }
            (p, _) => p,
        }
    }

    /// Picks an index into `eligible`, or `None` when nothing allowed is left.
    #[inline]
    pub fn pick(&self, eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        if eligible.is_empty() {
            return None;
        }
        let first = match self {
            Picker::RoundRobin(p) => p.pick(eligible.len()),
            Picker::WeightedRoundRobin(p) => p.pick(),
            Picker::LeastConnections(_) => return LeastConnections::pick(eligible, ctx),
        };
        if ctx.tried.is_empty() || ctx.allows(&eligible[first]) {
            return Some(first);
        }
        // A retry: the strategy's choice was already tried; take the next untried
        // backend in pool order after it, so retries spread like the rotation does.
        (1..eligible.len())
            .map(|k| (first + k) % eligible.len())
            .find(|&i| ctx.allows(&eligible[i]))
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;
    use crate::config::backend_spec;

    /// Backends named A, B, C… with the given weights.
    pub fn backends(weights: &[u32]) -> Vec<Arc<Backend>> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                let spec = backend_spec(
                    &format!("http://127.0.0.1:{}", 10000 + i),
                    Some(w),
                    Some(&((b'A' + (i % 26) as u8) as char).to_string()),
                )
                .unwrap();
                Arc::new(Backend::new(i as u64, spec, 0.1))
            })
            .collect()
    }

    /// The names of `n` successive picks.
    pub fn sequence(p: &Picker, bs: &[Arc<Backend>], n: usize) -> String {
        (0..n)
            .map(|_| bs[p.pick(bs, &PickCtx::default()).unwrap()].name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases() {
        for (k, canon, aliases) in NAMES {
            assert_eq!(StrategyKind::parse(canon), Some(*k));
            assert_eq!(k.name(), *canon);
            for a in *aliases {
                assert_eq!(StrategyKind::parse(a), Some(*k));
            }
        }
        assert_eq!(StrategyKind::parse("RR"), Some(StrategyKind::RoundRobin));
        assert_eq!(StrategyKind::parse("bogus"), None);
    }

    #[test]
    fn retries_skip_tried_backends() {
        let bs = test_util::backends(&[1, 1, 1]);
        for kind in [
            StrategyKind::RoundRobin,
            StrategyKind::WeightedRoundRobin,
            StrategyKind::LeastConnections,
        ] {
            let p = Picker::build(kind, &bs);
            let tried = [bs[0].id, bs[1].id];
            let ctx = PickCtx { tried: &tried };
            for _ in 0..5 {
                assert_eq!(p.pick(&bs, &ctx), Some(2), "{kind:?}");
            }
            let all = [0, 1, 2];
            assert_eq!(p.pick(&bs, &PickCtx { tried: &all }), None);
        }
    }
}

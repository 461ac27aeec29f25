//! Balancing strategies.
//!
//! A strategy is a pure function of a [`Snapshot`](crate::pool::Snapshot)'s eligible
//! backends: [`Picker::build`] turns them into a picker holding whatever per-strategy
//! state it needs (the smooth-WRR schedule, a rotation counter, a hash ring, a Maglev
//! table). When membership, health, weight or the strategy changes, the pool builds a
//! new picker and swaps it in; nothing holds a strategy across time except the routing
//! table itself. Measurements (in-flight counts, latency averages, peak-EWMA estimates)
//! live on the [`Backend`], never in a picker, so they survive a switch.
//!
//! `docs/strategies.md` explains each strategy's rule, the bet it makes and its cost.

mod bounded;
pub mod estimate;
pub mod key;
mod least_conn;
mod least_time;
mod load_index;
mod maglev;
mod p2c;
mod ramp;
mod reported_load;
mod ring;
mod round_robin;
mod select;
mod weighted_least_conn;
mod wrr;

use std::sync::Arc;

use crate::backend::{clock_ns, Backend};

pub use key::{request_key, KeySource};
pub(crate) use least_conn::LeastConnections;
pub(crate) use least_time::LeastResponseTime;
pub(crate) use load_index::{LoadIndex, LoadSlot};
pub(crate) use maglev::Maglev;
pub(crate) use p2c::{PeakEwma, PowerOfTwo};
pub(crate) use reported_load::ReportedLoad;
pub(crate) use ring::Ring;
pub(crate) use round_robin::RoundRobin;
pub(crate) use weighted_least_conn::WeightedLeastConnections;
pub(crate) use wrr::SmoothWeightedRoundRobin;

pub use crate::config::StrategyKind;

/// Folds one latency sample into the backend's average and into every strategy's
/// estimate, and tells the strategy's index: the one place a sample arrives.
pub fn record_latency(b: &Backend, sample: std::time::Duration) {
    record_latency_at(b, sample, clock_ns());
}

/// [`record_latency`] at `now` ([`clock_ns`]).
pub(crate) fn record_latency_at(b: &Backend, sample: std::time::Duration, now: u64) {
    let elapsed = b.note_latency(sample, now);
    let x = sample.as_nanos() as f64;
    least_time::fold(b, x, elapsed);
    p2c::fold_peak(b, x, elapsed);
    b.refresh_index();
}

impl StrategyKind {
    /// Where a hashing strategy takes its request key from; `None` for the others, whose
    /// requests need no key (so none is computed).
    #[inline]
    pub fn key_source(self) -> Option<KeySource> {
        match self {
            StrategyKind::ConsistentHash | StrategyKind::Maglev => Some(KeySource::Configured),
            StrategyKind::IpHash => Some(KeySource::ClientIp),
            _ => None,
        }
    }
}

/// What a pick may depend on besides the snapshot.
#[derive(Debug, Default, Clone, Copy)]
pub struct PickCtx<'a> {
    /// Backend ids already tried for this request (retries go elsewhere).
    pub tried: &'a [u64],
    /// The request's key for the hashing strategies ([`request_key`]); `None` for the
    /// others (a hashing strategy then uses key 0).
    pub key: Option<u64>,
}

/// Settings a picker is built with.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PickerOptions {
    /// `--hash-balance-factor`: bounded load for the hashing strategies.
    pub hash_balance_factor: Option<f64>,
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
    /// See [`WeightedLeastConnections`].
    WeightedLeastConnections(WeightedLeastConnections),
    /// See [`LeastResponseTime`].
    LeastResponseTime(LeastResponseTime),
    /// See [`PeakEwma`].
    PeakEwma(PeakEwma),
    /// See [`PowerOfTwo`].
    PowerOfTwo(PowerOfTwo),
    /// See [`Ring`] (`consistent_hash` and `ip_hash`), with the balance factor.
    Ring(Arc<Ring>, Option<f64>),
    /// See [`Maglev`], with the balance factor.
    Maglev(Arc<Maglev>, Option<f64>),
    /// See [`ReportedLoad`].
    ReportedLoad(ReportedLoad),
}

impl Picker {
    /// Builds the picker of `kind` over `eligible` (pool order) with default options.
    pub fn build(kind: StrategyKind, eligible: &[Arc<Backend>]) -> Picker {
        Self::build_with(kind, eligible, &PickerOptions::default(), None)
    }

    /// Builds the picker of `kind` over `eligible` with `opts`, going on from `previous`
    /// (the picker it replaces): a rotation continues (see [`Self::continuing`]), and a
    /// hash ring or Maglev table built over the same backends and weights is shared
    /// instead of built again — a republish that changed nothing they depend on (a
    /// slow-start step, say) costs nothing — and a ring over different backends is
    /// derived from the previous one ([`Ring::from_previous`]).
    pub fn build_with(
        kind: StrategyKind,
        eligible: &[Arc<Backend>],
        opts: &PickerOptions,
        previous: Option<&Picker>,
    ) -> Picker {
        let factor = opts.hash_balance_factor;
        let p = match kind {
            // While slow start ramps a backend, the rotation is weighted by the shares.
            StrategyKind::RoundRobin => match ramp::Ramp::of(eligible) {
                Some(r) => Picker::WeightedRoundRobin(
                    SmoothWeightedRoundRobin::new(&r.rotation_weights()).starting_anywhere(),
                ),
                None => Picker::RoundRobin(RoundRobin::new()),
            },
            StrategyKind::WeightedRoundRobin => {
                // While a backend ramps, whole weights on a finer scale: a weight of 1
                // ramping up from 10 % would otherwise round to 1 all along.
                let scale = match ramp::Ramp::of(eligible) {
                    Some(_) => ramp::ROTATION_SCALE,
                    None => 1.0,
                };
                let weights: Vec<u32> = eligible
                    .iter()
                    .map(|b| ((b.effective_weight() * scale).round() as u32).max(1))
                    .collect();
                Picker::WeightedRoundRobin(SmoothWeightedRoundRobin::new(&weights))
            }
            StrategyKind::LeastConnections => {
                Picker::LeastConnections(LeastConnections::new(eligible))
            }
            StrategyKind::WeightedLeastConnections => {
                Picker::WeightedLeastConnections(WeightedLeastConnections::new(eligible))
            }
            StrategyKind::LeastResponseTime => {
                Picker::LeastResponseTime(LeastResponseTime::new(eligible))
            }
            StrategyKind::PeakEwma => Picker::PeakEwma(PeakEwma::new(eligible)),
            StrategyKind::PowerOfTwo => Picker::PowerOfTwo(PowerOfTwo::new(eligible)),
            StrategyKind::ReportedLoad => {
                let previous = match previous {
                    Some(Picker::ReportedLoad(p)) => Some(p),
                    _ => None,
                };
                return Picker::ReportedLoad(ReportedLoad::new(eligible, clock_ns(), previous));
            }
            StrategyKind::ConsistentHash | StrategyKind::IpHash => {
                let ring = match previous {
                    Some(Picker::Ring(r, _)) if r.built_for(&ring::members(eligible)) => {
                        Arc::clone(r)
                    }
                    Some(Picker::Ring(r, _)) => Arc::new(Ring::from_previous(r, eligible)),
                    _ => Arc::new(Ring::new(eligible)),
                };
                return Picker::Ring(ring, factor);
            }
            StrategyKind::Maglev => {
                let table = match previous {
                    Some(Picker::Maglev(t, _)) if t.built_for(&ring::members(eligible)) => {
                        Arc::clone(t)
                    }
                    _ => Arc::new(Maglev::new(eligible)),
                };
                return Picker::Maglev(table, factor);
            }
        };
        p.continuing(previous)
    }

    /// Carries a round-robin rotation (and a smooth-WRR sequence whose weights did not
    /// change) over from the picker this one replaces, so a pool change does not send
    /// the next requests back to the first backends.
    pub(crate) fn continuing(self, previous: Option<&Picker>) -> Picker {
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

    /// Points every backend of the pool at its leaf in this picker's least-loaded index,
    /// or at none (strategies without one, pools too small or too large for one, and
    /// backends not in `eligible`), then brings every leaf up to date: loads that
    /// changed while the index was being built are counted before it is published.
    pub fn attach(&self, all: &[Arc<Backend>], eligible: &[Arc<Backend>]) {
        let index = match self {
            Picker::LeastConnections(p) => p.index(),
            Picker::WeightedLeastConnections(p) => p.index(),
            Picker::LeastResponseTime(p) => p.index(),
            _ => None,
        };
        for b in all {
            b.set_load_watch(None);
        }
        if let Some(index) = index {
            for (leaf, b) in eligible.iter().enumerate() {
                b.set_load_watch(Some(Box::new(LoadSlot {
                    trees: Arc::clone(index),
                    leaf,
                })));
            }
            for (leaf, b) in eligible.iter().enumerate() {
                for t in index.iter() {
                    t.refresh(leaf, b);
                }
            }
        }
    }

    /// Whether it is due to be rebuilt at `now` ([`clock_ns`] time):
    /// `least_response_time` keys idle backends relative to its index's birth and keeps
    /// them precise by being rebuilt every [`least_time::RENEW_AFTER`]; `reported_load`
    /// recomputes its weights from the latest reports every
    /// [`reported_load::REWEIGH_EVERY`].
    pub(crate) fn index_is_old(&self, now: u64) -> bool {
        match self {
            Picker::LeastResponseTime(p) => p.index_is_old(now),
            Picker::ReportedLoad(p) => p.is_due(now),
            _ => false,
        }
    }

    /// The number this strategy ranks `b` by now, as `POST /admin/explain` shows it: the
    /// requests in flight (least connections, power of two), in flight ÷ weight
    /// (weighted least connections), the expected wait in milliseconds (least response
    /// time, peak EWMA; `None` while unsampled) — lower wins — or the weight a weighted
    /// rotation gives it; `None` for the strategies that rank nothing (round robin, the
    /// hashing ones).
    pub(crate) fn score(&self, b: &Backend, now: u64) -> Option<f64> {
        let in_flight = b.in_flight();
        let ms = |ns: f64| ns / 1e6;
        match self {
            Picker::LeastConnections(_) | Picker::PowerOfTwo(_) => Some(in_flight as f64),
            Picker::WeightedLeastConnections(_) => {
                Some(in_flight as f64 / b.effective_weight().max(f64::MIN_POSITIVE))
            }
            Picker::LeastResponseTime(_) => {
                least_time::estimate(b, now, in_flight).map(|e| ms(e * (in_flight + 1) as f64))
            }
            Picker::PeakEwma(_) => Some(ms(p2c::peak_cost(b, now, in_flight))),
            Picker::WeightedRoundRobin(_) => Some(b.effective_weight()),
            Picker::ReportedLoad(p) => p.weight_of(b.id),
            Picker::RoundRobin(_) | Picker::Ring(..) | Picker::Maglev(..) => None,
        }
    }

    /// The ranking strategies' rule: the best of `eligible` that `ctx` allows (the
    /// backends not yielded yet, see [`Candidates`]). The other strategies walk instead.
    #[inline]
    fn rank(&self, eligible: &[Arc<Backend>], ctx: &PickCtx<'_>) -> Option<usize> {
        match self {
            Picker::LeastConnections(p) => p.pick(eligible, ctx),
            Picker::WeightedLeastConnections(p) => p.pick(eligible, ctx),
            Picker::LeastResponseTime(p) => p.pick(eligible, ctx),
            Picker::PeakEwma(p) => p.pick(eligible, ctx),
            Picker::PowerOfTwo(p) => p.pick(eligible, ctx),
            Picker::RoundRobin(_)
            | Picker::WeightedRoundRobin(_)
            | Picker::ReportedLoad(_)
            | Picker::Ring(..)
            | Picker::Maglev(..) => None,
        }
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;
    use crate::config::backend_spec;

    /// Backend `id` at `http://127.0.0.1:PORT` with `weight`.
    pub(crate) fn backend_at(id: u64, port: u16, weight: u32) -> Arc<Backend> {
        let spec = backend_spec(&format!("http://127.0.0.1:{port}"), Some(weight), None).unwrap();
        Arc::new(Backend::new(id, spec, 0.1))
    }

    /// Backends with ids 0, 1, 2… at the given (port, weight) pairs.
    pub(crate) fn pool_of(ports: &[(u16, u32)]) -> Vec<Arc<Backend>> {
        ports
            .iter()
            .enumerate()
            .map(|(i, &(port, w))| backend_at(i as u64, port, w))
            .collect()
    }

    /// Backends named A, B, C… with the given weights.
    pub(crate) fn backends(weights: &[u32]) -> Vec<Arc<Backend>> {
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
    pub(crate) fn sequence(p: &Picker, bs: &[Arc<Backend>], n: usize) -> String {
        (0..n)
            .map(|_| bs[p.pick(bs, &PickCtx::default()).unwrap()].name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::strategy_kind::NAMES;

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
        for (kind, _, _) in NAMES {
            let p = Picker::build(*kind, &bs);
            let tried = [bs[0].id, bs[1].id];
            for key in 0..5u64 {
                let ctx = PickCtx {
                    tried: &tried,
                    key: Some(key.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                };
                assert_eq!(p.pick(&bs, &ctx), Some(2), "{kind:?}");
            }
            let all = [0, 1, 2];
            let ctx = PickCtx {
                tried: &all,
                key: Some(7),
            };
            assert_eq!(p.pick(&bs, &ctx), None, "{kind:?}");
            assert_eq!(p.pick(&[], &PickCtx::default()), None, "{kind:?}");
        }
    }

    #[test]
    fn only_hashing_strategies_need_a_key() {
        for (kind, name, _) in NAMES {
            let hashing = matches!(*name, "consistent_hash" | "ip_hash" | "maglev");
            assert_eq!(kind.key_source().is_some(), hashing, "{name}");
        }
        assert_eq!(StrategyKind::IpHash.key_source(), Some(KeySource::ClientIp));
        assert_eq!(
            StrategyKind::Maglev.key_source(),
            Some(KeySource::Configured)
        );
    }

    #[test]
    fn a_ring_is_shared_by_a_rebuild_over_the_same_backends() {
        let bs = test_util::backends(&[1, 2, 1]);
        let opts = PickerOptions::default();
        for kind in [StrategyKind::ConsistentHash, StrategyKind::Maglev] {
            let a = Picker::build_with(kind, &bs, &opts, None);
            let b = Picker::build_with(kind, &bs, &opts, Some(&a));
            let c = Picker::build_with(kind, &bs[..2], &opts, Some(&b));
            match (&a, &b, &c) {
                (Picker::Ring(a, _), Picker::Ring(b, _), Picker::Ring(c, _)) => {
                    assert!(Arc::ptr_eq(a, b) && !Arc::ptr_eq(b, c))
                }
                (Picker::Maglev(a, _), Picker::Maglev(b, _), Picker::Maglev(c, _)) => {
                    assert!(Arc::ptr_eq(a, b) && !Arc::ptr_eq(b, c))
                }
                _ => panic!("{kind:?}"),
            }
        }
    }
}

//! The lab's seven scenarios (`docs/lab.md`, "Scenarios"): which demo backends, scripted
//! how, what fulcrum is told, and the load.

use std::time::Duration;

use super::{Tweak, Variant};
use crate::strategy::StrategyKind;

/// One of the scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// One of three backends turns ten times slower halfway.
    SlowBackend,
    /// One backend fails half its requests, in bursts.
    Flapping,
    /// Backends of capacity 1 : 2 : 4.
    Heterogeneous,
    /// A cold backend joins halfway and is slow for its first seconds.
    Warmup,
    /// Hashing with a skewed key popularity, with and without bounded load.
    HotKey,
    /// More load than the pool can serve, with a per-backend limit and a queue.
    Overload,
    /// One of four backends starts answering a third of its requests 503, at once.
    Brownout,
    /// A TCP pool: sessions of twenty queries each, over three TCP backends whose every
    /// open connection slows them, one three times slower than the others.
    LongLived,
}

/// Every scenario, by name.
pub(crate) const SCENARIOS: [(Scenario, &str); 8] = [
    (Scenario::SlowBackend, "slow-backend"),
    (Scenario::Flapping, "flapping"),
    (Scenario::Heterogeneous, "heterogeneous"),
    (Scenario::Warmup, "warmup"),
    (Scenario::HotKey, "hot-key"),
    (Scenario::Overload, "overload"),
    (Scenario::Brownout, "brownout"),
    (Scenario::LongLived, "long-lived"),
];

/// The queries each connection of `long-lived` sends, one after the other.
pub(crate) const SESSION_QUERIES: u32 = 20;

/// The success-rate ejection of the `+success_rate` rows: windows of half a second
/// (at 75 requests/s per backend, about 37 answers each), and a factor that one
/// backend of four can reach (one point of n lies at most sqrt(n - 1) deviations from
/// the mean: 1.73 for four).
pub(crate) const SUCCESS_RATE: &str = "interval=500ms,min_hosts=3,min_requests=10,stdev_factor=1.5";

/// The `+hedge` rows' `hedge.after`: about twice a fast backend's answer in
/// `slow-backend`, a fifth of the slow one's.
pub(crate) const HEDGE_AFTER: &str = "25ms";

/// A demo backend as a scenario starts it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BackendPlan {
    pub(crate) name: String,
    /// Its weight in the pool (the weighted strategies read it).
    pub(crate) weight: u32,
    /// fulcrum's `max_conns` for it; 0 = none.
    pub(crate) max_conns: u32,
    /// `fulcrum backend`'s flags: its latency and script.
    pub(crate) args: Vec<String>,
    /// When it joins the pool, if not from the start.
    pub(crate) joins_at: Option<Duration>,
}

fn backend(name: &str, latency_ms: u64, extra: &[&str]) -> BackendPlan {
    // Every backend reports its load: the `reported_load` rows read it.
    let mut args = vec![
        "--latency-ms".to_string(),
        latency_ms.to_string(),
        "--jitter-ms".to_string(),
        (latency_ms / 5).to_string(),
        "--report-load".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    BackendPlan {
        name: name.to_string(),
        weight: 1,
        max_conns: 0,
        args,
        joins_at: None,
    }
}

/// How the keys of the hot-key scenario are drawn: this many, Zipf with this exponent.
pub(crate) const HOT_KEYS: (u32, f64) = (1000, 1.1);

/// How many clients send the requests of every other scenario, each as likely.
pub(crate) const CLIENTS: u32 = 1024;

/// Who sends a scenario's requests, and what a hashing strategy hashes of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Clients {
    /// Keys drawn with a skewed popularity ([`HOT_KEYS`]), each request carrying its key
    /// in `x-lab-key` (the scenario's `hash_key`), from one client address.
    HotKeys(u32, f64),
    /// That many clients, each as likely, each with an address of its own in
    /// `X-Forwarded-For` (fulcrum trusts the lab's own address as a proxy): every
    /// hashing strategy, `ip_hash` too, spreads real clients, not one key.
    Many(u32),
}

/// The balance factor the hot-key scenario compares against none.
pub(crate) const HOT_KEY_FACTOR: f64 = 1.25;

impl Scenario {
    /// The scenario named `name`.
    pub(crate) fn parse(name: &str) -> Option<Scenario> {
        SCENARIOS.iter().find(|(_, n)| *n == name).map(|(s, _)| *s)
    }

    /// Its name.
    pub(crate) fn name(self) -> &'static str {
        SCENARIOS
            .iter()
            .find(|(s, _)| *s == self)
            .map_or("?", |(_, n)| n)
    }

    /// Every name, for error messages.
    pub(crate) fn names() -> Vec<&'static str> {
        SCENARIOS.iter().map(|(_, n)| *n).collect()
    }

    /// Requests per second offered unless `--rps` says otherwise.
    pub(crate) fn default_rps(self) -> u32 {
        match self {
            // Capacity 100 + 200 + 400 = 700 requests/s: 64 % of it.
            Scenario::Heterogeneous => 450,
            // Capacity 3 × 4 slots / 20 ms = 600 requests/s: 1.25 times it, so a fifth
            // must be refused whatever the limit, and each row's refusals show how close
            // it comes to that.
            Scenario::Overload => 750,
            // About 20 requests in flight: enough for bounded load's caps (on requests
            // in flight) to be fine-grained.
            Scenario::HotKey => 1000,
            // Connections per second, of twenty queries each: about 8 open at once.
            Scenario::LongLived => 30,
            _ => 300,
        }
    }

    /// The strategies run unless `--strategies` says otherwise; the hashing ones
    /// alone for hot-key, each without and with bounded load (`ip_hash` too: every
    /// request comes from 127.0.0.1, which shows what hashing the client address does
    /// behind one client).
    pub(crate) fn default_strategies(self) -> Vec<Variant> {
        let every = || {
            crate::strategy::StrategyKind::canonical_names()
                .into_iter()
                .filter_map(StrategyKind::parse)
                .map(Variant::plain)
        };
        let rr = StrategyKind::RoundRobin;
        match self {
            Scenario::HotKey => [
                StrategyKind::ConsistentHash,
                StrategyKind::Maglev,
                StrategyKind::IpHash,
            ]
            .into_iter()
            .flat_map(|k| {
                [
                    Variant::plain(k),
                    Variant::with(k, Tweak::Bounded(HOT_KEY_FACTOR)),
                ]
            })
            .collect(),
            // Every strategy under the fixed limit, then round robin under an adaptive
            // one and under none.
            Scenario::Overload => every()
                .chain([
                    Variant::with(rr, Tweak::AutoLimit),
                    Variant::with(rr, Tweak::NoLimit),
                ])
                .collect(),
            // Round robin and the latency-aware ones, without ejection and with
            // success-rate ejection.
            Scenario::Brownout => [rr, StrategyKind::LeastResponseTime, StrategyKind::PeakEwma]
                .into_iter()
                .flat_map(|k| [Variant::plain(k), Variant::with(k, Tweak::SuccessRate)])
                .collect(),
            // Every strategy, then round robin with hedged requests.
            Scenario::SlowBackend => every().chain([Variant::with(rr, Tweak::Hedge)]).collect(),
            // What counts connections or times them (every connection comes from
            // 127.0.0.1: the hashing ones would send all to one backend).
            Scenario::LongLived => [
                rr,
                StrategyKind::LeastConnections,
                StrategyKind::PowerOfTwo,
                StrategyKind::LeastResponseTime,
                StrategyKind::PeakEwma,
            ]
            .into_iter()
            .map(Variant::plain)
            .collect(),
            _ => every().collect(),
        }
    }

    /// The backends, for a run of `seconds`.
    pub(crate) fn backends(self, seconds: u32) -> Vec<BackendPlan> {
        let half = Duration::from_secs(u64::from(seconds)) / 2;
        let half_text = format!("{}ms", half.as_millis().max(1));
        match self {
            Scenario::SlowBackend => vec![
                backend("b1", 10, &["--max-concurrency", "16"]),
                backend("b2", 10, &["--max-concurrency", "16"]),
                backend(
                    "b3",
                    10,
                    &[
                        "--max-concurrency",
                        "16",
                        "--slow-after",
                        &half_text,
                        "--slow-factor",
                        "10",
                    ],
                ),
            ],
            Scenario::Flapping => vec![
                backend("b1", 10, &[]),
                backend("b2", 10, &["--fail-bursts", "2s"]),
                backend("b3", 10, &[]),
            ],
            Scenario::Heterogeneous => [("b1", 1, "2"), ("b2", 2, "4"), ("b3", 4, "8")]
                .into_iter()
                .map(|(name, weight, slots)| BackendPlan {
                    weight,
                    ..backend(name, 20, &["--max-concurrency", slots])
                })
                .collect(),
            Scenario::Warmup => vec![
                backend("b1", 10, &["--max-concurrency", "16"]),
                backend("b2", 10, &["--max-concurrency", "16"]),
                BackendPlan {
                    joins_at: Some(half),
                    ..backend("b3", 10, &["--max-concurrency", "16", "--cold-for", "3s"])
                },
            ],
            Scenario::HotKey => (1..=4)
                .map(|i| backend(&format!("b{i}"), 20, &["--max-concurrency", "64"]))
                .collect(),
            Scenario::Overload => (1..=3)
                .map(|i| BackendPlan {
                    max_conns: 4,
                    ..backend(&format!("b{i}"), 20, &["--max-concurrency", "4"])
                })
                .collect(),
            Scenario::Brownout => vec![
                backend("b1", 10, &[]),
                backend("b2", 10, &[]),
                backend("b3", 10, &["--brownout-after", &half_text]),
                backend("b4", 10, &[]),
            ],
            Scenario::LongLived => [("b1", 4), ("b2", 4), ("b3", 12)]
                .into_iter()
                .map(|(name, ms)| backend(name, ms, &["--tcp"]))
                .collect(),
        }
    }

    /// What fulcrum is told besides the strategy (option keys and values).
    pub(crate) fn fulcrum_options(self) -> Vec<(&'static str, String)> {
        let mut o = vec![("health_interval", "1s".to_string())];
        if let Clients::Many(_) = self.clients() {
            o.push(("trusted_proxies", "127.0.0.1/32".into()));
        }
        match self {
            Scenario::Warmup => o.push(("slow_start", "5s".into())),
            Scenario::HotKey => o.push(("hash_key", "header:x-lab-key".into())),
            Scenario::Overload => {
                o.push(("max_queue", "64".into()));
                o.push(("queue_timeout", "500ms".into()));
            }
            // Failures in a row off: the rows compare success-rate ejection with none.
            Scenario::Brownout => o.push(("outlier_consecutive_failures", "0".into())),
            _ => {}
        }
        o
    }

    /// Whether its pool is a TCP pool (`docs/tcp.md`): its load is connections, each a
    /// session of [`SESSION_QUERIES`] queries.
    pub(crate) fn tcp(self) -> bool {
        self == Scenario::LongLived
    }

    /// Whether requests carry a key (`x-lab-key`), drawn from [`HOT_KEYS`].
    pub(crate) fn keyed(self) -> bool {
        self == Scenario::HotKey
    }

    /// Who sends the requests (`docs/lab.md`, "How a run works").
    pub(crate) fn clients(self) -> Clients {
        match self {
            Scenario::HotKey => Clients::HotKeys(HOT_KEYS.0, HOT_KEYS.1),
            _ => Clients::Many(CLIENTS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_has_a_name_backends_and_strategies() {
        for (s, name) in SCENARIOS {
            assert_eq!(Scenario::parse(name), Some(s));
            assert_eq!(s.name(), name);
            assert!(s.backends(10).len() >= 3, "{name}");
            assert!(!s.default_strategies().is_empty(), "{name}");
        }
        assert_eq!(Scenario::parse("nope"), None);
        assert_eq!(Scenario::SlowBackend.default_strategies().len(), 12);
        assert_eq!(Scenario::HotKey.default_strategies().len(), 6);
        assert_eq!(Scenario::Overload.default_strategies().len(), 13);
        assert_eq!(Scenario::Brownout.default_strategies().len(), 6);
        let w = Scenario::Warmup.backends(10);
        assert_eq!(w[2].joins_at, Some(Duration::from_secs(5)));
    }
}

//! The strategies' names: the vocabulary the settings, the admin API and the store
//! share. What each strategy does is `strategy/`'s business (`docs/strategies.md`).

/// The strategies fulcrum knows, by canonical name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StrategyKind {
    /// Rotate over eligible backends, ignoring weights.
    RoundRobin,
    /// nginx's smooth weighted round robin.
    WeightedRoundRobin,
    /// Fewest requests in flight, ties to the lowest index.
    LeastConnections,
    /// Lowest in flight ÷ effective weight, ties to the lowest index.
    WeightedLeastConnections,
    /// Lowest latency average × (in flight + 1); unsampled first.
    LeastResponseTime,
    /// Two random choices, lower peak-EWMA cost wins.
    PeakEwma,
    /// Two random choices, fewer in flight wins.
    PowerOfTwo,
    /// Hash ring keyed by `--hash-key`.
    ConsistentHash,
    /// Hash ring keyed by the client IP.
    IpHash,
    /// Maglev table keyed by `--hash-key`.
    Maglev,
    /// Smooth WRR weighted by the load the backends report (ORCA).
    ReportedLoad,
}

/// Canonical names and their accepted aliases.
pub(crate) const NAMES: &[(StrategyKind, &str, &[&str])] = &[
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
    (
        StrategyKind::WeightedLeastConnections,
        "weighted_least_connections",
        &["wlc"],
    ),
    (
        StrategyKind::LeastResponseTime,
        "least_response_time",
        &["least-response-time", "lrt"],
    ),
    (StrategyKind::PeakEwma, "peak_ewma", &["p2c_ewma"]),
    (
        StrategyKind::PowerOfTwo,
        "power_of_two",
        &["p2c", "least_request"],
    ),
    (
        StrategyKind::ConsistentHash,
        "consistent_hash",
        &["consistent-hash", "ch"],
    ),
    (StrategyKind::IpHash, "ip_hash", &["ip-hash"]),
    (StrategyKind::Maglev, "maglev", &[]),
    (
        StrategyKind::ReportedLoad,
        "reported_load",
        &["orca", "reported-load"],
    ),
];

impl StrategyKind {
    /// Parses a canonical name or an alias (case-insensitive).
    pub(crate) fn parse(s: &str) -> Option<StrategyKind> {
        let s = s.trim().to_ascii_lowercase();
        NAMES
            .iter()
            .find(|(_, canon, aliases)| *canon == s || aliases.contains(&s.as_str()))
            .map(|(k, _, _)| *k)
    }

    /// The canonical snake_case name.
    pub(crate) fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(k, _, _)| *k == self)
            .map(|(_, n, _)| *n)
            .unwrap_or("unknown")
    }

    /// Every canonical name, in a stable order.
    pub(crate) fn canonical_names() -> Vec<&'static str> {
        NAMES.iter().map(|(_, n, _)| *n).collect()
    }
}

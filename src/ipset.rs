//! Sets of client addresses (`docs/policies.md`, "Who may come in"): single IPs and
//! CIDRs, IPv4 and IPv6, as the top-level `deny_clients`/`allow_clients` and a route's
//! `allow`/`deny` list them. Kept as sorted, merged ranges per family, so a lookup is a
//! binary search: 10 000 entries cost about as much as 10 (fourteen comparisons against
//! four), and nothing is allocated on the request path.

use std::net::IpAddr;

/// A set of addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct IpSet {
    /// IPv4 ranges `[first, last]`, sorted, disjoint and not adjacent.
    v4: Vec<(u32, u32)>,
    /// For a long IPv4 list: where the ranges of each /16 start ([`Buckets`]).
    buckets: Option<Buckets>,
    /// IPv6 ranges, the same way.
    v6: Vec<(u128, u128)>,
    /// The entries as configured, for the JSON form and messages.
    entries: Vec<String>,
}

impl IpSet {
    /// Reads entries such as `10.0.0.0/8`, `2001:db8::/32` or `192.0.2.7`; the error names
    /// the first bad one.
    pub(crate) fn parse<S: AsRef<str>>(entries: &[S]) -> Result<IpSet, String> {
        let mut set = IpSet::default();
        for e in entries {
            let text = e.as_ref().trim();
            match parse_entry(text)? {
                Range::V4(a, b) => set.v4.push((a, b)),
                Range::V6(a, b) => set.v6.push((a, b)),
            }
            set.entries.push(text.to_string());
        }
        set.v4 = merged(set.v4);
        set.v6 = merged(set.v6);
        set.buckets = (set.v4.len() >= Buckets::FROM)
            .then(|| Buckets::of(&set.v4))
            .flatten();
        Ok(set)
    }

    /// Whether it has no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries as configured.
    pub(crate) fn entries(&self) -> &[String] {
        &self.entries
    }

    /// Whether `ip` is in the set; an IPv4-mapped IPv6 address counts as its IPv4 one.
    #[cfg(test)]
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match canonical(ip) {
            IpAddr::V4(a) => self.holds_v4(u32::from(a)),
            IpAddr::V6(a) => holds(&self.v6, u128::from(a)),
        }
    }

    /// Whether the set holds the IPv4 address `x`.
    #[inline(always)]
    fn holds_v4(&self, x: u32) -> bool {
        match &self.buckets {
            Some(b) => b.holds(&self.v4, x),
            None => holds(&self.v4, x),
        }
    }
}

/// A long IPv4 list's index by the addresses' top 16 bits: `starts[h]` is how many
/// ranges begin before `h.0.0`'s /16 (`h << 16`), so an address is searched for among
/// the ranges that begin in its own /16 and the one before them — usually a handful,
/// whatever the list's length: a lookup in a 10 000-range list costs a few instructions
/// instead of fourteen halvings (`docs/performance.md`, "Who may come in"). 256 KiB,
/// made only for lists of [`Buckets::FROM`] ranges or more.
#[derive(Clone, PartialEq, Eq)]
struct Buckets {
    /// One entry per /16 and one past the last: its length is in its type, so that a
    /// lookup reads `starts[h]` and `starts[h + 1]` without a bounds check.
    starts: std::sync::Arc<[u32; Buckets::LEN]>,
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buckets({} /16s)", self.starts.len().saturating_sub(1))
    }
}

impl Buckets {
    /// Lists this long or longer get an index.
    const FROM: usize = 256;
    /// Every /16, and one past the last.
    const LEN: usize = (1 << 16) + 1;

    /// The index of `ranges` (sorted).
    fn of(ranges: &[(u32, u32)]) -> Option<Buckets> {
        let mut starts = Vec::with_capacity(Buckets::LEN);
        let mut i = 0;
        for h in 0..=(1u64 << 16) {
            let from = h << 16;
            while i < ranges.len() && u64::from(ranges[i].0) < from {
                i += 1;
            }
            starts.push(i as u32);
        }
        let starts: std::sync::Arc<[u32]> = starts.into();
        // One entry per /16 and one more: exactly `LEN` (else no index, and a lookup
        // searches the whole list).
        Some(Buckets {
            starts: starts.try_into().ok()?,
        })
    }

    /// Whether one of `ranges` (those the index was made of) holds `x`.
    #[inline(always)]
    fn holds(&self, ranges: &[(u32, u32)], x: u32) -> bool {
        let h = (x >> 16) as usize;
        let (lo, hi) = (self.starts[h] as usize, self.starts[h + 1] as usize);
        // The ranges that begin in x's /16; the one before them may reach into it.
        let within = ranges.get(lo..hi).unwrap_or_default();
        let i = lo + within.partition_point(|&(first, _)| first <= x);
        i > 0 && ranges.get(i - 1).is_some_and(|r| r.1 >= x)
    }
}

/// Who may come: `deny` wins, then a non-empty `allow` must hold the address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Admission {
    /// Addresses refused.
    pub(crate) deny: IpSet,
    /// Addresses taken when not empty (every other one refused).
    pub(crate) allow: IpSet,
}

impl Admission {
    /// Whether it refuses nobody.
    pub(crate) fn is_open(&self) -> bool {
        self.deny.is_empty() && self.allow.is_empty()
    }

    /// Whether the IPv4 address `x` may come in.
    #[inline(always)]
    pub(crate) fn admits_v4(&self, x: u32) -> bool {
        !self.deny.holds_v4(x) && (self.allow.is_empty() || self.allow.holds_v4(x))
    }

    /// Whether `ip` may come in. The address is made canonical once and each list
    /// searched by its family's number: this runs on every request of a route with a
    /// list (`docs/performance.md`, "Who may come in").
    #[inline(always)]
    pub(crate) fn admits(&self, ip: IpAddr) -> bool {
        match canonical(ip) {
            IpAddr::V4(a) => self.admits_v4(u32::from(a)),
            IpAddr::V6(a) => {
                let x = u128::from(a);
                !holds(&self.deny.v6, x) && (self.allow.is_empty() || holds(&self.allow.v6, x))
            }
        }
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) as the IPv4 address it carries.
#[inline(always)]
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether one of the sorted disjoint `ranges` holds `x`.
#[inline]
fn holds<T: Ord + Copy>(ranges: &[(T, T)], x: T) -> bool {
    // The first range that starts after `x`; the one before it is the only candidate.
    let i = ranges.partition_point(|&(first, _)| first <= x);
    i > 0 && ranges[i - 1].1 >= x
}

enum Range {
    V4(u32, u32),
    V6(u128, u128),
}

/// One entry as the range it covers.
fn parse_entry(text: &str) -> Result<Range, String> {
    let bad =
        || format!("'{text}' is not an IP address or CIDR (such as 10.0.0.0/8 or 2001:db8::/32)");
    let (addr, len) = match text.split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u8>().map_err(|_| bad())?)),
        None => (text, None),
    };
    let ip: IpAddr = addr.parse().map_err(|_| bad())?;
    match canonical(ip) {
        IpAddr::V4(a) => {
            let mapped = matches!(ip, IpAddr::V6(_));
            // A mapped IPv6 prefix counts its first 96 bits as the mapping's.
            let len = match (len, mapped) {
                (None, _) => 32,
                (Some(l), true) if (96..=128).contains(&l) => l - 96,
                (Some(l), false) if l <= 32 => l,
                _ => return Err(bad()),
            };
            let first = u32::from(a) & mask32(len);
            if first != u32::from(a) {
                return Err(format!(
                    "'{text}' has bits set past its prefix length (write {}/{len})",
                    std::net::Ipv4Addr::from(first)
                ));
            }
            Ok(Range::V4(first, first | !mask32(len)))
        }
        IpAddr::V6(a) => {
            let len = len.unwrap_or(128);
            if len > 128 {
                return Err(bad());
            }
            let first = u128::from(a) & mask128(len);
            if first != u128::from(a) {
                return Err(format!(
                    "'{text}' has bits set past its prefix length (write {}/{len})",
                    std::net::Ipv6Addr::from(first)
                ));
            }
            Ok(Range::V6(first, first | !mask128(len)))
        }
    }
}

fn mask32(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

fn mask128(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

/// `ranges` sorted, with overlapping and adjacent ones joined.
fn merged<T: Ord + Copy + num_like::Succ>(mut ranges: Vec<(T, T)>) -> Vec<(T, T)> {
    ranges.sort_unstable();
    let mut out: Vec<(T, T)> = Vec::with_capacity(ranges.len());
    for (first, last) in ranges {
        match out.last_mut() {
            Some(prev) if prev.1.succ().is_none_or(|next| first <= next) => {
                prev.1 = prev.1.max(last);
            }
            _ => out.push((first, last)),
        }
    }
    out
}

/// The next value, for joining adjacent ranges.
mod num_like {
    pub(super) trait Succ: Sized {
        fn succ(self) -> Option<Self>;
    }
    impl Succ for u32 {
        fn succ(self) -> Option<u32> {
            self.checked_add(1)
        }
    }
    impl Succ for u128 {
        fn succ(self) -> Option<u128> {
            self.checked_add(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_prefixes_of_both_families() {
        let set = IpSet::parse(&["10.0.0.0/8", "192.0.2.7", "2001:db8::/32", "::1"]).unwrap();
        for yes in [
            "10.1.2.3",
            "10.255.255.255",
            "192.0.2.7",
            "2001:db8:ffff::1",
            "::1",
            "::ffff:10.9.9.9",
        ] {
            assert!(set.contains(ip(yes)), "{yes}");
        }
        for no in [
            "11.0.0.0",
            "9.255.255.255",
            "192.0.2.8",
            "2001:db9::",
            "::2",
            "0.0.0.0",
        ] {
            assert!(!set.contains(ip(no)), "{no}");
        }
        let everyone = IpSet::parse(&["0.0.0.0/0", "::/0"]).unwrap();
        assert!(everyone.contains(ip("255.255.255.255")) && everyone.contains(ip("ffff::1")));
    }

    #[test]
    fn overlapping_and_adjacent_ranges_are_joined() {
        let set =
            IpSet::parse(&["10.0.0.0/25", "10.0.0.128/25", "10.0.0.0/24", "10.0.2.0/24"]).unwrap();
        assert_eq!(set.v4.len(), 2, "{:?}", set.v4);
        assert!(set.contains(ip("10.0.0.200")) && !set.contains(ip("10.0.1.1")));
    }

    #[test]
    fn deny_wins_then_a_non_empty_allow_list_decides() {
        let a = Admission {
            deny: IpSet::parse(&["10.0.0.5"]).unwrap(),
            allow: IpSet::parse(&["10.0.0.0/8"]).unwrap(),
        };
        assert!(a.admits(ip("10.0.0.4")));
        assert!(!a.admits(ip("10.0.0.5")));
        assert!(!a.admits(ip("192.0.2.1")));
        assert!(Admission::default().admits(ip("192.0.2.1")));
    }

    #[test]
    fn bad_entries_are_named() {
        for bad in [
            "10.0.0.0/33",
            "10.0.0.1/8",
            "fe80::1/129",
            "example.com",
            "10.0.0/8",
            "",
            "::ffff:10.0.0.0/95",
        ] {
            let e = IpSet::parse(&[bad]).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
        assert_eq!(
            IpSet::parse(&["::ffff:10.0.0.0/104"]).unwrap().v4,
            [(0x0a00_0000, 0x0aff_ffff)]
        );
    }

    #[test]
    fn ten_thousand_entries_are_found() {
        let entries: Vec<String> = (0..10_000u32)
            .map(|i| format!("{}/32", std::net::Ipv4Addr::from(0x0b00_0000 + i * 4)))
            .collect();
        let set = IpSet::parse(&entries).unwrap();
        assert!(set.contains(ip("11.0.0.4")) && !set.contains(ip("11.0.0.5")));
        assert!(set.buckets.is_some(), "a long list is indexed");
    }

    proptest::proptest! {
        /// The /16 index answers as the plain search over the same ranges, for ranges
        /// within one /16, across many, and reaching over bucket edges.
        #[test]
        fn the_index_answers_as_the_plain_search(
            ranges in proptest::collection::vec((proptest::num::u32::ANY, 0u32..300_000), 256..600),
            probes in proptest::collection::vec(proptest::num::u32::ANY, 50),
            near in proptest::collection::vec(0usize..600, 50),
        ) {
            let ranges = merged(ranges.iter().map(|&(a, len)| (a, a.saturating_add(len))).collect());
            let b = Buckets::of(&ranges).expect("an index for a long list");
            let edges = near.iter().filter_map(|&i| ranges.get(i % ranges.len()))
                .flat_map(|&(a, z)| [a, z, a.wrapping_sub(1), z.wrapping_add(1)]);
            for x in probes.into_iter().chain(edges) {
                proptest::prop_assert_eq!(b.holds(&ranges, x), holds(&ranges, x), "{}", x);
            }
        }
    }
}

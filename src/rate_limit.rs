//! A route's rate limit (`docs/policies.md`, "Rate limits"): GCRA, one theoretical
//! arrival time per key, in a table that keeps at most `max_keys` keys and forgets the
//! least recently seen first, so a flood of new keys cannot grow memory.
//!
//! Written here rather than taken from a crate: governor's keyed limiter has no bound
//! on its keys (only a `retain_recent` sweep), and a general cache (moka) spends far
//! more per request than the few hundred instructions a limited route may cost. One
//! table is split into shards, each behind its own short lock, so that workers
//! limiting different clients seldom meet.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::Stamp;

use crate::config::policy::RateLimit;
use crate::route::Prehashed;

/// Shards of a table (fewer when `max_keys` is small).
const SHARDS: usize = 16;

/// No slot (the end of the recency list).
const NONE: u32 = u32::MAX;

/// What a request on a limited route is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Whether it may go on.
    pub(crate) allowed: bool,
    /// Requests the key may still send at once.
    pub(crate) remaining: u32,
    /// Seconds until the key's allowance is whole again.
    pub(crate) reset_s: u64,
    /// When refused: seconds until a request would be taken (at least 1).
    pub(crate) retry_after_s: u64,
}

/// A route's limiter.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    /// Nanoseconds between two requests at the steady rate (GCRA's T).
    interval: u64,
    /// How far ahead of now a key's arrival time may run (GCRA's τ: T × burst).
    tolerance: u64,
    /// The configured rate, for `RateLimit-Limit`.
    pub(crate) limit: u32,
    /// The start of every answer's `RateLimit-*` fields, made once: see [`fields_lead`].
    pub(crate) lead: FieldsLead,
    shards: Box<[Mutex<Shard>]>,
}

impl RateLimiter {
    /// A limiter for `spec`, empty.
    pub(crate) fn new(spec: &RateLimit) -> RateLimiter {
        let interval = (spec.per.as_nanos() / u128::from(spec.rate)).max(1) as u64;
        // A power of two: a key's shard is a mask of its bits.
        let n = SHARDS.min(spec.max_keys.next_power_of_two() / 2).max(1);
        // Rounded down: never more than `max_keys` in all.
        let per_shard = spec.max_keys / n;
        RateLimiter {
            interval,
            tolerance: interval.saturating_mul(u64::from(spec.burst)),
            limit: spec.rate,
            lead: fields_lead(spec.rate),
            shards: (0..n).map(|_| Mutex::new(Shard::new(per_shard))).collect(),
        }
    }

    /// Takes a request of `key` (a hash) arriving at `now`.
    pub(crate) fn check(&self, key: u64, now: Stamp) -> Verdict {
        let t = now.ns();
        // The key's high bits pick the shard; the map takes its low bits.
        let shard = &self.shards[(key >> 40) as usize & (self.shards.len() - 1)];
        let mut s = lock(shard);
        let slot = s.slot(key);
        let tat = s.slots[slot].tat.max(t);
        let ahead = tat - t;
        if ahead > self.tolerance {
            let wait = ahead - self.tolerance;
            return Verdict {
                allowed: false,
                remaining: 0,
                reset_s: secs_up(ahead),
                retry_after_s: secs_up(wait).max(1),
            };
        }
        let next = tat + self.interval;
        s.slots[slot].tat = next;
        drop(s);
        let ahead = next - t;
        let remaining = match self.tolerance.checked_sub(ahead) {
            Some(room) => room / self.interval + 1,
            None => 0,
        };
        Verdict {
            allowed: true,
            remaining: remaining.min(u64::from(u32::MAX)) as u32,
            reset_s: secs_up(ahead),
            retry_after_s: 0,
        }
    }

    /// Whether [`Self::check`] would let a request of `key` through at `now`, without
    /// counting it nor keeping the key (`POST /admin/explain`).
    pub(crate) fn would_allow(&self, key: u64, now: Stamp) -> bool {
        let t = now.ns();
        let shard = lock(&self.shards[(key >> 40) as usize & (self.shards.len() - 1)]);
        let tat = match shard.map.get(&key) {
            Some(&i) => shard.slots[i as usize].tat,
            None => 0,
        };
        tat.max(t) - t <= self.tolerance
    }

    /// Keys kept now, in all shards.
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }
}

/// The longest [`FieldsLead`]: both names, a line end and a 10-digit limit.
pub(crate) const LEAD_MAX: usize = 17 + 10 + 23;

/// `ratelimit-limit: LIMIT\r\nratelimit-remaining: `: what the `RateLimit-*` fields of
/// a route's answers start with (the proxy writes the rest), made once per limiter. Kept
/// in a fixed array, so that an answer copies it whole at a length known when compiling
/// (a few register moves, where a copy of a run of unknown length is a `memcpy` call),
/// then keeps `len` bytes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FieldsLead {
    /// The text, then zeros.
    pub(crate) bytes: [u8; LEAD_MAX],
    /// Its length.
    pub(crate) len: u8,
}

/// The [`FieldsLead`] of a limit of `limit`.
pub(crate) fn fields_lead(limit: u32) -> FieldsLead {
    let text = format!("ratelimit-limit: {limit}\r\nratelimit-remaining: ");
    let mut bytes = [0u8; LEAD_MAX];
    let len = text.len().min(LEAD_MAX);
    bytes[..len].copy_from_slice(&text.as_bytes()[..len]);
    FieldsLead {
        bytes,
        len: len as u8,
    }
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // Nothing panics while holding it; a slot is consistent at every step.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whole seconds in `ns`, rounded up.
fn secs_up(ns: u64) -> u64 {
    ns.div_ceil(Duration::from_secs(1).as_nanos() as u64)
}

/// One key's state, linked in recency order.
#[derive(Debug, Clone, Copy)]
struct Slot {
    key: u64,
    /// Theoretical arrival time, in [`Stamp`] nanoseconds.
    tat: u64,
    /// Toward the most recently seen.
    newer: u32,
    /// Toward the least recently seen.
    older: u32,
}

/// A shard: keys to slots, the slots, and their recency list.
#[derive(Debug)]
struct Shard {
    /// Keys are hashes already: passed through, not hashed again.
    map: HashMap<u64, u32, BuildHasherDefault<Prehashed>>,
    slots: Vec<Slot>,
    capacity: usize,
    /// Most recently seen.
    newest: u32,
    /// Least recently seen: the next to go.
    oldest: u32,
}

impl Shard {
    fn new(capacity: usize) -> Shard {
        Shard {
            map: HashMap::default(),
            slots: Vec::new(),
            capacity,
            newest: NONE,
            oldest: NONE,
        }
    }

    /// The slot of `key`, made the newest: found, new, or the oldest's taken over.
    fn slot(&mut self, key: u64) -> usize {
        // The key seen last on this shard (a busy client, or a route's one key) is
        // found without the table, and is the newest already.
        let newest = self.newest as usize;
        if self.slots.get(newest).is_some_and(|s| s.key == key) {
            return newest;
        }
        if let Some(&i) = self.map.get(&key) {
            self.unlink(i);
            self.push_newest(i);
            return i as usize;
        }
        let i = if self.slots.len() < self.capacity {
            self.slots.push(Slot {
                key,
                tat: 0,
                newer: NONE,
                older: NONE,
            });
            (self.slots.len() - 1) as u32
        } else {
            let i = self.oldest;
            self.unlink(i);
            self.map.remove(&self.slots[i as usize].key);
            self.slots[i as usize].key = key;
            self.slots[i as usize].tat = 0;
            i
        };
        self.map.insert(key, i);
        self.push_newest(i);
        i as usize
    }

    fn unlink(&mut self, i: u32) {
        let Slot { newer, older, .. } = self.slots[i as usize];
        match newer {
            NONE => self.newest = older,
            n => self.slots[n as usize].older = older,
        }
        match older {
            NONE => self.oldest = newer,
            o => self.slots[o as usize].newer = newer,
        }
    }

    fn push_newest(&mut self, i: u32) {
        let old_newest = self.newest;
        let s = &mut self.slots[i as usize];
        s.newer = NONE;
        s.older = old_newest;
        match old_newest {
            NONE => self.oldest = i,
            n => self.slots[n as usize].newer = i,
        }
        self.newest = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::policy::LimitKey;

    fn limiter(rate: u32, per_ms: u64, burst: u32, max_keys: usize) -> RateLimiter {
        RateLimiter::new(&RateLimit {
            rate,
            per: Duration::from_millis(per_ms),
            burst,
            key: LimitKey::Route,
            max_keys,
        })
    }

    #[test]
    fn a_burst_then_the_steady_rate() {
        // 10 per second (one per 100 ms) with a burst of 4: five at once, then one per
        // 100 ms.
        let l = limiter(10, 1000, 4, 10);
        let t0 = Stamp::now().after(Duration::from_secs(1));
        let got: Vec<bool> = (0..6).map(|_| l.check(7, t0).allowed).collect();
        assert_eq!(got, [true, true, true, true, true, false]);
        let refused = l.check(7, t0);
        assert_eq!((refused.retry_after_s, refused.remaining), (1, 0));
        assert!(!l.check(7, t0.after(Duration::from_millis(99))).allowed);
        let v = l.check(7, t0.after(Duration::from_millis(100)));
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
        // Another key has its own allowance.
        assert_eq!(l.check(8, t0).remaining, 4);
        // Idle for a second: whole again.
        assert_eq!(l.check(7, t0.after(Duration::from_secs(2))).remaining, 4);
    }

    #[test]
    fn keys_stay_bounded_and_the_least_recently_seen_goes_first() {
        let l = limiter(1, 60_000, 0, 64);
        let t = Stamp::now().after(Duration::from_secs(1));
        assert!(l.check(1, t).allowed);
        assert!(!l.check(1, t).allowed, "one per minute");
        for k in 1000..100_000u64 {
            // Key 1 comes back now and then: it stays, and stays limited.
            if k % 8 == 0 {
                assert!(!l.check(1, t).allowed, "key 1 forgotten at {k}");
            }
            l.check(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), t);
        }
        assert!(l.keys() <= 64, "{} keys", l.keys());
    }
}

//! A pool's members (`docs/architecture.md`, "Membership"). Every source of backends —
//! the config file, the admin API, the store, the spawner — changes a pool through
//! here, and only the backends it owns ([`Source`]). A source that keeps a list hands
//! the pool that list ([`Pool::set_members`]); one that acts a backend at a time adds or
//! removes one ([`Pool::add`], [`Pool::remove`]). Backends are matched by URL: one that
//! stays keeps its id, counters, health, ejection and admin state; a new one joins at
//! the end (ramping up with slow start when asked); one that leaves is taken out, and
//! its requests in flight finish. Every change publishes one routing table.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{
    wake_for_new_slots, AdminState, Backend, BackendView, Event, Members, Pool, PoolError,
};
use crate::backend::{Source, SpawnInfo};
use crate::config::BackendSpec;

/// A backend a source wants in the pool.
#[derive(Debug, Clone)]
pub(crate) struct Wanted {
    /// What it is.
    pub(crate) spec: BackendSpec,
    /// Its id when the source fixes it (the store: the same on every instance); else
    /// a new backend takes the next free one.
    pub(crate) id: Option<u64>,
    /// Its admin state when the source keeps it (the store); else a backend that
    /// stays keeps its own, and a new one is active.
    pub(crate) state: Option<AdminState>,
}

impl Wanted {
    /// `spec`, with an id and an admin state of the pool's choosing.
    pub(crate) fn spec(spec: BackendSpec) -> Wanted {
        Wanted {
            spec,
            id: None,
            state: None,
        }
    }
}

/// How [`Pool::set_members`] applies a list.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Apply {
    /// New backends ramp up with slow start (not at start-up).
    pub(crate) ramp: bool,
    /// The source's backends the list leaves out are removed. A reload first applies
    /// its lists without removing, and removes once the new routes are in force.
    pub(crate) remove_unlisted: bool,
}

/// What a change did.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// Names of the backends that joined.
    pub(crate) added: Vec<String>,
    /// Names of the backends re-weighted, re-stated or replaced.
    pub(crate) updated: Vec<String>,
    /// The backends taken out.
    pub(crate) removed: Vec<Arc<Backend>>,
    /// What was left out, with why: its URL, the id the source gave it, the reason.
    pub(crate) refused: Vec<(String, Option<u64>, String)>,
}

/// A change in the making: gathered under the members lock, told after it.
#[derive(Default)]
struct Outcome {
    changed: bool,
    events: Vec<Event>,
    /// Backends whose `max_conns` changed: (backend, was, now).
    wakes: Vec<(Arc<Backend>, u32, u32)>,
    changes: Changes,
}

impl Pool {
    /// Makes the backends `source` owns in this pool those of `want`, in one published
    /// change (see the module's comment). A backend the admin API added that the list
    /// names passes to `source`; one another source owns, a URL listed twice, or a
    /// name another backend has is refused, and the rest goes on.
    pub(crate) fn set_members(&self, source: Source, want: Vec<Wanted>, how: Apply) -> Changes {
        let mut m = self.lock();
        let mut out = Outcome::default();
        if *self.retired.borrow() {
            return out.changes;
        }
        if how.remove_unlisted {
            let listed: HashSet<&str> = want.iter().map(|w| w.spec.url.as_str()).collect();
            let (stay, go) = std::mem::take(&mut m.backends).into_iter().partition(|b| {
                !owns(source, b.control.source()) || listed.contains(b.url.as_str())
            });
            m.backends = stay;
            for b in go {
                leave(b, &mut out);
            }
        }
        // Positions by URL: a pool of a thousand is matched in linear time.
        let mut at: HashMap<String, usize> = (m.backends.iter().enumerate())
            .map(|(i, b)| (b.url.clone(), i))
            .collect();
        let mut seen = HashSet::new();
        for w in want {
            if !seen.insert(w.spec.url.clone()) {
                refuse(&w, "its URL is listed twice".into(), &mut out);
                continue;
            }
            match at.get(&w.spec.url).copied() {
                Some(i) => self.match_member(&mut m, i, w, source, &mut out),
                None => {
                    if let Some(b) = self.join(&m.backends, w, source, how.ramp, &mut out) {
                        at.insert(b.url.clone(), m.backends.len());
                        m.backends.push(b);
                    }
                }
            }
        }
        self.finish(m, out)
    }

    /// Adds one backend of `source` at the end of the pool (ramping up with slow
    /// start); `spawn` is the process behind a spawned one.
    pub(crate) fn add_from(
        &self,
        source: Source,
        spec: BackendSpec,
        spawn: Option<SpawnInfo>,
    ) -> Result<Arc<Backend>, PoolError> {
        let mut m = self.lock();
        if *self.retired.borrow() {
            return Err(PoolError::Retired(self.name.to_string()));
        }
        if m.backends.iter().any(|b| b.url == spec.url) {
            return Err(PoolError::DuplicateUrl(spec.url));
        }
        if m.backends.iter().any(|b| b.name == spec.name) {
            return Err(PoolError::DuplicateName(spec.name));
        }
        if m.backends.len() >= self.settings.max_backends {
            return Err(PoolError::Full(self.settings.max_backends));
        }
        if let Some(why) = crate::loops::own_backend_now(spec.authority.as_str(), spec.addr) {
            return Err(PoolError::Own(why));
        }
        let b = self.member(self.hub.next_id(), spec, source, spawn);
        self.welcome(&b, None, true, &mut Outcome::default());
        m.backends.push(Arc::clone(&b));
        self.publish(&mut m);
        self.emit(Event::BackendAdded {
            backend: BackendView::of(&b),
        });
        Ok(b)
    }

    /// Adds a backend through the admin API (see [`Self::add_from`]).
    pub(crate) fn add(&self, spec: BackendSpec) -> Result<Arc<Backend>, PoolError> {
        self.add_from(Source::Admin, spec, None)
    }

    /// Removes a backend, whoever owns it; its requests in flight finish (their guards
    /// hold it).
    pub(crate) fn remove(&self, id: u64) -> Result<Arc<Backend>, PoolError> {
        let mut m = self.lock();
        let pos = (m.backends.iter().position(|b| b.id == id)).ok_or(PoolError::NotFound(id))?;
        let b = m.backends.remove(pos);
        let mut out = Outcome::default();
        leave(Arc::clone(&b), &mut out);
        self.finish(m, out);
        Ok(b)
    }

    /// A backend of this pool, not yet in it: its settings, its queue, its source.
    pub(super) fn member(
        &self,
        id: u64,
        spec: BackendSpec,
        source: Source,
        spawn: Option<SpawnInfo>,
    ) -> Arc<Backend> {
        let st = &self.settings;
        let b = crate::backend::Backend::new(id, spec, st.ewma_alpha)
            .in_pool(Arc::clone(&self.name), st, &self.link)
            .with_spawn(spawn);
        b.control.set_source(source);
        Arc::new(b)
    }

    /// Brings the member at `i` to `w`: updated in place, or replaced when what
    /// identifies it changed (its id, its name — which labels metrics and logs —, the
    /// address it is reached at, or whether it is a backup, fixed for a backend's life).
    fn match_member(
        &self,
        m: &mut Members,
        i: usize,
        w: Wanted,
        source: Source,
        out: &mut Outcome,
    ) {
        let b = Arc::clone(&m.backends[i]);
        let owner = b.control.source();
        if !may_take(source, owner) {
            let why = format!("its URL is backend {}'s, which {owner:?} owns", b.id);
            return refuse(&w, why.to_lowercase(), out);
        }
        // Where it is reached: a resolved address, or the URL's IP (`None`: resolved at
        // each connect).
        let reached = (w.spec.addr).or_else(|| w.spec.authority.as_str().parse().ok());
        let moved = reached != b.socket_addr;
        let replace = moved
            || w.id.is_some_and(|id| id != b.id)
            || b.name != w.spec.name
            || b.backup != w.spec.backup;
        if !replace {
            b.control.set_source(source);
            let limit = self.settings.max_conns_of(&w.spec);
            if update(&b, &w.spec, limit, w.state, &mut out.wakes) {
                out.changes.updated.push(b.name.clone());
                out.events.push(Event::BackendUpdated {
                    backend: BackendView::of(&b),
                });
                out.changed = true;
            }
            return;
        }
        self.replace_member(m, i, w, source, out);
    }

    /// Replaces the member at `i` by a new backend for `w` (same URL). One renamed is
    /// another backend to its operator: a new id. One that only moved (a resolved
    /// address) or became or stopped being a backup keeps its id and what the admin
    /// API set; its counters start again.
    fn replace_member(
        &self,
        m: &mut Members,
        i: usize,
        w: Wanted,
        source: Source,
        out: &mut Outcome,
    ) {
        let b = Arc::clone(&m.backends[i]);
        let others = (m.backends.iter()).filter(|x| !Arc::ptr_eq(x, &b));
        if let Some(c) = others.clone().find(|x| x.name == w.spec.name) {
            return refuse(&w, format!("its name is backend {}'s", c.id), out);
        }
        let same = b.name == w.spec.name;
        let id = (w.id).unwrap_or_else(|| if same { b.id } else { self.hub.next_id() });
        let state = w.state.unwrap_or(b.control.state());
        let fresh = self.member(id, w.spec, source, None);
        fresh.control.set_state(state);
        if same {
            fresh.keep_pins_of(&b);
        }
        m.backends[i] = Arc::clone(&fresh);
        out.changes.updated.push(fresh.name.clone());
        out.events.push(Event::BackendRemoved {
            id: b.id,
            backend: b.name.clone(),
        });
        out.events.push(Event::BackendAdded {
            backend: BackendView::of(&fresh),
        });
        out.changed = true;
    }

    /// A new member for `w`, unless its name is taken in `members`.
    fn join(
        &self,
        members: &[Arc<Backend>],
        w: Wanted,
        source: Source,
        ramp: bool,
        out: &mut Outcome,
    ) -> Option<Arc<Backend>> {
        // Rare (a backend joins): a scan is fine.
        if let Some(c) = members.iter().find(|b| b.name == w.spec.name) {
            refuse(&w, format!("its name is backend {}'s", c.id), out);
            return None;
        }
        if let Some(why) = crate::loops::own_backend_now(w.spec.authority.as_str(), w.spec.addr) {
            refuse(&w, why, out);
            return None;
        }
        let id = w.id.unwrap_or_else(|| self.hub.next_id());
        let b = self.member(id, w.spec, source, None);
        self.welcome(&b, w.state, ramp, out);
        Some(b)
    }

    /// Sets a joining backend's admin state and ramp, and notes that it joined.
    fn welcome(&self, b: &Arc<Backend>, state: Option<AdminState>, ramp: bool, out: &mut Outcome) {
        if let Some(s) = state {
            b.control.set_state(s);
        }
        if ramp {
            b.start_ramp(std::time::Instant::now());
        }
        out.changes.added.push(b.name.clone());
        out.events.push(Event::BackendAdded {
            backend: BackendView::of(b),
        });
        out.changed = true;
    }

    /// Publishes what changed, then wakes the queue and tells the events.
    fn finish(&self, mut m: std::sync::MutexGuard<'_, Members>, out: Outcome) -> Changes {
        if out.changed {
            self.publish(&mut m);
        }
        drop(m);
        for (b, was, now) in out.wakes {
            wake_for_new_slots(&b, was, now);
        }
        for e in out.events {
            self.emit(e);
        }
        out.changes
    }
}

/// Notes that `b` left the pool.
fn leave(b: Arc<Backend>, out: &mut Outcome) {
    out.events.push(Event::BackendRemoved {
        id: b.id,
        backend: b.name.clone(),
    });
    out.changes.removed.push(b);
    out.changed = true;
}

/// Notes that `w` was left out, and why.
fn refuse(w: &Wanted, why: String, out: &mut Outcome) {
    (out.changes.refused).push((w.spec.url.clone(), w.id, why));
}

/// Whether a list of `source` speaks for a backend `owner` owns: its own; and, for
/// discovery, whatever any discovery source found (a pool has one `discover` setting;
/// when it changes kind, the new source's list replaces the old one's) and what the
/// file listed before the pool had `discover` (a pool never has both: a reload that put
/// `discover` where a list was leaves the list's backends until discovery's first set).
fn owns(source: Source, owner: Source) -> bool {
    owner == source
        || (source.is_discovered() && (owner.is_discovered() || owner == Source::Config))
}

/// Whether `source` may take a backend `owner` owns over: what the admin API added
/// passes to any source that lists it; discovery and the file take each other's (a
/// reload switched a pool between a list and `discover`, see [`owns`]), and discovery's
/// sources each other's (a pool's `discover` changed kind).
fn may_take(source: Source, owner: Source) -> bool {
    let moving = |s: Source| s.is_discovered() || s == Source::Config;
    owner == source
        || owner == Source::Admin
        || (moving(source) && moving(owner) && (source.is_discovered() || owner.is_discovered()))
}

/// Sets what changed of `b`'s weight, `max_conns` (`limit`: the spec's, or its pool's
/// when the spec sets none) and (when given) admin state; whether anything did. A
/// discovered backend keeps the weight and `max_conns` the admin API set while it stays.
fn update(
    b: &Arc<Backend>,
    spec: &BackendSpec,
    limit: u32,
    state: Option<AdminState>,
    wakes: &mut Vec<(Arc<Backend>, u32, u32)>,
) -> bool {
    use crate::backend::pin;
    let kept = |bit| b.control.source().is_discovered() && b.control.pinned(bit);
    let mut changed = false;
    if b.control.weight() != spec.weight && !kept(pin::WEIGHT) {
        b.control.set_weight(spec.weight);
        changed = true;
    }
    if let Some(s) = state.filter(|s| *s != b.control.state()) {
        b.control.set_state(s);
        changed = true;
    }
    if b.configured_max_conns() != limit && !kept(pin::MAX_CONNS) {
        let was = b.max_conns();
        b.set_max_conns(limit);
        wakes.push((Arc::clone(b), was, b.max_conns()));
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::backend_spec;
    use crate::strategy::StrategyKind;

    fn spec(port: u16, weight: u32) -> BackendSpec {
        backend_spec(&format!("http://127.0.0.1:{port}"), Some(weight), None).unwrap()
    }

    fn stored(id: u64, port: u16, weight: u32, state: AdminState) -> Wanted {
        Wanted {
            spec: spec(port, weight),
            id: Some(id),
            state: Some(state),
        }
    }

    const ALL: Apply = Apply {
        ramp: true,
        remove_unlisted: true,
    };

    #[test]
    fn one_change_makes_the_pool_match_the_list() {
        let p = Pool::of_backends(Vec::new(), StrategyKind::RoundRobin);
        let want = vec![
            stored(10, 2000, 1, AdminState::Active),
            stored(11, 2001, 1, AdminState::Active),
        ];
        assert!(p.set_members(Source::Store, want, ALL).refused.is_empty());
        let ids: Vec<u64> = p.backends().iter().map(|b| b.id).collect();
        assert_eq!(ids, [10, 11]);
        let mut rx = p.hub.subscribe();
        let before = Arc::clone(&p.snapshot());
        let want = vec![
            stored(11, 2001, 5, AdminState::Draining),
            stored(12, 2002, 1, AdminState::Active),
            // The same URL again is left out.
            stored(13, 2002, 1, AdminState::Active),
        ];
        let changes = p.set_members(Source::Store, want.clone(), ALL);
        assert_eq!(changes.refused.len(), 1, "{:?}", changes.refused);
        assert_eq!(changes.refused[0].1, Some(13));
        let bs = p.backends();
        assert_eq!(bs.iter().map(|b| b.id).collect::<Vec<_>>(), [11, 12]);
        assert_eq!(
            (bs[0].control.weight(), bs[0].control.state()),
            (5, AdminState::Draining)
        );
        assert!(!Arc::ptr_eq(&before, &p.snapshot()));
        let events: Vec<Event> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|t| t.event)
            .collect();
        assert_eq!(events.len(), 3, "{events:?}");
        // Nothing to change: nothing published, nothing said.
        let same = Arc::clone(&p.snapshot());
        p.set_members(Source::Store, want[..2].to_vec(), ALL);
        assert!(Arc::ptr_eq(&same, &p.snapshot()));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_source_changes_only_what_it_owns() {
        let p = Pool::of_backends(vec![spec(3000, 1), spec(3001, 1)], StrategyKind::RoundRobin);
        let kept = p.backends()[0].clone();
        kept.control.set_state(AdminState::Draining);
        let added = p.add(spec(3002, 1)).unwrap();
        let spawned = p
            .add_from(
                Source::Spawn,
                spec(3003, 1),
                Some(SpawnInfo::new(3003, 0, 0)),
            )
            .unwrap();
        // The file now lists 3000 (re-weighted) and 3004, not 3001.
        let want = vec![Wanted::spec(spec(3000, 4)), Wanted::spec(spec(3004, 1))];
        let changes = p.set_members(Source::Config, want, ALL);
        let urls: Vec<String> = p.backends().iter().map(|b| b.url.clone()).collect();
        assert_eq!(
            urls,
            [3000, 3002, 3003, 3004].map(|port| format!("http://127.0.0.1:{port}"))
        );
        assert_eq!(changes.removed.len(), 1);
        assert!(
            Arc::ptr_eq(&p.backends()[0], &kept),
            "the same backend stays"
        );
        assert_eq!(
            (kept.control.weight(), kept.control.state()),
            (4, AdminState::Draining)
        );
        assert_eq!(added.control.source(), Source::Admin);
        assert_eq!(spawned.control.source(), Source::Spawn);
        // A file that lists what the admin API added takes it over; a spawned one is
        // not the file's to take.
        let want = vec![
            Wanted::spec(spec(3000, 4)),
            Wanted::spec(spec(3002, 2)),
            Wanted::spec(spec(3003, 1)),
            Wanted::spec(spec(3004, 1)),
        ];
        let changes = p.set_members(Source::Config, want, ALL);
        assert_eq!(added.control.source(), Source::Config);
        assert_eq!(added.control.weight(), 2);
        assert_eq!(changes.refused.len(), 1, "{:?}", changes.refused);
        assert!(
            changes.refused[0].2.contains("spawn"),
            "{:?}",
            changes.refused
        );
        assert_eq!(p.backends().len(), 4);
    }

    #[test]
    fn discovery_keeps_what_the_admin_api_set_and_the_id_of_a_backend_that_moved() {
        let p = Pool::of_backends(Vec::new(), StrategyKind::RoundRobin);
        let at = |ip: &str| {
            let mut s = spec(5000, 1);
            s.addr = Some(format!("{ip}:5000").parse().unwrap());
            s
        };
        p.set_members(Source::Srv, vec![Wanted::spec(at("127.0.0.9"))], ALL);
        let b = p.backends()[0].clone();
        p.update(b.id, Some(7), None, Some(3)).unwrap();
        let mut again = at("127.0.0.9");
        again.weight = 2;
        p.set_members(Source::Srv, vec![Wanted::spec(again)], ALL);
        assert_eq!(
            (b.control.weight(), b.max_conns()),
            (7, 3),
            "the PATCH sticks"
        );
        // The target's address moved: a new backend, with the same id and pins.
        p.set_members(Source::Srv, vec![Wanted::spec(at("127.0.0.10"))], ALL);
        let moved = p.backends()[0].clone();
        assert!(!Arc::ptr_eq(&b, &moved));
        assert_eq!(moved.id, b.id);
        assert_eq!((moved.control.weight(), moved.max_conns()), (7, 3));
        // Another discovery source, then the file, take it over; discovery takes the
        // file's back.
        p.set_members(Source::File, vec![Wanted::spec(at("127.0.0.10"))], ALL);
        assert_eq!(p.backends()[0].control.source(), Source::File);
        let listed = vec![Wanted::spec(spec(5000, 1)), Wanted::spec(spec(5001, 1))];
        p.set_members(Source::Config, listed, ALL);
        assert_eq!(p.backends()[0].control.source(), Source::Config);
        p.set_members(Source::Dns, vec![Wanted::spec(spec(5001, 1))], ALL);
        let left: Vec<(String, Source)> = (p.backends().iter())
            .map(|b| (b.url.clone(), b.control.source()))
            .collect();
        assert_eq!(left, [("http://127.0.0.1:5001".to_string(), Source::Dns)]);
    }

    #[test]
    fn a_list_applied_without_removing_keeps_the_others() {
        let p = Pool::of_backends(vec![spec(4000, 1)], StrategyKind::RoundRobin);
        let keep = Apply {
            ramp: true,
            remove_unlisted: false,
        };
        let changes = p.set_members(Source::Config, vec![Wanted::spec(spec(4001, 1))], keep);
        assert_eq!(changes.added.len(), 1);
        assert_eq!(p.backends().len(), 2);
        let changes = p.set_members(Source::Config, vec![Wanted::spec(spec(4001, 1))], ALL);
        assert_eq!(changes.removed.len(), 1);
        assert_eq!(p.backends().len(), 1);
    }
}

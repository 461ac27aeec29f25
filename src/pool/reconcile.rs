//! A pool made to match a list of backends in one change (fleet mode: the backends the
//! store holds), published as one new routing table.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{wake_for_new_slots, AdminState, Backend, BackendView, Event, Pool};
use crate::config::BackendSpec;

/// A backend the pool should have: its id (the same on every instance), what it is and
/// its admin state.
pub(crate) type Wanted = (u64, BackendSpec, AdminState);

/// What a reconciliation did, gathered under the members lock and told after it.
#[derive(Default)]
struct Outcome {
    changed: bool,
    events: Vec<Event>,
    /// Backends whose `max_conns` changed: (backend, was, now).
    wakes: Vec<(Arc<Backend>, u32, u32)>,
    refused: Vec<(u64, String)>,
}

impl Pool {
    /// Makes the pool's backends those of `want`: backends whose id is not listed
    /// leave, listed ones are re-weighted, re-stated or (if their URL, name or backup
    /// flag changed) replaced, new ones join at the end (ramping up with slow start when
    /// `ramp`). One routing table is published for all of it. A backend whose URL or
    /// name another one has is left out; what was left out is returned, with why.
    pub(crate) fn reconcile(&self, want: &[Wanted], ramp: bool) -> Vec<(u64, String)> {
        let mut m = self.lock();
        let mut out = Outcome::default();
        if *self.retired.borrow() {
            return out.refused;
        }
        drop_unwanted(&mut m.backends, want, &mut out);
        // Positions by id: a pool of a thousand is matched in linear time.
        let mut at_of: HashMap<u64, usize> = m
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| (b.id, i))
            .collect();
        for w in want {
            match at_of.get(&w.0).copied() {
                Some(at) => self.match_member(&mut m.backends[at], w, &mut out),
                None => {
                    if let Some(b) = self.join(&m.backends, w, ramp, &mut out) {
                        at_of.insert(w.0, m.backends.len());
                        m.backends.push(b);
                    }
                }
            }
        }
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
        out.refused
    }

    /// Brings the member in `slot` to `want`: updated in place, or replaced when what
    /// identifies it changed (the same rule as a reload: a name labels metrics, and
    /// being a backup is fixed for a backend's life).
    fn match_member(&self, slot: &mut Arc<Backend>, want: &Wanted, out: &mut Outcome) {
        let (id, spec, state) = want;
        let b = Arc::clone(slot);
        if b.url != spec.url || b.name != spec.name || b.backup != spec.backup {
            let fresh = self.member(*id, spec.clone(), None);
            fresh.set_state(*state);
            *slot = Arc::clone(&fresh);
            out.events.push(Event::BackendRemoved {
                id: *id,
                backend: b.name.clone(),
            });
            out.events.push(Event::BackendAdded {
                backend: BackendView::of(&fresh),
            });
            out.changed = true;
        } else if update(&b, spec, *state, &mut out.wakes) {
            out.events.push(Event::BackendUpdated {
                backend: BackendView::of(&b),
            });
            out.changed = true;
        }
    }

    /// A new member for `want`, unless its URL or name is taken in `members`.
    fn join(
        &self,
        members: &[Arc<Backend>],
        want: &Wanted,
        ramp: bool,
        out: &mut Outcome,
    ) -> Option<Arc<Backend>> {
        let (id, spec, state) = want;
        // Rare (a backend joins): a scan is fine.
        if let Some(c) = members
            .iter()
            .find(|b| b.url == spec.url || b.name == spec.name)
        {
            out.refused
                .push((*id, format!("its URL or name is backend {}'s", c.id)));
            return None;
        }
        let b = self.member(*id, spec.clone(), None);
        b.set_state(*state);
        if ramp {
            b.start_ramp(std::time::Instant::now());
        }
        out.events.push(Event::BackendAdded {
            backend: BackendView::of(&b),
        });
        out.changed = true;
        Some(b)
    }
}

/// Takes the members whose id `want` does not list out of `members`.
fn drop_unwanted(members: &mut Vec<Arc<Backend>>, want: &[Wanted], out: &mut Outcome) {
    let wanted: HashSet<u64> = want.iter().map(|(id, ..)| *id).collect();
    members.retain(|b| {
        let keep = wanted.contains(&b.id);
        if !keep {
            out.events.push(Event::BackendRemoved {
                id: b.id,
                backend: b.name.clone(),
            });
            out.changed = true;
        }
        keep
    });
}

/// Sets what changed of `b`'s weight, state and `max_conns`; whether anything did.
fn update(
    b: &Arc<Backend>,
    spec: &BackendSpec,
    state: AdminState,
    wakes: &mut Vec<(Arc<Backend>, u32, u32)>,
) -> bool {
    let mut changed = false;
    if b.weight() != spec.weight {
        b.set_weight(spec.weight);
        changed = true;
    }
    if b.state() != state {
        b.set_state(state);
        changed = true;
    }
    let was = b.max_conns();
    if was != spec.max_conns {
        b.set_max_conns(spec.max_conns);
        wakes.push((Arc::clone(b), was, spec.max_conns));
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

    #[test]
    fn one_change_makes_the_pool_match_the_list() {
        let p = Pool::of_backends(Vec::new(), StrategyKind::RoundRobin);
        let want = vec![
            (10, spec(2000, 1), AdminState::Active),
            (11, spec(2001, 1), AdminState::Active),
        ];
        assert!(p.reconcile(&want, false).is_empty());
        let ids: Vec<u64> = p.backends().iter().map(|b| b.id).collect();
        assert_eq!(ids, [10, 11]);
        let mut rx = p.hub.subscribe();
        let before = Arc::clone(&p.snapshot());
        let want = vec![
            (11, spec(2001, 5), AdminState::Draining),
            (12, spec(2002, 1), AdminState::Active),
            // The same URL under another id is left out.
            (13, spec(2002, 1), AdminState::Active),
        ];
        let refused = p.reconcile(&want, true);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, 13);
        let bs = p.backends();
        assert_eq!(bs.iter().map(|b| b.id).collect::<Vec<_>>(), [11, 12]);
        assert_eq!((bs[0].weight(), bs[0].state()), (5, AdminState::Draining));
        assert!(!Arc::ptr_eq(&before, &p.snapshot()));
        let events: Vec<Event> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|t| t.event)
            .collect();
        assert_eq!(events.len(), 3, "{events:?}");
        // Nothing to change: nothing published, nothing said.
        let same = Arc::clone(&p.snapshot());
        p.reconcile(&want[..2], true);
        assert!(Arc::ptr_eq(&same, &p.snapshot()));
        assert!(rx.try_recv().is_err());
    }
}

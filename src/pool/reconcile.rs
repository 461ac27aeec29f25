//! A pool made to match a list of backends in one change (fleet mode: the backends the
//! store holds), published as one new routing table.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{wake_for_new_slots, AdminState, Backend, BackendView, Event, Pool};
use crate::config::BackendSpec;

/// A backend the pool should have: its id (the same on every instance), what it is and
/// its admin state.
pub(crate) type Wanted = (u64, BackendSpec, AdminState);

impl Pool {
    /// Makes the pool's backends those of `want`: backends whose id is not listed
    /// leave, listed ones are re-weighted, re-stated or (if their URL, name or backup
    /// flag changed) replaced, new ones join at the end (ramping up with slow start when
    /// `ramp`). One routing table is published for all of it. A backend whose URL or
    /// name another one has is left out; what was left out is returned, with why.
    pub(crate) fn reconcile(&self, want: &[Wanted], ramp: bool) -> Vec<(u64, String)> {
        let mut m = self.lock();
        let mut refused = Vec::new();
        if *self.retired.borrow() {
            return refused;
        }
        let mut events = Vec::new();
        let mut wakes = Vec::new();
        // Sets and maps by id: a pool of a thousand is matched in linear time.
        let wanted: HashSet<u64> = want.iter().map(|(id, ..)| *id).collect();
        let before = m.backends.len();
        m.backends.retain(|b| {
            let keep = wanted.contains(&b.id);
            if !keep {
                events.push(Event::BackendRemoved {
                    id: b.id,
                    backend: b.name.clone(),
                });
            }
            keep
        });
        let mut changed = m.backends.len() != before;
        let mut at_of: HashMap<u64, usize> = m
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| (b.id, i))
            .collect();
        for (id, spec, state) in want {
            match at_of.get(id).copied() {
                Some(at) => {
                    let b = Arc::clone(&m.backends[at]);
                    if b.url != spec.url || b.name != spec.name || b.backup != spec.backup {
                        // The same rule as a reload: a name labels metrics, and being a
                        // backup is fixed for a backend's life.
                        let fresh = self.member(*id, spec.clone(), None);
                        fresh.set_state(*state);
                        m.backends[at] = Arc::clone(&fresh);
                        events.push(Event::BackendRemoved {
                            id: *id,
                            backend: b.name.clone(),
                        });
                        events.push(Event::BackendAdded {
                            backend: BackendView::of(&fresh),
                        });
                        changed = true;
                    } else if update(&b, spec, *state, &mut wakes) {
                        events.push(Event::BackendUpdated {
                            backend: BackendView::of(&b),
                        });
                        changed = true;
                    }
                }
                None => {
                    // Rare (a backend joins): a scan is fine.
                    let clash = m
                        .backends
                        .iter()
                        .find(|b| b.url == spec.url || b.name == spec.name);
                    if let Some(c) = clash {
                        refused.push((*id, format!("its URL or name is backend {}'s", c.id)));
                        continue;
                    }
                    let b = self.member(*id, spec.clone(), None);
                    b.set_state(*state);
                    if ramp {
                        b.start_ramp(std::time::Instant::now());
                    }
                    events.push(Event::BackendAdded {
                        backend: BackendView::of(&b),
                    });
                    at_of.insert(*id, m.backends.len());
                    m.backends.push(b);
                    changed = true;
                }
            }
        }
        if changed {
            self.publish(&mut m);
        }
        drop(m);
        for (b, was, now) in wakes {
            wake_for_new_slots(&b, was, now);
        }
        for e in events {
            self.emit(e);
        }
        refused
    }
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

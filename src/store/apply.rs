//! The store's pools, backends and routes applied to the site in one change
//! (`Site::replace`), keeping what each instance measured: a pool that stays keeps its
//! backends' live numbers, health and ejections; only what the store changed moves.

use std::sync::Arc;

use super::model::Desired;
use crate::pool::{Apply, Pool, Source, Wanted};
use crate::site::{Site, SiteError};

/// Something of the store that could not be applied, with why.
pub(crate) type Refusal = (String, String);

/// Applies `desired` to `site`. `first` is the load at start: backends present then
/// take their full weight at once, as at any start. Returns what was left out.
pub(crate) fn apply(site: &Site, desired: Desired, first: bool) -> Result<Vec<Refusal>, SiteError> {
    let Desired {
        pools,
        routes,
        left_out: mut refused,
        keys,
    } = desired;
    site.replace(
        |before| {
            pools
                .iter()
                .map(|want| {
                    let kept = before.iter().find(|p| {
                        *p.name == *want.spec.name
                            && crate::config::options::pool_restart_required(
                                &p.settings,
                                &want.spec.settings,
                            )
                            .is_empty()
                    });
                    let pool = match kept {
                        Some(p) => {
                            if p.strategy() != want.spec.settings.strategy {
                                p.set_strategy(want.spec.settings.strategy);
                            }
                            p.set_hash_balance_factor(want.spec.settings.hash_balance_factor);
                            p.set_discover(want.spec.discover.as_ref());
                            Arc::clone(p)
                        }
                        // New, or settings fixed for a pool's life changed: a new pool
                        // (the old one finishes its requests in flight).
                        None => {
                            Arc::new(Pool::new(&want.spec, Arc::clone(&site.hub), Source::Store))
                        }
                    };
                    let ramp = !first && kept.is_some();
                    let list = want.backends.iter().map(|(id, spec, state)| Wanted {
                        spec: spec.clone(),
                        id: Some(*id),
                        state: Some(*state),
                    });
                    let how = Apply {
                        ramp,
                        remove_unlisted: true,
                    };
                    let changes = pool.set_members(Source::Store, list.collect(), how);
                    for (url, id, why) in changes.refused {
                        let key = id.and_then(|id| keys.get(&id).cloned());
                        refused.push((key.unwrap_or(url), why));
                    }
                    pool
                })
                .collect()
        },
        routes,
    )?;
    Ok(refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{backend_spec, RouteSpec, Settings};
    use crate::pool::AdminState;
    use crate::store::etcd::Kv;
    use crate::store::model::{DesiredPool, Mirror};
    use std::time::Instant;

    fn desired(n: u16, weight_of_first: u32) -> Desired {
        let top = Settings::default();
        let mut d = Mirror::default().desired(&top);
        d.pools[0].backends = (0..n)
            .map(|i| {
                let w = if i == 0 { weight_of_first } else { 1 };
                let spec = backend_spec(&format!("http://127.0.0.1:{}", 10_000 + i), Some(w), None)
                    .unwrap();
                (u64::from(i) + 1, spec, AdminState::Active)
            })
            .collect();
        d
    }

    #[test]
    fn a_change_keeps_the_pool_and_its_backends() {
        let site = Site::new(&[], &[]).unwrap();
        apply(&site, desired(3, 1), true).unwrap();
        let pool = site.first().unwrap();
        let b1 = pool.get(1).unwrap();
        apply(&site, desired(3, 7), false).unwrap();
        let same = site.first().unwrap();
        assert!(Arc::ptr_eq(&pool, &same), "the pool stays");
        assert!(Arc::ptr_eq(&b1, &same.get(1).unwrap()), "the backend stays");
        assert_eq!(b1.control.weight(), 7);
        assert_eq!(site.routing().routes, vec![RouteSpec::catch_all("default")]);
        let gone: DesiredPool = desired(0, 1).pools.remove(0);
        let mut d = desired(0, 1);
        d.pools = vec![gone];
        apply(&site, d, false).unwrap();
        assert!(site.first().unwrap().backends().is_empty());
    }

    /// `docs/performance.md`, "Fleet mode": one backend changed in a pool of 1 000, as
    /// a watched change takes it: into the mirror, the desired site, applied.
    #[test]
    fn one_backend_changed_in_a_pool_of_a_thousand() {
        let top = Settings::default();
        let mut mirror = Mirror::default();
        let kv = |name: &str, port: u32, weight: u32, rev: i64| Kv {
            key: format!("backends/default/{name}"),
            value: format!(
                r#"{{"url": "http://127.0.0.1:{port}", "name": "{name}", "weight": {weight}}}"#
            )
            .into_bytes(),
            mod_revision: rev,
            create_revision: rev,
        };
        for i in 0..1000 {
            let b = kv(&format!("b{i}"), 10_000 + i, 1, i64::from(i) + 1);
            mirror.put(&b.key.clone(), &b).unwrap();
        }
        let site = Site::new(&[], &[]).unwrap();
        apply(&site, mirror.desired(&top), true).unwrap();
        let mut best = std::time::Duration::MAX;
        for w in 2..12 {
            let t = Instant::now();
            let mut b = kv("b0", 10_000, w, 1);
            b.mod_revision = 2000 + i64::from(w);
            mirror.put(&b.key.clone(), &b).unwrap();
            apply(&site, mirror.desired(&top), false).unwrap();
            best = best.min(t.elapsed());
        }
        let pool = site.first().unwrap();
        assert_eq!(pool.backends().len(), 1000);
        assert_eq!(pool.get(1).unwrap().control.weight(), 11);
        println!("one backend changed in a pool of 1000: applied in {best:?} (best of 10)");
    }
}

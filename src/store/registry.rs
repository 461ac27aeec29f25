//! The instance registry: each instance keeps `PREFIX/instances/ID` (its id, listen
//! address and the revision it applied) alive with a lease, so an instance that dies
//! leaves the registry when its lease runs out (`docs/fleet.md`, "The registry").

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::etcd::StoreError;
use super::fleet::Fleet;
use super::model::{Instance, INSTANCES};

/// How long an entry outlives its instance.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(5);

/// Keeps this instance registered until `stop` flips; then takes its entry out.
pub(crate) async fn run(fleet: Arc<Fleet>, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        match keep_registered(&fleet, &mut stop).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(error = ?e, "store: registry entry not kept");
                fleet.lost.notify_waiters();
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One lease's life: granted, renewed every third of its time, the entry written again
/// whenever the applied revision moves; revoked at the end.
async fn keep_registered(
    fleet: &Fleet,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), StoreError> {
    let lease = fleet.etcd.grant_lease(LEASE_TTL).await?;
    let key = fleet.key(&format!("{INSTANCES}{}", fleet.id));
    let mut seen = fleet.seen_changes();
    let mut renew = tokio::time::interval(LEASE_TTL / 3);
    let mut written = None;
    loop {
        let applied = fleet.applied();
        if written != Some(applied) {
            let me = Instance {
                id: fleet.id.clone(),
                listen: fleet.listen.clone(),
                revision: applied,
            };
            let value = serde_json::to_vec(&me).unwrap_or_default();
            fleet.etcd.put_with_lease(&key, &value, lease).await?;
            written = Some(applied);
        }
        tokio::select! {
            _ = renew.tick() => fleet.etcd.keep_alive(lease).await?,
            _ = seen.changed() => {}
            _ = stop.changed() => {
                let _ = fleet.etcd.revoke_lease(lease).await;
                return Ok(());
            }
        }
    }
}

//! The pool's upkeep, apart from the health prober: acts on the outlier news the request
//! path leaves on its backends (an ejection asked for, a trial passed) as soon as a
//! backend rings, compares its backends' success rates at the end of every window when
//! the pool judges them, and on every tick moves the adaptive connection limits, ends ejections whose time is up (the backend turns
//! half-open), advances slow-start ramps, and renews a least-response-time index that
//! has grown old. Each of these changes what the request path may pick, so each
//! publishes a new routing table when it changes anything.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Pool;

/// How often the upkeep runs: the precision of an ejection's end and of a ramp's steps.
pub(crate) const TICK: Duration = Duration::from_millis(25);

/// Runs the upkeep of `pool` every [`TICK`] until `stop` flips or the pool is removed.
pub(crate) async fn run(pool: Arc<Pool>, mut stop: watch::Receiver<bool>) {
    let mut retired = pool.retired();
    let news = pool.outlier_news();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Success-rate windows, when the pool judges them: the first ends one interval in.
    let mut windows = pool.settings.outlier.success_rate.map(|sr| {
        let start = tokio::time::Instant::now() + sr.interval;
        tokio::time::interval_at(start, sr.interval)
    });
    loop {
        let window_over = async {
            match windows.as_mut() {
                Some(w) => w.tick().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = news.notified() => pool.settle_outliers(),
            _ = window_over => pool.settle_success_rates(),
            _ = tick.tick() => {
                pool.end_due_ejections();
                pool.refresh_ramps();
                pool.renew_index();
                pool.adjust_limits();
            }
            _ = stop.changed() => return,
            _ = retired.wait_for(|r| *r) => return,
        }
    }
}

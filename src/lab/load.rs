//! The lab's load (`docs/lab.md`, "How a run works"): an open-loop schedule made from
//! the seed, the same for every strategy, and the driver that sends each request at
//! its time whatever the answers before it, timing each from that time. A closed loop
//! (send the next when the last is answered) slows down with the server and hides the
//! queueing a slow backend causes; an open loop shows it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use super::scenario::Clients;
use super::Phase;

/// A request's longest wait for its answer: beyond it, it counts as an error.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// When each request is sent, from the start, and its key (its client, or its hot
/// key).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Schedule {
    pub(crate) sends: Vec<(Duration, u32)>,
    /// Who sends them.
    pub(crate) clients: Clients,
}

impl Schedule {
    /// Poisson arrivals at `rps` for `seconds`, from `seed`; each request's key drawn
    /// as `clients` says: a hot key by its popularity, or one client of many.
    pub(crate) fn new(rps: u32, seconds: u32, seed: u64, clients: Clients) -> Schedule {
        let mut rng = fastrand::Rng::with_seed(seed);
        let zipf = match clients {
            Clients::HotKeys(n, s) => Some(zipf_cdf(n, s)),
            Clients::Many(_) => None,
        };
        let end = f64::from(seconds);
        let mut t = 0.0;
        let mut sends = Vec::with_capacity((rps * seconds) as usize);
        loop {
            // Exponential gaps: 1 - u is in (0, 1], so its logarithm is finite.
            t += -(1.0 - rng.f64()).ln() / f64::from(rps);
            if t >= end {
                break;
            }
            let key = match (&zipf, clients) {
                (Some(cdf), _) => {
                    let u = rng.f64();
                    cdf.partition_point(|&c| c < u) as u32
                }
                (None, Clients::Many(n)) => rng.u32(0..n.max(1)),
                (None, Clients::HotKeys(..)) => 0,
            };
            sends.push((Duration::from_secs_f64(t), key));
        }
        Schedule { sends, clients }
    }
}

/// The cumulative distribution of `n` keys whose popularity falls as `1 / rank^s`.
fn zipf_cdf(n: u32, s: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / f64::from(k).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = weights
        .iter()
        .map(|w| {
            acc += w / total;
            acc
        })
        .collect();
    // Rounding can leave the sum a hair under 1: a draw above it would find no key.
    if let Some(last) = cdf.last_mut() {
        *last = 1.0;
    }
    cdf
}

/// One request's outcome.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    /// When it was scheduled, from the start.
    pub(crate) at: Duration,
    /// From its scheduled time to the end of its answer (or the timeout).
    pub(crate) latency: Duration,
    /// Answered 2xx.
    pub(crate) ok: bool,
    /// The backend that answered, from the demo backend's JSON.
    pub(crate) backend: Option<String>,
    /// Its key.
    pub(crate) key: u32,
}

/// How often the driver reports its progress.
const TICK: Duration = Duration::from_millis(250);

/// Sends `schedule`, from `start` on, to the proxy at `target` (127.0.0.1 only) and
/// returns every request's outcome; `tick` hears the phase and the elapsed time as the
/// run goes, the last answers' wait included. `None` when the lab was asked to stop:
/// the requests in flight are abandoned.
pub(crate) async fn drive(
    target: SocketAddr,
    schedule: &Schedule,
    start: Instant,
    tick: &mut dyn FnMut(Phase, Duration),
) -> Result<Option<Vec<Sample>>, String> {
    if target.ip() != std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST) {
        return Err(format!(
            "the lab sends traffic to 127.0.0.1 only, not {target}"
        ));
    }
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build_http();
    let uri: http::Uri = format!("http://{target}/lab")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let each = |at, key, tx: Samples| {
        let (client, uri) = (client.clone(), uri.clone());
        let who = From::from((schedule.clients, key));
        async move {
            let sent = start + at;
            let (ok, backend) = one(&client, uri, who).await;
            let _ = tx.send(Sample {
                at,
                latency: sent.elapsed(),
                ok,
                backend,
                key,
            });
        }
    };
    Ok(run_schedule(schedule, start, schedule.sends.len(), tick, each).await)
}

/// Where a send's task puts its samples.
pub(super) type Samples = tokio::sync::mpsc::UnboundedSender<Sample>;

/// Starts `each` for every send of `schedule` at its time (from `start`), on a task of
/// its own, and gathers the samples they give (about `expected`); `None` when the lab
/// was asked to stop: the tasks still running are dropped.
pub(super) async fn run_schedule<F, Fut>(
    schedule: &Schedule,
    start: Instant,
    expected: usize,
    tick: &mut dyn FnMut(Phase, Duration),
    mut each: F,
) -> Option<Vec<Sample>>
where
    F: FnMut(Duration, u32, Samples) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut in_flight = tokio::task::JoinSet::new();
    let mut last_tick = Duration::ZERO;
    for &(at, key) in &schedule.sends {
        tokio::time::sleep_until(start + at).await;
        if super::stopping() {
            return None;
        }
        if at - last_tick >= TICK {
            last_tick = at;
            tick(Phase::Load, at);
        }
        while in_flight.try_join_next().is_some() {}
        in_flight.spawn(each(at, key, tx.clone()));
    }
    drop(tx);
    collect(rx, expected, start, tick).await
}

/// Gathers the samples the senders of `rx` send until the last is gone, telling `tick`
/// the drain goes on; `None` when the lab was asked to stop meanwhile.
async fn collect(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Sample>,
    expected: usize,
    start: Instant,
    tick: &mut dyn FnMut(Phase, Duration),
) -> Option<Vec<Sample>> {
    let mut out = Vec::with_capacity(expected);
    let mut every = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            s = rx.recv() => match s {
                Some(s) => out.push(s),
                None => break,
            },
            _ = every.tick() => {
                if super::stopping() {
                    return None;
                }
                tick(Phase::Draining, start.elapsed());
            }
        }
    }
    out.sort_by_key(|s| s.at);
    Some(out)
}

/// The field that says who sends a request: its hot key, or its client's address.
struct Sender(&'static str, String);

impl From<(Clients, u32)> for Sender {
    fn from((clients, key): (Clients, u32)) -> Sender {
        match clients {
            Clients::HotKeys(..) => Sender("x-lab-key", key.to_string()),
            Clients::Many(_) => {
                let [_, a, b, c] = key.to_be_bytes();
                Sender("x-forwarded-for", format!("10.{a}.{b}.{c}"))
            }
        }
    }
}

/// One request: whether it was answered 2xx, and by which backend.
async fn one(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    uri: http::Uri,
    who: Sender,
) -> (bool, Option<String>) {
    let req = http::Request::get(uri).header(who.0, who.1);
    let Ok(req) = req.body(Empty::new()) else {
        return (false, None);
    };
    let exchange = async {
        let resp = client.request(req).await.ok()?;
        let ok = resp.status().is_success();
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        Some((ok, backend_of(&body)))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
        Ok(Some(r)) => r,
        _ => (false, None),
    }
}

/// The `backend` field of the demo backend's answer, `{"backend":"b1",…}`.
fn backend_of(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let rest = text.split_once("\"backend\":\"")?.1;
    Some(rest.split('"').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_makes_the_same_schedule_and_keys_follow_zipf() {
        let hot = Clients::HotKeys(100, 1.1);
        let a = Schedule::new(200, 5, 7, hot);
        assert_eq!(a, Schedule::new(200, 5, 7, hot));
        assert_ne!(a, Schedule::new(200, 5, 8, hot));
        let n = a.sends.len() as f64;
        assert!((900.0..1100.0).contains(&n), "{n}");
        assert!(a.sends.windows(2).all(|w| w[0].0 <= w[1].0));
        let first = a.sends.iter().filter(|(_, k)| *k == 0).count() as f64;
        // Rank 1 of 100 with s = 1.1 is about 19 % of the draws.
        assert!((0.14..0.25).contains(&(first / n)), "{}", first / n);
        assert_eq!(
            backend_of(br#"{"backend":"b2","method":"GET"}"#),
            Some("b2".into())
        );
    }
}

//! SRV and A/AAAA lookups with hickory-resolver (`docs/discovery.md`): the resolver
//! asks the servers of `resolvers` (or of `/etc/resolv.conf`) itself, on the control
//! runtime, with no thread of the system resolver, and gives each answer's TTL.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use hickory_resolver::config::{
    NameServerConfig, NameServerConfigGroup, ResolveHosts, ResolverConfig,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::{Resolver, TokioResolver};

use crate::config::discover::{DiscoverSpec, MIN_INTERVAL};
use crate::config::{backend_spec, BackendSpec, MAX_WEIGHT};

/// How long one server may take to answer one query.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// What a lookup found: the backends, and how long the answer holds.
#[derive(Debug)]
pub(super) struct Found {
    /// One per record (SRV) or address (A/AAAA), in a stable order.
    pub(super) backends: Vec<BackendSpec>,
    /// The smallest TTL of the records it took, clamped to [1 s, interval].
    pub(super) valid_for: Duration,
}

/// A resolver for `servers` (none: those of `/etc/resolv.conf`) that caches nothing
/// past `interval`: every lookup after a TTL ran out asks a server again.
pub(super) fn resolver(
    servers: &[SocketAddr],
    interval: Duration,
) -> Result<TokioResolver, String> {
    let mut b = if servers.is_empty() {
        Resolver::builder_tokio().map_err(|e| format!("cannot read /etc/resolv.conf: {e}"))?
    } else {
        let mut group = NameServerConfigGroup::new();
        for a in servers {
            // UDP first; TCP when an answer is truncated.
            group.push(NameServerConfig::new(*a, Protocol::Udp));
            group.push(NameServerConfig::new(*a, Protocol::Tcp));
        }
        let config = ResolverConfig::from_parts(None, Vec::new(), group);
        let mut b = Resolver::builder_with_config(config, TokioConnectionProvider::default());
        // Named servers answer alone: /etc/hosts is not theirs.
        b.options_mut().use_hosts_file = ResolveHosts::Never;
        b
    };
    let o = b.options_mut();
    o.timeout = QUERY_TIMEOUT;
    o.attempts = 1;
    o.positive_max_ttl = Some(interval);
    o.negative_max_ttl = Some(MIN_INTERVAL);
    Ok(b.build())
}

/// Looks `spec`'s SRV name or host up.
pub(super) async fn lookup(r: &TokioResolver, spec: &DiscoverSpec) -> Result<Found, String> {
    use crate::config::discover::Target;
    match &spec.target {
        Target::Srv(name) => srv(r, name, spec).await,
        Target::Dns { host, port } => a_and_aaaa(r, host, *port, spec).await,
        Target::File(_) => Err("a file is not looked up".into()),
    }
}

/// One backend per SRV record: `SCHEME://TARGET:PORT`, connected at the target's
/// address; the lowest priority value's records are primaries, the others backups. A
/// target of `.` ("no such service here", RFC 2782) is no record; a target without an
/// address fails the lookup (never a partial set).
async fn srv(r: &TokioResolver, name: &str, spec: &DiscoverSpec) -> Result<Found, String> {
    let answer = (r.srv_lookup(name).await).map_err(|e| format!("SRV {name}: {e}"))?;
    let mut records: Vec<_> = (answer.iter())
        .filter(|s| !s.target().is_root())
        .cloned()
        .collect();
    // One backend per target and port: of a pair listed twice, the lower priority.
    records.sort_by_key(|s| (s.target().to_ascii(), s.port(), s.priority()));
    records.dedup_by(|a, b| a.target() == b.target() && a.port() == b.port());
    let Some(lowest) = records.iter().map(|s| s.priority()).min() else {
        return Err(format!("SRV {name}: no records"));
    };
    let targets = records.iter().map(|rec| async move {
        let host = rec.target().to_ascii();
        let host = host.trim_end_matches('.').to_string();
        let found = addresses(r, &host).await;
        (host, found)
    });
    let mut until = answer.as_lookup().valid_until();
    let mut backends = Vec::with_capacity(records.len());
    for (rec, (host, found)) in records.iter().zip(join_all(targets).await) {
        let (ips, valid) = found.map_err(|e| format!("SRV {name}: target {e}"))?;
        until = until.min(valid);
        let url = format!("{}://{host}:{}", spec.scheme(), rec.port());
        let weight = u32::from(rec.weight()).clamp(1, MAX_WEIGHT);
        let mut b = backend_spec(&url, Some(weight), None)
            .map_err(|e| format!("SRV {name}: record {host}:{}: {e}", rec.port()))?;
        b.backup = rec.priority() != lowest;
        // The lowest address: an answer in another order does not move the backend.
        b.addr = Some(SocketAddr::new(ips[0], rec.port()));
        backends.push(b);
    }
    backends.sort_by(|a, b| a.url.cmp(&b.url));
    Ok(Found {
        backends,
        valid_for: clamp(until, spec.interval),
    })
}

/// Every address of `host`, sorted (never empty), and when the answer runs out. A and
/// AAAA are asked apart: a family that fails (a timeout, SERVFAIL) fails the lookup,
/// where a combined lookup would give the other family alone and so drop half the
/// backends; a family with no record is empty.
async fn addresses(r: &TokioResolver, host: &str) -> Result<(Vec<IpAddr>, Instant), String> {
    let (v4, v6) = tokio::join!(r.ipv4_lookup(host), r.ipv6_lookup(host));
    let mut ips = Vec::new();
    let mut until: Option<Instant> = None;
    match v4 {
        Ok(l) => {
            ips.extend(l.iter().map(|a| IpAddr::V4(a.0)));
            until = Some(l.valid_until());
        }
        Err(e) if e.is_no_records_found() => {}
        Err(e) => return Err(format!("{host} (A): {e}")),
    }
    match v6 {
        Ok(l) => {
            ips.extend(l.iter().map(|a| IpAddr::V6(a.0)));
            let v = l.valid_until();
            until = Some(until.map_or(v, |u| u.min(v)));
        }
        Err(e) if e.is_no_records_found() => {}
        Err(e) => return Err(format!("{host} (AAAA): {e}")),
    }
    ips.sort();
    ips.dedup();
    match until {
        Some(until) if !ips.is_empty() => Ok((ips, until)),
        _ => Err(format!("{host}: no address")),
    }
}

/// One backend per A or AAAA address of `host`: `SCHEME://ADDRESS:PORT`.
async fn a_and_aaaa(
    r: &TokioResolver,
    host: &str,
    port: u16,
    spec: &DiscoverSpec,
) -> Result<Found, String> {
    let (ips, until) = addresses(r, host).await?;
    let backends = ips
        .iter()
        .map(|ip| {
            let url = format!("{}://{}", spec.scheme(), SocketAddr::new(*ip, port));
            backend_spec(&url, None, None).map_err(|e| format!("{host}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Found {
        backends,
        valid_for: clamp(until, spec.interval),
    })
}

/// The time left until `until`, clamped to [1 s, `interval`].
fn clamp(until: Instant, interval: Duration) -> Duration {
    (until.saturating_duration_since(Instant::now())).clamp(MIN_INTERVAL, interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_is_clamped_to_one_second_and_the_interval() {
        let now = Instant::now();
        let i = Duration::from_secs(30);
        assert_eq!(clamp(now, i), MIN_INTERVAL);
        assert_eq!(clamp(now + Duration::from_secs(3600), i), i);
        let d = clamp(now + Duration::from_secs(10), i);
        assert!(
            d > Duration::from_secs(9) && d <= Duration::from_secs(10),
            "{d:?}"
        );
    }
}

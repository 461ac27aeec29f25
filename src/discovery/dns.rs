//! SRV and A/AAAA lookups with hickory-resolver (`docs/discovery.md`): the resolver
//! asks the servers of `resolvers` (or of `/etc/resolv.conf`) itself, on the control
//! runtime, with no thread of the system resolver, and gives each answer's TTL.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hickory_resolver::config::{
    NameServerConfig, NameServerConfigGroup, ResolveHosts, ResolverConfig,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::op::{Edns, Message, Query, ResponseCode};
use hickory_resolver::proto::rr::rdata::SRV;
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::{Resolver, TokioResolver};

use crate::config::discover::{DiscoverSpec, MIN_INTERVAL};
use crate::config::{backend_spec, BackendSpec, MAX_WEIGHT};

/// How long one server may take to answer one query.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Tries of one query before it counts as failed (hickory's `attempts` counts the
/// retries after the first).
const TRIES: usize = 2;

/// SRV targets looked up at once: a burst of hundreds of queries is more than a small
/// resolver (dnsmasq's default of 150 forwarded queries) answers.
const TARGETS_AT_ONCE: usize = 16;

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
    o.attempts = TRIES - 1;
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
/// target of `.` ("no such service here", RFC 2782) or a port of 0 is no record; a
/// target without an address fails the lookup (never a partial set). Addresses the
/// answer's additional section gives are taken as they are; the other targets are
/// looked up, [`TARGETS_AT_ONCE`] at a time.
async fn srv(r: &TokioResolver, name: &str, spec: &DiscoverSpec) -> Result<Found, String> {
    let answer = srv_answer(r, name).await?;
    let mut records: Vec<_> = (answer.records.into_iter())
        .filter(|s| !s.target().is_root() && s.port() != 0)
        .collect();
    // One backend per target and port: of a pair listed twice, the lower priority.
    records.sort_by_key(|s| (s.target().to_ascii(), s.port(), s.priority()));
    records.dedup_by(|a, b| a.target() == b.target() && a.port() == b.port());
    let Some(lowest) = records.iter().map(|s| s.priority()).min() else {
        return Err(format!("SRV {name}: no records"));
    };
    let found = target_addresses(r, &records, &answer.glue).await;
    let mut until = answer.until;
    let mut backends = Vec::with_capacity(records.len());
    for (rec, (host, found)) in records.iter().zip(found) {
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

/// Each record's target and its addresses: from `glue` when it has them, else looked
/// up, [`TARGETS_AT_ONCE`] at a time (a boxed stream: the futures borrow `records`).
async fn target_addresses(
    r: &TokioResolver,
    records: &[SRV],
    glue: &HashMap<String, (Vec<IpAddr>, Instant)>,
) -> Vec<(String, Result<(Vec<IpAddr>, Instant), String>)> {
    let lookups: Vec<_> = (records.iter())
        .map(|rec| {
            let host = host_of(rec.target());
            let known = glue.get(&host).cloned();
            Box::pin(async move {
                let found = match known {
                    Some(k) => Ok(k),
                    None => addresses(r, &host).await,
                };
                (host, found)
            })
        })
        .collect();
    let stream = futures_util::stream::iter(lookups).buffered(TARGETS_AT_ONCE);
    stream.collect().await
}

/// A target's name as a URL's host: lower case, without the root's dot.
fn host_of(name: &Name) -> String {
    name.to_ascii().trim_end_matches('.').to_ascii_lowercase()
}

/// An SRV name's records, the addresses of their targets that came with them (sorted,
/// never empty), and when the answer runs out.
struct SrvAnswer {
    records: Vec<SRV>,
    glue: HashMap<String, (Vec<IpAddr>, Instant)>,
    until: Instant,
}

/// The SRV records of `name`: asked of the first server directly, to read the
/// additional section as well, and through the resolver when that answer cannot be used
/// (truncated, an error, none in time) — the resolver then asks every server, over TCP
/// for a truncated answer, and finds the targets' addresses itself.
async fn srv_answer(r: &TokioResolver, name: &str) -> Result<SrvAnswer, String> {
    if let Some(a) = srv_direct(r, name).await {
        return Ok(a);
    }
    let answer = (r.srv_lookup(name).await).map_err(|e| format!("SRV {name}: {e}"))?;
    Ok(SrvAnswer {
        records: answer.iter().cloned().collect(),
        glue: HashMap::new(),
        until: answer.as_lookup().valid_until(),
    })
}

/// One SRV query of the first UDP server, read whole: hickory's resolver keeps only the
/// answer section's records for an SRV query, and the additional section often holds
/// every target's address (dnsmasq, CoreDNS and Consul put them there), which saves a
/// query per target. `None` when the answer cannot be used as it is.
async fn srv_direct(r: &TokioResolver, name: &str) -> Option<SrvAnswer> {
    let config = r.config().name_servers();
    let server = config.iter().find(|s| s.protocol == Protocol::Udp)?;
    let mut query_name = Name::from_ascii(name).ok()?;
    query_name.set_fqdn(true);
    let id = fastrand::u16(..);
    let mut m = Message::new();
    m.set_id(id)
        .set_recursion_desired(true)
        .add_query(Query::query(query_name, RecordType::SRV));
    m.set_edns(Edns::new().set_max_payload(1232).clone());
    let query = m.to_vec().ok()?;
    let local: SocketAddr = match server.socket_addr {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = tokio::net::UdpSocket::bind(local).await.ok()?;
    sock.connect(server.socket_addr).await.ok()?;
    sock.send(&query).await.ok()?;
    let mut buf = vec![0u8; 1232];
    let n = tokio::time::timeout(QUERY_TIMEOUT, sock.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    let reply = Message::from_vec(&buf[..n]).ok()?;
    if reply.id() != id || reply.truncated() || reply.response_code() != ResponseCode::NoError {
        return None;
    }
    srv_of_reply(&reply, Instant::now())
}

/// The SRV records and the targets' addresses of a reply received at `now`.
fn srv_of_reply(reply: &Message, now: Instant) -> Option<SrvAnswer> {
    let ttl = |t: u32| now + Duration::from_secs(u64::from(t));
    let mut records = Vec::new();
    let mut until = None::<Instant>;
    for rec in reply.answers() {
        if let RData::SRV(srv) = rec.data() {
            records.push(srv.clone());
            until = Some(until.map_or(ttl(rec.ttl()), |u| u.min(ttl(rec.ttl()))));
        }
    }
    let mut glue: HashMap<String, (Vec<IpAddr>, Instant)> = HashMap::new();
    for rec in reply.additionals() {
        let ip = match rec.data() {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            _ => continue,
        };
        let e = (glue.entry(host_of(rec.name()))).or_insert((Vec::new(), ttl(rec.ttl())));
        e.0.push(ip);
        e.1 = e.1.min(ttl(rec.ttl()));
    }
    for (ips, _) in glue.values_mut() {
        ips.sort();
        ips.dedup();
    }
    Some(SrvAnswer {
        records,
        glue,
        until: until?,
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
    use hickory_resolver::proto::rr::rdata::A;
    use hickory_resolver::proto::rr::Record;

    #[test]
    fn an_answers_additional_section_gives_its_targets_addresses() {
        let name = |n: &str| Name::from_ascii(n).unwrap();
        let mut m = Message::new();
        let srv = |target: &str, port| SRV::new(10, 1, port, name(target));
        m.add_answer(Record::from_rdata(
            name("_h._tcp.x.test."),
            30,
            RData::SRV(srv("A.x.test.", 80)),
        ));
        m.add_answer(Record::from_rdata(
            name("_h._tcp.x.test."),
            10,
            RData::SRV(srv("b.x.test.", 81)),
        ));
        for (host, ip, ttl) in [
            ("a.x.test.", [10, 0, 0, 2], 5),
            ("a.x.test.", [10, 0, 0, 1], 20),
        ] {
            m.add_additional(Record::from_rdata(
                name(host),
                ttl,
                RData::A(A::from(std::net::Ipv4Addr::from(ip))),
            ));
        }
        let now = Instant::now();
        let a = srv_of_reply(&m, now).unwrap();
        assert_eq!(a.records.len(), 2);
        assert_eq!(a.until, now + Duration::from_secs(10), "the smallest TTL");
        let (ips, until) = &a.glue["a.x.test"];
        assert_eq!(
            ips,
            &[
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "10.0.0.2".parse().unwrap()
            ]
        );
        assert_eq!(*until, now + Duration::from_secs(5));
        assert!(!a.glue.contains_key("b.x.test"), "b is looked up");
        assert_eq!(host_of(&name("A.x.test.")), "a.x.test");
    }

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

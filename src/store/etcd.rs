//! etcd v3 through its JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`, `/v3/watch`,
//! `/v3/lease/…`; etcd 3.4 and later), over hyper's client.
//!
//! Why the gateway and not the `etcd-client` crate: that crate generates its gRPC code
//! at build time, so it needs `protoc` installed (Debian's `protobuf-compiler`), and
//! alone it builds 99 crates in 70 s on this 2-core machine (tonic, prost, prost-build
//! and their dependencies). The gateway needs nothing fulcrum does not have: hyper,
//! serde_json and base64 (keys and values are base64 in the gateway's JSON).

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// How long one call to etcd may take (a watch excepted): well under the registry's
/// lease, so that a member that does not answer leaves time to renew it through another.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long connecting to one member may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// What went wrong talking to etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreError {
    /// No endpoint answered.
    Unreachable(String),
    /// An endpoint answered with something that is not what the gateway sends.
    Protocol(String),
    /// The watch's start revision was compacted away; the prefix must be read again.
    Compacted(i64),
}

/// One key and its value, as etcd holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kv {
    /// The key, as text.
    pub(crate) key: String,
    /// The value's bytes.
    pub(crate) value: Vec<u8>,
    /// The revision of its last change: what a write compares against.
    pub(crate) mod_revision: i64,
    /// The revision it was created at: unique among the store's keys, and the same on
    /// every client, so it serves as an id all instances agree on.
    pub(crate) create_revision: i64,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Writes the value at the key.
    Put(String, Vec<u8>),
    /// Writes the value at the key, attached to a lease: it goes when the lease does.
    PutLease(String, Vec<u8>, i64),
    /// Deletes the key.
    Delete(String),
    /// Deletes every key under the prefix.
    DeletePrefix(String),
}

impl Op {
    fn json(&self) -> Value {
        match self {
            Op::Put(k, v) => json!({"request_put": {"key": b64(k.as_bytes()), "value": b64(v)}}),
            Op::PutLease(k, v, lease) => json!({"request_put": {"key": b64(k.as_bytes()),
                "value": b64(v), "lease": lease.to_string()}}),
            Op::Delete(k) => json!({"request_delete_range": {"key": b64(k.as_bytes())}}),
            Op::DeletePrefix(p) => json!({"request_delete_range": {
                "key": b64(p.as_bytes()), "range_end": b64(&prefix_end(p))}}),
        }
    }
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// The key was written.
    Put(Kv),
    /// The key was deleted at this revision.
    Delete { key: String, revision: i64 },
}

impl Change {
    /// The revision of the change.
    pub(crate) fn revision(&self) -> i64 {
        match self {
            Change::Put(kv) => kv.mod_revision,
            Change::Delete { revision, .. } => *revision,
        }
    }
}

/// The HTTP connector: a member that does not accept soon is passed over, and a watch
/// connection that dies silently (a dropped NAT entry) is noticed by TCP keep-alive
/// within about 11 s.
fn connector() -> HttpConnector {
    let mut c = HttpConnector::new();
    c.set_connect_timeout(Some(CONNECT_TIMEOUT));
    c.set_keepalive(Some(Duration::from_secs(5)));
    c.set_keepalive_interval(Some(Duration::from_secs(2)));
    c.set_keepalive_retries(Some(3));
    c.set_nodelay(true);
    c
}

/// A compare-and-set's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Written {
    /// Written, at this revision.
    Done(i64),
    /// Someone else changed it first: its current value, if it has one.
    Conflict(Option<Kv>),
}

/// A client of one etcd cluster.
#[derive(Debug, Clone)]
pub(crate) struct Etcd {
    /// `http://host:port`, in the order to try them.
    endpoints: Vec<String>,
    /// The member that answered last: tried first.
    preferred: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// A condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Compare<'a> {
    /// The key was last changed at this revision (0: it does not exist).
    Mod(&'a str, i64),
    /// No key under the prefix changed after this revision (none was written since
    /// a read at it).
    UnchangedSince(&'a str, i64),
}

impl Compare<'_> {
    fn json(&self) -> Value {
        // etcd leaves a zero out of its JSON: compare "MOD = 0" is written explicitly,
        // and means the key does not exist.
        match self {
            Compare::Mod(k, rev) => json!({"key": b64(k.as_bytes()), "target": "MOD",
                "result": "EQUAL", "mod_revision": rev.to_string()}),
            Compare::UnchangedSince(p, rev) => json!({"key": b64(p.as_bytes()),
                "range_end": b64(&prefix_end(p)), "target": "MOD", "result": "LESS",
                "mod_revision": (rev + 1).to_string()}),
        }
    }
}

/// The gateway writes 64-bit integers as strings (proto3 JSON); absent means 0.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn b64(s: &[u8]) -> String {
    B64.encode(s)
}

/// The key just after every key that starts with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

#[derive(Deserialize)]
struct RawKv {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    mod_revision: Value,
    #[serde(default)]
    create_revision: Value,
}

impl RawKv {
    fn decode(self) -> Result<Kv, StoreError> {
        let bad = |e: base64::DecodeError| StoreError::Protocol(format!("base64: {e}"));
        let key = B64.decode(self.key).map_err(bad)?;
        Ok(Kv {
            key: String::from_utf8_lossy(&key).into_owned(),
            value: B64.decode(self.value).map_err(bad)?,
            mod_revision: int(&self.mod_revision),
            create_revision: int(&self.create_revision),
        })
    }
}

impl Etcd {
    /// A client of the cluster at `endpoints` (`host:port` each).
    pub(crate) fn new(endpoints: &[String]) -> Etcd {
        Etcd {
            endpoints: endpoints.iter().map(|e| format!("http://{e}")).collect(),
            preferred: Default::default(),
            client: Client::builder(TokioExecutor::new()).build(connector()),
        }
    }

    /// The endpoints in the order to try them: the one that answered last first.
    fn in_order(&self) -> impl Iterator<Item = (usize, &String)> {
        let first = self.preferred.load(std::sync::atomic::Ordering::Relaxed);
        let n = self.endpoints.len();
        (0..n).map(move |i| ((first + i) % n, &self.endpoints[(first + i) % n]))
    }

    fn prefer(&self, i: usize) {
        self.preferred
            .store(i, std::sync::atomic::Ordering::Relaxed);
    }

    /// POSTs `body` to `path` on the first endpoint that answers well; its JSON answer.
    /// A member that answers with a server error (no leader, say) is passed over too.
    async fn call(&self, path: &str, body: Value) -> Result<Value, StoreError> {
        let mut last = String::from("no endpoint");
        for (i, e) in self.in_order() {
            let req = http::Request::post(format!("{e}{path}"))
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body.to_string())))
                .map_err(|x| StoreError::Protocol(x.to_string()))?;
            let answer = async {
                let resp = self.client.request(req).await.map_err(|x| x.to_string())?;
                let status = resp.status();
                let bytes = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(|x| x.to_string())?;
                Ok::<_, String>((status, bytes.to_bytes()))
            };
            match tokio::time::timeout(CALL_TIMEOUT, answer).await {
                Ok(Ok((status, bytes))) if status.is_success() => {
                    self.prefer(i);
                    return serde_json::from_slice(&bytes)
                        .map_err(|x| StoreError::Protocol(format!("{path}: {x}")));
                }
                Ok(Ok((status, bytes))) if status.is_server_error() => {
                    last = format!("{e}: {status} {}", String::from_utf8_lossy(&bytes));
                }
                Ok(Ok((status, bytes))) => {
                    let text = String::from_utf8_lossy(&bytes);
                    return Err(StoreError::Protocol(format!("{path}: {status} {text}")));
                }
                Ok(Err(x)) => last = format!("{e}: {x}"),
                Err(_) => last = format!("{e}: no answer within {CALL_TIMEOUT:?}"),
            }
        }
        Err(StoreError::Unreachable(last))
    }

    /// Every key under `prefix`, and the revision the read saw.
    pub(crate) async fn range_prefix(&self, prefix: &str) -> Result<(i64, Vec<Kv>), StoreError> {
        let body = json!({"key": b64(prefix.as_bytes()), "range_end": b64(&prefix_end(prefix))});
        let v = self.call("/v3/kv/range", body).await?;
        let revision = int(&v["header"]["revision"]);
        let kvs = match v.get("kvs") {
            Some(list) => serde_json::from_value::<Vec<RawKv>>(list.clone())
                .map_err(|x| StoreError::Protocol(x.to_string()))?
                .into_iter()
                .map(RawKv::decode)
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        Ok((revision, kvs))
    }

    /// The key `key`, if it exists.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<Kv>, StoreError> {
        let v = self
            .call("/v3/kv/range", json!({"key": b64(key.as_bytes())}))
            .await?;
        match v["kvs"][0].clone() {
            Value::Null => Ok(None),
            raw => serde_json::from_value::<RawKv>(raw)
                .map_err(|x| StoreError::Protocol(x.to_string()))?
                .decode()
                .map(Some),
        }
    }

    /// Writes `value` at `key` if its last change is `mod_revision` (0: only if it does
    /// not exist), in one transaction; on a conflict, the current value.
    #[cfg(test)]
    pub(crate) async fn put_if(
        &self,
        key: &str,
        value: &[u8],
        mod_revision: i64,
    ) -> Result<Written, StoreError> {
        let put = Op::Put(key.to_string(), value.to_vec());
        self.txn(&[Compare::Mod(key, mod_revision)], &[put]).await
    }

    /// Deletes `key` if its last change is `mod_revision`.
    #[cfg(test)]
    pub(crate) async fn delete_if(
        &self,
        key: &str,
        mod_revision: i64,
    ) -> Result<Written, StoreError> {
        let del = Op::Delete(key.to_string());
        self.txn(&[Compare::Mod(key, mod_revision)], &[del]).await
    }

    /// Carries out `ops` in one transaction if every condition holds; otherwise changes
    /// nothing and returns the current value of the first key compared with
    /// [`Compare::Mod`] that differs (none if it is a prefix's condition that failed).
    pub(crate) async fn txn(
        &self,
        compares: &[Compare<'_>],
        ops: &[Op],
    ) -> Result<Written, StoreError> {
        let failure: Vec<Value> = compares
            .iter()
            .map(|c| match c {
                Compare::Mod(k, _) | Compare::UnchangedSince(k, _) => {
                    json!({"request_range": {"key": b64(k.as_bytes())}})
                }
            })
            .collect();
        let body = json!({"compare": compares.iter().map(Compare::json).collect::<Vec<_>>(),
            "success": ops.iter().map(Op::json).collect::<Vec<_>>(), "failure": failure});
        let v = self.call("/v3/kv/txn", body).await?;
        if v["succeeded"].as_bool().unwrap_or(false) {
            return Ok(Written::Done(int(&v["header"]["revision"])));
        }
        for (i, c) in compares.iter().enumerate() {
            let Compare::Mod(_, rev) = c else {
                continue;
            };
            let current = match v["responses"][i]["response_range"]["kvs"][0].clone() {
                Value::Null => None,
                raw => Some(
                    serde_json::from_value::<RawKv>(raw)
                        .map_err(|x| StoreError::Protocol(x.to_string()))?
                        .decode()?,
                ),
            };
            if current.as_ref().map_or(0, |kv| kv.mod_revision) != *rev {
                return Ok(Written::Conflict(current));
            }
        }
        Ok(Written::Conflict(None))
    }

    /// A lease of `ttl`; its id.
    pub(crate) async fn grant_lease(&self, ttl: Duration) -> Result<i64, StoreError> {
        let v = self
            .call("/v3/lease/grant", json!({"TTL": ttl.as_secs().to_string()}))
            .await?;
        match int(&v["ID"]) {
            0 => Err(StoreError::Protocol("a lease without an id".into())),
            id => Ok(id),
        }
    }

    /// Renews lease `id` once.
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<(), StoreError> {
        let v = self
            .call("/v3/lease/keepalive", json!({"ID": id.to_string()}))
            .await?;
        // An expired (or unknown) lease is renewed to nothing: no TTL in the answer.
        match int(&v["result"]["TTL"]) {
            0 => Err(StoreError::Protocol(format!("lease {id} has expired"))),
            _ => Ok(()),
        }
    }

    /// Ends lease `id` now: its keys go at once.
    pub(crate) async fn revoke_lease(&self, id: i64) -> Result<(), StoreError> {
        self.call("/v3/lease/revoke", json!({"ID": id.to_string()}))
            .await?;
        Ok(())
    }

    /// Writes `value` at `key`, attached to lease `id`.
    pub(crate) async fn put_with_lease(
        &self,
        key: &str,
        value: &[u8],
        id: i64,
    ) -> Result<(), StoreError> {
        let body =
            json!({"key": b64(key.as_bytes()), "value": b64(value), "lease": id.to_string()});
        self.call("/v3/kv/put", body).await?;
        Ok(())
    }

    /// Opens a watch stream on the first endpoint that answers.
    async fn open_watch(
        &self,
        create: &Value,
    ) -> Result<http::Response<hyper::body::Incoming>, StoreError> {
        let mut last = String::from("no endpoint");
        for (i, e) in self.in_order() {
            let req = http::Request::post(format!("{e}/v3/watch"))
                .body(Full::new(Bytes::from(create.to_string())))
                .map_err(|x| StoreError::Protocol(x.to_string()))?;
            match tokio::time::timeout(CALL_TIMEOUT, self.client.request(req)).await {
                Ok(Ok(resp)) if resp.status().is_success() => {
                    self.prefer(i);
                    return Ok(resp);
                }
                Ok(Ok(resp)) => last = format!("{e}: watch answered {}", resp.status()),
                Ok(Err(x)) => last = format!("{e}: {x}"),
                Err(_) => last = format!("{e}: no answer within {CALL_TIMEOUT:?}"),
            }
        }
        Err(StoreError::Unreachable(last))
    }

    /// Watches every key under `prefix` from `revision` on: calls `each` with the changes
    /// of every event batch and the revision of its last change, until the stream
    /// ends (an error) or `each` returns false.
    pub(crate) async fn watch(
        &self,
        prefix: &str,
        revision: i64,
        mut each: impl FnMut(i64, Vec<Change>) -> bool,
    ) -> Result<(), StoreError> {
        let create = json!({"create_request": {"key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_end(prefix)), "start_revision": revision.to_string()}});
        let resp = self.open_watch(&create).await?;
        let mut body = resp.into_body();
        let mut pending = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|x| StoreError::Unreachable(x.to_string()))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            pending.extend_from_slice(data);
            // One JSON object per line.
            while let Some(at) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=at).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let v: Value = serde_json::from_slice(&line)
                    .map_err(|x| StoreError::Protocol(format!("watch: {x}")))?;
                let r = &v["result"];
                let compacted = int(&r["compact_revision"]);
                if compacted > 0 {
                    return Err(StoreError::Compacted(compacted));
                }
                if r["canceled"].as_bool() == Some(true) {
                    return Err(StoreError::Protocol(format!(
                        "watch canceled: {}",
                        r["cancel_reason"]
                    )));
                }
                let changes = changes_of(&r["events"])?;
                // The revision the batch brings this watcher to is its last event's: the
                // header's may be ahead while a long catch-up comes in parts.
                let upto = changes.iter().map(Change::revision).max().unwrap_or(0);
                if !changes.is_empty() && !each(upto, changes) {
                    return Ok(());
                }
            }
        }
        Err(StoreError::Unreachable("the watch ended".into()))
    }
}

/// A watch answer's events.
fn changes_of(events: &Value) -> Result<Vec<Change>, StoreError> {
    let Some(list) = events.as_array() else {
        return Ok(Vec::new());
    };
    list.iter()
        .map(|e| {
            let raw = serde_json::from_value::<RawKv>(e["kv"].clone())
                .map_err(|x| StoreError::Protocol(x.to_string()))?;
            let kv = raw.decode()?;
            Ok(match e["type"].as_str() {
                Some("DELETE") => Change::Delete {
                    key: kv.key,
                    revision: kv.mod_revision,
                },
                _ => Change::Put(kv),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_just_after_its_keys() {
        assert_eq!(prefix_end("fulcrum/"), b"fulcrum0");
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80");
        assert_eq!(prefix_end(""), [0]);
        assert_eq!(int(&json!("42")), 42);
        assert_eq!(int(&json!(7)), 7);
        assert_eq!(int(&Value::Null), 0);
    }

    /// A real etcd on ephemeral ports with a data directory of its own; killed on drop.
    struct RealEtcd {
        child: std::process::Child,
        dir: std::path::PathBuf,
        client: String,
    }

    impl Drop for RealEtcd {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    }

    fn start_etcd(tag: &str) -> RealEtcd {
        let (client, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("fulcrum-etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let child = std::process::Command::new("etcd")
            .args(["--data-dir", dir.to_str().unwrap_or("/tmp/etcd")])
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("etcd is needed for the fleet tests: apt-get install etcd-server");
        RealEtcd {
            child,
            dir,
            client: format!("127.0.0.1:{client}"),
        }
    }

    async fn ready(e: &Etcd) {
        for _ in 0..100 {
            if e.range_prefix("x").await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("etcd did not start");
    }

    #[tokio::test]
    async fn reads_writes_on_a_revision_and_watches_a_real_etcd() {
        let real = start_etcd("gateway");
        let e = Etcd::new(std::slice::from_ref(&real.client));
        ready(&e).await;
        let (start, empty) = e.range_prefix("fulcrum/").await.unwrap();
        assert!(empty.is_empty());
        let Written::Done(r1) = e
            .put_if("fulcrum/pools/web", b"{\"a\":1}", 0)
            .await
            .unwrap()
        else {
            panic!("a new key is written");
        };
        // A second writer based on "does not exist" loses and sees the current value.
        match e
            .put_if("fulcrum/pools/web", b"{\"a\":2}", 0)
            .await
            .unwrap()
        {
            Written::Conflict(Some(kv)) => assert_eq!(
                (kv.value.as_slice(), kv.mod_revision),
                (&b"{\"a\":1}"[..], r1)
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            e.put_if("fulcrum/pools/web", b"{\"a\":3}", r1)
                .await
                .unwrap(),
            Written::Done(_)
        ));
        let (_, kvs) = e.range_prefix("fulcrum/").await.unwrap();
        assert_eq!(kvs.len(), 1);
        assert_eq!(kvs[0].value, b"{\"a\":3}");
        // The watch from the first revision sees every change, the delete included.
        let last = kvs[0].mod_revision;
        assert!(matches!(
            e.delete_if("fulcrum/pools/web", last).await.unwrap(),
            Written::Done(_)
        ));
        let mut seen = Vec::new();
        let watch = e.watch("fulcrum/", start + 1, |_, changes| {
            seen.extend(changes);
            seen.len() < 3
        });
        tokio::time::timeout(Duration::from_secs(5), watch)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(&seen[2], Change::Delete { key, .. } if key == "fulcrum/pools/web"),
            "{seen:?}"
        );
        // A lease keeps its key while renewed.
        let id = e.grant_lease(Duration::from_secs(5)).await.unwrap();
        e.put_with_lease("fulcrum/instances/a", b"{}", id)
            .await
            .unwrap();
        e.keep_alive(id).await.unwrap();
        let (_, kvs) = e.range_prefix("fulcrum/instances/").await.unwrap();
        assert_eq!(kvs.len(), 1);
    }
}

//! What happens once a request is over: metrics, the access log line, and (sampled) a
//! `request` event for the event stream. Every request is recorded exactly once — when
//! its response has been sent whole, when it failed, or when the client went away.

use std::net::IpAddr;
use std::time::Duration;

use http::uri::PathAndQuery;
use http::Method;

use crate::clock::Stamp;
use crate::config::AccessFormat;
use crate::pool::{Backend, Event, Tagged};
use crate::site::Site;

/// One request's facts, filled in along the way.
#[derive(Debug)]
pub(crate) struct Finish {
    /// When the request head had arrived.
    pub(crate) started: Stamp,
    /// Request method.
    pub(crate) method: Method,
    /// Request target.
    pub(crate) path: PathAndQuery,
    /// The client (the connection's peer).
    pub(crate) client: IpAddr,
    /// The client's protocol version.
    pub(crate) version: http::Version,
    /// Status sent to the client.
    pub(crate) status: u16,
    /// From sending the request upstream until the response headers arrived.
    pub(crate) upstream: Option<Latency>,
    /// Retries it took (a `u16` beside [`Self::split`]: the record stays 168 bytes, and
    /// every move of it as short as before splits; `docs/performance.md`).
    pub(crate) retries: u16,
    /// Its `X-Request-Id`.
    pub(crate) id: super::request_id::RequestId,
    /// What the access log's format adds to the others, kept only for that format: one
    /// box for either, as the record moves with every request (`docs/performance.md`,
    /// "A hold in 256 bytes").
    pub(crate) extra: Option<Box<Extra>>,
    /// Its route split its requests among pools: the access log names the pool taken
    /// (`docs/traffic.md`).
    pub(crate) split: bool,
    /// Its trace, when it is sampled (`docs/tracing.md`): the server span is written
    /// with the record.
    pub(crate) trace: Option<Box<crate::trace::Traced>>,
}

/// A latency in 8 bytes, nanoseconds and never zero, where an `Option<Duration>` takes
/// 16: a record is moved with every request, inside a hold kept to 256 bytes
/// (`docs/performance.md`, "A hold in 256 bytes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Latency(std::num::NonZeroU64);

impl Latency {
    /// As a duration.
    pub(crate) fn get(self) -> Duration {
        Duration::from_nanos(self.0.get())
    }
}

impl From<Duration> for Latency {
    /// `d`, at least a nanosecond, at most 584 years.
    fn from(d: Duration) -> Latency {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Latency(std::num::NonZeroU64::new(ns).unwrap_or(std::num::NonZeroU64::MIN))
    }
}

/// What one access log format adds to a record.
#[derive(Debug)]
pub(crate) enum Extra {
    /// The combined format's fields.
    Combined(Combined),
    /// The connection's verified client certificate: the json format names its subject.
    ClientCert(std::sync::Arc<crate::identity::ClientCert>),
}

impl Finish {
    /// The combined format's fields, when the record keeps them.
    pub(crate) fn combined_mut(&mut self) -> Option<&mut Combined> {
        match self.extra.as_deref_mut() {
            Some(Extra::Combined(c)) => Some(c),
            _ => None,
        }
    }

    /// The combined format's fields, when the record keeps them.
    fn combined(&self) -> Option<&Combined> {
        match self.extra.as_deref() {
            Some(Extra::Combined(c)) => Some(c),
            _ => None,
        }
    }

    /// The verified client certificate, when the record keeps it.
    fn client_cert(&self) -> Option<&crate::identity::ClientCert> {
        match self.extra.as_deref() {
            Some(Extra::ClientCert(c)) => Some(c),
            _ => None,
        }
    }
}

/// The fields of a combined access log line that the others do without.
#[derive(Debug)]
pub(crate) struct Combined {
    /// `Referer`, as sent.
    pub(crate) referer: Option<http::HeaderValue>,
    /// `User-Agent`, as sent.
    pub(crate) user_agent: Option<http::HeaderValue>,
    /// The answer body's length as sent, when it was stated (`-` otherwise, as Apache
    /// writes for an unknown size).
    pub(crate) bytes: Option<u64>,
}

/// A request's record while the request is being handled. Dropped without having been
/// written — hyper dropped the handler because the client went away or reset the stream
/// while the backend was still thinking — it records the request all the same, with
/// status 499 ("client closed request", as nginx logs it) unless a status was known.
#[derive(Debug)]
pub(crate) struct Pending {
    fin: Finish,
    armed: bool,
    /// The backend of the attempt in progress.
    pub(crate) backend_id: Option<u64>,
    rec: &'static Recorder,
}

/// What nginx logs for a request whose client went away first.
pub(crate) const CLIENT_CLOSED: u16 = 499;

impl Pending {
    /// Starts the record of a request.
    pub(crate) fn new(fin: Finish, rec: &'static Recorder) -> Pending {
        Pending {
            fin,
            armed: true,
            backend_id: None,
            rec,
        }
    }

    /// Writes the record now (an answer of fulcrum's own, an upgrade).
    pub(crate) fn finish(&mut self, backend: Option<&Backend>) {
        if std::mem::take(&mut self.armed) {
            self.rec.finish(&self.fin, backend);
        }
    }

    /// Writes the record now against the backend of the last attempt (looked up by
    /// id: failure paths only, off the common path).
    pub(crate) fn finish_attempted(&mut self) {
        if std::mem::take(&mut self.armed) {
            let backend = self
                .backend_id
                .and_then(|id| self.rec.site.live_backend(id));
            self.rec.finish(&self.fin, backend.as_deref());
        }
    }

    /// Hands the record to the response body, which writes it when it ends.
    pub(crate) fn hand_off(&mut self) -> (Finish, &'static Recorder) {
        self.armed = false;
        // Moved out, not cloned: what is left behind is never written out.
        let left = Finish {
            started: self.fin.started,
            method: Method::GET,
            path: PathAndQuery::from_static("/"),
            client: self.fin.client,
            version: self.fin.version,
            status: self.fin.status,
            // Still read: a mirror compares the answer's latency (`proxy::mirror`).
            upstream: self.fin.upstream,
            retries: 0,
            id: super::request_id::RequestId::Ours([b'0'; 32]),
            extra: None,
            split: false,
            trace: None,
        };
        (std::mem::replace(&mut self.fin, left), self.rec)
    }
}

impl std::ops::Deref for Pending {
    type Target = Finish;
    fn deref(&self) -> &Finish {
        &self.fin
    }
}

impl std::ops::DerefMut for Pending {
    fn deref_mut(&mut self) -> &mut Finish {
        &mut self.fin
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if self.fin.status == 0 {
            self.fin.status = CLIENT_CLOSED;
        }
        self.finish_attempted();
    }
}

/// Records finished requests for one proxy (shared by its workers).
#[derive(Debug)]
pub(crate) struct Recorder {
    site: std::sync::Arc<Site>,
    /// The access log's format, `None` when it is off.
    access_log: Option<AccessFormat>,
    /// Requests by the client's protocol (this worker's).
    protocols: crate::stats::ProtocolCounts,
}

/// Longest path carried by a `request` event (a subscriber that lags holds up to 1024
/// events).
const EVENT_PATH_MAX: usize = 256;

/// `s` cut to at most `max` bytes at a character boundary.
fn truncated(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Milliseconds with microsecond precision, for logs and events.
fn ms(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

impl Recorder {
    /// A recorder for the backends of `site`; `access_log` writes one line per request
    /// in that format.
    pub(crate) fn new(site: std::sync::Arc<Site>, access_log: Option<AccessFormat>) -> Recorder {
        Recorder {
            site,
            access_log,
            protocols: crate::stats::ProtocolCounts::new(),
        }
    }

    /// What a record keeps for the access log's format: the request's `combined`
    /// fields, or the connection's client certificate `cert` for the json format.
    pub(crate) fn extra(
        &self,
        combined: impl FnOnce() -> Combined,
        cert: Option<&std::sync::Arc<crate::identity::ClientCert>>,
    ) -> Option<Box<Extra>> {
        match (self.access_log?, cert) {
            (AccessFormat::Combined, _) => Some(Box::new(Extra::Combined(combined()))),
            (AccessFormat::Json, Some(c)) => Some(Box::new(Extra::ClientCert(c.clone()))),
            _ => None,
        }
    }

    /// Records a finished request; `backend` is the one that served it (or failed it),
    /// `None` for fulcrum's own answers that reached no backend.
    pub(crate) fn finish(&self, f: &Finish, backend: Option<&Backend>) {
        let now = Stamp::now();
        let total = now.since(f.started);
        let protocol = crate::stats::protocol_index(f.version);
        self.protocols.count(protocol);
        let protocol = crate::stats::PROTOCOLS[protocol];
        if let Some(b) = backend {
            b.live.stats.finished(f.status, total);
        }
        if let Some(t) = &f.trace {
            t.end(&crate::trace::Ended {
                started: f.started,
                ended: now,
                method: &f.method,
                path: &f.path,
                status: f.status,
                client: f.client,
                version: f.version,
                request_id: f.id.as_bytes(),
            });
        }
        if let Some(format) = self.access_log {
            let name = backend.map_or("-", |b| b.name.as_str());
            let said = Said {
                backend: name,
                tries: backend.map_or(0, |_| u64::from(f.retries) + 1),
                pool: backend.filter(|_| f.split).map(|b| &*b.pool),
                protocol,
                total,
            };
            crate::logging::write_access_line(|buf| access_line(buf, format, f, &said));
        }
        if let Some(b) = backend {
            let hub = &self.site.hub;
            if hub.sampler.sample(now) {
                let event = Event::Request {
                    id: b.id,
                    backend: b.name.clone(),
                    status: f.status,
                    latency_ms: ms(total),
                    method: f.method.to_string(),
                    path: truncated(f.path.path(), EVENT_PATH_MAX).to_string(),
                    retries: u32::from(f.retries),
                    protocol,
                };
                hub.send(Tagged {
                    pool: std::sync::Arc::clone(&b.pool),
                    event,
                });
            }
        }
    }
}

// ------------------------------------------------------------------ the access log line
//
// Formatted by hand, straight into the worker's log batch, in the layout of the rest of
// the log (tracing-subscriber's text and JSON formats). Going through `tracing!` cost
// about 10 % of a worker's throughput in its generic formatter (timestamp, field
// visitors, float formatting); this costs a few hundred nanoseconds.

/// Appends `n` in decimal. Most numbers of a log line (a status, an address's octets,
/// milliseconds, retries) have one to three digits: those are written as arrays of a
/// known length, which the compiler stores in place, where a copy of a run of unknown
/// length is a `memcpy` call.
fn push_u64(buf: &mut Vec<u8>, n: u64) {
    let digit = |d: u64| b'0' + (d % 10) as u8;
    match n {
        0..=9 => buf.push(digit(n)),
        10..=99 => buf.extend_from_slice(&[digit(n / 10), digit(n)]),
        100..=999 => buf.extend_from_slice(&[digit(n / 100), digit(n / 10), digit(n)]),
        _ => {
            let mut digits = [0u8; 20];
            let mut i = digits.len();
            let mut n = n;
            while n > 0 {
                i -= 1;
                digits[i] = digit(n);
                n /= 10;
            }
            buf.extend_from_slice(&digits[i..]);
        }
    }
}

/// Appends `d` as milliseconds with three decimals (`1.018`).
fn push_ms(buf: &mut Vec<u8>, d: Duration) {
    let us = d.as_micros().min(u64::MAX as u128) as u64;
    push_u64(buf, us / 1000);
    let frac = us % 1000;
    buf.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// Appends an IP address; IPv4 by hand, as `Display` costs several times more.
fn push_ip(buf: &mut Vec<u8>, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            // Put together on the stack and copied once: one push per octet cost about
            // 170 instructions a line.
            let mut text = [0u8; 15];
            let mut n = 0;
            for (i, o) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text[n] = b'.';
                    n += 1;
                }
                if o >= 100 {
                    text[n] = b'0' + o / 100;
                    n += 1;
                }
                if o >= 10 {
                    text[n] = b'0' + o / 10 % 10;
                    n += 1;
                }
                text[n] = b'0' + o % 10;
                n += 1;
            }
            buf.extend_from_slice(&text[..n]);
        }
        v6 => {
            use std::io::Write;
            let _ = write!(buf, "{v6}");
        }
    }
}

/// Year, month, day of a day count since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

thread_local! {
    /// The current second's `YYYY-MM-DDTHH:MM:SS`, made once a second per thread.
    static SECOND: std::cell::Cell<(u64, [u8; 19])> = const { std::cell::Cell::new((u64::MAX, [0; 19])) };
}

/// Appends the time as `2026-11-29T22:35:51.049566Z`.
fn push_timestamp(buf: &mut Vec<u8>, unix_ns: u64) {
    let secs = unix_ns / 1_000_000_000;
    let (cached, mut text) = SECOND.with(|c| c.get());
    if cached != secs {
        let (y, m, d) = civil((secs / 86_400) as i64);
        let t = secs % 86_400;
        let s = format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
            t / 3600,
            t / 60 % 60,
            t % 60
        );
        if s.len() == 19 {
            text.copy_from_slice(s.as_bytes());
            SECOND.with(|c| c.set((secs, text)));
        }
    }
    buf.extend_from_slice(&text);
    let us = (unix_ns % 1_000_000_000 / 1_000) as u32;
    let mut frac = [b'.', 0, 0, 0, 0, 0, 0, b'Z'];
    let mut v = us;
    for i in (1..7).rev() {
        frac[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    buf.extend_from_slice(&frac);
}

/// Appends `s` as tracing's text format shows a string field: quoted, escaped.
fn push_quoted(buf: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|c| PLAIN[usize::from(c)]) {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        use std::io::Write;
        let _ = write!(buf, "{s:?}");
    }
}

/// Appends ` pool="NAME"`. A pool's name needs no quoting (`[a-z0-9_-]`, checked when it
/// is made); written apart from [`push_quoted`] so that the backend's name, on every
/// line, keeps that function inlined.
#[inline(never)]
fn push_pool(buf: &mut Vec<u8>, pool: &str) {
    buf.extend_from_slice(b" pool=\"");
    buf.extend_from_slice(pool.as_bytes());
    buf.push(b'"');
}

/// The bytes [`push_quoted`] writes as they are: printable ASCII but `"` and `\`, and
/// any byte of a multi-byte character (`Debug` leaves those as they are too). One
/// lookup a byte where four comparisons were.
const PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0x20;
    while c < 256 {
        t[c] = c != b'"' as usize && c != b'\\' as usize && c != 0x7f;
        c += 1;
    }
    t
};

/// Appends `s` as a JSON string.
fn push_json_str(buf: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *buf, s);
}

/// What an access log line says beside the record: who answered, over which protocol
/// the client asked, and how long it all took.
struct Said<'a> {
    backend: &'a str,
    /// Tries sent to backends (0 for an answer of fulcrum's own).
    tries: u64,
    /// The backend's pool, on a split route (its side).
    pool: Option<&'a str>,
    protocol: &'static str,
    total: Duration,
}

/// One access log line.
fn access_line(buf: &mut Vec<u8>, format: AccessFormat, f: &Finish, said: &Said<'_>) {
    let now = crate::clock::unix_ns();
    match format {
        AccessFormat::Text => text_line(buf, f, said, now),
        AccessFormat::Json => json_line(buf, f, said, now),
        AccessFormat::Combined => combined_line(buf, f, now),
    }
}

/// The text format's line. In line in its one caller, as when it was written there
/// (a call of its own on every request is measurable: `docs/performance.md`).
#[inline(always)]
fn text_line(buf: &mut Vec<u8>, f: &Finish, said: &Said<'_>, now: u64) {
    let Said {
        backend,
        tries,
        pool,
        protocol,
        total,
    } = *said;
    push_timestamp(buf, now);
    buf.extend_from_slice(b"  INFO access client=");
    push_ip(buf, f.client);
    buf.extend_from_slice(b" protocol=");
    buf.extend_from_slice(protocol.as_bytes());
    buf.extend_from_slice(b" method=");
    buf.extend_from_slice(f.method.as_str().as_bytes());
    buf.extend_from_slice(b" path=");
    buf.extend_from_slice(f.path.as_str().as_bytes());
    buf.extend_from_slice(b" status=");
    push_u64(buf, u64::from(f.status));
    buf.extend_from_slice(b" backend=");
    push_quoted(buf, backend);
    if let Some(pool) = pool {
        push_pool(buf, pool);
    }
    if let Some(up) = f.upstream {
        buf.extend_from_slice(b" upstream_ms=");
        push_ms(buf, up.get());
    }
    buf.extend_from_slice(b" total_ms=");
    push_ms(buf, total);
    buf.extend_from_slice(b" retries=");
    push_u64(buf, u64::from(f.retries));
    buf.extend_from_slice(b" tries=");
    push_u64(buf, tries);
    // Its characters need no quoting (see `RequestId::from_peer`).
    buf.extend_from_slice(b" request_id=");
    buf.extend_from_slice(f.id.as_bytes());
    buf.push(b'\n');
}

/// The JSON format's line. In line in its one caller, as [`text_line`].
#[inline(always)]
fn json_line(buf: &mut Vec<u8>, f: &Finish, said: &Said<'_>, now: u64) {
    let Said {
        backend,
        tries,
        pool,
        protocol,
        total,
    } = *said;
    buf.extend_from_slice(b"{\"timestamp\":\"");
    push_timestamp(buf, now);
    buf.extend_from_slice(
        b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"access\",\"client\":\"",
    );
    push_ip(buf, f.client);
    buf.extend_from_slice(b"\",\"protocol\":\"");
    buf.extend_from_slice(protocol.as_bytes());
    buf.extend_from_slice(b"\",\"method\":");
    push_json_str(buf, f.method.as_str());
    buf.extend_from_slice(b",\"path\":");
    push_json_str(buf, f.path.as_str());
    buf.extend_from_slice(b",\"status\":");
    push_u64(buf, u64::from(f.status));
    buf.extend_from_slice(b",\"backend\":");
    push_json_str(buf, backend);
    if let Some(pool) = pool {
        buf.extend_from_slice(b",\"pool\":");
        push_json_str(buf, pool);
    }
    if let Some(up) = f.upstream {
        buf.extend_from_slice(b",\"upstream_ms\":");
        push_ms(buf, up.get());
    }
    buf.extend_from_slice(b",\"total_ms\":");
    push_ms(buf, total);
    buf.extend_from_slice(b",\"retries\":");
    push_u64(buf, u64::from(f.retries));
    buf.extend_from_slice(b",\"tries\":");
    push_u64(buf, tries);
    buf.extend_from_slice(b",\"request_id\":\"");
    buf.extend_from_slice(f.id.as_bytes());
    buf.extend_from_slice(b"\",\"client_cert\":");
    match f.client_cert() {
        Some(c) => push_json_str(buf, &c.subject),
        None => buf.extend_from_slice(b"null"),
    }
    buf.extend_from_slice(b"}}\n");
}

/// One TCP connection's facts, for its access log line (`docs/tcp.md`).
#[derive(Debug)]
pub(crate) struct TcpRecord<'a> {
    /// The client.
    pub(crate) client: IpAddr,
    /// The TCP pool.
    pub(crate) pool: &'a str,
    /// The backend it reached; `None` when none could be.
    pub(crate) backend: Option<&'a str>,
    /// Bytes from the client (to the backend).
    pub(crate) bytes_in: u64,
    /// Bytes to the client (from the backend).
    pub(crate) bytes_out: u64,
    /// How long the backend's connect took.
    pub(crate) connect: Option<Duration>,
    /// From accept to close.
    pub(crate) duration: Duration,
    /// How it ended: `closed`, `reset`, `idle`, `cut`, `connect_failed`, `no_backend`,
    /// `queue_full`, `queue_timeout`, `no_descriptor`.
    pub(crate) end: &'static str,
}

/// Writes a TCP connection's access log line (`proto` `tcp`): the text format's fields,
/// or the JSON format's (the combined format, made for HTTP, writes the text one).
pub(crate) fn write_tcp_line(format: AccessFormat, r: &TcpRecord<'_>) {
    let now = crate::clock::unix_ns();
    crate::logging::write_access_line(|buf| match format {
        AccessFormat::Json => tcp_json_line(buf, r, now),
        AccessFormat::Text | AccessFormat::Combined => tcp_text_line(buf, r, now),
    });
}

fn tcp_text_line(buf: &mut Vec<u8>, r: &TcpRecord<'_>, now: u64) {
    push_timestamp(buf, now);
    buf.extend_from_slice(b"  INFO access client=");
    push_ip(buf, r.client);
    buf.extend_from_slice(b" proto=tcp");
    push_pool(buf, r.pool);
    buf.extend_from_slice(b" backend=");
    push_quoted(buf, r.backend.unwrap_or("-"));
    buf.extend_from_slice(b" bytes_in=");
    push_u64(buf, r.bytes_in);
    buf.extend_from_slice(b" bytes_out=");
    push_u64(buf, r.bytes_out);
    if let Some(c) = r.connect {
        buf.extend_from_slice(b" connect_ms=");
        push_ms(buf, c);
    }
    buf.extend_from_slice(b" duration_ms=");
    push_ms(buf, r.duration);
    buf.extend_from_slice(b" end=");
    buf.extend_from_slice(r.end.as_bytes());
    buf.push(b'\n');
}

fn tcp_json_line(buf: &mut Vec<u8>, r: &TcpRecord<'_>, now: u64) {
    buf.extend_from_slice(b"{\"timestamp\":\"");
    push_timestamp(buf, now);
    buf.extend_from_slice(
        b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"access\",\"client\":\"",
    );
    push_ip(buf, r.client);
    buf.extend_from_slice(b"\",\"proto\":\"tcp\",\"pool\":");
    push_json_str(buf, r.pool);
    buf.extend_from_slice(b",\"backend\":");
    match r.backend {
        Some(b) => push_json_str(buf, b),
        None => buf.extend_from_slice(b"null"),
    }
    buf.extend_from_slice(b",\"bytes_in\":");
    push_u64(buf, r.bytes_in);
    buf.extend_from_slice(b",\"bytes_out\":");
    push_u64(buf, r.bytes_out);
    if let Some(c) = r.connect {
        buf.extend_from_slice(b",\"connect_ms\":");
        push_ms(buf, c);
    }
    buf.extend_from_slice(b",\"duration_ms\":");
    push_ms(buf, r.duration);
    buf.extend_from_slice(b",\"end\":\"");
    buf.extend_from_slice(r.end.as_bytes());
    buf.extend_from_slice(b"\"}}\n");
}

/// Apache's combined format: `CLIENT - - [TIME] "REQUEST" STATUS BYTES "REFERER"
/// "USER-AGENT"`, the quoted values escaped as Apache escapes them.
fn combined_line(buf: &mut Vec<u8>, f: &Finish, unix_ns: u64) {
    let c = f.combined();
    push_ip(buf, f.client);
    buf.extend_from_slice(b" - - [");
    push_clf_time(buf, unix_ns);
    buf.extend_from_slice(b"] \"");
    buf.extend_from_slice(f.method.as_str().as_bytes());
    buf.push(b' ');
    push_escaped(buf, f.path.as_str().as_bytes());
    buf.push(b' ');
    buf.extend_from_slice(format!("{:?}", f.version).as_bytes());
    buf.extend_from_slice(b"\" ");
    push_u64(buf, u64::from(f.status));
    buf.push(b' ');
    match c.and_then(|c| c.bytes) {
        Some(n) => push_u64(buf, n),
        None => buf.push(b'-'),
    }
    for v in [
        c.and_then(|c| c.referer.as_ref()),
        c.and_then(|c| c.user_agent.as_ref()),
    ] {
        buf.extend_from_slice(b" \"");
        match v {
            Some(v) => push_escaped(buf, v.as_bytes()),
            None => buf.push(b'-'),
        }
        buf.push(b'"');
    }
    buf.push(b'\n');
}

/// A quoted value as Apache writes it: `"` and `\` escaped, other bytes outside
/// printable ASCII as `\xHH`.
fn push_escaped(buf: &mut Vec<u8>, v: &[u8]) {
    for &b in v {
        match b {
            b'"' | b'\\' => buf.extend_from_slice(&[b'\\', b]),
            0x20..=0x7e => buf.push(b),
            _ => buf.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
        }
    }
}

/// `10/Oct/2000:13:55:36 +0000` (UTC).
fn push_clf_time(buf: &mut Vec<u8>, unix_ns: u64) {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = unix_ns / 1_000_000_000;
    let (y, m, d) = civil((secs / 86_400) as i64);
    let t = secs % 86_400;
    let month = MONTHS[(m as usize).clamp(1, 12) - 1];
    let text = format!(
        "{d:02}/{month}/{y:04}:{:02}:{:02}:{:02} +0000",
        t / 3600,
        t / 60 % 60,
        t % 60
    );
    buf.extend_from_slice(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(backend: &str, total_us: u64) -> Said<'_> {
        Said {
            backend,
            tries: 2,
            pool: Some("web"),
            protocol: "h1",
            total: Duration::from_micros(total_us),
        }
    }

    fn finish() -> Finish {
        Finish {
            started: Stamp::now(),
            method: Method::GET,
            path: PathAndQuery::from_static("/a?b=c%22"),
            client: "10.0.0.7".parse().unwrap(),
            version: http::Version::HTTP_11,
            status: 502,
            upstream: Some(Latency::from(Duration::from_micros(1018))),
            retries: 1,
            id: super::super::request_id::RequestId::from_peer(b"abc-123").unwrap(),
            extra: None,
            split: false,
            trace: None,
        }
    }

    #[test]
    fn addresses_and_quoted_names() {
        for ip in [
            "0.0.0.0",
            "10.0.0.7",
            "1.20.100.9",
            "255.255.255.255",
            "::1",
            "2001:db8::7",
        ] {
            let mut b = Vec::new();
            push_ip(&mut b, ip.parse().unwrap());
            assert_eq!(String::from_utf8(b).unwrap(), ip);
        }
        for name in [
            "b1",
            "127.0.0.1:8080",
            "é-ü",
            "a\"b",
            "a\\b",
            "a\u{7f}",
            "a\tb",
        ] {
            let mut b = Vec::new();
            push_quoted(&mut b, name);
            assert_eq!(String::from_utf8(b).unwrap(), format!("{name:?}"));
        }
    }

    #[test]
    fn dates_and_times() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(20_421), (2025, 11, 29));
        assert_eq!(civil(11_016), (2000, 2, 29));
        let mut b = Vec::new();
        push_timestamp(&mut b, 1_764_455_751_049_566_999);
        assert_eq!(String::from_utf8(b).unwrap(), "2025-11-29T22:35:51.049566Z");
        let mut b = Vec::new();
        push_ms(&mut b, Duration::from_micros(2_005));
        push_u64(&mut b, 0);
        assert_eq!(b, b"2.0050");
        for n in [9, 10, 99, 100, 999, 1000, 65_535, u64::MAX] {
            let mut b = Vec::new();
            push_u64(&mut b, n);
            assert_eq!(b, n.to_string().as_bytes());
        }
    }

    #[test]
    fn text_line_reads_like_the_rest_of_the_log() {
        let mut b = Vec::new();
        access_line(
            &mut b,
            AccessFormat::Text,
            &finish(),
            &said("a \"b\"", 1_301),
        );
        let line = String::from_utf8(b).unwrap();
        let (_, rest) = line.split_once("Z  INFO ").unwrap();
        assert_eq!(
            rest,
            "access client=10.0.0.7 protocol=h1 method=GET path=/a?b=c%22 status=502 backend=\"a \\\"b\\\"\" pool=\"web\" upstream_ms=1.018 total_ms=1.301 retries=1 tries=2 request_id=abc-123\n"
        );
    }

    #[test]
    fn combined_line_reads_as_apache_writes_it() {
        let mut f = finish();
        f.extra = Some(Box::new(Extra::Combined(Combined {
            referer: Some(http::HeaderValue::from_static("http://a.example/\"x\"")),
            user_agent: None,
            bytes: Some(2326),
        })));
        let mut b = Vec::new();
        access_line(&mut b, AccessFormat::Combined, &f, &said("x", 0));
        let line = String::from_utf8(b).unwrap();
        let (head, rest) = line.split_once(" [").unwrap();
        assert_eq!(head, "10.0.0.7 - -");
        let (time, rest) = rest.split_once("] ").unwrap();
        assert_eq!(time.len(), "10/Oct/2000:13:55:36 +0000".len(), "{time}");
        assert!(
            time.ends_with(" +0000") && time[3..6].chars().all(|c| c.is_ascii_alphabetic()),
            "{time}"
        );
        assert_eq!(
            rest,
            "\"GET /a?b=c%22 HTTP/1.1\" 502 2326 \"http://a.example/\\\"x\\\"\" \"-\"\n"
        );
    }

    #[test]
    fn json_line_is_json() {
        let mut b = Vec::new();
        access_line(
            &mut b,
            AccessFormat::Json,
            &finish(),
            &said("a \"b\"", 1_301),
        );
        assert_eq!(b.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["level"], "INFO");
        let f = &v["fields"];
        assert_eq!(f["message"], "access");
        assert_eq!(f["client"], "10.0.0.7");
        assert_eq!(f["path"], "/a?b=c%22");
        assert_eq!(f["backend"], "a \"b\"");
        assert_eq!(f["status"], 502);
        assert_eq!(f["upstream_ms"], 1.018);
        assert_eq!(f["retries"], 1);
        assert_eq!(f["request_id"], "abc-123");
        assert_eq!(f.get("client_cert"), Some(&serde_json::Value::Null), "{f}");
    }
}

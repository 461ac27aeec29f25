//! A pool's `discover` setting (`docs/discovery.md`): where its backends come from
//! when no list names them — SRV records, A/AAAA records, or a watched file.
//!
//! The file's inline table, `POST /admin/pools`' and the store's JSON object and the
//! `--discover` flag all come down to the same pairs of key and text, checked here.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use super::values::parse_positive_duration;

/// How often a name is looked up again at most, unless a pool says otherwise.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// The shortest re-resolution interval: TTLs are clamped to at least this too.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Why `discover` and `backends` are refused together.
pub(crate) const WITH_BACKENDS: &str =
    "discover and backends together: a pool's backends come from one or the other";

/// The keys of a `discover` table.
pub(crate) const KEYS: [&str; 5] = ["srv", "dns", "file", "scheme", "interval"];

/// What a pool's backends are found from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// An SRV name (`_http._tcp.api.internal`): one backend per record.
    Srv(String),
    /// A name's A and AAAA records, each address with `port`.
    Dns {
        /// The name looked up.
        host: String,
        /// The port of every backend.
        port: u16,
    },
    /// A JSON file of backends, re-read when it changes.
    File(PathBuf),
}

/// A pool's `discover` setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiscoverSpec {
    /// What is looked up or read.
    pub(crate) target: Target,
    /// The scheme of the backends found (`scheme`); `None`: the pool's own (`http`, or
    /// `tcp` in a TCP pool).
    pub(crate) scheme: Option<Scheme>,
    /// The longest time between two lookups (a TTL is clamped to [1 s, interval]); for
    /// a file, how often it is read again even without a change seen.
    pub(crate) interval: Duration,
}

/// The scheme of discovered backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
    Tcp,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
            Scheme::Tcp => "tcp",
        }
    }
}

impl DiscoverSpec {
    /// `srv`, `dns` or `file`.
    pub(crate) fn kind(&self) -> &'static str {
        match self.target {
            Target::Srv(_) => "srv",
            Target::Dns { .. } => "dns",
            Target::File(_) => "file",
        }
    }

    /// What is looked up or read, as written.
    pub(crate) fn target_text(&self) -> String {
        match &self.target {
            Target::Srv(name) => name.clone(),
            Target::Dns { host, port } => format!("{host}:{port}"),
            Target::File(p) => p.display().to_string(),
        }
    }

    /// `http`, `https` or `tcp`.
    pub(crate) fn scheme(&self) -> &'static str {
        self.scheme.unwrap_or(Scheme::Http).as_str()
    }

    /// The setting as a pool of `mode` follows it: its scheme the pool's unless given.
    pub(crate) fn for_mode(&self, mode: super::tcp::PoolMode) -> DiscoverSpec {
        let own = match mode {
            super::tcp::PoolMode::Http => Scheme::Http,
            super::tcp::PoolMode::Tcp => Scheme::Tcp,
        };
        DiscoverSpec {
            scheme: Some(self.scheme.unwrap_or(own)),
            ..self.clone()
        }
    }

    /// Why the setting does not fit a pool of `mode`: a scheme of the other kind.
    pub(crate) fn fits(&self, mode: super::tcp::PoolMode) -> Result<(), String> {
        match (self.scheme, mode) {
            (Some(s @ (Scheme::Http | Scheme::Https)), super::tcp::PoolMode::Tcp) => Err(format!(
                "discover.scheme '{}' in a TCP pool: its backends are tcp://HOST:PORT",
                s.as_str()
            )),
            (Some(Scheme::Tcp), super::tcp::PoolMode::Http) => {
                Err("discover.scheme 'tcp' needs a pool with mode = \"tcp\"".into())
            }
            _ => Ok(()),
        }
    }

    /// The setting from its keys and texts, each checked; the message names the key.
    pub(crate) fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, String)>,
    ) -> Result<DiscoverSpec, String> {
        let mut target = None;
        let mut scheme = None;
        let mut interval = DEFAULT_INTERVAL;
        for (key, text) in pairs {
            match key {
                "srv" | "dns" | "file" => {
                    if target.is_some() {
                        return Err(one_source());
                    }
                    target = Some(parse_target(key, &text)?);
                }
                "scheme" => {
                    scheme = Some(match text.as_str() {
                        "http" => Scheme::Http,
                        "https" => Scheme::Https,
                        "tcp" => Scheme::Tcp,
                        _ => {
                            return Err(format!(
                                "invalid discover.scheme '{text}' (valid: http, https, tcp)"
                            ))
                        }
                    })
                }
                "interval" => interval = parse_interval(&text)?,
                k => {
                    return Err(format!(
                        "unknown key 'discover.{k}' (valid: {})",
                        KEYS.join(", ")
                    ))
                }
            }
        }
        let target = target.ok_or_else(one_source)?;
        Ok(DiscoverSpec {
            target,
            scheme,
            interval,
        })
    }

    /// `--discover KIND=TARGET[,scheme=https][,interval=DUR]`.
    pub(crate) fn parse_flag(s: &str) -> Result<DiscoverSpec, String> {
        let pairs = s.split(',').map(|p| match p.split_once('=') {
            Some((k, v)) => Ok((k.trim(), v.trim().to_string())),
            None => Err(format!(
                "invalid --discover part '{p}' (expected KEY=VALUE, such as dns=api.internal:8080)"
            )),
        });
        DiscoverSpec::from_pairs(pairs.collect::<Result<Vec<_>, _>>()?)
    }

    /// The setting from a JSON object (`POST /admin/pools`, the store).
    pub(crate) fn from_json(v: &Value) -> Result<DiscoverSpec, String> {
        let Value::Object(fields) = v else {
            return Err(
                "invalid discover: expected an object such as {\"dns\": \"api.internal:8080\"}"
                    .into(),
            );
        };
        let pairs = fields.iter().map(|(k, v)| match v {
            Value::String(s) => Ok((k.as_str(), s.clone())),
            _ => Err(format!("invalid discover.{k}: expected a string")),
        });
        DiscoverSpec::from_pairs(pairs.collect::<Result<Vec<_>, _>>()?)
    }

    /// The JSON object [`Self::from_json`] reads back.
    pub(crate) fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert(self.kind().into(), Value::String(self.target_text()));
        if let Some(s) = self.scheme {
            m.insert("scheme".into(), Value::String(s.as_str().into()));
        }
        let interval = super::values::duration_text(self.interval);
        m.insert("interval".into(), Value::String(interval));
        Value::Object(m)
    }
}

fn one_source() -> String {
    "discover takes exactly one of srv, dns and file".into()
}

/// A re-resolution interval: a duration of at least [`MIN_INTERVAL`].
fn parse_interval(text: &str) -> Result<Duration, String> {
    let d = parse_positive_duration(text).map_err(|e| format!("discover.interval: {e}"))?;
    if d < MIN_INTERVAL {
        return Err(format!(
            "invalid discover.interval '{text}' (at least 1s: a name is not looked up more often)"
        ));
    }
    Ok(d)
}

/// The `srv`, `dns` or `file` value.
fn parse_target(key: &str, text: &str) -> Result<Target, String> {
    match key {
        "srv" => {
            check_name(text).map_err(|e| format!("invalid discover.srv '{text}': {e}"))?;
            Ok(Target::Srv(text.to_string()))
        }
        "dns" => {
            let bad = |why: &str| format!("invalid discover.dns '{text}': {why}");
            let (host, port) = text
                .rsplit_once(':')
                .ok_or_else(|| bad("expected NAME:PORT, such as api.internal:8080"))?;
            let port = port
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad("the port is a number from 1 to 65535"))?;
            check_name(host).map_err(|e| bad(&e))?;
            Ok(Target::Dns {
                host: host.to_string(),
                port,
            })
        }
        _ if text.trim().is_empty() => Err("invalid discover.file: the path is empty".into()),
        _ => Ok(Target::File(PathBuf::from(text))),
    }
}

/// A DNS name: dot-separated labels of letters, digits, `-` and `_`, each 1 to 63
/// bytes, 253 in all; a final dot allowed.
fn check_name(name: &str) -> Result<(), String> {
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() || trimmed.len() > 253 {
        return Err("a DNS name has 1 to 253 characters".into());
    }
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    };
    if trimmed.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("a DNS name is dot-separated labels of letters, digits, '-' and '_'".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&'static str, &str)]) -> Result<DiscoverSpec, String> {
        DiscoverSpec::from_pairs(p.iter().map(|(k, v)| (*k, v.to_string())))
    }

    #[test]
    fn each_source_and_its_options() {
        let s = pairs(&[("srv", "_http._tcp.api.internal")]).unwrap();
        assert_eq!(s.kind(), "srv");
        assert_eq!((s.scheme, s.interval), (None, DEFAULT_INTERVAL));
        assert_eq!(s.scheme(), "http");
        use super::super::tcp::PoolMode;
        assert_eq!(s.for_mode(PoolMode::Tcp).scheme(), "tcp");
        assert_eq!(s.for_mode(PoolMode::Http).scheme(), "http");
        let tcp = pairs(&[("srv", "a"), ("scheme", "tcp")]).unwrap();
        assert!(tcp.fits(PoolMode::Tcp).is_ok() && tcp.fits(PoolMode::Http).is_err());
        let d = pairs(&[("dns", "api.internal:8080"), ("scheme", "https")]).unwrap();
        assert_eq!(
            d.target,
            Target::Dns {
                host: "api.internal".into(),
                port: 8080
            }
        );
        assert_eq!(d.scheme, Some(Scheme::Https));
        assert!(d.fits(super::super::tcp::PoolMode::Tcp).is_err());
        assert_eq!(
            d.for_mode(super::super::tcp::PoolMode::Tcp).scheme(),
            "https"
        );
        let f = DiscoverSpec::parse_flag("file=/etc/b.json,interval=90s").unwrap();
        assert_eq!(f.target, Target::File("/etc/b.json".into()));
        assert_eq!(f.interval, Duration::from_secs(90));
        assert_eq!(DiscoverSpec::from_json(&f.to_json()), Ok(f));
    }

    #[test]
    fn bad_settings_name_what_is_wrong() {
        let cases: [(&[(&str, &str)], &str); 9] = [
            (&[], "exactly one"),
            (&[("srv", "a"), ("dns", "b:1")], "exactly one"),
            (&[("dns", "api.internal")], "NAME:PORT"),
            (&[("dns", "api.internal:0")], "port"),
            (&[("dns", "api internal:80")], "labels"),
            (&[("srv", "")], "1 to 253"),
            (&[("srv", "a"), ("scheme", "ftp")], "scheme"),
            (&[("srv", "a"), ("interval", "500ms")], "at least 1s"),
            (&[("srv", "a"), ("color", "red")], "discover.color"),
        ];
        for (p, want) in cases {
            let e = pairs(p).unwrap_err();
            assert!(e.contains(want), "{p:?}: {e}");
        }
        assert!(DiscoverSpec::parse_flag("dns").is_err());
        assert!(DiscoverSpec::from_json(&serde_json::json!({"dns": 5})).is_err());
    }
}

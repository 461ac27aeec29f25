//! `[tls.acme]` (`docs/tls.md`, "Certificates from ACME"): where to order a certificate,
//! for which names, how to prove them, where to keep what the CA gives, and when to
//! renew. Read from the file only, like `[[tls.certs]]`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::de::DeValue;
use toml::Spanned;

use super::collector::Collector;
use super::options::FileType;

/// Where the account and the certificates are kept by default (the Debian package's
/// state directory).
pub(crate) const DEFAULT_STORAGE: &str = "/var/lib/fulcrum/acme";

/// Renewal starts this long before the expiry by default, as Caddy's and certbot's do
/// for 90-day certificates.
pub(crate) const DEFAULT_RENEW_BEFORE: Duration = Duration::from_secs(30 * 86_400);

const KEYS: &str = "directory, email, domains, challenge, storage, ca_file, renew_before";

/// How the CA is shown that fulcrum answers for a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// `http-01`: `GET /.well-known/acme-challenge/TOKEN` on the plain listener.
    Http01,
    /// `tls-alpn-01`: a handshake with ALPN `acme-tls/1` on the TLS listener.
    TlsAlpn01,
}

impl Challenge {
    fn parse(s: &str) -> Result<Challenge, String> {
        match s {
            "http-01" => Ok(Challenge::Http01),
            "tls-alpn-01" => Ok(Challenge::TlsAlpn01),
            _ => Err(format!(
                "unknown challenge '{s}' (valid: http-01, tls-alpn-01)"
            )),
        }
    }

    /// Its name in the protocol.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Challenge::Http01 => "http-01",
            Challenge::TlsAlpn01 => "tls-alpn-01",
        }
    }
}

/// The `[tls.acme]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AcmeSettings {
    /// The CA's directory URL.
    pub(crate) directory: String,
    /// The account's contact, without `mailto:`.
    pub(crate) email: Option<String>,
    /// The names of the one certificate ordered, lower case, the first naming its files.
    pub(crate) domains: Vec<String>,
    /// How the names are proven.
    pub(crate) challenge: Challenge,
    /// Where the account key and the certificates are kept.
    pub(crate) storage: PathBuf,
    /// Trust for the directory's own HTTPS instead of the system's.
    pub(crate) ca_file: Option<PathBuf>,
    /// Renew this long before the expiry (or at a third of the lifetime left, if sooner).
    pub(crate) renew_before: Duration,
    /// `FILE line N: tls.acme`, for an error found when every layer is applied.
    pub(crate) origin: String,
    /// `FILE line N: tls.acme.storage` and `…ca_file`, where they are set.
    pub(crate) storage_origin: Option<String>,
    pub(crate) ca_file_origin: Option<String>,
}

/// What a key of the table holds once read.
#[derive(Default)]
struct Read {
    directory: Option<String>,
    email: Option<String>,
    domains: Option<Vec<String>>,
    /// A key was there but unusable (already reported): no "missing field" for it.
    bad: bool,
    challenge: Option<Challenge>,
    storage: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    renew_before: Option<Duration>,
    storage_origin: Option<String>,
    ca_file_origin: Option<String>,
}

/// Reads `[tls.acme]`; `None` (with the errors pushed) when it is unusable.
pub(super) fn read_table(
    c: &mut Collector<'_>,
    value: &Spanned<DeValue<'_>>,
) -> Option<AcmeSettings> {
    let at = value.span().start;
    let Some(table) = value.get_ref().as_table() else {
        c.push(at, Some("tls.acme"), "expected a table".into());
        return None;
    };
    let mut read = Read::default();
    for (key, v) in table {
        let k = key.get_ref().as_ref();
        let shown = format!("tls.acme.{k}");
        if k == "domains" {
            read.domains = read_domains(c, v, &shown);
            read.bad |= read.domains.is_none();
            continue;
        }
        if !KEYS.split(", ").any(|known| known == k) {
            read.bad = true;
            let msg = format!("unknown key '{shown}' (valid: {KEYS})");
            c.push(key.span().start, None, msg);
            continue;
        }
        let Some(text) = c.text_of(v, FileType::Str, &shown) else {
            read.bad = true;
            continue;
        };
        match k {
            "storage" => read.storage_origin = Some(c.origin_at(v.span().start, &shown)),
            "ca_file" => read.ca_file_origin = Some(c.origin_at(v.span().start, &shown)),
            _ => {}
        }
        if let Err(e) = read_one(&mut read, c, k, &text) {
            read.bad = true;
            c.push(v.span().start, Some(&shown), e);
        }
    }
    finish_table(c, at, read)
}

/// One string key of the table into `read`.
fn read_one(read: &mut Read, c: &Collector<'_>, key: &str, text: &str) -> Result<(), String> {
    match key {
        "directory" => read.directory = Some(directory_url(text)?),
        "email" => read.email = Some(email(text)?),
        "challenge" => read.challenge = Some(Challenge::parse(text)?),
        "storage" => read.storage = Some(c.relative_to_file(non_empty(text)?)),
        "ca_file" => read.ca_file = Some(c.relative_to_file(non_empty(text)?)),
        "renew_before" => {
            let d = super::values::parse_duration(text)?;
            if d.is_zero() {
                return Err("it must be more than 0".into());
            }
            read.renew_before = Some(d);
        }
        _ => return Err(format!("unknown key (valid: {KEYS})")),
    }
    Ok(())
}

fn finish_table(c: &mut Collector<'_>, at: usize, read: Read) -> Option<AcmeSettings> {
    if read.bad {
        return None;
    }
    let missing = |c: &mut Collector<'_>, key: &str| {
        c.push(at, Some("tls.acme"), format!("missing field '{key}'"));
    };
    let Some(directory) = read.directory else {
        missing(c, "directory");
        return None;
    };
    let Some(domains) = read.domains else {
        missing(c, "domains");
        return None;
    };
    Some(AcmeSettings {
        directory,
        email: read.email,
        domains,
        challenge: read.challenge.unwrap_or(Challenge::Http01),
        storage: read.storage.unwrap_or_else(|| DEFAULT_STORAGE.into()),
        ca_file: read.ca_file,
        renew_before: read.renew_before.unwrap_or(DEFAULT_RENEW_BEFORE),
        origin: c.origin_at(at, "tls.acme"),
        storage_origin: read.storage_origin,
        ca_file_origin: read.ca_file_origin,
    })
}

fn read_domains(
    c: &mut Collector<'_>,
    v: &Spanned<DeValue<'_>>,
    shown: &str,
) -> Option<Vec<String>> {
    let text = c.text_of(v, FileType::StrOrList, shown)?;
    match domains(&text) {
        Ok(d) => Some(d),
        Err(e) => {
            c.push(v.span().start, Some(shown), e);
            None
        }
    }
}

/// The directory: an `https://` URL (`http://` only for a CA on this host: the
/// account's requests are signed, but a directory read in the clear could be swapped).
fn directory_url(s: &str) -> Result<String, String> {
    let uri: http::Uri = s.parse().map_err(|e| format!("'{s}' is not a URL: {e}"))?;
    let local = |h: &str| {
        h == "localhost"
            || h.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    match (uri.scheme_str(), uri.host()) {
        (Some("https"), Some(_)) => Ok(s.to_string()),
        (Some("http"), Some(h)) if local(h) => Ok(s.to_string()),
        (Some("http"), Some(_)) => Err(format!(
            "'{s}': http:// is taken only for a CA on this host; use https://"
        )),
        _ => Err(format!("'{s}' is not an https:// URL")),
    }
}

fn email(s: &str) -> Result<String, String> {
    let s = s.strip_prefix("mailto:").unwrap_or(s);
    match s.split_once('@') {
        Some((user, host)) if !user.is_empty() && !host.is_empty() && !s.contains(' ') => {
            Ok(s.to_string())
        }
        _ => Err(format!("'{s}' is not an email address")),
    }
}

/// The names, comma-joined by the reader: each a DNS name (no wildcard: neither
/// challenge fulcrum answers can prove one), none twice, at least one.
fn domains(text: &str) -> Result<Vec<String>, String> {
    if text.trim().is_empty() {
        return Err("it needs at least one name".into());
    }
    let mut out: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim) {
        let name = name.to_ascii_lowercase();
        if name.starts_with("*.") {
            return Err(format!(
                "'{name}': a wildcard needs the dns-01 challenge, which fulcrum does not answer"
            ));
        }
        if !is_dns_name(&name) {
            return Err(format!("'{name}' is not a DNS name"));
        }
        if out.contains(&name) {
            return Err(format!("'{name}' is named twice"));
        }
        out.push(name);
    }
    Ok(out)
}

/// Letters, digits and hyphens in dot-separated labels of 1 to 63 characters; at most
/// 253 in all; not an IP address.
fn is_dns_name(name: &str) -> bool {
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(label_ok)
        && name.parse::<std::net::IpAddr>().is_err()
}

fn non_empty(s: &str) -> Result<&str, String> {
    if s.is_empty() {
        Err("the path is empty".into())
    } else {
        Ok(s)
    }
}

/// Checks the table against the other settings and the disk: a TLS listener to serve
/// the certificate, a `ca_file` that reads, a storage directory fulcrum can write (or
/// create) unless the fleet's store keeps everything. Nothing is left behind here:
/// `fulcrum check` changes nothing. Each error comes with where to point it.
pub(super) fn check(
    acme: &AcmeSettings,
    tls_listen: bool,
    in_store: bool,
) -> Vec<(String, String)> {
    let at = |o: &Option<String>| o.clone().unwrap_or_else(|| acme.origin.clone());
    let mut errors = Vec::new();
    if !tls_listen {
        let e = "it needs tls_listen: the certificate is served there".to_string();
        errors.push((acme.origin.clone(), e));
    }
    if let Some(ca) = &acme.ca_file {
        if let Err(e) = super::pem::read_ca_file(ca) {
            errors.push((at(&acme.ca_file_origin), e));
        }
    }
    if let (false, Err(e)) = (in_store, storage_usable(&acme.storage)) {
        errors.push((at(&acme.storage_origin), e));
    }
    errors
}

/// A directory fulcrum may write, or a path whose nearest existing parent is one.
fn storage_usable(path: &Path) -> Result<(), String> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(m) if !m.is_dir() => Err(format!("'{shown}' is not a directory")),
        Ok(_) if !writable(path) => Err(format!("'{shown}' is not writable")),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = path
                .ancestors()
                .skip(1)
                .find(|p| p.as_os_str().is_empty() || p.exists())
                .map(|p| {
                    if p.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        p
                    }
                })
                .unwrap_or(Path::new("/"));
            if parent.is_dir() && writable(parent) {
                Ok(())
            } else {
                Err(format!(
                    "'{shown}' does not exist and '{}' is not a writable directory to make it in",
                    parent.display()
                ))
            }
        }
        Err(e) => Err(format!("'{shown}': {e}")),
    }
}

/// Whether this process may create files in `dir`: a probe file is made and removed
/// (permission bits alone mislead for root, read-only mounts and `/proc`).
fn writable(dir: &Path) -> bool {
    let probe = dir.join(format!(".fulcrum-probe-{}", std::process::id()));
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .is_ok();
    if made {
        let _ = std::fs::remove_file(&probe);
    }
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_are_dns_names_once_each_and_no_wildcard() {
        assert_eq!(
            domains("A.example.test, www.example.test").unwrap(),
            ["a.example.test", "www.example.test"]
        );
        assert!(domains("*.example.test").unwrap_err().contains("dns-01"));
        assert!(domains("a.test,a.test").unwrap_err().contains("twice"));
        assert!(domains("exa mple.test").is_err());
        assert!(domains("127.0.0.1").is_err());
        assert!(domains("-a.test").is_err());
        assert!(domains("").unwrap_err().contains("at least one"));
    }

    #[test]
    fn challenges_by_their_protocol_names() {
        assert_eq!(Challenge::parse("http-01"), Ok(Challenge::Http01));
        assert_eq!(Challenge::parse("tls-alpn-01"), Ok(Challenge::TlsAlpn01));
        let e = Challenge::parse("http01").unwrap_err();
        assert!(e.contains("valid: http-01, tls-alpn-01"), "{e}");
    }

    #[test]
    fn the_directory_is_a_url_and_the_email_an_address() {
        assert!(directory_url("https://ca.test/dir").is_ok());
        assert!(directory_url("ca.test/dir").is_err());
        assert!(directory_url("ftp://ca.test/dir").is_err());
        assert!(directory_url("http://127.0.0.1:14000/dir").is_ok());
        assert!(directory_url("http://ca.test/dir")
            .unwrap_err()
            .contains("this host"));
        assert_eq!(email("mailto:ops@a.test").unwrap(), "ops@a.test");
        assert!(email("ops").is_err());
    }

    #[test]
    fn storage_must_be_a_writable_directory_or_makeable() {
        let dir = std::env::temp_dir().join(format!("fulcrum-acme-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(storage_usable(&dir).is_ok());
        assert!(storage_usable(&dir.join("new/deeper")).is_ok());
        let file = dir.join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(storage_usable(&file)
            .unwrap_err()
            .contains("not a directory"));
        assert!(storage_usable(&file.join("under")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

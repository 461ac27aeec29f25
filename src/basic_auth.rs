//! A route's basic authentication (`docs/policies.md`, "Basic auth"): the users of its
//! htpasswd file, and the credentials already verified. bcrypt is slow on purpose
//! (tens of milliseconds), so a credential that verified once is remembered — the
//! whole `Authorization` value, compared exactly — and later requests with it pay a
//! set lookup. The cache is bounded, and starts afresh with the routing table (a
//! reload re-reads the file).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use base64::Engine;
use http::HeaderValue;

use crate::config::policy::BasicAuth;

/// Verified credentials kept; past this the cache starts again (an attacker cannot grow
/// it: only credentials that verified enter it).
const CACHE: usize = 1024;

/// A bcrypt hash of nothing anyone knows, checked for an unknown user of a gate with no
/// users at all.
const DECOY: &str = "$2b$10$o.7EYV2AXCMxQAIhd5I8p.9yYRmpd8fcwtPiQIYdnC.JGHzNtT2Z.";

/// Verifications that may wait for a core beyond those running; past it, 503.
const MAX_WAITING: usize = 64;

/// A route's users and what was verified.
#[derive(Debug)]
pub struct Gate {
    /// `Basic realm="REALM"`.
    pub challenge: HeaderValue,
    users: Arc<BTreeMap<String, String>>,
    /// The hash an unknown user's password is checked against: one of the file's own,
    /// of its most common cost, so that a wrong user name takes as long as a wrong
    /// password whatever cost the file uses (the answer is "no" whatever it says).
    decoy: String,
    verified: Mutex<HashSet<Vec<u8>>>,
}

/// What a request's `Authorization` field says.
#[derive(Debug)]
pub enum Check {
    /// Verified before: let it through.
    Known,
    /// To verify (slow: on a blocking thread).
    Verify(Attempt),
    /// No credentials, or not of the Basic scheme, or not decodable.
    Missing,
}

/// Credentials to check against a hash.
#[derive(Debug)]
pub struct Attempt {
    password: String,
    hash: String,
    /// The user is in the file (else `hash` is the decoy, which never lets anyone in).
    known: bool,
    /// The whole field value, remembered when it verifies.
    pub field: Vec<u8>,
}

impl Attempt {
    /// Whether the password matches (bcrypt). An unknown user's is checked against the
    /// decoy all the same, and fails.
    pub fn verify(&self) -> bool {
        let matches = bcrypt::verify(&self.password, &self.hash).unwrap_or(false);
        matches && self.known
    }
}

impl Gate {
    /// The gate of `spec`, with nothing verified yet.
    pub(crate) fn new(spec: &BasicAuth) -> Gate {
        Gate::for_users(&spec.realm, spec.users.clone())
    }

    /// The gate of `realm` for `users` (name to bcrypt hash), nothing verified yet.
    pub fn for_users(realm: &str, users: BTreeMap<String, String>) -> Gate {
        let challenge = format!("Basic realm=\"{realm}\"");
        Gate {
            // A configured realm is checked to be printable and without quotes.
            challenge: HeaderValue::from_str(&challenge)
                .unwrap_or_else(|_| HeaderValue::from_static("Basic")),
            decoy: decoy_of(&users),
            users: Arc::new(users),
            verified: Mutex::new(HashSet::new()),
        }
    }

    /// Reads a request's `Authorization` value.
    pub fn check(&self, field: Option<&[u8]>) -> Check {
        let Some(field) = field else {
            return Check::Missing;
        };
        if self.lock().contains(field) {
            return Check::Known;
        }
        let Some((user, password)) = credentials(field) else {
            return Check::Missing;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.as_str(), true),
            None => (self.decoy.as_str(), false),
        };
        Check::Verify(Attempt {
            password,
            hash: hash.to_string(),
            known,
            field: field.to_vec(),
        })
    }

    /// Remembers a value that verified.
    pub fn remember(&self, field: Vec<u8>) {
        let mut v = self.lock();
        if v.len() >= CACHE {
            v.clear();
        }
        v.insert(field);
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<Vec<u8>>> {
        // Nothing panics while holding it.
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The hash of `users` whose bcrypt cost is the most common (the higher on a tie), or
/// [`DECOY`] for none.
fn decoy_of(users: &BTreeMap<String, String>) -> String {
    let mut by_cost: BTreeMap<u32, &str> = BTreeMap::new();
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for hash in users.values() {
        let cost = hash
            .split('$')
            .nth(2)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        by_cost.entry(cost).or_insert(hash);
        *counts.entry(cost).or_default() += 1;
    }
    let most = counts.iter().max_by_key(|&(cost, n)| (*n, *cost));
    most.and_then(|(cost, _)| by_cost.get(cost))
        .map_or(DECOY, |h| h)
        .to_string()
}

/// What a verification found.
#[derive(Debug)]
pub enum Verified {
    /// The password matches: the field value to remember.
    Yes(Vec<u8>),
    /// It does not (or the check could not run).
    No,
    /// Too many verifications running and waiting: try again in a second.
    Busy,
}

/// The verifications of the whole process: at most one per core runs, at most
/// [`MAX_WAITING`] more wait (`docs/policies.md`, "Basic auth").
struct Verifications {
    running: tokio::sync::Semaphore,
    /// Running and waiting.
    admitted: AtomicUsize,
    most: usize,
}

fn verifications() -> &'static Verifications {
    static V: OnceLock<Verifications> = OnceLock::new();
    V.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Verifications {
            running: tokio::sync::Semaphore::new(cores),
            admitted: AtomicUsize::new(0),
            most: cores + MAX_WAITING,
        }
    })
}

/// Takes one admitted place until dropped.
struct Admitted(&'static AtomicUsize);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Verifies `attempt` on a blocking thread (bcrypt takes tens of milliseconds: not on a
/// worker), once a core is free. A caller that goes away while it waits (its client
/// closed or reset the stream) drops this future, and the check never starts; one that
/// started runs to its end, holding its core.
pub async fn verify(attempt: Attempt) -> Verified {
    let v = verifications();
    if v.admitted.fetch_add(1, Ordering::AcqRel) >= v.most {
        v.admitted.fetch_sub(1, Ordering::AcqRel);
        return Verified::Busy;
    }
    let _place = Admitted(&v.admitted);
    let Ok(permit) = v.running.acquire().await else {
        return Verified::No;
    };
    let checked = tokio::task::spawn_blocking(move || {
        let _core = permit;
        attempt.verify().then_some(attempt.field)
    });
    match checked.await {
        Ok(Some(field)) => Verified::Yes(field),
        _ => Verified::No,
    }
}

/// The user and password of a `Basic` value.
fn credentials(field: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(field).ok()?.trim();
    let (scheme, token) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let pair = String::from_utf8(raw).ok()?;
    let (user, password) = pair.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> Gate {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        Gate::new(&BasicAuth {
            realm: "ops".into(),
            users_file: "/dev/null".into(),
            users: [("alice".to_string(), hash)].into(),
        })
    }

    fn basic(user: &str, password: &str) -> Vec<u8> {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {token}").into_bytes()
    }

    #[test]
    fn good_credentials_verify_once_and_are_remembered() {
        let g = gate();
        assert_eq!(g.challenge, "Basic realm=\"ops\"");
        let good = basic("alice", "s3cret");
        let Check::Verify(a) = g.check(Some(&good)) else {
            panic!("not verified yet")
        };
        assert!(a.verify());
        g.remember(a.field);
        assert!(matches!(g.check(Some(&good)), Check::Known));
        for bad in [basic("alice", "nope"), basic("bob", "s3cret")] {
            match g.check(Some(&bad)) {
                Check::Verify(a) => assert!(!a.verify()),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(g.check(None), Check::Missing));
        assert!(matches!(g.check(Some(b"Bearer x")), Check::Missing));
        assert!(matches!(g.check(Some(b"Basic !!!")), Check::Missing));
        // The decoy is alice's own hash: an unknown user costs what a wrong password
        // does, and her password does not let another name in.
        match g.check(Some(&basic("mallory", "s3cret"))) {
            Check::Verify(a) => assert!(!a.known && !a.verify()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(bcrypt::verify("x", DECOY), Ok(false)));
    }

    #[test]
    fn the_decoy_has_the_files_most_common_cost() {
        let h = |cost| bcrypt::hash("x", cost).unwrap();
        let users: BTreeMap<String, String> = [
            ("a".to_string(), h(4)),
            ("b".to_string(), h(5)),
            ("c".to_string(), h(5)),
        ]
        .into();
        assert!(decoy_of(&users).starts_with("$2b$05$"));
        assert_eq!(decoy_of(&BTreeMap::new()), DECOY);
    }
}

//! A route's basic authentication (`docs/policies.md`, "Basic auth"): the users of its
//! htpasswd file, and the credentials already verified. bcrypt is slow on purpose
//! (tens of milliseconds), so a credential that verified once is remembered — the
//! whole `Authorization` value, compared exactly — and later requests with it pay a
//! set lookup. The cache is bounded, and starts afresh with the routing table (a
//! reload re-reads the file).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine;
use http::HeaderValue;

use crate::config::policy::BasicAuth;

/// Verified credentials kept; past this the cache starts again (an attacker cannot grow
/// it: only credentials that verified enter it).
const CACHE: usize = 1024;

/// A bcrypt hash of nothing anyone knows, checked for an unknown user so that a wrong
/// user name takes as long as a wrong password.
const DECOY: &str = "$2b$10$o.7EYV2AXCMxQAIhd5I8p.9yYRmpd8fcwtPiQIYdnC.JGHzNtT2Z.";

/// A route's users and what was verified.
#[derive(Debug)]
pub struct Gate {
    /// `Basic realm="REALM"`.
    pub challenge: HeaderValue,
    users: Arc<BTreeMap<String, String>>,
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
    /// The whole field value, remembered when it verifies.
    pub field: Vec<u8>,
}

impl Attempt {
    /// Whether the password matches (bcrypt).
    pub fn verify(&self) -> bool {
        bcrypt::verify(&self.password, &self.hash).unwrap_or(false)
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
        let hash = self.users.get(&user).map_or(DECOY, String::as_str);
        Check::Verify(Attempt {
            password,
            hash: hash.to_string(),
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
        // The decoy is a real hash: an unknown user costs what a wrong password does.
        assert!(matches!(bcrypt::verify("x", DECOY), Ok(false)));
    }
}

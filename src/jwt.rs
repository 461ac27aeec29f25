//! Bearer tokens (`docs/policies.md`, "Bearer tokens (JWT)"): a route's key set and the
//! check of a token against it. The signature and the time claims are jsonwebtoken's
//! (on ring, as the TLS stack is); what is decided here is which tokens get that far:
//! only the asymmetric algorithms of [`ALGORITHMS`] — `none` and HMAC are refused
//! whatever a token's header says, so a public key can never be used as an HMAC
//! secret — and which keys a token is checked against.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use http::header::{HeaderName, HeaderValue};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

/// Why a route's `jwt` refused a request (`fulcrum_jwt_refused_total{route,reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JwtRefusal {
    /// No bearer token (nor the `token_cookie`).
    Missing,
    /// Not a JWS of three parts, or its header, claims or encoding unreadable.
    Malformed,
    /// An algorithm not taken (`none`, HMAC, …), or one its key does not name.
    Algorithm,
    /// Its `kid` names no key of the set.
    UnknownKey,
    /// No key of the set verifies its signature.
    Signature,
    /// Past `exp` (leeway counted), or no `exp`.
    Expired,
    /// Before `nbf` (leeway counted).
    NotYetValid,
    /// `iss` missing or not the configured issuer.
    Issuer,
    /// `aud` missing or naming none of the configured audiences.
    Audience,
    /// The route holds no key set yet (its `jwks_url` never answered).
    NoKeys,
}

impl JwtRefusal {
    /// The label values, in the order of the variants.
    pub(crate) const ALL: [&'static str; 10] = [
        "missing",
        "malformed",
        "algorithm",
        "unknown_key",
        "signature",
        "expired",
        "not_yet_valid",
        "issuer",
        "audience",
        "no_keys",
    ];

    /// Its label value.
    pub(crate) fn label(self) -> &'static str {
        Self::ALL[self as usize]
    }
}

/// The algorithms a token may be signed with.
pub(crate) const ALGORITHMS: [Algorithm; 7] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// `exp` and `nbf` are checked with this much slack for clocks apart.
pub(crate) const LEEWAY_SECS: u64 = 60;

/// The kind of key an algorithm verifies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Rsa,
    Ec,
    Ed,
}

fn family(alg: Algorithm) -> Option<Family> {
    match alg {
        Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512 | Algorithm::PS256 => {
            Some(Family::Rsa)
        }
        Algorithm::ES256 | Algorithm::ES384 => Some(Family::Ec),
        Algorithm::EdDSA => Some(Family::Ed),
        _ => None,
    }
}

/// One public key of a set.
struct Key {
    kid: Option<String>,
    /// The algorithm the key names (`alg`): a token must use exactly it.
    alg: Option<Algorithm>,
    family: Family,
    key: DecodingKey,
}

/// The usable keys of a JWK set (RFC 7517): RSA, EC (P-256, P-384) and Ed25519 public
/// keys meant for signatures. Symmetric keys and keys for encryption are left out.
pub(crate) struct KeySet {
    keys: Vec<Key>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<_> = self.keys.iter().map(|k| k.kid.as_deref()).collect();
        f.debug_struct("KeySet").field("kids", &kids).finish()
    }
}

impl KeySet {
    /// Reads a JWK set; the message says why it is not one, or why none of its keys is
    /// usable.
    pub(crate) fn parse(text: &[u8]) -> Result<KeySet, String> {
        let doc: Value =
            serde_json::from_slice(text).map_err(|e| format!("not a JWK set (not JSON: {e})"))?;
        let list = doc
            .get("keys")
            .and_then(Value::as_array)
            .ok_or("not a JWK set (no \"keys\" list)")?;
        let keys: Vec<Key> = list.iter().filter_map(usable).collect();
        if keys.is_empty() {
            return Err(format!(
                "the JWK set holds no usable public key ({} keys; RSA, EC P-256/P-384 or Ed25519 for signatures expected)",
                list.len()
            ));
        }
        Ok(KeySet { keys })
    }

    /// How many keys it holds.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}

/// A key of the set as a [`Key`], or `None` when it cannot verify a token here.
fn usable(v: &Value) -> Option<Key> {
    let jwk: Jwk = serde_json::from_value(v.clone()).ok()?;
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Family::Rsa,
        AlgorithmParameters::EllipticCurve(p)
            if matches!(p.curve, EllipticCurve::P256 | EllipticCurve::P384) =>
        {
            Family::Ec
        }
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => Family::Ed,
        _ => return None,
    };
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(a) => Some(key_algorithm(a).filter(|a| self::family(*a) == Some(family))?),
    };
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        family,
        key,
    })
}

/// A JWK's `alg` as a signature algorithm taken here.
fn key_algorithm(a: KeyAlgorithm) -> Option<Algorithm> {
    Some(match a {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// What a token is checked for beside its signature.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Claims {
    /// `iss` must be this.
    pub(crate) issuer: Option<String>,
    /// `aud` must name one of these (none: `aud` is not checked).
    pub(crate) audiences: Vec<String>,
    /// The algorithms taken (none: all of [`ALGORITHMS`]).
    pub(crate) algorithms: Vec<Algorithm>,
}

/// A token that verified: its claims and when it stops being good.
#[derive(Debug)]
pub(crate) struct Verified {
    /// Its claims.
    pub(crate) claims: Map<String, Value>,
    /// `exp`, in seconds since the epoch.
    pub(crate) exp: u64,
}

/// What a token's header says, read before any key is touched.
struct Head {
    alg: Algorithm,
    kid: Option<String>,
}

/// Reads the token's header: `Err` for a shape that is not a JWS or an algorithm not
/// taken here (`none` and HMAC among them).
fn head(token: &str) -> Result<Head, JwtRefusal> {
    let mut parts = token.split('.');
    let (Some(h), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtRefusal::Malformed);
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(h)
        .map_err(|_| JwtRefusal::Malformed)?;
    let doc: Map<String, Value> =
        serde_json::from_slice(&bytes).map_err(|_| JwtRefusal::Malformed)?;
    let alg = doc
        .get("alg")
        .and_then(Value::as_str)
        .ok_or(JwtRefusal::Malformed)?;
    let alg = ALGORITHMS
        .into_iter()
        .find(|a| format!("{a:?}") == alg)
        .ok_or(JwtRefusal::Algorithm)?;
    let kid = match doc.get("kid") {
        None => None,
        Some(Value::String(k)) => Some(k.clone()),
        Some(_) => return Err(JwtRefusal::Malformed),
    };
    Ok(Head { alg, kid })
}

/// Checks `token` against `keys` and `rules`: the signature with the key its `kid`
/// names (without one, each key of its algorithm's kind in turn), then `exp` (required)
/// and `nbf` with [`LEEWAY_SECS`], `iss` and `aud` when configured.
pub(crate) fn verify(token: &str, keys: &KeySet, rules: &Claims) -> Result<Verified, JwtRefusal> {
    let head = head(token)?;
    if !rules.algorithms.is_empty() && !rules.algorithms.contains(&head.alg) {
        return Err(JwtRefusal::Algorithm);
    }
    let fam = family(head.alg).ok_or(JwtRefusal::Algorithm)?;
    let mut candidates = keys.keys.iter().filter(|k| {
        k.family == fam
            && k.alg.is_none_or(|a| a == head.alg)
            && (head.kid.is_none() || k.kid == head.kid)
    });
    let validation = validation(head.alg, rules);
    let mut refusal = match &head.kid {
        // A key of that id for another algorithm: no fetch will change that.
        Some(kid) if keys.keys.iter().any(|k| k.kid.as_ref() == Some(kid)) => JwtRefusal::Algorithm,
        Some(_) => JwtRefusal::UnknownKey,
        None => JwtRefusal::Signature,
    };
    for key in candidates.by_ref() {
        match jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation) {
            Ok(data) => {
                let exp = data.claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
                return Ok(Verified {
                    claims: data.claims,
                    exp,
                });
            }
            Err(e) => {
                refusal = refusal_of(e.kind());
                if refusal != JwtRefusal::Signature {
                    return Err(refusal);
                }
            }
        }
    }
    Err(refusal)
}

fn validation(alg: Algorithm, rules: &Claims) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = LEEWAY_SECS;
    v.validate_nbf = true;
    let mut required = vec!["exp"];
    if let Some(iss) = &rules.issuer {
        v.set_issuer(&[iss]);
        required.push("iss");
    }
    v.validate_aud = !rules.audiences.is_empty();
    if v.validate_aud {
        v.set_audience(&rules.audiences);
        required.push("aud");
    }
    v.set_required_spec_claims(&required);
    v
}

fn refusal_of(kind: &jsonwebtoken::errors::ErrorKind) -> JwtRefusal {
    use jsonwebtoken::errors::ErrorKind as K;
    match kind {
        K::InvalidSignature => JwtRefusal::Signature,
        K::ExpiredSignature => JwtRefusal::Expired,
        K::ImmatureSignature => JwtRefusal::NotYetValid,
        K::InvalidIssuer => JwtRefusal::Issuer,
        K::InvalidAudience => JwtRefusal::Audience,
        K::MissingRequiredClaim(c) if c == "exp" => JwtRefusal::Expired,
        K::MissingRequiredClaim(c) if c == "iss" => JwtRefusal::Issuer,
        K::MissingRequiredClaim(c) if c == "aud" => JwtRefusal::Audience,
        K::InvalidAlgorithm | K::MissingAlgorithm => JwtRefusal::Algorithm,
        _ => JwtRefusal::Malformed,
    }
}

/// Seconds since the epoch now.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A claim as a field value: a string as it is, a list joined with `, `, anything else
/// as JSON; `None` when it cannot be a field value (a control character).
pub(crate) fn claim_value(v: &Value) -> Option<HeaderValue> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    };
    HeaderValue::from_str(&text).ok()
}

/// The fields `claims_to_headers` makes of a verified token's claims (absent claims
/// make none).
pub(crate) fn claim_fields(
    claims: &Map<String, Value>,
    to_headers: &[(String, HeaderName)],
) -> Vec<(HeaderName, HeaderValue)> {
    to_headers
        .iter()
        .filter_map(|(claim, name)| Some((name.clone(), claim_value(claims.get(claim)?)?)))
        .collect()
}

/// The fuzz target `bearer_token` (`src/fuzzing.rs`): whatever the bytes, reading them
/// as a JWK set and checking them as a token never panics; a token that verifies against
/// the fixed set has an `exp`, and its claims make field values without a panic.
#[cfg(any(fuzzing, test))]
pub(crate) fn fuzz_token(data: &[u8]) {
    use std::sync::OnceLock;
    static KEYS: OnceLock<Option<KeySet>> = OnceLock::new();
    if let Ok(set) = KeySet::parse(data) {
        assert!(set.len() > 0, "a set is made of usable keys only");
    }
    let keys = KEYS.get_or_init(|| {
        let jwks = br#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","kid":"a"},
            {"kty":"EC","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;
        KeySet::parse(jwks).ok()
    });
    let Some(keys) = keys else {
        return;
    };
    let text = String::from_utf8_lossy(data);
    let rules = Claims {
        issuer: Some("https://id.test".into()),
        audiences: vec!["api".into()],
        algorithms: Vec::new(),
    };
    if let Ok(v) = verify(&text, keys, &rules) {
        assert!(v.exp > 0, "a verified token has an exp");
        let to_headers = [("sub".to_string(), HeaderName::from_static("x-user"))];
        let _ = claim_fields(&v.claims, &to_headers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_and_hmac_are_refused_before_any_key() {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        for alg in ["none", "HS256", "HS512", "RS1"] {
            let token = format!("{}.{}.", b64(&format!("{{\"alg\":\"{alg}\"}}")), b64("{}"));
            assert_eq!(head(&token).err(), Some(JwtRefusal::Algorithm), "{alg}");
        }
        assert_eq!(head("a.b").err(), Some(JwtRefusal::Malformed));
        assert_eq!(head("!!.b.c").err(), Some(JwtRefusal::Malformed));
    }

    #[test]
    fn key_sets_without_usable_keys_are_refused() {
        assert!(KeySet::parse(b"[]").is_err());
        assert!(KeySet::parse(b"{\"keys\": 3}").is_err());
        let oct = br#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#;
        assert!(KeySet::parse(oct).unwrap_err().contains("no usable"));
        let ed = br#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","kid":"a"}]}"#;
        let set = KeySet::parse(ed).unwrap();
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn claims_become_field_values() {
        let v = serde_json::json!(["a", 1, {"b": 2}]);
        assert_eq!(claim_value(&v).unwrap(), "a, 1, {\"b\":2}");
        assert_eq!(claim_value(&serde_json::json!(42)).unwrap(), "42");
        assert!(claim_value(&serde_json::json!("a\nb")).is_none());
    }
}

//! One certificate order (RFC 8555 §7.4): the account, the order, each name's challenge
//! answered and announced, the CSR, the chain.

use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeHandle, ChallengeType, Identifier,
    NewAccount, NewOrder, Order, OrderStatus, RetryPolicy,
};

use super::storage::{Answer, Storage};
use crate::config::acme::{AcmeSettings, Challenge};
use crate::obtained::Obtained;

/// The stored account: its credentials and the directory they belong to.
const ACCOUNT: &str = "account.json";

/// How long the CA may take to validate the names, then to issue.
const VALIDATION: Duration = Duration::from_secs(90);

/// The chain and its private key, both PEM, as the CA issued them.
pub(super) struct Pem {
    pub(super) chain: String,
    pub(super) key: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredAccount {
    directory: String,
    credentials: AccountCredentials,
}

/// The stored account for this directory, else a new one (stored before it is used).
pub(super) async fn account(s: &AcmeSettings, storage: &dyn Storage) -> Result<Account, String> {
    let builder =
        || Account::builder_with_http(Box::new(super::client::Client::new(s.ca_file.clone())));
    if let Some(bytes) = storage.get(ACCOUNT).await?.filter(|b| !b.is_empty()) {
        match serde_json::from_slice::<StoredAccount>(&bytes) {
            Ok(stored) if stored.directory == s.directory => {
                return builder()
                    .from_credentials(stored.credentials)
                    .await
                    .map_err(|e| format!("the stored account: {e}"));
            }
            Ok(_) => tracing::info!(
                "acme: the stored account is another CA's; registering with this one"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "acme: the stored account does not parse; registering again")
            }
        }
    }
    let contact = s.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let new = NewAccount {
        contact: &contacts,
        terms_of_service_agreed: true,
        only_return_existing: false,
    };
    let (account, credentials) = builder()
        .create(&new, s.directory.clone(), None)
        .await
        .map_err(|e| format!("cannot register an account with {}: {e}", s.directory))?;
    let stored = StoredAccount {
        directory: s.directory.clone(),
        credentials,
    };
    let bytes = serde_json::to_vec(&stored).map_err(|e| e.to_string())?;
    storage.put(ACCOUNT, bytes).await?;
    Ok(account)
}

/// What is answered for the CA while an order runs, withdrawn when it ends however it
/// ends.
struct Answers<'a> {
    obtained: &'a Obtained,
    tokens: Vec<String>,
    names: Vec<String>,
}

impl Drop for Answers<'_> {
    fn drop(&mut self) {
        for t in &self.tokens {
            self.obtained.forget_token(t);
        }
        for n in &self.names {
            self.obtained.forget_alpn(n);
        }
    }
}

impl Answers<'_> {
    /// Gives the answer to `challenge` of `name` here, and returns it for the other
    /// instances.
    fn give(
        &mut self,
        kind: Challenge,
        name: &str,
        challenge: &ChallengeHandle<'_>,
    ) -> Result<Answer, String> {
        let key_auth = challenge.key_authorization();
        Ok(match kind {
            Challenge::Http01 => {
                self.obtained
                    .answer_token(&challenge.token, key_auth.as_str());
                self.tokens.push(challenge.token.clone());
                Answer::Http {
                    token: challenge.token.clone(),
                    key_authorization: key_auth.as_str().to_string(),
                }
            }
            Challenge::TlsAlpn01 => {
                let (cert, key) = alpn_certificate(name, key_auth.digest().as_ref())?;
                let certified = super::challenge_certified(cert.as_bytes(), key.as_bytes())?;
                self.obtained.answer_alpn(name, certified);
                self.names.push(name.to_string());
                Answer::Alpn {
                    name: name.to_string(),
                    cert,
                    key,
                }
            }
        })
    }
}

/// Orders a certificate for `s.domains` and waits for it; the answers to the CA are
/// given here and published through `storage` for the other instances of a fleet.
pub(super) async fn order(
    s: &AcmeSettings,
    account: &Account,
    obtained: &Obtained,
    storage: &dyn Storage,
) -> Result<Pem, String> {
    let ids: Vec<Identifier> = s.domains.iter().cloned().map(Identifier::Dns).collect();
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .map_err(|e| format!("the CA refused the order: {e}"))?;
    let mut answers = Answers {
        obtained,
        tokens: Vec::new(),
        names: Vec::new(),
    };
    answer_all(s, &mut order, &mut answers, storage).await?;
    let retries = RetryPolicy::new().timeout(VALIDATION);
    let status = order
        .poll_ready(&retries)
        .await
        .map_err(|e| format!("the names were not validated: {e}"))?;
    if status != OrderStatus::Ready {
        return Err(format!(
            "the order is {status:?}: the CA could not validate the names"
        ));
    }
    drop(answers);
    let (csr, key) = csr(&s.domains)?;
    order
        .finalize_csr(&csr)
        .await
        .map_err(|e| format!("the CA refused the CSR: {e}"))?;
    let chain = order
        .poll_certificate(&retries)
        .await
        .map_err(|e| format!("no certificate came: {e}"))?;
    Ok(Pem { chain, key })
}

/// Answers each pending authorization's challenge, publishes the answer, and tells
/// the CA to look.
async fn answer_all(
    s: &AcmeSettings,
    order: &mut Order,
    answers: &mut Answers<'_>,
    storage: &dyn Storage,
) -> Result<(), String> {
    let kind = match s.challenge {
        Challenge::Http01 => ChallengeType::Http01,
        Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
    };
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.map_err(|e| format!("cannot read an authorization: {e}"))?;
        match authz.status {
            AuthorizationStatus::Valid => continue,
            AuthorizationStatus::Pending => {}
            other => return Err(format!("an authorization is {other:?}")),
        }
        let name = authz.identifier().to_string();
        let what = s.challenge.name();
        let mut challenge = authz
            .challenge(kind.clone())
            .ok_or_else(|| format!("the CA offers no {what} challenge for {name}"))?;
        storage
            .publish(answers.give(s.challenge, &name, &challenge)?)
            .await?;
        challenge
            .set_ready()
            .await
            .map_err(|e| format!("cannot announce the challenge for {name}: {e}"))?;
    }
    Ok(())
}

/// Drops the stored account (the CA no longer knows it): the next order registers.
pub(super) async fn forget_account(storage: &dyn Storage) {
    if let Err(e) = storage.put(ACCOUNT, Vec::new()).await {
        tracing::warn!(error = %e, "acme: the stored account could not be dropped");
    }
}

/// A new P-256 key and a CSR for `names` signed with it (PEM key).
fn csr(names: &[String]) -> Result<(Vec<u8>, String), String> {
    let key = rcgen::KeyPair::generate().map_err(|e| format!("cannot make a key: {e}"))?;
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(|e| e.to_string())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .map_err(|e| format!("cannot make the CSR: {e}"))?;
    Ok((csr.der().to_vec(), key.serialize_pem()))
}

/// The `tls-alpn-01` certificate for `name` (RFC 8737 §3): self-signed, for `name` only,
/// with the key authorization's digest in the critical `acmeIdentifier` extension; the
/// certificate and its key, PEM.
fn alpn_certificate(name: &str, digest: &[u8]) -> Result<(String, String), String> {
    let fail = |e: rcgen::Error| format!("cannot make the tls-alpn-01 certificate: {e}");
    let key = rcgen::KeyPair::generate().map_err(fail)?;
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).map_err(fail)?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params.self_signed(&key).map_err(fail)?;
    Ok((cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alpn_certificate_is_for_its_name_and_carries_the_digest() {
        let digest = [7u8; 32];
        let (cert, key) = alpn_certificate("a.test", &digest).unwrap();
        let cert = crate::acme::challenge_certified(cert.as_bytes(), key.as_bytes()).unwrap();
        let der = cert.end_entity_cert().unwrap().as_ref().to_vec();
        // The extension's OID (1.3.6.1.5.5.7.1.31) and the digest as an OCTET STRING.
        let oid = [0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x1f];
        assert!(der.windows(oid.len()).any(|w| w == oid));
        let mut value = vec![0x04, 0x20];
        value.extend_from_slice(&digest);
        assert!(der.windows(value.len()).any(|w| w == value.as_slice()));
        // The name as a dNSName of the subjectAltName ([2] IMPLICIT IA5String).
        assert!(der.windows(8).any(|w| w == b"\x82\x06a.test"));
    }

    #[test]
    fn the_csr_names_every_domain() {
        let (csr, key) = csr(&["a.test".into(), "b.test".into()]).unwrap();
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
        for n in ["a.test", "b.test"] {
            assert!(csr.windows(n.len()).any(|w| w == n.as_bytes()));
        }
    }
}

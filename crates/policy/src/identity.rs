//! Identities: which sandbox is asking, and which rules it may use.
//!
//! A sandbox is recognised by a `Proxy-Authorization` token (Basic — the password, or the user
//! when there is no password — or Bearer), compared in constant time against every identity's
//! token, or by its source address. An identity with both needs both. Without `[identities]` in
//! the policy every client is `default` and may use every rule.

use std::collections::BTreeSet;
use std::net::IpAddr;

use base64::Engine;

use crate::secrets::SecretStore;
use crate::wire::cidr::Cidr;

/// The name every client has when the policy defines no identities.
pub const DEFAULT_IDENTITY: &str = "default";

/// The store key of an identity's token (not a valid secret name, so never clashes).
pub fn token_key(identity: &str) -> String {
    format!("identity:{identity}")
}

/// Which rules an identity may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleSet {
    All,
    Named(BTreeSet<String>),
}

impl RuleSet {
    pub fn allows(&self, rule: &str) -> bool {
        match self {
            RuleSet::All => true,
            RuleSet::Named(names) => names.contains(rule),
        }
    }
}

/// A compiled identity.
#[derive(Debug, Clone)]
pub struct Identity {
    pub name: String,
    /// Whether a token is required (its value lives in the secret store under [`token_key`]).
    pub has_token: bool,
    pub sources: Vec<Cidr>,
    pub rules: RuleSet,
    /// `labels = { sandbox = "…", owner = "…" }`: facts about the sandbox, copied into
    /// approval requests (and audit records) so a reviewer knows whose request it is.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `limits = ["NAME", …]`: the `[limits.NAME]` every request of this identity is charged to.
    pub limits: Vec<String>,
    /// Set for a `[profiles.NAME]`: never recognised by token or address, only carried by an
    /// admitted runtime session (see [`crate::profile`]).
    pub profile: Option<std::sync::Arc<crate::profile::Profile>>,
}

/// Why a client could not be identified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifyError {
    #[error("no identity matches the Proxy-Authorization token sent")]
    UnknownToken,
    #[error("client {0} sent no Proxy-Authorization and matches no identity's sources")]
    Unidentified(IpAddr),
    #[error("the token of identity {identity:?} is unavailable: {why}")]
    TokenUnavailable { identity: String, why: String },
}

/// The token in a `Proxy-Authorization` value: Bearer's token, or Basic's password (the user
/// when the password is empty, for clients that put the token first).
pub fn presented_token(value: &[u8]) -> Option<zeroize::Zeroizing<Vec<u8>>> {
    let text = std::str::from_utf8(value).ok()?;
    let (scheme, rest) = text.trim().split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(zeroize::Zeroizing::new(rest.as_bytes().to_vec()));
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = zeroize::Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(rest)
                .ok()?,
        );
        let (user, pass) = match decoded.iter().position(|&b| b == b':') {
            Some(i) => (&decoded[..i], &decoded[i + 1..]),
            None => (&decoded[..], &[][..]),
        };
        let token = if pass.is_empty() { user } else { pass };
        return Some(zeroize::Zeroizing::new(token.to_vec()));
    }
    None
}

/// Identifies a client among `identities` by token and source address. A profile is never
/// matched here: only a session carries one.
pub async fn identify<'a>(
    identities: &'a [Identity],
    store: &SecretStore,
    proxy_authorization: Option<&[u8]>,
    client: IpAddr,
) -> Result<&'a Identity, IdentifyError> {
    let client = client.to_canonical();
    let in_sources =
        |id: &Identity| id.sources.is_empty() || id.sources.iter().any(|c| c.contains(client));
    match proxy_authorization.and_then(presented_token) {
        Some(token) => {
            // Compare against every token (constant time each) before deciding, so timing does
            // not tell which identity came close.
            let mut found = None;
            for id in identities
                .iter()
                .filter(|i| i.has_token && i.profile.is_none())
            {
                let value = store.get(&token_key(&id.name)).await.map_err(|e| {
                    IdentifyError::TokenUnavailable {
                        identity: id.name.clone(),
                        why: e.to_string(),
                    }
                })?;
                if value.ct_eq(&token) && found.is_none() && in_sources(id) {
                    found = Some(id);
                }
            }
            found.ok_or(IdentifyError::UnknownToken)
        }
        None => identities
            .iter()
            .find(|id| {
                !id.has_token && id.profile.is_none() && !id.sources.is_empty() && in_sources(id)
            })
            .ok_or(IdentifyError::Unidentified(client)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_taken_from_bearer_and_basic_forms() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let t = |v: &str| presented_token(v.as_bytes()).map(|z| z.to_vec());
        assert_eq!(t("Bearer abc123"), Some(b"abc123".to_vec()));
        assert_eq!(
            t(&format!("Basic {}", b64("ci:tok-1"))),
            Some(b"tok-1".to_vec())
        );
        assert_eq!(
            t(&format!("Basic {}", b64("tok-2:"))),
            Some(b"tok-2".to_vec())
        );
        assert_eq!(
            t(&format!("Basic {}", b64("tok-3"))),
            Some(b"tok-3".to_vec())
        );
        assert_eq!(t("Digest x"), None);
        assert_eq!(t("Basic !!!"), None);
    }
}

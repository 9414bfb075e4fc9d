//! Sessions a sandbox proves instead of carrying a token: a workload token (a Kubernetes
//! projected service-account token, a SPIFFE JWT-SVID, any OIDC ID token) verified against a
//! reviewed `[attest.NAME]` ([`crate::attest::verify`]) admits a session of the table's
//! profile, with labels mapped from its claims.
//!
//! Each distinct workload token is one session: its id is a keyed hash of the token, so the
//! same token presented again (on any replica) is the same session, found in the store like
//! any other; the workload token is its token (kept as a keyed hash). It expires when the
//! workload token does (never later than the profile's TTL), and revoking it refuses that
//! token from then on. The token is never kept, logged or shown.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{
    now_ms, unix_ms, Live, Refused, SessionDoc, Sessions, ID_PREFIX, NS_SESSIONS, TOMBSTONE,
};
use crate::attest::{self, Expect, Jwks};
use crate::policy::access::Attest;
use crate::policy::profile::NarrowRequest;
use crate::policy::Policy;

/// Clock skew allowed on a workload token's `exp`, `nbf` and `iat`.
pub const LEEWAY: Duration = Duration::from_secs(30);

/// Why a workload token admitted no session. Never carries the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttestRefused {
    #[error("workload token refused by [attest.{table}]: {why}")]
    Token {
        table: String,
        why: attest::AttestError,
    },
    #[error("no [attest] table names the issuer this workload token claims")]
    NoIssuer,
    #[error("[attest.{table}]: its keys are unavailable: {why}")]
    Keys { table: String, why: String },
    #[error("[attest.{table}]: profile {profile:?} {why}")]
    Profile {
        table: String,
        profile: String,
        why: String,
    },
    #[error("{0}")]
    Session(Refused),
}

impl AttestRefused {
    pub fn reason(&self) -> crate::reason::Reason {
        match self {
            AttestRefused::Keys { .. } => crate::reason::Reason::StateUnavailable,
            AttestRefused::Session(r) => r.reason(),
            _ => crate::reason::Reason::ProxyAuthRequired,
        }
    }
}

/// The `[attest]` table a workload token's (unverified) `iss` names: only to pick which keys
/// to verify it with; nothing is trusted before [`attest::verify`].
pub fn table_for<'p>(policy: &'p Policy, token: &str) -> Option<&'p Attest> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    if payload.len() > attest::MAX_TOKEN_BYTES {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let iss = claims.get("iss")?.as_str()?;
    policy.attest().iter().find(|a| a.issuer == iss)
}

/// Whether a presented credential has the shape of a JWS (three base64url segments, the first
/// a JSON header): a workload token rather than a static identity's token.
pub fn looks_like_jwt(text: &str) -> bool {
    let mut parts = text.split('.');
    let (Some(h), Some(p), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    h.starts_with("eyJ") && !p.is_empty() && text.len() <= attest::MAX_TOKEN_BYTES
}

/// The `kid` a workload token's header names, if any (to pick or refresh keys; not trusted).
pub fn token_kid(token: &str) -> Option<String> {
    jsonwebtoken::decode_header(token).ok()?.kid
}

impl Sessions {
    /// The session `token` (a workload token `table` trusts, verified with `jwks`) proves,
    /// made on first presentation.
    pub async fn admit_attested(
        &self,
        policy: &Policy,
        table: &Attest,
        jwks: &Jwks,
        token: &str,
        client: IpAddr,
    ) -> Result<Arc<Live>, AttestRefused> {
        let id = self.attested_id(&table.name, token);
        // Presented before (here or on another replica): the ordinary admission.
        match self.admit_token(&id, token.as_bytes(), client).await {
            Err(Refused::Unknown { .. }) => {}
            other => return other.map_err(AttestRefused::Session),
        }
        let expect = Expect {
            issuer: &table.issuer,
            audience: &table.audience,
            leeway: LEEWAY,
        };
        let claims = attest::verify(token, jwks, &expect, SystemTime::now()).map_err(|why| {
            AttestRefused::Token {
                table: table.name.clone(),
                why,
            }
        })?;
        let refused = |why: String| AttestRefused::Profile {
            table: table.name.clone(),
            profile: table.profile.clone(),
            why,
        };
        let identity = policy
            .identity(&table.profile)
            .filter(|i| i.profile.is_some())
            .ok_or_else(|| refused("is not defined by the policy in force".to_string()))?;
        let terms = identity
            .profile
            .as_ref()
            .ok_or_else(|| refused("is not a profile".to_string()))?;
        let mut labels: BTreeMap<String, String> = identity.labels.clone();
        labels.insert("attest".to_string(), table.name.clone());
        // A claim the token lacks leaves its label out; a label the profile requires must
        // be there (from a claim or the profile).
        for (label, path) in &table.labels {
            // The profile's labels (and `attest`) are the reviewed ones: a claim never
            // replaces them.
            if let Some(v) = claims.get(path) {
                labels
                    .entry(label.clone())
                    .or_insert_with(|| v.chars().take(256).collect());
            }
        }
        if let Some(missing) = terms
            .require_labels
            .iter()
            .find(|k| !labels.contains_key(*k))
        {
            let from = table.labels.get(missing).map_or(
                String::from("no claim maps to it in [attest] labels"),
                |p| format!("the token has no claim.{p}"),
            );
            return Err(refused(format!("requires label {missing:?}: {from}")));
        }
        let now = now_ms();
        let max = now + terms.max_ttl.as_millis() as u64;
        let expires_at = unix_ms(claims.expires_at()).min(max);
        let reach = crate::policy::reach::session_reach(
            policy,
            identity,
            &crate::policy::profile::Narrowing::default(),
        )
        .reach;
        let doc = SessionDoc {
            id: id.clone(),
            profile: identity.name.clone(),
            token_hash: hex::encode(self.hash(token.as_bytes())),
            labels,
            created_at: now,
            expires_at,
            max_expires_at: expires_at,
            source: None,
            narrow: NarrowRequest::default(),
            reach,
            created_by: Some(format!("attest:{}", table.name)),
            revoked_at: None,
            revoked_by: None,
        };
        let bytes = serde_json::to_vec(&doc).map_err(|e| refused(e.to_string()))?;
        let kept = Duration::from_millis(expires_at.saturating_sub(now)) + TOMBSTONE;
        let stored = self
            .store
            .put_new(NS_SESSIONS, &id, &bytes, Some(kept))
            .await
            .map_err(|e| AttestRefused::Session(Refused::Unavailable(e.to_string())))?;
        if stored {
            self.counters
                .created
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(session = %id, profile = %doc.profile, attest = %table.name, "session attested");
        }
        // Stored now (by this call or a concurrent one): admit it as any session.
        self.admit_token(&id, token.as_bytes(), client)
            .await
            .map_err(AttestRefused::Session)
    }

    /// The session id of a workload token under `table`: a keyed hash, so it names the token
    /// without revealing it.
    fn attested_id(&self, table: &str, token: &str) -> String {
        let mut input = Vec::with_capacity(table.len() + token.len() + 8);
        input.extend_from_slice(b"attest\n");
        input.extend_from_slice(table.as_bytes());
        input.push(b'\n');
        input.extend_from_slice(token.as_bytes());
        let hash = self.hash(&input);
        format!("{ID_PREFIX}{}", hex::encode(&hash[..16]))
    }
}

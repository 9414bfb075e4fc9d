//! Sessions at the proxy: recognising a presented session on any listener, and the one check
//! every request and gated connection under a session passes.
//!
//! - Proxy hop: `Proxy-Authorization: Basic base64(SESSION_ID:TOKEN)` ([`Proxy::session_by_header`]).
//! - SOCKS5: username `SESSION_ID`, password `TOKEN` ([`Proxy::session_by_user`]).
//! - Transparent and DNS-routed capture, where a client presents nothing: the source address a
//!   session was bound to ([`Proxy::session_by_source`]).
//!
//! Once admitted, the session rides on the request context ([`super::pipeline::Ctx::session`])
//! and the connection's [`Cut`] is attached to it, so revoking the session ends the
//! connection. [`check`] runs once per gated connection and once per request: the session is
//! still live (the store is read again while the watcher is not fresh, failing closed), its
//! profile still exists and the session still fits it under the policy in force; the record
//! then names the session, its profile, labels and reach.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Proxy;
use crate::audit::Entry;
use crate::governance::attest;
use crate::governance::sessions::{self, attested, Live, Refused, Scoped, Sessions};
use crate::policy::access::{Attest, JwksSource};
use crate::policy::Policy;
use crate::reason::{Reason, Refusal};
use crate::wire::cut::Cut;

impl Proxy {
    /// The sessions on the state store, set once when serving starts.
    pub fn sessions(&self) -> Option<&Arc<Sessions>> {
        self.sessions.get()
    }

    /// Sets the sessions (once; later calls are ignored).
    pub fn set_sessions(&self, sessions: Arc<Sessions>) {
        let _ = self.sessions.set(sessions);
    }

    /// The session a `Proxy-Authorization` value presents: `None` when it presents none (no
    /// header, or one that is not `Basic SESSION_ID:TOKEN`: static identities then apply).
    pub(crate) async fn session_by_header(
        &self,
        value: Option<&[u8]>,
        client: SocketAddr,
    ) -> Option<Result<Arc<Live>, Refusal>> {
        let (id, token) = sessions::presented(value?)?;
        Some(self.admit_token(&id, &token, client.ip()).await)
    }

    /// The session a SOCKS5 username and password present (`None`: the username is not a
    /// session id).
    pub(crate) async fn session_by_user(
        &self,
        user: &[u8],
        password: &[u8],
        client: SocketAddr,
    ) -> Option<Result<Arc<Live>, Refusal>> {
        let id = std::str::from_utf8(user)
            .ok()
            .filter(|u| sessions::is_session_id(u))?;
        Some(self.admit_token(id, password, client.ip()).await)
    }

    /// The session a workload token proves (`Proxy-Authorization: Bearer JWT`, or Basic with
    /// user `attest` and the token as password), when the policy has `[attest]` tables: `None`
    /// when none is presented.
    pub(crate) async fn session_by_attestation(
        &self,
        value: Option<&[u8]>,
        client: SocketAddr,
    ) -> Option<Result<Arc<Live>, Refusal>> {
        let policy = self.policy();
        if policy.attest().is_empty() {
            return None;
        }
        let token = attested_token(value?)?;
        let Some(sessions) = self.sessions() else {
            return Some(Err(Refusal::new(
                Reason::StateUnavailable,
                "a workload token was presented, and latchkey has no state store for sessions",
            )));
        };
        let Some(table) = attested::table_for(&policy, &token) else {
            let e = attested::AttestRefused::NoIssuer;
            return Some(Err(Refusal::new(e.reason(), e.to_string())));
        };
        let jwks = match self
            .jwks(table, attested::token_kid(&token).as_deref())
            .await
        {
            Ok(jwks) => jwks,
            Err(e) => return Some(Err(Refusal::new(e.reason(), e.to_string()))),
        };
        Some(
            sessions
                .admit_attested(&policy, table, &jwks, &token, client.ip())
                .await
                .map_err(|e| Refusal::new(e.reason(), e.to_string())),
        )
    }

    /// `table`'s keys: from its file, or fetched from its URL through the guarded client,
    /// cached (refreshed when a token names a key the set lacks, at most every 10 s).
    async fn jwks(
        &self,
        table: &Attest,
        kid: Option<&str>,
    ) -> Result<Arc<attest::Jwks>, attested::AttestRefused> {
        let cache = {
            let mut caches = self
                .jwks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let key = format!("{}\n{:?}", table.name, table.jwks);
            caches
                .entry(key)
                .or_insert_with(|| {
                    Arc::new(attest::JwksCache::new(
                        Duration::from_secs(300),
                        Duration::from_secs(10),
                        Duration::from_secs(3600),
                    ))
                })
                .clone()
        };
        let source = table.jwks.clone();
        let client = self.upstream_client();
        cache
            .get(kid, Instant::now(), move || fetch_jwks(client, source))
            .await
            .map_err(|e| attested::AttestRefused::Keys {
                table: table.name.clone(),
                why: e.to_string(),
            })
    }

    async fn admit_token(
        &self,
        id: &str,
        token: &[u8],
        client: IpAddr,
    ) -> Result<Arc<Live>, Refusal> {
        let Some(sessions) = self.sessions() else {
            return Err(Refusal::new(
                Reason::StateUnavailable,
                "a session was presented, and latchkey has no state store to check it in",
            ));
        };
        sessions
            .admit_token(id, token, client)
            .await
            .map_err(|e| refusal(&e))
    }

    /// The session bound to `client`'s address, if any (a store that cannot answer refuses:
    /// the client may be a bound session).
    /// What a record says of the session bound to `client`'s address, if one is (for the
    /// listeners outside this crate that record a client's traffic: the DNS resolver).
    pub async fn source_attribution(
        &self,
        client: SocketAddr,
        policy: &Policy,
    ) -> Option<Attribution> {
        let live = self.session_by_source(client).await.ok().flatten()?;
        let reach = live
            .scoped(policy)
            .map(|s| s.reach.clone())
            .unwrap_or_default();
        Some(Attribution {
            id: live.id.clone(),
            profile: live.profile.clone(),
            labels: live.labels.clone(),
            reach,
        })
    }

    pub(crate) async fn session_by_source(
        &self,
        client: SocketAddr,
    ) -> Result<Option<Arc<Live>>, Refusal> {
        let Some(sessions) = self.sessions() else {
            return Ok(None);
        };
        sessions
            .admit_source(client.ip())
            .await
            .map_err(|e| refusal(&e))
    }
}

/// A workload token in a `Proxy-Authorization` value: `Bearer JWT`, or `Basic` with user
/// `attest` and the token as password.
fn attested_token(value: &[u8]) -> Option<String> {
    use base64::Engine;
    let text = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = text.split_once(' ')?;
    let token = if scheme.eq_ignore_ascii_case("bearer") {
        rest.trim().to_string()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        text.strip_prefix("attest:")?.to_string()
    } else {
        return None;
    };
    attested::looks_like_jwt(&token).then_some(token)
}

/// Reads a JWKS: a file, or an https URL through the guarded client (5 s, 256 KiB at most).
async fn fetch_jwks(
    client: crate::upstream::Client,
    source: JwksSource,
) -> Result<Vec<u8>, String> {
    use http_body_util::BodyExt;
    match source {
        JwksSource::File(path) => {
            let bytes = tokio::fs::read(&path)
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if bytes.len() > attest::MAX_JWKS_BYTES {
                return Err(format!(
                    "{}: larger than {} bytes",
                    path.display(),
                    attest::MAX_JWKS_BYTES
                ));
            }
            Ok(bytes)
        }
        JwksSource::Url(url) => {
            let req = http::Request::get(url.as_str())
                .header(http::header::ACCEPT, "application/json")
                .body(super::body::empty())
                .map_err(|e| e.to_string())?;
            let exchange = async {
                let res = client
                    .request(req)
                    .await
                    .map_err(|e| format!("{url}: {}", crate::reason::chain_text(&e)))?;
                if !res.status().is_success() {
                    return Err(format!("{url}: status {}", res.status()));
                }
                let limited = http_body_util::Limited::new(res.into_body(), attest::MAX_JWKS_BYTES);
                limited
                    .collect()
                    .await
                    .map(|b| b.to_bytes().to_vec())
                    .map_err(|e| format!("{url}: {e}"))
            };
            tokio::time::timeout(Duration::from_secs(5), exchange)
                .await
                .map_err(|_| format!("{url}: no answer within 5 s"))?
        }
    }
}

/// A session as a record names it.
#[derive(Debug, Clone)]
pub struct Attribution {
    pub id: String,
    pub profile: String,
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its reach under the policy asked about (empty when it no longer fits its profile).
    pub reach: String,
}

/// The refusal an admission failure is.
pub(crate) fn refusal(e: &Refused) -> Refusal {
    Refusal::new(e.reason(), e.to_string())
}

/// The check of a request's (or a gated connection's) session, and its record's attribution:
/// the session still live, its profile defined, its narrowing still within the profile under
/// `policy`. Attaches `cut` (the connection's switch), so revoking the session ends the
/// connection. Guarantees on `Ok`: the record names the session, profile, labels and reach.
pub(crate) async fn check(
    proxy: &Proxy,
    policy: &Policy,
    live: &Live,
    client: IpAddr,
    cut: Option<&Arc<Cut>>,
    entry: &mut Entry,
) -> Result<Arc<Scoped>, Refusal> {
    let Some(sessions) = proxy.sessions() else {
        return Err(Refusal::new(
            Reason::StateUnavailable,
            "latchkey has no state store to check sessions in",
        ));
    };
    entry.set_session(&live.id, &live.profile);
    sessions.still_live(live).await.map_err(|e| refusal(&e))?;
    let scoped = live
        .scoped(policy)
        .map_err(|why| Refusal::new(Reason::ProxyAuthRequired, why))?;
    // A profile's `sources` bound every session of it, token-presented ones too.
    if let Some(profile) = policy.identity(&live.profile) {
        let ip = client.to_canonical();
        if !profile.sources.is_empty() && !profile.sources.iter().any(|c| c.contains(ip)) {
            return Err(Refusal::new(
                Reason::ProxyAuthRequired,
                format!(
                    "client {ip} is outside the sources of profile '{}': its sessions may be used only from there",
                    live.profile
                ),
            ));
        }
    }
    entry.set_ceiling(&live.labels, &scoped.reach);
    if let Some(cut) = cut {
        live.attach(cut, sessions::now_ms());
    }
    Ok(scoped)
}

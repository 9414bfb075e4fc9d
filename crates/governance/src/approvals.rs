//! Approvals on the state store: asking (one approval per distinct request, rate-limited per
//! identity), waiting for the answer (woken by the store's events, polling as well), answering
//! (compare-and-set, so two approvers cannot both decide), and the grants an answer leaves.
//!
//! A grant is looked up before anything is asked:
//! - `once`: keyed by the request's fingerprint (identity, method, full URL, body SHA-256) and
//!   consumed by deleting it, so exactly one request uses it, on whichever replica;
//! - a duration (`1h`): keyed by identity + rule + host, expiring with the store's TTL;
//! - `session`: keyed by identity + rule + host + the identity's session (a keyed hash of its
//!   token), so a new token finds no grant.
//!
//! Every key that holds request data is a keyed hash (HMAC-SHA256 with a key kept in the store,
//! shared by every replica): the store never holds a URL's query values, and a guessable value
//! cannot be confirmed from its hash. Depends on `state`, `policy` (scopes) and `record`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_lc_rs::hmac;
use serde::{Deserialize, Serialize};

use super::record::{self, Answer, Approval, State, CHANNEL_DECIDED, NS_APPROVAL};
use crate::policy::Scope;
use crate::state::{Added, StateError, StateStore};

/// Fingerprint → id of the approval that asked about that exact request.
const NS_BY_REQUEST: &str = "approval-request";
/// Standing grants (a duration or a session), by keyed hash of identity, rule, host (, session).
pub const NS_GRANT: &str = "grant";
/// One-time grants, by request fingerprint.
pub const NS_ONCE: &str = "grant-once";
/// Keys shared by every replica.
const NS_KEYS: &str = "keys";
/// A decided approval stays readable (for review and `export`) this long.
const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// A one-time grant nobody used is dropped after this long.
const ONCE_FOR: Duration = Duration::from_secs(24 * 3600);
/// A session grant lasts at most this long, even if the token never changes.
const SESSION_MAX: Duration = Duration::from_secs(30 * 24 * 3600);
/// How often a waiter re-reads its approval, whatever the events say (a lost event, or a
/// store without cross-process events, only delays the answer by this much).
const POLL: Duration = Duration::from_millis(500);
/// Most approvals a listing returns.
pub const LIST_MAX: usize = 1000;

/// A grant an approval left: what it lets through, until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The approval that made it.
    pub approval: String,
    pub identity: String,
    pub rule: String,
    pub scheme: String,
    pub host: String,
    pub port: u16,
    /// The request that was approved (a standing grant covers more than it: every method and
    /// path of the rule on this host).
    pub method: String,
    pub path: String,
    /// `once`, a duration (`1h`) or `session`.
    pub scope: String,
    pub by: String,
    #[serde(with = "record::rfc3339")]
    pub created: SystemTime,
    #[serde(with = "record::rfc3339")]
    pub expires: SystemTime,
}

/// What a request that needs a person is matched on.
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    pub identity: &'a str,
    pub rule: &'a str,
    pub host: &'a str,
    /// [`Approvals::fingerprint`] of the request.
    pub fingerprint: &'a str,
    /// [`Approvals::session`] of the identity now.
    pub session: &'a str,
}

/// What the store already says about a request.
#[derive(Debug, Clone)]
pub enum Found {
    /// A grant lets it through (a `once` grant is consumed by finding it).
    Granted(Grant),
    /// An approval for this exact request waits for an answer.
    Pending(Approval),
    /// This exact request was denied.
    Denied(Approval),
    /// Nothing: ask.
    Nothing,
}

/// The result of [`Approvals::ask`].
#[derive(Debug, Clone)]
pub enum Asked {
    /// A new approval, stored: notify about it.
    New(Approval),
    /// Someone asked about this exact request already (a concurrent twin): wait on theirs.
    Existing(Approval),
    /// This exact request was denied meanwhile.
    Denied(Approval),
    /// Over the identity's rate of new approval requests; asked nobody. Retry after this long.
    RateLimited(Duration),
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("no approval {0:?}")]
    NotFound(String),
    #[error("approval {id} is already {state}")]
    Conflict { id: String, state: &'static str },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StateError),
}

/// Approvals and grants, over one state store.
#[derive(Debug)]
pub struct Approvals {
    store: Arc<dyn StateStore>,
    key: HmacKey,
}

/// The HMAC key; its `Debug` prints nothing.
struct HmacKey(hmac::Key);

impl std::fmt::Debug for HmacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HmacKey(..)")
    }
}

/// The id of the key that keys request fingerprints (a retry matches its approval).
pub const KEY_FINGERPRINTS: &str = "fingerprints";

/// 32 random bytes kept in the store under `keys`/`id`, made by the first replica that needs
/// them and read by every other: keys every replica must share (fingerprints, link signatures).
pub async fn shared_key(store: &dyn StateStore, id: &str) -> Result<[u8; 32], StateError> {
    let mut fresh = [0u8; 32];
    aws_lc_rs::rand::fill(&mut fresh).map_err(|_| StateError::Backend {
        store: store.describe().to_string(),
        message: "the system random generator failed".to_string(),
    })?;
    store
        .put_new(NS_KEYS, id, hex::encode(fresh).as_bytes(), None)
        .await?;
    let bad = |why: &str| StateError::Backend {
        store: store.describe().to_string(),
        message: format!("the shared key {NS_KEYS}/{id} {why}"),
    };
    let stored = store
        .get(NS_KEYS, id)
        .await?
        .ok_or_else(|| bad("vanished"))?;
    let text = std::str::from_utf8(&stored.doc).map_err(|_| bad("is not text"))?;
    let mut key = [0u8; 32];
    // Strict: 64 hex digits (`from_str_radix` would also take a sign, `+a`).
    hex::decode_to_slice(text, &mut key).map_err(|_| bad("is not 64 hex digits"))?;
    Ok(key)
}

impl Approvals {
    /// Approvals over `store`, with the fingerprint key every replica shares.
    pub async fn open(store: Arc<dyn StateStore>) -> Result<Self, StateError> {
        let key = shared_key(store.as_ref(), KEY_FINGERPRINTS).await?;
        Ok(Self {
            store,
            key: HmacKey(hmac::Key::new(hmac::HMAC_SHA256, &key)),
        })
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    fn keyed(&self, parts: &[&[u8]]) -> String {
        let mut ctx = hmac::Context::with_key(&self.key.0);
        for p in parts {
            // Length-prefixed: no two part lists hash alike.
            ctx.update(&(p.len() as u64).to_be_bytes());
            ctx.update(p);
        }
        hex::encode(ctx.sign())
    }

    /// The keyed hash a retry of the same request (identity, method, full URL, body) matches.
    pub fn fingerprint(
        &self,
        identity: &str,
        method: &str,
        url: &str,
        body_sha256: &str,
    ) -> String {
        self.keyed(&[
            b"request",
            identity.as_bytes(),
            method.as_bytes(),
            url.as_bytes(),
            body_sha256.as_bytes(),
        ])
    }

    /// The keyed hash of what identifies the identity's session now (its token's value, or its
    /// sources): a `session` grant holds while this stays the same.
    pub fn session(&self, identity: &str, credential: &[u8]) -> String {
        self.keyed(&[b"session", identity.as_bytes(), credential])
    }

    fn grant_key(&self, k: &Key<'_>, session: Option<&str>) -> String {
        let s = session.unwrap_or_default();
        self.keyed(&[
            b"grant",
            k.identity.as_bytes(),
            k.rule.as_bytes(),
            k.host.as_bytes(),
            s.as_bytes(),
        ])
    }

    /// What the store says about this request, newest rights first: a one-time grant (taken),
    /// a session grant, a duration grant, then an approval of this exact request.
    pub async fn find(&self, k: &Key<'_>, now: SystemTime) -> Result<Found, StateError> {
        if let Some(v) = self.store.get(NS_ONCE, k.fingerprint).await? {
            // Only the caller whose delete removed it may use it.
            if self.store.delete(NS_ONCE, k.fingerprint).await? {
                if let Some(g) = parse::<Grant>(self.store.as_ref(), NS_ONCE, &v.doc)? {
                    return Ok(Found::Granted(g));
                }
            }
        }
        for session in [Some(k.session), None] {
            let id = self.grant_key(k, session);
            if let Some(v) = self.store.get(NS_GRANT, &id).await? {
                if let Some(g) = parse::<Grant>(self.store.as_ref(), NS_GRANT, &v.doc)? {
                    if g.expires > now {
                        return Ok(Found::Granted(g));
                    }
                }
            }
        }
        let Some(a) = self.by_request(k.fingerprint).await? else {
            return Ok(Found::Nothing);
        };
        Ok(match a.state_at(now) {
            State::Pending => Found::Pending(a),
            State::Denied => Found::Denied(a),
            State::Approved | State::Expired => Found::Nothing,
        })
    }

    async fn by_request(&self, fingerprint: &str) -> Result<Option<Approval>, StateError> {
        let Some(v) = self.store.get(NS_BY_REQUEST, fingerprint).await? else {
            return Ok(None);
        };
        let id = String::from_utf8_lossy(&v.doc).into_owned();
        self.get(&id).await
    }

    /// One approval by id.
    pub async fn get(&self, id: &str) -> Result<Option<Approval>, StateError> {
        match self.store.get(NS_APPROVAL, id).await? {
            Some(v) => parse(self.store.as_ref(), NS_APPROVAL, &v.doc),
            None => Ok(None),
        }
    }

    /// Stores `approval` (pending, its fingerprint set) unless this exact request already has
    /// a pending or denied approval, charging one new approval request to the identity's rate
    /// (`rate` per `window`).
    pub async fn ask(
        &self,
        approval: Approval,
        rate: u32,
        window: Duration,
        now: SystemTime,
    ) -> Result<Asked, StateError> {
        let ttl = ttl_until(approval.expires, now) + KEEP;
        let link_ttl = Some(ttl_until(approval.expires, now).max(Duration::from_secs(1)));
        for _ in 0..4 {
            // A twin already asked?
            if let Some(v) = self.store.get(NS_BY_REQUEST, &approval.fingerprint).await? {
                let id = String::from_utf8_lossy(&v.doc).into_owned();
                match self.get(&id).await?.map(|a| (a.state_at(now), a)) {
                    Some((State::Pending, a)) => return Ok(Asked::Existing(a)),
                    Some((State::Denied, a)) => return Ok(Asked::Denied(a)),
                    // Approved (and used) or expired: this is a new question.
                    _ => {
                        if !self
                            .store
                            .delete(NS_BY_REQUEST, &approval.fingerprint)
                            .await?
                        {
                            continue;
                        }
                    }
                }
            }
            if let Some(wait) = self
                .over_rate(&approval.identity, rate, window, now)
                .await?
            {
                return Ok(Asked::RateLimited(wait));
            }
            let doc = to_json(&approval);
            if !self
                .store
                .put_new(
                    NS_BY_REQUEST,
                    &approval.fingerprint,
                    approval.id.as_bytes(),
                    link_ttl,
                )
                .await?
            {
                // A twin won the race: wait on theirs (next round reads it).
                continue;
            }
            self.store
                .put(NS_APPROVAL, &approval.id, &doc, Some(ttl))
                .await?;
            return Ok(Asked::New(approval));
        }
        Err(StateError::Backend {
            store: self.store.describe().to_string(),
            message: "the approval for this request kept changing while it was read".to_string(),
        })
    }

    /// Charges one new approval request to `identity`'s window; `Some(wait)` when over.
    async fn over_rate(
        &self,
        identity: &str,
        rate: u32,
        window: Duration,
        now: SystemTime,
    ) -> Result<Option<Duration>, StateError> {
        let secs = window.as_secs().max(1);
        let t = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let start = t - t % secs;
        let key = format!(
            "ask-rate:{}:{start}",
            self.keyed(&[b"rate", identity.as_bytes()])
        );
        match self
            .store
            .add(&key, 1, Some(i64::from(rate)), Duration::from_secs(secs))
            .await?
        {
            Added::Ok(_) => Ok(None),
            Added::Over(_) => Ok(Some(Duration::from_secs(start + secs - t))),
        }
    }

    /// Waits up to `hold` for approval `id` to be answered; the approval as it then stands.
    pub async fn wait(&self, id: &str, hold: Duration) -> Result<Option<Approval>, StateError> {
        // Subscribed before the first read, so an answer between the two is not missed.
        let mut events = self.store.subscribe();
        let deadline = tokio::time::Instant::now() + hold;
        loop {
            let a = self.get(id).await?;
            let now = SystemTime::now();
            match &a {
                Some(a) if a.state_at(now) == State::Pending => {}
                _ => return Ok(a),
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(a);
            }
            let wake = async {
                loop {
                    match events.recv().await {
                        Ok(e) if e.channel == CHANNEL_DECIDED && e.message == id => return,
                        Ok(_) => {}
                        // Lagged: something may have been missed; re-read.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await
                        }
                    }
                }
            };
            let _ = tokio::time::timeout(left.min(POLL), wake).await;
        }
    }

    /// Answers approval `id`: `approve` (with one of the scopes it offers; the first when
    /// `answer.scope` is `None`) or `deny`. Only a pending approval can be answered, once.
    /// Leaves the grant, then wakes every waiter on every replica.
    pub async fn answer(
        &self,
        id: &str,
        mut answer: Answer,
        now: SystemTime,
    ) -> Result<(Approval, Option<Grant>), AnswerError> {
        let approve = match answer.decision.as_str() {
            "approve" => true,
            "deny" => false,
            other => {
                return Err(AnswerError::Invalid(format!(
                    "decision {other:?} is not \"approve\" or \"deny\""
                )))
            }
        };
        for _ in 0..4 {
            let Some(v) = self.store.get(NS_APPROVAL, id).await? else {
                return Err(AnswerError::NotFound(id.to_string()));
            };
            let Some(mut a) = parse::<Approval>(self.store.as_ref(), NS_APPROVAL, &v.doc)? else {
                return Err(AnswerError::NotFound(id.to_string()));
            };
            match a.state_at(now) {
                State::Pending => {}
                s => {
                    return Err(AnswerError::Conflict {
                        id: id.to_string(),
                        state: s.as_str(),
                    })
                }
            }
            let scope = if approve {
                let chosen = match answer.scope.as_deref() {
                    Some(s) => Scope::parse(s).map_err(AnswerError::Invalid)?,
                    None => a
                        .scopes
                        .first()
                        .and_then(|s| Scope::parse(s).ok())
                        .unwrap_or(Scope::Once),
                };
                if !a
                    .scopes
                    .iter()
                    .any(|s| Scope::parse(s).ok() == Some(chosen))
                {
                    return Err(AnswerError::Invalid(format!(
                        "scope {:?} is not one approval {id} offers ({})",
                        chosen.to_string(),
                        a.scopes.join(", ")
                    )));
                }
                Some(chosen)
            } else {
                None
            };
            answer.scope = scope.map(|s| s.to_string());
            answer.at = now;
            a.state = if approve {
                State::Approved
            } else {
                State::Denied
            };
            a.answer = Some(answer.clone());
            let doc = to_json(&a);
            if !self
                .store
                .replace(NS_APPROVAL, id, v.version, &doc, Some(KEEP))
                .await?
            {
                continue;
            }
            let grant = match scope {
                Some(s) => Some(self.grant(&a, s, &answer.by, now).await?),
                None => None,
            };
            self.store.publish(CHANNEL_DECIDED, id).await?;
            return Ok((a, grant));
        }
        Err(AnswerError::Store(StateError::Backend {
            store: self.store.describe().to_string(),
            message: format!("approval {id} kept changing while it was answered"),
        }))
    }

    async fn grant(
        &self,
        a: &Approval,
        scope: Scope,
        by: &str,
        now: SystemTime,
    ) -> Result<Grant, StateError> {
        let (ns, id, ttl) = {
            let k = Key {
                identity: &a.identity,
                rule: &a.rule,
                host: &a.host,
                fingerprint: &a.fingerprint,
                session: &a.session,
            };
            match scope {
                Scope::Once => (NS_ONCE, a.fingerprint.clone(), ONCE_FOR),
                Scope::For(d) => (NS_GRANT, self.grant_key(&k, None), d),
                Scope::Session => (NS_GRANT, self.grant_key(&k, Some(&a.session)), SESSION_MAX),
            }
        };
        let grant = Grant {
            approval: a.id.clone(),
            identity: a.identity.clone(),
            rule: a.rule.clone(),
            scheme: a.scheme.clone(),
            host: a.host.clone(),
            port: a.port,
            method: a.method.clone(),
            path: a.path.clone(),
            scope: scope.to_string(),
            by: by.to_string(),
            created: now,
            expires: now + ttl,
        };
        self.store.put(ns, &id, &to_json(&grant), Some(ttl)).await?;
        Ok(grant)
    }

    /// Approvals in `state` (`None`: all), as of `now`, newest first.
    pub async fn list(
        &self,
        state: Option<State>,
        now: SystemTime,
    ) -> Result<Vec<Approval>, StateError> {
        let mut out = Vec::new();
        for (_, v) in self.store.list(NS_APPROVAL, LIST_MAX).await? {
            if let Some(mut a) = parse::<Approval>(self.store.as_ref(), NS_APPROVAL, &v.doc)? {
                a.state = a.state_at(now);
                if state.is_none_or(|s| s == a.state) {
                    out.push(a);
                }
            }
        }
        out.sort_by_key(|a| std::cmp::Reverse(a.created));
        Ok(out)
    }

    /// Every grant still standing (one-time grants not yet used included), newest first.
    pub async fn grants(&self, now: SystemTime) -> Result<Vec<Grant>, StateError> {
        let mut out = Vec::new();
        for ns in [NS_GRANT, NS_ONCE] {
            for (_, v) in self.store.list(ns, LIST_MAX).await? {
                if let Some(g) = parse::<Grant>(self.store.as_ref(), ns, &v.doc)? {
                    if g.expires > now {
                        out.push(g);
                    }
                }
            }
        }
        out.sort_by_key(|a| std::cmp::Reverse(a.created));
        Ok(out)
    }
}

fn ttl_until(t: SystemTime, now: SystemTime) -> Duration {
    t.duration_since(now).unwrap_or_default()
}

fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising these plain structs cannot fail (string keys, no maps with other keys).
    serde_json::to_vec(v).unwrap_or_default()
}

/// A stored document read back; one that does not parse is reported (never silently used) and
/// treated as absent, so a corrupt record cannot grant anything.
fn parse<T: for<'de> Deserialize<'de>>(
    store: &dyn StateStore,
    ns: &str,
    doc: &[u8],
) -> Result<Option<T>, StateError> {
    match serde_json::from_slice(doc) {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            tracing::error!(store = store.describe(), ns, error = %e, "unreadable state record ignored");
            Ok(None)
        }
    }
}

#[cfg(test)]
#[path = "approvals_tests.rs"]
mod tests;

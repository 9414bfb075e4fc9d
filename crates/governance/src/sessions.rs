//! Sessions: a platform admits, scopes, attributes and revokes each sandbox at runtime.
//!
//! A session is made from a reviewed `[profiles.NAME]` with optional narrowing
//! ([`crate::policy::profile`]: never wider), lives in the state store ([`NS_SESSIONS`], so
//! every replica sees it at once), and is presented by the sandbox as `SESSION_ID:TOKEN`
//! (Proxy-Authorization Basic, SOCKS5 username/password) or by the source address it was bound
//! to. Its token is shown once and stored only as a keyed hash (HMAC-SHA256 under a key every
//! replica shares).
//!
//! Each process keeps the sessions it admitted in a bounded cache of [`Live`] entries. What a
//! cached entry may be trusted for is bounded in time: a watcher ([`Sessions::watch`]) polls
//! the store's recent ends ([`NS_ENDS`]) every [`POLL`] and wakes on the store's events; while
//! the last successful poll is older than [`FRESH`], every admission reads the store again, and
//! a store that cannot answer refuses it (`503 state_unavailable`). Revoking (or expiry) throws
//! the [`Cut`] of every connection the session holds, on every replica, within a poll.
//!
//! Depends on `policy` (profiles), `state`, `wire` (the cut switch, reasons); never on `proxy`.

mod admit;
pub mod attested;
mod store;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use aws_lc_rs::hmac;
use serde::{Deserialize, Serialize};

use crate::policy::profile::{NarrowRequest, Narrowing, TooWide};
use crate::policy::Policy;
use crate::reason::Reason;
use crate::state::{StateError, StateStore};
use crate::wire::cut::Cut;

pub use admit::{is_session_id, presented, Refused};
pub use store::{CreateError, CreateRequest, Created, Filter, SessionView};

/// Where sessions are kept, by id.
pub const NS_SESSIONS: &str = "sessions";
/// Source addresses bound to a session: the address → the session's id.
pub const NS_SOURCES: &str = "session-sources";
/// Recent ends (revocations), polled by every replica: id → `revoked`, kept [`END_NOTE_TTL`].
pub const NS_ENDS: &str = "session-ends";
/// The event channel: `end ID`, `extend ID`.
pub const CHANNEL: &str = "sessions";
/// The shared key token hashes are made with.
pub const KEY_TOKENS: &str = "session-tokens";
/// Every session id starts with this; a Proxy-Authorization user that does is a session.
pub const ID_PREFIX: &str = "ses_";
/// Every session token starts with this (so a scanner can spot a leaked one).
pub const TOKEN_PREFIX: &str = "lks_";
/// How often each replica polls the store for ends and expiries.
pub const POLL: Duration = Duration::from_millis(250);
/// How long after the last successful poll a cached session is still trusted without reading
/// the store again.
pub const FRESH: Duration = Duration::from_secs(3);
/// How long an end note stays for pollers to see.
pub const END_NOTE_TTL: Duration = Duration::from_secs(120);
/// How long a revoked or expired session's record is kept to answer `session_revoked` or
/// `session_expired` (then it is swept by the store's TTL).
pub const TOMBSTONE: Duration = Duration::from_secs(24 * 3600);
/// The most sessions one process keeps admitted at once.
pub const MAX_CACHED: usize = 100_000;

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Revoked,
    Expired,
}

impl End {
    pub fn reason(self) -> Reason {
        match self {
            End::Revoked => Reason::SessionRevoked,
            End::Expired => Reason::SessionExpired,
        }
    }
}

/// What the store keeps of a session (JSON). The token is here only as its keyed hash.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionDoc {
    pub id: String,
    pub profile: String,
    /// Hex HMAC-SHA256 of the token under [`KEY_TOKENS`].
    pub token_hash: String,
    pub labels: BTreeMap<String, String>,
    /// Unix milliseconds.
    pub created_at: u64,
    pub expires_at: u64,
    /// The latest `expires_at` an extension may reach: creation plus the profile's TTL.
    pub max_expires_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<IpAddr>,
    #[serde(default)]
    pub narrow: NarrowRequest,
    /// The session's reach digest under the policy it was made with.
    pub reach: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
}

/// What a session carries under one policy: its narrowing, checked again, and its reach.
#[derive(Debug)]
pub struct Scoped {
    pub narrowing: Narrowing,
    /// `sha256:` digest of what the session can reach: the `reach` of its audit records.
    pub reach: String,
}

/// A session this process admitted. Shared by every connection that carries it.
#[derive(Debug)]
pub struct Live {
    pub id: String,
    pub profile: String,
    pub labels: BTreeMap<String, String>,
    pub source: Option<IpAddr>,
    narrow: NarrowRequest,
    token_hash: [u8; 32],
    expires_at: AtomicU64,
    /// 0 live, 1 revoked, 2 expired.
    ended: AtomicU8,
    /// The switches of the connections that carry it (dead ones pruned as new ones come).
    cuts: Mutex<Vec<Weak<Cut>>>,
    /// The narrowing and reach under the policy last seen (by its digest).
    scoped: Mutex<Option<(String, Arc<Scoped>)>>,
}

impl Live {
    fn from_doc(doc: &SessionDoc) -> Option<Self> {
        let mut token_hash = [0u8; 32];
        hex::decode_to_slice(&doc.token_hash, &mut token_hash).ok()?;
        Some(Self {
            id: doc.id.clone(),
            profile: doc.profile.clone(),
            labels: doc.labels.clone(),
            source: doc.source,
            narrow: doc.narrow.clone(),
            token_hash,
            expires_at: AtomicU64::new(doc.expires_at),
            ended: AtomicU8::new(match doc.revoked_at {
                Some(_) => 1,
                None => 0,
            }),
            cuts: Mutex::new(Vec::new()),
            scoped: Mutex::new(None),
        })
    }

    /// How it ended, if it did (expiry counts once its time passed, even before the watcher
    /// noticed).
    pub fn ended(&self, now_ms: u64) -> Option<End> {
        match self.ended.load(Ordering::Acquire) {
            1 => Some(End::Revoked),
            2 => Some(End::Expired),
            _ if now_ms >= self.expires_at.load(Ordering::Acquire) => Some(End::Expired),
            _ => None,
        }
    }

    /// Unix milliseconds.
    pub fn expires_at(&self) -> u64 {
        self.expires_at.load(Ordering::Acquire)
    }

    /// Ends the session here: every connection carrying it is cut. The first end stays.
    pub fn end(&self, end: End) {
        let code = match end {
            End::Revoked => 1,
            End::Expired => 2,
        };
        let _ = self
            .ended
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
        let first = End::from_code(self.ended.load(Ordering::Acquire)).unwrap_or(end);
        let cuts = std::mem::take(&mut *lock(&self.cuts));
        for cut in cuts.iter().filter_map(Weak::upgrade) {
            cut.throw(first.reason().code());
        }
    }

    /// Ties `cut` (a connection's switch) to this session: thrown when it ends (at once if it
    /// already has).
    pub fn attach(&self, cut: &Arc<Cut>, now_ms: u64) {
        cut.arm();
        {
            let mut cuts = lock(&self.cuts);
            if !cuts.iter().any(|c| c.as_ptr() == Arc::as_ptr(cut)) {
                // Prune the dead before growing: the list is bounded by live connections.
                if cuts.len() >= 16 && cuts.len().is_power_of_two() {
                    cuts.retain(|c| c.strong_count() > 0);
                }
                cuts.push(Arc::downgrade(cut));
            }
        }
        if let Some(end) = self.ended(now_ms) {
            cut.throw(end.reason().code());
        }
    }

    /// The open connections carrying it.
    pub fn connections(&self) -> usize {
        lock(&self.cuts)
            .iter()
            .filter(|c| c.strong_count() > 0)
            .count()
    }

    /// The narrowing and reach under `policy` (computed once per policy). `Err`: the session
    /// no longer fits its profile (a reload narrowed or removed it): fail closed.
    pub fn scoped(&self, policy: &Policy) -> Result<Arc<Scoped>, String> {
        let mut slot = lock(&self.scoped);
        if let Some((digest, scoped)) = slot.as_ref() {
            if digest == policy.digest() {
                return Ok(scoped.clone());
            }
        }
        let scoped = Arc::new(scope(policy, &self.profile, &self.narrow)?);
        *slot = Some((policy.digest().to_string(), scoped.clone()));
        Ok(scoped)
    }
}

impl End {
    fn from_code(code: u8) -> Option<End> {
        match code {
            1 => Some(End::Revoked),
            2 => Some(End::Expired),
            _ => None,
        }
    }
}

/// A session's narrowing of `profile` checked under `policy`, and its reach.
pub fn scope(policy: &Policy, profile: &str, narrow: &NarrowRequest) -> Result<Scoped, String> {
    let identity = policy
        .identity(profile)
        .filter(|i| i.profile.is_some())
        .ok_or_else(|| format!("profile {profile:?} is not defined by the policy in force"))?;
    let Some(terms) = identity.profile.as_ref() else {
        return Err(format!("{profile:?} is not a profile"));
    };
    let narrowing = terms
        .narrowing(identity, policy, narrow)
        .map_err(|e: TooWide| format!("the session no longer fits profile {profile:?}: {e}"))?;
    let reach = crate::policy::reach::session_reach(policy, identity, &narrowing).reach;
    Ok(Scoped { narrowing, reach })
}

/// Every session this process admitted, and the way to the store.
#[derive(Debug)]
pub struct Sessions {
    store: Arc<dyn StateStore>,
    key: TokenKey,
    cache: Mutex<HashMap<String, Arc<Live>>>,
    /// Source address → session id, for the cached source-bound sessions.
    by_source: Mutex<HashMap<IpAddr, String>>,
    /// When the watcher last heard from the store (its poll succeeded).
    synced: Mutex<Option<Instant>>,
    /// Admissions refused and sessions made, for metrics (by nothing unbounded).
    pub counters: Counters,
}

/// Sessions' counters, for `/metrics` (labels by profile are added by the caller).
#[derive(Debug, Default)]
pub struct Counters {
    pub created: AtomicU64,
    pub revoked: AtomicU64,
    pub expired: AtomicU64,
    pub admitted: AtomicU64,
    pub refused: AtomicU64,
    pub store_reads: AtomicU64,
}

struct TokenKey(hmac::Key);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl Sessions {
    /// Sessions over `store`, with the token key every replica shares.
    pub async fn open(store: Arc<dyn StateStore>) -> Result<Arc<Self>, StateError> {
        let key = super::approvals::shared_key(store.as_ref(), KEY_TOKENS).await?;
        Ok(Arc::new(Self {
            store,
            key: TokenKey(hmac::Key::new(hmac::HMAC_SHA256, &key)),
            cache: Mutex::new(HashMap::new()),
            by_source: Mutex::new(HashMap::new()),
            synced: Mutex::new(None),
            counters: Counters::default(),
        }))
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    /// The keyed hash of a token.
    fn hash(&self, token: &[u8]) -> [u8; 32] {
        let tag = hmac::sign(&self.key.0, token);
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// The sessions this process holds admitted now, by profile (for metrics).
    pub fn cached_by_profile(&self) -> BTreeMap<String, u64> {
        let now = now_ms();
        let mut out = BTreeMap::new();
        for live in lock(&self.cache).values() {
            if live.ended(now).is_none() {
                *out.entry(live.profile.clone()).or_insert(0) += 1;
            }
        }
        out
    }

    /// Whether the watcher heard from the store within [`FRESH`].
    fn fresh(&self) -> bool {
        lock(&self.synced).is_some_and(|t| t.elapsed() < FRESH)
    }
}

/// A poisoned lock still holds consistent data here (every critical section is a few plain
/// writes): take it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// RFC 3339 (UTC, seconds) of unix milliseconds.
pub fn rfc3339_ms(ms: u64) -> String {
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
#[path = "sessions_tests.rs"]
mod tests;

//! The token cache: minted tokens by credential (and identity/host for JWTs whose claims use
//! them), single flight, with failures shared for a moment so a burst makes one failing
//! exchange. Knows nothing of how a token is made.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::CredentialError;
use crate::secrets::SecretValue;

/// A cached token, or the failure of the last attempt (shared for a few seconds, so N
/// concurrent requests cause one failing exchange, not N).
#[derive(Clone)]
enum Token {
    Ok {
        value: SecretValue,
        refresh_at: Instant,
    },
    Failed {
        error: CredentialError,
        /// The attempt that failed: callers that were already waiting share its error.
        attempt: u64,
        /// Callers arriving just after share it too, so a burst makes one failing exchange.
        until: Instant,
    },
}

/// How long a failed exchange answers for newcomers before the next attempt.
const FAILURE_HOLD: Duration = Duration::from_secs(2);

/// One credential's token and the attempts made for it.
#[derive(Default)]
struct Slot {
    token: tokio::sync::Mutex<Option<Token>>,
    attempts: std::sync::atomic::AtomicU64,
}

/// The most token slots kept: a JWT whose claims use `{{host}}` under a wildcard rule has one
/// per host the sandbox names, so the cache must not grow with them.
const MAX_SLOTS: usize = 1024;

/// Tokens by credential (and identity/host for JWTs whose claims use them), single flight.
/// Bounded: past [`MAX_SLOTS`] the least recently used slots not in use are dropped (their
/// next caller mints again).
#[derive(Default)]
pub struct TokenCache {
    slots: Mutex<HashMap<String, (Arc<Slot>, Instant)>>,
    exchanges: std::sync::atomic::AtomicU64,
    /// Refresh tokens a token endpoint rotated, by credential: used for the next refresh
    /// instead of the configured one (which the endpoint may have revoked).
    rotated: Mutex<HashMap<String, SecretValue>>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache").finish_non_exhaustive()
    }
}

impl TokenCache {
    fn slot(&self, key: &str) -> Arc<Slot> {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        // A known key (every request after the first) costs no allocation.
        if let Some(entry) = slots.get_mut(key) {
            entry.1 = now;
            return entry.0.clone();
        }
        let slot: Arc<Slot> = Arc::default();
        slots.insert(key.to_string(), (slot.clone(), now));
        if slots.len() > MAX_SLOTS {
            let mut idle: Vec<(Instant, String)> = slots
                .iter()
                .filter(|(_, (s, _))| Arc::strong_count(s) == 1)
                .map(|(k, (_, used))| (*used, k.clone()))
                .collect();
            idle.sort();
            let excess = slots.len() - MAX_SLOTS;
            for (_, k) in idle.into_iter().take(excess) {
                slots.remove(&k);
            }
        }
        slot
    }

    /// The cache of the next policy generation: the slots (tokens, failures, single flight) of
    /// the credentials `keep` says are unchanged, shared with this cache; nothing of the others,
    /// whose next caller mints anew. Requests still running on this generation keep using this
    /// cache, so a token minted under a changed definition never reaches the next one.
    pub fn carry(&self, keep: impl Fn(&str) -> bool) -> TokenCache {
        let slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let kept = slots
            .iter()
            .filter(|(key, _)| keep(credential_of(key)))
            .map(|(key, (slot, used))| (key.clone(), (slot.clone(), *used)))
            .collect();
        let rotated = self
            .rotated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(name, _)| keep(name))
            .map(|(name, v)| (name.clone(), v.clone()))
            .collect();
        TokenCache {
            slots: Mutex::new(kept),
            exchanges: std::sync::atomic::AtomicU64::new(0),
            rotated: Mutex::new(rotated),
        }
    }

    /// The refresh token credential `name`'s endpoint last rotated to, if it did.
    pub(super) fn rotated(&self, name: &str) -> Option<SecretValue> {
        self.rotated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Keeps the refresh token `name`'s endpoint rotated to, for its next refresh.
    pub(super) fn set_rotated(&self, name: &str, value: SecretValue) {
        self.rotated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_string(), value);
    }

    /// Token slots held now.
    pub fn len(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token exchanges (and JWT signings) made so far.
    pub fn exchanges(&self) -> u64 {
        self.exchanges.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The cached token for `key`, or a fresh one from `mint` (run once for concurrent callers).
    pub(super) async fn get<F, Fut>(
        &self,
        key: &str,
        margin: Duration,
        mint: F,
    ) -> Result<SecretValue, CredentialError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(SecretValue, Duration), CredentialError>>,
    {
        use std::sync::atomic::Ordering;
        let slot = self.slot(key);
        let seen = slot.attempts.load(Ordering::Acquire);
        let mut guard = slot.token.lock().await;
        match guard.as_ref() {
            Some(Token::Ok { value, refresh_at }) if Instant::now() < *refresh_at => {
                return Ok(value.clone());
            }
            // An attempt that started while this caller waited failed: share its answer
            // rather than hammer a failing endpoint; later callers try again.
            Some(Token::Failed {
                error,
                attempt,
                until,
            }) if *attempt > seen || Instant::now() < *until => {
                return Err(error.clone());
            }
            _ => {}
        }
        let attempt = slot.attempts.fetch_add(1, Ordering::AcqRel) + 1;
        self.exchanges.fetch_add(1, Ordering::Relaxed);
        match mint().await {
            Ok((value, lifetime)) => {
                // Used until `margin` before expiry; a shorter-lived token, for one request.
                let refresh_at = Instant::now() + lifetime.saturating_sub(margin);
                *guard = Some(Token::Ok {
                    value: value.clone(),
                    refresh_at,
                });
                Ok(value)
            }
            Err(error) => {
                *guard = Some(Token::Failed {
                    error: error.clone(),
                    attempt,
                    until: Instant::now() + FAILURE_HOLD,
                });
                Err(error)
            }
        }
    }
}

/// The credential a cache key belongs to: the key itself, or its part before the first NUL
/// (a JWT keyed per identity and/or host).
fn credential_of(key: &str) -> &str {
    key.split('\0').next().unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_token_cache_is_bounded_however_many_hosts_a_sandbox_names() {
        let cache = TokenCache::default();
        for i in 0..(MAX_SLOTS + 300) {
            let token = cache
                .get(&format!("jwt:h{i}.example"), Duration::ZERO, || async {
                    Ok((
                        SecretValue::new(b"minted-token-value".to_vec()),
                        Duration::from_secs(60),
                    ))
                })
                .await
                .expect("minted");
            assert_eq!(token.expose(), b"minted-token-value");
        }
        assert_eq!(cache.len(), MAX_SLOTS);
        assert_eq!(cache.exchanges(), (MAX_SLOTS + 300) as u64);
    }

    async fn minted(v: &'static str) -> Result<(SecretValue, Duration), CredentialError> {
        Ok((
            SecretValue::new(v.as_bytes().to_vec()),
            Duration::from_secs(3600),
        ))
    }

    #[tokio::test]
    async fn a_carried_cache_keeps_the_tokens_of_unchanged_credentials_only() {
        let old = TokenCache::default();
        old.get("same", Duration::ZERO, || minted("same-token-1"))
            .await
            .expect("minted");
        old.get("changed", Duration::ZERO, || minted("changed-token-1"))
            .await
            .expect("minted");
        old.get("jwt\0alice\0", Duration::ZERO, || minted("jwt-token-1"))
            .await
            .expect("minted");
        let new = old.carry(|c| c != "changed");
        assert_eq!(new.len(), 2);
        // Unchanged (a JWT per identity too): the same token, no exchange.
        let t = new
            .get("same", Duration::ZERO, || minted("same-token-2"))
            .await
            .expect("cached");
        assert_eq!(t.expose(), b"same-token-1");
        let t = new
            .get("jwt\0alice\0", Duration::ZERO, || minted("jwt-token-2"))
            .await
            .expect("cached");
        assert_eq!(t.expose(), b"jwt-token-1");
        assert_eq!(new.exchanges(), 0);
        // Changed: minted anew under the next generation ...
        let t = new
            .get("changed", Duration::ZERO, || minted("changed-token-2"))
            .await
            .expect("minted");
        assert_eq!(t.expose(), b"changed-token-2");
        // ... while a request still on the old one keeps the old token, and a token it mints
        // there never reaches the next generation.
        let t = old
            .get("changed", Duration::ZERO, || minted("changed-token-3"))
            .await
            .expect("cached");
        assert_eq!(t.expose(), b"changed-token-1");
        old.get("removed", Duration::ZERO, || minted("removed-token-1"))
            .await
            .expect("minted");
        assert_eq!(new.len(), 3);
    }
}

//! Admission: a presented `SESSION_ID:TOKEN`, or a client address a session was bound to, to
//! the [`Live`] session it names, or why not.
//!
//! A cached session is trusted while the watcher is fresh ([`super::FRESH`]); otherwise the
//! store is read again, and a store that cannot answer refuses (fail closed). Tokens are
//! compared as keyed hashes in constant time. No message carries the token.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{lock, now_ms, End, Live, SessionDoc, Sessions, MAX_CACHED, NS_SESSIONS, NS_SOURCES};
use crate::reason::Reason;

/// Why a presented session was not admitted. The message names the session id (never the
/// token) and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no session {id:?} (never made, or swept a day after it ended)")]
    Unknown { id: String },
    #[error("the token presented for session {id:?} is not its token")]
    BadToken { id: String },
    #[error("session {id:?} was revoked")]
    Revoked { id: String },
    #[error("session {id:?} expired")]
    Expired { id: String },
    #[error("session {id:?} is bound to source {bound}; this client is {client}")]
    WrongSource {
        id: String,
        bound: IpAddr,
        client: IpAddr,
    },
    #[error("sessions cannot be checked: the state store does not answer ({0})")]
    Unavailable(String),
    #[error("this replica holds {0} admitted sessions, its most; retry shortly")]
    TooMany(usize),
}

impl Refused {
    /// The reason code the refusal is recorded and answered with.
    pub fn reason(&self) -> Reason {
        match self {
            Refused::Revoked { .. } => Reason::SessionRevoked,
            Refused::Expired { .. } => Reason::SessionExpired,
            Refused::Unavailable(_) => Reason::StateUnavailable,
            Refused::TooMany(_) => Reason::TooBusy,
            _ => Reason::ProxyAuthRequired,
        }
    }
}

impl Sessions {
    /// The session `id` whose token is `token`, presented from `client`.
    ///
    /// Guarantees on `Ok`: the token's keyed hash matches, the session is neither revoked nor
    /// expired as far as this replica could know within [`super::FRESH`], and a bound session
    /// is presented from its source.
    pub async fn admit_token(
        &self,
        id: &str,
        token: &[u8],
        client: IpAddr,
    ) -> Result<Arc<Live>, Refused> {
        let live = self.find(id).await?;
        let hash = self.hash(token);
        if aws_lc_rs::constant_time::verify_slices_are_equal(&hash, &live.token_hash).is_err() {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::BadToken { id: id.to_string() });
        }
        self.admitted(live, client)
    }

    /// The session bound to `client`'s address, if one is: `Ok(None)` when none is.
    pub async fn admit_source(&self, client: IpAddr) -> Result<Option<Arc<Live>>, Refused> {
        let client = client.to_canonical();
        let cached = lock(&self.by_source).get(&client).cloned();
        let id = match cached {
            Some(id) if self.fresh() => id,
            _ => {
                self.counters.store_reads.fetch_add(1, Ordering::Relaxed);
                let key = client.to_string();
                match self.store.get(NS_SOURCES, &key).await {
                    Ok(Some(v)) => match String::from_utf8(v.doc) {
                        Ok(id) => id,
                        Err(_) => return Ok(None),
                    },
                    Ok(None) => {
                        lock(&self.by_source).remove(&client);
                        return Ok(None);
                    }
                    Err(e) => return Err(Refused::Unavailable(e.to_string())),
                }
            }
        };
        let live = self.find(&id).await?;
        self.admitted(live, client).map(Some)
    }

    /// Whether `live`, admitted earlier (a connection's session), is still live: checked on
    /// every request a connection carries. While the watcher is not fresh the store is read
    /// again, and a store that does not answer refuses.
    pub async fn still_live(&self, live: &Live) -> Result<(), Refused> {
        if !self.fresh() {
            self.counters.store_reads.fetch_add(1, Ordering::Relaxed);
            match self.store.get(NS_SESSIONS, &live.id).await {
                Ok(Some(v)) => match serde_json::from_slice::<SessionDoc>(&v.doc) {
                    Ok(doc) if doc.revoked_at.is_none() => {
                        live.expires_at.store(doc.expires_at, Ordering::Release);
                    }
                    _ => live.end(End::Revoked),
                },
                Ok(None) => live.end(End::Revoked),
                Err(e) => return Err(Refused::Unavailable(e.to_string())),
            }
        }
        ended(live)
    }

    fn admitted(&self, live: Arc<Live>, client: IpAddr) -> Result<Arc<Live>, Refused> {
        ended(&live)?;
        let client = client.to_canonical();
        if let Some(bound) = live.source {
            if bound.to_canonical() != client {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::WrongSource {
                    id: live.id.clone(),
                    bound,
                    client,
                });
            }
        }
        self.counters.admitted.fetch_add(1, Ordering::Relaxed);
        Ok(live)
    }

    /// The session `id`: cached while fresh, else read from the store (and cached).
    async fn find(&self, id: &str) -> Result<Arc<Live>, Refused> {
        let cached = lock(&self.cache).get(id).cloned();
        if let Some(live) = cached.filter(|_| self.fresh()) {
            return Ok(live);
        }
        self.counters.store_reads.fetch_add(1, Ordering::Relaxed);
        let read = self
            .store
            .get(NS_SESSIONS, id)
            .await
            .map_err(|e| Refused::Unavailable(e.to_string()))?;
        let Some(doc) = read.and_then(|v| serde_json::from_slice::<SessionDoc>(&v.doc).ok()) else {
            self.forget(id);
            return Err(Refused::Unknown { id: id.to_string() });
        };
        if doc.revoked_at.is_some() {
            self.forget(id);
            return Err(Refused::Revoked { id: id.to_string() });
        }
        if now_ms() >= doc.expires_at {
            self.forget(id);
            return Err(Refused::Expired { id: id.to_string() });
        }
        self.cache_doc(&doc)
    }

    /// Caches `doc` (or refreshes the cached entry's expiry), returning the shared entry.
    pub(super) fn cache_doc(&self, doc: &SessionDoc) -> Result<Arc<Live>, Refused> {
        let mut cache = lock(&self.cache);
        if let Some(live) = cache.get(&doc.id) {
            live.expires_at.store(doc.expires_at, Ordering::Release);
            return Ok(live.clone());
        }
        if cache.len() >= MAX_CACHED {
            return Err(Refused::TooMany(cache.len()));
        }
        let Some(live) = Live::from_doc(doc) else {
            return Err(Refused::Unknown { id: doc.id.clone() });
        };
        let live = Arc::new(live);
        cache.insert(doc.id.clone(), live.clone());
        drop(cache);
        if let Some(ip) = doc.source {
            lock(&self.by_source).insert(ip.to_canonical(), doc.id.clone());
        }
        Ok(live)
    }

    /// Drops `id` from the cache (its connections keep their `Live`, already ended or not).
    pub(super) fn forget(&self, id: &str) {
        let removed = lock(&self.cache).remove(id);
        if let Some(ip) = removed.and_then(|l| l.source) {
            let mut by_source = lock(&self.by_source);
            if by_source.get(&ip.to_canonical()).is_some_and(|i| i == id) {
                by_source.remove(&ip.to_canonical());
            }
        }
    }
}

/// `Err` when `live` has ended (revoked, or its time passed).
fn ended(live: &Live) -> Result<(), Refused> {
    match live.ended(now_ms()) {
        None => Ok(()),
        Some(End::Revoked) => Err(Refused::Revoked {
            id: live.id.clone(),
        }),
        Some(End::Expired) => Err(Refused::Expired {
            id: live.id.clone(),
        }),
    }
}

/// A `Proxy-Authorization` value naming a session: `Basic base64(SESSION_ID:TOKEN)`. `None`
/// when it is not one (another scheme, or a user that is not a session id): the caller goes on
/// to static identities.
pub fn presented(value: &[u8]) -> Option<(String, zeroize::Zeroizing<Vec<u8>>)> {
    use base64::Engine;
    let text = std::str::from_utf8(value).ok()?;
    let (scheme, rest) = text.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = zeroize::Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .ok()?,
    );
    let colon = decoded.iter().position(|&b| b == b':')?;
    let id = std::str::from_utf8(&decoded[..colon]).ok()?;
    if !is_session_id(id) {
        return None;
    }
    Some((
        id.to_string(),
        zeroize::Zeroizing::new(decoded[colon + 1..].to_vec()),
    ))
}

/// Whether `text` has the shape of a session id (`ses_` and 32 lower-case hex digits).
pub fn is_session_id(text: &str) -> bool {
    text.strip_prefix(super::ID_PREFIX).is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

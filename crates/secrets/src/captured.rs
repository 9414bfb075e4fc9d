//! Tokens latchkey captured from a token endpoint's responses (a rule's `capture`), per
//! identity: the real values live here and the sandbox holds only their placeholders.
//!
//! In memory, bounded ([`MAX_HELD`]); with a state store, also there, encrypted with
//! AES-256-GCM under a key in latchkey's own directory (`capture.key` next to the CA), so they
//! survive a restart and are shared by replicas that share the key — and a copy of the store
//! alone reveals nothing. Every value expires: at its `expires_in`, the capture's `ttl`, or
//! after [`MAX_LIFETIME`].
//!
//! Every kept token is redacted from the first response after a start: `serve` reads them all
//! from the store before it accepts a connection ([`Captured::preload`]), and then follows the
//! store ([`Captured::follow`]): a capture announces itself on [`CHANNEL`] (its identity and
//! name, never the value), so a token one replica captures joins every replica's redaction set
//! as soon as the event arrives, and a full re-read every [`RESYNC`] covers a lost event.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use base64::Engine as _;

use super::SecretValue;
use crate::state::StateStore;

/// Most tokens held in memory at once; past it the one that expires first goes.
pub const MAX_HELD: usize = 10_000;

/// A token with no lifetime of its own is kept at most this long.
pub const MAX_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// The state store namespace of captured tokens.
const NS: &str = "captured";

/// What a kept token is handed to (identity, name, value): the redaction set.
pub type Redact = dyn Fn(&str, &str, &SecretValue) + Send + Sync;

/// The event channel a capture is announced on; the message is `identity/name`.
pub const CHANNEL: &str = "captured";

/// How often a follower re-reads every kept token (a lost event delays redaction by this much
/// at most).
pub const RESYNC: Duration = Duration::from_secs(30);

/// The key file's name in latchkey's directory.
pub const KEY_FILE: &str = "capture.key";

#[derive(Debug, thiserror::Error)]
pub enum CaptureKeyError {
    #[error("cannot make the token-capture key {path}: no randomness")]
    Random { path: String },
    #[error("the token-capture key {path} is not 32 bytes")]
    Length { path: String },
    /// Its mode lets others at it, or it cannot be read or created.
    #[error(transparent)]
    Private(#[from] crate::files::PrivateFileError),
}

/// What the key file is, in messages.
const WHAT: &str = "the token-capture key";

struct Held {
    value: SecretValue,
    expires: SystemTime,
}

/// The captured tokens, by (identity, name).
pub struct Captured {
    held: Mutex<HashMap<(String, String), Held>>,
    key: Option<LessSafeKey>,
    store: OnceLock<Arc<dyn StateStore>>,
}

impl std::fmt::Debug for Captured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captured").finish_non_exhaustive()
    }
}

impl Captured {
    /// Held in memory only (no key: nothing is ever written to a store).
    pub fn in_memory() -> Self {
        Self {
            held: Mutex::new(HashMap::new()),
            key: None,
            store: OnceLock::new(),
        }
    }

    /// With the key in `dir` ([`KEY_FILE`]); see [`Captured::with_key_at`].
    pub fn with_key_in(dir: &Path) -> Result<Self, CaptureKeyError> {
        Self::with_key_at(&dir.join(KEY_FILE))
    }

    /// With the key at `path` (created, mode 0600, if absent): captured tokens may also be
    /// kept, encrypted, in a state store ([`Captured::attach`]).
    pub fn with_key_at(path: &Path) -> Result<Self, CaptureKeyError> {
        let shown = path.display().to_string();
        let bytes = match crate::files::read(path, WHAT)? {
            Some(b) => zeroize::Zeroizing::new(b),
            None => {
                let mut key = zeroize::Zeroizing::new(vec![0u8; 32]);
                SystemRandom::new()
                    .fill(&mut key)
                    .map_err(|_| CaptureKeyError::Random {
                        path: shown.clone(),
                    })?;
                crate::files::create(path, &key, WHAT)?;
                key
            }
        };
        let key = UnboundKey::new(&AES_256_GCM, &bytes)
            .map_err(|_| CaptureKeyError::Length { path: shown })?;
        Ok(Self {
            held: Mutex::new(HashMap::new()),
            key: Some(LessSafeKey::new(key)),
            store: OnceLock::new(),
        })
    }

    /// Keeps captured tokens in `store` too (encrypted), so they survive a restart.
    pub fn attach(&self, store: Arc<dyn StateStore>) {
        if self.key.is_some() {
            let _ = self.store.set(store);
        }
    }

    /// Keeps `value` as `name` for `identity` for `lifetime` (at most [`MAX_LIFETIME`]),
    /// replacing what was there. A store that cannot be written is logged, never fatal: the
    /// token is still held in memory.
    pub async fn put(&self, identity: &str, name: &str, value: SecretValue, lifetime: Duration) {
        let lifetime = lifetime.min(MAX_LIFETIME);
        let expires = SystemTime::now() + lifetime;
        let sealed = self.seal(identity, name, &value, expires);
        if let (Some(store), Some(sealed)) = (self.store.get().cloned(), sealed) {
            let key = id(identity, name);
            let written = store.put(NS, &key, &sealed, Some(lifetime)).await;
            match written {
                // The other replicas read it now (identity and name only, never the value).
                Ok(()) => {
                    if let Err(e) = store.publish(CHANNEL, &key).await {
                        tracing::warn!(identity, secret = name, error = %e, "captured token not announced to other replicas: they redact it after their next re-read");
                    }
                }
                Err(e) => {
                    tracing::warn!(identity, secret = name, error = %e, "captured token not kept in the state store: it will not survive a restart");
                }
            }
        }
        self.hold(identity, name, Held { value, expires });
    }

    /// Holds `held` in memory, making room past [`MAX_HELD`] (expired ones first, then the one
    /// that expires first).
    fn hold(&self, identity: &str, name: &str, held_value: Held) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (identity.to_string(), name.to_string());
        if held.len() >= MAX_HELD && !held.contains_key(&key) {
            let now = SystemTime::now();
            held.retain(|_, h| h.expires > now);
            if held.len() >= MAX_HELD {
                if let Some(first) = held
                    .iter()
                    .min_by_key(|(_, h)| h.expires)
                    .map(|(k, _)| k.clone())
                {
                    held.remove(&first);
                }
            }
        }
        held.insert(key, held_value);
    }

    /// Reads every unexpired token the state store keeps (at most [`MAX_HELD`]), holds it and
    /// hands it to `redact` (identity, name, value): at start, before the first connection.
    /// Returns how many were read. A token that does not open with this key (another
    /// `--capture-key`) is counted in a warning: it can be neither used nor redacted.
    pub async fn preload(&self, redact: &Redact) -> Result<usize, crate::state::StateError> {
        let Some(store) = self.store.get().cloned() else {
            return Ok(0);
        };
        let docs = store.list(NS, MAX_HELD).await?;
        let (mut read, mut sealed_otherwise) = (0, 0);
        let now = SystemTime::now();
        for (key, doc) in docs {
            let Some((identity, name)) = key.rsplit_once('/') else {
                continue;
            };
            match self.open(identity, name, &doc.doc) {
                Some((value, expires)) if expires > now => {
                    redact(identity, name, &value);
                    self.hold(identity, name, Held { value, expires });
                    read += 1;
                }
                Some(_) => {}
                None => sealed_otherwise += 1,
            }
        }
        if sealed_otherwise > 0 {
            tracing::warn!(tokens = sealed_otherwise, store = store.describe(), "captured tokens in the state store do not open with this --capture-key: they can be neither used nor redacted here (replicas must share one capture key)");
        }
        Ok(read)
    }

    /// Reads `identity`/`name` from the store again (another replica captured a new value),
    /// holds it and hands it to `redact`.
    async fn reload(&self, key: &str, redact: &Redact) {
        let (Some(store), Some((identity, name))) = (self.store.get(), key.rsplit_once('/')) else {
            return;
        };
        let doc = match store.get(NS, key).await {
            Ok(Some(v)) => v.doc,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(identity, secret = name, error = %e, "captured token announced but the state store cannot be read: redacted after the next re-read");
                return;
            }
        };
        if let Some((value, expires)) = self.open(identity, name, &doc) {
            if expires > SystemTime::now() {
                redact(identity, name, &value);
                self.hold(identity, name, Held { value, expires });
            }
        }
    }

    /// Follows the state store until `stop` turns true (shutdown): each capture announced on [`CHANNEL`] (by any
    /// replica) is read and handed to `redact`; every [`RESYNC`], and whenever events were
    /// lost, every kept token is read again ([`Captured::preload`]).
    pub async fn follow(
        self: Arc<Self>,
        redact: Arc<Redact>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let Some(store) = self.store.get().cloned() else {
            return;
        };
        let mut events = store.subscribe();
        let mut resync = tokio::time::interval(RESYNC);
        resync.tick().await;
        loop {
            if *stop.borrow() {
                return;
            }
            let lost = tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    false
                }
                _ = resync.tick() => true,
                event = events.recv() => match event {
                    Ok(e) if e.channel == CHANNEL => {
                        self.reload(&e.message, &*redact).await;
                        false
                    }
                    Ok(_) => false,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        events = store.subscribe();
                        true
                    }
                },
            };
            if lost {
                if let Err(e) = self.preload(&*redact).await {
                    tracing::warn!(error = %e, "captured tokens: the state store cannot be re-read; retrying");
                }
            }
        }
    }

    /// The token `name` captured for `identity`, if held and not expired (from memory, else
    /// from the state store).
    pub async fn get(&self, identity: &str, name: &str) -> Option<SecretValue> {
        let key = (identity.to_string(), name.to_string());
        {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            match held.get(&key) {
                Some(h) if h.expires > SystemTime::now() => return Some(h.value.clone()),
                Some(_) => {
                    held.remove(&key);
                }
                None => {}
            }
        }
        let store = self.store.get()?;
        let doc = match store.get(NS, &id(identity, name)).await {
            Ok(Some(v)) => v.doc,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(identity, secret = name, error = %e, "captured token: the state store cannot be read");
                return None;
            }
        };
        let (value, expires) = self.open(identity, name, &doc)?;
        if expires <= SystemTime::now() {
            return None;
        }
        self.hold(
            identity,
            name,
            Held {
                value: value.clone(),
                expires,
            },
        );
        Some(value)
    }

    /// `{"exp": unix secs, "n": nonce, "c": ciphertext}`; the identity and name are the
    /// associated data, so a record moved to another key does not open.
    fn seal(
        &self,
        identity: &str,
        name: &str,
        value: &SecretValue,
        expires: SystemTime,
    ) -> Option<Vec<u8>> {
        let key = self.key.as_ref()?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        let mut data = zeroize::Zeroizing::new(value.expose().to_vec());
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(id(identity, name).as_bytes()),
            &mut *data,
        )
        .ok()?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let exp = expires.duration_since(UNIX_EPOCH).ok()?.as_secs();
        let doc = serde_json::json!({"exp": exp, "n": b64.encode(nonce), "c": b64.encode(&*data)});
        Some(doc.to_string().into_bytes())
    }

    fn open(&self, identity: &str, name: &str, doc: &[u8]) -> Option<(SecretValue, SystemTime)> {
        let key = self.key.as_ref()?;
        let v: serde_json::Value = serde_json::from_slice(doc).ok()?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let nonce: [u8; NONCE_LEN] = b64.decode(v["n"].as_str()?).ok()?.try_into().ok()?;
        let mut data = zeroize::Zeroizing::new(b64.decode(v["c"].as_str()?).ok()?);
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(id(identity, name).as_bytes()),
                &mut data,
            )
            .ok()?;
        let expires = UNIX_EPOCH + Duration::from_secs(v["exp"].as_u64()?);
        Some((SecretValue::new(plain.to_vec()), expires))
    }
}

fn id(identity: &str, name: &str) -> String {
    format!("{identity}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_token_is_held_per_identity_until_it_expires() {
        let c = Captured::in_memory();
        c.put(
            "a",
            "x_access_token",
            SecretValue::new(b"tok-aaaaaaaa".to_vec()),
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(
            c.get("a", "x_access_token")
                .await
                .map(|v| v.expose().to_vec()),
            Some(b"tok-aaaaaaaa".to_vec())
        );
        assert!(c.get("b", "x_access_token").await.is_none());
        c.put(
            "a",
            "x_id_token",
            SecretValue::new(b"tok-bbbbbbbb".to_vec()),
            Duration::ZERO,
        )
        .await;
        assert!(c.get("a", "x_id_token").await.is_none());
    }

    #[test]
    fn a_sealed_token_opens_only_under_its_own_identity_and_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Captured::with_key_in(dir.path()).expect("key");
        let v = SecretValue::new(b"refresh-0123456789".to_vec());
        let exp = SystemTime::now() + Duration::from_secs(60);
        let sealed = c.seal("a", "x_refresh_token", &v, exp).expect("sealed");
        assert!(!String::from_utf8_lossy(&sealed).contains("refresh-0123456789"));
        let (opened, _) = c.open("a", "x_refresh_token", &sealed).expect("opens");
        assert_eq!(opened.expose(), v.expose());
        assert!(c.open("b", "x_refresh_token", &sealed).is_none());
        // The same key file is read back: another replica (or a restart) opens it.
        let again = Captured::with_key_in(dir.path()).expect("key again");
        assert!(again.open("a", "x_refresh_token", &sealed).is_some());
        let other = tempfile::tempdir().expect("tempdir");
        let foreign = Captured::with_key_in(other.path()).expect("other key");
        assert!(foreign.open("a", "x_refresh_token", &sealed).is_none());
    }
}

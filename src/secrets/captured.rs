//! Tokens latchkey captured from a token endpoint's responses (a rule's `capture`), per
//! identity: the real values live here and the sandbox holds only their placeholders.
//!
//! In memory, bounded ([`MAX_HELD`]); with a state store, also there, encrypted with
//! AES-256-GCM under a key in latchkey's own directory (`capture.key` next to the CA), so they
//! survive a restart and are shared by replicas that share the key — and a copy of the store
//! alone reveals nothing. Every value expires: at its `expires_in`, the capture's `ttl`, or
//! after [`MAX_LIFETIME`].

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

/// The key file's name in latchkey's directory.
pub const KEY_FILE: &str = "capture.key";

#[derive(Debug, thiserror::Error)]
pub enum CaptureKeyError {
    #[error("cannot read the token-capture key {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write the token-capture key {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("the token-capture key {path} is not 32 bytes")]
    Length { path: String },
}

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
        let path = path.to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(dir);
        }
        let shown = path.display().to_string();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                SystemRandom::new()
                    .fill(&mut key)
                    .map_err(|_| CaptureKeyError::Write {
                        path: shown.clone(),
                        source: std::io::Error::other("no randomness"),
                    })?;
                write_private(&path, &key).map_err(|source| CaptureKeyError::Write {
                    path: shown.clone(),
                    source,
                })?;
                key.to_vec()
            }
            Err(source) => {
                return Err(CaptureKeyError::Read {
                    path: shown,
                    source,
                })
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
            if let Err(e) = written {
                tracing::warn!(identity, secret = name, error = %e, "captured token not kept in the state store: it will not survive a restart");
            }
        }
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.len() >= MAX_HELD {
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
        held.insert(
            (identity.to_string(), name.to_string()),
            Held { value, expires },
        );
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
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                key,
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

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut f = options.open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
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

//! The audit signing key: an Ed25519 key that signs the log's checkpoints, kept like the CA key
//! (a PKCS#8 PEM file created exclusively with mode 0600, never overwritten). Its public half,
//! `ed25519:` + base64, is what `latchkey audit key` prints and `latchkey audit verify --key`
//! trusts. Read and created through [`crate::files`] (a key group or others can read is
//! refused); depends on nothing else in the crate.

use std::path::{Path, PathBuf};

use aws_lc_rs::signature::{self, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use base64::Engine;

/// The file name of the key in latchkey's CA directory.
pub const KEY_FILE: &str = "latchkey-audit.key";
const PEM_LABEL: &str = "PRIVATE KEY";
const PUBLIC_PREFIX: &str = "ed25519:";
/// What the key file is, in messages.
const WHAT: &str = "the audit signing key";

/// A problem with the audit signing key, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the audit signing key {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an Ed25519 private key in PKCS#8 PEM ({what})")]
    Invalid { path: PathBuf, what: &'static str },
    #[error("cannot generate an Ed25519 key")]
    Generate,
    /// Its mode lets others at it, or it cannot be read or created.
    #[error(transparent)]
    Private(#[from] crate::files::PrivateFileError),
    #[error("`{0}` is not an audit public key: expected ed25519: followed by 32 bytes in base64")]
    Public(String),
}

/// Whether [`SigningKey::load_or_create`] found the key or made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOutcome {
    Existing,
    Created,
}

/// The private key that signs checkpoints. `Debug` shows the public half only.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    public: PublicKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("public", &self.public.to_string())
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Loads the key at `path`, creating it (0600, exclusively) when absent.
    pub fn load_or_create(path: &Path) -> Result<(Self, KeyOutcome), KeyError> {
        match crate::files::read(path, WHAT)? {
            Some(bytes) => Ok((Self::from_pem(path, &bytes)?, KeyOutcome::Existing)),
            None => {
                let key = Self::create(path)?;
                Ok((key, KeyOutcome::Created))
            }
        }
    }

    /// Loads an existing key.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let bytes = crate::files::read(path, WHAT)?.ok_or_else(|| KeyError::Read {
            path: path.to_path_buf(),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        Self::from_pem(path, &bytes)
    }

    fn create(path: &Path) -> Result<Self, KeyError> {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&aws_lc_rs::rand::SystemRandom::new())
            .map_err(|_| KeyError::Generate)?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref());
        let mut pem = format!("-----BEGIN {PEM_LABEL}-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str(&format!("-----END {PEM_LABEL}-----\n"));
        crate::files::create(path, pem.as_bytes(), WHAT)?;
        Self::from_pkcs8(path, pkcs8.as_ref())
    }

    fn from_pem(path: &Path, bytes: &[u8]) -> Result<Self, KeyError> {
        let invalid = |what| KeyError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        let text = std::str::from_utf8(bytes).map_err(|_| invalid("not text"))?;
        let begin = format!("-----BEGIN {PEM_LABEL}-----");
        let end = format!("-----END {PEM_LABEL}-----");
        let body = text
            .split_once(&begin)
            .and_then(|(_, rest)| rest.split_once(&end))
            .map(|(body, _)| body)
            .ok_or_else(|| invalid("no PRIVATE KEY block"))?;
        let b64: String = body.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| invalid("its base64 does not decode"))?;
        Self::from_pkcs8(path, &der)
    }

    fn from_pkcs8(path: &Path, der: &[u8]) -> Result<Self, KeyError> {
        let pair = Ed25519KeyPair::from_pkcs8(der)
            .or_else(|_| Ed25519KeyPair::from_pkcs8_maybe_unchecked(der))
            .map_err(|_| KeyError::Invalid {
                path: path.to_path_buf(),
                what: "not an Ed25519 PKCS#8 key",
            })?;
        let mut public = [0u8; 32];
        let raw = pair.public_key().as_ref();
        if raw.len() != 32 {
            return Err(KeyError::Invalid {
                path: path.to_path_buf(),
                what: "its public key is not 32 bytes",
            });
        }
        public.copy_from_slice(raw);
        Ok(Self {
            pair,
            public: PublicKey(public),
        })
    }

    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The signature of `message`, base64.
    pub fn sign(&self, message: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.pair.sign(message).as_ref())
    }
}

/// An audit public key; displayed and parsed as `ed25519:` + base64 of its 32 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// Parses `ed25519:BASE64`.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let bad = || KeyError::Public(text.chars().take(80).collect());
        let b64 = text.trim().strip_prefix(PUBLIC_PREFIX).ok_or_else(bad)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| bad())?;
        let raw: [u8; 32] = bytes.try_into().map_err(|_| bad())?;
        Ok(Self(raw))
    }

    /// Whether `signature` (base64) is this key's signature of `message`.
    pub fn verifies(&self, message: &[u8], signature: &str) -> bool {
        let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(signature) else {
            return false;
        };
        UnparsedPublicKey::new(&signature::ED25519, &self.0)
            .verify(message, &sig)
            .is_ok()
    }
}

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{PUBLIC_PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(self.0)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_created_0600_reloaded_and_verifies_only_its_own_signatures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("k").join(KEY_FILE);
        let (key, outcome) = SigningKey::load_or_create(&path).expect("create");
        assert_eq!(outcome, KeyOutcome::Created);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (again, outcome) = SigningKey::load_or_create(&path).expect("load");
        assert_eq!(outcome, KeyOutcome::Existing);
        assert_eq!(key.public(), again.public());
        let sig = key.sign(b"checkpoint");
        let public = PublicKey::parse(&key.public().to_string()).expect("parse");
        assert!(public.verifies(b"checkpoint", &sig));
        assert!(!public.verifies(b"checkpoinT", &sig));
        assert!(!public.verifies(b"checkpoint", "not base64!"));
        let other = SigningKey::load_or_create(&dir.path().join("other")).expect("other");
        assert!(!other.0.public().verifies(b"checkpoint", &sig));
        assert!(!format!("{key:?}").contains("PRIVATE"));
    }

    #[test]
    fn bad_keys_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.key");
        std::fs::write(&path, "hello").expect("write");
        let err = SigningKey::load(&path).expect_err("loose");
        assert!(matches!(err, KeyError::Private(_)), "{err}");
        assert!(err.to_string().contains("chmod 600"), "{err}");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let err = SigningKey::load(&path).expect_err("bad");
        assert!(matches!(err, KeyError::Invalid { .. }), "{err}");
        assert!(err.to_string().contains("bad.key"), "{err}");
        assert!(PublicKey::parse("ed25519:AAAA").is_err());
        assert!(PublicKey::parse("rsa:xyz").is_err());
    }
}

//! A TLS client identity (mTLS): the certificate chain and private key a client's connections
//! present to upstreams that ask for one.
//!
//! Parsed and checked once, when it is made ([`ClientIdentity::from_pem`]): PEM certificates,
//! a PEM private key, and the key matching the first certificate. Two identities are the same
//! way out only when they come from the same credential *and* the same bytes (a digest of the
//! certificate and key), so a rotated certificate gets a pool of its own and a connection made
//! with one identity is never reused for another. Nothing here prints the key: `Debug` shows
//! the credential's name only, and errors say what is wrong, never the bytes.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// A client identity could not be made from the credential's material.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("cert: {0}")]
    Cert(String),
    #[error("key: {0}")]
    Key(String),
    #[error("the key does not belong to the certificate ({0})")]
    Mismatch(String),
}

/// The certificate and key one credential presents, checked and ready for rustls.
#[derive(Clone)]
pub struct ClientIdentity {
    /// The credential it comes from.
    name: Arc<str>,
    /// SHA-256 over the certificate and key as read: what tells a rotated one apart.
    digest: [u8; 32],
    key: Arc<CertifiedKey>,
}

impl ClientIdentity {
    /// The identity of credential `name` from its PEM certificate chain (leaf first) and PEM
    /// private key (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem(name: &str, cert: &[u8], key: &[u8]) -> Result<Self, IdentityError> {
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                IdentityError::Cert(format!("not a PEM certificate chain: {}", pem_error(&e)))
            })?;
        if chain.is_empty() {
            return Err(IdentityError::Cert(
                "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".to_string(),
            ));
        }
        // The parser's error names the PEM section it expected, never the bytes it read.
        let private = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
            IdentityError::Key(format!(
                "not a PEM private key (PKCS#8, PKCS#1 or SEC1): {}",
                pem_error(&e)
            ))
        })?;
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let certified = CertifiedKey::from_der(chain, private, &provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => IdentityError::Mismatch(e.to_string()),
            _ => IdentityError::Key(format!("cannot be used to sign: {e}")),
        })?;
        Ok(Self {
            name: name.into(),
            digest: digest(cert, key),
            key: Arc::new(certified),
        })
    }

    /// Whether this identity was made from exactly these bytes.
    pub fn made_from(&self, cert: &[u8], key: &[u8]) -> bool {
        self.digest == digest(cert, key)
    }

    /// The credential this identity comes from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What a rustls client configuration presents when a server asks for a certificate.
    pub(super) fn resolver(&self) -> Arc<dyn rustls::client::ResolvesClientCert> {
        Arc::new(rustls::sign::SingleCertAndKey::from(self.key.clone()))
    }
}

/// SHA-256 over the certificate and key, each length-prefixed.
fn digest(cert: &[u8], key: &[u8]) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for part in [cert, key] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// What went wrong reading PEM, without the input.
fn pem_error(e: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error;
    match e {
        Error::NoItemsFound => "no section of that kind in it",
        Error::MissingSectionEnd { .. } => "a section without its END line",
        Error::IllegalSectionStart { .. } => "a malformed BEGIN line",
        Error::Base64Decode(_) => "a section that is not valid base64",
        _ => "unreadable",
    }
}

impl PartialEq for ClientIdentity {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.digest == other.digest
    }
}

impl Eq for ClientIdentity {}

impl Hash for ClientIdentity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.digest.hash(state);
    }
}

/// The credential's name only: no key, no digest of it.
impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("credential", &self.name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `cn` and its key, as PEM.
    fn pair(cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![cn.to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("self-sign");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn an_identity_is_the_credential_and_its_bytes() {
        let (cert, key) = pair("client.test");
        let a = ClientIdentity::from_pem("tls", cert.as_bytes(), key.as_bytes()).expect("a");
        let again = ClientIdentity::from_pem("tls", cert.as_bytes(), key.as_bytes()).expect("a");
        assert_eq!(a, again);
        assert!(a.made_from(cert.as_bytes(), key.as_bytes()));
        // Another credential with the same bytes, or the same credential rotated, differs.
        let other = ClientIdentity::from_pem("tls2", cert.as_bytes(), key.as_bytes()).expect("b");
        assert_ne!(a, other);
        let (cert2, key2) = pair("client.test");
        let rotated =
            ClientIdentity::from_pem("tls", cert2.as_bytes(), key2.as_bytes()).expect("rotated");
        assert_ne!(a, rotated);
        assert!(!a.made_from(cert2.as_bytes(), key2.as_bytes()));
    }

    #[test]
    fn bad_material_is_refused_without_printing_it() {
        let (cert, key) = pair("client.test");
        let (_, other_key) = pair("other.test");
        let cases = [
            (cert.as_str(), other_key.as_str(), "does not belong"),
            (cert.as_str(), "not a key at all", "not a PEM private key"),
            ("not a certificate", key.as_str(), "no PEM certificate"),
            (key.as_str(), key.as_str(), "no PEM certificate"),
        ];
        for (c, k, want) in cases {
            let e = ClientIdentity::from_pem("tls", c.as_bytes(), k.as_bytes())
                .expect_err(want)
                .to_string();
            assert!(e.contains(want), "{e}");
            for line in key
                .lines()
                .chain(other_key.lines())
                .filter(|l| !l.starts_with("-----"))
            {
                assert!(!e.contains(line), "{e}");
            }
        }
    }

    #[test]
    fn debug_shows_the_credential_name_only() {
        let (cert, key) = pair("client.test");
        let i =
            ClientIdentity::from_pem("partner_tls", cert.as_bytes(), key.as_bytes()).expect("i");
        let shown = format!("{i:?}");
        assert_eq!(shown, "ClientIdentity { credential: \"partner_tls\", .. }");
    }
}

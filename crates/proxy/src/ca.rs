//! latchkey's certificate authority: created once, then signs a short-lived leaf per host.
//!
//! The CA key never leaves `--ca-dir` (mode 0600) and is never used as a leaf key. Each host gets
//! its own P-256 key and a certificate valid for at most 7 days, kept in a bounded cache as a
//! ready `rustls::ServerConfig` so a handshake to a known host costs no signing.
//!
//! The CA's subject is derived from its public key (`latchkey CA <fingerprint>`), so loading an
//! existing CA needs only the key file to rebuild the issuer; the certificate on disk is checked
//! to belong to that key.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use time::OffsetDateTime;

/// File names inside `--ca-dir`.
pub const CA_CERT_FILE: &str = "latchkey-ca.pem";
pub const CA_KEY_FILE: &str = "latchkey-ca.key";

/// Leaf validity: short, so a leaked leaf is worth little; the cache expires well before.
const LEAF_VALIDITY: Duration = Duration::from_secs(6 * 24 * 3600);
const LEAF_CACHE_TTL: Duration = Duration::from_secs(24 * 3600);
const LEAF_CACHE_CAPACITY: u64 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid private key: {why}")]
    BadKey { path: PathBuf, why: String },
    #[error("{cert} does not belong to the key in {key}: regenerate both (`latchkey ca init` in an empty directory)")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error(
        "{present} exists but {missing} does not: restore it or remove both to create a new CA"
    )]
    HalfPresent { present: PathBuf, missing: PathBuf },
    #[error("cannot generate certificate: {0}")]
    Generate(String),
    /// The key file's mode lets others at it, or it cannot be read or created.
    #[error(transparent)]
    Private(#[from] crate::files::PrivateFileError),
    #[error("cannot build TLS configuration for {host}: {why}")]
    Tls { host: String, why: String },
}

/// Whether `init` made a new CA or found one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitOutcome {
    Created,
    Existing,
}

/// A loaded CA, able to mint leaf configurations.
pub struct CertAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_path: PathBuf,
    fingerprint: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
    leaves: moka::sync::Cache<String, Arc<ServerConfig>>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes))
}

/// The CA's certificate parameters, derived from its key alone.
fn ca_params(key: &KeyPair) -> Result<CertificateParams, CaError> {
    let fp = sha256_hex(key.public_key_raw());
    let mut params = CertificateParams::new(Vec::<String>::new())
        .map_err(|e| CaError::Generate(e.to_string()))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "latchkey");
    dn.push(DnType::CommonName, format!("latchkey CA {}", &fp[..16]));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// Creates the CA in `dir` unless it exists. Never overwrites.
pub fn init(dir: &Path) -> Result<InitOutcome, CaError> {
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => return Ok(InitOutcome::Existing),
        (true, false) => {
            return Err(CaError::HalfPresent {
                present: cert_path,
                missing: key_path,
            })
        }
        (false, true) => {
            return Err(CaError::HalfPresent {
                present: key_path,
                missing: cert_path,
            })
        }
        (false, false) => {}
    }
    crate::files::create_dir(dir).map_err(|source| CaError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let key = KeyPair::generate().map_err(|e| CaError::Generate(e.to_string()))?;
    let mut params = ca_params(&key)?;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(3650);
    let cert = params
        .self_signed(&key)
        .map_err(|e| CaError::Generate(e.to_string()))?;
    // The key first, created exclusively with 0600, so a crash never leaves a readable key.
    crate::files::create(&key_path, key.serialize_pem().as_bytes(), KEY_WHAT)?;
    write_cert(&cert_path, cert.pem().as_bytes())?;
    Ok(InitOutcome::Created)
}

/// What the CA key is, in messages.
const KEY_WHAT: &str = "the CA's private key";

/// Writes the (public) CA certificate, exclusively, mode 0644.
fn write_cert(path: &Path, bytes: &[u8]) -> Result<(), CaError> {
    let err = |source| CaError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o644);
    let mut f = opts.open(path).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)
}

impl CertAuthority {
    /// Loads the CA from `dir`, creating it first if absent.
    pub fn load_or_create(dir: &Path) -> Result<(Self, InitOutcome), CaError> {
        let outcome = init(dir)?;
        Ok((Self::load(dir)?, outcome))
    }

    /// Loads an existing CA.
    pub fn load(dir: &Path) -> Result<Self, CaError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| CaError::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        // Refused when its mode lets group or others at it (`crate::files`).
        let key_pem = crate::files::read(&key_path, KEY_WHAT)?.ok_or_else(|| CaError::Read {
            path: key_path.clone(),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        let key_pem = String::from_utf8(key_pem).map_err(|_| CaError::BadKey {
            path: key_path.clone(),
            why: "not text".to_string(),
        })?;
        let cert_pem = read(&cert_path)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| CaError::BadKey {
            path: key_path.clone(),
            why: e.to_string(),
        })?;
        let cert_der =
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|_| CaError::Mismatch {
                cert: cert_path.clone(),
                key: key_path.clone(),
            })?;
        let params = ca_params(&key)?;
        // The certificate must carry this key's public key and the subject derived from it.
        let subject = format!("latchkey CA {}", &sha256_hex(key.public_key_raw())[..16]);
        if !contains(cert_der.as_ref(), key.public_key_raw())
            || !contains(cert_der.as_ref(), subject.as_bytes())
        {
            return Err(CaError::Mismatch {
                cert: cert_path,
                key: key_path,
            });
        }
        let fingerprint = sha256_hex(cert_der.as_ref());
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem,
            cert_path,
            fingerprint,
            provider: Arc::new(sandbox_tls_provider()),
            leaves: moka::sync::Cache::builder()
                .max_capacity(LEAF_CACHE_CAPACITY)
                .time_to_live(LEAF_CACHE_TTL)
                .build(),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// SHA-256 of the CA certificate's DER, hex.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// A TLS server configuration presenting a leaf for `host` (normalised; IP literals get an IP
    /// SAN). Concurrent first requests for one host mint one leaf.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        self.server_config_counted(host).map(|(c, _)| c)
    }

    /// Like [`server_config`](Self::server_config), also saying whether the leaf was cached.
    pub fn server_config_counted(&self, host: &str) -> Result<(Arc<ServerConfig>, bool), CaError> {
        if let Some(c) = self.leaves.get(host) {
            return Ok((c, true));
        }
        self.leaves
            .try_get_with(host.to_string(), || self.mint(host))
            .map(|c| (c, false))
            .map_err(|e| CaError::Tls {
                host: host.to_string(),
                why: e.to_string(),
            })
    }

    fn mint(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        let tls_err = |why: String| CaError::Tls {
            host: host.to_string(),
            why,
        };
        let key = KeyPair::generate().map_err(|e| CaError::Generate(e.to_string()))?;
        let mut params =
            CertificateParams::new(vec![host.to_string()]).map_err(|e| tls_err(e.to_string()))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + LEAF_VALIDITY;
        let mut serial = [0u8; 16];
        aws_lc_rs::rand::fill(&mut serial).map_err(|_| CaError::Generate("rng".into()))?;
        serial[0] &= 0x7f;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| CaError::Generate(e.to_string()))?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key_der)
            .map_err(|e| tls_err(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        // Our order, not the client's: AES-128-GCM with SHA-256 first (see sandbox_tls_provider).
        config.ignore_client_order = true;
        Ok(Arc::new(config))
    }
}

/// The cryptography latchkey offers sandboxes on intercepted connections.
///
/// A new connection per request is how agents behave, so the handshake is the hot path. Two
/// choices make it about twice as cheap, neither weakening what matters:
/// - TLS 1.3 suites in the order AES-128-GCM-SHA256, AES-256-GCM-SHA384, ChaCha20-Poly1305,
///   chosen by latchkey: the key schedule then runs on SHA-256, which CPUs accelerate (SHA-NI),
///   rather than SHA-384; AES-128-GCM is TLS 1.3's mandatory suite.
/// - Key exchange X25519, P-256 or P-384, without the hybrid X25519MLKEM768. That leg never
///   leaves the sandbox's host (loopback or the gateway's virtual link), so a recording of it is
///   no harvest-now-decrypt-later target; the upstream leg, which crosses networks, keeps the
///   post-quantum hybrid.
fn sandbox_tls_provider() -> rustls::crypto::CryptoProvider {
    use rustls::crypto::aws_lc_rs::{cipher_suite as cs, default_provider, kx_group};
    let mut provider = default_provider();
    provider.cipher_suites = vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
        // Leaves are ECDSA P-256, so only ECDSA suites can ever be used for TLS 1.2.
        cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ];
    provider.kx_groups = vec![kx_group::X25519, kx_group::SECP256R1, kx_group::SECP384R1];
    provider
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_creates_a_0600_key_and_never_overwrites() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(init(dir.path()).expect("init"), InitOutcome::Created);
        let before = std::fs::read(dir.path().join(CA_KEY_FILE)).expect("key");
        assert_eq!(init(dir.path()).expect("init"), InitOutcome::Existing);
        assert_eq!(
            before,
            std::fs::read(dir.path().join(CA_KEY_FILE)).expect("key")
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(CA_KEY_FILE))
                .expect("meta")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_ca_key_group_or_others_can_read_is_refused_naming_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        init(dir.path()).expect("init");
        let key = dir.path().join(CA_KEY_FILE);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = CertAuthority::load(dir.path())
            .err()
            .expect("a loose CA key is refused");
        let text = err.to_string();
        assert!(
            text.contains("0644") && text.contains(&format!("chmod 600 {}", key.display())),
            "{text}"
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(CertAuthority::load(dir.path()).is_ok());
    }

    #[test]
    fn a_certificate_from_another_ca_is_refused() {
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");
        init(a.path()).expect("init");
        init(b.path()).expect("init");
        std::fs::copy(b.path().join(CA_CERT_FILE), a.path().join(CA_CERT_FILE)).expect("copy");
        assert!(matches!(
            CertAuthority::load(a.path()),
            Err(CaError::Mismatch { .. })
        ));
    }

    #[test]
    fn leaves_verify_against_the_ca_and_are_cached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, _) = CertAuthority::load_or_create(dir.path()).expect("ca");
        let a = ca.server_config("api.example.com").expect("leaf");
        let b = ca.server_config("api.example.com").expect("leaf");
        assert!(Arc::ptr_eq(&a, &b));
        let ip = ca.server_config("127.0.0.1").expect("ip leaf");
        assert!(!Arc::ptr_eq(&a, &ip));
    }
}

//! A throwaway certificate authority for the upstream servers.
//!
//! The upstreams present certificates signed by this CA; latchkey is told to trust it with
//! `--upstream-ca`. Clients that should see latchkey's own certificates never trust it, so a
//! client that succeeds while trusting only this CA proves that the connection was not
//! intercepted (a `tunnel = true` rule).

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tempfile::TempDir;

/// The names every upstream certificate covers.
pub const UPSTREAM_NAMES: &[&str] = &["api.test", "other.test", "tunnel.test", "*.wild.test"];

pub struct TestCa {
    dir: TempDir,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new() -> Self {
        let key = KeyPair::generate().expect("generate test CA key");
        let mut params =
            CertificateParams::new(Vec::<String>::new()).expect("CA params without names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "latchkey integration test upstream CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-sign test CA");
        let dir = tempfile::Builder::new()
            .prefix("latchkey-test-ca")
            .tempdir()
            .expect("temp dir for test CA");
        std::fs::write(dir.path().join("test-ca.pem"), cert.pem()).expect("write test CA PEM");
        TestCa {
            dir,
            issuer: Issuer::new(params, key),
        }
    }

    /// The PEM file of the CA certificate.
    pub fn pem_path(&self) -> PathBuf {
        self.dir.path().join("test-ca.pem")
    }

    /// A leaf certificate for `names`, signed by this CA, and its private key.
    pub fn issue(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate (`clientAuth`) whose subject is `CN=<cn>`, written as PEM files in
    /// this CA's directory: (certificate, key, the certificate's DER).
    pub fn issue_client_pem_files(&self, cn: &str, stem: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        let (chain, key) = self.leaf(&[cn], ExtendedKeyUsagePurpose::ClientAuth);
        let cert = self.dir.path().join(format!("{stem}-cert.pem"));
        let key_path = self.dir.path().join(format!("{stem}-key.pem"));
        std::fs::write(&cert, pem("CERTIFICATE", &chain[0])).expect("write client cert");
        std::fs::write(&key_path, pem("PRIVATE KEY", key.secret_der())).expect("write client key");
        (cert, key_path, chain[0].to_vec())
    }

    fn leaf(
        &self,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().expect("generate leaf key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<String>>())
                .expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign leaf with test CA");
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![cert.der().clone()], key_der)
    }

    /// A leaf for `names` written as PEM files in this CA's directory: (certificate, key).
    pub fn issue_pem_files(&self, names: &[&str], stem: &str) -> (PathBuf, PathBuf) {
        let (chain, key) = self.issue(names);
        let cert = self.dir.path().join(format!("{stem}-cert.pem"));
        let key_path = self.dir.path().join(format!("{stem}-key.pem"));
        std::fs::write(&cert, pem("CERTIFICATE", &chain[0])).expect("write leaf cert");
        std::fs::write(&key_path, pem("PRIVATE KEY", key.secret_der())).expect("write leaf key");
        (cert, key_path)
    }
}

/// DER as a PEM block.
pub fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

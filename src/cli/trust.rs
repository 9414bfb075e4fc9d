//! Trust stores beyond PEM bundles: the JVM's PKCS#12 truststore `latchkey env` writes beside
//! the bundle, and `latchkey ca install`, which adds latchkey's CA to a Debian, Ubuntu or
//! Alpine system store (this machine's, or an image root's with `--root`).
//!
//! The truststore holds the same certificates as the bundle (system roots and latchkey's CA:
//! `javax.net.ssl.trustStore` replaces the JVM's own roots, and hosts on `tunnel = true` rules
//! present their real certificates), each as a *trusted certificate* entry (the PKCS#12 bag
//! carries Java's trusted-key-usage attribute, which `p12-keystore` writes for certificate
//! entries). Depends on nothing else in the crate; never starts a proxy.

use std::path::{Path, PathBuf};
use std::process::Command;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// File name of the JVM truststore inside the CA directory.
pub const TRUSTSTORE_FILE: &str = "latchkey-truststore.p12";

/// The truststore's password. A truststore holds no private key, so this keys only its
/// integrity check; it is the JVM's own default (`cacerts`), and printed in the environment.
pub const TRUSTSTORE_PASSWORD: &str = "changeit";

/// Where `ca install` puts the CA in a Debian/Ubuntu/Alpine root (both read this directory).
pub const SYSTEM_CA_FILE: &str = "usr/local/share/ca-certificates/latchkey.crt";

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("latchkey's CA certificate is not a PEM certificate: {0}")]
    BadCa(String),
    #[error("cannot build the JVM truststore: {0}")]
    Truststore(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot tell which system this is: no {root}etc/os-release or {root}usr/lib/os-release \
         (ca install supports Debian, Ubuntu and Alpine)"
    )]
    NoOsRelease { root: String },
    #[error(
        "ca install supports Debian, Ubuntu and Alpine system stores; {root} is {name:?}: add \
         {ca} to its trust store by hand"
    )]
    Unsupported {
        root: String,
        name: String,
        ca: PathBuf,
    },
    #[error("cannot run update-ca-certificates (install the ca-certificates package): {0}")]
    NoUpdater(std::io::Error),
    #[error("update-ca-certificates failed ({status}): {stderr}")]
    UpdateFailed { status: String, stderr: String },
}

/// Writes `ca_dir/latchkey-truststore.p12`: every certificate of `system_pem` (the system
/// bundle, if any) that parses, then latchkey's CA, each a trusted certificate entry. Returns
/// its path.
pub fn write_truststore(
    ca_dir: &Path,
    ca_pem: &str,
    system_pem: Option<&str>,
) -> Result<PathBuf, TrustError> {
    let mut store = p12_keystore::KeyStore::new();
    let ca = CertificateDer::pem_slice_iter(ca_pem.as_bytes())
        .next()
        .ok_or_else(|| TrustError::BadCa("no certificate in it".into()))?
        .map_err(|e| TrustError::BadCa(e.to_string()))?;
    let ca =
        p12_keystore::Certificate::from_der(&ca).map_err(|e| TrustError::BadCa(e.to_string()))?;
    let mut skipped = 0usize;
    for (i, der) in system_pem
        .map(|p| CertificateDer::pem_slice_iter(p.as_bytes()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        // A system root Java's parser cannot read is left out (the store trusts less), never
        // the CA itself.
        match der
            .map_err(|e| e.to_string())
            .and_then(|d| p12_keystore::Certificate::from_der(&d).map_err(|e| e.to_string()))
        {
            Ok(cert) => store.add_entry(
                &format!("system-{i}"),
                p12_keystore::KeyStoreEntry::Certificate(cert),
            ),
            Err(_) => skipped += 1,
        }
    }
    if skipped > 0 {
        tracing::warn!(
            skipped,
            "system roots the JVM truststore leaves out: they do not parse"
        );
    }
    store.add_entry("latchkey-ca", p12_keystore::KeyStoreEntry::Certificate(ca));
    let bytes = store
        .writer(TRUSTSTORE_PASSWORD)
        .write()
        .map_err(|e| TrustError::Truststore(e.to_string()))?;
    let path = ca_dir.join(TRUSTSTORE_FILE);
    std::fs::write(&path, bytes).map_err(|source| TrustError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// `JAVA_TOOL_OPTIONS` trusting the truststore at `path`, or `None` when the path cannot be
/// written in it (it holds both quote characters). The JVM splits the variable on whitespace
/// and honours quotes, so a path with spaces is quoted.
pub fn java_tool_options(path: &Path) -> Option<String> {
    let path = path.display().to_string();
    let quoted = if !path.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'') {
        path
    } else if !path.contains('"') {
        format!("\"{path}\"")
    } else if !path.contains('\'') {
        format!("'{path}'")
    } else {
        return None;
    };
    Some(format!(
        "-Djavax.net.ssl.trustStore={quoted} -Djavax.net.ssl.trustStoreType=PKCS12 \
         -Djavax.net.ssl.trustStorePassword={TRUSTSTORE_PASSWORD}"
    ))
}

/// The system families `ca install` knows; both read `/usr/local/share/ca-certificates`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// Debian, Ubuntu and their derivatives (`ID_LIKE=debian`).
    Debian,
    Alpine,
}

/// Which system an `os-release` file describes: `Ok(system)`, or `Err(name)` naming the one it
/// is when `ca install` does not support it.
pub fn system_of(os_release: &str) -> Result<System, String> {
    let field = |key: &str| {
        os_release.lines().find_map(|l| {
            l.strip_prefix(key)
                .and_then(|v| v.strip_prefix('='))
                .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'').to_string())
        })
    };
    let id = field("ID").unwrap_or_default().to_ascii_lowercase();
    let like = field("ID_LIKE").unwrap_or_default().to_ascii_lowercase();
    let names: Vec<&str> = std::iter::once(id.as_str())
        .chain(like.split_whitespace())
        .collect();
    if names.iter().any(|n| matches!(*n, "debian" | "ubuntu")) {
        Ok(System::Debian)
    } else if names.contains(&"alpine") {
        Ok(System::Alpine)
    } else {
        Err(field("PRETTY_NAME")
            .filter(|n| !n.is_empty())
            .unwrap_or(if id.is_empty() { "unknown".into() } else { id }))
    }
}

/// What `ca install` did.
#[derive(Debug, PartialEq, Eq)]
pub struct Installed {
    pub system: System,
    /// The certificate file written under the root.
    pub path: PathBuf,
    /// Whether `update-ca-certificates` ran (only for the root `/`).
    pub updated: bool,
}

/// Adds `ca_pem` to the system store under `root`: writes [`SYSTEM_CA_FILE`] (mode 0644), then
/// for the root `/` runs `update-ca-certificates`. Another root (an image being built) only
/// gets the file: its own `update-ca-certificates` must run inside it.
pub fn install(ca_pem: &str, root: &Path) -> Result<Installed, TrustError> {
    // Exactly one certificate, so nothing else (a key pasted by mistake) lands in the store.
    let certs: Vec<_> = CertificateDer::pem_slice_iter(ca_pem.as_bytes()).collect();
    match certs.as_slice() {
        [Ok(_)] if !ca_pem.contains("PRIVATE KEY") => {}
        _ => {
            return Err(TrustError::BadCa(
                "expected exactly one PEM certificate and nothing else".into(),
            ))
        }
    }
    let shown = {
        let s = root.display().to_string();
        if s.ends_with('/') {
            s
        } else {
            format!("{s}/")
        }
    };
    let text = ["etc/os-release", "usr/lib/os-release"]
        .iter()
        .find_map(|rel| std::fs::read_to_string(root.join(rel)).ok())
        .ok_or_else(|| TrustError::NoOsRelease {
            root: shown.clone(),
        })?;
    let path = root.join(SYSTEM_CA_FILE);
    let system = system_of(&text).map_err(|name| TrustError::Unsupported {
        root: shown,
        name,
        ca: path.clone(),
    })?;
    let write = |path: &Path| -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, ca_pem)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
    };
    write(&path).map_err(|source| TrustError::Write {
        path: path.clone(),
        source,
    })?;
    let is_live = root.canonicalize().is_ok_and(|r| r == Path::new("/"));
    if is_live {
        let out = Command::new("update-ca-certificates")
            .output()
            .map_err(TrustError::NoUpdater)?;
        if !out.status.success() {
            return Err(TrustError::UpdateFailed {
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    Ok(Installed {
        system,
        path,
        updated: is_live,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_names_the_system_family() {
        let debian = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n";
        assert_eq!(system_of(debian), Ok(System::Debian));
        let ubuntu = "NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\n";
        assert_eq!(system_of(ubuntu), Ok(System::Debian));
        let mint = "ID=linuxmint\nID_LIKE=\"ubuntu debian\"\n";
        assert_eq!(system_of(mint), Ok(System::Debian));
        assert_eq!(
            system_of("ID=alpine\nVERSION_ID=3.20.0\n"),
            Ok(System::Alpine)
        );
        let fedora = "ID=fedora\nPRETTY_NAME=\"Fedora Linux 40\"\n";
        assert_eq!(system_of(fedora), Err("Fedora Linux 40".into()));
        // `ID_LIKE` must not be read as `ID`.
        assert_eq!(system_of("ID_LIKE=debian\n"), Ok(System::Debian));
        assert_eq!(system_of(""), Err("unknown".into()));
    }

    #[test]
    fn java_tool_options_quote_a_path_the_jvm_would_split() {
        let plain = java_tool_options(Path::new("/ca/t.p12")).expect("plain");
        assert!(
            plain.starts_with("-Djavax.net.ssl.trustStore=/ca/t.p12 "),
            "{plain}"
        );
        assert!(plain.contains("-Djavax.net.ssl.trustStoreType=PKCS12"));
        assert!(plain.contains("-Djavax.net.ssl.trustStorePassword=changeit"));
        let spaced = java_tool_options(Path::new("/my ca/t.p12")).expect("spaced");
        assert!(spaced.starts_with("-Djavax.net.ssl.trustStore=\"/my ca/t.p12\" "));
        let quoted = java_tool_options(Path::new("/a \"b\"/t.p12")).expect("quoted");
        assert!(quoted.starts_with("-Djavax.net.ssl.trustStore='/a \"b\"/t.p12' "));
        assert_eq!(java_tool_options(Path::new("/a\"'/t.p12")), None);
    }

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).expect("cert").pem()
    }

    #[test]
    fn the_truststore_holds_every_system_root_and_the_ca_as_trusted_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, other) = (ca_pem(), ca_pem());
        let system = format!(
            "{other}\n-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"
        );
        let path = write_truststore(dir.path(), &ca, Some(&system)).expect("written");
        let bytes = std::fs::read(&path).expect("read");
        let store = p12_keystore::KeyStore::from_pkcs12(
            &bytes,
            TRUSTSTORE_PASSWORD,
            p12_keystore::Pkcs12ImportPolicy::Strict,
        )
        .expect("a PKCS#12 file");
        // Strict import keeps only certificates marked trusted: both made it.
        assert_eq!(
            store.entries_len(),
            2,
            "{:?}",
            store.entries().collect::<Vec<_>>()
        );
        let ders: Vec<Vec<u8>> = store
            .entries()
            .filter_map(|(_, e)| match e {
                p12_keystore::KeyStoreEntry::Certificate(c) => Some(c.as_der().to_vec()),
                _ => None,
            })
            .collect();
        for pem in [&ca, &other] {
            let der = CertificateDer::from_pem_slice(pem.as_bytes()).expect("der");
            assert!(ders.contains(&der.to_vec()));
        }
        let err = write_truststore(dir.path(), "no pem here", None).expect_err("no CA");
        assert!(matches!(err, TrustError::BadCa(_)), "{err}");
    }

    #[test]
    fn install_writes_the_ca_into_a_debian_or_alpine_root_and_refuses_others() {
        let pem = ca_pem();
        for (release, system) in [
            ("ID=debian\n", System::Debian),
            ("ID=alpine\n", System::Alpine),
        ] {
            let root = tempfile::tempdir().expect("root");
            std::fs::create_dir_all(root.path().join("etc")).expect("etc");
            std::fs::write(root.path().join("etc/os-release"), release).expect("os-release");
            let done = install(&pem, root.path()).expect("installed");
            assert_eq!(done.system, system);
            assert!(!done.updated, "update-ca-certificates ran on a temp root");
            assert_eq!(done.path, root.path().join(SYSTEM_CA_FILE));
            assert_eq!(std::fs::read_to_string(&done.path).expect("cert"), pem);
            let mode = std::fs::metadata(&done.path).expect("meta").permissions();
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
                0o644
            );
        }
        let root = tempfile::tempdir().expect("root");
        let err = install(&pem, root.path()).expect_err("no os-release");
        assert!(err.to_string().contains("etc/os-release"), "{err}");
        std::fs::create_dir_all(root.path().join("usr/lib")).expect("usr/lib");
        std::fs::write(root.path().join("usr/lib/os-release"), "ID=fedora\n").expect("release");
        let err = install(&pem, root.path()).expect_err("fedora");
        assert!(err.to_string().contains("\"fedora\""), "{err}");
        assert!(!root.path().join(SYSTEM_CA_FILE).exists());
        std::fs::write(root.path().join("usr/lib/os-release"), "ID=debian\n").expect("release");
        for bad in ["not a certificate", &format!("{pem}{pem}")] {
            let err = install(bad, root.path()).expect_err("not one certificate");
            assert!(matches!(err, TrustError::BadCa(_)), "{err}");
        }
        assert!(!root.path().join(SYSTEM_CA_FILE).exists());
    }
}

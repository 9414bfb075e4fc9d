//! `latchkey env`: the environment a sandbox needs to use latchkey, for every common client.
//!
//! Clients disagree on where they read trust from, so one bundle (system roots plus latchkey's
//! CA: hosts on `tunnel = true` rules still present their real certificates) is written next to
//! the CA and every variable points at it.

use std::path::{Path, PathBuf};

/// System trust bundles, first match wins.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// File name of the combined bundle inside the CA directory.
pub const BUNDLE_FILE: &str = "latchkey-bundle.pem";

/// Variables that take a path to a PEM bundle.
const BUNDLE_VARS: [&str; 11] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
    "HTTPLIB2_CA_CERTS",
    "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "NIX_SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
];

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `export NAME='value'` lines for `eval`.
    Shell,
    /// `NAME=value` lines for env files.
    Dotenv,
    /// One JSON object.
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("cannot write trust bundle {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot resolve {path}: {source}")]
    Path {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Writes the combined bundle and returns the variables, in a stable order.
pub fn variables(
    proxy_url: &str,
    ca_dir: &Path,
    ca_pem: &str,
) -> Result<Vec<(String, String)>, EnvError> {
    let ca_dir = ca_dir.canonicalize().map_err(|source| EnvError::Path {
        path: ca_dir.to_path_buf(),
        source,
    })?;
    let bundle = ca_dir.join(BUNDLE_FILE);
    let mut text = String::new();
    match SYSTEM_BUNDLES
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
    {
        Some(system) => {
            text.push_str(&system);
            if !text.ends_with('\n') {
                text.push('\n');
            }
        }
        None => {
            tracing::warn!("no system trust bundle found: the bundle trusts latchkey's CA only")
        }
    }
    text.push_str("# latchkey CA\n");
    text.push_str(ca_pem);
    std::fs::write(&bundle, text).map_err(|source| EnvError::Write {
        path: bundle.clone(),
        source,
    })?;
    let bundle = bundle.display().to_string();
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let mut vars = vec![
        ("HTTP_PROXY".to_string(), proxy_url.to_string()),
        ("HTTPS_PROXY".to_string(), proxy_url.to_string()),
        ("http_proxy".to_string(), proxy_url.to_string()),
        ("https_proxy".to_string(), proxy_url.to_string()),
        ("NO_PROXY".to_string(), no_proxy.clone()),
        ("no_proxy".to_string(), no_proxy),
        ("SSL_CERT_DIR".to_string(), ca_dir.display().to_string()),
    ];
    vars.extend(BUNDLE_VARS.iter().map(|v| (v.to_string(), bundle.clone())));
    Ok(vars)
}

/// Renders variables in a format.
pub fn render(vars: &[(String, String)], format: Format) -> String {
    match format {
        Format::Shell => vars
            .iter()
            .map(|(k, v)| format!("export {k}='{}'\n", v.replace('\'', "'\\''")))
            .collect(),
        Format::Dotenv => vars.iter().map(|(k, v)| format!("{k}={v}\n")).collect(),
        Format::Json => {
            let map: serde_json::Map<String, serde_json::Value> = vars
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            let mut s = serde_json::Value::Object(map).to_string();
            s.push('\n');
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_values_are_quoted() {
        let v = vec![("A".to_string(), "it's".to_string())];
        assert_eq!(render(&v, Format::Shell), "export A='it'\\''s'\n");
    }

    #[test]
    fn every_bundle_variable_points_at_a_bundle_holding_the_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vars = variables("http://127.0.0.1:3128", dir.path(), "PEM-CA\n").expect("vars");
        for name in BUNDLE_VARS {
            let (_, path) = vars.iter().find(|(k, _)| k == name).expect(name);
            let text = std::fs::read_to_string(path).expect("bundle");
            assert!(text.ends_with("PEM-CA\n"));
        }
        assert!(vars
            .iter()
            .any(|(k, v)| k == "HTTPS_PROXY" && v == "http://127.0.0.1:3128"));
    }
}

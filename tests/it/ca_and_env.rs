//! `latchkey ca init|show`, the CA created by `serve`, and `latchkey env`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde_json::Value;

use crate::support::latchkey::{wait_with_timeout, SCRUBBED_ENV};
use crate::support::{api_policy, https_world, run_cli, Echo};

const CERT_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
    "AWS_CA_BUNDLE",
    "PIP_CERT",
];

fn certs_in(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .map(|c| c.expect("certificate in PEM"))
        .collect()
}

fn assert_ca_files(ca_dir: &Path) {
    let cert = ca_dir.join("latchkey-ca.pem");
    let key = ca_dir.join("latchkey-ca.key");
    assert_eq!(
        certs_in(&cert).len(),
        1,
        "latchkey-ca.pem holds one certificate"
    );
    let mode = std::fs::metadata(&key)
        .expect("latchkey-ca.key exists")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "CA key mode is {:o}", mode & 0o777);
    let key_text = std::fs::read_to_string(&key).expect("read CA key");
    assert!(key_text.contains("PRIVATE KEY"), "CA key is not a PEM key");
}

fn ca_init(ca_dir: &Path) {
    let out = run_cli([
        "ca".as_ref(),
        "init".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
}

#[test]
fn ca_init_creates_a_certificate_and_a_key_readable_only_by_its_owner() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_dir = dir.path().join("ca");
    ca_init(&ca_dir);
    assert_ca_files(&ca_dir);

    let out = run_cli([
        "ca".as_ref(),
        "show".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(!out.stdout.trim().is_empty(), "ca show printed nothing");
}

#[test]
fn ca_init_does_not_overwrite_an_existing_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_dir = dir.path().join("ca");
    ca_init(&ca_dir);
    let cert_before = std::fs::read(ca_dir.join("latchkey-ca.pem")).expect("cert");
    let key_before = std::fs::read(ca_dir.join("latchkey-ca.key")).expect("key");

    let _ = run_cli([
        "ca".as_ref(),
        "init".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
    ]);
    assert_eq!(
        std::fs::read(ca_dir.join("latchkey-ca.pem")).expect("cert"),
        cert_before,
        "ca init replaced the CA certificate"
    );
    assert_eq!(
        std::fs::read(ca_dir.join("latchkey-ca.key")).expect("key"),
        key_before,
        "ca init replaced the CA key"
    );
}

#[test]
fn serve_creates_the_ca_on_first_run_with_a_private_key() {
    let w = https_world(api_policy);
    assert_ca_files(&w.lk.ca_dir());
}

fn env_json(proxy: &str, ca_dir: &Path) -> serde_json::Map<String, Value> {
    let out = run_cli([
        "env".as_ref(),
        "--proxy".as_ref(),
        proxy.as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let v: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("env --format json printed no JSON ({e}): {out:#?}"));
    v.as_object().expect("env JSON is an object").clone()
}

#[test]
fn env_json_points_every_cert_variable_at_a_bundle_holding_the_latchkey_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_dir = dir.path().join("ca");
    ca_init(&ca_dir);
    let proxy = "http://127.0.0.1:3128";
    let vars = env_json(proxy, &ca_dir);

    for name in ["HTTP_PROXY", "HTTPS_PROXY"] {
        assert_eq!(
            vars.get(name).and_then(Value::as_str),
            Some(proxy),
            "{name}: {vars:#?}"
        );
    }
    assert!(
        vars.get("NO_PROXY").is_some_and(Value::is_string),
        "NO_PROXY: {vars:#?}"
    );
    let bundle = vars
        .get("SSL_CERT_FILE")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("SSL_CERT_FILE missing: {vars:#?}"))
        .to_string();
    for name in CERT_VARS {
        assert_eq!(
            vars.get(*name).and_then(Value::as_str),
            Some(bundle.as_str()),
            "{name} should point at the bundle: {vars:#?}"
        );
    }

    let bundle_certs = certs_in(Path::new(&bundle));
    let ca = certs_in(&ca_dir.join("latchkey-ca.pem"));
    assert!(
        bundle_certs.contains(&ca[0]),
        "the bundle {bundle} does not hold latchkey's CA"
    );
    assert!(
        bundle_certs.len() > 1,
        "the bundle should also hold the system roots (tunnelled hosts present real certificates)"
    );
}

#[test]
fn env_prints_shell_export_lines_by_default() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_dir = dir.path().join("ca");
    ca_init(&ca_dir);
    let out = run_cli([
        "env".as_ref(),
        "--proxy".as_ref(),
        "http://127.0.0.1:3128".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let lines: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(
        lines.iter().all(|l| l.starts_with("export ")),
        "every line should be an export: {}",
        out.stdout
    );
    assert!(
        lines.contains(&"export HTTPS_PROXY='http://127.0.0.1:3128'"),
        "{}",
        out.stdout
    );
    for name in CERT_VARS {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("export {name}='"))),
            "no export of {name}: {}",
            out.stdout
        );
    }
}

#[test]
fn a_client_configured_only_by_latchkey_env_goes_through_the_proxy() {
    let w = https_world(api_policy);
    let port = w.upstream.port();
    let vars = env_json(&w.lk.proxy_url(), &w.lk.ca_dir());

    let mut cmd = Command::new(crate::support::toolchain::tool("curl"));
    cmd.args(["-q", "-sS", "--max-time", "20"])
        .arg(format!("https://api.test:{port}/v1/via-env"));
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    for (name, value) in &vars {
        if let Some(value) = value.as_str() {
            cmd.env(name, value);
        }
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert_eq!(Echo::parse(&out.stdout).path, "/v1/via-env");
    let records = w.lk.wait_audit(1);
    assert_eq!(records[0]["decision"], "allow", "{:#}", records[0]);
}

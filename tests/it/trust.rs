//! Trust beyond PEM bundles: a real JVM (`java Single.java`, source-file mode) reaches an HTTPS
//! upstream through latchkey's interception trusting latchkey only through the
//! `JAVA_TOOL_OPTIONS` `latchkey env` prints (its PKCS#12 truststore), and fails with a
//! certificate error without it; Deno's `DENO_CERT` names the bundle; `latchkey ca install
//! --root` writes the CA into a Debian or Alpine image root and refuses other systems.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::latchkey::{wait_with_timeout, CliOutput, SCRUBBED_ENV};
use crate::support::{api_policy, assert_record, https_world, run_cli, toolchain, Echo};

/// A Java program fetching `args[0]` with `HttpURLConnection`: prints the status and the body.
const SINGLE_JAVA: &str = r#"
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URL;

public class Single {
    public static void main(String[] args) throws Exception {
        HttpURLConnection c = (HttpURLConnection) new URL(args[0]).openConnection();
        c.setConnectTimeout(10000);
        c.setReadTimeout(10000);
        int status = c.getResponseCode();
        try (InputStream in = c.getInputStream()) {
            System.out.println("status " + status);
            System.out.println(new String(in.readAllBytes(), "UTF-8"));
        }
    }
}
"#;

/// JVM settings a developer's shell may carry, which would change what the JVM trusts.
const JAVA_ENV: &[&str] = &["JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"];

/// `latchkey ca init --ca-dir DIR`: `env` reads the CA `serve` or `ca init` made, never makes one.
fn ca_init(ca_dir: &Path) {
    let out = run_cli([
        "ca".as_ref(),
        "init".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
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
    v.as_object().expect("an object").clone()
}

/// `java -Dhttps.proxyHost/Port=latchkey Single.java URL`, with `JAVA_TOOL_OPTIONS` if given.
fn java(
    dir: &Path,
    proxy: std::net::SocketAddr,
    url: &str,
    tool_options: Option<&str>,
) -> CliOutput {
    let source = dir.join("Single.java");
    std::fs::write(&source, SINGLE_JAVA).expect("write Single.java");
    let mut cmd = Command::new(toolchain::tool("java"));
    cmd.arg(format!("-Dhttps.proxyHost={}", proxy.ip()))
        .arg(format!("-Dhttps.proxyPort={}", proxy.port()))
        .arg(&source)
        .arg(url)
        .current_dir(dir);
    for var in SCRUBBED_ENV.iter().chain(JAVA_ENV) {
        cmd.env_remove(var);
    }
    if let Some(options) = tool_options {
        cmd.env("JAVA_TOOL_OPTIONS", options);
    }
    wait_with_timeout(&mut cmd, Duration::from_secs(60))
}

#[test]
fn a_jvm_trusts_latchkey_through_java_tool_options_and_fails_without_it() {
    let w = https_world(api_policy);
    let vars = env_json(&w.lk.proxy_url(), &w.lk.ca_dir());
    let options = vars
        .get("JAVA_TOOL_OPTIONS")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no JAVA_TOOL_OPTIONS: {vars:#?}"))
        .to_string();
    assert!(
        options.contains("-Djavax.net.ssl.trustStoreType=PKCS12"),
        "{options}"
    );
    let store =
        w.lk.ca_dir()
            .canonicalize()
            .expect("ca dir")
            .join("latchkey-truststore.p12");
    assert!(
        options.contains(&format!("-Djavax.net.ssl.trustStore={}", store.display())),
        "{options}"
    );
    let url = format!("https://api.test:{}/v1/from-java", w.upstream.port());

    let out = java(w.lk.scratch(), w.lk.addr(), &url, Some(&options));
    assert_eq!(out.code(), Some(0), "java failed: {out:#?}");
    let (status, body) = out.stdout.split_once('\n').expect("status line");
    assert_eq!(status.trim(), "status 200", "{out:#?}");
    assert_eq!(Echo::parse(body.trim()).path, "/v1/from-java");
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"method": "GET", "scheme": "https", "host": "api.test", "path": "/v1/from-java",
               "decision": "allow", "rule": "api", "reason": "allowed", "status": 200}),
    );

    // The JVM's own roots do not know latchkey's CA: the handshake fails on the certificate.
    let out = java(w.lk.scratch(), w.lk.addr(), &url, None);
    assert_ne!(
        out.code(),
        Some(0),
        "java trusted latchkey without its truststore: {out:#?}"
    );
    assert!(
        out.stderr.contains("PKIX path building failed"),
        "not a certificate error: {out:#?}"
    );
    assert_eq!(
        w.upstream.received().len(),
        1,
        "the refused handshake reached the upstream"
    );
    let records = w.lk.wait_audit(2);
    assert_record(
        &records[1],
        json!({"method": "CONNECT", "host": "api.test", "decision": "deny",
               "reason": "tls_handshake_failed"}),
    );
}

#[test]
fn deno_cert_names_the_bundle_every_pem_variable_names() {
    let dir = tempfile::tempdir().expect("temp dir");
    ca_init(&dir.path().join("ca"));
    let vars = env_json("http://127.0.0.1:3128", &dir.path().join("ca"));
    let bundle = vars
        .get("SSL_CERT_FILE")
        .and_then(Value::as_str)
        .expect("bundle");
    assert_eq!(
        vars.get("DENO_CERT").and_then(Value::as_str),
        Some(bundle),
        "{vars:#?}"
    );
    assert!(bundle.ends_with("latchkey-bundle.pem"), "{bundle}");
}

fn ca_install(ca_dir: &Path, root: &Path) -> CliOutput {
    run_cli([
        "ca".as_ref(),
        "install".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
        "--root".as_ref(),
        root.as_os_str(),
    ])
}

#[test]
fn ca_install_writes_the_ca_into_a_debian_or_alpine_image_root_and_names_what_it_refuses() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_dir = dir.path().join("ca");
    let out = run_cli([
        "ca".as_ref(),
        "init".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let pem = std::fs::read_to_string(ca_dir.join("latchkey-ca.pem")).expect("CA");
    // Only the certificate is needed: an image never holds the CA's key.
    std::fs::remove_file(ca_dir.join("latchkey-ca.key")).expect("remove key");
    for (system, release) in [
        ("debian", "ID=debian\nVERSION_ID=\"12\"\n"),
        ("alpine", "ID=alpine\n"),
    ] {
        let root = dir.path().join(system);
        std::fs::create_dir_all(root.join("etc")).expect("etc");
        std::fs::write(root.join("etc/os-release"), release).expect("os-release");
        let out = ca_install(&ca_dir, &root);
        assert_eq!(out.code(), Some(0), "{system}: {out:#?}");
        let installed = root.join("usr/local/share/ca-certificates/latchkey.crt");
        assert_eq!(std::fs::read_to_string(&installed).expect("installed"), pem);
        assert!(out.stdout.contains("update-ca-certificates"), "{out:#?}");
    }
    let root = dir.path().join("fedora");
    std::fs::create_dir_all(root.join("etc")).expect("etc");
    std::fs::write(
        root.join("etc/os-release"),
        "ID=fedora\nPRETTY_NAME=\"Fedora Linux 40\"\n",
    )
    .expect("os-release");
    let out = ca_install(&ca_dir, &root);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("\"Fedora Linux 40\""), "{out:#?}");
    assert!(out.stderr.contains("Debian, Ubuntu and Alpine"), "{out:#?}");
    let out = ca_install(&ca_dir, &dir.path().join("nothing"));
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("os-release"), "{out:#?}");
}

#[test]
fn env_install_adds_the_ca_to_an_image_root_and_keeps_its_stdout_shell_lines() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_dir = dir.path().join("ca");
    let root = dir.path().join("debian");
    std::fs::create_dir_all(root.join("etc")).expect("etc");
    std::fs::write(root.join("etc/os-release"), "ID=debian\n").expect("os-release");
    ca_init(&ca_dir);
    let out = run_cli([
        "env".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
        "--install".as_ref(),
        "--root".as_ref(),
        root.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let pem = std::fs::read_to_string(ca_dir.join("latchkey-ca.pem")).expect("CA");
    let installed = root.join("usr/local/share/ca-certificates/latchkey.crt");
    assert_eq!(std::fs::read_to_string(&installed).expect("installed"), pem);
    // What the install did is on stderr; stdout is still only what `eval` can run.
    assert!(out.stderr.contains("update-ca-certificates"), "{out:#?}");
    for line in out.stdout.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.starts_with("export ") || line.starts_with('#'),
            "not a shell line on stdout: {line:?}\n{out:#?}"
        );
    }
    assert!(out.stdout.contains("export SSL_CERT_FILE="), "{out:#?}");

    // An unsupported system fails the whole command, before any variable is printed.
    let other = dir.path().join("fedora");
    std::fs::create_dir_all(other.join("etc")).expect("etc");
    std::fs::write(other.join("etc/os-release"), "ID=fedora\n").expect("os-release");
    let out = run_cli([
        "env".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
        "--install".as_ref(),
        "--root".as_ref(),
        other.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(!out.stdout.contains("export "), "{out:#?}");

    // --root alone is a usage error: it only means something with --install.
    let out = run_cli([
        "env".as_ref(),
        "--ca-dir".as_ref(),
        ca_dir.as_os_str(),
        "--root".as_ref(),
        root.as_os_str(),
    ]);
    assert_eq!(out.code(), Some(2), "{out:#?}");
}

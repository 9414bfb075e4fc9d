//! `latchkey ca init|show`, the CA created by `serve`, and `latchkey env` (its `NO_PROXY`
//! comment and `--no-proxy`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde_json::{json, Value};

use crate::support::latchkey::{wait_with_timeout, SCRUBBED_ENV};
use crate::support::{api_policy, assert_record, https_world, latchkey, run_cli, Echo, Upstream};

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
        lines
            .iter()
            .all(|l| l.starts_with("export ") || l.starts_with("# NO_PROXY: ")),
        "every line should be an export or the NO_PROXY comment: {}",
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

/// `latchkey env ARGS...` for a fresh CA, with `extra` environment variables.
fn env_output(args: &[&str], extra: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_dir = dir.path().join("ca");
    ca_init(&ca_dir);
    let mut cmd = Command::new(crate::support::latchkey::BIN);
    cmd.args(["env", "--proxy", "http://127.0.0.1:3128", "--ca-dir"])
        .arg(&ca_dir)
        .args(args);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd.env_remove("LATCHKEY_NO_PROXY");
    for (name, value) in extra {
        cmd.env(name, value);
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(out.code(), Some(0), "{out:#?}");
    out.stdout
}

fn no_proxy_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.to_ascii_lowercase().contains("no_proxy"))
        .collect()
}

#[test]
fn env_says_in_a_comment_that_no_proxy_sends_loopback_around_latchkey() {
    for (format, line) in [
        ("shell", "export NO_PROXY='localhost,127.0.0.1,::1'"),
        ("dotenv", "NO_PROXY=localhost,127.0.0.1,::1"),
    ] {
        let text = env_output(&["--format", format], &[]);
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| *l == line)
            .unwrap_or_else(|| panic!("{format}: no {line:?} in:\n{text}"));
        let comment = lines[at - 1];
        assert!(
            comment
                .starts_with("# NO_PROXY: requests to localhost, 127.0.0.1, ::1 bypass latchkey")
                && comment.contains("--no-proxy ''"),
            "{format}: the line before NO_PROXY should explain it: {comment:?}"
        );
        assert_eq!(
            lines.iter().filter(|l| l.starts_with('#')).count(),
            1,
            "{format}: one comment line:\n{text}"
        );
    }
    // JSON has no comments: the output stays one valid object.
    let v: Value =
        serde_json::from_str(env_output(&["--format", "json"], &[]).trim()).expect("env JSON");
    assert_eq!(v["NO_PROXY"], "localhost,127.0.0.1,::1");
    assert_eq!(v["no_proxy"], "localhost,127.0.0.1,::1");
}

#[test]
fn env_no_proxy_empty_unsets_both_variables_in_every_format() {
    for format in ["shell", "dotenv", "json"] {
        for (args, extra) in [
            (vec!["--no-proxy", "", "--format", format], vec![]),
            (vec!["--format", format], vec![("LATCHKEY_NO_PROXY", "")]),
        ] {
            let text = env_output(&args, &extra);
            let lines = no_proxy_lines(&text);
            match format {
                "shell" => assert_eq!(
                    lines,
                    ["unset NO_PROXY no_proxy"],
                    "{args:?} {extra:?}:\n{text}"
                ),
                "dotenv" => assert_eq!(
                    lines,
                    ["NO_PROXY=", "no_proxy="],
                    "{args:?} {extra:?}:\n{text}"
                ),
                _ => {
                    let v: Value = serde_json::from_str(text.trim()).expect("env JSON stays valid");
                    assert_eq!(
                        (&v["NO_PROXY"], &v["no_proxy"]),
                        (&json!(""), &json!("")),
                        "{v:#}"
                    );
                }
            }
            assert!(text.contains("HTTPS_PROXY"), "{text}");
        }
    }
}

#[test]
fn eval_of_env_with_an_empty_no_proxy_clears_what_an_earlier_eval_set() {
    let first = env_output(&[], &[]);
    let second = env_output(&["--no-proxy", ""], &[]);
    let script = format!(
        "{first}\n[ -n \"$NO_PROXY\" ] || exit 3\n{second}\necho \"NO_PROXY=${{NO_PROXY-unset}} no_proxy=${{no_proxy-unset}}\""
    );
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert_eq!(
        out.stdout.trim(),
        "NO_PROXY=unset no_proxy=unset",
        "{out:#?}"
    );
}

#[test]
fn env_without_a_ca_fails_naming_where_it_looked_and_how_to_make_or_point_at_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nonexistent").join("x");
    let out = run_cli(["env".as_ref(), "--ca-dir".as_ref(), missing.as_os_str()]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stdout.is_empty(), "nothing to eval: {out:#?}");
    let shown = missing.display().to_string();
    for needle in [
        format!("no latchkey CA in {shown}"),
        format!("latchkey ca init --ca-dir {shown}"),
        format!("latchkey serve --ca-dir {shown}"),
        "--ca-dir DIR (or LATCHKEY_CA_DIR)".to_string(),
    ] {
        assert!(out.stderr.contains(&needle), "{needle:?} not in {out:#?}");
    }
    assert!(
        !dir.path().join("nonexistent").exists(),
        "env must create nothing where no CA is"
    );

    // A relative directory from the environment: the absolute path and the variable named.
    let mut cmd = Command::new(crate::support::latchkey::BIN);
    cmd.arg("env").current_dir(dir.path());
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd.env("LATCHKEY_CA_DIR", "certs");
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let absolute = dir.path().join("certs").display().to_string();
    assert!(
        out.stderr.contains(&format!(
            "no latchkey CA in certs ({absolute}), chosen by LATCHKEY_CA_DIR"
        )),
        "{out:#?}"
    );
    assert!(!dir.path().join("certs").exists(), "{out:#?}");

    // `ca show` and `ca install` need the CA too, and say the same.
    for action in ["show", "install"] {
        let out = run_cli([
            "ca".as_ref(),
            action.as_ref(),
            "--ca-dir".as_ref(),
            missing.as_os_str(),
        ]);
        assert_eq!(out.code(), Some(1), "{out:#?}");
        assert!(
            out.stderr
                .contains(&format!("latchkey ca init --ca-dir {shown}")),
            "{out:#?}"
        );
    }
    assert!(!dir.path().join("nonexistent").exists());
}

#[test]
fn env_no_proxy_list_replaces_the_default() {
    let list = "localhost,.internal.example";
    let text = env_output(&["--no-proxy", list], &[]);
    let lines = no_proxy_lines(&text);
    assert_eq!(
        lines,
        [
            "# NO_PROXY: requests to localhost, .internal.example bypass latchkey (curl applies it even over -x); --no-proxy '' to send them through latchkey too",
            "export NO_PROXY='localhost,.internal.example'",
            "export no_proxy='localhost,.internal.example'",
        ],
        "{text}"
    );
    let v: Value = serde_json::from_str(
        env_output(&["--format", "json"], &[("LATCHKEY_NO_PROXY", list)]).trim(),
    )
    .expect("env JSON");
    assert_eq!(v["NO_PROXY"], list);
    assert_eq!(v["no_proxy"], list);
}

#[test]
fn env_no_proxy_with_a_line_break_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().expect("temp dir");
    ca_init(&dir.path().join("ca"));
    let out = run_cli([
        "env".as_ref(),
        "--ca-dir".as_ref(),
        dir.path().join("ca").as_os_str(),
        "--no-proxy".as_ref(),
        "localhost\necho pwned".as_ref(),
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("--no-proxy"), "{out:#?}");
    assert!(out.stdout.is_empty(), "{out:#?}");
}

#[test]
fn a_loopback_upstream_bypasses_latchkey_under_the_default_no_proxy_and_not_with_an_empty_one() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .policy(
            "main.toml",
            &format!("[[rules]]\nname = \"local\"\nhosts = [\"127.0.0.1\"]\nports = [{port}]\n"),
        )
        .run();
    let curl_with = |vars: &serde_json::Map<String, Value>, path: &str| {
        let mut cmd = Command::new("curl");
        cmd.args(["-q", "-sS", "--max-time", "20"])
            .arg(format!("http://127.0.0.1:{port}{path}"));
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        for (name, value) in vars {
            if let Some(value) = value.as_str() {
                cmd.env(name, value);
            }
        }
        let out = wait_with_timeout(&mut cmd, Duration::from_secs(30));
        assert_eq!(out.code(), Some(0), "{out:#?}");
        Echo::parse(&out.stdout)
    };

    // Default: curl goes straight to the upstream; latchkey sees nothing.
    let default = env_json(&lk.proxy_url(), &lk.ca_dir());
    assert_eq!(curl_with(&default, "/around").path, "/around");
    // --no-proxy '': the same request goes through latchkey and is audited.
    let out = run_cli([
        "env".as_ref(),
        "--proxy".as_ref(),
        lk.proxy_url().as_ref(),
        "--ca-dir".as_ref(),
        lk.ca_dir().as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
        "--no-proxy".as_ref(),
        "".as_ref(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let through: serde_json::Map<String, Value> =
        serde_json::from_str(out.stdout.trim()).expect("env JSON");
    assert_eq!(curl_with(&through, "/through").path, "/through");

    assert_eq!(
        upstream.received().len(),
        2,
        "both requests reached the upstream"
    );
    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"path": "/through", "decision": "allow", "rule": "local", "status": 200}),
    );
}

#[test]
fn ca_init_export_writes_the_public_half_where_a_sandbox_mounts_it_never_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_dir, out_dir) = (dir.path().join("ca"), dir.path().join("trust"));
    let export = |target: &Path| {
        run_cli([
            "ca".as_ref(),
            "init".as_ref(),
            "--ca-dir".as_ref(),
            ca_dir.as_os_str(),
            "--export".as_ref(),
            target.as_os_str(),
        ])
    };
    // The directory must exist: a typo is an error naming it, not a new directory somewhere.
    let out = export(&out_dir);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("--export") && out.stderr.contains("not a directory"));
    std::fs::create_dir(&out_dir).expect("mkdir");
    let out = export(&out_dir);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert_ca_files(&ca_dir);
    let mut names: Vec<String> = std::fs::read_dir(&out_dir)
        .expect("read the export")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "latchkey-bundle.pem",
            "latchkey-ca.pem",
            "latchkey-truststore.p12"
        ]
    );
    let ca = certs_in(&ca_dir.join("latchkey-ca.pem"));
    assert_eq!(certs_in(&out_dir.join("latchkey-ca.pem")), ca);
    let bundle = certs_in(&out_dir.join("latchkey-bundle.pem"));
    assert!(bundle.contains(&ca[0]), "the bundle trusts the CA");
    let key = std::fs::read(ca_dir.join("latchkey-ca.key")).expect("the key");
    for name in &names {
        let bytes = std::fs::read(out_dir.join(name)).expect("an exported file");
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("PRIVATE KEY"), "{name} holds a private key");
        assert!(
            !bytes.windows(key.len()).any(|w| w == key.as_slice()),
            "{name} holds the CA key"
        );
    }
    // Run again (a compose restart): the same CA, exported again.
    let out = export(&out_dir);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(out.stdout.contains("left unchanged"), "{}", out.stdout);
    assert_eq!(certs_in(&out_dir.join("latchkey-ca.pem")), ca);
}

#[test]
fn health_exits_zero_only_while_latchkey_serves() {
    let lk = latchkey()
        .policy(
            "main.toml",
            "[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\n",
        )
        .run();
    let url = format!("http://{}", lk.admin_addr());
    for extra in [&[][..], &["--live"][..]] {
        let mut args = vec!["health", "--admin-url", url.as_str()];
        args.extend_from_slice(extra);
        let out = run_cli(&args);
        assert_eq!(out.code(), Some(0), "health {extra:?}: {out:#?}");
    }
    drop(lk);
    let out = run_cli(["health", "--admin-url", url.as_str(), "--timeout", "1s"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("cannot reach the admin API"),
        "{}",
        out.stderr
    );
}

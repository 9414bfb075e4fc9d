//! A newcomer's first run: `--version` names the build, `serve` works from any directory.

use std::process::Command;

use crate::support::latchkey::BIN;

#[test]
fn version_names_the_crate_version_and_the_git_revision() {
    let out = Command::new(BIN)
        .arg("--version")
        .output()
        .expect("run latchkey --version");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let expected_prefix = format!("latchkey {} (", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&expected_prefix), "{text}");
    // In a git checkout (CI's fresh clone included) the stamp is HEAD's short hash and date.
    let head = Command::new(crate::support::toolchain::tool("git"))
        .args(["log", "-1", "--format=%h %cs"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run git");
    if head.status.success() {
        let head = String::from_utf8_lossy(&head.stdout);
        assert_eq!(text.trim(), format!("{expected_prefix}{})", head.trim()));
    } else {
        assert_eq!(text.trim(), format!("{expected_prefix}unknown revision)"));
    }
    // Subcommands print the same stamp.
    let sub = Command::new(BIN)
        .args(["serve", "--version"])
        .output()
        .expect("run");
    assert!(
        String::from_utf8_lossy(&sub.stdout).contains(text.trim().trim_start_matches("latchkey "))
    );
}

/// `latchkey serve` with no `--policies` in a directory without `policies/` writes the example
/// policy (and its tests) there and serves it; the written files are the repository's.
#[test]
fn serve_in_an_empty_directory_writes_and_serves_the_example_policy() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--admin", "off"])
        .current_dir(dir.path())
        .env_remove("LATCHKEY_POLICIES")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn latchkey serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let ready = loop {
        match lines.next() {
            Some(Ok(line)) => {
                let done = line.starts_with("latchkey: proxy listening on");
                seen.push(line);
                if done {
                    break true;
                }
            }
            _ => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(ready, "serve did not start:\n{}", seen.join("\n"));
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for file in ["example.toml", "tests/example.toml"] {
        let written = std::fs::read_to_string(dir.path().join("policies").join(file))
            .unwrap_or_else(|e| panic!("policies/{file} not written: {e}"));
        let original = std::fs::read_to_string(repo.join(file)).expect("repo policy");
        assert_eq!(written, original, "policies/{file}");
    }
    assert!(dir.path().join("certs/latchkey-ca.pem").exists());
    assert!(
        seen.iter().any(|l| l.contains("wrote the example policy")),
        "{}",
        seen.join("\n")
    );
    // The written policy passes its own tests.
    let test = Command::new(BIN)
        .arg("test")
        .current_dir(dir.path())
        .env_remove("LATCHKEY_POLICIES")
        .output()
        .expect("latchkey test");
    assert!(test.status.success(), "{test:?}");
}

/// A policy directory that was named and does not exist is an error naming it, never an
/// example policy in its place.
#[test]
fn serve_with_a_named_missing_policy_directory_fails_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    for args in [
        vec![
            "serve",
            "--policies",
            "mine",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "off",
        ],
        vec!["serve", "--listen", "127.0.0.1:0", "--admin", "off"],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .current_dir(dir.path())
            .env("LATCHKEY_POLICIES", "mine")
            .output()
            .expect("run latchkey serve");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot read policy directory mine"), "{err}");
        assert!(!dir.path().join("policies").exists());
        assert!(!dir.path().join("mine").exists());
    }
}

//! The shipped policies: the default example and every model-provider preset must validate, and
//! a preset must name its missing key precisely.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::latchkey::wait_with_timeout;
use crate::support::run_cli;

const PRESET_KEYS: &[&str] = &[
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "MISTRAL_API_KEY",
    "OPENROUTER_API_KEY",
];

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(path)
        .display()
        .to_string()
}

#[test]
fn the_example_policy_is_valid() {
    let out = run_cli(["check", "--policies", &repo("policies")]);
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
}

#[test]
fn every_preset_is_valid_when_its_keys_are_set() {
    // The credential presets read key files (/run/secrets/...) that only a deployment has, so
    // validate them without reading secret values; the env-only presets are read for real.
    let out = run_cli([
        "check",
        "--no-secrets",
        "--policies",
        &repo("policies/presets"),
    ]);
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("11 rule(s) in 8 file(s)"),
        "{}",
        out.stdout
    );

    let dir = tempfile::tempdir().expect("tempdir");
    for f in [
        "openai.toml",
        "anthropic.toml",
        "gemini.toml",
        "azure-openai.toml",
        "bearer-apis.toml",
    ] {
        std::fs::copy(repo(&format!("policies/presets/{f}")), dir.path().join(f)).expect("copy");
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_latchkey"));
    cmd.args(["check", "--policies", &dir.path().display().to_string()]);
    for (i, key) in PRESET_KEYS.iter().enumerate() {
        cmd.env(key, format!("preset-test-key-{i}-0123456789"));
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("6 rule(s) in 5 file(s)"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_preset_without_its_key_names_the_file_line_and_variable() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_latchkey"));
    cmd.args(["check", "--policies", &repo("policies/presets")]);
    for key in PRESET_KEYS {
        cmd.env_remove(key);
    }
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr
            .contains("openai.toml:8:10: secrets.openai.source: env var OPENAI_API_KEY is not set"),
        "{}",
        out.stderr
    );
}

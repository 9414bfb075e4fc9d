//! Policy operations a security team runs in CI: `check` (every error, warnings, JSON), `test`
//! (policy test cases) and `explain` (candidates and why they did not match).

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::latchkey::{wait_with_timeout, SCRUBBED_ENV};
use crate::support::{assert_problem, policy_dir, problems_in, CliOutput};

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

/// `latchkey ARGS...` with every preset key removed from the environment and `env` set.
fn cli(args: &[&OsStr], env: &[(&str, &str)]) -> CliOutput {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_latchkey"));
    cmd.args(args);
    for var in SCRUBBED_ENV.iter().chain(PRESET_KEYS) {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    wait_with_timeout(&mut cmd, Duration::from_secs(20))
}

fn os<'a>(args: &'a [&'a str]) -> Vec<&'a OsStr> {
    args.iter().map(OsStr::new).collect()
}

fn check(dir: &Path, extra: &[&str]) -> CliOutput {
    let mut args: Vec<&OsStr> = vec!["check".as_ref(), "--policies".as_ref(), dir.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    cli(&args, &[])
}

fn json_of(out: &CliOutput) -> Value {
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {out:#?}"))
}

// ---------------------------------------------------------------------------------------------
// check: every error, with its line

/// Three files, several errors each; the line of each problem is noted beside it.
const BROKEN: &[(&str, &str)] = &[
    (
        "a.toml",
        r#"[[rules]]
name = "bad name"
hosts = ["api.test"]
ports = [70000]

[[rules]]
name = "lower"
hosts = ["https://api.test/v1"]
methods = ["get"]
"#,
    ),
    (
        "b.toml",
        r#"[secrets.k]
source = "vault:secret/k"

[[rules]]
name = "star"
hosts = ["*"]
paths = ["v1/**"]
[rules.inject.headers]
x-k = "{{secret.missing}}"
"#,
    ),
    (
        "c.toml",
        r#"[[rules]]
name = "x"
hosts = "a.test" oops
"#,
    ),
];

#[test]
fn check_reports_every_error_in_every_file_at_its_line() {
    let dir = policy_dir(BROKEN);
    let out = check(dir.path(), &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let text = &out.stderr;
    assert_problem(text, "a.toml", 2, "bad name");
    assert_problem(text, "a.toml", 4, "70000");
    assert_problem(text, "a.toml", 8, "is a URL");
    assert_problem(text, "a.toml", 9, "\"GET\"");
    assert_problem(text, "b.toml", 2, "vault");
    assert_problem(text, "b.toml", 6, "every host");
    assert_problem(text, "b.toml", 7, "must start with '/'");
    assert_problem(text, "b.toml", 9, "missing");
    assert_problem(text, "c.toml", 3, "");
    assert_eq!(problems_in(text, "a.toml").len(), 4, "{text}");
    assert_eq!(problems_in(text, "b.toml").len(), 4, "{text}");
    assert!(
        text.contains("latchkey: error: 9 problem(s) in policy"),
        "{text}"
    );
}

#[test]
fn check_format_json_lists_every_error_with_file_line_and_col() {
    let dir = policy_dir(BROKEN);
    let out = check(dir.path(), &["--format", "json"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let v = json_of(&out);
    assert_eq!(v["ok"], false, "{v:#}");
    assert_eq!(v["files"], 3, "{v:#}");
    assert_eq!(v["policy"], Value::Null, "{v:#}");
    let errors = v["errors"].as_array().expect("errors array");
    assert_eq!(errors.len(), 9, "{v:#}");
    for e in errors {
        assert!(
            e["file"].as_str().is_some_and(|f| f.ends_with(".toml")),
            "{e}"
        );
        assert!(e["line"].as_u64().is_some_and(|l| l >= 1), "{e}");
        assert!(e["col"].as_u64().is_some_and(|c| c >= 1), "{e}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    }
    let located = |file: &str, line: u64| {
        errors
            .iter()
            .any(|e| e["file"].as_str().is_some_and(|f| f.ends_with(file)) && e["line"] == line)
    };
    assert!(
        located("a.toml", 4) && located("b.toml", 7) && located("c.toml", 3),
        "{v:#}"
    );
}

// ---------------------------------------------------------------------------------------------
// check: warnings

/// Valid, but every risky construct `check` warns about, each at a known line.
const RISKY: &str = r#"[secrets.used]
source = "exec:printf used-secret-value-0123"

[secrets.spare]
source = "exec:printf spare-secret-value-0123"

[[rules]]
name = "wild"
hosts = ["*.corp.test"]
dangerously_inject_into_wildcard = true
[rules.inject.headers]
authorization = "Bearer {{secret.used}}"

[[rules]]
name = "everything"
hosts = ["api.test"]
ports = [80, 443]

[[rules]]
name = "never"
hosts = ["api.test"]

[identities.lab]
sources = ["10.0.0.0/8"]
rules = ["*"]
"#;

#[test]
fn check_warns_about_risky_constructs_and_still_exits_0() {
    let dir = policy_dir(&[("risky.toml", RISKY)]);
    let out = check(dir.path(), &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let warnings: Vec<(u32, String)> = problems_in(&out.stderr, "risky.toml")
        .into_iter()
        .map(|(line, _, m)| (line, m))
        .collect();
    let expect = [
        (
            4,
            "warning: secret \"spare\" is declared but no rule binds it",
        ),
        (
            8,
            "warning: rule \"wild\" binds secret(s) \"used\" and allows every method",
        ),
        (
            10,
            "warning: rule \"wild\" sends secret(s) \"used\" to every host matching *.corp.test",
        ),
        (
            20,
            "warning: rule \"never\" can never match: rule \"everything\"",
        ),
        (
            24,
            "warning: identity \"lab\" may use every rule, needs no token",
        ),
    ];
    assert_eq!(warnings.len(), expect.len(), "{}", out.stderr);
    for (line, start) in expect {
        assert!(
            warnings
                .iter()
                .any(|(l, m)| *l == line && m.starts_with(start)),
            "expected risky.toml:{line}:COL: {start}… in:\n{}",
            out.stderr
        );
    }
    assert!(
        out.stdout.contains("ok: 3 rule(s) in 1 file(s)") && out.stdout.contains("5 warning(s)"),
        "{}",
        out.stdout
    );
}

#[test]
fn check_format_json_carries_warnings_rules_files_and_the_digest() {
    let dir = policy_dir(&[("risky.toml", RISKY)]);
    let out = check(dir.path(), &["--format", "json"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let v = json_of(&out);
    assert_eq!(v["ok"], true, "{v:#}");
    assert_eq!(v["errors"], serde_json::json!([]), "{v:#}");
    assert_eq!(v["rules"], 3, "{v:#}");
    assert_eq!(v["files"], 1, "{v:#}");
    assert!(
        v["policy"]
            .as_str()
            .is_some_and(|p| p.starts_with("sha256:")),
        "{v:#}"
    );
    let codes: Vec<&str> = v["warnings"]
        .as_array()
        .expect("warnings array")
        .iter()
        .map(|w| {
            assert!(
                w["file"]
                    .as_str()
                    .is_some_and(|f| f.ends_with("risky.toml")),
                "{w}"
            );
            assert!(
                w["line"].as_u64().is_some() && w["col"].as_u64().is_some(),
                "{w}"
            );
            assert!(w["message"].as_str().is_some(), "{w}");
            w["code"].as_str().unwrap_or_default()
        })
        .collect();
    assert_eq!(
        codes,
        [
            "unused_secret",
            "secret_all_methods",
            "wildcard_secret",
            "shadowed_rule",
            "wide_identity"
        ],
        "{v:#}"
    );
    // Nothing but the JSON object on stdout; nothing on stderr.
    assert!(out.stderr.trim().is_empty(), "{}", out.stderr);
}

#[test]
fn the_shipped_example_policy_has_no_warnings() {
    let out = check(Path::new(&repo("policies")), &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
}

#[test]
fn check_no_secrets_validates_the_presets_without_their_keys() {
    let presets = repo("policies/presets");
    let out = check(Path::new(&presets), &["--no-secrets"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.starts_with("ok: ") && out.stdout.contains("secret values not read"),
        "{}",
        out.stdout
    );
    // Without the flag the same machine fails, naming the missing key.
    let out = check(Path::new(&presets), &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("OPENAI_API_KEY is not set"),
        "{}",
        out.stderr
    );
}

#[test]
fn check_no_secrets_still_rejects_a_malformed_secret_source() {
    let dir = policy_dir(&[(
        "a.toml",
        "[secrets.k]\nsource = \"env\"\n[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\nmethods = [\"GET\"]\nsecrets = [\"k\"]\n",
    )]);
    let out = check(dir.path(), &["--no-secrets"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert_problem(&out.stderr, "a.toml", 2, "secrets.k.source");
}

// ---------------------------------------------------------------------------------------------
// test: policy test cases

fn test_cmd(policies: &str, extra: &[&str]) -> CliOutput {
    let mut args = vec!["test", "--policies", policies];
    args.extend_from_slice(extra);
    cli(&os(&args), &[])
}

#[test]
fn test_passes_on_the_shipped_example_policy() {
    let out = test_cmd(&repo("policies"), &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.contains("PASS read the zen of GitHub"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("FAIL"), "{}", out.stdout);
    assert!(out.stdout.contains(" passed, 0 failed"), "{}", out.stdout);
}

#[test]
fn test_passes_on_the_presets_without_their_keys() {
    let out = test_cmd(&repo("policies/presets"), &[]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.contains("PASS chat completions get the key"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains(" passed, 0 failed"), "{}", out.stdout);
}

const TESTED_POLICY: &str = r#"[secrets.k]
source = "env:LATCHKEY_POLICY_OPS_UNSET_KEY"

[[rules]]
name = "api-read"
hosts = ["api.test"]
methods = ["GET"]
[rules.inject.headers]
authorization = "Bearer {{secret.k}}"
"#;

/// A policy dir with `tests/NAME` holding `cases`.
fn tested_dir(name: &str, cases: &str) -> tempfile::TempDir {
    let dir = policy_dir(&[("main.toml", TESTED_POLICY)]);
    std::fs::create_dir(dir.path().join("tests")).expect("mkdir tests");
    std::fs::write(dir.path().join("tests").join(name), cases).expect("write cases");
    dir
}

#[test]
fn test_fails_with_a_fail_line_for_a_wrong_case() {
    let dir = tested_dir(
        "cases.toml",
        r#"[[cases]]
name = "reads work"
method = "GET"
url = "https://api.test/v1/items"
expect = "allow"
rule = "api-read"
secrets = ["k"]

[[cases]]
name = "writes work too (wrong)"
method = "POST"
url = "https://api.test/v1/items"
expect = "allow"
"#,
    );
    let out = test_cmd(&dir.path().display().to_string(), &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stdout.contains("PASS reads work"), "{}", out.stdout);
    assert!(
        out.stdout.contains(
            "FAIL writes work too (wrong): expected allow, got deny (method_not_allowed: no rule allows POST https://api.test/v1/items: rule 'api-read' allows only GET)"
        ),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("cases.toml:9:1"), "{}", out.stdout);
    assert!(out.stdout.contains("1 passed, 1 failed"), "{}", out.stdout);
}

#[test]
fn test_checks_rule_reason_and_secrets_expectations() {
    let dir = tested_dir(
        "cases.toml",
        r#"[[cases]]
method = "POST"
url = "https://api.test/"
expect = "deny"
rule = "api-read"
reason = "path_not_allowed"

[[cases]]
method = "GET"
url = "https://api.test/"
expect = "allow"
secrets = ["other"]
"#,
    );
    let out = test_cmd(&dir.path().display().to_string(), &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stdout.contains(
            "FAIL POST https://api.test/: expected reason path_not_allowed, got method_not_allowed"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(
            "FAIL GET https://api.test/: expected secret(s) other bound, rule 'api-read' binds k"
        ),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("0 passed, 2 failed"), "{}", out.stdout);
}

#[test]
fn test_rejects_a_malformed_test_file_with_file_line_and_col() {
    let dir = tested_dir(
        "bad.toml",
        r#"[[cases]]
method = "GET"
url = "https://api.test/"
expect = "allowed"
rule = "no-such-rule"

[[cases]]
method = "GET"
url = "https://api.test/"
expect = "allow"
colour = "blue"
"#,
    );
    let out = test_cmd(&dir.path().display().to_string(), &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    // The TOML layer stops at the first unknown key; it is reported where it is written.
    assert_problem(&out.stderr, "bad.toml", 11, "colour");

    let dir = tested_dir(
        "bad.toml",
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"allowed\"\nrule = \"no-such-rule\"\nreason = \"nope\"\nidentity = \"ci\"\n",
    );
    let out = test_cmd(&dir.path().display().to_string(), &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert_problem(&out.stderr, "bad.toml", 4, "allowed");
    assert_problem(&out.stderr, "bad.toml", 5, "no-such-rule");
    assert_problem(&out.stderr, "bad.toml", 6, "nope");
    assert_problem(&out.stderr, "bad.toml", 7, "identit");
    assert!(
        out.stdout.contains("4 problem(s) in test files"),
        "{}",
        out.stdout
    );
}

#[test]
fn test_reads_cases_from_the_tests_flag_directory() {
    let policies = policy_dir(&[("main.toml", TESTED_POLICY)]);
    let cases = policy_dir(&[(
        "elsewhere.toml",
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"allow\"\n",
    )]);
    let out = cli(
        &[
            "test".as_ref(),
            "--policies".as_ref(),
            policies.path().as_os_str(),
            "--tests".as_ref(),
            cases.path().as_os_str(),
        ],
        &[],
    );
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(out.stdout.contains("1 passed, 0 failed"), "{}", out.stdout);
    // No test directory at all is an error, not a silent pass.
    let out = test_cmd(&policies.path().display().to_string(), &[]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("cannot read test directory"),
        "{}",
        out.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// explain: candidates and why they did not match

const EXPLAINED: &str = r#"[secrets.gh]
source = "env:LATCHKEY_POLICY_OPS_GH"

[[rules]]
name = "gh-read"
hosts = ["api.gh.test"]
methods = ["GET"]
paths = ["/repos/**"]
[rules.inject.headers]
authorization = "Bearer {{secret.gh}}"

[[rules]]
name = "gh-write"
hosts = ["api.gh.test"]
methods = ["POST"]
paths = ["/repos/*/issues"]

[[rules]]
name = "gh-alt"
hosts = ["*.gh.test"]
ports = [8443]

[[rules]]
name = "other"
hosts = ["other.test"]
"#;

const GH_VALUE: &str = "gh-secret-value-must-not-print-0123";

fn explain(args: &[&str]) -> CliOutput {
    let dir = policy_dir(&[("main.toml", EXPLAINED)]);
    let mut full: Vec<&OsStr> = vec![
        "explain".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ];
    full.extend(args.iter().map(OsStr::new));
    let out = cli(&full, &[("LATCHKEY_POLICY_OPS_GH", GH_VALUE)]);
    assert!(
        !out.stdout.contains(GH_VALUE) && !out.stderr.contains(GH_VALUE),
        "a secret value was printed: {out:#?}"
    );
    out
}

#[test]
fn explain_lists_every_candidate_rule_and_why_it_did_not_match() {
    let out = explain(&["POST", "https://api.gh.test/repos/x/pulls"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let text = &out.stdout;
    for line in [
        "decision: deny",
        "reason:   path_not_allowed",
        "  - gh-read (",
        "main.toml:4): method: allows only GET",
        "main.toml:12): path: allows only paths /repos/*/issues (closest)",
        "main.toml:18): port: allows port(s) 8443",
    ] {
        assert!(text.contains(line), "expected {line:?} in:\n{text}");
    }
    assert!(
        !text.contains("other ("),
        "other.test is not a candidate:\n{text}"
    );
    assert!(
        !text.contains("secrets:"),
        "a denial binds nothing:\n{text}"
    );
}

#[test]
fn explain_names_the_secrets_and_headers_of_the_allowing_rule() {
    let out = explain(&["GET", "https://api.gh.test/repos/x"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let text = &out.stdout;
    for line in [
        "decision: allow",
        "rule:     gh-read (",
        "main.toml:4): matched: decides",
        "main.toml:12): method: allows only POST",
        "injects:  authorization (names only)",
        "secrets:  gh (env) (bound to this rule's hosts)",
    ] {
        assert!(text.contains(line), "expected {line:?} in:\n{text}");
    }
}

#[test]
fn explain_json_carries_candidates_secrets_and_injected_names() {
    let out = explain(&["--json", "GET", "https://api.gh.test/repos/x"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let v = json_of(&out);
    assert_eq!(v["decision"], "allow", "{v:#}");
    assert_eq!(v["reason"], "allowed", "{v:#}");
    assert_eq!(v["rule"], "gh-read", "{v:#}");
    assert!(
        v["rule_origin"]
            .as_str()
            .is_some_and(|o| o.ends_with("main.toml:4")),
        "{v:#}"
    );
    assert_eq!(v["secrets"], serde_json::json!(["gh"]), "{v:#}");
    assert_eq!(v["injected"], serde_json::json!(["authorization"]), "{v:#}");
    assert!(
        v["policy"]
            .as_str()
            .is_some_and(|p| p.starts_with("sha256:")),
        "{v:#}"
    );
    let candidates: Vec<(&str, &str, bool)> = v["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .map(|c| {
            (
                c["rule"].as_str().unwrap_or_default(),
                c["outcome"].as_str().unwrap_or_default(),
                c["decides"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        candidates,
        [
            ("gh-read", "matched", true),
            ("gh-write", "method", false),
            ("gh-alt", "port", false)
        ],
        "{v:#}"
    );
}

#[test]
fn explain_with_identities_says_which_rules_the_identity_may_not_use() {
    let policy = format!(
        "{EXPLAINED}\n[identities.ci]\nsources = [\"10.9.0.0/24\"]\nrules = [\"gh-write\"]\n"
    );
    let dir = policy_dir(&[("main.toml", &policy)]);
    let base = ["explain", "--policies", &dir.path().display().to_string()].map(String::from);
    let run = |extra: &[&str]| {
        let mut args: Vec<&str> = base.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        cli(&os(&args), &[])
    };
    let out = run(&[
        "--identity",
        "ci",
        "--json",
        "GET",
        "https://api.gh.test/repos/x",
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let v = json_of(&out);
    assert_eq!(v["identity"], "ci", "{v:#}");
    assert_eq!(v["candidates"][0]["outcome"], "identity", "{v:#}");
    // No identity at all: the proxy refuses an unidentified client, and so does explain.
    let out = run(&["--json", "GET", "https://api.gh.test/repos/x"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert_eq!(json_of(&out)["reason"], "proxy_auth_required");
    // An unknown identity is an input error naming the known ones.
    let out = run(&["--identity", "nobody", "GET", "https://api.gh.test/"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("the policy defines: ci"),
        "{}",
        out.stderr
    );
}

//! `check`, `explain` and `test` on a policy that asks a person: the `ask` verdict, its terms in
//! `explain`'s text and JSON, `expect = "ask"` cases, and `check`'s summary.

use serde_json::Value;

use crate::support::{policy_dir, run_cli, CliOutput};

const ASKING: &str = r#"[notify.ops]
url = "https://hooks.example.test/latchkey"

[ask]
unknown = true
hold = "10s"

[[rules]]
name = "prod-writes"
hosts = ["api.prod.test"]
methods = ["POST", "DELETE"]
ask = { hold = "30s", scope = ["once", "1h", "session"], message = "Production write", notify = ["ops"] }

[[rules]]
name = "prod-reads"
hosts = ["api.prod.test"]
methods = ["GET"]
"#;

fn run(dir: &std::path::Path, args: &[&str]) -> CliOutput {
    let mut full: Vec<&std::ffi::OsStr> = vec![args[0].as_ref(), "--policies".as_ref()];
    full.push(dir.as_os_str());
    full.extend(args[1..].iter().map(|a| std::ffi::OsStr::new(*a)));
    run_cli(full)
}

#[test]
fn explain_says_ask_with_the_rule_hold_and_scopes_and_exits_1() {
    let dir = policy_dir(&[("main.toml", ASKING)]);
    let out = run(
        dir.path(),
        &["explain", "POST", "https://api.prod.test/v1/deploy"],
    );
    assert_eq!(out.code(), Some(1), "an ask is not an allow yet: {out:#?}");
    assert!(out.stdout.contains("decision: ask\n"), "{}", out.stdout);
    assert!(
        out.stdout.contains(
            "asks a person (rule 'prod-writes'; hold 30s; scopes once, 1h, session; notifies ops)"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("message: Production write"),
        "{}",
        out.stdout
    );

    let out = run(
        dir.path(),
        &["explain", "--json", "GET", "https://new.test/"],
    );
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let v: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("no JSON ({e}): {out:#?}"));
    assert_eq!(v["decision"], "ask", "{v:#}");
    assert_eq!(v["reason"], "no_rule", "{v:#}");
    assert_eq!(v["ask"]["rule"], "unknown", "{v:#}");
    assert_eq!(v["ask"]["hold"], "10s", "{v:#}");
    assert_eq!(v["ask"]["scopes"], serde_json::json!(["once"]), "{v:#}");
    assert_eq!(v["ask"]["notify"], serde_json::json!(["ops"]), "{v:#}");

    let out = run(
        dir.path(),
        &["explain", "--json", "GET", "https://api.prod.test/"],
    );
    assert_eq!(out.code(), Some(0), "{out:#?}");
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_default();
    assert_eq!(v["decision"], "allow", "{v:#}");
    assert!(v.get("ask").is_none(), "{v:#}");
}

#[test]
fn test_takes_expect_ask_and_fails_a_deny_that_asks() {
    let cases = r#"[[cases]]
name = "prod write waits for a person"
method = "POST"
url = "https://api.prod.test/v1/deploy"
expect = "ask"
ask_rule = "prod-writes"

[[cases]]
name = "unknown host is asked about"
method = "GET"
url = "https://new.test/"
expect = "ask"
ask_rule = "unknown"
"#;
    let dir = policy_dir(&[("main.toml", ASKING)]);
    std::fs::create_dir(dir.path().join("tests")).expect("tests dir");
    std::fs::write(dir.path().join("tests/ask.toml"), cases).expect("write cases");
    let out = run(dir.path(), &["test"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.contains("PASS prod write waits for a person"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("2 passed, 0 failed"), "{}", out.stdout);

    let failing = "[[cases]]\nname = \"unknown is denied\"\nmethod = \"GET\"\nurl = \"https://new.test/\"\nexpect = \"deny\"\n";
    std::fs::write(dir.path().join("tests/ask.toml"), failing).expect("write cases");
    let out = run(dir.path(), &["test"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stdout.contains(
            "FAIL unknown is denied: expected deny, got ask: asks a person ([ask] unknown = true; hold 10s"
        ),
        "{}",
        out.stdout
    );
}

#[test]
fn check_names_ask_rules_and_notifiers_and_warns_when_nobody_would_hear() {
    let dir = policy_dir(&[("main.toml", ASKING)]);
    let out = run(dir.path(), &["check", "--no-secrets"]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(
        out.stdout.contains(
            "; asks a person: 1 rule(s) and requests no rule allows ([ask] unknown); notifiers: ops"
        ),
        "{}",
        out.stdout
    );
    let out = run(dir.path(), &["check", "--no-secrets", "--format", "json"]);
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_default();
    assert_eq!(v["ask_rules"], serde_json::json!(["prod-writes"]), "{v:#}");
    assert_eq!(v["ask_unknown"], true, "{v:#}");
    assert_eq!(v["notifiers"], serde_json::json!(["ops"]), "{v:#}");

    let quiet = policy_dir(&[(
        "main.toml",
        "[ask]\nunknown = true\n[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\nmethods = [\"GET\"]\n",
    )]);
    let out = run(quiet.path(), &["check", "--no-secrets"]);
    assert_eq!(out.code(), Some(0), "warnings alone pass: {out:#?}");
    assert!(
        out.stderr.contains("main.toml:1:1: warning: [ask] unknown = true turns every request no rule allows into an approval request, but no [notify.NAME] webhook exists"),
        "{}",
        out.stderr
    );
}

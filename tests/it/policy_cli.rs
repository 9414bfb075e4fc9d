//! Policy validation (`serve` refusing to start, `check`) and `explain`.

use serde_json::Value;

use crate::support::{assert_problem, latchkey, policy_dir, problems_in, run_cli, CliOutput};

fn serve_refuses(files: &[(&str, &str)]) -> CliOutput {
    let mut builder = latchkey();
    for (name, contents) in files {
        builder = builder.policy(name, contents);
    }
    let out = builder.run_expecting_failure();
    assert_eq!(
        out.code(),
        Some(1),
        "serve on an invalid policy must exit 1: {out:#?}"
    );
    out
}

#[test]
fn serve_refuses_to_start_on_an_unknown_key() {
    let out = serve_refuses(&[(
        "main.toml",
        "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\ncolour = \"blue\"\n",
    )]);
    assert_problem(&out.stderr, "main.toml", 4, "colour");
}

#[test]
fn serve_refuses_to_start_on_duplicate_rule_names_across_two_files() {
    let out = serve_refuses(&[
        (
            "a.toml",
            "[[rules]]\nname = \"dup\"\nhosts = [\"api.test\"]\n",
        ),
        (
            "b.toml",
            "[[rules]]\nname = \"dup\"\nhosts = [\"other.test\"]\n",
        ),
    ]);
    let located = problems_in(&out.stderr, "a.toml")
        .into_iter()
        .chain(problems_in(&out.stderr, "b.toml"))
        .any(|(line, _, message)| line == 2 && message.contains("dup"));
    assert!(
        located,
        "expected a.toml:2 or b.toml:2 naming \"dup\" in:\n{}",
        out.stderr
    );
}

#[test]
fn serve_refuses_to_start_on_empty_hosts() {
    let out = serve_refuses(&[("main.toml", "[[rules]]\nname = \"api\"\nhosts = []\n")]);
    assert_problem(&out.stderr, "main.toml", 3, "hosts");
}

#[test]
fn serve_refuses_to_start_on_a_bad_path_glob() {
    let out = serve_refuses(&[(
        "main.toml",
        "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\npaths = [\"/v1/[a\"]\n",
    )]);
    assert_problem(&out.stderr, "main.toml", 4, "/v1/[a");
}

#[test]
fn serve_refuses_to_start_on_a_port_out_of_range() {
    let out = serve_refuses(&[(
        "main.toml",
        "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [70000]\n",
    )]);
    assert_problem(&out.stderr, "main.toml", 4, "70000");
}

#[test]
fn check_reports_every_problem_in_one_run() {
    let dir = policy_dir(&[
        (
            "a.toml",
            "[[rules]]\nname = \"empty\"\nhosts = []\n\n[[rules]]\nname = \"zero\"\nhosts = [\"api.test\"]\nports = [0]\n",
        ),
        (
            "b.toml",
            "[[rules]]\nname = \"glob\"\nhosts = [\"api.test\"]\npaths = [\"/v1/[a\"]\n",
        ),
    ]);
    let out = run_cli([
        "check".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let output = format!("{}{}", out.stdout, out.stderr);
    assert_problem(&output, "a.toml", 3, "hosts");
    assert_problem(&output, "a.toml", 8, "port");
    assert_problem(&output, "b.toml", 4, "/v1/[a");
}

#[test]
fn check_refuses_a_tunnel_rule_that_sets_methods() {
    let dir = policy_dir(&[(
        "main.toml",
        "[[rules]]\nname = \"t\"\nhosts = [\"tunnel.test\"]\ntunnel = true\nmethods = [\"GET\"]\n",
    )]);
    let out = run_cli([
        "check".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let output = format!("{}{}", out.stdout, out.stderr);
    assert!(
        !problems_in(&output, "main.toml").is_empty(),
        "expected a main.toml:LINE:COL: problem in:\n{output}"
    );
}

#[test]
fn check_accepts_a_valid_policy() {
    let dir = policy_dir(&[
        (
            "a.toml",
            r#"
[[rules]]
name    = "api"
hosts   = ["api.test", "*.wild.test"]
ports   = [443, 8443]
methods = ["GET", "POST"]
paths   = ["/v1/**", "/health"]
[rules.inject.headers]
x-test-injected = "literal value"
"#,
        ),
        (
            "b.toml",
            "[[rules]]\nname = \"tunnel\"\nhosts = [\"tunnel.test\"]\ntunnel = true\n",
        ),
    ]);
    let out = run_cli([
        "check".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
}

const EXPLAIN_POLICY: &str = r#"
[[rules]]
name    = "api"
hosts   = ["api.test"]
methods = ["GET"]
paths   = ["/v1/**"]
"#;

fn explain(args: &[&str]) -> CliOutput {
    let dir = policy_dir(&[("main.toml", EXPLAIN_POLICY)]);
    let mut full: Vec<&std::ffi::OsStr> = vec![
        "explain".as_ref(),
        "--policies".as_ref(),
        dir.path().as_os_str(),
    ];
    full.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
    run_cli(full)
}

fn explain_json(method: &str, url: &str) -> (Option<i32>, Value) {
    let out = explain(&["--json", method, url]);
    let v: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("explain --json printed no JSON ({e}): {out:#?}"));
    (out.code(), v)
}

#[test]
fn explain_json_allows_a_get_that_a_rule_covers() {
    let (code, v) = explain_json("GET", "https://api.test/v1/x");
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["decision"], "allow", "{v:#}");
    assert_eq!(v["rule"], "api", "{v:#}");
    assert!(v["reason"].as_str().is_some_and(|r| !r.is_empty()), "{v:#}");
}

#[test]
fn explain_denies_what_no_rule_covers_with_exit_status_1() {
    let out = explain(&["POST", "http://nothing.test/"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");

    for (method, url) in [
        ("POST", "http://nothing.test/"),
        ("POST", "https://api.test/v1/x"),
        ("GET", "https://api.test/v2/x"),
        ("GET", "https://api.test:8443/v1/x"),
    ] {
        let (code, v) = explain_json(method, url);
        assert_eq!(code, Some(1), "{method} {url}: {v:#}");
        assert_eq!(v["decision"], "deny", "{method} {url}: {v:#}");
        assert!(
            v["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{method} {url}: {v:#}"
        );
    }
}

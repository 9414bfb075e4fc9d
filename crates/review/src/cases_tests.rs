//! Tests of policy test cases: reading, validating and running them.

use super::*;
use crate::policy::{compile_sources_with, SecretLoading};

const POLICY: &str = r#"
[secrets.k]
source = "env:LATCHKEY_CASES_TEST_UNSET"

[[rules]]
name = "read"
hosts = ["api.test"]
methods = ["GET"]
[rules.inject.headers]
authorization = "Bearer {{secret.k}}"
"#;

fn policy() -> Policy {
    compile_sources_with(&[(Path::new("p.toml"), POLICY)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

fn run(text: &str) -> Vec<CaseResult> {
    let p = policy();
    let cases = parse_cases(Path::new("t.toml"), text, &p).unwrap_or_else(|e| panic!("{e:?}"));
    cases.iter().map(|c| run_case(&p, c)).collect()
}

fn errors(text: &str) -> Vec<String> {
    match parse_cases(Path::new("t.toml"), text, &policy()) {
        Ok(c) => panic!("expected errors, parsed {c:?}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn cases_that_hold_pass_and_name_defaults_to_method_and_url() {
    let r = run(
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"allow\"\nrule = \"read\"\nsecrets = [\"k\"]\n\n[[cases]]\nname = \"no writes\"\nmethod = \"POST\"\nurl = \"https://api.test/\"\nexpect = \"deny\"\nrule = \"read\"\nreason = \"method_not_allowed\"\n",
    );
    assert!(r.iter().all(CaseResult::passed), "{r:#?}");
    assert_eq!(r[0].case.name, "GET https://api.test/");
    assert_eq!(r[1].case.name, "no writes");
}

#[test]
fn every_expectation_that_does_not_hold_is_a_failure() {
    let r = run(
        "[[cases]]\nmethod = \"POST\"\nurl = \"https://api.test/\"\nexpect = \"allow\"\nreason = \"path_not_allowed\"\n",
    );
    assert_eq!(r[0].failures.len(), 2, "{:?}", r[0].failures);
    assert!(r[0].failures[0].starts_with("expected allow, got deny (method_not_allowed: "));
    let r = run("[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"deny\"\n");
    assert!(r[0].failures[0].starts_with("expected deny, got allow (rule 'read'"));
    let r = run(
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"allow\"\nsecrets = [\"other\"]\n",
    );
    assert_eq!(
        r[0].failures,
        vec!["expected secret(s) other bound, rule 'read' binds k"]
    );
}

#[test]
fn a_credential_expectation_names_the_credential_the_rule_uses() {
    let text = format!(
        "{POLICY}\n[credentials.gh]\nkind = \"github_app\"\napp_id = \"1\"\ninstallation_id = \"2\"\nprivate_key = \"file:/x.pem\"\n[[rules]]\nname = \"gh\"\nhosts = [\"gh.test\"]\nmethods = [\"GET\"]\ncredential = \"gh\"\n"
    );
    let p = compile_sources_with(&[(Path::new("p.toml"), &text)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let cases = parse_cases(
        Path::new("t.toml"),
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://gh.test/\"\nexpect = \"allow\"\ncredential = \"gh\"\n[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"allow\"\ncredential = \"gh\"\n",
        &p,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let r: Vec<CaseResult> = cases.iter().map(|c| run_case(&p, c)).collect();
    assert!(r[0].passed(), "{:?}", r[0].failures);
    assert_eq!(
        r[1].failures,
        vec!["expected credential 'gh', rule 'read' uses none"]
    );
    let e = parse_cases(
        Path::new("t.toml"),
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://gh.test/\"\nexpect = \"allow\"\ncredential = \"nope\"\n",
        &p,
    )
    .err()
    .unwrap_or_default();
    assert!(
        e[0].to_string()
            .starts_with("t.toml:5:14: cases[0].credential: unknown credential"),
        "{e:?}"
    );
}

#[test]
fn a_limits_expectation_is_the_exact_list_charged_in_order() {
    let text = format!(
        "{POLICY}\n[limits.a]\nrequests = \"1/s\"\n[limits.b]\nconcurrency = 1\n[[rules]]\nname = \"metered\"\nhosts = [\"m.test\"]\nlimits = [\"b\", \"a\"]\n"
    );
    let p = compile_sources_with(&[(Path::new("p.toml"), &text)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let cases = parse_cases(
        Path::new("t.toml"),
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://m.test/\"\nexpect = \"allow\"\nlimits = [\"b\", \"a\"]\n[[cases]]\nmethod = \"GET\"\nurl = \"https://m.test/\"\nexpect = \"allow\"\nlimits = [\"a\", \"b\"]\n[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"allow\"\nlimits = []\n[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"allow\"\nlimits = [\"a\"]\n",
        &p,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    let r: Vec<CaseResult> = cases.iter().map(|c| run_case(&p, c)).collect();
    assert!(r[0].passed(), "{:?}", r[0].failures);
    assert_eq!(
        r[1].failures,
        vec!["expected limits a, b, rule 'metered' charges b, a"]
    );
    assert!(r[2].passed(), "{:?}", r[2].failures);
    assert_eq!(
        r[3].failures,
        vec!["expected limits a, rule 'read' charges none"]
    );
    let e = parse_cases(
        Path::new("t.toml"),
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://m.test/\"\nexpect = \"allow\"\nlimits = [\"a\", \"zz\"]\n",
        &p,
    )
    .err()
    .unwrap_or_default();
    assert_eq!(
        e.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        ["t.toml:5:16: cases[0].limits[1]: unknown limit \"zz\""]
    );
}

#[test]
fn a_malformed_case_file_reports_every_problem_with_line_and_column() {
    let e = errors(
        "[[cases]]\nmethod = \"GET\"\nurl = \"api.test\"\nexpect = \"maybe\"\nrule = \"nope\"\nreason = \"nope\"\n",
    );
    assert_eq!(e.len(), 4, "{e:?}");
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:4:10: cases[0].expect")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|m| m.starts_with("t.toml:5:8: cases[0].rule")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:6:10: cases[0].reason")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|m| m.starts_with("t.toml:3:7: cases[0].url")),
        "{e:?}"
    );
    let e = errors("[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"allow\"\ncolour = \"blue\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("t.toml:5:1: cases[0]: unknown key `colour`; known keys:"),
        "{e:?}"
    );
    // An unknown key hides nothing: the same case's other problems and every other case's
    // are reported too, in file order, each at its line and column, with a did-you-mean.
    let e = errors(
        "[[cases]]\nmethd = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"maybe\"\n\n\
         [[cases]]\nmethod = 7\nurl = \"https://api.test/\"\nexpect = \"allow\"\n\n\
         [[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"deny\"\nreason = \"nope\"\n",
    );
    assert_eq!(
        e,
        [
            "t.toml:1:1: cases[0]: missing key `method`",
            "t.toml:2:1: cases[0]: unknown key `methd`; did you mean `method`?",
            "t.toml:7:10: cases[1].method: expected a string, found an integer",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(
            e.iter()
                .filter(|m| m.starts_with("t.toml:15:10: cases[2].reason"))
                .cloned()
        )
        .collect::<Vec<_>>(),
        "{e:?}"
    );
    assert_eq!(e.len(), 4, "{e:?}");
    // An unknown key beside a bad `expect` in the same case: both reported.
    let e = errors(
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"maybe\"\nrul = \"x\"\n",
    );
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e[0].starts_with("t.toml:4:10: cases[0].expect"), "{e:?}");
    assert!(
        e[1].starts_with("t.toml:5:1: cases[0]: unknown key `rul`; did you mean `rule`?"),
        "{e:?}"
    );
    let e = errors("cases = \"x\"\n");
    assert!(
        e[0].starts_with("t.toml:1:9: cases: expected a list of tables, found a string; write each case as [[cases]]"),
        "{e:?}"
    );
    let e = errors("");
    assert!(e[0].contains("no [[cases]]"), "{e:?}");
}

const GUARDED: &str = r#"
[[deny]]
name        = "no-delete"
description = "Never delete."
hosts       = ["api.test"]
methods     = ["DELETE"]

[[deny]]
name    = "no-admin-action"
hosts   = ["api.test"]
methods = ["POST"]
paths   = ["/v1/actions"]
body    = { "/action" = "admin*" }

[[rules]]
name    = "versioned"
hosts   = ["api.test"]
headers = { "x-api-version" = "2024-*" }
query   = { forbidden = ["debug"] }

[[rules]]
name    = "graph"
hosts   = ["gql.test"]
paths   = ["/graphql"]
graphql = { operations = ["query"] }
"#;

fn run_guarded(text: &str) -> Vec<CaseResult> {
    let p = compile_sources_with(&[(Path::new("p.toml"), GUARDED)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let cases = parse_cases(Path::new("t.toml"), text, &p).unwrap_or_else(|e| panic!("{e:?}"));
    cases.iter().map(|c| run_case(&p, c)).collect()
}

#[test]
fn cases_carry_headers_query_and_body_to_denials_and_predicates() {
    let r = run_guarded(
        r#"
[[cases]]
method = "GET"
url = "https://api.test/v1/x"
headers = { "x-api-version" = "2024-06-01" }
expect = "allow"
rule = "versioned"

[[cases]]
method = "GET"
url = "https://api.test/v1/x"
expect = "deny"
reason = "predicate_mismatch"
rule = "versioned"

[[cases]]
method = "GET"
url = "https://api.test/v1/x?debug=1"
headers = { "X-Api-Version" = "2024-06-01" }
expect = "deny"
reason = "predicate_mismatch"

[[cases]]
method = "DELETE"
url = "https://api.test/v1/x"
headers = { "x-api-version" = "2024-06-01" }
expect = "deny"
reason = "denied_by_rule"
rule = "no-delete"

[[cases]]
method = "POST"
url = "https://api.test/v1/actions"
headers = { "x-api-version" = "2024-06-01" }
content_type = "application/json"
body = '{"action": "admin.delete"}'
expect = "deny"
reason = "denied_by_rule"
rule = "no-admin-action"

[[cases]]
method = "POST"
url = "https://api.test/v1/actions"
headers = { "x-api-version" = "2024-06-01", "content-type" = "application/x-www-form-urlencoded" }
body = 'action=read'
expect = "allow"

[[cases]]
method = "POST"
url = "https://gql.test/graphql"
content_type = "application/json"
body = '{"query": "mutation { deleteRepository(id: 1) { id } }"}'
expect = "deny"
reason = "predicate_mismatch"
rule = "graph"

[[cases]]
method = "POST"
url = "https://gql.test/graphql"
content_type = "application/json"
body = '{"query": "{ viewer { login } }"}'
expect = "allow"
rule = "graph"
"#,
    );
    for c in &r {
        assert!(c.passed(), "{}: {:?}", c.case.name, c.failures);
    }
}

#[test]
fn a_case_expecting_the_wrong_denial_fails_naming_the_one_that_refused() {
    let r = run_guarded(
        "[[cases]]\nmethod = \"DELETE\"\nurl = \"https://api.test/\"\nexpect = \"deny\"\nrule = \"no-admin-action\"\n",
    );
    assert_eq!(
        r[0].failures,
        vec!["expected rule 'no-admin-action', got rule 'no-delete'"]
    );
    let p = compile_sources_with(&[(Path::new("p.toml"), GUARDED)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let e = parse_cases(
        Path::new("t.toml"),
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test/\"\nexpect = \"deny\"\nrule = \"no-delet\"\nheaders = { \"x-a\" = \"\\u0001\" }\n",
        &p,
    )
    .err()
    .unwrap_or_default();
    let e: Vec<String> = e.iter().map(ToString::to_string).collect();
    assert!(
        e.iter().any(|m| m.contains("did you mean \"no-delete\"")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.contains("cases[0].headers.x-a: invalid header value")),
        "{e:?}"
    );
}

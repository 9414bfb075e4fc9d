//! `check`, `explain` and `test` on cleartext: a credential never travels in cleartext.

use std::path::Path;

use http::Method;

use crate::policy::{compile_sources_with, Policy, Scheme, SecretLoading, Target};
use crate::reason::Reason;

const SECRETS: &str = r#"
[secrets.k]
source = "env:LATCHKEY_SCHEMES_TEST_UNSET"

[credentials.aws]
kind = "aws_sigv4"
access_key_id = "env:LATCHKEY_SCHEMES_TEST_ID"
secret_access_key = "env:LATCHKEY_SCHEMES_TEST_KEY"
region = "us-east-1"
service = "s3"

[credentials.gh]
kind = "github_app"
app_id = "1"
installation_id = "2"
private_key = "file:/nonexistent/gh.pem"
"#;

fn compile(text: &str) -> Result<Policy, Vec<String>> {
    let text = format!("{SECRETS}{text}");
    compile_sources_with(&[(Path::new("p.toml"), text.as_str())], SecretLoading::Skip)
        .map_err(|e| e.iter().map(ToString::to_string).collect())
}

fn policy(text: &str) -> Policy {
    compile(text).unwrap_or_else(|e| panic!("{e:#?}"))
}

/// The line a snippet starts on once [`SECRETS`] is in front of it.
fn line(n: usize) -> usize {
    SECRETS.lines().count() + n
}

fn decide(p: &Policy, scheme: Scheme, host: &str, port: u16) -> (Reason, Option<String>, String) {
    let method = Method::GET;
    let d = p.decide(&Target {
        scheme,
        host,
        port,
        method: &method,
        path: "/v1/x",
        identity: None,
        narrowing: None,
        websocket: false,
        query: None,
        headers: None,
    });
    (d.reason, d.rule_name().map(str::to_string), d.message)
}

/// One rule for `api.test` on ports 8443 and 8080 that brokers the way `how` says.
fn brokering(how: &str) -> String {
    format!(
        "[[rules]]\nname = \"b\"\nhosts = [\"api.test\"]\nports = [8443, 8080, 443, 80]\n{how}\n"
    )
}

/// Every way a rule can put a secret into a request.
const WAYS: &[(&str, &str)] = &[
    (
        "a secret header",
        "[rules.inject.headers]\nauthorization = \"Bearer {{secret.k}}\"",
    ),
    (
        "a query parameter",
        "[rules.inject.query]\nkey = \"{{secret.k}}\"",
    ),
    (
        "basic auth",
        "[rules.inject.basic_auth]\nuser = \"u\"\npassword = \"{{secret.k}}\"",
    ),
    (
        "placeholders",
        "secrets = [\"k\"]\nplaceholders = [\"header\", \"body\", \"query\"]",
    ),
    ("a sigv4 credential", "credential = \"aws\""),
    ("a minted token", "credential = \"gh\""),
    (
        "a capture",
        "capture = { fields = [\"access_token\"], as = \"idp\" }",
    ),
];

#[test]
fn check_warns_at_the_key_naming_the_rule_and_what_goes_in_cleartext() {
    let text = format!(
        "{SECRETS}{}",
        brokering(WAYS[0].1).replace(
            "ports = [",
            "methods = [\"GET\"]\ndangerously_allow_cleartext = true\nports = [",
        )
    );
    let sources = [(Path::new("p.toml"), text.as_str())];
    let p = compile_sources_with(&sources, SecretLoading::Skip).expect("compiles");
    let w: Vec<_> = crate::lint::lint(&p, &sources)
        .into_iter()
        .filter(|w| w.code.contains("cleartext"))
        .collect();
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(w[0].code, "cleartext_credential");
    assert_eq!((w[0].line, w[0].col), (line(5), 31));
    assert!(
        w[0].to_string().starts_with(&format!(
            "p.toml:{}:31: warning: rule \"b\" sends secret(s) \"k\" upstream over plain http",
            line(5)
        )),
        "{}",
        w[0]
    );
    // The key where it changes nothing: a warning too.
    for extra in ["", "schemes = [\"https\"]\n"] {
        let how = if extra.is_empty() { "" } else { WAYS[0].1 };
        let text = format!(
            "{SECRETS}[[rules]]\nname = \"n\"\nhosts = [\"n.test\"]\nmethods = [\"GET\"]\n{extra}dangerously_allow_cleartext = true\n{how}\n"
        );
        let sources = [(Path::new("p.toml"), text.as_str())];
        let p = compile_sources_with(&sources, SecretLoading::Skip).expect("compiles");
        let w = crate::lint::lint(&p, &sources);
        assert!(
            w.iter().any(|w| w.code == "useless_cleartext"),
            "{extra:?}: {w:#?}"
        );
    }
}

#[test]
fn explain_says_a_cleartext_request_is_refused_and_why() {
    let preset = include_str!("../../../../policies/presets/openai.toml");
    let sources = [(Path::new("openai.toml"), preset)];
    let p = compile_sources_with(&sources, SecretLoading::Skip).expect("the preset compiles");
    let e = crate::explain::explain(&p, None, "GET", "http://api.openai.com/v1/models")
        .expect("explains");
    assert_eq!(e.decision, crate::explain::Verdict::Deny);
    assert_eq!(e.reason, "credential_needs_tls");
    assert_eq!(e.rule.as_deref(), Some("openai"));
    assert!(e.injected.is_empty() && e.secrets.is_empty(), "{e:#?}");
    assert!(
        e.message
            .contains("a credential never travels in cleartext"),
        "{}",
        e.message
    );
    // The preset's denial is listed first (checked before every rule); the rule follows.
    let rule = e.candidates.iter().find(|c| !c.denial).expect("the rule");
    assert_eq!(rule.outcome, crate::explain::Outcome::Scheme);
    assert!(
        rule.detail.contains("dangerously_allow_cleartext"),
        "{e:#?}"
    );
    // A WebSocket over cleartext under a brokering rule that allows upgrades: the same.
    let ws = preset.replacen("paths = [", "websocket = true\npaths = [", 1);
    let p = compile_sources_with(
        &[(Path::new("openai.toml"), ws.as_str())],
        SecretLoading::Skip,
    )
    .expect("compiles");
    let e = crate::explain::explain(&p, None, "GET", "ws://api.openai.com/v1/realtime")
        .expect("explains");
    assert_eq!(e.reason, "credential_needs_tls");
    let e = crate::explain::explain(&p, None, "GET", "https://api.openai.com/v1/models")
        .expect("explains");
    assert!(e.allowed() && e.injected == ["authorization"], "{e:#?}");
}

#[test]
fn a_case_file_decides_a_cleartext_url_as_the_proxy_does() {
    let p = policy(&brokering(WAYS[0].1));
    let cases = "[[cases]]\nmethod = \"GET\"\nurl = \"http://api.test:8080/v1/x\"\nexpect = \"deny\"\nrule = \"b\"\nreason = \"credential_needs_tls\"\n\n[[cases]]\nmethod = \"GET\"\nurl = \"https://api.test:8080/v1/x\"\nexpect = \"allow\"\nrule = \"b\"\n";
    let parsed = crate::cases::parse_cases(Path::new("t.toml"), cases, &p).expect("parses");
    for case in &parsed {
        let run = crate::cases::run_case(&p, case);
        assert!(run.passed(), "{:?}", run.failures);
    }
}

#[test]
fn an_https_only_rule_does_not_shadow_a_later_rule_for_plain_http() {
    let text = "[[rules]]\nname = \"tls\"\nhosts = [\"api.test\"]\nschemes = [\"https\"]\n\n[[rules]]\nname = \"plain\"\nhosts = [\"api.test\"]\n";
    let sources = [(Path::new("p.toml"), text)];
    let p = compile_sources_with(&sources, SecretLoading::Skip).expect("compiles");
    let w = crate::lint::lint(&p, &sources);
    assert!(!w.iter().any(|w| w.code == "shadowed_rule"), "{w:#?}");
    assert_eq!(
        decide(&p, Scheme::Http, "api.test", 80).1.as_deref(),
        Some("plain")
    );
}

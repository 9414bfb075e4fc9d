use http::Method;

use super::compile::{compile_one, compile_sources};
use super::*;

fn target<'a>(
    method: &'a Method,
    scheme: Scheme,
    host: &'a str,
    port: u16,
    path: &'a str,
) -> Target<'a> {
    Target {
        scheme,
        host,
        port,
        method,
        path,
        identity: None,
        narrowing: None,
        websocket: false,
        query: None,
        headers: None,
    }
}

fn decide(
    p: &Policy,
    method: &str,
    scheme: Scheme,
    host: &str,
    port: u16,
    path: &str,
) -> (Reason, Option<String>) {
    let m = Method::from_bytes(method.as_bytes()).expect("method");
    let d = p.decide(&target(&m, scheme, host, port, path));
    (d.reason, d.rule_name().map(str::to_string))
}

const BASIC: &str = r#"
[[rules]]
name = "api-read"
hosts = ["api.example.com"]
methods = ["GET", "HEAD"]
paths = ["/v1/**"]

[[rules]]
name = "api-admin"
hosts = ["api.example.com"]
methods = ["POST"]
paths = ["/v1/admin/*"]

[[rules]]
name = "wild"
hosts = ["*.cdn.example.com"]

[[rules]]
name = "plain"
hosts = ["plain.example.com"]
ports = [8080]
"#;

#[test]
fn deny_by_default_when_no_rule_names_the_host() {
    let p = compile_one(BASIC).expect("valid");
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "evil.test", 443, "/"),
        (Reason::NoRule, None)
    );
}

#[test]
fn allows_the_first_matching_rule_and_reports_the_closest_miss() {
    let p = compile_one(BASIC).expect("valid");
    assert_eq!(
        decide(
            &p,
            "GET",
            Scheme::Https,
            "api.example.com",
            443,
            "/v1/models"
        ),
        (Reason::Allowed, Some("api-read".into()))
    );
    assert_eq!(
        decide(
            &p,
            "POST",
            Scheme::Https,
            "api.example.com",
            443,
            "/v1/admin/x"
        ),
        (Reason::Allowed, Some("api-admin".into()))
    );
    // `*` does not cross `/`.
    assert_eq!(
        decide(
            &p,
            "POST",
            Scheme::Https,
            "api.example.com",
            443,
            "/v1/admin/x/y"
        )
        .0,
        Reason::PathNotAllowed
    );
    assert_eq!(
        decide(&p, "DELETE", Scheme::Https, "api.example.com", 443, "/v1/x").0,
        Reason::MethodNotAllowed
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "api.example.com", 8443, "/v1/x").0,
        Reason::PortNotAllowed
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "api.example.com", 443, "/v2/x").0,
        Reason::PathNotAllowed
    );
}

#[test]
fn default_ports_follow_the_scheme() {
    let p = compile_one(BASIC).expect("valid");
    assert_eq!(
        decide(&p, "GET", Scheme::Http, "a.cdn.example.com", 80, "/").0,
        Reason::Allowed
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "a.cdn.example.com", 443, "/").0,
        Reason::Allowed
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Http, "a.cdn.example.com", 443, "/").0,
        Reason::PortNotAllowed
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Http, "plain.example.com", 8080, "/").0,
        Reason::Allowed
    );
}

#[test]
fn wildcards_match_one_or_more_labels_but_never_the_apex() {
    let p = compile_one(BASIC).expect("valid");
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "a.cdn.example.com", 443, "/").0,
        Reason::Allowed
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "a.b.cdn.example.com", 443, "/").0,
        Reason::Allowed
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "cdn.example.com", 443, "/").0,
        Reason::NoRule
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "xcdn.example.com", 443, "/").0,
        Reason::NoRule
    );
}

#[test]
fn deny_message_names_method_url_and_the_rule_that_could_allow_it() {
    let p = compile_one(BASIC).expect("valid");
    let m = Method::POST;
    let d = p.decide(&target(&m, Scheme::Https, "api.example.com", 443, "/v1/x"));
    assert_eq!(d.reason, Reason::PathNotAllowed);
    assert!(
        d.message
            .starts_with("no rule allows POST https://api.example.com/v1/x"),
        "{}",
        d.message
    );
    assert!(d.message.contains("api-admin"), "{}", d.message);
}

#[test]
fn connect_gate_refuses_unknown_hosts_and_ports_before_tls() {
    let p = compile_one(BASIC).expect("valid");
    assert!(matches!(
        p.decide_connect("api.example.com", 443, None),
        ConnectDecision::Intercept
    ));
    match p.decide_connect("evil.test", 443, None) {
        ConnectDecision::Deny(d) => assert_eq!(d.reason, Reason::NoRule),
        other => panic!("{other:?}"),
    }
    match p.decide_connect("api.example.com", 22, None) {
        ConnectDecision::Deny(d) => assert_eq!(d.reason, Reason::PortNotAllowed),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tunnel_rules_allow_connect_but_never_a_visible_request() {
    let p = compile_one(
        r#"
[[rules]]
name = "t"
hosts = ["git.example.com"]
tunnel = true
"#,
    )
    .expect("valid");
    assert!(
        matches!(p.decide_connect("git.example.com", 443, None), ConnectDecision::Tunnel(r) if r.name == "t")
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "git.example.com", 443, "/").0,
        Reason::MethodNotAllowed
    );
}

fn errors(text: &str) -> Vec<String> {
    match compile_one(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn unknown_keys_are_errors_with_a_location() {
    let e = errors("[[rules]]\nname = \"a\"\nhosts = [\"a.com\"]\nmethod = [\"GET\"]\n");
    assert_eq!(e.len(), 1);
    assert!(e[0].starts_with("test.toml:4:1: "), "{e:?}");
    assert!(e[0].contains("method"), "{e:?}");
}

#[test]
fn every_problem_in_a_file_is_reported() {
    let e = errors(
        r#"[[rules]]
name = "a"
hosts = []
ports = [0, 70000]
methods = ["get"]
paths = ["/v1/[a", "v1"]

[[rules]]
name = "a"
hosts = ["*", "https://x.com/", "a.com:443", "*.com", "a.*.com"]
"#,
    );
    let joined = e.join("\n");
    for needle in [
        "test.toml:3:9: rules[0].hosts: a rule needs at least one host",
        "test.toml:4:10: rules[0].ports[0]: invalid port 0",
        "rules[0].ports[1]: invalid port 70000",
        "did you mean \"GET\"?",
        "rules[0].paths[0]: invalid path glob",
        "rules[0].paths[1]: path glob \"v1\" must start with '/'",
        "would match every host; did you mean \"*.example.com\"?",
        "did you mean \"x.com\"",
        "write hosts = [\"a.com\"] and ports = [443]",
        "would match a whole top-level domain",
        "'*' is only allowed as the whole first label",
    ] {
        assert!(joined.contains(needle), "missing {needle:?} in:\n{joined}");
    }
}

#[test]
fn duplicate_rule_names_are_errors_across_files() {
    let r = compile_sources(&[
        (
            std::path::Path::new("a.toml"),
            "[[rules]]\nname = \"x\"\nhosts = [\"a.com\"]\n",
        ),
        (
            std::path::Path::new("b.toml"),
            "\n[[rules]]\nname = \"x\"\nhosts = [\"b.com\"]\n",
        ),
    ]);
    let e = r.expect_err("duplicate");
    assert_eq!(e.len(), 1);
    assert_eq!(
        e[0].to_string(),
        "b.toml:3:8: rules[0].name: duplicate rule name \"x\", first defined at a.toml:1"
    );
}

#[test]
fn tunnel_rules_cannot_restrict_what_they_cannot_see() {
    let e = errors(
        "[[rules]]\nname = \"t\"\nhosts = [\"a.com\"]\ntunnel = true\nmethods = [\"GET\"]\n",
    );
    assert!(e[0].contains("tunnel rule"), "{e:?}");
}

#[test]
fn secret_templates_are_refused_until_secrets_exist() {
    let e = errors(
        "[[rules]]\nname = \"t\"\nhosts = [\"a.com\"]\n[rules.inject.headers]\nauthorization = \"Bearer {{secret.openai}}\"\n",
    );
    assert!(e[0].contains("unknown secret \"openai\""), "{e:?}");
}

#[test]
fn hop_by_hop_and_host_headers_cannot_be_injected() {
    let e = errors("[[rules]]\nname = \"t\"\nhosts = [\"a.com\"]\n[rules.inject.headers]\nconnection = \"close\"\nhost = \"x\"\n");
    assert_eq!(e.len(), 2, "{e:?}");
}

#[test]
fn exact_hosts_take_precedence_over_wildcards() {
    let p = compile_one(
        r#"
[[rules]]
name = "wild"
hosts = ["*.example.com"]

[[rules]]
name = "exact"
hosts = ["api.example.com"]
"#,
    )
    .expect("valid");
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "api.example.com", 443, "/"),
        (Reason::Allowed, Some("exact".into()))
    );
    assert_eq!(
        decide(&p, "GET", Scheme::Https, "www.example.com", 443, "/"),
        (Reason::Allowed, Some("wild".into()))
    );
}

#[test]
fn digest_changes_with_content() {
    let a = compile_one(BASIC).expect("valid");
    let b = compile_one(&format!("{BASIC}\n# comment\n")).expect("valid");
    assert_ne!(a.digest(), b.digest());
    assert!(a.digest().starts_with("sha256:"));
}

#[test]
fn identities_restrict_rules_and_say_so() {
    let p = compile_one(
        r#"
[[rules]]
name = "a"
hosts = ["a.example.com"]

[[rules]]
name = "b"
hosts = ["b.example.com"]

[identities.ci]
sources = ["10.77.0.0/24"]
rules = ["a"]

[identities.admin]
sources = ["10.78.0.0/24"]
rules = ["*"]
"#,
    )
    .expect("valid");
    let ci = p.identity("ci");
    let m = Method::GET;
    let mut t = target(&m, Scheme::Https, "b.example.com", 443, "/");
    t.identity = ci;
    let d = p.decide(&t);
    assert_eq!(d.reason, Reason::IdentityNotAllowed);
    assert!(
        d.message.contains("identity 'ci' may not use rule 'b'"),
        "{}",
        d.message
    );
    t.host = "a.example.com";
    assert_eq!(p.decide(&t).reason, Reason::Allowed);
    t.host = "b.example.com";
    t.identity = p.identity("admin");
    assert_eq!(p.decide(&t).reason, Reason::Allowed);
    assert!(matches!(
        p.decide_connect("b.example.com", 443, ci),
        ConnectDecision::Deny(d) if d.reason == Reason::IdentityNotAllowed
    ));
}

#[test]
fn identities_need_known_rules_and_a_way_to_be_recognised() {
    let e = errors(
        "[[rules]]\nname = \"a\"\nhosts = [\"a.com\"]\n[identities.x]\nrules = [\"nope\"]\n",
    );
    let joined = e.join("\n");
    assert!(
        joined.contains("identities.x: an identity needs a token, sources, or both"),
        "{joined}"
    );
    assert!(
        joined.contains("identities.x.rules[0]: unknown rule \"nope\""),
        "{joined}"
    );
}

#[test]
fn an_upgrade_is_allowed_only_by_a_rule_with_websocket() {
    let p = compile_one(
        "[[rules]]\nname = \"plain\"\nhosts = [\"rt.example.com\"]\npaths = [\"/v1/**\"]\n\n\
         [[rules]]\nname = \"realtime\"\nhosts = [\"rt.example.com\"]\npaths = [\"/v1/realtime\"]\nwebsocket = true\n",
    )
    .expect("compiles");
    let get = Method::GET;
    let upgrade = |path| Target {
        websocket: true,
        ..target(&get, Scheme::Https, "rt.example.com", 443, path)
    };
    let d = p.decide(&upgrade("/v1/realtime"));
    assert_eq!(
        (d.reason, d.rule_name()),
        (Reason::Allowed, Some("realtime"))
    );
    let d = p.decide(&upgrade("/v1/other"));
    assert_eq!(d.reason, Reason::WebSocketNotAllowed);
    assert_eq!(d.rule_name(), Some("plain"));
    assert!(
        d.message
            .contains("rule 'plain' does not allow WebSocket upgrades"),
        "{}",
        d.message
    );
    // The same request without an upgrade is the plain rule's.
    let plain = target(&get, Scheme::Https, "rt.example.com", 443, "/v1/other");
    assert_eq!(p.decide(&plain).reason, Reason::Allowed);
}

//! Predicates and `[[deny]]`: each key's errors at `file:line:col`, denials before rules for
//! every identity, predicates as requirements (rules) and selectors (denials), the body step,
//! and property tests of the query and JSON-pointer matchers.

use http::{HeaderMap, HeaderValue, Method};
use proptest::prelude::*;

use super::compile::compile_one;
use super::predicates::{lookup, Polarity};
use super::*;

fn connect_decision_name(d: &ConnectDecision<'_>) -> String {
    match d {
        ConnectDecision::Tunnel(r) => format!("tunnel:{}", r.name),
        ConnectDecision::Intercept => "intercept".to_string(),
        ConnectDecision::Deny(d) => format!("deny:{}", d.rule_name().unwrap_or("none")),
    }
}

fn errors(text: &str) -> Vec<String> {
    match compile_one(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

fn policy(text: &str) -> Policy {
    compile_one(text).unwrap_or_else(|e| panic!("{e:?}"))
}

/// A request to decide: method, URL path, query and headers.
struct Req<'a> {
    method: Method,
    host: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    headers: HeaderMap,
}

fn req<'a>(method: &str, host: &'a str, path: &'a str, query: Option<&'a str>) -> Req<'a> {
    Req {
        method: Method::from_bytes(method.as_bytes()).expect("method"),
        host,
        path,
        query,
        headers: HeaderMap::new(),
    }
}

impl Req<'_> {
    fn header(mut self, name: &'static str, value: &[u8]) -> Self {
        let v = HeaderValue::from_bytes(value).expect("header value");
        self.headers.append(name, v);
        self
    }

    fn target(&self) -> Target<'_> {
        Target {
            scheme: Scheme::Https,
            host: self.host,
            port: 443,
            method: &self.method,
            path: self.path,
            identity: None,
            narrowing: None,
            websocket: false,
            query: self.query,
            headers: Some(&self.headers),
        }
    }
}

/// Decides the head, then the body (`ct`, `body`) when the decision waits for it.
fn decide_all(p: &Policy, r: &Req<'_>, ct: Option<&str>, body: &[u8]) -> (Reason, String, String) {
    let d = p.decide(&r.target());
    let d = p.decide_body(&d, &r.method, r.query, ct, body);
    assert!(d.body.is_none(), "decide_body settles the decision");
    (
        d.reason,
        d.rule_name().unwrap_or("none").to_string(),
        d.message,
    )
}

const GITHUB: &str = r#"
[[deny]]
name = "no-repo-delete"
description = "Agents never delete repositories."
hosts = ["api.github.com"]
methods = ["DELETE"]
paths = ["/repos/*/*"]

[[rules]]
name = "github"
hosts = ["api.github.com"]

[[rules]]
name = "search"
hosts = ["api.example.com"]
methods = ["GET"]
paths = ["/v1/search"]
query = { required = ["q"], forbidden = ["include_private"], only = ["q", "page"], values = { page = "re:^[0-9]{1,3}$" } }
headers = { "X-Api-Version" = "2024-*" }

[identities.ci]
sources = ["10.0.0.0/8"]
rules = ["github", "search"]
"#;

#[test]
fn a_denial_refuses_before_any_rule_for_every_identity_and_names_itself_and_its_description() {
    let p = policy(GITHUB);
    let r = req("DELETE", "api.github.com", "/repos/acme/app", None);
    let ci = p.identity("ci");
    for identity in [None, ci] {
        let t = Target {
            identity,
            ..r.target()
        };
        let d = p.decide(&t);
        assert_eq!(d.reason, Reason::DeniedByRule);
        assert_eq!(d.rule_name(), Some("no-repo-delete"));
        assert_eq!(
            d.message,
            "denied by rule 'no-repo-delete': Agents never delete repositories."
        );
        assert!(
            d.reason.is_policy_denial(),
            "--mode report lets it through, marked"
        );
        assert_eq!(d.reason.status(), http::StatusCode::FORBIDDEN);
    }
    let other = req("DELETE", "api.github.com", "/repos/acme/app/issues/1", None);
    assert_eq!(decide_all(&p, &other, None, b"").0, Reason::Allowed);
    let get = req("GET", "api.github.com", "/repos/acme/app", None);
    assert_eq!(decide_all(&p, &get, None, b"").0, Reason::Allowed);
}

#[test]
fn query_requirements_name_the_parameter_and_never_its_value() {
    let p = policy(GITHUB);
    let cases: &[(Option<&str>, Reason, &str)] = &[
        (Some("q=rust&page=2"), Reason::Allowed, ""),
        (Some("q=rust"), Reason::Allowed, ""),
        (Some("q="), Reason::Allowed, ""),
        (
            None,
            Reason::PredicateMismatch,
            "rule 'search' requires query parameter q",
        ),
        (
            Some("page=1"),
            Reason::PredicateMismatch,
            "requires query parameter q",
        ),
        (
            Some("q=a&include_private=true"),
            Reason::PredicateMismatch,
            "rule 'search' forbids query parameter include_private",
        ),
        // Percent-encoded and form-encoded names are read as the upstream reads them.
        (
            Some("q=a&include%5Fprivate=1"),
            Reason::PredicateMismatch,
            "forbids query parameter include_private",
        ),
        (
            Some("q=a&debug=SECRETVALUE"),
            Reason::PredicateMismatch,
            "rule 'search' allows no query parameter other than q, page (got: debug)",
        ),
        (
            Some("q=a&page=1234"),
            Reason::PredicateMismatch,
            "requires query parameter page to match re:^[0-9]{1,3}$",
        ),
        // A parameter given twice: each occurrence must match.
        (
            Some("q=a&page=1&page=x"),
            Reason::PredicateMismatch,
            "page to match",
        ),
        (Some("%71=a"), Reason::Allowed, ""),
        // `+` is a space to a form decoder: "q+" may be "q " upstream, which `only` refuses.
        (
            Some("q+=a"),
            Reason::PredicateMismatch,
            "requires query parameter q",
        ),
    ];
    for (query, reason, says) in cases {
        let r = req("GET", "api.example.com", "/v1/search", *query)
            .header("x-api-version", b"2024-06-01");
        let (got, _, message) = decide_all(&p, &r, None, b"");
        assert_eq!(got, *reason, "{query:?}: {message}");
        assert!(message.contains(says), "{query:?}: {message}");
        assert!(
            !message.contains("SECRETVALUE") && !message.contains("1234"),
            "{message}"
        );
    }
}

#[test]
fn header_predicates_ignore_name_case_and_every_value_must_match() {
    let p = policy(GITHUB);
    let base = || req("GET", "api.example.com", "/v1/search", Some("q=x"));
    assert_eq!(
        decide_all(
            &p,
            &base().header("X-API-VERSION", b"2024-01-01"),
            None,
            b""
        )
        .0,
        Reason::Allowed
    );
    let (reason, _, message) = decide_all(&p, &base(), None, b"");
    assert_eq!(reason, Reason::PredicateMismatch);
    assert!(
        message.contains("header x-api-version to match 2024-*"),
        "{message}"
    );
    let two = base()
        .header("x-api-version", b"2024-01-01")
        .header("x-api-version", b"2023-01-01");
    assert_eq!(decide_all(&p, &two, None, b"").0, Reason::PredicateMismatch);
    let odd = base().header("x-api-version", b"2024-\xff");
    assert_eq!(
        decide_all(&p, &odd, None, b"").0,
        Reason::PredicateMismatch,
        "not UTF-8: never matches"
    );
}

#[test]
fn present_and_absent_headers() {
    let p = policy(
        "[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\nheaders = { \"x-trace\" = \"!present\", \"x-debug\" = \"!absent\" }\n",
    );
    let base = || req("GET", "a.test", "/", None);
    assert_eq!(
        decide_all(&p, &base().header("x-trace", b""), None, b"").0,
        Reason::Allowed
    );
    assert_eq!(
        decide_all(&p, &base(), None, b"").0,
        Reason::PredicateMismatch
    );
    let debug = base().header("x-trace", b"1").header("x-debug", b"1");
    assert_eq!(
        decide_all(&p, &debug, None, b"").0,
        Reason::PredicateMismatch
    );
}

const BODY: &str = r#"
[[deny]]
name = "no-force"
hosts = ["api.test"]
methods = ["POST"]
body = { "/force" = "true" }

[[rules]]
name = "actions"
hosts = ["api.test"]
methods = ["POST"]
paths = ["/act"]
body = { "/action" = "read", "/target/owner" = "acme" }
"#;

#[test]
fn body_predicates_wait_for_the_body_then_decide() {
    let p = policy(BODY);
    let r = req("POST", "api.test", "/act", None);
    let head = p.decide(&r.target());
    assert_eq!(head.reason, Reason::Allowed);
    let check = head.body.as_ref().expect("waits for the body");
    assert_eq!(check.denials.len(), 1);
    assert_eq!(check.rule.map(|r| r.name.as_str()), Some("actions"));
    assert_eq!(check.max_bytes, 1 << 20);
    let json = Some("application/json");
    let form = Some("application/x-www-form-urlencoded; charset=utf-8");
    let cases: &[(Option<&str>, &[u8], Reason)] = &[
        (
            json,
            br#"{"action":"read","target":{"owner":"acme"}}"#,
            Reason::Allowed,
        ),
        (
            json,
            br#"{"action":"write","target":{"owner":"acme"}}"#,
            Reason::PredicateMismatch,
        ),
        (json, br#"{"action":"read"}"#, Reason::PredicateMismatch),
        (
            json,
            br#"{"action":"read","target":{"owner":"acme"},"force":true}"#,
            Reason::DeniedByRule,
        ),
        (
            json,
            br#"{"action":"read","target":{"owner":"acme"},"FORCE":true}"#,
            Reason::DeniedByRule,
        ),
        // Duplicate keys are ambiguous: the rule cannot tell, the denial fails closed.
        (
            json,
            br#"{"action":"read","action":"write","target":{"owner":"acme"}}"#,
            Reason::DeniedByRule,
        ),
        (
            json,
            br#"{"action":["read"],"target":{"owner":"acme"}}"#,
            Reason::PredicateMismatch,
        ),
        (form, b"action=read&force=false", Reason::PredicateMismatch),
        (form, b"action=read&force=true", Reason::DeniedByRule),
        (None, b"not json", Reason::DeniedByRule),
        (json, b"", Reason::PredicateMismatch),
    ];
    for (ct, body, want) in cases {
        let d = p.decide_body(&head, &r.method, None, *ct, body);
        assert_eq!(
            d.reason,
            *want,
            "{}: {}",
            String::from_utf8_lossy(body),
            d.message
        );
    }
    let d = p.decide_body(
        &head,
        &r.method,
        None,
        json,
        br#"{"action":"x","target":{"owner":"acme"}}"#,
    );
    assert!(
        d.message
            .contains("rule 'actions' requires body field /action to match read"),
        "{}",
        d.message
    );
    let mut big = br#"{"action":"read","target":{"owner":"acme"},"pad":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 1 << 20));
    big.extend(b"\"}");
    let d = p.decide_body(&head, &r.method, None, json, &big);
    assert_eq!(
        d.reason,
        Reason::DeniedByRule,
        "over 1 MiB: a denial applies"
    );
}

#[test]
fn an_allow_rule_with_a_body_predicate_refuses_a_body_over_the_cap() {
    let p = policy(&BODY.replace(
        "methods = [\"POST\"]\nbody = { \"/force\" = \"true\" }",
        "methods = [\"PUT\"]\nbody = { \"/force\" = \"true\" }",
    ));
    let r = req("POST", "api.test", "/act", None);
    let head = p.decide(&r.target());
    let check = head.body.as_ref().expect("waits");
    assert!(check.denials.is_empty());
    let mut big = br#"{"action":"read","target":{"owner":"acme"},"pad":""#.to_vec();
    big.extend(std::iter::repeat_n(b'a', 1 << 20));
    big.extend(b"\"}");
    let d = p.decide_body(&head, &r.method, None, Some("application/json"), &big);
    assert_eq!(d.reason, Reason::PredicateMismatch);
}

const GRAPHQL: &str = r#"
[[deny]]
name = "no-repo-delete"
description = "Agents never delete repositories."
hosts = ["g.test"]
graphql = { deny_fields = ["deleteRepository"] }

[[rules]]
name = "gql"
hosts = ["g.test"]
graphql = { operations = ["query"], max_depth = 4, persisted = ["aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"] }
"#;

fn gql(body: &str) -> (Reason, String, String) {
    let p = policy(GRAPHQL);
    let r = req("POST", "g.test", "/graphql", None);
    decide_all(&p, &r, Some("application/json"), body.as_bytes())
}

#[test]
fn graphql_predicates_allow_queries_refuse_mutations_deep_selections_and_unlisted_hashes() {
    assert_eq!(
        gql(r#"{"query":"{ viewer { login } }"}"#).0,
        Reason::Allowed
    );
    let (reason, _, message) = gql(r#"{"query":"mutation { createIssue(title: \"x\") }"}"#);
    assert_eq!(reason, Reason::PredicateMismatch, "{message}");
    assert!(
        message.contains("allows GraphQL operations query only"),
        "{message}"
    );
    // A denial selects on a field, aliased or not, and wins over the rule.
    let (reason, rule, message) =
        gql(r#"{"query":"mutation { x: deleteRepository(name: \"r\") }"}"#);
    assert_eq!(
        (reason, rule.as_str()),
        (Reason::DeniedByRule, "no-repo-delete"),
        "{message}"
    );
    let (reason, ..) = gql(r#"{"query":"{ a { b { c { d { e } } } } }"}"#);
    assert_eq!(reason, Reason::PredicateMismatch);
    // A batch: every request must pass.
    let (reason, ..) = gql(r#"[{"query":"{ a }"},{"query":"mutation { b }"}]"#);
    assert_eq!(reason, Reason::PredicateMismatch);
    // A persisted query alone: allowed only when its hash is listed.
    let listed = format!(
        r#"{{"extensions":{{"persistedQuery":{{"version":1,"sha256Hash":"{}"}}}}}}"#,
        "a".repeat(64)
    );
    assert_eq!(gql(&listed).0, Reason::Allowed);
    let unlisted = listed.replace(&"a".repeat(64), &"b".repeat(64));
    assert_eq!(gql(&unlisted).0, Reason::PredicateMismatch);
    // What cannot be read as GraphQL makes the denial apply (fail closed: it cannot be shown
    // not to select the field), never echoing the body.
    let (reason, rule, message) = gql("not json sk-live-0123456789");
    assert_eq!(
        (reason, rule.as_str()),
        (Reason::DeniedByRule, "no-repo-delete")
    );
    assert!(!message.contains("sk-live"), "{message}");
}

#[test]
fn a_host_only_denial_refuses_the_connect_and_a_request_level_one_does_not() {
    let p = policy(
        "[[deny]]\nname = \"blocked\"\nhosts = [\"*.evil.test\"]\n\n[[deny]]\nname = \"paths\"\nhosts = [\"ok.test\"]\npaths = [\"/admin/**\"]\n\n[[rules]]\nname = \"all\"\nhosts = [\"*.evil.test\", \"ok.test\"]\n\n[ask]\nunknown = true\n",
    );
    assert_eq!(
        connect_decision_name(&p.decide_connect("a.evil.test", 443, None)),
        "deny:blocked"
    );
    assert_eq!(
        connect_decision_name(&p.decide_connect("a.evil.test", 8443, None)),
        "deny:blocked"
    );
    assert_eq!(
        connect_decision_name(&p.decide_connect("ok.test", 443, None)),
        "intercept"
    );
    let d = p.decide(&req("GET", "a.evil.test", "/", None).target());
    assert_eq!(d.reason, Reason::DeniedByRule);
    assert!(p.asks(&d).is_none(), "a denial is never put to a person");
}

#[test]
fn a_tunnel_over_a_host_a_request_level_denial_names_is_an_error_naming_the_denial() {
    let e = errors(
        "[[deny]]\nname = \"no-admin\"\nhosts = [\"*.corp.test\"]\npaths = [\"/admin/**\"]\n\n[[rules]]\nname = \"git\"\nhosts = [\"git.corp.test\"]\ntunnel = true\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("test.toml:6:1: rule 'git': a tunnel rule"),
        "{e:?}"
    );
    assert!(e[0].contains("denial 'no-admin'"), "{e:?}");
    // A host-only denial refuses the CONNECT itself: no conflict.
    policy("[[deny]]\nname = \"x\"\nhosts = [\"git.corp.test\"]\n\n[[rules]]\nname = \"git\"\nhosts = [\"git.corp.test\"]\ntunnel = true\n");
}

#[test]
fn every_new_key_is_checked_at_its_line_and_column() {
    let e = errors(concat!(
        "[[deny]]\n",
        "name = \"d\"\n",
        "hosts = [\"a.test\"]\n",
        "inject = { headers = { x = \"y\" } }\n",
        "tunnel = true\n",
        "[[rules]]\n",
        "name = \"d\"\n",
        "hosts = [\"a.test\"]\n",
        "query = { required = [\"a\"], forbidden = [\"a\"], values = { p = \"re:(\" }, bogus = [] }\n",
        "headers = { \"bad name\" = \"x\", h = \"!maybe\" }\n",
        "body = { \"action\" = \"x\", \"/a~2\" = \"y\", \"/b\" = \"[\" }\n",
        "graphql = { operations = [\"mutate\"], max_depth = 0, persisted = [\"abc\"] }\n",
    ));
    let want = [
        "test.toml:4:10: deny[0].inject: a denial only selects requests",
        "test.toml:5:10: deny[0].tunnel: a denial only selects requests",
        "test.toml:2:8: deny[0].name: duplicate name \"d\" (rules and denials share names), first defined at test.toml:6",
        "test.toml:9:9: rules[0].query: parameter \"a\" is both required and forbidden",
        "test.toml:9:73: rules[0].query: unknown key `bogus`",
        "test.toml:9:63: rules[0].query.values.p: invalid regex \"(\": error: unclosed group",
        "test.toml:10:13: rules[0].headers.bad name: not a valid header name",
        "test.toml:10:35: rules[0].headers.h: unknown test \"!maybe\"",
        "test.toml:11:10: rules[0].body.\"action\": a JSON pointer starts with '/'",
        "test.toml:11:26: rules[0].body.\"/a~2\": '~' in a JSON pointer",
        "test.toml:11:47: rules[0].body.\"/b\": invalid glob \"[\"",
        "test.toml:12:27: rules[0].graphql.operations[0]: unknown operation \"mutate\"",
        "test.toml:12:50: rules[0].graphql.max_depth: 0 is out of range",
        "test.toml:12:66: rules[0].graphql.persisted[0]: expected a SHA-256 hash",
    ];
    assert_eq!(e.len(), want.len(), "{e:#?}");
    for w in want {
        assert!(
            e.iter().any(|m| m.starts_with(w)),
            "missing {w:?} in {e:#?}"
        );
    }
}

#[test]
fn names_are_unique_across_rules_and_denials() {
    let e = errors("[[rules]]\nname = \"x\"\nhosts = [\"a.test\"]\n[[deny]]\nname = \"x\"\nhosts = [\"a.test\"]\n");
    assert!(
        e[0].starts_with("test.toml:5:8: deny[0].name: duplicate name \"x\""),
        "{e:?}"
    );
}

#[test]
fn a_json_pointer_reads_escapes_arrays_and_scalars() {
    let v: serde_json::Value =
        serde_json::from_str(r#"{"a/b":{"m~n":[1,{"x":null}]},"s":"t"}"#).expect("json");
    assert_eq!(lookup(&v, "/a~1b/m~0n/0"), Some(&serde_json::json!(1)));
    assert_eq!(lookup(&v, "/a~1b/m~0n/1/x"), Some(&serde_json::Value::Null));
    assert_eq!(lookup(&v, "/a~1b/m~0n/01"), None, "no leading zeros");
    assert_eq!(
        lookup(&v, "/S"),
        Some(&serde_json::json!("t")),
        "keys as a loose parser reads them"
    );
    assert_eq!(lookup(&v, "/missing/x"), None);
}

fn query_policy() -> Policy {
    policy("[[rules]]\nname = \"q\"\nhosts = [\"a.test\"]\nquery = { forbidden = [\"admin\"], values = { n = \"re:^[0-9]+$\" } }\n[[deny]]\nname = \"d\"\nhosts = [\"a.test\"]\nquery = { required = [\"drop\"] }\n")
}

proptest! {
    #[test]
    fn arbitrary_queries_and_headers_never_panic(query in ".{0,80}", value in proptest::collection::vec(any::<u8>(), 0..40)) {
        let p = query_policy();
        let mut r = req("GET", "a.test", "/", Some(&query));
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            r.headers.append("x", v);
        }
        let _ = decide_all(&p, &r, None, &value);
    }

    #[test]
    fn a_forbidden_parameter_never_matches_however_it_is_encoded(
        pre in "[a-z]{0,5}(=[a-z0-9]{0,4})?", encode in proptest::collection::vec(any::<bool>(), 5),
    ) {
        let p = query_policy();
        let name: String = "admin".chars().zip(&encode).map(|(c, e)| if *e { format!("%{:02X}", c as u8) } else { c.to_string() }).collect();
        let query = format!("{pre}&{name}=1");
        let r = req("GET", "a.test", "/", Some(&query));
        let (reason, ..) = decide_all(&p, &r, None, b"");
        prop_assert_eq!(reason, Reason::PredicateMismatch);
        // A denial requiring `drop` selects it however it is spelt.
        let drop = format!("{pre}&dr%6Fp");
        let r = req("GET", "a.test", "/", Some(&drop));
        prop_assert_eq!(decide_all(&p, &r, None, b"").0, Reason::DeniedByRule);
    }

    #[test]
    fn a_value_pattern_never_allows_a_value_it_does_not_match(v in ".{0,12}") {
        let p = query_policy();
        let enc: String = v.bytes().map(|b| format!("%{b:02X}")).collect();
        let query = format!("n={enc}");
        let r = req("GET", "a.test", "/", Some(&query));
        let all_digits = !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
        prop_assert_eq!(decide_all(&p, &r, None, b"").0 == Reason::Allowed, all_digits);
    }

    #[test]
    fn arbitrary_pointers_and_bodies_never_panic(pointer in "(/[a-z~01]{0,4}){0,4}", body in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
            let _ = lookup(&v, &pointer);
        }
        let p = policy(BODY);
        let r = req("POST", "api.test", "/act", None);
        let head = p.decide(&r.target());
        for ct in [None, Some("application/json"), Some("application/x-www-form-urlencoded")] {
            let _ = p.decide_body(&head, &r.method, None, ct, &body);
        }
        let _ = Polarity::Select;
    }
}

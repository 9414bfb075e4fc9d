//! A credential never travels in cleartext: every way a rule brokers one covers https only,
//! `schemes` says what a rule covers, and `dangerously_allow_cleartext` is the only way out.

use std::path::Path;

use http::Method;

use super::*;
use crate::{compile_sources_with, ConnectDecision, Policy, SecretLoading, Target};

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
        "a path prefix",
        "[rules.inject]\npath_prefix = \"/bot{{secret.k}}\"",
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
fn every_way_of_brokering_covers_https_only_on_every_port() {
    for (what, how) in WAYS {
        let p = policy(&brokering(how));
        for port in [8080, 8443, 443, 80] {
            let (reason, rule, message) = decide(&p, Scheme::Http, "api.test", port);
            assert_eq!(reason, Reason::CredentialNeedsTls, "{what} on http:{port}");
            assert_eq!(rule.as_deref(), Some("b"), "{what}");
            assert!(
                message.contains("rule 'b' brokers") && message.contains("https://"),
                "{what}: {message}"
            );
            let (reason, rule, _) = decide(&p, Scheme::Https, "api.test", port);
            assert_eq!(
                (reason, rule.as_deref()),
                (Reason::Allowed, Some("b")),
                "{what} https:{port}"
            );
        }
        let rule = &p.rules()[0];
        assert!(rule.brokers() && rule.brokered().is_some(), "{what}");
        assert_eq!(rule.schemes, Schemes::HTTPS, "{what}");
    }
}

#[test]
fn a_credential_in_cleartext_is_refused_in_every_mode_and_never_asked_about() {
    assert!(!Reason::CredentialNeedsTls.is_policy_denial());
    assert!(!Reason::CredentialNeedsTls.is_allow());
    assert_eq!(
        Reason::CredentialNeedsTls.status(),
        http::StatusCode::FORBIDDEN
    );
    let p = policy(&format!(
        "[ask]\nunknown = true\n{}",
        brokering(WAYS[0].1).replace("ports = [", "mode = \"report\"\nports = [")
    ));
    assert!(p.rules()[0].report);
    let (reason, _, _) = decide(&p, Scheme::Http, "api.test", 80);
    assert_eq!(reason, Reason::CredentialNeedsTls);
    let d = p.decide(&Target {
        scheme: Scheme::Http,
        host: "api.test",
        port: 80,
        method: &Method::GET,
        path: "/",
        identity: None,
        narrowing: None,
        websocket: false,
        query: None,
        headers: None,
    });
    assert!(
        p.asks(&d).is_none(),
        "nobody is asked to send a credential in cleartext"
    );
}

#[test]
fn a_literal_or_identity_injected_is_not_a_credential() {
    for how in [
        "[rules.inject.headers]\nx-api-version = \"2022-11-28\"\nx-agent = \"{{identity}}\"",
        "[rules.inject.query]\nclient = \"latchkey\"",
    ] {
        let p = policy(&brokering(how));
        let rule = &p.rules()[0];
        assert!(
            rule.injects() && !rule.brokers() && rule.brokered().is_none(),
            "{how}"
        );
        assert_eq!(rule.schemes, Schemes::BOTH, "{how}");
        assert_eq!(
            decide(&p, Scheme::Http, "api.test", 8080).0,
            Reason::Allowed,
            "{how}"
        );
    }
    // A secret inside a template with other text is still a secret.
    let p = policy(&brokering(
        "[rules.inject.headers]\nx-agent = \"{{identity}}:{{secret.k}}\"",
    ));
    assert_eq!(
        decide(&p, Scheme::Http, "api.test", 8080).0,
        Reason::CredentialNeedsTls
    );
}

#[test]
fn a_rule_that_brokers_nothing_keeps_both_schemes_and_schemes_narrows_it() {
    let plain = "[[rules]]\nname = \"p\"\nhosts = [\"api.test\"]\nports = [8080]\n";
    let p = policy(plain);
    assert_eq!(p.rules()[0].schemes, Schemes::BOTH);
    assert_eq!(
        decide(&p, Scheme::Http, "api.test", 8080).0,
        Reason::Allowed
    );
    let p = policy(&plain.replace("ports", "schemes = [\"https\"]\nports"));
    let (reason, rule, message) = decide(&p, Scheme::Http, "api.test", 8080);
    assert_eq!(
        (reason, rule.as_deref()),
        (Reason::SchemeNotAllowed, Some("p"))
    );
    assert!(
        message.contains("covers only schemes \"https\""),
        "{message}"
    );
    assert_eq!(
        decide(&p, Scheme::Https, "api.test", 8080).0,
        Reason::Allowed
    );

    // A rule for plain http only allows no CONNECT: nothing inside one is plain.
    let p = policy(&plain.replace("ports", "schemes = [\"http\"]\nports"));
    assert_eq!(
        decide(&p, Scheme::Https, "api.test", 8080).0,
        Reason::SchemeNotAllowed
    );
    match p.decide_connect("api.test", 8080, None) {
        ConnectDecision::Deny(d) => assert_eq!(d.reason, Reason::SchemeNotAllowed, "{}", d.message),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        policy(plain).decide_connect("api.test", 8080, None),
        ConnectDecision::Intercept
    ));
}

#[test]
fn a_cleartext_request_goes_on_under_a_rule_that_brokers_nothing_and_carries_nothing() {
    let p = policy(&format!(
        "{}[[rules]]\nname = \"wide\"\nhosts = [\"api.test\"]\nports = [8080]\n",
        brokering(WAYS[0].1)
    ));
    let (reason, rule, _) = decide(&p, Scheme::Http, "api.test", 8080);
    assert_eq!((reason, rule.as_deref()), (Reason::Allowed, Some("wide")));
    assert!(!p.rules()[1].brokers());
}

#[test]
fn dangerously_allow_cleartext_is_the_only_way_out() {
    for (what, how) in WAYS {
        let p = policy(
            &brokering(how).replace("ports = [", "dangerously_allow_cleartext = true\nports = ["),
        );
        let rule = &p.rules()[0];
        assert!(rule.cleartext, "{what}");
        assert_eq!(rule.schemes, Schemes::BOTH, "{what}");
        assert_eq!(
            decide(&p, Scheme::Http, "api.test", 8080).0,
            Reason::Allowed,
            "{what}"
        );
    }
    // Stated schemes with the key: exactly those.
    let p = policy(&brokering(WAYS[0].1).replace(
        "ports = [",
        "schemes = [\"http\"]\ndangerously_allow_cleartext = true\nports = [",
    ));
    assert_eq!(decide(&p, Scheme::Http, "api.test", 80).0, Reason::Allowed);
    assert_eq!(
        decide(&p, Scheme::Https, "api.test", 443).0,
        Reason::SchemeNotAllowed
    );
}

#[test]
fn a_brokering_rule_listing_http_without_the_key_does_not_load_and_says_how_to_fix_it() {
    let text =
        brokering(WAYS[0].1).replace("ports = [", "schemes = [\"https\", \"http\"]\nports = [");
    let e = compile(&text).expect_err("must not load");
    assert_eq!(e.len(), 1, "{e:#?}");
    let want = format!("p.toml:{}:21: rules[0].schemes[1]: the rule brokers secret(s) \"k\", which over http would travel in cleartext to anyone on the path; remove \"http\" (a credential goes upstream only inside TLS), or set dangerously_allow_cleartext = true to accept that", line(4));
    assert_eq!(e[0], want);
    // The same for a credential, which names it.
    let text =
        brokering("credential = \"aws\"").replace("ports = [", "schemes = [\"http\"]\nports = [");
    let e = compile(&text).expect_err("must not load");
    assert!(e[0].contains("brokers credential \"aws\""), "{e:#?}");
}

#[test]
fn schemes_are_validated_where_they_are_written() {
    let rule = |schemes: &str| {
        format!("[[rules]]\nname = \"p\"\nhosts = [\"api.test\"]\nschemes = {schemes}\n")
    };
    let l = line(4);
    let cases: &[(&str, &str)] = &[
        ("[]", ":11: rules[0].schemes: an empty list allows nothing; remove the key for the default"),
        ("[\"HTTPS\"]", ":12: rules[0].schemes[0]: unknown scheme \"HTTPS\": use \"https\" or \"http\"; did you mean \"https\"?"),
        ("[\"htps\"]", ":12: rules[0].schemes[0]: unknown scheme \"htps\": use \"https\" or \"http\"; did you mean \"https\"?"),
        ("[\"wss\"]", ":12: rules[0].schemes[0]: unknown scheme \"wss\": use \"https\" or \"http\"; did you mean \"https\"?"),
        ("[\"gopher\"]", ":12: rules[0].schemes[0]: unknown scheme \"gopher\": use \"https\" or \"http\""),
        ("[\"https\", \"https\"]", ":21: rules[0].schemes[1]: \"https\" is listed twice"),
        ("\"https\"", ":11: rules[0].schemes: "),
    ];
    for (schemes, want) in cases {
        let e = compile(&rule(schemes)).expect_err(schemes);
        let want = format!("p.toml:{l}{want}");
        assert!(
            e.iter().any(|e| e.starts_with(&want)),
            "{schemes}: {e:#?}\nwant {want}"
        );
    }
    let e = compile(
        "[[rules]]\nname = \"t\"\nhosts = [\"t.test\"]\ntunnel = true\nschemes = [\"https\"]\n",
    )
    .expect_err("tunnel");
    assert!(
        e[0].contains("rules[0].schemes: a tunnel rule relays CONNECT bytes"),
        "{e:#?}"
    );
    let e = compile("[[rules]]\nname = \"t\"\nhosts = [\"t.test\"]\nschems = [\"https\"]\n")
        .expect_err("typo");
    assert!(e[0].contains("did you mean `schemes`?"), "{e:#?}");
    let e = compile(
        "[[rules]]\nname = \"t\"\nhosts = [\"t.test\"]\ndangerously_allow_cleartext = \"yes\"\n",
    )
    .expect_err("type");
    assert!(e[0].contains("dangerously_allow_cleartext"), "{e:#?}");
}

#[test]
fn a_misspelt_scheme_gets_the_likely_one() {
    assert_eq!(scheme_hint("HTTPS"), Some("https"));
    assert_eq!(scheme_hint("https://"), Some("https"));
    assert_eq!(scheme_hint("wss"), Some("https"));
    assert_eq!(scheme_hint("htp"), Some("http"));
    assert_eq!(scheme_hint("htps"), Some("https"));
    assert_eq!(scheme_hint("gopher"), None);
}

#[test]
fn schemes_list_and_allow_what_they_hold() {
    assert!(Schemes::BOTH.allows(Scheme::Http) && Schemes::BOTH.allows(Scheme::Https));
    assert!(!Schemes::HTTPS.allows(Scheme::Http) && Schemes::HTTPS.allows(Scheme::Https));
    assert_eq!(Schemes::BOTH.listed(), "\"http\", \"https\"");
    assert_eq!(Schemes::HTTPS.iter().collect::<Vec<_>>(), [Scheme::Https]);
}

proptest::proptest! {
    /// Whatever ports a brokering rule names and whatever port a request uses, a cleartext
    /// request is never allowed under it, and the same request over TLS is exactly when the
    /// port matches.
    #[test]
    fn no_port_makes_cleartext_carry_a_credential(
        ports in proptest::collection::btree_set(1u16..=65535, 1..6),
        port in proptest::prop_oneof![1u16..=65535, proptest::prop_oneof![
            proptest::strategy::Just(80u16), proptest::strategy::Just(443u16)]],
        way in 0..WAYS.len(),
    ) {
        let list: Vec<String> = ports.iter().map(u16::to_string).collect();
        let text = format!(
            "[[rules]]\nname = \"b\"\nhosts = [\"api.test\"]\nports = [{}]\n{}\n",
            list.join(", "),
            WAYS[way].1
        );
        let p = policy(&text);
        let (reason, _, _) = decide(&p, Scheme::Http, "api.test", port);
        proptest::prop_assert_ne!(reason, Reason::Allowed);
        let want = if ports.contains(&port) {
            Reason::CredentialNeedsTls
        } else {
            Reason::PortNotAllowed
        };
        proptest::prop_assert_eq!(reason, want);
        let (reason, _, _) = decide(&p, Scheme::Https, "api.test", port);
        proptest::prop_assert_eq!(reason == Reason::Allowed, ports.contains(&port));
    }
}

#[test]
fn a_path_prefix_binds_its_secret_and_shows_in_the_rule() {
    let p = policy(&brokering(
        "[rules.inject]\npath_prefix = \"/bot{{secret.k}}\"",
    ));
    let rule = p.rules().iter().find(|r| r.name == "b").expect("rule b");
    assert!(rule.injects() && rule.bound.contains("k"));
    let prefix = rule.inject_path_prefix.as_ref().expect("prefix");
    assert_eq!(prefix.to_string(), "/bot{{secret.k}}");
}

#[test]
fn a_bad_path_prefix_is_refused_at_its_file_line_and_column() {
    // The snippet's `path_prefix` is on its 6th line, the value from column 15.
    for (prefix, why) in [
        ("bot{{secret.k}}", "must start with '/'"),
        ("/bot{{secret.k}}/", "must not end with '/'"),
        (
            "/bot{{secret.k}}?x=1",
            "'?' is not allowed in a path prefix",
        ),
        ("/b%41{{secret.k}}", "'%' is not allowed in a path prefix"),
        ("/a b/{{secret.k}}", "' ' is not allowed in a path prefix"),
        ("/../{{secret.k}}", "empty, '.' or '..' segment"),
        ("//{{secret.k}}", "empty, '.' or '..' segment"),
        ("/bot{{secret.nope}}", "unknown secret \"nope\""),
        ("/bot{{secret.k", "unclosed '{{'"),
    ] {
        let errors = compile(&brokering(&format!(
            "[rules.inject]\npath_prefix = \"{prefix}\""
        )))
        .err()
        .unwrap_or_else(|| panic!("{prefix:?} compiled"));
        let want = format!("p.toml:{}:15: rules[0].inject.path_prefix: ", line(6));
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(&want) && e.contains(why)),
            "{prefix:?}: want {want}…{why}, got {errors:#?}"
        );
    }
}

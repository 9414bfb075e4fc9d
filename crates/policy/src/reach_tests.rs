//! Reach listings and digests: exact listings, equal for equal rules, changed by every widening
//! and narrowing, untouched by other identities; the default identity's labels.

use std::path::Path;

use super::*;
use crate::{compile_sources_with, SecretLoading};

fn compile(text: &str) -> Policy {
    compile_sources_with(&[(Path::new("p.toml"), text)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

fn errors(text: &str) -> Vec<String> {
    match compile_sources_with(&[(Path::new("p.toml"), text)], SecretLoading::Skip) {
        Ok(_) => Vec::new(),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    }
}

const BASE: &str = r#"
[secrets.openai]
source = "env:OPENAI_KEY"

[credentials.gh]
kind = "jwt"
alg = "HS256"
key = "env:JWT_KEY"
header = "authorization"

[[rules]]
name    = "openai"
hosts   = ["api.openai.com"]
methods = ["POST"]
paths   = ["/v1/**"]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"

[[rules]]
name  = "gh"
hosts = ["api.github.com"]
ports = [443, 8443]
credential = "gh"

[[rules]]
name   = "pypi"
hosts  = ["*.pypi.org"]
tunnel = true

[identities.ci]
sources = ["10.0.0.1/32"]
rules   = ["openai", "gh"]
labels  = { env = "ci", owner = "ana" }

[identities.twin]
sources = ["10.0.0.2/32"]
rules   = ["gh", "openai"]

[identities.lab]
sources = ["10.0.0.3/32"]
rules   = ["pypi"]
"#;

fn reach_of(policy: &Policy, identity: &str) -> Reach {
    reach(policy, identity).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_listing_names_every_fact_of_every_rule_the_identity_may_use_sorted() {
    let p = compile(BASE);
    let r = reach_of(&p, "ci");
    assert_eq!(
        r.items,
        [
            "rule gh: credential gh (jwt)",
            "rule gh: host api.github.com",
            "rule gh: method any",
            "rule gh: path any",
            "rule gh: port https:443",
            "rule gh: port https:8443",
            "rule openai: host api.openai.com",
            "rule openai: method POST",
            "rule openai: path /v1/**",
            "rule openai: placeholders in header",
            "rule openai: port https:443",
            "rule openai: secret openai bound to api.openai.com",
        ]
    );
    assert_eq!(r.reach, digest(&r.items));
    assert!(r.reach.starts_with("sha256:") && r.reach.len() == 7 + 64);
    let lab = reach_of(&p, "lab");
    assert_eq!(
        lab.items,
        [
            "rule pypi: host *.pypi.org",
            "rule pypi: port https:443",
            "rule pypi: tunnel: raw CONNECT relay, not inspected",
        ]
    );
}

#[test]
fn the_digest_is_the_sha256_of_the_lines_each_ended_by_a_newline() {
    let items = vec!["a".to_string(), "b".to_string()];
    let want = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b"a\nb\n");
    let hex: String = want.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(digest(&items), format!("sha256:{hex}"));
    assert_ne!(digest(&[]), digest(&["".to_string()]));
}

#[test]
fn identities_with_the_same_rules_have_the_same_reach_and_the_policy_carries_it() {
    let p = compile(BASE);
    let ci = reach_of(&p, "ci");
    assert_eq!(ci.reach, reach_of(&p, "twin").reach);
    assert_ne!(ci.reach, reach_of(&p, "lab").reach);
    let ceiling = p.ceiling("ci").expect("ci's ceiling");
    assert_eq!(ceiling.reach, ci.reach);
    assert_eq!(
        ceiling.labels,
        BTreeMap::from([
            ("env".to_string(), "ci".to_string()),
            ("owner".to_string(), "ana".to_string())
        ])
    );
    assert!(p.ceiling("twin").expect("twin").labels.is_empty());
    // `default` is nobody in a policy with identities.
    assert!(p.ceiling("default").is_none());
    assert!(p.ceiling("nobody").is_none());
    // The same text compiles to the same reach.
    assert_eq!(compile(BASE).ceiling("ci"), p.ceiling("ci"));
}

/// Each edit widens or narrows what `ci` can reach: its digest changes; `lab`'s does not.
#[test]
fn every_widening_and_narrowing_changes_the_digest_and_no_other_identity_s() {
    let p = compile(BASE);
    let (ci, lab) = (reach_of(&p, "ci").reach, reach_of(&p, "lab").reach);
    let edits: &[(&str, &str, &str)] = &[
        (
            "a method",
            "methods = [\"POST\"]",
            "methods = [\"POST\", \"GET\"]",
        ),
        ("all methods", "methods = [\"POST\"]\n", ""),
        (
            "a path",
            "paths   = [\"/v1/**\"]",
            "paths = [\"/v1/**\", \"/v2/**\"]",
        ),
        (
            "a narrower path",
            "paths   = [\"/v1/**\"]",
            "paths = [\"/v1/chat\"]",
        ),
        (
            "a host",
            "hosts = [\"api.github.com\"]",
            "hosts = [\"api.github.com\", \"uploads.github.com\"]",
        ),
        (
            "a wildcard host",
            "hosts = [\"api.github.com\"]",
            "hosts = [\"*.github.com\"]\ndangerously_inject_into_wildcard = true",
        ),
        ("a port", "ports = [443, 8443]", "ports = [8443]"),
        ("the default ports", "ports = [443, 8443]\n", ""),
        (
            "a rule for the identity",
            "rules   = [\"openai\", \"gh\"]",
            "rules = [\"openai\", \"gh\", \"pypi\"]",
        ),
        (
            "a secret bound",
            "credential = \"gh\"",
            "secrets = [\"openai\"]",
        ),
        (
            "placeholders",
            "[rules.inject.headers]\nauthorization",
            "placeholders = [\"header\", \"body\"]\n[rules.inject.headers]\nauthorization",
        ),
        (
            "report mode",
            "credential = \"gh\"",
            "credential = \"gh\"\nmode = \"report\"",
        ),
        (
            "a private range",
            "credential = \"gh\"",
            "credential = \"gh\"\nallow_private = [\"10.1.0.0/16\"]",
        ),
        (
            "a kept header",
            "credential = \"gh\"",
            "credential = \"gh\"\nkeep_headers = [\"cookie\"]",
        ),
        (
            "plain http allowed",
            "credential = \"gh\"",
            "credential = \"gh\"\ndangerously_allow_cleartext = true",
        ),
        (
            "https stated",
            "[rules.inject.headers]\nauthorization",
            "schemes = [\"https\", \"http\"]\ndangerously_allow_cleartext = true\n[rules.inject.headers]\nauthorization",
        ),
        (
            "an ask",
            "credential = \"gh\"",
            "credential = \"gh\"\nask = { scope = [\"once\", \"1h\"] }",
        ),
        (
            "[ask] unknown",
            "[[rules]]\nname    = \"openai\"",
            "[ask]\nunknown = true\n\n[[rules]]\nname    = \"openai\"",
        ),
    ];
    let mut seen = std::collections::HashSet::from([ci.clone()]);
    for (what, from, to) in edits {
        assert!(
            BASE.contains(from),
            "{what}: {from:?} is not in the base policy"
        );
        let edited = compile(&BASE.replacen(from, to, 1));
        let (new_ci, new_lab) = (
            reach_of(&edited, "ci").reach,
            reach_of(&edited, "lab").reach,
        );
        assert_ne!(new_ci, ci, "{what}: ci's reach did not change");
        assert!(
            seen.insert(new_ci),
            "{what}: the same reach as another edit"
        );
        if *what != "[ask] unknown" {
            assert_eq!(new_lab, lab, "{what}: lab's reach changed");
        }
    }
    // `["*"]` reaches what listing every rule reaches.
    let every = |list: &str| {
        reach_of(
            &compile(&BASE.replacen("rules   = [\"openai\", \"gh\"]", list, 1)),
            "ci",
        )
        .reach
    };
    assert_eq!(
        every("rules = [\"*\"]"),
        every("rules = [\"pypi\", \"gh\", \"openai\"]")
    );
    // What ci cannot use changes nothing for it.
    let other = compile(&BASE.replacen("tunnel = true", "tunnel = true\nports = [443, 444]", 1));
    assert_eq!(reach_of(&other, "ci").reach, ci);
    assert_ne!(reach_of(&other, "lab").reach, lab);
    // Neither do labels, nor an identity's name.
    let relabelled = compile(&BASE.replacen("owner = \"ana\"", "owner = \"bo\"", 1));
    assert_eq!(reach_of(&relabelled, "ci").reach, ci);
}

#[test]
fn without_identities_default_reaches_every_rule_with_the_default_labels() {
    let text = "[identities.default]\nlabels = { sandbox = \"run-7\" }\n\n[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\n\n[[rules]]\nname = \"b\"\nhosts = [\"b.test\"]\ntunnel = true\n";
    let p = compile(text);
    assert!(p.identities().is_empty());
    let r = reach_of(&p, "default");
    assert!(r.items.contains(&"rule a: host a.test".to_string()));
    assert!(r.items.contains(&"rule b: host b.test".to_string()));
    let c = p.ceiling("default").expect("default's ceiling");
    assert_eq!(c.reach, r.reach);
    assert_eq!(c.labels["sandbox"], "run-7");
    // Without the table: no labels, the same reach.
    let bare = compile(&text.replacen(
        "[identities.default]\nlabels = { sandbox = \"run-7\" }\n",
        "",
        1,
    ));
    assert!(bare.ceiling("default").expect("default").labels.is_empty());
    assert_eq!(bare.ceiling("default").expect("default").reach, r.reach);
    assert!(matches!(
        reach(&p, "ci"),
        Err(ExplainError::NoIdentities { name }) if name == "ci"
    ));
}

#[test]
fn an_unknown_identity_is_an_error_listing_the_known_ones() {
    let p = compile(BASE);
    let e = reach(&p, "nobody").expect_err("unknown identity");
    assert_eq!(
        e.to_string(),
        "unknown identity \"nobody\"; the policy defines: ci, twin, lab"
    );
    assert!(reach(&p, "default").is_err());
}

#[test]
fn identities_default_takes_labels_only_and_only_without_other_identities() {
    let rules = "[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\n";
    let with = |table: &str| errors(&format!("{rules}{table}"));
    assert_eq!(
        with("[identities.default]\nlabels = { env = \"ci\" }\n"),
        Vec::<String>::new()
    );
    assert_eq!(
        with("[identities.default]\nlabels = { env = \"ci\" }\n[identities.ci]\nsources = [\"10.0.0.1/32\"]\nrules = [\"a\"]\n"),
        ["p.toml:4:13: identities.default: its labels would never apply: a policy with identities (ci) identifies every client as one of them; put the labels on each identity"]
    );
    assert_eq!(
        with("[identities.default]\ntoken = \"exec:true\"\n"),
        ["p.toml:4:13: identities.default: identity \"default\" is defined twice or reserved"]
    );
    assert_eq!(
        with("[identities.default]\nlabels = { Env = \"ci\" }\n"),
        ["p.toml:5:12: identities.default.labels.Env: label keys use lower-case letters, digits, '_', '.' and '-' (at most 64)"]
    );
    assert_eq!(
        with("[identities.default]\nlabels = { env = \"ci\" }\n[identities.default]\nlabels = { env = \"cd\" }\n").len(),
        1,
        "a second [identities.default] is an error (TOML says so first)"
    );
}

#[test]
fn a_brokering_rule_reaches_https_only_unless_it_allows_cleartext_and_says_so() {
    let plain = BASE.replacen(
        "credential = \"gh\"",
        "credential = \"gh\"\ndangerously_allow_cleartext = true",
        1,
    );
    let items = reach_of(&compile(&plain), "ci").items;
    for want in [
        "rule gh: port http:443",
        "rule gh: port http:8443",
        "rule gh: dangerously_allow_cleartext: credentials may go upstream over plain http",
    ] {
        assert!(items.iter().any(|i| i == want), "{want}: {items:#?}");
    }
    let base = reach_of(&compile(BASE), "ci").items;
    assert!(!base.iter().any(|i| i.contains("http:")), "{base:#?}");
}

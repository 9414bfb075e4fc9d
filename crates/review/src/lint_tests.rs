//! Tests of the policy lints: each warning, where it points, and what does not warn.

use super::*;
use crate::policy::{compile_sources_with, SecretLoading};

fn lint_text(text: &str) -> Vec<Warning> {
    let file = Path::new("p.toml");
    let sources = [(file, text)];
    let policy = compile_sources_with(&sources, SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("policy does not compile: {e:?}"));
    lint(&policy, &sources)
}

fn codes(w: &[Warning]) -> Vec<(&'static str, usize)> {
    w.iter().map(|w| (w.code, w.line)).collect()
}

#[test]
fn a_clean_policy_has_no_warnings() {
    let w = lint_text(
        "[secrets.k]\nsource = \"env:K\"\n[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\nmethods = [\"GET\"]\n[rules.inject.headers]\nx-k = \"{{secret.k}}\"\n",
    );
    assert_eq!(w, vec![]);
}

#[test]
fn a_secret_on_a_wildcard_host_and_on_every_method_warns_at_the_rule() {
    let w = lint_text(
        "[secrets.k]\nsource = \"env:K\"\n[[rules]]\nname = \"a\"\nhosts = [\"*.a.test\"]\ndangerously_inject_into_wildcard = true\n[rules.inject.headers]\nx-k = \"{{secret.k}}\"\n",
    );
    assert_eq!(
        codes(&w),
        vec![("secret_all_methods", 4), ("wildcard_secret", 6)]
    );
    assert_eq!(w[1].col, 36);
    assert!(w[1]
        .to_string()
        .starts_with("p.toml:6:36: warning: rule \"a\""));
}

#[test]
fn a_credential_on_every_method_and_an_unused_credential_warn() {
    let w = lint_text(
        "[credentials.gh]\nkind = \"github_app\"\napp_id = \"1\"\ninstallation_id = \"2\"\nprivate_key = \"file:/x.pem\"\n[credentials.spare]\nkind = \"github_app\"\napp_id = \"1\"\ninstallation_id = \"2\"\nprivate_key = \"file:/x.pem\"\n[[rules]]\nname = \"gh\"\nhosts = [\"api.github.com\"]\ncredential = \"gh\"\n",
    );
    assert_eq!(
        codes(&w),
        vec![("unused_credential", 6), ("secret_all_methods", 12)]
    );
    assert!(
        w[1].message
            .starts_with("rule \"gh\" binds credential \"gh\" and allows every method"),
        "{}",
        w[1].message
    );
}

#[test]
fn a_secret_no_rule_binds_warns_at_its_declaration() {
    let w = lint_text(
        "\n[secrets.unused]\nsource = \"env:K\"\n[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\n",
    );
    assert_eq!(codes(&w), vec![("unused_secret", 2)]);
    assert_eq!(w[0].col, 10);
}

#[test]
fn a_rule_after_an_unrestricted_rule_for_the_same_host_is_shadowed() {
    let w = lint_text(
        "[[rules]]\nname = \"all\"\nhosts = [\"a.test\"]\nports = [80, 443]\n[[rules]]\nname = \"later\"\nhosts = [\"a.test\"]\n",
    );
    assert_eq!(codes(&w), vec![("shadowed_rule", 6)]);
    assert!(w[0].message.contains("can never match"), "{}", w[0].message);
}

#[test]
fn a_rule_with_paths_comes_first_so_it_is_not_shadowed() {
    // `narrow` restricts paths, so it is tried before `all` despite the file order; `all`
    // still matches everything else.
    let w = lint_text(
        "[[rules]]\nname = \"all\"\nhosts = [\"a.test\"]\n[[rules]]\nname = \"narrow\"\nhosts = [\"a.test\"]\npaths = [\"/v1/**\"]\n",
    );
    assert_eq!(w, vec![]);
}

#[test]
fn a_rule_that_adds_a_port_or_a_method_is_not_shadowed() {
    let w = lint_text(
        "[[rules]]\nname = \"get\"\nhosts = [\"a.test\"]\nmethods = [\"GET\"]\n[[rules]]\nname = \"post\"\nhosts = [\"a.test\"]\nmethods = [\"POST\", \"GET\"]\n[[rules]]\nname = \"all\"\nhosts = [\"a.test\"]\nports = [8443]\n",
    );
    assert_eq!(w, vec![]);
}

#[test]
fn shadowing_on_one_host_of_two_names_that_host() {
    let w = lint_text(
        "[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\nmethods = [\"GET\", \"POST\"]\n[[rules]]\nname = \"b\"\nhosts = [\"a.test\", \"b.test\"]\nmethods = [\"GET\"]\n",
    );
    assert_eq!(codes(&w), vec![("shadowed_rule", 6)]);
    assert!(
        w[0].message.contains("never matches host(s) a.test"),
        "{}",
        w[0].message
    );
}

#[test]
fn an_identity_that_may_use_only_the_later_rule_still_reaches_it() {
    let w = lint_text(
        "[[rules]]\nname = \"all\"\nhosts = [\"a.test\"]\n[[rules]]\nname = \"later\"\nhosts = [\"a.test\"]\n[identities.ci]\nsources = [\"10.0.0.0/24\"]\nrules = [\"later\"]\n",
    );
    assert_eq!(w, vec![]);
}

#[test]
fn a_tokenless_identity_with_every_rule_and_a_wide_range_warns_at_the_range() {
    let w = lint_text(
        "[[rules]]\nname = \"a\"\nhosts = [\"a.test\"]\n[identities.wide]\nsources = [\"10.1.0.0/24\", \"10.0.0.0/8\"]\nrules = [\"*\"]\n[identities.narrow]\nsources = [\"10.2.0.0/16\"]\nrules = [\"*\"]\n",
    );
    assert_eq!(codes(&w), vec![("wide_identity", 5)]);
    assert_eq!(w[0].col, 27);
}

#[test]
fn a_denial_on_hosts_no_rule_reaches_warns_at_its_name() {
    let w = lint_text(
        "[[rules]]\nname = \"gh\"\nhosts = [\"api.github.com\"]\n\n[[deny]]\nname = \"typo\"\nhosts = [\"api.githb.com\"]\n\n[[deny]]\nname = \"fine\"\nhosts = [\"*.github.com\"]\nmethods = [\"DELETE\"]\n",
    );
    assert_eq!(codes(&w), vec![("unreachable_denial", 6)]);
    assert!(w[0]
        .message
        .contains("\"typo\" names hosts no rule reaches (api.githb.com)"));
    // Under [ask] unknown a request there may be asked about: the denial matters.
    let w = lint_text(
        "[ask]\nunknown = true\n[[rules]]\nname = \"gh\"\nhosts = [\"api.github.com\"]\n[[deny]]\nname = \"typo\"\nhosts = [\"api.githb.com\"]\n",
    );
    assert!(!w.iter().any(|w| w.code == "unreachable_denial"), "{w:?}");
}

#[test]
fn a_graphql_predicate_without_post_or_get_warns() {
    let w = lint_text(
        "[[rules]]\nname = \"g\"\nhosts = [\"api.test\"]\nmethods = [\"PUT\"]\ngraphql = { operations = [\"query\"] }\n\n[[rules]]\nname = \"ok\"\nhosts = [\"api.test\"]\nmethods = [\"POST\"]\ngraphql = { operations = [\"query\"] }\n\n[[deny]]\nname = \"d\"\nhosts = [\"api.test\"]\nmethods = [\"PATCH\"]\ngraphql = { deny_fields = [\"x\"] }\n",
    );
    assert_eq!(
        codes(&w),
        vec![
            ("graphql_without_post_or_get", 2),
            ("graphql_without_post_or_get", 14)
        ]
    );
    assert!(w[0].message.starts_with("rule \"g\" allows nothing"));
    assert!(w[1]
        .message
        .starts_with("denial \"d\" refuses every request"));
}

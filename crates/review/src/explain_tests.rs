//! `explain`'s unit tests: candidates, identities, odd URLs, limits, serialisation.

use super::*;
use crate::policy::{compile_sources_with, SecretLoading};
use std::path::Path;

const POLICY: &str = r#"
[secrets.k]
source = "env:LATCHKEY_EXPLAIN_TEST_UNSET"

[[rules]]
name = "read"
hosts = ["api.corp.test"]
methods = ["GET"]
paths = ["/v1/**"]
[rules.inject.headers]
authorization = "Bearer {{secret.k}}"

[[rules]]
name = "write"
hosts = ["api.corp.test"]
methods = ["POST"]

[[rules]]
name = "alt-port"
hosts = ["*.corp.test"]
ports = [8443]
"#;

fn policy(text: &str) -> Policy {
    compile_sources_with(&[(Path::new("p.toml"), text)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

fn outcomes(e: &Explanation) -> Vec<(&str, Outcome, bool)> {
    e.candidates
        .iter()
        .map(|c| (c.rule.as_str(), c.outcome, c.decides))
        .collect()
}

#[test]
fn an_allowed_request_names_its_rule_secrets_and_headers_and_every_candidate() {
    let p = policy(POLICY);
    let e = explain(&p, None, "GET", "https://api.corp.test/v1/x?q=1").expect("explains");
    assert_eq!(e.decision, Verdict::Allow);
    assert_eq!(e.rule.as_deref(), Some("read"));
    assert_eq!(e.secrets, vec!["k"]);
    assert_eq!(e.injected, vec!["authorization"]);
    assert_eq!(e.url, "https://api.corp.test/v1/x");
    assert_eq!(
        outcomes(&e),
        vec![
            ("read", Outcome::Matched, true),
            ("write", Outcome::Method, false),
            ("alt-port", Outcome::Port, false),
        ]
    );
}

#[test]
fn a_denied_request_says_why_each_candidate_failed_and_binds_nothing() {
    let p = policy(POLICY);
    let e = explain(&p, None, "DELETE", "https://api.corp.test/v1/x").expect("explains");
    assert_eq!(e.decision, Verdict::Deny);
    assert_eq!(e.reason, "method_not_allowed");
    assert!(e.secrets.is_empty() && e.injected.is_empty());
    assert_eq!(e.candidates[0].detail, "allows only GET");
    let e = explain(&p, None, "GET", "https://api.corp.test/v2").expect("explains");
    assert_eq!(e.reason, "path_not_allowed", "read comes closest: {e:?}");
    assert_eq!(e.candidates[0].outcome, Outcome::Path);
}

#[test]
fn a_host_no_rule_names_has_no_candidates() {
    let p = policy(POLICY);
    let e = explain(&p, None, "GET", "http://other.example/").expect("explains");
    assert_eq!(e.reason, "no_rule");
    assert!(e.candidates.is_empty());
}

#[test]
fn identities_gate_rules_and_an_unidentified_client_is_refused() {
    let text =
        format!("{POLICY}\n[identities.ci]\nsources = [\"10.0.0.0/24\"]\nrules = [\"write\"]\n");
    let p = policy(&text);
    let e = explain(&p, Some("ci"), "GET", "https://api.corp.test/v1/x").expect("explains");
    assert_eq!(e.reason, "method_not_allowed");
    assert_eq!(e.candidates[0].outcome, Outcome::Identity);
    assert_eq!(e.identity, "ci");
    let e = explain(&p, None, "GET", "https://api.corp.test/v1/x").expect("explains");
    assert_eq!(e.reason, "proxy_auth_required");
    assert!(matches!(
        explain(&p, Some("nobody"), "GET", "https://api.corp.test/"),
        Err(ExplainError::UnknownIdentity { .. })
    ));
}

#[test]
fn bad_input_is_an_error_and_odd_urls_are_refused_like_the_proxy_does() {
    let p = policy(POLICY);
    assert!(matches!(
        explain(&p, None, "G ET", "https://api.corp.test/"),
        Err(ExplainError::InvalidMethod(_))
    ));
    assert!(matches!(
        explain(&p, None, "GET", "ftp://api.corp.test/"),
        Err(ExplainError::InvalidUrl { .. })
    ));
    assert!(matches!(
        explain(&p, Some("ci"), "GET", "https://api.corp.test/"),
        Err(ExplainError::NoIdentities { .. })
    ));
    let e = explain(&p, None, "GET", "https://u:p@api.corp.test/v1/x").expect("explains");
    assert_eq!(e.reason, "userinfo_in_url");
    let e = explain(&p, None, "GET", "https://api.corp.test/v1/../admin").expect("explains");
    assert_eq!(e.reason, "ambiguous_path");
}

#[test]
fn a_credential_is_named_with_its_kind_and_its_key_material_is_not_listed_as_secrets() {
    let text = format!(
        "{POLICY}\n[credentials.gh]\nkind = \"github_app\"\napp_id = \"1\"\ninstallation_id = \"2\"\nprivate_key = \"file:/nonexistent/gh.pem\"\n\n[[rules]]\nname = \"gh\"\nhosts = [\"api.gh.example\"]\nmethods = [\"GET\"]\ncredential = \"gh\"\n"
    );
    let p = policy(&text);
    let e = explain(&p, None, "GET", "https://api.gh.example/zen").expect("explains");
    assert_eq!(e.rule.as_deref(), Some("gh"));
    assert_eq!(e.credential.as_deref(), Some("gh"));
    assert_eq!(e.credential_kind.as_deref(), Some("github_app"));
    assert!(e.secrets.is_empty(), "{:?}", e.secrets);
}

#[test]
fn an_allowed_request_lists_the_limits_it_is_charged_to_in_order_and_a_denied_one_none() {
    let text = format!(
        "{POLICY}\n[limits.rate]\nrequests = \"10/min\"\n[limits.budget]\nper = \"global\"\nspend = \"2.5 USD/day\"\nllm_tokens = \"1M/day\"\n[[rules]]\nname = \"llm\"\nhosts = [\"llm.test\"]\nlimits = [\"rate\", \"budget\"]\n"
    );
    let p = policy(&text);
    let e = explain(&p, None, "POST", "https://llm.test/v1/chat").expect("explains");
    let names: Vec<&str> = e.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["rate", "budget"]);
    assert_eq!(e.limits[1].per, "global");
    assert_eq!(e.limits[1].measures["spend"], "2.5 USD/day");
    assert_eq!(e.limits[1].measures["llm_tokens"], "1000000/day");
    let v = serde_json::to_value(&e).expect("serialises");
    assert_eq!(v["limits"][0]["measures"]["requests"], "10/min");
    assert_eq!(v["limits"][0]["on_store_error"], "deny");
    let e = explain(&p, None, "GET", "https://llm.test:8443/").expect("explains");
    assert!(!e.allowed());
    assert!(e.limits.is_empty());
}

#[test]
fn explanations_serialise_with_stable_field_names() {
    let p = policy(POLICY);
    let e = explain(&p, None, "GET", "https://api.corp.test/v1/x").expect("explains");
    let v = serde_json::to_value(&e).expect("serialises");
    assert_eq!(v["decision"], "allow");
    assert_eq!(v["reason"], "allowed");
    assert_eq!(v["candidates"][1]["outcome"], "method");
    assert_eq!(v["policy"], p.digest());
}

const DENIALS: &str = r#"
[[deny]]
name = "no-repo-delete"
description = "Agents never delete repositories."
hosts = ["api.gh.test"]
methods = ["DELETE"]
paths = ["/repos/*/*"]

[[rules]]
name = "gh"
hosts = ["api.gh.test"]

[[rules]]
name = "search"
hosts = ["api.gh.test"]
paths = ["/search"]
query = { required = ["q"], forbidden = ["include_private"] }
"#;

#[test]
fn a_denial_is_a_candidate_and_decides_before_any_rule() {
    let p = policy(DENIALS);
    let e = explain(&p, None, "DELETE", "https://api.gh.test/repos/a/b").expect("explains");
    assert_eq!(e.reason, "denied_by_rule");
    assert_eq!(e.rule.as_deref(), Some("no-repo-delete"));
    assert_eq!(
        e.message,
        "denied by rule 'no-repo-delete': Agents never delete repositories."
    );
    assert!(e.candidates[0].denial && e.candidates[0].decides);
    let e = explain(&p, None, "GET", "https://api.gh.test/repos/a/b").expect("explains");
    assert_eq!(e.reason, "allowed");
    assert_eq!(
        (e.candidates[0].outcome, e.candidates[0].detail.as_str()),
        (Outcome::Method, "denies only DELETE")
    );
    let v = serde_json::to_value(&e).expect("serialises");
    assert_eq!(v["candidates"][0]["denial"], true);
}

#[test]
fn the_urls_query_string_reaches_the_predicates_and_the_candidate_names_it() {
    let p = policy(DENIALS);
    let e = explain(
        &p,
        None,
        "GET",
        "https://api.gh.test/search?q=x&include_private=1",
    )
    .expect("explains");
    // `search` fails its predicate; `gh` (no paths) still allows it.
    assert_eq!(e.rule.as_deref(), Some("gh"));
    let search = e
        .candidates
        .iter()
        .find(|c| c.rule == "search")
        .expect("search is a candidate");
    assert_eq!(search.outcome, Outcome::Predicate);
    assert_eq!(search.detail, "forbids query parameter include_private");
    assert_eq!(
        search.predicates,
        ["query requires q", "query forbids include_private"]
    );
    let e = explain(&p, None, "GET", "https://api.gh.test/search?q=x").expect("explains");
    assert_eq!(e.rule.as_deref(), Some("search"));
}

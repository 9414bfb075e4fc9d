//! `check`'s warnings about `[limits]` and `[prices]`.

use std::path::Path;

use crate::policy::{compile_sources_with, Policy, SecretLoading};

fn policy(text: &str) -> Policy {
    compile_sources_with(&[(Path::new("test.toml"), text)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

const RULE: &str = "[[rules]]\nname = \"r\"\nhosts = [\"api.test\"]\n";

const CREDENTIAL: &str = "[credentials.gh]\nkind = \"github_app\"\napp_id = \"1\"\ninstallation_id = \"2\"\nprivate_key = \"file:/nonexistent/gh.pem\"\n";

fn lint_codes(text: &str) -> Vec<(&'static str, usize, String)> {
    let sources = [(Path::new("test.toml"), text)];
    let p = compile_sources_with(&sources, SecretLoading::Skip).unwrap_or_else(|e| panic!("{e:?}"));
    crate::lint::lint(&p, &sources)
        .into_iter()
        .map(|w| (w.code, w.line, w.message))
        .collect()
}

#[test]
fn a_limit_nobody_is_charged_to_warns_at_its_declaration() {
    let w = lint_codes(&format!(
        "[limits.used]\nrequests = \"1/s\"\n[limits.spare]\nrequests = \"1/s\"\n{RULE}limits = [\"used\"]\n"
    ));
    assert_eq!(
        w,
        [(
            "unused_limit",
            3,
            "limit \"spare\" is declared but nothing is charged to it; remove it, or add limits = [\"spare\"] to a rule, identity or credential".to_string()
        )]
    );
}

#[test]
fn a_limit_charged_only_by_an_identity_or_a_credential_is_used() {
    let w = lint_codes(&format!(
        "[limits.a]\nrequests = \"1/s\"\n[limits.b]\nrequests = \"1/s\"\n{CREDENTIAL}limits = [\"b\"]\n[[rules]]\nname = \"gh\"\nhosts = [\"api.gh.test\"]\nmethods = [\"GET\"]\ncredential = \"gh\"\n[identities.ci]\ntoken = \"env:T\"\nrules = [\"*\"]\nlimits = [\"a\"]\n"
    ));
    assert_eq!(w, []);
}

#[test]
fn an_identity_with_a_body_budget_and_a_tunnel_rule_warns_that_the_tunnel_is_not_counted() {
    let w = lint_codes(
        "[limits.exfil]\nllm_tokens = \"10M/day\"\n[limits.rate]\nrequests = \"1/s\"\n[[rules]]\nname = \"t\"\nhosts = [\"t.test\"]\ntunnel = true\n[[rules]]\nname = \"h\"\nhosts = [\"h.test\"]\n[identities.ci]\ntoken = \"env:T\"\nrules = [\"*\"]\nlimits = [\"exfil\", \"rate\"]\n[identities.web]\ntoken = \"env:W\"\nrules = [\"h\"]\nlimits = [\"exfil\"]\n",
    );
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!((w[0].0, w[0].1), ("unmetered_tunnel", 12));
    assert!(
        w[0].2.starts_with("identity \"ci\" is charged to limit \"exfil\" (llm_tokens) but may use tunnel rule(s) \"t\""),
        "{}",
        w[0].2
    );
}

#[test]
fn a_model_priced_at_zero_warns() {
    let w = lint_codes(&format!(
        "[prices.\"Free-Model\"]\ninput = 0\noutput = 0.0\n[prices.\"cheap\"]\ninput = 0\noutput = 0.01\n{RULE}"
    ));
    assert_eq!(
        w,
        [(
            "free_model",
            1,
            "model \"free-model\" is priced at 0: spend budgets count its calls as free; give its real prices if a spend limit covers it".to_string()
        )]
    );
}

#[test]
fn a_price_written_as_a_pattern_or_prefix_warns_that_it_matches_nothing() {
    let w = lint_codes(&format!(
        "[prices.\"o3-*\"]\ninput = 20\noutput = 80\n[prices.\"gpt-5-\"]\ninput = 15\noutput = 120\n[prices.\"o3-pro\"]\ninput = 20\noutput = 80\n{RULE}"
    ));
    let codes: Vec<(&str, usize)> = w.iter().map(|x| (x.0, x.1)).collect();
    assert_eq!(
        codes,
        [("price_matches_nothing", 1), ("price_matches_nothing", 4)],
        "{w:?}"
    );
    assert!(w[0].2.contains("written as a pattern"), "{}", w[0].2);
    assert!(w[1].2.contains("written as a prefix"), "{}", w[1].2);
    let p = policy(&format!(
        "[prices.\"o3-pro\"]\ninput = 20\noutput = 80\n{RULE}"
    ));
    assert_eq!(
        p.prices().lookup("o3-pro-2025-06-10").map(|x| x.0),
        Some("o3-pro")
    );
    assert!(p.prices().lookup("o3-pro-max").is_none());
}

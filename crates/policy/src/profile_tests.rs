use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use super::*;
use crate::{compile_sources_with, Policy, SecretLoading};

const POLICY: &str = r#"
[limits.llm]
requests = "100/min"
llm_tokens = "1M/day"
concurrency = 8

[[rules]]
name = "openai"
hosts = ["api.openai.com"]
secrets = ["openai_key"]
inject.headers = { authorization = "Bearer {{secret.openai_key}}" }

[[rules]]
name = "github"
hosts = ["api.github.com", "github.com"]
secrets = ["gh_token"]
inject.headers = { authorization = "Bearer {{secret.gh_token}}" }

[[rules]]
name = "pages"
hosts = ["*.github.io"]

[[rules]]
name = "pypi"
hosts = ["pypi.org"]

[secrets.openai_key]
source = "env:LK_TEST_OPENAI"

[secrets.gh_token]
source = "env:LK_TEST_GH"

[identities.ci]
token = "env:LK_TEST_CI"
rules = ["pypi"]
labels = { team = "infra" }

[profiles.agent]
rules = ["openai", "github", "pypi", "pages"]
labels = { tier = "agents" }
require_labels = ["task"]
ttl = "2h"
limits = ["llm"]
sources = ["10.0.0.0/8"]

[profiles.builder]
inherits = "ci"
ttl = "30m"
narrow = ["hosts"]
"#;

fn policy() -> Policy {
    compile_sources_with(&[(Path::new("p.toml"), POLICY)], SecretLoading::Skip)
        .expect("valid policy")
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn narrow(p: &Policy, name: &str, asked: Asked<'_>) -> Result<Granted, TooWide> {
    let id = p.identity(name).expect("profile");
    id.profile.as_ref().expect("a profile").narrow(id, p, asked)
}

#[test]
fn a_profile_is_an_identity_no_client_can_be_recognised_as() {
    let p = policy();
    let agent = p.identity("agent").expect("profile compiled");
    assert!(agent.profile.is_some());
    assert!(!agent.has_token);
    // Inheriting takes the identity's rules and labels.
    let builder = p.identity("builder").expect("profile compiled");
    assert!(builder.rules.allows("pypi") && !builder.rules.allows("openai"));
    assert_eq!(
        builder.labels.get("team").map(String::as_str),
        Some("infra")
    );
    // A client inside the profile's sources, with no token, is not the profile.
    let ip: IpAddr = "10.1.2.3".parse().expect("ip");
    let store = crate::secrets::SecretStore::empty();
    let found = futures_executor(crate::identity::identify(p.identities(), &store, None, ip));
    assert!(found.is_err(), "a profile must never be matched by address");
}

fn futures_executor<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
}

#[test]
fn a_session_gets_the_profile_and_callers_labels_within_the_ttl() {
    let p = policy();
    let asked_labels = labels(&[("task", "t-1")]);
    let g = narrow(
        &p,
        "agent",
        Asked {
            ttl: Some(Duration::from_secs(600)),
            labels: &asked_labels,
            source: Some("10.0.3.7".parse().expect("ip")),
            narrow: &NarrowRequest::default(),
        },
    )
    .expect("within the profile");
    assert_eq!(g.ttl, Duration::from_secs(600));
    assert_eq!(g.labels, labels(&[("task", "t-1"), ("tier", "agents")]));
    assert!(g.narrowing.is_empty());
    // Without a ttl: the profile's longest.
    let g = narrow(
        &p,
        "agent",
        Asked {
            ttl: None,
            labels: &asked_labels,
            source: None,
            narrow: &NarrowRequest::default(),
        },
    )
    .expect("ok");
    assert_eq!(g.ttl, Duration::from_secs(7200));
}

#[test]
fn anything_wider_than_the_profile_is_refused_and_named() {
    let p = policy();
    let bad_labels = labels(&[("tier", "admins")]);
    let req = NarrowRequest {
        hosts: Some(vec![
            "api.openai.com".into(),
            "evil.example".into(),
            "*.com".into(),
        ]),
        secrets: Some(vec!["openai_key".into(), "aws_root".into()]),
        limits: Some(BTreeMap::from([(
            "llm".to_string(),
            BTreeMap::from([
                ("requests".to_string(), "1000/min".to_string()),
                ("llm_tokens".to_string(), "2M/day".to_string()),
            ]),
        )])),
    };
    let err = narrow(
        &p,
        "agent",
        Asked {
            ttl: Some(Duration::from_secs(3 * 3600)),
            labels: &bad_labels,
            source: Some("192.168.1.1".parse().expect("ip")),
            narrow: &req,
        },
    )
    .expect_err("too wide");
    let text = err.to_string();
    for needle in [
        "ttl 3h is longer",
        "label \"tier\" is set by profile",
        "label \"task\" is required",
        "source 192.168.1.1 is outside",
        "host \"evil.example\"",
        "host \"*.com\"",
        "secret \"aws_root\"",
        "limits.llm.requests",
        "limits.llm.llm_tokens",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from: {text}");
    }
    assert!(!text.contains("api.openai.com"), "{text}");
}

#[test]
fn narrowing_only_narrows_and_decisions_follow_it() {
    let p = policy();
    let l = labels(&[("task", "t")]);
    let req = NarrowRequest {
        hosts: Some(vec!["api.openai.com".into(), "*.docs.github.io".into()]),
        secrets: Some(vec!["openai_key".into()]),
        limits: Some(BTreeMap::from([(
            "llm".to_string(),
            BTreeMap::from([
                ("requests".to_string(), "10/min".to_string()),
                ("concurrency".to_string(), "2".to_string()),
            ]),
        )])),
    };
    let g = narrow(
        &p,
        "agent",
        Asked {
            ttl: None,
            labels: &l,
            source: None,
            narrow: &req,
        },
    )
    .expect("narrower");
    let n = &g.narrowing;
    assert_eq!(n.limits.len(), 1);
    assert_eq!(n.limits[0].per, crate::limits::Per::Session);
    assert_eq!(n.limits[0].name, "llm@session");
    assert_eq!(n.limits[0].requests.map(|r| r.count), Some(10));
    let agent = p.identity("agent").expect("profile");
    let get = http::Method::GET;
    let decide = |host: &str| {
        p.decide(&crate::Target {
            scheme: crate::Scheme::Https,
            host,
            port: 443,
            method: &get,
            path: "/",
            identity: Some(agent),
            narrowing: Some(n),
            websocket: false,
            query: None,
            headers: None,
        })
        .reason
    };
    use crate::reason::Reason;
    assert_eq!(decide("api.openai.com"), Reason::Allowed);
    // Outside the narrowed hosts, and a rule whose secret is outside the narrowed secrets.
    assert_eq!(decide("a.docs.github.io"), Reason::Allowed);
    assert_eq!(decide("pypi.org"), Reason::IdentityNotAllowed);
    assert_eq!(decide("other.github.io"), Reason::IdentityNotAllowed);
    assert_eq!(decide("api.github.com"), Reason::IdentityNotAllowed);
    // The session's reach differs from the profile's, and says why.
    let profile_reach = crate::reach::reach(&p, "agent").expect("reach");
    let session = crate::reach::session_reach(&p, agent, n);
    assert_ne!(profile_reach.reach, session.reach);
    assert!(session
        .items
        .iter()
        .any(|i| i == "session: only host api.openai.com"));
    let unnarrowed = crate::reach::session_reach(&p, agent, &Narrowing::default());
    assert_eq!(unnarrowed.reach, profile_reach.reach);
}

#[test]
fn a_profile_that_does_not_allow_narrowing_a_parameter_refuses_it() {
    let p = policy();
    let req = NarrowRequest {
        secrets: Some(vec![]),
        ..NarrowRequest::default()
    };
    let err = narrow(
        &p,
        "builder",
        Asked {
            ttl: None,
            labels: &BTreeMap::new(),
            source: None,
            narrow: &req,
        },
    )
    .expect_err("not narrowable");
    assert!(err
        .to_string()
        .contains("does not let a session narrow secrets"));
}

#[test]
fn profile_mistakes_are_named_with_file_line_and_field() {
    let bad = r#"
[[rules]]
name = "r"
hosts = ["a.test"]

[identities.ci]
token = "env:LK_TEST_X"
rules = ["r"]

[profiles.ci]
rules = ["r"]
ttl = "1h"

[profiles.p1]
rules = ["nope"]
ttl = "90d"
narrow = ["everything"]

[profiles.p2]
inherits = "cj"
ttl = "soon"

[profiles.p3]
ttl = "1h"
"#;
    let errs = compile_sources_with(&[(Path::new("bad.toml"), bad)], SecretLoading::Skip)
        .expect_err("invalid");
    let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
    let all = text.join("\n");
    for needle in [
        "bad.toml:10:",
        "profiles.ci: \"ci\" is already an identity or profile",
        "profiles.p1.rules[0]: unknown rule \"nope\"",
        "profiles.p1.ttl: between 1s and 30d",
        "profiles.p1.narrow[0]: unknown \"everything\"",
        "profiles.p2.inherits: unknown identity \"cj\"",
        "profiles.p2.ttl: \"soon\" is not a duration",
        "profiles.p3: list the rules",
    ] {
        assert!(all.contains(needle), "{needle:?} missing from:\n{all}");
    }
}

#[test]
fn a_policy_with_only_profiles_identifies_every_client() {
    let only = r#"
[[rules]]
name = "r"
hosts = ["a.test"]

[profiles.p]
rules = ["r"]
ttl = "1h"
"#;
    let p =
        compile_sources_with(&[(Path::new("p.toml"), only)], SecretLoading::Skip).expect("valid");
    // Not empty: a client without a session is refused (407), never `default` with every rule.
    assert_eq!(p.identities().len(), 1);
}

#[test]
fn host_patterns_nest_only_inward() {
    let w = |s: &str| HostPattern::Wildcard(s.to_string());
    let e = |s: &str| HostPattern::Exact(s.to_string());
    assert!(within(&e("a.github.com"), &w("github.com")));
    assert!(within(&w("api.github.com"), &w("github.com")));
    assert!(within(&w("github.com"), &w("github.com")));
    assert!(!within(&w("github.com"), &w("api.github.com")));
    assert!(!within(&w("github.com"), &e("github.com")));
    assert!(!within(&e("github.com"), &w("github.com")));
    assert!(!within(&w("xgithub.com"), &w("github.com")));
    assert!(parse_host_pattern("*.com").is_err());
    assert!(parse_host_pattern("a.*.com").is_err());
    assert_eq!(
        parse_host_pattern("API.OpenAI.com."),
        Ok(e("api.openai.com"))
    );
}

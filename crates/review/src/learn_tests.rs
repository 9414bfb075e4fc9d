use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;

use super::*;
use crate::explain::explain;
use crate::policy::{compile_sources_with, SecretLoading};

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000 + secs)
}

fn seen(identity: &str, host: &str, port: u16, method: &str, path: &str) -> Seen {
    Seen {
        identity: identity.to_string(),
        scheme: Scheme::Https,
        host: host.to_string(),
        port,
        method: method.to_string(),
        path: path.to_string(),
        at: at(0),
    }
}

fn learn(requests: &[(&str, &str)]) -> Proposal {
    let mut l = Learner::new(Caps::default());
    for (method, path) in requests {
        l.add(seen("default", "api.test", 443, method, path));
    }
    l.propose(1, &BTreeSet::new())
}

fn globs(p: &Proposal) -> Vec<(Vec<String>, Vec<String>)> {
    p.rules
        .iter()
        .map(|r| (r.methods.clone(), r.paths.clone()))
        .collect()
}

fn v(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn ids_uuids_hashes_dates_and_tokens_are_variable_and_words_stay_literal() {
    for var in [
        "17",
        "4242",
        "20260501",
        "3f2a9c1e-8b7d-4e6f-a5c4-1d2e3f4a5b6c",
        "9fceb02",
        "da39a3ee5e6b4b0d3255bfef95601890afd80709",
        "2026-05-01",
        "2026-05-01T10:00:00Z",
        "2026-05-01T10%3A00%3A00.123%2B02%3A00"
            .replace("%2B", "+")
            .as_str(),
        "AbX9kQ2mZ7pL4vN8sR1tY6wE",
    ] {
        assert!(is_variable(var), "{var} should be variable");
    }
    for lit in [
        "v1",
        "main",
        "abc",
        "deadbeef",
        "issues",
        "repos",
        "release-notes-2026-q1-final",
        "2026-05",
        "1.2.3",
        "",
    ] {
        assert!(!is_variable(lit), "{lit} should stay literal");
    }
}

#[test]
fn varying_ids_become_a_star_and_an_extension_is_kept() {
    let p = learn(&[
        ("GET", "/v1/items/17"),
        ("GET", "/v1/items/4242"),
        ("GET", "/v1/reports/2026-05-01.json"),
    ]);
    assert_eq!(
        globs(&p),
        vec![(v(&["GET"]), v(&["/v1/items/*", "/v1/reports/*.json"]))]
    );
    assert_eq!(p.rules[0].requests, 3);
}

#[test]
fn literal_paths_stay_listed_until_a_segment_takes_many_values() {
    let few = learn(&[("GET", "/v1/users"), ("GET", "/v1/orgs")]);
    assert_eq!(globs(&few)[0].1, v(&["/v1/orgs", "/v1/users"]));
    let names: Vec<String> = (0..VARY)
        .map(|i| format!("/simple/pkg-{}/", (b'a' + i as u8) as char))
        .collect();
    let reqs: Vec<(&str, &str)> = names.iter().map(|n| ("GET", n.as_str())).collect();
    assert_eq!(globs(&learn(&reqs))[0].1, v(&["/simple/*/"]));
}

#[test]
fn double_star_only_where_depth_varies_below_a_literal_prefix() {
    let files = [
        "/files/a.txt",
        "/files/b/c.txt",
        "/files/d/e/f.txt",
        "/files/g.md",
        "/files/h/i.md",
        "/files/j/k/l/m.md",
        "/files/n.rs",
        "/files/o/p.rs",
    ];
    let reqs: Vec<(&str, &str)> = files.iter().map(|f| ("GET", *f)).collect();
    assert_eq!(globs(&learn(&reqs))[0].1, v(&["/files/**"]));
    // The same number of paths at one depth: no `**`.
    let flat: Vec<String> = (0..VARY).map(|i| format!("/files/x{i}/y")).collect();
    let reqs: Vec<(&str, &str)> = flat.iter().map(|f| ("GET", f.as_str())).collect();
    assert_eq!(globs(&learn(&reqs))[0].1, v(&["/files/*/y"]));
    // Varying depth straight under the root never becomes `/**`.
    let rooted = ["/a", "/b/c", "/d/e/f", "/g", "/h/i", "/j/k/l", "/m", "/n/o"];
    let reqs: Vec<(&str, &str)> = rooted.iter().map(|f| ("GET", *f)).collect();
    let got = globs(&learn(&reqs));
    assert!(
        got.iter()
            .all(|(_, paths)| paths.iter().all(|p| !p.contains("**"))),
        "{got:?}"
    );
}

#[test]
fn glob_characters_in_a_literal_are_escaped() {
    let p = learn(&[("GET", "/a/[x]*{y}")]);
    assert_eq!(globs(&p)[0].1, v(&["/a/\\[x\\]\\*\\{y\\}"]));
    let rule = crate::policy::rule::path_glob(&p.rules[0].paths[0])
        .expect("glob")
        .compile_matcher();
    assert!(rule.is_match("/a/[x]*{y}"));
    assert!(!rule.is_match("/a/x"));
}

#[test]
fn methods_group_globs_so_a_write_is_not_paired_with_paths_it_never_touched() {
    let p = learn(&[
        ("GET", "/v1/items/1"),
        ("GET", "/v1/items/2"),
        ("POST", "/v1/items"),
        ("GET", "/v1/status"),
        ("HEAD", "/v1/status"),
    ]);
    assert_eq!(
        globs(&p),
        vec![
            (v(&["GET"]), v(&["/v1/items/*"])),
            (v(&["GET", "HEAD"]), v(&["/v1/status"])),
            (v(&["POST"]), v(&["/v1/items"])),
        ]
    );
    let names: Vec<&str> = p.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "learned-api-test",
            "learned-api-test-2",
            "learned-api-test-3"
        ]
    );
    assert_eq!(p.rules[2].writes(), ["POST"]);
    assert!(p.rules[0].writes().is_empty());
}

#[test]
fn ports_with_the_same_traffic_share_a_rule_and_others_do_not() {
    let mut l = Learner::new(Caps::default());
    l.add(seen("default", "api.test", 443, "GET", "/x"));
    l.add(seen("default", "api.test", 8443, "GET", "/x"));
    l.add(seen("default", "api.test", 9443, "DELETE", "/x"));
    let p = l.propose(1, &BTreeSet::new());
    let ports: Vec<Vec<u16>> = p.rules.iter().map(|r| r.ports.clone()).collect();
    assert_eq!(ports, vec![vec![443, 8443], vec![9443]]);
}

#[test]
fn names_avoid_taken_ones_and_carry_the_identity() {
    let mut l = Learner::new(Caps::default());
    l.add(seen("ci-agent", "api.github.com", 443, "GET", "/zen"));
    l.add(seen("default", "api.github.com", 443, "GET", "/zen"));
    let taken = BTreeSet::from(["learned-api-github-com".to_string()]);
    let names: Vec<String> = l
        .propose(1, &taken)
        .rules
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(
        names,
        [
            "learned-api-github-com-ci-agent",
            "learned-api-github-com-2"
        ]
    );
}

#[test]
fn min_count_drops_rare_globs_and_says_which() {
    let mut l = Learner::new(Caps::default());
    for id in ["1", "2", "3"] {
        l.add(seen(
            "default",
            "api.test",
            443,
            "GET",
            &format!("/v1/items/{id}"),
        ));
    }
    l.add(seen("default", "api.test", 443, "DELETE", "/v1/items/9"));
    let p = l.propose(2, &BTreeSet::new());
    assert_eq!(globs(&p), vec![(v(&["GET"]), v(&["/v1/items/*"]))]);
    assert_eq!(
        p.rare,
        vec![Rare {
            identity: "default".into(),
            host: "api.test".into(),
            port: 443,
            method: "DELETE".into(),
            glob: "/v1/items/*".into(),
            count: 1,
        }]
    );
}

#[test]
fn caps_bound_what_is_held_and_count_what_was_dropped() {
    let mut l = Learner::new(Caps {
        groups: 2,
        paths: 3,
    });
    for host in ["a.test", "b.test", "c.test"] {
        l.add(seen("default", host, 443, "GET", "/"));
    }
    for i in 0..5 {
        l.add(seen("default", "a.test", 443, "GET", &format!("/p{i}")));
    }
    // The same request again is counted, never dropped.
    l.add(seen("default", "a.test", 443, "GET", "/"));
    assert_eq!(l.dropped, 1 + 3);
    assert_eq!(l.requests(), 2 + 2 + 1);
}

#[test]
fn first_and_last_seen_and_rfc3339() {
    let mut l = Learner::new(Caps::default());
    for (secs, id) in [(50, "1"), (10, "2"), (90, "3")] {
        let mut s = seen("default", "api.test", 443, "GET", &format!("/i/{id}"));
        s.at = at(secs);
        l.add(s);
    }
    let r = &l.propose(1, &BTreeSet::new()).rules[0];
    assert_eq!((r.first, r.last, r.requests), (at(10), at(90), 3));
    let text = render_policy(&[], std::slice::from_ref(r));
    assert!(
        text.contains("first 2026-05-28T20:26:50Z, last 2026-05-28T20:28:10Z"),
        "{text}"
    );
    assert_eq!(
        rfc3339_seconds(SystemTime::UNIX_EPOCH + Duration::from_secs(1_777_630_000)).to_string(),
        "2026-05-01T10:06:40Z"
    );
    // Before 1970 (`--since 30000d`): the epoch, not a panic.
    let early = SystemTime::UNIX_EPOCH - Duration::from_secs(86_400);
    assert_eq!(rfc3339_seconds(early).to_string(), "1970-01-01T00:00:00Z");
}

/// The learned file compiles with the real compiler, every request learned is allowed under
/// its rule, and the case file reads and keeps what it says once filtered by `explain`.
fn round_trip(requests: &[Seen]) -> Result<(), TestCaseError> {
    let mut l = Learner::new(Caps::default());
    for s in requests {
        l.add(s.clone());
    }
    let p = l.propose(1, &BTreeSet::new());
    let text = render_policy(&["learned".to_string()], &p.rules);
    let path = Path::new("learned.toml");
    let policy = compile_sources_with(&[(path, text.as_str())], SecretLoading::Skip)
        .map_err(|e| TestCaseError::fail(format!("{e:?}\n{text}")))?;
    for s in requests {
        let u = crate::policy::display_url(s.scheme, &s.host, s.port, &s.path);
        let e = explain(&policy, None, &s.method, &u)
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert!(
            e.allowed(),
            "{} {u} not allowed: {}\n{text}",
            s.method,
            e.message
        );
    }
    let mut cases = Vec::new();
    let learned: BTreeSet<&str> = p.rules.iter().map(|r| r.name.as_str()).collect();
    for r in &p.rules {
        for mut c in cases_for(r) {
            let e = explain(&policy, c.identity.as_deref(), &c.method, &c.url)
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            if c.allow {
                // Learned globs may overlap: the case pins the rule that decides.
                let rule = e.rule.clone().unwrap_or_default();
                prop_assert!(e.allowed() && learned.contains(rule.as_str()), "{c:?}");
                c.rule = rule;
                cases.push(c);
            } else if !e.allowed() {
                cases.push(c);
            }
        }
    }
    let case_text = render_cases(&["cases".to_string()], &cases);
    let parsed = crate::cases::parse_cases(Path::new("c.toml"), &case_text, &policy)
        .map_err(|e| TestCaseError::fail(format!("{e:?}\n{case_text}")))?;
    prop_assert_eq!(parsed.len(), cases.len());
    for case in &parsed {
        let run = crate::cases::run_case(&policy, case);
        prop_assert!(run.passed(), "{:?}\n{}", run.failures, case_text);
    }
    Ok(())
}

#[test]
fn the_output_compiles_and_its_cases_pass() {
    let reqs: Vec<Seen> = [
        ("GET", "/v1/items/17"),
        ("GET", "/v1/items/18"),
        ("POST", "/v1/items"),
        ("GET", "/"),
        ("GET", "/a/[x]"),
        ("PROPFIND", "/dav/"),
    ]
    .iter()
    .map(|(m, p)| seen("default", "api.test", 8443, m, p))
    .collect();
    round_trip(&reqs).expect("round trip");
    let text = render_policy(&["h".into()], &learn(&[("DELETE", "/x/1")]).rules);
    assert!(
        text.contains(
            "# REVIEW: allows writes (DELETE): confirm the agent must do this\n[[rules]]"
        ),
        "{text}"
    );
    assert!(text.contains("ports   = [443]"), "{text}");
    assert!(
        !text.contains("secret") && !text.contains("inject"),
        "{text}"
    );
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,8}",
        "[0-9]{1,6}",
        "[0-9a-f]{7,12}",
        "[a-zA-Z0-9._~%!$&'()+,;=:@*\\[\\]{}-]{1,10}",
        Just(String::new()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any paths seen: every request is allowed by the learned rules, and the output compiles.
    #[test]
    fn every_request_seen_is_allowed_by_what_is_learned(
        paths in prop::collection::vec(
            (prop_oneof![Just("GET"), Just("POST"), Just("DELETE")],
             prop::collection::vec(segment(), 1..6),
             prop_oneof![Just(443u16), Just(8443u16)]),
            1..40)
    ) {
        let reqs: Vec<Seen> = paths
            .iter()
            .filter_map(|(m, segs, port)| {
                let path = format!("/{}", segs.join("/"));
                // What `latchkey learn` never hands over: paths a rule with paths refuses.
                (crate::wire::path::ambiguity(&path).is_none()
                    && crate::wire::path::check_rule_path(&path, true).is_ok())
                .then(|| seen("default", "api.test", *port, m, &path))
            })
            .collect();
        prop_assume!(!reqs.is_empty());
        round_trip(&reqs)?;
    }
}

/// Learn proposes rules only: never a `[[deny]]` and never a predicate, even over traffic a
/// denial would refuse (deleting a repository) or that carried queries a predicate could pin.
#[test]
fn learn_proposes_only_rules_never_a_denial_or_a_predicate() {
    let reqs: Vec<Seen> = [
        ("DELETE", "/repos/acme/app"),
        ("GET", "/repos/acme/app/actions/secrets"),
        ("POST", "/graphql"),
        ("GET", "/search/issues"),
    ]
    .iter()
    .map(|(m, p)| seen("default", "api.github.com", 443, m, p))
    .collect();
    let mut l = Learner::new(Caps::default());
    for s in &reqs {
        l.add(s.clone());
    }
    let p = l.propose(1, &BTreeSet::new());
    let text = render_policy(&["learned".to_string()], &p.rules);
    for key in ["[[deny]]", "query", "headers", "body", "graphql ="] {
        assert!(!text.contains(key), "{key} in:\n{text}");
    }
    let policy = compile_sources_with(&[(Path::new("l.toml"), text.as_str())], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    assert!(policy.denials().is_empty(), "{text}");
    assert!(
        policy.rules().iter().all(|r| r.predicates.is_none()),
        "{text}"
    );
    // What it learned allows the traffic, deletes included: refusing is the reviewer's call.
    round_trip(&reqs).expect("round trip");
}

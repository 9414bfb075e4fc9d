//! Reach diffs of hand-built policy pairs: each kind of widening and narrowing gives exactly its
//! change, every example is decided as claimed by `explain` on both sides, a change that is
//! not a change in reach (order, comments, names) gives none; the path witness is sound and
//! complete against globset's own matcher (proptest).

use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::policy::{compile_sources_with, SecretLoading};

pub(super) fn compile(text: &str) -> Policy {
    compile_sources_with(&[(Path::new("p.toml"), text)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

const HEAD: &str = r#"
[secrets.openai]
source = "env:OPENAI_KEY"

[credentials.gh]
kind = "jwt"
alg = "HS256"
key = "env:JWT_KEY"
header = "authorization"
"#;

pub(super) fn run(old: &str, new: &str) -> Diff {
    let (o, n) = (
        compile(&format!("{HEAD}{old}")),
        compile(&format!("{HEAD}{new}")),
    );
    let d = diff((&o, "old"), (&n, "new"));
    check_examples(&d, &o, &n);
    d
}

/// Every example is what `explain` decides on each side, and it differs the way it says.
pub(super) fn check_examples(d: &Diff, o: &Policy, n: &Policy) {
    for id in &d.identities {
        let who = (id.identity != DEFAULT_IDENTITY).then_some(id.identity.as_str());
        for c in &id.changes {
            let Some(e) = &c.example else { continue };
            let method = if e.method == "CONNECT" {
                "GET"
            } else {
                &e.method
            };
            for (p, got) in [(o, &e.old), (n, &e.new)] {
                match explain(p, who, method, &e.url) {
                    Ok(x) => {
                        assert_eq!(x.decision, got.decision, "{c:?}");
                        assert_eq!(x.reason, got.reason, "{c:?}");
                        assert_eq!(x.rule, got.rule, "{c:?}");
                    }
                    Err(_) => assert_eq!(got.reason, "proxy_auth_required", "{c:?}"),
                }
            }
            match c.direction {
                Direction::Widened => assert!(e.new.level() > e.old.level(), "{c:?}"),
                Direction::Narrowed => assert!(e.old.level() > e.new.level(), "{c:?}"),
            }
        }
    }
}

/// (identity, direction, kind, host) of every change.
pub(super) fn kinds(d: &Diff) -> Vec<(String, Direction, Kind, String)> {
    let mut v: Vec<_> = d
        .identities
        .iter()
        .flat_map(|i| {
            i.changes.iter().map(|c| {
                (
                    i.identity.clone(),
                    c.direction,
                    c.kind,
                    c.host.clone().unwrap_or_default(),
                )
            })
        })
        .collect();
    v.sort();
    v
}

fn one(d: Direction, k: Kind, host: &str) -> Vec<(String, Direction, Kind, String)> {
    vec![("default".to_string(), d, k, host.to_string())]
}

const GH: &str = r#"
[[rules]]
name    = "gh-read"
hosts   = ["api.github.com"]
methods = ["GET", "HEAD"]
paths   = ["/repos/*/issues"]
"#;

#[test]
fn the_same_reach_in_other_words_is_no_change() {
    let old =
        format!("{GH}\n[[rules]]\nname = \"pypi\"\nhosts = [\"pypi.org\"]\nmethods = [\"GET\"]\n");
    // Reordered, renamed, commented, methods reordered: the same requests get through.
    let new = "# reviewed\n[[rules]]\nname = \"pkg\"\nhosts = [\"pypi.org\"]\nmethods = [\"GET\"]\n\n[[rules]]\nname = \"github\"\nhosts = [\"api.github.com\"]\nmethods = [\"HEAD\", \"GET\"]\npaths = [\"/repos/*/issues\"]\n";
    let d = run(&old, new);
    assert!(d.identities.is_empty(), "{d:#?}");
    assert!(!d.widened && !d.narrowed);
}

#[test]
fn a_new_host_is_newly_reachable_and_a_removed_one_no_longer() {
    let d = run(
        GH,
        &format!("{GH}\n[[rules]]\nname = \"pypi\"\nhosts = [\"pypi.org\"]\n"),
    );
    assert_eq!(kinds(&d), one(Direction::Widened, Kind::Host, "pypi.org"));
    let c = &d.identities[0].changes[0];
    assert_eq!(c.rule.as_deref(), Some("pypi"));
    let text = format!("{HEAD}{GH}\n[[rules]]\nname = \"pypi\"\nhosts = [\"pypi.org\"]\n");
    let line = text
        .lines()
        .position(|l| l == "name = \"pypi\"")
        .expect("line");
    let origin = c.origin.as_deref().expect("origin");
    assert!(
        origin == format!("p.toml:{line}") || origin == format!("p.toml:{}", line + 1),
        "{origin} vs line {line}"
    );
    assert_eq!(
        c.example.as_ref().map(|e| e.url.as_str()),
        Some("https://pypi.org/")
    );
    assert!(d.widened && !d.narrowed);

    let back = run(
        &format!("{GH}\n[[rules]]\nname = \"pypi\"\nhosts = [\"pypi.org\"]\n"),
        GH,
    );
    assert_eq!(
        kinds(&back),
        one(Direction::Narrowed, Kind::Host, "pypi.org")
    );
    assert!(!back.widened && back.narrowed);
}

#[test]
fn an_exact_host_made_a_wildcard_reaches_every_other_subdomain() {
    let wild = GH.replace("[\"api.github.com\"]", "[\"*.github.com\"]");
    let d = run(GH, &wild);
    // api.github.com keeps its reach; the rest of the subdomains are new.
    assert_eq!(
        kinds(&d),
        one(Direction::Widened, Kind::Host, "*.github.com")
    );
    let e = d.identities[0].changes[0]
        .example
        .as_ref()
        .expect("example");
    assert_eq!(e.url, "https://x.github.com/repos/x/issues");
    assert_eq!(e.old.reason, "no_rule");
}

#[test]
fn a_wildcards_sample_host_is_never_an_exact_host_either_policy_names() {
    let old = "[[rules]]\nname = \"x\"\nhosts = [\"x.example.com\"]\n";
    let new = "[[rules]]\nname = \"x\"\nhosts = [\"x.example.com\", \"*.example.com\"]\n";
    let d = run(old, new);
    let e = d.identities[0].changes[0]
        .example
        .as_ref()
        .expect("example");
    assert_eq!(e.url, "https://x1.example.com/");
}

#[test]
fn a_port_added_is_reported_for_both_schemes_at_once() {
    let old = "[[rules]]\nname = \"a\"\nhosts = [\"api.test\"]\nports = [443]\n";
    let new = "[[rules]]\nname = \"a\"\nhosts = [\"api.test\"]\nports = [443, 8443]\n";
    let d = run(old, new);
    assert_eq!(kinds(&d), one(Direction::Widened, Kind::Port, "api.test"));
    let c = &d.identities[0].changes[0];
    assert_eq!(c.port, Some(8443));
    assert_eq!(
        c.ports.as_deref(),
        Some(&["https:8443".to_string(), "http:8443".to_string()][..])
    );
    assert_eq!(
        c.summary,
        "api.test (https:8443, http:8443) newly reachable"
    );
}

#[test]
fn methods_opened_are_listed_with_other_for_the_ones_no_rule_names() {
    let new = GH.replace("methods = [\"GET\", \"HEAD\"]\n", "");
    let d = run(GH, &new);
    assert_eq!(
        kinds(&d),
        one(Direction::Widened, Kind::Method, "api.github.com")
    );
    let c = &d.identities[0].changes[0];
    assert_eq!(
        c.methods.as_deref(),
        Some(&["DELETE", "OPTIONS", "PATCH", "POST", "PUT", "other"].map(String::from)[..])
    );
    assert_eq!(
        c.example.as_ref().map(|e| e.old.reason),
        Some("method_not_allowed")
    );
}

#[test]
fn a_path_glob_widened_shows_a_request_the_old_glob_denied() {
    let new = GH.replace("/repos/*/issues", "/repos/**");
    let d = run(GH, &new);
    assert_eq!(
        kinds(&d),
        vec![
            (
                "default".into(),
                Direction::Widened,
                Kind::Path,
                "api.github.com".into()
            ),
            (
                "default".into(),
                Direction::Widened,
                Kind::Path,
                "api.github.com".into()
            ),
        ]
    );
    for c in &d.identities[0].changes {
        let e = c.example.as_ref().expect("example");
        assert_eq!(e.old.reason, "path_not_allowed");
        assert!(
            e.url.starts_with("https://api.github.com/repos/"),
            "{}",
            e.url
        );
    }
    // And back: the old glob's paths are still inside `/repos/**`, so nothing narrows... but
    // the narrowing direction of the reverse diff is exactly the widening here.
    let back = run(&new, GH);
    assert!(back.narrowed && !back.widened);
    assert!(back.identities[0]
        .changes
        .iter()
        .all(|c| c.kind == Kind::Path));
}

#[test]
fn disjoint_globs_change_both_ways() {
    let new = GH.replace("/repos/*/issues", "/repos/*/pulls");
    let d = run(GH, &new);
    assert!(d.widened && d.narrowed);
    let get: Vec<&Change> = d.identities[0]
        .changes
        .iter()
        .filter(|c| c.method.as_deref() == Some("GET"))
        .collect();
    assert_eq!(get.len(), 2, "{get:#?}");
    let urls: Vec<&str> = get
        .iter()
        .map(|c| c.example.as_ref().expect("example").url.as_str())
        .collect();
    assert!(
        urls.contains(&"https://api.github.com/repos/x/pulls"),
        "{urls:?}"
    );
    assert!(
        urls.contains(&"https://api.github.com/repos/x/issues"),
        "{urls:?}"
    );
}

#[test]
fn a_secret_bound_to_a_wider_host_is_the_first_line() {
    let rule = |hosts: &str, extra: &str| {
        format!("[[rules]]\nname = \"openai\"\nhosts = {hosts}\n{extra}methods = [\"POST\"]\npaths = [\"/v1/**\"]\n[rules.inject.headers]\nauthorization = \"Bearer {{{{secret.openai}}}}\"\n")
    };
    let d = run(
        &rule("[\"api.openai.com\"]", ""),
        &rule(
            "[\"*.openai.com\"]",
            "dangerously_inject_into_wildcard = true\n",
        ),
    );
    let changes = &d.identities[0].changes;
    assert_eq!(changes[0].kind, Kind::Secret);
    assert_eq!(changes[0].direction, Direction::Widened);
    assert_eq!(changes[0].host.as_deref(), Some("*.openai.com"));
    assert_eq!(changes[0].secret.as_deref(), Some("openai"));
    assert_eq!(
        changes[0].summary,
        "secret openai newly bound to *.openai.com"
    );
    assert!(changes
        .iter()
        .any(|c| c.kind == Kind::Host && c.host.as_deref() == Some("*.openai.com")));
    // api.openai.com still gets the secret, through the wildcard: no narrowing is claimed.
    assert!(
        !changes.iter().any(|c| c.direction == Direction::Narrowed),
        "{changes:#?}"
    );
    assert!(d.widened && !d.narrowed);
}

/// [`GH`] over https only: a credential added to it changes no reach.
fn gh_https() -> String {
    GH.replace("paths   = [", "schemes = [\"https\"]\npaths   = [")
}

#[test]
fn a_secret_added_to_an_existing_rule_changes_no_reach_but_is_reported() {
    let d = run(
        &gh_https(),
        &gh_https().replace("paths   = [", "secrets = [\"openai\"]\npaths   = ["),
    );
    assert_eq!(
        kinds(&d),
        one(Direction::Widened, Kind::Secret, "api.github.com")
    );
}

#[test]
fn a_secret_added_to_a_rule_that_covered_plain_http_narrows_it_to_https() {
    let d = run(
        GH,
        &GH.replace("paths   = [", "secrets = [\"openai\"]\npaths   = ["),
    );
    let port = d.identities[0]
        .changes
        .iter()
        .find(|c| c.kind == Kind::Port)
        .unwrap_or_else(|| panic!("{d:#?}"));
    assert_eq!(port.direction, Direction::Narrowed);
    assert_eq!(port.scheme, Some("http"));
    let example = port.example.as_ref().expect("an example");
    assert_eq!(example.new.reason, "credential_needs_tls", "{example:#?}");
    assert!(d.widened && d.narrowed);
}

#[test]
fn allowing_a_credential_over_cleartext_is_a_widening() {
    let https = gh_https().replace("paths   = [", "secrets = [\"openai\"]\npaths   = [");
    let cleartext = https.replace(
        "schemes = [\"https\"]",
        "schemes = [\"https\", \"http\"]\ndangerously_allow_cleartext = true",
    );
    let d = run(&https, &cleartext);
    let found: Vec<(Direction, Kind)> = d.identities[0]
        .changes
        .iter()
        .map(|c| (c.direction, c.kind))
        .collect();
    assert!(
        found.contains(&(Direction::Widened, Kind::Cleartext))
            && found.contains(&(Direction::Widened, Kind::Port)),
        "{d:#?}"
    );
    assert!(!found.iter().any(|(d, _)| *d == Direction::Narrowed));
    let c = d.identities[0]
        .changes
        .iter()
        .find(|c| c.kind == Kind::Cleartext)
        .expect("cleartext change");
    assert_eq!(
        c.summary,
        "api.github.com: credentials newly sent over plain http (dangerously_allow_cleartext = true)"
    );
    assert_eq!(c.rule.as_deref(), Some("gh-read"));
    // A rule that already had the key and now brokers: the secret and the cleartext, widened.
    let plain = GH.replace(
        "paths   = [",
        "dangerously_allow_cleartext = true\npaths   = [",
    );
    let brokering = plain.replace("paths   = [", "secrets = [\"openai\"]\npaths   = [");
    let d = run(&plain, &brokering);
    assert_eq!(
        kinds(&d),
        one(Direction::Widened, Kind::Secret, "api.github.com")
    );
    assert!(d.widened && !d.narrowed);
}

#[test]
fn a_credential_on_a_host_is_reported_with_its_kind() {
    let d = run(
        &gh_https(),
        &gh_https().replace("paths   = [", "credential = \"gh\"\npaths   = ["),
    );
    assert_eq!(
        kinds(&d),
        one(Direction::Widened, Kind::Credential, "api.github.com")
    );
    let c = &d.identities[0].changes[0];
    assert_eq!(c.credential.as_deref(), Some("gh"));
    assert_eq!(c.credential_kind.as_deref(), Some("jwt"));
}

const IDS: &str = r#"
[identities.ci]
token = "env:CI_TOKEN"
rules = ["gh-read"]

[[rules]]
name    = "gh-read"
hosts   = ["api.github.com"]
methods = ["GET"]

[[rules]]
name  = "pypi"
hosts = ["pypi.org"]
"#;

#[test]
fn identities_added_granted_and_removed() {
    let added = format!("{IDS}\n[identities.bot]\ntoken = \"env:BOT_TOKEN\"\nrules = [\"pypi\"]\n");
    let d = run(IDS, &added);
    assert_eq!(d.identities.len(), 1);
    assert_eq!(d.identities[0].identity, "bot");
    assert_eq!(d.identities[0].status, Status::Added);
    assert_eq!(
        kinds(&d),
        vec![(
            "bot".into(),
            Direction::Widened,
            Kind::Host,
            "pypi.org".into()
        )]
    );
    assert_eq!(
        d.identities[0].changes[0]
            .example
            .as_ref()
            .map(|e| e.old.reason),
        Some("proxy_auth_required")
    );

    let granted = IDS.replace("rules = [\"gh-read\"]", "rules = [\"gh-read\", \"pypi\"]");
    let d = run(IDS, &granted);
    assert_eq!(
        kinds(&d),
        vec![(
            "ci".into(),
            Direction::Widened,
            Kind::Host,
            "pypi.org".into()
        )]
    );
    assert_eq!(
        d.identities[0].changes[0]
            .example
            .as_ref()
            .map(|e| e.old.reason),
        Some("identity_not_allowed")
    );

    let removed = run(&added, IDS);
    assert_eq!(removed.identities[0].status, Status::Removed);
    assert!(removed.narrowed && !removed.widened);
}

#[test]
fn a_tunnel_is_reported_as_raw_relay() {
    let d = run(
        GH,
        &format!("{GH}\n[[rules]]\nname = \"t\"\nhosts = [\"db.test\"]\ntunnel = true\n"),
    );
    assert_eq!(kinds(&d), one(Direction::Widened, Kind::Tunnel, "db.test"));
    let c = &d.identities[0].changes[0];
    assert_eq!(
        c.summary,
        "CONNECT db.test:443 now relayed raw (not inspected)"
    );
    assert_eq!(c.example.as_ref().map(|e| e.new.reason), Some("tunnel"));
}

#[test]
fn report_mode_private_ranges_and_kept_headers_are_facts() {
    let d = run(
        GH,
        &GH.replace(
            "paths   = [",
            "mode = \"report\"\nallow_private = [\"10.1.0.0/16\"]\nkeep_headers = [\"cookie\"]\npaths   = [",
        ),
    );
    let ks: Vec<Kind> = d.identities[0].changes.iter().map(|c| c.kind).collect();
    assert!(ks.contains(&Kind::ReportOnly), "{ks:?}");
    assert!(ks.contains(&Kind::AllowPrivate), "{ks:?}");
    assert!(ks.contains(&Kind::KeepHeader), "{ks:?}");
    assert!(d.identities[0]
        .changes
        .iter()
        .all(|c| c.direction == Direction::Widened));
}

#[test]
fn an_ask_added_narrows_and_removed_widens() {
    let asked = GH.replace("paths   = [", "ask = {}\npaths   = [");
    let d = run(GH, &asked);
    assert_eq!(
        kinds(&d),
        one(Direction::Narrowed, Kind::Ask, "api.github.com")
    );
    assert!(!d.widened);
    let d = run(&asked, GH);
    assert_eq!(
        kinds(&d),
        one(Direction::Widened, Kind::Ask, "api.github.com")
    );
    let d = run(GH, &format!("[ask]\nunknown = true\n{GH}"));
    assert!(d.widened);
    assert!(d.identities[0]
        .changes
        .iter()
        .any(|c| c.kind == Kind::AskUnknown && c.host.is_none()));
}

#[test]
fn witness_for_the_issue_example() {
    let old = Paths::Globs(["/repos/*/issues".to_string()].into());
    let new = Paths::Globs(["/repos/**".to_string()].into());
    let w = witness(&new, &old).expect("a path");
    assert!(w.starts_with("/repos/"));
    assert_eq!(witness(&old, &new), None);
    assert_eq!(witness(&Paths::All, &new).as_deref(), Some("/"));
    assert_eq!(witness(&new, &Paths::All), None);
    assert_eq!(witness(&new, &Paths::None).as_deref(), Some("/repos/"));
}

#[test]
fn instances_read_like_requests() {
    assert_eq!(instantiate("/repos/*/issues"), vec!["/repos/x/issues"]);
    assert_eq!(instantiate("/a/**"), vec!["/a/x/y", "/a/x"]);
    assert_eq!(instantiate("/v{1,2}/[abc]"), vec!["/v1/a", "/v2/a"]);
    assert_eq!(instantiate("/[!x]"), vec!["/q"]);
    assert_eq!(instantiate(r"/a\*b"), vec!["/a*b"]);
}

/// Globs from a small grammar that exercises `*`, `**`, classes and alternatives.
fn glob() -> impl Strategy<Value = String> {
    let seg = prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("*".to_string()),
        Just("**".to_string()),
        Just("a*".to_string()),
        Just("[ab]".to_string()),
        Just("{a,bb}".to_string()),
    ];
    prop::collection::vec(seg, 1..4).prop_map(|s| format!("/{}", s.join("/")))
}

/// Paths over the same letters.
fn path() -> impl Strategy<Value = String> {
    let seg = prop_oneof![
        Just("a"),
        Just("b"),
        Just("bb"),
        Just("ab"),
        Just(""),
        Just("c")
    ];
    prop::collection::vec(seg, 1..5).prop_map(|s| format!("/{}", s.join("/")))
}

fn set(globs: &[String]) -> globset::GlobSet {
    let mut b = globset::GlobSetBuilder::new();
    for g in globs {
        b.add(path_glob(g).expect("glob"));
    }
    b.build().expect("set")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Sound: a witness is matched by the new globs and not the old (globset decides);
    /// complete: when some sampled path is, a witness exists.
    #[test]
    fn the_witness_agrees_with_globset(
        old in prop::collection::vec(glob(), 0..3),
        new in prop::collection::vec(glob(), 1..3),
        probes in prop::collection::vec(path(), 0..20),
    ) {
        let (os, ns) = (set(&old), set(&new));
        let as_paths = |g: &[String]| if g.is_empty() { Paths::None } else { Paths::Globs(g.iter().cloned().collect()) };
        let w = witness(&as_paths(&new), &as_paths(&old));
        if let Some(w) = &w {
            prop_assert!(ns.is_match(w.as_str()) && !os.is_match(w.as_str()), "witness {w:?}");
        }
        for p in &probes {
            if ns.is_match(p.as_str()) && !os.is_match(p.as_str()) {
                prop_assert!(w.is_some(), "{p:?} is new but no witness");
            }
        }
    }
}

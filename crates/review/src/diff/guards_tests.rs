//! Denials and predicates in a diff: a denial added narrows and removed widens, a predicate
//! tightened narrows and loosened widens, a change that cannot be judged reads both ways; no
//! denial added to any policy ever widens (proptest).

use proptest::prelude::*;

use super::super::tests::{check_examples, compile, kinds, run};
use super::*;

const API: &str = r#"
[[rules]]
name  = "github"
hosts = ["api.github.com"]
"#;

const NO_DELETE: &str = r#"
[[deny]]
name        = "no-repo-delete"
description = "Agents never delete repositories."
hosts       = ["api.github.com"]
methods     = ["DELETE"]
paths       = ["/repos/*/*"]
"#;

fn only(d: &Diff, dir: Direction, kind: Kind) -> Vec<&Change> {
    d.identities
        .iter()
        .flat_map(|i| &i.changes)
        .filter(|c| c.direction == dir && c.kind == kind)
        .collect()
}

#[test]
fn a_denial_added_narrows_with_an_example_it_refuses() {
    let d = run(API, &format!("{API}{NO_DELETE}"));
    assert!(!d.widened && d.narrowed, "{d:#?}");
    let c = only(&d, Direction::Narrowed, Kind::Deny);
    assert_eq!(c.len(), 1, "{d:#?}");
    assert_eq!(c[0].rule.as_deref(), Some("no-repo-delete"));
    assert_eq!(c[0].host.as_deref(), Some("api.github.com"));
    assert!(
        c[0].summary
            .contains("denial 'no-repo-delete' added: refuses DELETE /repos/*/* on api.github.com"),
        "{}",
        c[0].summary
    );
    let e = c[0].example.as_ref().expect("an example");
    assert_eq!((e.old.reason, e.new.reason), ("allowed", "denied_by_rule"));
    assert_eq!(kinds(&d).len(), 1, "{d:#?}");
}

#[test]
fn a_denial_removed_widens() {
    let d = run(&format!("{API}{NO_DELETE}"), API);
    assert!(d.widened && !d.narrowed, "{d:#?}");
    let c = only(&d, Direction::Widened, Kind::Deny);
    assert!(c[0].summary.starts_with("denial 'no-repo-delete' removed"));
    let e = c[0].example.as_ref().expect("an example");
    assert_eq!((e.old.reason, e.new.reason), ("denied_by_rule", "allowed"));
}

#[test]
fn a_denial_refusing_more_narrows_and_less_widens() {
    let wider = NO_DELETE.replace(r#"["DELETE"]"#, r#"["DELETE", "PUT"]"#);
    let d = run(&format!("{API}{NO_DELETE}"), &format!("{API}{wider}"));
    assert!(!d.widened && d.narrowed, "{d:#?}");
    assert!(only(&d, Direction::Narrowed, Kind::Deny)[0]
        .summary
        .contains("refuses more: methods now include PUT"));
    let d = run(&format!("{API}{wider}"), &format!("{API}{NO_DELETE}"));
    assert!(d.widened && !d.narrowed, "{d:#?}");
    // Every path, rather than some: refuses more.
    let all_paths = NO_DELETE.replace("paths       = [\"/repos/*/*\"]\n", "");
    let d = run(&format!("{API}{NO_DELETE}"), &format!("{API}{all_paths}"));
    assert!(!d.widened && d.narrowed, "{d:#?}");
    // A glob replaced by another: cannot tell, so both (a widening is reported).
    let other = NO_DELETE.replace("/repos/*/*", "/repos/**");
    let d = run(&format!("{API}{NO_DELETE}"), &format!("{API}{other}"));
    assert!(d.widened && d.narrowed, "{d:#?}");
    assert!(only(&d, Direction::Widened, Kind::Deny)[0]
        .summary
        .contains("may refuse less"));
}

#[test]
fn a_denial_on_hosts_the_identity_never_reaches_is_not_its_change() {
    let other = NO_DELETE.replace("api.github.com", "api.gitlab.com");
    let d = run(API, &format!("{API}{other}"));
    assert!(d.identities.is_empty(), "{d:#?}");
}

const SEARCH: &str = r#"
[[rules]]
name    = "search"
hosts   = ["api.example.com"]
methods = ["GET"]
paths   = ["/v1/search"]
"#;

fn search(predicates: &str) -> String {
    format!("{SEARCH}{predicates}\n")
}

#[test]
fn a_predicate_added_or_tightened_narrows() {
    let d = run(SEARCH, &search(r#"query = { required = ["q"] }"#));
    assert!(!d.widened && d.narrowed, "{d:#?}");
    let c = only(&d, Direction::Narrowed, Kind::Predicate);
    assert_eq!(c[0].rule.as_deref(), Some("search"));
    assert_eq!(
        c[0].summary,
        "rule 'search' on api.example.com: predicates tightened: now query requires q"
    );
    let d = run(
        &search(r#"query = { required = ["q"], only = ["q", "page"] }"#),
        &search(r#"query = { required = ["q", "page"], only = ["q", "page"] }"#),
    );
    assert!(!d.widened && d.narrowed, "{d:#?}");
    let d = run(
        &search(r#"graphql = { max_depth = 10 }"#),
        &search(r#"graphql = { max_depth = 5, operations = ["query"] }"#),
    );
    assert!(!d.widened && d.narrowed, "{d:#?}");
}

#[test]
fn a_predicate_removed_or_loosened_widens() {
    let d = run(
        &search(r#"headers = { "x-api-version" = "2024-*" }"#),
        SEARCH,
    );
    assert!(d.widened && !d.narrowed, "{d:#?}");
    let c = only(&d, Direction::Widened, Kind::Predicate);
    assert!(c[0]
        .summary
        .contains("loosened: no longer header x-api-version matches 2024-*"));
    let d = run(
        &search(r#"query = { only = ["q"] }"#),
        &search(r#"query = { only = ["q", "page"] }"#),
    );
    assert!(d.widened && !d.narrowed, "{d:#?}");
    assert!(only(&d, Direction::Widened, Kind::Predicate)[0]
        .summary
        .contains("query parameters now include page"));
}

#[test]
fn a_changed_pattern_reads_both_ways() {
    let d = run(
        &search(r#"body = { "/action" = "read" }"#),
        &search(r#"body = { "/action" = "re:^(read|list)$" }"#),
    );
    assert!(d.widened && d.narrowed, "{d:#?}");
    assert!(only(&d, Direction::Widened, Kind::Predicate)[0]
        .summary
        .contains("changed (may widen)"));
}

#[test]
fn a_rule_renamed_without_its_predicates_widens() {
    let d = run(
        &search(r#"query = { forbidden = ["include_private"] }"#),
        &SEARCH.replace("\"search\"", "\"find\""),
    );
    assert!(d.widened, "{d:#?}");
    assert!(only(&d, Direction::Widened, Kind::Predicate)[0]
        .summary
        .contains("removed with its predicates (query forbids include_private)"));
}

#[test]
fn a_new_rule_with_requirements_is_still_a_widening() {
    let d = run(
        API,
        &format!("{API}{}", search(r#"query = { required = ["q"] }"#)),
    );
    assert!(d.widened, "{d:#?}");
    assert!(
        only(&d, Direction::Widened, Kind::Host)[0].host.as_deref() == Some("api.example.com"),
        "{d:#?}"
    );
}

/// A small policy: rules over a few hosts, methods and paths, maybe with predicates.
fn rule() -> impl Strategy<Value = String> {
    let host = prop::sample::select(vec!["a.example.com", "b.example.com", "*.example.com"]);
    let methods = prop::option::of(prop::sample::subsequence(
        vec!["GET", "POST", "DELETE"],
        1..3,
    ));
    let paths = prop::option::of(prop::sample::subsequence(vec!["/x/*", "/y", "/**"], 1..3));
    let pred = prop::sample::select(vec![
        "",
        "query = { required = [\"q\"] }",
        "headers = { \"x-v\" = \"1\" }",
        "body = { \"/a\" = \"b\" }",
    ]);
    (host, methods, paths, pred, any::<bool>()).prop_map(|(h, m, p, pred, ask)| {
        let mut s = format!("hosts = [\"{h}\"]\n");
        if let Some(m) = m {
            s += &format!("methods = {m:?}\n");
        }
        if let Some(p) = p {
            s += &format!("paths = {p:?}\n");
        }
        if !pred.is_empty() {
            s += pred;
            s += "\n";
        }
        if ask {
            s += "mode = \"report\"\n";
        }
        s
    })
}

fn denial() -> impl Strategy<Value = String> {
    (rule(), any::<bool>()).prop_map(|(r, all_hosts)| {
        let r = r.replace("mode = \"report\"\n", "");
        if all_hosts {
            r.replace("hosts = [\"a.example.com\"]", "hosts = [\"*.example.com\"]")
        } else {
            r
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Adding a `[[deny]]` to any policy never widens reach.
    #[test]
    fn adding_a_denial_never_widens(
        rules in prop::collection::vec(rule(), 1..4),
        denials in prop::collection::vec(denial(), 0..2),
        added in denial(),
    ) {
        let mut old = String::new();
        for (i, r) in rules.iter().enumerate() {
            old += &format!("[[rules]]\nname = \"r{i}\"\n{r}\n");
        }
        for (i, d) in denials.iter().enumerate() {
            old += &format!("[[deny]]\nname = \"d{i}\"\n{d}\n");
        }
        let new = format!("{old}[[deny]]\nname = \"added\"\n{added}\n");
        let (o, n) = (compile(&old), compile(&new));
        let d = diff((&o, "old"), (&n, "new"));
        check_examples(&d, &o, &n);
        prop_assert!(!d.widened, "{old}\n---\n{new}\n{d:#?}");
    }
}

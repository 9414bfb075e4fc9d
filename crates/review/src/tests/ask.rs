//! `explain`, `test` and `check` on the approvals keys (`ask`, `[ask]`, `[notify.NAME]`).

use std::path::Path;

use crate::policy::{compile_sources_with, Policy, SecretLoading};

fn policy(text: &str) -> Policy {
    compile_sources_with(&[(Path::new("test.toml"), text)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

const NOTIFY: &str = "[notify.ops]\nurl = \"https://hooks.example.test/latchkey\"\n";

const ASKING: &str = "[notify.ops]\nurl = \"https://hooks.example.test/l\"\n[notify.sec]\nurl = \"https://sec.example.test/l\"\n\n[ask]\nunknown = true\nhold = \"10s\"\nnotify = [\"sec\"]\n\n[[rules]]\nname = \"prod-writes\"\nhosts = [\"api.prod.test\"]\nmethods = [\"POST\"]\nask = { hold = \"30s\", scope = [\"once\", \"1h\", \"session\"], message = \"Production write\", notify = [\"ops\"] }\n\n[[rules]]\nname = \"prod-reads\"\nhosts = [\"api.prod.test\"]\nmethods = [\"GET\"]\n";

#[test]
fn explain_says_ask_with_the_terms_and_keeps_the_rules_reason() {
    use crate::explain::{explain, Verdict};
    let p = policy(ASKING);
    let e = explain(&p, None, "POST", "https://api.prod.test/v1").expect("explains");
    assert_eq!(e.decision, Verdict::Ask);
    assert_eq!(
        e.reason, "allowed",
        "the rule allows once a person approves"
    );
    assert_eq!(e.rule.as_deref(), Some("prod-writes"));
    let ask = e.ask.as_ref().expect("asks");
    assert_eq!(ask.rule, "prod-writes");
    assert_eq!(ask.hold, "30s");
    assert_eq!(ask.scopes, ["once", "1h", "session"]);
    assert_eq!(ask.notify, ["ops"]);
    assert_eq!(
        ask.summary(),
        "rule 'prod-writes'; hold 30s; scopes once, 1h, session; notifies ops"
    );
    let v = serde_json::to_value(&e).expect("serialises");
    assert_eq!(v["decision"], "ask");
    assert_eq!(v["ask"]["rule"], "prod-writes");
    assert_eq!(v["ask"]["message"], "Production write");

    let e = explain(&p, None, "GET", "https://other.test/").expect("explains");
    assert_eq!(e.decision, Verdict::Ask);
    assert_eq!(e.reason, "no_rule");
    let ask = e.ask.as_ref().expect("unknown asks");
    assert_eq!(
        ask.summary(),
        "[ask] unknown = true; hold 10s; scopes once; notifies sec"
    );

    let e = explain(&p, None, "GET", "https://api.prod.test/").expect("explains");
    assert_eq!(e.decision, Verdict::Allow);
    let v = serde_json::to_value(&e).expect("serialises");
    assert!(v.get("ask").is_none(), "absent when nobody is asked: {v}");
    // A refusal that is not a policy denial stays a refusal.
    let e = explain(&p, None, "GET", "https://api.prod.test/a/../b").expect("explains");
    assert_eq!((e.decision, e.reason), (Verdict::Deny, "ambiguous_path"));
}

#[test]
fn an_asks_notify_list_resolves_to_every_notifier_when_it_names_none() {
    let p = policy(&format!(
        "{NOTIFY}[notify.b]\nurl = \"https://b.test/\"\n[[rules]]\nname = \"w\"\nhosts = [\"a.test\"]\nask = {{}}\n"
    ));
    let e = crate::explain::explain(&p, None, "GET", "https://a.test/").expect("explains");
    assert_eq!(
        e.ask.map(|a| a.notify),
        Some(vec!["b".to_string(), "ops".to_string()])
    );
}

#[test]
fn cases_expect_ask_and_fail_an_allow_or_deny_that_asks() {
    use crate::cases::{parse_cases, run_case};
    let p = policy(ASKING);
    let run = |text: &str| {
        let cases = parse_cases(Path::new("t.toml"), text, &p).unwrap_or_else(|e| panic!("{e:?}"));
        cases
            .iter()
            .map(|c| run_case(&p, c).failures)
            .collect::<Vec<_>>()
    };
    let f = run(
        "[[cases]]\nmethod = \"POST\"\nurl = \"https://api.prod.test/\"\nexpect = \"ask\"\nask_rule = \"prod-writes\"\nrule = \"prod-writes\"\n\
         [[cases]]\nmethod = \"GET\"\nurl = \"https://new.test/\"\nexpect = \"ask\"\nask_rule = \"unknown\"\nreason = \"no_rule\"\n",
    );
    assert_eq!(f, [Vec::<String>::new(), Vec::new()]);
    let f = run(
        "[[cases]]\nmethod = \"POST\"\nurl = \"https://api.prod.test/\"\nexpect = \"allow\"\n\
         [[cases]]\nmethod = \"GET\"\nurl = \"https://new.test/\"\nexpect = \"deny\"\n\
         [[cases]]\nmethod = \"GET\"\nurl = \"https://api.prod.test/\"\nexpect = \"ask\"\nask_rule = \"prod-writes\"\n\
         [[cases]]\nmethod = \"POST\"\nurl = \"https://api.prod.test/\"\nexpect = \"ask\"\nask_rule = \"unknown\"\n",
    );
    assert_eq!(
        f[0],
        ["expected allow, got ask: asks a person (rule 'prod-writes'; hold 30s; scopes once, 1h, session; notifies ops) (allowed: rule 'prod-writes' allows POST https://api.prod.test/)"]
    );
    assert_eq!(f[1].len(), 1);
    assert!(
        f[1][0].starts_with("expected deny, got ask: asks a person ([ask] unknown = true; "),
        "{f:?}"
    );
    assert_eq!(
        f[2],
        [
            "expected ask, got allow (rule 'prod-reads': rule 'prod-reads' allows GET https://api.prod.test/)",
            "expected ask_rule 'prod-writes', nobody is asked",
        ]
    );
    assert_eq!(
        f[3],
        ["expected ask_rule 'unknown', rule 'prod-writes' asks"]
    );
    let e = parse_cases(
        Path::new("t.toml"),
        "[[cases]]\nmethod = \"GET\"\nurl = \"https://a.test/\"\nexpect = \"allow\"\nask_rule = \"unknown\"\n\
         [[cases]]\nmethod = \"GET\"\nurl = \"https://a.test/\"\nexpect = \"ask\"\nask_rule = \"prod-reads\"\n\
         [[cases]]\nmethod = \"GET\"\nurl = \"https://a.test/\"\nexpect = \"ask\"\nask_rule = \"nope\"\n\
         [[cases]]\nmethod = \"GET\"\nurl = \"https://a.test/\"\nexpect = \"maybe\"\n",
        &p,
    )
    .err()
    .unwrap_or_default();
    let e: Vec<String> = e.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        e,
        [
            "t.toml:5:12: cases[0].ask_rule: only a case with expect = \"ask\" has an asking rule",
            "t.toml:10:12: cases[1].ask_rule: rule \"prod-reads\" has no ask",
            "t.toml:15:12: cases[2].ask_rule: unknown rule \"nope\" (\"unknown\" names [ask] unknown = true)",
            "t.toml:19:10: cases[3].expect: \"maybe\" is not \"allow\", \"deny\" or \"ask\"",
        ]
    );
}

#[test]
fn lint_warns_when_nobody_hears_of_approvals_and_of_notifiers_no_ask_tells() {
    use crate::lint::lint;
    let codes = |text: &str| {
        let p = policy(text);
        lint(&p, &[(Path::new("test.toml"), text)])
            .into_iter()
            .filter(|w| w.code == "unheard_ask" || w.code == "unused_notifier")
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        codes("[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\nmethods = [\"GET\"]\n\n[ask]\nunknown = true\n"),
        ["test.toml:6:1: warning: [ask] unknown = true turns every request no rule allows into an approval request, but no [notify.NAME] webhook exists: nobody hears of an approval unless they poll `latchkey approvals list`; add a [notify.NAME] with a url"]
    );
    let w = codes("[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\nmethods = [\"GET\"]\nask = {}\n");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with(
            "test.toml:2:8: warning: rule(s) \"r\" ask a person, but no [notify.NAME]"
        ),
        "{w:?}"
    );
    assert_eq!(
        codes(&format!("{NOTIFY}[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\nmethods = [\"GET\"]\n")),
        ["test.toml:1:9: warning: notifier \"ops\" is never told of anything: no rule has ask and [ask] unknown is off; remove it or name it in a notify list"]
    );
    let w = codes(ASKING);
    assert!(w.is_empty(), "each notifier is told by some ask: {w:?}");
    let w = codes(&ASKING.replace("notify = [\"sec\"]\n", "notify = [\"ops\"]\n"));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("notifier \"sec\" is never told of anything: every ask names its own notify list without it"), "{w:?}");
}

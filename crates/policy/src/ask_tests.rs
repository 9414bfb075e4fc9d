//! The approvals keys: `ask`, `[ask]`, `[notify.NAME]` and `labels`, each key's parse, each
//! error at its `file:line:col`, defaults resolution, and which decisions ask.

use std::path::Path;
use std::time::Duration;

use http::Method;

use super::ask_compile::parse_rate;
use super::compile::{compile_one, compile_sources_with};
use super::{
    ask::{notify_secret_key, slack_signing_key},
    ConnectDecision, NotifyFormat, Policy, Scheme, Scope, SecretLoading, Target,
};

fn policy(text: &str) -> Policy {
    compile_sources_with(&[(Path::new("test.toml"), text)], SecretLoading::Skip)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

fn errors(text: &str) -> Vec<String> {
    match compile_sources_with(&[(Path::new("test.toml"), text)], SecretLoading::Skip) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

const NOTIFY: &str = "[notify.ops]\nurl = \"https://hooks.example.test/latchkey\"\n";

fn rule_with(ask: &str) -> String {
    format!("{NOTIFY}[[rules]]\nname = \"w\"\nhosts = [\"api.prod.test\"]\nmethods = [\"POST\"]\nask = {ask}\n")
}

fn target<'a>(host: &'a str, method: &'a Method, path: &'a str) -> Target<'a> {
    Target {
        scheme: Scheme::Https,
        host,
        port: 443,
        method,
        path,
        identity: None,
        narrowing: None,
        websocket: false,
        query: None,
        headers: None,
    }
}

#[test]
fn a_rules_ask_takes_every_key_inline_or_as_a_sub_table() {
    let p = policy(&rule_with(
        "{ hold = \"5s\", scope = [\"once\", \"1h\", \"session\"], message = \" Production write \", notify = [\"ops\"] }",
    ));
    let ask = p.rules()[0].ask.as_ref().expect("asks");
    assert_eq!(ask.hold, Duration::from_secs(5));
    assert_eq!(
        ask.scopes,
        [
            Scope::Once,
            Scope::For(Duration::from_secs(3600)),
            Scope::Session
        ]
    );
    assert_eq!(ask.message.as_deref(), Some("Production write"));
    assert_eq!(ask.notify, ["ops"]);
    let p = policy(&format!(
        "{NOTIFY}[[rules]]\nname = \"w\"\nhosts = [\"api.prod.test\"]\n[rules.ask]\nhold = \"0s\"\n"
    ));
    let ask = p.rules()[0].ask.as_ref().expect("asks");
    assert_eq!(ask.hold, Duration::ZERO, "0s: not held");
    assert_eq!(ask.scopes, [Scope::Once]);
    assert!(ask.message.is_none() && ask.notify.is_empty());
}

#[test]
fn a_rule_without_ask_does_not_ask_and_an_empty_ask_takes_the_defaults() {
    let p = policy("[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\n");
    assert!(p.rules()[0].ask.is_none());
    assert!(!p.ask().unknown);
    assert!(p.ask().origin.is_none() && p.notifiers().is_empty());
    let p = policy("[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\nask = {}\n");
    assert_eq!(p.rules()[0].ask.as_ref(), Some(&super::Ask::default()));
}

#[test]
fn missing_keys_of_a_rules_ask_take_the_ask_tables_values() {
    let text = format!(
        "{NOTIFY}[notify.sec]\nurl = \"http://10.0.0.9:8080/hook\"\nformat = \"slack\"\n\n[ask]\nunknown = true\nhold = \"10s\"\nscope = [\"once\", \"30m\"]\nmessage = \"Somebody should look\"\nnotify = [\"sec\"]\nrate = \"3/h\"\nexpire = \"2h\"\n\n[[rules]]\nname = \"w\"\nhosts = [\"api.prod.test\"]\nask = {{ scope = [\"session\"] }}\n"
    );
    let p = policy(&text);
    let a = p.ask();
    assert!(a.unknown);
    assert_eq!(a.terms.hold, Duration::from_secs(10));
    assert_eq!(a.terms.notify, ["sec"]);
    assert_eq!((a.rate, a.rate_window), (3, Duration::from_secs(3600)));
    assert_eq!(a.expire, Duration::from_secs(7200));
    assert_eq!(a.origin.as_ref().map(|o| o.line), Some(7));
    let ask = p.rules()[0].ask.as_ref().expect("asks");
    assert_eq!(ask.hold, Duration::from_secs(10));
    assert_eq!(ask.scopes, [Scope::Session]);
    assert_eq!(ask.message.as_deref(), Some("Somebody should look"));
    assert_eq!(ask.notify, ["sec"]);
    let names: Vec<&str> = p.notifiers().iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["ops", "sec"], "sorted by name");
    assert_eq!(p.notifiers()[1].format, NotifyFormat::Slack);
    assert_eq!(p.notifiers()[0].format, NotifyFormat::Json);
    assert!(!p.notifiers()[0].signed);
}

#[test]
fn the_ask_table_may_sit_in_any_file_and_applies_to_rules_in_every_file() {
    let p = compile_sources_with(
        &[
            (
                Path::new("a.toml"),
                "[[rules]]\nname = \"w\"\nhosts = [\"a.test\"]\nask = { notify = [\"ops\"] }\n",
            ),
            (
                Path::new("b.toml"),
                "[ask]\nhold = \"1m\"\n[notify.ops]\nurl = \"https://h.test/\"\n",
            ),
        ],
        SecretLoading::Skip,
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        p.rules()[0].ask.as_ref().map(|a| a.hold),
        Some(Duration::from_secs(60))
    );
    let e = compile_sources_with(
        &[
            (Path::new("a.toml"), "[ask]\nunknown = true\n"),
            (Path::new("b.toml"), "\n[ask]\nhold = \"1s\"\n"),
        ],
        SecretLoading::Skip,
    )
    .err()
    .unwrap_or_default();
    assert_eq!(
        e.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        ["b.toml:2:1: ask: a second [ask] table; the first is at a.toml:1: a policy takes one [ask], so merge them"]
    );
}

#[test]
fn every_bad_ask_value_is_reported_at_its_line_with_its_field() {
    let e = errors(&rule_with(
        "{ hold = \"11m\", scope = [\"once\", \"once\", \"forever\", \"0s\", \"400d\"], message = \"\", notify = [\"nobody\", \"ops\", \"ops\"] }",
    ));
    assert_eq!(
        e,
        [
            "test.toml:7:16: rules[0].ask.hold: \"11m\" is longer than 10m",
            "test.toml:7:40: rules[0].ask.scope[1]: scope \"once\" is listed twice",
            "test.toml:7:48: rules[0].ask.scope[2]: scope \"forever\" is not \"once\", \"session\" or a duration such as \"1h\"",
            "test.toml:7:59: rules[0].ask.scope[3]: scope \"0s\" is shorter than one second",
            "test.toml:7:65: rules[0].ask.scope[4]: \"400d\" is longer than 30days: access wanted for longer is a rule (latchkey approvals export), not a grant",
            "test.toml:7:84: rules[0].ask.message: empty; remove the key for no message",
            "test.toml:7:98: rules[0].ask.notify[0]: unknown notifier \"nobody\": declare [notify.nobody] with a url (declared: ops)",
            "test.toml:7:115: rules[0].ask.notify[2]: notifier \"ops\" is listed twice",
        ]
    );
    let e = errors(&rule_with("{ scope = [], notify = [], hold = \"soon\" }"));
    assert_eq!(
        e,
        [
            "test.toml:7:17: rules[0].ask.scope: an empty list offers the approver nothing; list at least one of \"once\", \"session\" or a duration such as \"1h\"",
            "test.toml:7:30: rules[0].ask.notify: an empty list; remove the key to tell every [notify.*] webhook",
            "test.toml:7:41: rules[0].ask.hold: \"soon\" is not a duration like \"30s\" or \"5m\"",
        ]
    );
    let e = errors(&rule_with("{ message = \"two\\nlines\", hold = 5 }"));
    assert_eq!(
        e,
        [
            "test.toml:7:19: rules[0].ask.message: contains a control character (a newline?): one line",
            "test.toml:7:40: rules[0].ask.hold: expected a string, found an integer",
        ]
    );
}

#[test]
fn unknown_keys_in_ask_tables_are_errors_with_a_hint() {
    let e = errors(&rule_with("{ hodl = \"5s\", rate = \"1/s\" }"));
    assert_eq!(
        e,
        [
            "test.toml:7:9: rules[0].ask: unknown key `hodl`; known keys: hold, scope, message, notify",
            "test.toml:7:22: rules[0].ask: unknown key `rate`; known keys: hold, scope, message, notify",
        ]
    );
    let e = errors("[ask]\nunkown = true\n");
    assert_eq!(
        e,
        ["test.toml:2:1: ask: unknown key `unkown`; did you mean `unknown`?"]
    );
    let e = errors("[notify.ops]\nurl = \"https://h.test/\"\nsecert = \"env:X\"\n");
    assert_eq!(
        e,
        ["test.toml:3:1: notify.ops: unknown key `secert`; did you mean `secret`?"]
    );
    let e = errors("[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\nask = true\n");
    assert_eq!(
        e,
        ["test.toml:4:7: rules[0].ask: expected a table, found a boolean"]
    );
}

#[test]
fn a_tunnel_or_report_rule_cannot_ask() {
    let e = errors("[[rules]]\nname = \"t\"\nhosts = [\"a.test\"]\ntunnel = true\nask = {}\n");
    assert_eq!(
        e,
        ["test.toml:5:7: rules[0].ask: a tunnel rule cannot ask a person: latchkey cannot see inside the tunnel; remove ask or set tunnel = false"]
    );
    let e = errors("[[rules]]\nname = \"t\"\nhosts = [\"a.test\"]\nmode = \"report\"\n[rules.ask]\nhold = \"1s\"\n");
    assert_eq!(
        e,
        ["test.toml:5:1: rules[0].ask: a rule in mode = \"report\" lets requests through and cannot also hold them for a person; remove ask or mode"]
    );
}

#[test]
fn the_ask_tables_own_keys_are_checked() {
    let e = errors(
        "[ask]\nunknown = \"yes\"\nrate = \"0/min\"\nexpire = \"30s\"\nhold = \"2m\"\nnotify = [\"ops\"]\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:2:11: ask.unknown: expected true or false, found a string",
            "test.toml:3:8: ask.rate: \"0/min\" is not a rate like \"10/min\" (N/s, N/min, N/h or N/day, N at least 1)",
            "test.toml:4:10: ask.expire: \"30s\" is shorter than 1m",
            "test.toml:6:11: ask.notify[0]: unknown notifier \"ops\": declare [notify.ops] with a url (the policy declares none)",
        ]
    );
    let e = errors("[ask]\nexpire = \"5m\"\n[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\nask = { hold = \"6m\" }\n");
    assert_eq!(
        e,
        ["test.toml:6:16: rules[0].ask.hold: 6m is longer than [ask] expire (5m): the approval would expire while the request waits"]
    );
    let e = errors("[ask]\nexpire = \"31d\"\n");
    assert_eq!(
        e,
        ["test.toml:2:10: ask.expire: \"31d\" is longer than 30days"]
    );
}

#[test]
fn rates_take_every_unit_and_refuse_the_rest() {
    assert_eq!(parse_rate("10/min"), Ok((10, Duration::from_secs(60))));
    assert_eq!(parse_rate(" 1 / s "), Ok((1, Duration::from_secs(1))));
    assert_eq!(parse_rate("2/sec"), Ok((2, Duration::from_secs(1))));
    assert_eq!(parse_rate("5/h"), Ok((5, Duration::from_secs(3600))));
    assert_eq!(parse_rate("5/hour"), Ok((5, Duration::from_secs(3600))));
    assert_eq!(
        parse_rate("100/day"),
        Ok((100, Duration::from_secs(86_400)))
    );
    for bad in [
        "10",
        "0/s",
        "-1/s",
        "x/min",
        "10/week",
        "10/",
        "/min",
        "99999999999/s",
    ] {
        assert!(parse_rate(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_notifier_needs_a_plain_http_or_https_url_and_a_known_format() {
    let e = errors(
        "[notify.a]\nurl = \"ftp://h.test/\"\n[notify.b]\nurl = \"https://u:pw@h.test/\"\n[notify.c]\nurl = \"https://h.test/?token=abc\"\n[notify.d]\nurl = \"not a url\"\n[notify.e]\nurl = \"https://h.test/x#y\"\nformat = \"xml\"\n[notify.f]\nformat = \"json\"\n[notify.\"bad name\"]\nurl = \"https://h.test/\"\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:2:7: notify.a.url: scheme \"ftp\": a webhook URL is http:// or https://",
            "test.toml:4:7: notify.b.url: it carries a user or password ('@'): credentials do not belong in a URL; use secret = \"env:…\" to sign deliveries",
            "test.toml:6:7: notify.c.url: it has a query ('?'): a token there would be logged and shown to approvers; use secret = \"env:…\" to sign deliveries",
            "test.toml:8:7: notify.d.url: not an absolute URL (relative URL without a base)",
            "test.toml:10:7: notify.e.url: it has a fragment ('#')",
            "test.toml:11:10: notify.e.format: unknown format \"xml\": use \"json\" or \"slack\"",
            "test.toml:12:1: notify.f: missing key `url`",
            "test.toml:14:9: notify.bad name: notifier names use letters, digits, '-' and single '_' (at most 64)",
        ]
    );
    // No secret (here: the password) is echoed back.
    assert!(e.iter().all(|m| !m.contains("pw@")), "{e:?}");
    let e = compile_sources_with(
        &[(Path::new("a.toml"), NOTIFY), (Path::new("b.toml"), NOTIFY)],
        SecretLoading::Skip,
    )
    .err()
    .unwrap_or_default();
    assert_eq!(
        e.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        ["b.toml:1:9: notify.ops: duplicate notifier \"ops\", first declared at a.toml:1"]
    );
}

#[test]
fn a_notifiers_secret_is_a_secret_source_loaded_and_located_like_any_other() {
    let var = "LATCHKEY_ASK_TEST_WEBHOOK_SECRET";
    std::env::set_var(var, "hook-secret-value");
    let p = compile_one(&format!(
        "[notify.ops]\nurl = \"https://h.test/\"\nsecret = \"env:{var}\"\n"
    ))
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert!(p.notifiers()[0].signed);
    assert!(p.secret_names().any(|n| n == notify_secret_key("ops")));
    let e = compile_one(
        "[notify.ops]\nurl = \"https://h.test/\"\nsecret = \"env:LATCHKEY_ASK_TEST_UNSET_SECRET\"\n",
    )
    .err()
    .unwrap_or_default();
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].to_string()
            .starts_with("test.toml:3:10: notify.ops.secret: "),
        "{e:?}"
    );
    let e = errors("[notify.ops]\nurl = \"https://h.test/\"\nsecret = \"hunter2\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("test.toml:3:10: notify.ops.secret: "),
        "{e:?}"
    );
    assert!(!e[0].contains("hunter2"), "{e:?}");
}

#[test]
fn a_slack_notifiers_signing_secret_and_approvers_make_its_buttons_interactive() {
    let var = "LATCHKEY_ASK_TEST_SLACK_SIGNING_SECRET";
    std::env::set_var(var, "slack-signing-secret-value");
    let p = compile_one(&format!(
        "[notify.chat]\nurl = \"https://hooks.slack.test/services/T/B/X\"\nformat = \"slack\"\nsigning_secret = \"env:{var}\"\napprovers = [\"U012AB3CD\", \"W0ABC\"]\n[notify.plain]\nurl = \"https://hooks.slack.test/services/T/B/Y\"\nformat = \"slack\"\n"
    ))
    .unwrap_or_else(|e| panic!("{e:?}"));
    let chat = &p.notifiers()[0];
    assert_eq!(chat.name, "chat");
    assert!(chat.interactive && !chat.signed);
    assert_eq!(chat.approvers, ["U012AB3CD", "W0ABC"]);
    assert!(p.secret_names().any(|n| n == slack_signing_key("chat")));
    assert_ne!(slack_signing_key("chat"), notify_secret_key("chat"));
    let plain = &p.notifiers()[1];
    assert!(!plain.interactive && plain.approvers.is_empty());
    // Without approvers, anyone who can click answers.
    let p = policy("[notify.chat]\nurl = \"https://h.test/\"\nformat = \"slack\"\nsigning_secret = \"env:X\"\n");
    assert!(p.notifiers()[0].interactive && p.notifiers()[0].approvers.is_empty());
    // Read like any secret: a missing value is an error at the key, never echoed.
    let e = compile_one(
        "[notify.chat]\nurl = \"https://h.test/\"\nformat = \"slack\"\nsigning_secret = \"env:LATCHKEY_ASK_TEST_UNSET_SIGNING\"\n",
    )
    .err()
    .unwrap_or_default();
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].to_string()
            .starts_with("test.toml:4:18: notify.chat.signing_secret: "),
        "{e:?}"
    );
    let e = errors("[notify.chat]\nurl = \"https://h.test/\"\nformat = \"slack\"\nsigning_secret = \"hunter2\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("test.toml:4:18: notify.chat.signing_secret: "),
        "{e:?}"
    );
    assert!(!e[0].contains("hunter2"), "{e:?}");
}

#[test]
fn signing_secret_is_slacks_only_and_approvers_need_it() {
    let e = errors(
        "[notify.a]\nurl = \"https://h.test/\"\nsigning_secret = \"env:X\"\n[notify.b]\nurl = \"https://h.test/\"\nformat = \"slack\"\napprovers = [\"U012AB3CD\"]\n[notify.c]\nurl = \"https://h.test/\"\nformat = \"slack\"\nsigning_secret = \"env:X\"\napprovers = []\n[notify.d]\nurl = \"https://h.test/\"\nformat = \"slack\"\nsigning_secret = \"env:X\"\napprovers = [\"U012AB3CD\", \"ana\", \"u012ab3cd\", \"U012AB3CD\", \"U\"]\n[notify.e]\nurl = \"https://h.test/\"\nformat = \"json\"\nsigning_secret = \"env:X\"\napprovers = [\"U1X\"]\n",
    );
    assert_eq!(
        e,
        [
            "test.toml:3:18: notify.a.signing_secret: only a format = \"slack\" notifier answers from its buttons; set format = \"slack\" or remove signing_secret",
            "test.toml:7:13: notify.b.approvers: approvers need signing_secret: without it the buttons are links that whoever holds the message can open, so nobody could be held to the list",
            "test.toml:12:13: notify.c.approvers: an empty list: nobody could answer; remove the key to let anyone who can click in the channel answer",
            "test.toml:17:27: notify.d.approvers[1]: \"ana\" is not a Slack user ID (U or W, then upper-case letters and digits, as in U012AB3CD)",
            "test.toml:17:34: notify.d.approvers[2]: \"u012ab3cd\" is not a Slack user ID (U or W, then upper-case letters and digits, as in U012AB3CD)",
            "test.toml:17:47: notify.d.approvers[3]: \"U012AB3CD\" is listed twice",
            "test.toml:17:60: notify.d.approvers[4]: \"U\" is not a Slack user ID (U or W, then upper-case letters and digits, as in U012AB3CD)",
            "test.toml:21:18: notify.e.signing_secret: only a format = \"slack\" notifier answers from its buttons; set format = \"slack\" or remove signing_secret",
        ]
    );
    let e = errors(
        "[notify.ops]\nurl = \"https://h.test/\"\nformat = \"slack\"\napprover = [\"U1X\"]\n",
    );
    assert_eq!(
        e,
        ["test.toml:4:1: notify.ops: unknown key `approver`; did you mean `approvers`?"]
    );
}

#[test]
fn identity_labels_are_checked_and_kept() {
    let p = policy(
        "[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\n[identities.agent]\nsources = [\"10.0.0.1/32\"]\nrules = [\"r\"]\nlabels = { sandbox = \"run-42\", owner = \"ana\", \"k8s.pod-name_1\" = \"x\" }\n",
    );
    let labels = &p.identities()[0].labels;
    assert_eq!(labels.len(), 3);
    assert_eq!(labels.get("sandbox").map(String::as_str), Some("run-42"));
    let long = "v".repeat(257);
    let e = errors(&format!(
        "[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\n[identities.agent]\nsources = [\"10.0.0.1/32\"]\nrules = [\"r\"]\n[identities.agent.labels]\nOwner = \"ana\"\nn = 1\nlong = \"{long}\"\nnl = \"a\\nb\"\n"
    ));
    assert_eq!(
        e,
        [
            "test.toml:8:1: identities.agent.labels.Owner: label keys use lower-case letters, digits, '_', '.' and '-' (at most 64)",
            "test.toml:9:5: identities.agent.labels.n: expected a string, found an integer",
            "test.toml:10:8: identities.agent.labels.long: value longer than 256 bytes",
            "test.toml:11:6: identities.agent.labels.nl: value contains a control character",
        ]
    );
    let many: String = (0..33).map(|i| format!("l{i} = \"x\"\n")).collect();
    let e = errors(&format!(
        "[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\n[identities.agent]\nsources = [\"10.0.0.1/32\"]\nrules = [\"r\"]\n[identities.agent.labels]\n{many}"
    ));
    assert_eq!(
        e,
        ["test.toml:7:1: identities.agent.labels: 33 labels; at most 32 (they are copied into every approval)"]
    );
}

#[test]
fn asks_is_some_for_an_ask_rules_allow_and_under_unknown_for_policy_denials_only() {
    let text = format!(
        "{NOTIFY}[[rules]]\nname = \"w\"\nhosts = [\"api.prod.test\"]\nmethods = [\"POST\"]\npaths = [\"/v1/**\"]\nask = {{ hold = \"5s\" }}\n[[rules]]\nname = \"r\"\nhosts = [\"api.prod.test\"]\nmethods = [\"GET\"]\n"
    );
    let p = policy(&text);
    let (post, get, del) = (Method::POST, Method::GET, Method::DELETE);
    let d = p.decide(&target("api.prod.test", &post, "/v1/x"));
    let a = p.asks(&d).expect("the ask rule's allow asks");
    assert_eq!(a.rule_name(), "w");
    assert_eq!(a.terms.hold, Duration::from_secs(5));
    let d = p.decide(&target("api.prod.test", &get, "/v1/x"));
    assert!(
        d.allowed() && p.asks(&d).is_none(),
        "a plain allow does not ask"
    );
    for (m, path) in [(&del, "/v1/x"), (&post, "/v2")] {
        let d = p.decide(&target("api.prod.test", m, path));
        assert!(!d.allowed() && p.asks(&d).is_none(), "deny stays deny");
    }
    let d = p.decide(&target("other.test", &get, "/"));
    assert!(p.asks(&d).is_none());

    let p = policy(&format!("[ask]\nunknown = true\nhold = \"2s\"\n{text}"));
    for (host, m, path, reason) in [
        ("other.test", &get, "/", "no_rule"),
        ("api.prod.test", &del, "/v1/x", "method_not_allowed"),
        ("api.prod.test", &post, "/v2", "path_not_allowed"),
    ] {
        let d = p.decide(&target(host, m, path));
        assert_eq!(d.reason.code(), reason);
        let a = p.asks(&d).expect("unknown asks");
        assert_eq!(a.rule_name(), "unknown");
        assert!(a.rule.is_none());
        assert_eq!(a.terms.hold, Duration::from_secs(2));
    }
    let mut port = target("api.prod.test", &get, "/");
    port.port = 8443;
    let d = p.decide(&port);
    assert_eq!(d.reason.code(), "port_not_allowed");
    assert!(p.asks(&d).is_some());
    let d = p.decide(&target("api.prod.test", &post, "/v1/x"));
    assert_eq!(
        p.asks(&d).map(|a| a.rule_name().to_string()).as_deref(),
        Some("w"),
        "a rule's ask keeps its own name"
    );
}

#[test]
fn unknown_asks_for_identity_denials_and_turns_a_refused_connect_into_an_intercept() {
    let text = "[[rules]]\nname = \"r\"\nhosts = [\"a.test\"]\n[[rules]]\nname = \"t\"\nhosts = [\"t.test\"]\ntunnel = true\n[identities.ci]\nsources = [\"10.0.0.1/32\"]\nrules = [\"t\"]\n";
    let p = policy(text);
    let ci = p.identity("ci");
    let denied = |d: ConnectDecision<'_>| matches!(d, ConnectDecision::Deny(_));
    assert!(denied(p.decide_connect("other.test", 443, ci)));
    assert!(
        denied(p.decide_connect("a.test", 443, ci)),
        "identity_not_allowed"
    );
    assert!(
        denied(p.decide_connect("a.test", 8443, None)),
        "port_not_allowed"
    );

    let p = policy(&format!("[ask]\nunknown = true\n{text}"));
    let ci = p.identity("ci");
    let intercept = |d: ConnectDecision<'_>| matches!(d, ConnectDecision::Intercept);
    assert!(
        intercept(p.decide_connect("other.test", 443, ci)),
        "no_rule"
    );
    assert!(
        intercept(p.decide_connect("a.test", 443, ci)),
        "identity_not_allowed"
    );
    assert!(
        intercept(p.decide_connect("a.test", 8443, None)),
        "port_not_allowed"
    );
    assert!(matches!(
        p.decide_connect("t.test", 443, ci),
        ConnectDecision::Tunnel(_)
    ));
    let get = Method::GET;
    let mut t = target("a.test", &get, "/");
    t.identity = ci;
    let d = p.decide(&t);
    assert_eq!(d.reason.code(), "identity_not_allowed");
    assert_eq!(
        p.asks(&d).map(|a| a.rule_name().to_string()).as_deref(),
        Some("unknown")
    );
}

#[test]
fn the_rule_name_unknown_is_reserved_for_requests_no_rule_allows() {
    let e = errors("[[rules]]\nname = \"unknown\"\nhosts = [\"a.test\"]\n");
    assert_eq!(
        e,
        ["test.toml:2:8: rules[0].name: rule name \"unknown\" is reserved: approvals and grants for requests no rule allows go by it; rename the rule"]
    );
}

//! Tests of the audit log reader: filters, lines, rows and summaries.

use super::*;

fn at(s: &str) -> SystemTime {
    humantime::parse_rfc3339(s).expect("test time")
}

#[test]
fn since_and_until_read_rfc3339_with_or_without_an_offset_and_dates() {
    let now = at("2026-05-01T12:00:00Z");
    let cases = [
        ("2026-05-01T10:00:00Z", "2026-05-01T10:00:00Z"),
        ("2026-05-01T10:00:00.250Z", "2026-05-01T10:00:00.250Z"),
        ("2026-05-01T10:00:00", "2026-05-01T10:00:00Z"),
        ("2026-05-01 10:00:00", "2026-05-01T10:00:00Z"),
        ("2026-05-01T12:00:00+02:00", "2026-05-01T10:00:00Z"),
        ("2026-05-01T05:30:00-04:30", "2026-05-01T10:00:00Z"),
        ("2026-05-01", "2026-05-01T00:00:00Z"),
    ];
    for (given, want) in cases {
        assert_eq!(parse_instant(given, now).expect(given), at(want), "{given}");
    }
}

#[test]
fn a_bare_duration_means_that_long_before_now() {
    let now = at("2026-05-01T12:00:00Z");
    assert_eq!(
        parse_instant("1h", now).expect("1h"),
        at("2026-05-01T11:00:00Z")
    );
    assert_eq!(
        parse_instant("30m", now).expect("30m"),
        at("2026-05-01T11:30:00Z")
    );
    assert_eq!(
        parse_instant("2d 1h", now).expect("2d 1h"),
        at("2026-04-29T11:00:00Z")
    );
}

#[test]
fn a_bad_time_names_the_value_and_the_accepted_forms() {
    let now = at("2026-05-01T12:00:00Z");
    for bad in [
        "yesterday",
        "1 fortnight",
        "2026-13-01T00:00:00Z",
        "",
        "10:00",
    ] {
        let e = parse_instant(bad, now).expect_err(bad).to_string();
        assert!(e.contains(&format!("{bad:?}")), "{e}");
        assert!(e.contains("RFC 3339") && e.contains("1h"), "{e}");
    }
}

#[test]
fn reason_codes_are_checked_against_the_registry() {
    for r in crate::reason::Reason::ALL {
        assert_eq!(parse_reason(r.code()).expect("known code"), r.code());
    }
    let e = parse_reason("no_such_reason")
        .expect_err("unknown")
        .to_string();
    assert!(
        e.starts_with("unknown reason code \"no_such_reason\""),
        "{e}"
    );
    assert!(
        e.contains("no_rule") && e.contains("method_not_allowed"),
        "{e}"
    );
}

#[test]
fn host_globs_match_subdomains_and_exact_names_only_themselves() {
    let wild = HostPattern::parse("*.Example.com").expect("glob");
    assert!(wild.matches("api.example.com"));
    assert!(wild.matches("a.b.example.com"));
    assert!(wild.matches("API.EXAMPLE.COM."));
    assert!(!wild.matches("example.com"));
    assert!(!wild.matches("evilexample.com"));
    assert!(!wild.matches("api.example.com.evil"));
    let exact = HostPattern::parse("api.test").expect("exact");
    assert!(exact.matches("api.test"));
    assert!(!exact.matches("a.api.test"));
    assert!(!exact.matches("api.tes"));
    let mid = HostPattern::parse("api-*.test").expect("inner star");
    assert!(mid.matches("api-1.test"));
    assert!(mid.matches("api-eu-2.test"));
    assert!(!mid.matches("api-.test"));
    let two = HostPattern::parse("*.*.test").expect("two stars");
    assert!(two.matches("a.b.test"));
    assert!(!two.matches("a.test"));
    for bad in ["", "https://api.test", "api.test/v1", "a b"] {
        assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
    }
}

fn line(json: &str) -> Line {
    Line::parse(json.to_string())
        .expect("record")
        .expect("not a checkpoint")
}

/// A record of identity `ci` allowed to api.test by `api`; `extra` (`"k":v,...`) overrides.
fn rec(id: &str, phase: &str, extra: &str) -> Line {
    let mut v: serde_json::Value = serde_json::from_str(&format!(
        r#"{{"seq":1,"prev":"x","phase":"{phase}","ts":"2026-05-01T10:00:00.000Z","id":"{id}","identity":"ci","host":"api.test","decision":"allow","reason":"allowed","rule":"api"}}"#
    ))
    .expect("base record");
    let over: serde_json::Value =
        serde_json::from_str(&format!("{{{}}}", extra.trim_start_matches(','))).expect("extra");
    for (k, x) in over.as_object().expect("object") {
        v[k] = x.clone();
    }
    line(&v.to_string())
}

#[test]
fn filters_combine_with_and() {
    let r = rec("a", "outcome", "");
    let pass = |f: Filter| f.matches(&r);
    assert!(pass(Filter::default()));
    assert!(pass(Filter {
        identity: Some("ci".into()),
        host: Some(HostPattern::parse("*.test").expect("glob")),
        decision: Some(Verdict::Allow),
        reason: Some("allowed"),
        rule: Some("api".into()),
        since: Some(at("2026-05-01T10:00:00Z")),
        until: Some(at("2026-05-01T10:00:01Z")),
        session: None,
        profile: None,
    }));
    // A session or profile filter passes only records that carry them.
    assert!(!pass(Filter {
        session: Some("ses_00000000000000000000000000000000".into()),
        ..Filter::default()
    }));
    assert!(!pass(Filter {
        profile: Some("agent".into()),
        ..Filter::default()
    }));
    assert!(!pass(Filter {
        identity: Some("ci".into()),
        decision: Some(Verdict::Deny),
        ..Filter::default()
    }));
    assert!(!pass(Filter {
        rule: Some("other".into()),
        ..Filter::default()
    }));
    assert!(!pass(Filter {
        until: Some(at("2026-05-01T10:00:00Z")),
        ..Filter::default()
    }));
    assert!(!pass(Filter {
        since: Some(at("2026-05-01T10:00:00.001Z")),
        ..Filter::default()
    }));
}

#[test]
fn lines_that_are_not_records_say_why_and_checkpoints_are_skipped() {
    assert!(
        Line::parse(r#"{"seq":3,"prev":"ab","checkpoint":{"records":2}}"#.into())
            .expect("checkpoint")
            .is_none()
    );
    let why = |s: &str| Line::parse(s.to_string()).expect_err(s);
    assert!(why("{\"seq\":1,").starts_with("not JSON"));
    assert!(why("[1,2]").starts_with("not an audit record"));
    assert!(why(r#"{"ts":"2026-05-01T10:00:00Z"}"#).contains("no `id`"));
    assert!(why(r#"{"id":"a"}"#).contains("no `ts`"));
    assert!(why(r#"{"id":"a","ts":"noon"}"#).contains("`ts` \"noon\""));
    assert!(why(r#"{"id":"a","ts":"2026-05-01T10:00:00Z","phase":"x"}"#).contains("phase"));
}

#[test]
fn per_request_rows_are_outcomes_and_decisions_left_alone_come_last() {
    let mut q = Requests::new(Rows::PerRequest, Filter::default());
    let mut out = Vec::new();
    q.push(rec("a", "decision", ""), &mut out);
    q.push(rec("b", "decision", ""), &mut out);
    q.push(
        rec("c", "outcome", r#","decision":"deny","reason":"no_rule""#),
        &mut out,
    );
    q.push(rec("a", "outcome", ""), &mut out);
    q.finish(&mut out);
    let got: Vec<(&str, bool)> = out.iter().map(|l| (l.id(), l.decision_phase)).collect();
    assert_eq!(got, [("c", false), ("a", false), ("b", true)]);

    for (rows, want) in [
        (Rows::Decision, vec!["a", "b"]),
        (Rows::Outcome, vec!["c", "a"]),
        (Rows::Any, vec!["a", "b", "c", "a"]),
    ] {
        let mut q = Requests::new(rows, Filter::default());
        let mut out = Vec::new();
        for l in [
            rec("a", "decision", ""),
            rec("b", "decision", ""),
            rec("c", "outcome", ""),
            rec("a", "outcome", ""),
        ] {
            q.push(l, &mut out);
        }
        q.finish(&mut out);
        assert_eq!(
            out.iter().map(Line::id).collect::<Vec<_>>(),
            want,
            "{rows:?}"
        );
    }
}

#[test]
fn waiting_decisions_are_bounded() {
    let mut q = Requests::new(Rows::PerRequest, Filter::default());
    let mut out = Vec::new();
    for i in 0..=MAX_PENDING {
        q.push(rec(&format!("d{i}"), "decision", ""), &mut out);
    }
    assert_eq!(
        out.len(),
        1,
        "the oldest comes out once the limit is passed"
    );
    assert_eq!(out[0].id(), "d0");
    q.finish(&mut out);
    assert_eq!(out.len(), MAX_PENDING + 1);
}

#[test]
fn lines_are_read_whole_overlong_ones_cut_and_the_last_may_lack_its_newline() {
    let text = format!("ab\n{}\ncd", "x".repeat(20));
    let mut r = std::io::Cursor::new(text.into_bytes());
    let mut buf = Vec::new();
    let mut next = |buf: &mut Vec<u8>| {
        buf.clear();
        read_line(&mut r, buf, 8).expect("read").map(|l| {
            (
                String::from_utf8_lossy(buf).to_string(),
                l.newline,
                l.overlong,
            )
        })
    };
    assert_eq!(next(&mut buf), Some(("ab".into(), true, false)));
    assert_eq!(next(&mut buf), Some(("xxxxxxxx".into(), true, true)));
    assert_eq!(next(&mut buf), Some(("cd".into(), false, false)));
    assert_eq!(next(&mut buf), None);
}

#[test]
fn a_summary_counts_per_identity_and_caps_hosts() {
    let mut s = Summary::default();
    s.add(&rec(
        "a",
        "outcome",
        r#","secrets":["gh"],"bytes_up":10,"bytes_down":100,"labels":{"env":"ci"}"#,
    ));
    s.add(&rec("b", "decision", r#","secrets":["gh"]"#));
    s.add(&rec(
        "c",
        "outcome",
        r#","decision":"deny","reason":"no_rule","host":"evil.test""#,
    ));
    s.add(&rec(
        "d",
        "outcome",
        r#","usage":{"provider":"openai","input_tokens":7,"output_tokens":3,"cached_input_tokens":2,"cost":0.1,"source":"response"}"#,
    ));
    s.add(&rec(
        "e",
        "outcome",
        r#","usage":{"provider":"openai","input_tokens":1,"output_tokens":1,"cached_input_tokens":0,"cost":0.2,"source":"response"}"#,
    ));
    s.finish();
    assert_eq!(s.identities.len(), 1);
    let ci = &s.identities[0];
    assert_eq!(
        (ci.requests, ci.allowed, ci.denied, ci.unfinished),
        (5, 4, 1, 1)
    );
    assert_eq!(ci.hosts.ranked(), [("api.test", 4)]);
    assert_eq!(ci.secrets.ranked(), [("gh", 2)]);
    assert_eq!(ci.denials.ranked(), [("no_rule", 1)]);
    assert_eq!((ci.bytes_up, ci.bytes_down), (10, 100));
    assert_eq!(ci.labels.get("env").map(String::as_str), Some("ci"));
    assert_eq!(
        ci.usage,
        Some(UsageTotals {
            calls: 2,
            input_tokens: 8,
            cached_input_tokens: 2,
            output_tokens: 4,
            cost: Some(0.3),
        })
    );

    let mut c = Counts::with_cap(2);
    for h in ["a", "b", "c", "a", "d"] {
        c.add(h);
    }
    assert_eq!(c.ranked(), [("a", 2), ("b", 1)]);
    assert_eq!(c.untracked, 2);
}

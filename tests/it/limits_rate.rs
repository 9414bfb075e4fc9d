//! `requests = "N/PERIOD"`: a token bucket per key. A burst gets exactly the bucket's size
//! through; the rest are `429 rate_limited` with `x-ratelimit-*` and `retry-after`, never reach
//! the upstream, and say so in their audit record. The bucket refills continuously, identities
//! have their own buckets, `per = "global"` shares one.

use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use serde_json::json;

use crate::support::assert_record;
use crate::support::clients::RawResponse;
use crate::support::providers::{
    charge, chat_body, header_num, identities_toml, is_refusal, limits_world, on_path,
    provider_rule, ratelimit_headers, user, with_reason, Call, LimitsWorld, ANTHROPIC_HOST,
    GEMINI_HOST, OPENAI_HOST, SECRET_TOML,
};

fn policy(limits: &str, rules: &[String], identities: &str) -> String {
    format!("{SECRET_TOML}{limits}\n{}\n{identities}", rules.concat())
}

/// `n` calls at once (released together by a barrier), each from its own thread.
fn burst(w: &LimitsWorld, n: usize, call: &Call) -> Vec<RawResponse> {
    let barrier = Barrier::new(n);
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    w.run(call)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("burst thread"))
            .collect()
    })
}

fn chat(w: &LimitsWorld) -> Call {
    Call::post(
        &w.url(OPENAI_HOST, "/v1/chat/completions"),
        &chat_body("gpt-4o", false, Some(5)),
    )
}

#[test]
fn a_burst_of_twelve_against_five_per_minute_admits_exactly_five() {
    let w = limits_world(
        &policy(
            "[limits.burst]\nrequests = \"5/min\"\n",
            &[
                provider_rule("openai", OPENAI_HOST, "\"burst\""),
                provider_rule("free", ANTHROPIC_HOST, ""),
            ],
            "",
        ),
        |b| b,
    );
    let answers = burst(&w, 12, &chat(&w));
    let (allowed, refused): (Vec<_>, Vec<_>) = answers.iter().partition(|r| r.status == 200);
    assert_eq!(allowed.len(), 5, "admitted: {answers:#?}");
    assert_eq!(refused.len(), 7, "{answers:#?}");
    for r in &refused {
        assert!(is_refusal(r, 429, "rate_limited"), "{r:#?}");
        assert_eq!(r.header("x-latchkey-decision"), Some("deny"), "{r:#?}");
        let (limit, remaining, reset) = ratelimit_headers(r);
        assert_eq!((limit, remaining), (5, 0), "{r:#?}");
        assert!(
            (1..=60).contains(&reset),
            "x-ratelimit-reset {reset}: {r:#?}"
        );
        // One token comes back every 12 s.
        let retry = header_num(r, "retry-after");
        assert!((1..=12).contains(&retry), "retry-after {retry}: {r:#?}");
    }
    // Each admitted request took one token: the remaining counts are 4, 3, 2, 1, 0.
    let mut remaining: Vec<u64> = allowed
        .iter()
        .map(|r| {
            let (limit, remaining, _) = ratelimit_headers(r);
            assert_eq!(limit, 5, "{r:#?}");
            remaining
        })
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, [0, 1, 2, 3, 4], "{allowed:#?}");
    assert_eq!(
        w.providers.received().len(),
        5,
        "only the admitted requests reach the provider"
    );

    // A rule without limits is not counted.
    let free = w.run(&Call::post(
        &w.url(ANTHROPIC_HOST, "/upload"),
        &json!({"x": 1}),
    ));
    assert_eq!(free.status, 200, "{free:#?}");
    assert!(free.header("x-ratelimit-limit").is_none(), "{free:#?}");

    let records = w.lk.wait_audit(13);
    let chats = on_path(&records, "/v1/chat/completions");
    assert_eq!(chats.len(), 12);
    for r in &chats {
        let c = charge(r, "burst", "requests");
        assert_eq!(c["key"], "identity:default", "{r:#}");
        assert_eq!(c["limit_value"], 5, "{r:#}");
        assert_eq!(c["charged"], 1, "{r:#}");
    }
    let refused_records = with_reason(&records, "rate_limited");
    assert_eq!(refused_records.len(), 7, "{records:#?}");
    for r in &refused_records {
        assert_record(
            r,
            json!({"decision": "deny", "rule": "openai", "status": 429, "upstream": null}),
        );
        assert_eq!(charge(r, "burst", "requests")["refused"], true, "{r:#}");
    }
    let allowed_records = with_reason(&records, "allowed");
    assert_eq!(allowed_records.len(), 6, "{records:#?}");
    let upload = on_path(&records, "/upload");
    assert_record(upload[0], json!({"rule": "free", "status": 200}));
    assert!(upload[0].get("limits").is_none(), "{:#}", upload[0]);
    w.sweep();
}

#[test]
fn the_bucket_refills_one_token_per_interval() {
    // One token, back after a second: each pair below is two calls well within a second.
    let w = limits_world(
        &policy(
            "[limits.fast]\nrequests = \"1/s\"\n",
            &[provider_rule("openai", OPENAI_HOST, "\"fast\"")],
            "",
        ),
        |b| b,
    );
    let call = chat(&w);
    for round in 0..2 {
        let ok = w.run(&call);
        assert_eq!(ok.status, 200, "round {round}: {ok:#?}");
        assert_eq!(ratelimit_headers(&ok).1, 0, "{ok:#?}");
        let refused = w.run(&call);
        assert!(is_refusal(&refused, 429, "rate_limited"), "{refused:#?}");
        assert_eq!(header_num(&refused, "retry-after"), 1, "{refused:#?}");
        thread::sleep(Duration::from_millis(1100));
    }
    assert_eq!(w.providers.received().len(), 2);
    let records = w.lk.wait_audit(4);
    assert_eq!(with_reason(&records, "allowed").len(), 2, "{records:#?}");
    assert_eq!(
        with_reason(&records, "rate_limited").len(),
        2,
        "{records:#?}"
    );
    w.sweep();
}

#[test]
fn each_identity_has_its_own_bucket_and_a_global_limit_shares_one() {
    let limits = r#"
[limits.mine]
requests = "2/min"

[limits.shared]
per      = "global"
requests = "3/min"
"#;
    let w = limits_world(
        &policy(
            limits,
            &[
                provider_rule("openai", OPENAI_HOST, "\"mine\""),
                provider_rule("gemini", GEMINI_HOST, "\"shared\""),
            ],
            &identities_toml(&[]),
        ),
        |b| b,
    );
    let own = |who: &str| {
        w.run(&Call::post(&w.url(OPENAI_HOST, "/upload"), &json!({"who": who})).user(&user(who)))
            .status
    };
    let shared = |who: &str| {
        w.run(&Call::post(&w.url(GEMINI_HOST, "/upload"), &json!({"who": who})).user(&user(who)))
            .status
    };
    // Per identity: each gets two.
    assert_eq!([own("agent"), own("agent"), own("agent")], [200, 200, 429]);
    assert_eq!([own("other"), own("other"), own("other")], [200, 200, 429]);
    // Global: three between them.
    assert_eq!(
        [
            shared("agent"),
            shared("other"),
            shared("agent"),
            shared("other")
        ],
        [200, 200, 200, 429]
    );
    let records = w.lk.wait_audit(10);
    for r in &records {
        let identity = r["identity"].as_str().expect("identity");
        match r["rule"].as_str() {
            Some("openai") => assert_eq!(
                charge(r, "mine", "requests")["key"],
                format!("identity:{identity}"),
                "{r:#}"
            ),
            Some("gemini") => {
                assert_eq!(charge(r, "shared", "requests")["key"], "global", "{r:#}")
            }
            other => panic!("unexpected rule {other:?}: {r:#}"),
        }
    }
    assert_eq!(with_reason(&records, "rate_limited").len(), 3);
    w.sweep();
}

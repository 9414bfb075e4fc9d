//! `llm_tokens`: reserve before admission, settle with the response's usage. Twenty streaming
//! calls at once through the real `openai` SDK overshoot the budget by at most one
//! reservation; the refused ones are `429 budget_exhausted` before the provider saw them. A
//! call whose reservation cannot fit is refused outright; a call naming no maximum reserves
//! `reserve_tokens`.

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::providers::{
    charge, chat_body, completion_text, is_refusal, limits_world, num, provider_rule, usage_of,
    with_reason, Call, LimitsWorld, OPENAI_HOST, SECRET_TOML,
};

fn world(limit: &str) -> LimitsWorld {
    limits_world(
        &format!(
            "{SECRET_TOML}[limits.tokens]\n{limit}\n{}",
            provider_rule("openai", OPENAI_HOST, "\"tokens\"")
        ),
        |b| b,
    )
}

#[test]
fn twenty_concurrent_sdk_streams_overshoot_a_token_budget_by_at_most_one_reservation() {
    const BUDGET: u64 = 1500;
    let w = world("llm_tokens = \"1500/day\"");
    let results = w.sdk(
        None,
        &json!({
            "api": "openai-chat",
            "base_url": w.url(OPENAI_HOST, "/v1"),
            "model": "gpt-4o-mini",
            "stream": true,
            "include_usage": true,
            "max_tokens": 100,
            "headers": {"x-fake-input-tokens": "20", "x-fake-delay-ms": "25"},
            "count": 20,
        }),
    );
    assert_eq!(results.len(), 20);
    let allowed: Vec<&Value> = results.iter().filter(|r| r["status"] == 200).collect();
    let refused: Vec<&Value> = results.iter().filter(|r| r["status"] == 429).collect();
    assert_eq!(allowed.len() + refused.len(), 20, "{results:#?}");
    assert!(!allowed.is_empty(), "nothing was admitted: {results:#?}");
    assert!(
        !refused.is_empty(),
        "20 × 120 tokens fit a 1500-token budget? {results:#?}"
    );
    for r in &allowed {
        assert_eq!(r["text"], completion_text(), "{r:#}");
        assert_eq!(r["usage"]["prompt_tokens"], 20, "{r:#}");
        assert_eq!(r["usage"]["completion_tokens"], 100, "{r:#}");
    }
    for r in &refused {
        assert_eq!(r["error"], "RateLimitError", "{r:#}");
        // Spent, or held by the reservations of calls in flight (which of the two depends on
        // how the calls interleave).
        let reason = r["headers"]["x-latchkey-reason"]
            .as_str()
            .unwrap_or_default();
        assert!(
            ["budget_exhausted", "budget_reserved"].contains(&reason),
            "{r:#}"
        );
        assert!(
            r["body"].as_str().is_some_and(|b| b.contains("tokens")),
            "the refusal does not name the budget: {r:#}"
        );
    }
    let upstream_calls = w.providers.received().len();
    assert_eq!(
        upstream_calls,
        allowed.len(),
        "refused calls must not reach the provider"
    );

    let records = w.lk.wait_audit(20);
    let ok = with_reason(&records, "allowed");
    let mut no = with_reason(&records, "budget_exhausted");
    no.extend(with_reason(&records, "budget_reserved"));
    assert_eq!((ok.len(), no.len()), (allowed.len(), refused.len()));
    let mut charged_total = 0;
    for r in &ok {
        let usage = usage_of(r);
        assert_eq!(usage["provider"], "openai", "{r:#}");
        assert_eq!(usage["source"], "response", "{r:#}");
        let tokens = num(&usage, "input_tokens") + num(&usage, "output_tokens");
        assert_eq!(tokens, 120, "{r:#}");
        // Settled: the charge is the usage, not the reservation.
        assert_eq!(num(&charge(r, "tokens", "llm_tokens"), "charged"), tokens);
        charged_total += tokens;
    }
    // The largest reservation a refused call asked for bounds the overshoot.
    let reservation = no
        .iter()
        .map(|r| {
            assert_record(
                r,
                json!({"decision": "deny", "status": 429, "rule": "openai", "upstream": null}),
            );
            let c = charge(r, "tokens", "llm_tokens");
            assert_eq!(c["refused"], true, "{c:#}");
            num(&c, "charged")
        })
        .max()
        .expect("a refused call");
    assert!(
        reservation >= 100,
        "a reservation covers max_tokens: {reservation}"
    );
    assert!(
        charged_total <= BUDGET + reservation,
        "charged {charged_total} tokens against a budget of {BUDGET} (one reservation: {reservation})"
    );
    w.sweep();
}

#[test]
fn a_call_whose_reservation_cannot_fit_is_refused_before_the_provider() {
    let w = world("llm_tokens = \"1000/day\"");
    let url = w.url(OPENAI_HOST, "/v1/chat/completions");
    let greedy = w.run(&Call::post(&url, &chat_body("gpt-4o", false, Some(5000))));
    assert!(is_refusal(&greedy, 429, "budget_exhausted"), "{greedy:#?}");
    assert!(greedy.header("retry-after").is_some(), "{greedy:#?}");
    assert!(w.providers.received().is_empty());

    let modest = w.run(
        &Call::post(&url, &chat_body("gpt-4o", false, Some(50)))
            .header("x-fake-input-tokens", "30")
            .header("x-fake-output-tokens", "20"),
    );
    assert_eq!(modest.status, 200, "{modest:#?}");
    assert_eq!(w.providers.received().len(), 1);

    let records = w.lk.wait_audit(2);
    let refused = with_reason(&records, "budget_exhausted");
    let c = charge(refused[0], "tokens", "llm_tokens");
    assert!(num(&c, "charged") >= 5000, "what it asked for: {c:#}");
    assert_eq!(c["used"], 0, "{c:#}");
    let allowed = with_reason(&records, "allowed");
    let usage = usage_of(allowed[0]);
    assert_record(
        &usage,
        json!({"provider": "openai", "model": "gpt-4o", "input_tokens": 30, "output_tokens": 20}),
    );
    let c = charge(allowed[0], "tokens", "llm_tokens");
    assert_eq!((num(&c, "charged"), num(&c, "used")), (50, 50), "{c:#}");
    w.sweep();
}

#[test]
fn a_call_naming_no_maximum_reserves_reserve_tokens() {
    // 300 output tokens reserved: over a 200-token budget whatever the input.
    let w = world("llm_tokens = \"200/day\"\nreserve_tokens = 300");
    let url = w.url(OPENAI_HOST, "/v1/chat/completions");
    let body = chat_body("gpt-4o", false, None);
    let refused = w.run(&Call::post(&url, &body));
    assert!(
        is_refusal(&refused, 429, "budget_exhausted"),
        "{refused:#?}"
    );
    // With a maximum that fits, the same call goes.
    let fits = w.run(&Call::post(&url, &chat_body("gpt-4o", false, Some(10))));
    assert_eq!(fits.status, 200, "{fits:#?}");
    assert_eq!(w.providers.received().len(), 1);
    let records = w.lk.wait_audit(2);
    let c = charge(
        with_reason(&records, "budget_exhausted")[0],
        "tokens",
        "llm_tokens",
    );
    let asked = num(&c, "charged");
    let body_len = body.to_string().len() as u64;
    assert!(
        (300..=300 + body_len).contains(&asked),
        "reserved {asked}: 300 output tokens plus an input estimate under {body_len}"
    );
    w.sweep();
}

#[test]
fn a_call_that_fails_without_usage_gives_its_reservation_back() {
    let w = world("llm_tokens = \"1000/day\"");
    let url = w.url(OPENAI_HOST, "/v1/chat/completions");
    // Reserves at least 600 of the 1000; the provider fails and reports no usage.
    let failed =
        w.run(&Call::post(&url, &chat_body("gpt-4o", false, Some(600))).header("x-fake-fail", "1"));
    assert_eq!(failed.status, 500, "{failed:#?}");
    // Had the reservation stayed, this one (600 more) would not fit.
    let next = w.run(
        &Call::post(&url, &chat_body("gpt-4o", false, Some(600)))
            .header("x-fake-input-tokens", "10")
            .header("x-fake-output-tokens", "5"),
    );
    assert_eq!(next.status, 200, "{next:#?}");
    assert_eq!(w.providers.received().len(), 2);
    let records = w.lk.wait_audit(2);
    let failed = records
        .iter()
        .find(|r| r["status"] == 500)
        .unwrap_or_else(|| panic!("{records:#?}"));
    assert!(failed.get("usage").is_none(), "{failed:#}");
    let c = charge(failed, "tokens", "llm_tokens");
    assert_eq!((num(&c, "charged"), num(&c, "used")), (0, 0), "{c:#}");
    let ok = records
        .iter()
        .find(|r| r["status"] == 200)
        .unwrap_or_else(|| panic!("{records:#?}"));
    let c = charge(ok, "tokens", "llm_tokens");
    assert_eq!((num(&c, "charged"), num(&c, "used")), (15, 15), "{c:#}");
    w.sweep();
}

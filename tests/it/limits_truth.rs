//! Limits and prices say the truth: a refusal reaches an HTTP/2 client with a body as a `429`
//! (never a stream reset), a budget held only by reservations in flight says so
//! (`budget_reserved`, `retry-after: 1`) and `queue` waits for them to settle, and a model
//! variant is never priced as its cheaper sibling.

use std::time::Duration;

use serde_json::Value;

use crate::support::clients::curl;
use crate::support::providers::{
    chat_body, header_num, is_refusal, limits_world, provider_rule, usage_of, Call, LimitsWorld,
    OPENAI_HOST, SECRET_TOML,
};

/// `curl --http2` POSTing a 64 KiB body to `path` on the fake through latchkey, 10 times.
fn h2_posts(w: &LimitsWorld, path: &str) -> Vec<crate::support::clients::CurlOutput> {
    let body = w.lk.scratch().join("body.bin");
    std::fs::write(&body, vec![b'x'; 64 * 1024]).expect("body file");
    let data = format!("@{}", body.display());
    (0..10)
        .map(|_| {
            curl(&w.lk)
                .args([
                    "--http2",
                    "-H",
                    "content-type: application/octet-stream",
                    "--data-binary",
                    &data,
                    &w.url(OPENAI_HOST, path),
                ])
                .run()
        })
        .collect()
}

fn assert_all_refused(outs: &[crate::support::clients::CurlOutput], reason: &str) {
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(out.exit, Some(0), "call {i}: curl failed: {out:#?}");
        assert_eq!(out.http_version, "2", "call {i}: {out:#?}");
        assert!(is_refusal(&out.response, 429, reason), "call {i}: {out:#?}");
        assert!(
            header_num(&out.response, "retry-after") >= 1,
            "call {i}: {out:#?}"
        );
    }
}

#[test]
fn rate_and_budget_refusals_reach_an_h2_client_with_a_body_as_429s() {
    let w = limits_world(
        &format!(
            "{SECRET_TOML}[limits.slow]\nrequests = \"1/hour\"\n[limits.tiny]\nbytes_up = \"1KB/day\"\n{}{}",
            provider_rule("slow", OPENAI_HOST, "\"slow\"").replace(
                "hosts  = [",
                "paths = [\"/slow/**\"]\nhosts  = ["
            ),
            provider_rule("tiny", OPENAI_HOST, "\"tiny\"").replace(
                "hosts  = [",
                "paths = [\"/tiny/**\"]\nhosts  = ["
            ),
        ),
        |b| b,
    );
    // The bucket's one request goes; the next ten are rate_limited, each a whole answer.
    let first = curl(&w.lk)
        .args(["--http2", "-d", "x", &w.url(OPENAI_HOST, "/slow/first")])
        .run();
    assert_eq!(first.ok().status, 200, "{first:#?}");
    assert_all_refused(&h2_posts(&w, "/slow/upload"), "rate_limited");
    // A body over what the budget holds: refused up front, ten times.
    assert_all_refused(&h2_posts(&w, "/tiny/upload"), "budget_exhausted");
    assert_eq!(w.providers.received().len(), 1, "a refused upload left");
    w.sweep();
}

/// A chat body whose reservation is exactly `tokens` (its bytes / 2, rounded up, plus
/// `max_tokens`).
fn chat_reserving(tokens: u64) -> Value {
    (1..tokens)
        .map(|m| chat_body("gpt-4o", false, Some(m)))
        .find(|b| {
            (b.to_string().len() as u64).div_ceil(2) + b["max_tokens"].as_u64().unwrap_or(0)
                == tokens
        })
        .expect("a max_tokens that makes the reservation")
}

fn token_world(queue: Option<&str>) -> LimitsWorld {
    let queue = queue
        .map(|q| format!("concurrency = 20\nqueue = \"{q}\"\n"))
        .unwrap_or_default();
    limits_world(
        &format!(
            "{SECRET_TOML}[limits.tokens]\nllm_tokens = \"300/day\"\n{queue}{}",
            provider_rule("openai", OPENAI_HOST, "\"tokens\"")
        ),
        |b| b,
    )
}

/// 20 calls, each reserving 155 tokens of 300; each reports 12 + 8 tokens used. With
/// `hold_first`, the first is held by the fake (in flight, reserving) until the other 19, sent
/// at once, have their answers.
fn twenty_calls(w: &LimitsWorld, hold_first: bool) -> Vec<crate::support::clients::RawResponse> {
    let body = chat_reserving(155);
    let url = w.url(OPENAI_HOST, "/v1/chat/completions");
    let call = || {
        Call::post(&url, &body)
            .header("x-fake-input-tokens", "12")
            .header("x-fake-output-tokens", "8")
    };
    std::thread::scope(|s| {
        let held = hold_first.then(|| {
            let held = call().header("x-fake-hold", "1");
            let h = s.spawn(move || w.run(&held));
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while w.providers.received().is_empty() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the held call never arrived"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            h
        });
        let rest = if hold_first { 19 } else { 20 };
        let handles: Vec<_> = (0..rest)
            .map(|_| {
                let c = call();
                s.spawn(move || w.run(&c))
            })
            .collect();
        let mut answers: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("call"))
            .collect();
        if let Some(h) = held {
            w.providers.release(1);
            answers.push(h.join().expect("held call"));
        }
        answers
    })
}

#[test]
fn calls_refused_for_reservations_in_flight_are_budget_reserved_not_exhausted() {
    let w = token_world(None);
    let answers = twenty_calls(&w, true);
    let served = answers.iter().filter(|a| a.status == 200).count();
    assert_eq!(served, 1, "{answers:#?}");
    for a in answers.iter().filter(|a| a.status != 200) {
        assert!(is_refusal(a, 429, "budget_reserved"), "{a:#?}");
        assert_eq!(header_num(a, "retry-after"), 1, "{a:#?}");
        assert!(
            a.text().contains("reserved by requests still in flight"),
            "{a:#?}"
        );
    }
    // Settled at 20 tokens: 280 left, a call reserving 155 fits again.
    let again = w.run(
        &Call::post(
            &w.url(OPENAI_HOST, "/v1/chat/completions"),
            &chat_reserving(155),
        )
        .header("x-fake-input-tokens", "12")
        .header("x-fake-output-tokens", "8"),
    );
    assert_eq!(again.status, 200, "{again:#?}");
    let records = w.lk.wait_audit(21);
    assert_eq!(
        records
            .iter()
            .filter(|r| r["reason"] == "budget_reserved")
            .count(),
        19,
        "{records:#?}"
    );
    w.sweep();
}

#[test]
fn with_a_queue_calls_wait_for_settles_and_are_served_as_room_comes_free() {
    let w = token_world(Some("20s"));
    let answers = twenty_calls(&w, false);
    // One call at a time fits (155 + 155 > 300); each settles at 20 tokens, so after seven the
    // eighth is the last that fits (7 * 20 + 155 <= 300). The rest are refused for what was
    // spent, not for reservations.
    let served = answers.iter().filter(|a| a.status == 200).count();
    assert_eq!(served, 8, "{answers:#?}");
    for a in answers.iter().filter(|a| a.status != 200) {
        assert!(is_refusal(a, 429, "budget_exhausted"), "{a:#?}");
    }
    w.sweep();
}

#[test]
fn a_model_variant_is_unpriced_not_priced_as_its_cheaper_sibling() {
    let w = limits_world(
        &format!(
            "{SECRET_TOML}[limits.money]\nspend = \"5 USD/day\"\n[prices.\"gpt-5-pro\"]\ninput = 15.0\noutput = 120.0\n{}",
            provider_rule("openai", OPENAI_HOST, "\"money\"")
        ),
        |b| b,
    );
    let url = w.url(OPENAI_HOST, "/v1/chat/completions");
    let call = |model: &str| {
        w.run(
            &Call::post(&url, &chat_body(model, false, Some(100)))
                .header("x-fake-input-tokens", "1000")
                .header("x-fake-output-tokens", "100"),
        )
    };
    // o3-pro is not o3: no price, refused under a spend budget, naming the model.
    for variant in ["o3-pro", "gpt-4o-pro", "claude-opus-4-5-thinking"] {
        let r = call(variant);
        assert!(is_refusal(&r, 429, "budget_exhausted"), "{variant}: {r:#?}");
        assert!(
            r.text()
                .contains(&format!("model \"{variant}\" has no price")),
            "{variant}: {r:#?}"
        );
    }
    // A dated snapshot costs what its model costs; an explicit [prices] entry prices a variant.
    assert_eq!(call("gpt-4o-2024-08-06").status, 200);
    assert_eq!(call("gpt-5-pro").status, 200);
    let records = w.lk.wait_audit(5);
    let cost = |model: &str| {
        let r = records
            .iter()
            .find(|r| r["usage"]["model"] == model)
            .unwrap_or_else(|| panic!("no record for {model}: {records:#?}"));
        usage_of(r)["cost"].as_f64().expect("cost")
    };
    // 1000 in, 100 out: gpt-4o at 2.5 / 10 USD per million; gpt-5-pro at 15 / 120.
    assert!((cost("gpt-4o-2024-08-06") - 0.0035).abs() < 1e-9);
    assert!((cost("gpt-5-pro") - 0.027).abs() < 1e-9);
    w.sweep();
}

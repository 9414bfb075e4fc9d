//! LLM usage accounting, provider by provider: the model and tokens each response reports —
//! OpenAI chat and responses, Anthropic messages, Gemini generateContent, streaming and not —
//! land in the audit record's `usage`, while the client gets the response unchanged and a
//! stream's events as they come (the first reaches the client before the provider has sent
//! the last). `include_usage = true` adds `stream_options.include_usage` to a streaming OpenAI
//! chat call; without it such a stream reports no usage and the reservation is charged.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::providers::{
    anthropic_body, charge, chat_body, completion_text, gemini_body, limits_world, num,
    provider_rule, responses_body, streamed_text, usage_of, Api, Call, LimitsWorld, ANTHROPIC_HOST,
    GEMINI_HOST, OPENAI_HOST, SECRET_TOML,
};

const METER: &str = "[limits.meter]\nllm_tokens = \"10M/day\"\n";

fn world() -> LimitsWorld {
    let rules = [
        provider_rule("openai", OPENAI_HOST, "\"meter\""),
        provider_rule("anthropic", ANTHROPIC_HOST, "\"meter\""),
        provider_rule("gemini", GEMINI_HOST, "\"meter\""),
    ]
    .concat();
    limits_world(&format!("{SECRET_TOML}{METER}{rules}"), |b| b)
}

/// One call of each API, streaming or not: (api, host, path, body, model).
fn calls(stream: bool) -> Vec<(Api, &'static str, String, Value, &'static str)> {
    let gemini_path = if stream {
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    } else {
        "/v1beta/models/gemini-2.5-pro:generateContent"
    };
    vec![
        (
            Api::OpenAiChat,
            OPENAI_HOST,
            "/v1/chat/completions".to_string(),
            {
                let mut b = chat_body("gpt-4.1", stream, Some(64));
                if stream {
                    b["stream_options"] = json!({"include_usage": true});
                }
                b
            },
            "gpt-4.1",
        ),
        (
            Api::OpenAiResponses,
            OPENAI_HOST,
            "/v1/responses".to_string(),
            responses_body("gpt-5-mini", stream, Some(64)),
            "gpt-5-mini",
        ),
        (
            Api::Anthropic,
            ANTHROPIC_HOST,
            "/v1/messages".to_string(),
            anthropic_body("claude-haiku-4-5", stream, 64),
            "claude-haiku-4-5",
        ),
        (
            Api::Gemini,
            GEMINI_HOST,
            gemini_path.to_string(),
            gemini_body(Some(64)),
            "gemini-2.5-pro",
        ),
    ]
}

#[test]
fn every_provider_api_streaming_and_not_reports_its_usage_into_the_audit_record() {
    let w = world();
    let mut expected = Vec::new();
    for stream in [false, true] {
        for (i, (api, host, path, body, model)) in calls(stream).into_iter().enumerate() {
            // Distinct numbers for every call, so each record is found by its input.
            let n = i as u64 + if stream { 10 } else { 0 };
            let (input, cached, output) = (100 + n, 10 + n, 20 + n);
            let resp = w.run(
                &Call::post(&w.url(host, &path), &body)
                    .header("x-fake-input-tokens", &input.to_string())
                    .header("x-fake-cached-tokens", &cached.to_string())
                    .header("x-fake-output-tokens", &output.to_string()),
            );
            assert_eq!(resp.status, 200, "{api:?} stream={stream}: {resp:#?}");
            if stream {
                assert!(
                    resp.header("content-type")
                        .is_some_and(|c| c.starts_with("text/event-stream")),
                    "{resp:#?}"
                );
                assert_eq!(
                    streamed_text(api, &resp.text()),
                    completion_text(),
                    "{api:?}: the stream reached the client changed: {}",
                    resp.text()
                );
            } else {
                let doc: Value = serde_json::from_slice(&resp.body)
                    .unwrap_or_else(|e| panic!("{api:?}: not JSON ({e}): {resp:#?}"));
                assert!(
                    doc.to_string().contains(&completion_text()),
                    "{api:?}: {doc:#}"
                );
            }
            expected.push((api, stream, path, model, input, cached, output));
        }
    }
    let records = w.lk.wait_audit(8);
    for (api, stream, path, model, input, cached, output) in expected {
        let path_only = path.split('?').next().expect("path");
        let found: Vec<&Value> = records
            .iter()
            .filter(|r| {
                r["path"].as_str().is_some_and(|p| p.starts_with(path_only))
                    && usage_of(r)["input_tokens"] == input
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{api:?} stream={stream}: records {records:#?}"
        );
        let r = found[0];
        assert_record(r, json!({"decision": "allow", "status": 200}));
        assert_record(
            &usage_of(r),
            json!({
                "provider": api.provider(),
                "model": model,
                "input_tokens": input,
                "output_tokens": output,
                "cached_input_tokens": cached,
                "source": "response",
            }),
        );
        assert!(
            usage_of(r)["cost"].as_f64().is_some_and(|c| c > 0.0),
            "a shipped model has a price: {r:#}"
        );
        assert_eq!(
            num(&charge(r, "meter", "llm_tokens"), "charged"),
            input + output,
            "{api:?} stream={stream}: {r:#}"
        );
    }
    w.sweep();
}

#[test]
fn the_openai_and_anthropic_sdks_get_their_completions_and_usage_through_a_metered_rule() {
    let w = world();
    let mut n = 0;
    for (api, host, base, model) in [
        ("openai-chat", OPENAI_HOST, "/v1", "gpt-4o"),
        ("openai-responses", OPENAI_HOST, "/v1", "gpt-4o-mini"),
        ("anthropic", ANTHROPIC_HOST, "", "claude-sonnet-4"),
    ] {
        for stream in [false, true] {
            n += 1;
            let input = 40 + n;
            let results = w.sdk(
                None,
                &json!({
                    "api": api, "base_url": w.url(host, base), "model": model,
                    "stream": stream, "include_usage": true, "max_tokens": 32,
                    "headers": {"x-fake-input-tokens": input.to_string()},
                }),
            );
            let r = &results[0];
            assert_eq!(r["status"], 200, "{api} stream={stream}: {r:#}");
            assert_eq!(r["text"], completion_text(), "{api} stream={stream}: {r:#}");
            assert_eq!(r["model"], model, "{r:#}");
            // What the SDK parsed is what the provider sent.
            let (sdk_in, sdk_out) = match api {
                "openai-chat" => ("prompt_tokens", "completion_tokens"),
                _ => ("input_tokens", "output_tokens"),
            };
            assert_eq!(r["usage"][sdk_out], 32, "{r:#}");
            if api != "anthropic" {
                assert_eq!(r["usage"][sdk_in], input, "{r:#}");
            }
        }
    }
    let records = w.lk.wait_audit(6);
    for r in &records {
        let usage = usage_of(r);
        assert_eq!(usage["source"], "response", "{r:#}");
        assert_eq!(usage["output_tokens"], 32, "{r:#}");
        let input = num(&usage, "input_tokens");
        assert!((41..=46).contains(&input), "{r:#}");
        assert_eq!(
            num(&charge(r, "meter", "llm_tokens"), "charged"),
            input + 32
        );
    }
    let mut inputs: Vec<u64> = records
        .iter()
        .map(|r| num(&usage_of(r), "input_tokens"))
        .collect();
    inputs.sort_unstable();
    assert_eq!(inputs, [41, 42, 43, 44, 45, 46]);
    w.sweep();
}

#[test]
fn a_metered_stream_reaches_the_client_before_the_provider_sends_its_last_event() {
    let w = world();
    for (i, (api, host, path, body, _)) in calls(true).into_iter().enumerate() {
        let mut resp = Call::post(&w.url(host, &path), &body)
            .header("x-fake-gate", "1")
            .stream(&w.lk);
        assert_eq!(resp.status, 200, "{api:?}");
        resp.read_until(
            |seen| String::from_utf8_lossy(seen).contains("Hello"),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| {
            panic!(
                "{api:?}: the first events did not reach the client while the provider held \
                 the last one ({e}); got {:?}",
                String::from_utf8_lossy(&resp.body)
            )
        });
        assert_eq!(
            w.providers.finals_sent(),
            i,
            "{api:?}: the last event was already sent"
        );
        w.providers.release(1);
        resp.read_to_end(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{api:?}: {e}"));
        assert_eq!(w.providers.finals_sent(), i + 1);
        let text = String::from_utf8_lossy(&resp.body).into_owned();
        w.saw("a gated stream", text.as_bytes());
        assert_eq!(streamed_text(api, &text), completion_text(), "{api:?}");
    }
    let records = w.lk.wait_audit(4);
    for r in &records {
        assert_eq!(usage_of(r)["source"], "response", "{r:#}");
        assert_eq!(usage_of(r)["output_tokens"], 64, "{r:#}");
    }
    w.sweep();
}

#[test]
fn include_usage_adds_stream_options_when_the_limit_asks_and_is_off_by_default() {
    let policy = format!(
        "{SECRET_TOML}[limits.with]\nllm_tokens = \"1M/day\"\ninclude_usage = true\n\n\
         [limits.without]\nllm_tokens = \"1M/day\"\n{}{}",
        provider_rule("with", OPENAI_HOST, "\"with\""),
        provider_rule("without", GEMINI_HOST, "\"without\""),
    );
    let w = limits_world(&policy, |b| b);
    let body = chat_body("gpt-4o", true, Some(16));
    let with = w.run(
        &Call::post(&w.url(OPENAI_HOST, "/v1/chat/completions"), &body)
            .header("x-fake-input-tokens", "9"),
    );
    let without = w.run(&Call::post(
        &w.url(GEMINI_HOST, "/v1/chat/completions"),
        &body,
    ));
    assert_eq!((with.status, without.status), (200, 200));

    let answers = w.providers.answers();
    assert_eq!(answers.len(), 2);
    assert!(
        answers[0].include_usage,
        "include_usage = true did not add stream_options"
    );
    assert!(
        !answers[1].include_usage,
        "stream_options added without include_usage"
    );
    let received = w.providers.received();
    let sent: Value = serde_json::from_slice(&received[0].body).expect("JSON body upstream");
    assert_eq!(sent["stream_options"]["include_usage"], true, "{sent:#}");
    assert_eq!(
        sent["messages"], body["messages"],
        "the rest of the body is kept"
    );
    assert_eq!(
        received[1].body,
        body.to_string().into_bytes(),
        "the body is forwarded unchanged by default"
    );
    // The sandbox sees the usage chunk only where it was asked for.
    assert!(with.text().contains("\"choices\":[]"), "{}", with.text());
    assert!(
        !without.text().contains("prompt_tokens"),
        "{}",
        without.text()
    );
    assert_eq!(
        streamed_text(Api::OpenAiChat, &with.text()),
        completion_text()
    );
    assert_eq!(
        streamed_text(Api::OpenAiChat, &without.text()),
        completion_text()
    );

    let records = w.lk.wait_audit(2);
    let by_rule = |rule: &str| {
        records
            .iter()
            .find(|r| r["rule"] == rule)
            .unwrap_or_else(|| panic!("no record for {rule}: {records:#?}"))
    };
    let r = by_rule("with");
    assert_record(
        &usage_of(r),
        json!({"source": "response", "input_tokens": 9, "output_tokens": 16}),
    );
    assert_eq!(num(&charge(r, "with", "llm_tokens"), "charged"), 25);
    // No usage in the stream: the reservation stands as the charge.
    let r = by_rule("without");
    assert_eq!(usage_of(r)["source"], "reserved", "{r:#}");
    assert!(
        num(&charge(r, "without", "llm_tokens"), "charged") >= 16,
        "{r:#}"
    );
    w.sweep();
}

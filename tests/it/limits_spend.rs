//! `spend`: usage turned into money by the price table — a policy's `[prices."MODEL"]` and the
//! shipped table (a dated model name costs what its family costs; cached input has its own
//! price) — charged to a USD budget, reserved up front like tokens.

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::providers::{
    anthropic_body, charge, chat_body, gemini_body, is_refusal, limits_world, num, provider_rule,
    usage_of, with_reason, Call, LimitsWorld, ANTHROPIC_HOST, GEMINI_HOST, OPENAI_HOST,
    SECRET_TOML,
};

const LIMITS: &str = r#"
[limits.money]
spend = "1 USD/day"

[prices."fake-model"]
input  = 1000.0
output = 2000.0

[prices."penny-model"]
input  = 1.0
output = 1.0
"#;

fn world() -> LimitsWorld {
    let rules = [
        provider_rule("openai", OPENAI_HOST, "\"money\""),
        provider_rule("anthropic", ANTHROPIC_HOST, "\"money\""),
        provider_rule("gemini", GEMINI_HOST, "\"money\""),
    ]
    .concat();
    limits_world(&format!("{SECRET_TOML}{LIMITS}{rules}"), |b| b)
}

fn tokens(call: Call, input: u64, cached: u64, output: u64) -> Call {
    call.header("x-fake-input-tokens", &input.to_string())
        .header("x-fake-cached-tokens", &cached.to_string())
        .header("x-fake-output-tokens", &output.to_string())
}

/// The record of the call to `path` (its only one).
fn record_for<'a>(records: &'a [Value], path: &str) -> &'a Value {
    let found: Vec<&Value> = records.iter().filter(|r| r["path"] == path).collect();
    assert_eq!(found.len(), 1, "records for {path}: {records:#?}");
    found[0]
}

fn assert_cost(record: &Value, model: &str, micros: u64) {
    let usage = usage_of(record);
    assert_eq!(usage["model"], model, "{record:#}");
    let cost = usage["cost"]
        .as_f64()
        .unwrap_or_else(|| panic!("no cost: {record:#}"));
    assert!(
        (cost - micros as f64 / 1e6).abs() < 1e-9,
        "cost {cost} USD, expected {micros} micro-USD: {record:#}"
    );
    let c = charge(record, "money", "spend");
    assert_eq!(num(&c, "charged"), micros, "{c:#}");
    assert_eq!(num(&c, "limit_value"), 1_000_000, "{c:#}");
}

#[test]
fn spend_is_priced_from_the_policy_override_and_the_shipped_table() {
    let w = world();
    // The override: 100 input at $1000/M + 10 output at $2000/M = $0.12.
    let a = w.run(&tokens(
        Call::post(
            &w.url(OPENAI_HOST, "/v1/chat/completions"),
            &chat_body("fake-model", false, Some(10)),
        ),
        100,
        0,
        10,
    ));
    assert_eq!(a.status, 200, "{a:#?}");
    // Shipped claude-sonnet-4-5 ($3 in, $0.30 cached, $15 out): 600 fresh + 400 cached input,
    // 200 output = 1800 + 120 + 3000 micro-USD.
    let b = w.run(&tokens(
        Call::post(
            &w.url(ANTHROPIC_HOST, "/v1/messages"),
            &anthropic_body("claude-sonnet-4-5", true, 200),
        ),
        1000,
        400,
        200,
    ));
    assert_eq!(b.status, 200, "{b:#?}");
    // A dated name in the response costs its family's price: gpt-4o ($2.50 in, $10 out).
    let c = w.run(
        &tokens(
            Call::post(
                &w.url(OPENAI_HOST, "/v1/responses"),
                &json!({"model": "gpt-4o", "input": "hi", "max_output_tokens": 100}),
            ),
            1000,
            0,
            100,
        )
        .header("x-fake-model", "gpt-4o-2024-08-06"),
    );
    assert_eq!(c.status, 200, "{c:#?}");
    // Shipped gemini-2.5-flash ($0.30 in, $2.50 out), streamed.
    let d = w.run(&tokens(
        Call::post(
            &w.url(
                GEMINI_HOST,
                "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            ),
            &gemini_body(Some(1000)),
        ),
        10_000,
        0,
        1000,
    ));
    assert_eq!(d.status, 200, "{d:#?}");

    let records = w.lk.wait_audit(4);
    assert_cost(
        record_for(&records, "/v1/chat/completions"),
        "fake-model",
        120_000,
    );
    assert_cost(
        record_for(&records, "/v1/messages"),
        "claude-sonnet-4-5",
        4920,
    );
    assert_cost(
        record_for(&records, "/v1/responses"),
        "gpt-4o-2024-08-06",
        3500,
    );
    let gemini = records
        .iter()
        .find(|r| r["host"] == GEMINI_HOST)
        .expect("gemini record");
    assert_cost(gemini, "gemini-2.5-flash", 5500);
    // One budget, one key: the charges add up.
    let mut used: Vec<u64> = records
        .iter()
        .map(|r| num(&charge(r, "money", "spend"), "used"))
        .collect();
    used.sort_unstable();
    assert_eq!(used.last().copied(), Some(120_000 + 4920 + 3500 + 5500));
    w.sweep();
}

#[test]
fn a_call_whose_priced_reservation_does_not_fit_is_refused_and_an_unpriced_model_too() {
    let w = world();
    let url = w.url(OPENAI_HOST, "/v1/chat/completions");
    // 1000 output tokens at $2000/M reserve $2: over the $1 budget before anything is spent.
    let dear = w.run(&Call::post(
        &url,
        &chat_body("fake-model", false, Some(1000)),
    ));
    assert!(is_refusal(&dear, 429, "budget_exhausted"), "{dear:#?}");
    assert!(dear.text().contains("money"), "{dear:#?}");
    // A model the table does not know has no price: refused rather than counted as free.
    let unknown = w.run(&Call::post(
        &url,
        &chat_body("mystery-model-9", false, Some(5)),
    ));
    assert_eq!(unknown.status, 429, "{unknown:#?}");
    assert!(
        unknown.header("x-latchkey-reason").is_some(),
        "{unknown:#?}"
    );
    assert!(w.providers.received().is_empty());
    // A cheap call still goes.
    let cheap = w.run(&tokens(
        Call::post(&url, &chat_body("fake-model", false, Some(5))),
        10,
        0,
        5,
    ));
    assert_eq!(cheap.status, 200, "{cheap:#?}");
    let records = w.lk.wait_audit(3);
    let refused = with_reason(&records, "budget_exhausted");
    assert!(!refused.is_empty(), "{records:#?}");
    for r in &refused {
        assert_record(
            r,
            json!({"decision": "deny", "status": 429, "rule": "openai", "upstream": null}),
        );
    }
    let ok = with_reason(&records, "allowed");
    assert_eq!(ok.len(), 1, "{records:#?}");
    assert_cost(ok[0], "fake-model", 10 * 1000 + 5 * 2000);
    w.sweep();
}

/// A cost in micro-USD goes into the record as USD (a float) and must come back as the same
/// count for the charge: 123 micro-USD is 0.000123 USD, and 0.000123 × 10^6 in floating point
/// is a hair over 123, which rounding up would charge as 124.
#[test]
fn the_spend_charged_is_the_cost_to_the_micro_dollar() {
    let w = world();
    let url = w.url(OPENAI_HOST, "/v1/chat/completions");
    for (input, output) in [(100, 23), (200, 46), (250, 3)] {
        let resp = w.run(&tokens(
            Call::post(&url, &chat_body("penny-model", false, Some(output))),
            input,
            0,
            output,
        ));
        assert_eq!(resp.status, 200, "{resp:#?}");
    }
    let records = w.lk.wait_audit(3);
    let mut total = 0;
    for r in &records {
        let usage = usage_of(r);
        let micros = num(&usage, "input_tokens") + num(&usage, "output_tokens");
        assert_cost(r, "penny-model", micros);
        total += micros;
    }
    let used = records
        .iter()
        .map(|r| num(&charge(r, "money", "spend"), "used"))
        .max();
    assert_eq!(used, Some(total), "{records:#?}");
    w.sweep();
}

/// The console's limits page: each counter with what is reserved in flight, and the spend by
/// model since latchkey started (from the audit writer's tap, priced as the records are).
#[test]
fn the_console_shows_spend_by_model_and_reservations() {
    let rules = provider_rule("openai", OPENAI_HOST, "\"money\"");
    let w = limits_world(&format!("{SECRET_TOML}{LIMITS}{rules}"), |b| {
        b.arg("--console")
    });
    for _ in 0..2 {
        let a = w.run(&tokens(
            Call::post(
                &w.url(OPENAI_HOST, "/v1/chat/completions"),
                &chat_body("fake-model", false, Some(10)),
            ),
            100,
            0,
            10,
        ));
        assert_eq!(a.status, 200, "{a:#?}");
    }
    // Two calls of $0.12 each. An outcome is written once its response has ended, so the
    // page may lag the client by a moment. The console is open (no admin token): each visit
    // gets a session.
    let row = "<td>openai</td><td>fake-model</td><td>2</td><td>200</td><td>20</td><td>0.2400</td><td>0</td>";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let text = loop {
        let page =
            crate::support::approvals::http_call(w.lk.admin_addr(), "GET", "/ui/limits", &[], b"");
        assert_eq!(page.status, 200, "{page:#?}");
        let text = page.text();
        if text.contains(row) || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(text.contains("<th>reserved in flight</th>"), "{text}");
    assert!(text.contains(row), "no spend row {row:?} in {text}");
    assert!(
        text.contains("<strong>0.2400 USD</strong> in all"),
        "{text}"
    );
}

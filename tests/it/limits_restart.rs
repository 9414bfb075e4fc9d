//! The embedded store persists counters: latchkey killed with `kill -9` and started again on
//! the same `--state sqlite:PATH` still knows what a daily token budget has used and what a
//! request bucket has left.

use std::time::Duration;

use serde_json::json;

use crate::support::admin::{admin_get, json_body};
use crate::support::assert_record;
use crate::support::providers::{
    charge, chat_body, is_refusal, limits_latchkey, num, provider_rule, sweep_latchkey,
    with_reason, Call, Providers, GEMINI_HOST, OPENAI_HOST, SECRET_TOML,
};
use crate::support::TestCa;

const LIMITS: &str = r#"
[limits.daily]
llm_tokens = "1000/day"

[limits.rate]
requests = "2/min"
"#;

#[test]
fn a_restart_on_the_same_sqlite_state_keeps_a_day_budget_and_a_request_bucket() {
    let ca = TestCa::new();
    let providers = Providers::start(&ca);
    let policy = format!(
        "{SECRET_TOML}{LIMITS}{}{}",
        provider_rule("llm", OPENAI_HOST, "\"daily\""),
        provider_rule("api", GEMINI_HOST, "\"rate\""),
    )
    .replace("PORT", &providers.port().to_string());
    let dir = tempfile::tempdir().expect("state dir");
    let state = format!("sqlite:{}", dir.path().join("state.db").display());
    let url = |host: &str, path: &str| format!("https://{host}:{}{path}", providers.port());
    let llm = |max: u64| {
        Call::post(
            &url(OPENAI_HOST, "/v1/chat/completions"),
            &chat_body("gpt-4o", false, Some(max)),
        )
        .header("x-fake-input-tokens", "200")
    };
    let ping = Call::post(&url(GEMINI_HOST, "/ping"), &json!({}));

    let mut first = limits_latchkey(&ca, &policy, |b| b.arg("--state").arg(&state));
    // 2 × (200 in + 100 out) = 600 of the day's 1000 tokens; the bucket's two requests.
    for _ in 0..2 {
        assert_eq!(llm(100).run(&first).status, 200);
        assert_eq!(ping.run(&first).status, 200);
    }
    let before = first.wait_audit(4);
    assert_eq!(with_reason(&before, "allowed").len(), 4, "{before:#?}");
    sweep_latchkey(&first);
    first.signal("KILL");
    assert!(first.wait_exit(Duration::from_secs(5)).is_some());
    drop(first);

    let second = limits_latchkey(&ca, &policy, |b| b.arg("--state").arg(&state));
    let limited = ping.run(&second);
    assert!(
        is_refusal(&limited, 429, "rate_limited"),
        "the bucket was refilled by the restart: {limited:#?}"
    );
    // 400 tokens left: a 500-token reservation does not fit, a 100-token one does.
    let greedy = llm(500).run(&second);
    assert!(
        is_refusal(&greedy, 429, "budget_exhausted"),
        "the budget was reset by the restart: {greedy:#?}"
    );
    let fits = llm(100).run(&second);
    assert_eq!(fits.status, 200, "{fits:#?}");
    assert_eq!(providers.received().len(), 5);

    let after = second.wait_audit(3);
    let rate = with_reason(&after, "rate_limited");
    assert_record(rate[0], json!({"rule": "api", "status": 429}));
    let greedy_record = with_reason(&after, "budget_exhausted")[0];
    assert_eq!(
        num(&charge(greedy_record, "daily", "llm_tokens"), "used"),
        600,
        "{greedy_record:#}"
    );
    let ok = with_reason(&after, "allowed")[0];
    assert_eq!(
        num(&charge(ok, "daily", "llm_tokens"), "used"),
        900,
        "{ok:#}"
    );

    // The admin API agrees.
    let resp = admin_get(&second, "/limits");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let text = json_body(&resp).to_string();
    assert!(text.contains("daily") && text.contains("900"), "{text}");
    sweep_latchkey(&second);
}

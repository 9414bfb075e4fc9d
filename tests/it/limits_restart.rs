//! The embedded store persists budget counters: latchkey killed with `kill -9` and started
//! again on the same `--state sqlite:PATH` still knows what a daily token budget and an
//! exfiltration budget have used. (Request buckets live in memory on the embedded store and
//! start full after a restart: book "Several replicas, restarts, and a store that is down".)

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

[limits.exfil]
bytes_up = "1500B/day"
"#;

#[test]
fn a_restart_on_the_same_sqlite_state_keeps_a_token_budget_and_an_exfiltration_budget() {
    let ca = TestCa::new();
    let providers = Providers::start(&ca);
    let policy = format!(
        "{SECRET_TOML}{LIMITS}{}{}",
        provider_rule("llm", OPENAI_HOST, "\"daily\""),
        provider_rule("api", GEMINI_HOST, "\"exfil\""),
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
    let upload =
        |n: usize| Call::post(&url(GEMINI_HOST, "/upload"), &json!(null)).raw_body(vec![b'u'; n]);

    let mut first = limits_latchkey(&ca, &policy, |b| b.arg("--state").arg(&state));
    // 2 × (200 in + 100 out) = 600 of the day's 1000 tokens; 2 × (400 + the request head) of
    // its 1500 bytes.
    for _ in 0..2 {
        assert_eq!(llm(100).run(&first).status, 200);
        assert_eq!(upload(400).run(&first).status, 200);
    }
    let before = first.wait_audit(4);
    assert_eq!(with_reason(&before, "allowed").len(), 4, "{before:#?}");
    let spent = before
        .iter()
        .filter(|r| r["rule"] == "api")
        .map(|r| num(&charge(r, "exfil", "bytes_up"), "used"))
        .max()
        .expect("uploads charged");
    let left = 1500 - spent;
    assert!((250..700).contains(&left), "{before:#?}");
    sweep_latchkey(&first);
    // The embedded store writes counters every 250 ms: a kill -9 right after a charge may
    // forget it (the book). Past that, nothing is forgotten.
    std::thread::sleep(Duration::from_millis(600));
    first.signal("KILL");
    assert!(first.wait_exit(Duration::from_secs(5)).is_some());
    drop(first);

    let second = limits_latchkey(&ca, &policy, |b| b.arg("--state").arg(&state));
    // `left` bytes left: a body of that many does not fit beside its head; one 250 smaller does
    // (a head is shorter).
    let big = upload(left as usize).run(&second);
    assert!(
        is_refusal(&big, 429, "budget_exhausted"),
        "the exfiltration budget was reset by the restart: {big:#?}"
    );
    assert_eq!(upload(left as usize - 250).run(&second).status, 200);
    // 400 tokens left: a 500-token reservation does not fit, a 100-token one does.
    let greedy = llm(500).run(&second);
    assert!(
        is_refusal(&greedy, 429, "budget_exhausted"),
        "the budget was reset by the restart: {greedy:#?}"
    );
    let fits = llm(100).run(&second);
    assert_eq!(fits.status, 200, "{fits:#?}");
    assert_eq!(providers.received().len(), 6);

    let after = second.wait_audit(4);
    let refused_upload = after
        .iter()
        .find(|r| r["rule"] == "api" && r["reason"] == "budget_exhausted")
        .unwrap_or_else(|| panic!("{after:#?}"));
    assert_record(refused_upload, json!({"status": 429, "upstream": null}));
    assert_eq!(
        num(&charge(refused_upload, "exfil", "bytes_up"), "used"),
        spent
    );
    let greedy_record = after
        .iter()
        .find(|r| r["rule"] == "llm" && r["reason"] == "budget_exhausted")
        .unwrap_or_else(|| panic!("{after:#?}"));
    assert_eq!(
        num(&charge(greedy_record, "daily", "llm_tokens"), "used"),
        600,
        "{greedy_record:#}"
    );
    let ok = after
        .iter()
        .find(|r| r["rule"] == "llm" && r["reason"] == "allowed")
        .unwrap_or_else(|| panic!("{after:#?}"));
    assert_eq!(
        num(&charge(ok, "daily", "llm_tokens"), "used"),
        900,
        "{ok:#}"
    );

    // The admin API agrees.
    let resp = admin_get(&second, "/limits");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let body = json_body(&resp);
    let used = |limit: &str| {
        body["counters"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["limit"] == limit)
            .and_then(|c| c["used"].as_u64())
    };
    assert_eq!(used("daily"), Some(900), "{body:#}");
    let exfil = used("exfil").expect("exfil counter");
    assert!(exfil > spent + left - 250 && exfil <= 1500, "{body:#}");
    sweep_latchkey(&second);
}

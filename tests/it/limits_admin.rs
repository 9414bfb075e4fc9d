//! Seeing limits: `GET /limits` on the admin API shows each limit's counters per key,
//! `/metrics` has used and remaining gauges per limit and key, and `latchkey explain` lists
//! the limits a request would be charged (from its rule and its identity).

use serde_json::{json, Value};

use crate::support::admin::{admin_get, json_body, metrics};
use crate::support::assert_record;
use crate::support::providers::{
    charge, chat_body, identities_toml, limits_world, num, provider_rule, user, Call, OPENAI_HOST,
    SECRET_TOML,
};
use crate::support::{policy_dir, run_cli};

const LIMITS: &str = r#"
[limits.llm]
llm_tokens = "10000/day"
requests   = "50/min"

[limits.agent-cap]
bytes_up = "1MB/day"
"#;

fn policy() -> String {
    format!(
        "{SECRET_TOML}{LIMITS}{}\n{}",
        provider_rule("openai", OPENAI_HOST, "\"llm\""),
        identities_toml(&[("agent", "\"agent-cap\"")]),
    )
}

#[test]
fn get_limits_and_metrics_show_what_each_key_used_and_has_left() {
    let w = limits_world(&policy(), |b| b);
    for input in [300, 500] {
        let resp = w.run(
            &Call::post(
                &w.url(OPENAI_HOST, "/v1/chat/completions"),
                &chat_body("gpt-4o", false, Some(100)),
            )
            .user(&user("agent"))
            .header("x-fake-input-tokens", &input.to_string()),
        );
        assert_eq!(resp.status, 200, "{resp:#?}");
    }
    let records = w.lk.wait_audit(2);
    let used_tokens = 300 + 100 + 500 + 100;
    let last = records
        .iter()
        .map(|r| num(&charge(r, "llm", "llm_tokens"), "used"))
        .max();
    assert_eq!(last, Some(used_tokens));
    let up: u64 = records
        .iter()
        .map(|r| {
            let c = charge(r, "agent-cap", "bytes_up");
            assert_eq!(c["key"], format!("identity:agent@{OPENAI_HOST}"), "{c:#}");
            num(&c, "charged")
        })
        .sum();
    for r in &records {
        assert_record(
            r,
            json!({"identity": "agent", "rule": "openai", "status": 200}),
        );
    }

    let resp = admin_get(&w.lk, "/limits");
    assert_eq!(resp.status, 200, "{resp:#?}");
    w.saw("GET /limits", resp.text().as_bytes());
    let body = json_body(&resp);
    let declared: Vec<&str> = body["limits"]
        .as_array()
        .unwrap_or_else(|| panic!("GET /limits has no limits: {body:#}"))
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(declared, ["agent-cap", "llm"], "{body:#}");
    assert_eq!(
        body["prices"]["date"].as_str().map(str::len),
        Some(10),
        "{body:#}"
    );
    let counter = |limit: &str, measure: &str| -> Value {
        body["counters"]
            .as_array()
            .unwrap_or_else(|| panic!("GET /limits has no counters: {body:#}"))
            .iter()
            .find(|c| c["limit"] == limit && c["measure"] == measure)
            .unwrap_or_else(|| panic!("no {limit}/{measure} counter: {body:#}"))
            .clone()
    };
    let tokens = counter("llm", "llm_tokens");
    assert_record(
        &tokens,
        json!({"key": "identity:agent", "used": used_tokens, "limit_value": 10_000,
               "remaining": 10_000 - used_tokens}),
    );
    assert!(tokens["resets_at"].is_string(), "{tokens:#}");
    let requests = counter("llm", "requests");
    assert_record(
        &requests,
        json!({"key": "identity:agent", "limit_value": 50}),
    );
    let bytes = counter("agent-cap", "bytes_up");
    assert_record(
        &bytes,
        json!({"key": format!("identity:agent@{OPENAI_HOST}"), "used": up,
               "limit_value": 1_000_000}),
    );

    let m = metrics(&w.lk);
    w.saw("/metrics", m.text.as_bytes());
    let labels = [
        ("limit", "llm"),
        ("measure", "llm_tokens"),
        ("key", "identity:agent"),
    ];
    let used = m.samples("latchkey_limit_used", &labels);
    assert!(
        used.iter().any(|s| s.value == used_tokens as f64),
        "no latchkey_limit_used of {used_tokens} for llm: {used:#?}\n{}",
        m.text
    );
    let remaining = m.samples("latchkey_limit_remaining", &labels);
    assert!(
        remaining
            .iter()
            .any(|s| s.value == (10_000 - used_tokens) as f64),
        "no latchkey_limit_remaining of {} for llm: {remaining:#?}\n{}",
        10_000 - used_tokens,
        m.text
    );
    assert_eq!(m.family_of("latchkey_limit_used").kind, "gauge");
    assert_eq!(m.family_of("latchkey_limit_remaining").kind, "gauge");
    w.sweep();
}

#[test]
fn explain_lists_the_limits_a_request_would_be_charged() {
    let policy = policy().replace("PORT", "443");
    let dir = policy_dir(&[("main.toml", &policy)]);
    let url = format!("https://{OPENAI_HOST}/v1/chat/completions");
    let out = run_cli([
        "explain",
        "--policies",
        dir.path().to_str().expect("UTF-8 path"),
        "--identity",
        "agent",
        "POST",
        &url,
    ]);
    assert_eq!(out.code(), Some(0), "{out:#?}");
    for needle in [
        "llm (per identity): requests 50/min, llm_tokens 10000/day",
        "agent-cap (per identity): bytes_up 1000000 bytes/day per host",
    ] {
        assert!(
            out.stdout.contains(needle),
            "explain does not list {needle}:\n{}",
            out.stdout
        );
    }
    let json_out = run_cli([
        "explain",
        "--policies",
        dir.path().to_str().expect("UTF-8 path"),
        "--identity",
        "agent",
        "--json",
        "POST",
        &url,
    ]);
    let v: Value = serde_json::from_str(json_out.stdout.trim())
        .unwrap_or_else(|e| panic!("explain --json printed no JSON ({e}): {json_out:#?}"));
    let limits = v["limits"]
        .as_array()
        .unwrap_or_else(|| panic!("explain --json has no limits: {v:#}"));
    let names: Vec<&str> = limits.iter().filter_map(|l| l["name"].as_str()).collect();
    assert!(
        names.contains(&"llm") && names.contains(&"agent-cap") && names.len() == 2,
        "{v:#}"
    );
    let llm = limits.iter().find(|l| l["name"] == "llm").expect("llm");
    assert_record(
        llm,
        json!({"per": "identity", "on_store_error": "deny",
               "measures": {"llm_tokens": "10000/day", "requests": "50/min"}}),
    );
    assert!(
        !out.stdout.contains("tok-limits"),
        "explain printed a token"
    );
}

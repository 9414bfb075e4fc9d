//! Seeing limits: `GET /limits` on the admin API shows each limit's counters per key,
//! `/metrics` has used and remaining gauges per limit and key, and `latchkey explain` lists
//! the limits a request would be charged (from its rule and its identity).

use serde_json::{json, Value};

use crate::support::admin::{admin_get, json_body, metrics};
use crate::support::assert_record;
use crate::support::providers::{
    charge, chat_body, identities_toml, limits_world, num, provider_rule, user, Call,
    OPENAI_HOST, SECRET_TOML,
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

/// Every string and number in `v`, flattened, for finding a value wherever the shape puts it.
fn leaves(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => m.values().for_each(|x| leaves(x, out)),
        Value::Array(a) => a.iter().for_each(|x| leaves(x, out)),
        Value::String(s) => out.push(s.clone()),
        Value::Number(n) => out.push(n.to_string()),
        _ => {}
    }
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
        assert_record(r, json!({"identity": "agent", "rule": "openai", "status": 200}));
    }

    let resp = admin_get(&w.lk, "/limits");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let body = json_body(&resp);
    w.saw("GET /limits", resp.text().as_bytes());
    let mut all = Vec::new();
    leaves(&body, &mut all);
    for needle in [
        "llm".to_string(),
        "agent-cap".to_string(),
        "identity:agent".to_string(),
        used_tokens.to_string(),
        (10_000 - used_tokens).to_string(),
        up.to_string(),
    ] {
        assert!(
            all.iter().any(|v| v == &needle || v.contains(&needle)),
            "GET /limits does not show {needle}: {body:#}"
        );
    }

    let m = metrics(&w.lk);
    w.saw("/metrics", m.text.as_bytes());
    let used = m.samples("latchkey_limit_used", &[("limit", "llm")]);
    assert!(
        used.iter().any(|s| s.value == used_tokens as f64),
        "no latchkey_limit_used of {used_tokens} for llm: {used:#?}\n{}",
        m.text
    );
    let remaining = m.samples("latchkey_limit_remaining", &[("limit", "llm")]);
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
    for needle in ["llm", "agent-cap", "llm_tokens", "bytes_up"] {
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
    let mut all = Vec::new();
    leaves(&v, &mut all);
    for needle in ["llm", "agent-cap"] {
        assert!(all.iter().any(|s| s == needle), "{v:#}");
    }
    assert!(!out.stdout.contains("tok-limits"), "explain printed a token");
}

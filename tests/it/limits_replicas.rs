//! Limits across replicas, on a real `redis-server`: two latchkeys sharing one store enforce
//! one request bucket and one token budget together. With the store gone, a request under a
//! limit is refused `503 limits_unavailable` (fail closed) unless its limit says
//! `on_store_error = "allow"`, in which case it passes and its record says the limit went
//! unchecked; a rule without limits does not need the store.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::admin::{admin_get, json_body};
use crate::support::assert_record;
use crate::support::latchkey::Latchkey;
use crate::support::providers::{
    charge, charges, chat_body, is_refusal, limits_latchkey, num, provider_rule, sweep_latchkey,
    with_reason, Call, Providers, ANTHROPIC_HOST, GEMINI_HOST, OPENAI_HOST, SECRET_TOML,
};
use crate::support::redis::RedisServer;
use crate::support::TestCa;

/// The `GET /limits` counter of `limit`'s budget (its only counter).
fn counter(lk: &Latchkey, limit: &str) -> Value {
    let resp = admin_get(lk, "/limits");
    assert_eq!(resp.status, 200, "{resp:#?}");
    let body = json_body(&resp);
    let found: Vec<&Value> = body["counters"]
        .as_array()
        .unwrap_or_else(|| panic!("GET /limits has no counters: {body:#}"))
        .iter()
        .filter(|c| c["limit"] == limit)
        .collect();
    assert_eq!(found.len(), 1, "{body:#}");
    found[0].clone()
}

/// Waits (up to 5 s) until `lk`'s `GET /limits` shows `used` for `limit`.
fn wait_used(lk: &Latchkey, limit: &str, used: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp = admin_get(lk, "/limits");
        let body = json_body(&resp);
        let now = body["counters"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["limit"] == limit)
            .and_then(|c| c["used"].as_u64());
        if now == Some(used) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{limit} never showed {used} used: {body:#}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_replicas_on_one_redis_share_one_request_bucket_and_one_token_budget() {
    let redis = RedisServer::start();
    let ca = TestCa::new();
    let providers = Providers::start(&ca);
    let policy = format!(
        "{SECRET_TOML}[limits.bucket]\nper = \"global\"\nrequests = \"6/min\"\n\n\
         [limits.budget]\nllm_tokens = \"500/day\"\n{}{}",
        provider_rule("api", GEMINI_HOST, "\"bucket\""),
        provider_rule("llm", OPENAI_HOST, "\"budget\""),
    )
    .replace("PORT", &providers.port().to_string());
    let state = redis.url();
    let a = limits_latchkey(&ca, &policy, |b| b.arg("--state").arg(&state));
    let b = limits_latchkey(&ca, &policy, |b| b.arg("--state").arg(&state));
    let url = |host: &str, path: &str| format!("https://{host}:{}{path}", providers.port());

    // Ten requests at once, five through each replica: six tokens between them.
    let ping = Call::post(&url(GEMINI_HOST, "/ping"), &json!({}));
    let barrier = Barrier::new(10);
    let statuses: Vec<u16> = thread::scope(|s| {
        let handles: Vec<_> = (0..10)
            .map(|i| {
                let (lk, ping, barrier) = (if i % 2 == 0 { &a } else { &b }, &ping, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    ping.run(lk).status
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ping"))
            .collect()
    });
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        6,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        4,
        "{statuses:?}"
    );

    // A spends 300 tokens; B then has 200 left and refuses a 300-token reservation.
    let llm = |max: u64| {
        Call::post(
            &url(OPENAI_HOST, "/v1/chat/completions"),
            &chat_body("gpt-4o", false, Some(max)),
        )
        .header("x-fake-input-tokens", "200")
    };
    assert_eq!(llm(100).run(&a).status, 200);
    // On a shared store the settle lands in the background: wait until the store has it.
    wait_used(&a, "budget", 300);
    let refused = llm(300).run(&b);
    assert!(
        is_refusal(&refused, 429, "budget_exhausted"),
        "B did not see A's spending: {refused:#?}"
    );
    assert_eq!(
        providers.received().len(),
        7,
        "six pings and one call upstream"
    );

    let on_a = a.wait_audit(6);
    let on_b = b.wait_audit(6);
    let all: Vec<Value> = on_a.iter().chain(&on_b).cloned().collect();
    let pings: Vec<&Value> = all.iter().filter(|r| r["path"] == "/ping").collect();
    assert_eq!(pings.len(), 10);
    assert_eq!(with_reason(&all, "rate_limited").len(), 4);
    for r in &pings {
        assert_eq!(charge(r, "bucket", "requests")["key"], "global", "{r:#}");
    }
    let b_refusal = with_reason(&on_b, "budget_exhausted");
    assert_eq!(b_refusal.len(), 1, "{on_b:#?}");
    assert_eq!(
        num(&charge(b_refusal[0], "budget", "llm_tokens"), "used"),
        300
    );
    // Each replica's /limits reads the shared counter from the store.
    for lk in [&a, &b] {
        assert_eq!(counter(lk, "budget")["used"], 300);
    }
    sweep_latchkey(&a);
    sweep_latchkey(&b);
}

#[test]
fn with_the_store_down_a_limited_request_gets_503_unless_its_limit_allows() {
    let redis = RedisServer::start();
    let ca = TestCa::new();
    let providers = Providers::start(&ca);
    let policy = format!(
        "{SECRET_TOML}[limits.strict]\nrequests = \"100/min\"\n\n\
         [limits.lenient]\nrequests = \"100/min\"\non_store_error = \"allow\"\n{}{}{}",
        provider_rule("strict", OPENAI_HOST, "\"strict\""),
        provider_rule("lenient", GEMINI_HOST, "\"lenient\""),
        provider_rule("free", ANTHROPIC_HOST, ""),
    )
    .replace("PORT", &providers.port().to_string());
    let lk = limits_latchkey(&ca, &policy, |b| b.arg("--state").arg(&redis.url()));
    let call = |host: &str| {
        Call::post(
            &format!("https://{host}:{}/ping", providers.port()),
            &json!({}),
        )
        .run(&lk)
    };
    for host in [OPENAI_HOST, GEMINI_HOST, ANTHROPIC_HOST] {
        assert_eq!(call(host).status, 200, "{host} with the store up");
    }
    drop(redis);

    let strict = call(OPENAI_HOST);
    assert!(
        is_refusal(&strict, 503, "limits_unavailable"),
        "{strict:#?}"
    );
    assert_eq!(providers.received().len(), 3, "the refused request left");
    let lenient = call(GEMINI_HOST);
    assert_eq!(lenient.status, 200, "{lenient:#?}");
    let free = call(ANTHROPIC_HOST);
    assert_eq!(free.status, 200, "{free:#?}");
    assert_eq!(providers.received().len(), 5);

    let records = lk.wait_audit(6);
    let down = &records[3..];
    let by_rule = |rule: &str| {
        down.iter()
            .find(|r| r["rule"] == rule)
            .unwrap_or_else(|| panic!("no record for {rule}: {down:#?}"))
    };
    assert_record(
        by_rule("strict"),
        json!({"reason": "limits_unavailable", "decision": "deny", "status": 503,
               "upstream": null}),
    );
    let r = by_rule("lenient");
    assert_record(r, json!({"reason": "allowed", "status": 200}));
    assert_eq!(charge(r, "lenient", "requests")["unchecked"], true, "{r:#}");
    let r = by_rule("free");
    assert_record(r, json!({"reason": "allowed", "status": 200}));
    assert!(charges(r).is_empty(), "{r:#}");
    // The store's address may be named; nothing else leaks.
    sweep_latchkey(&lk);
}

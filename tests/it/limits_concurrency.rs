//! `concurrency = N` with `queue = "…"`: at most N requests in flight per key. One over the cap
//! waits up to `queue` for a slot: it goes through if one frees in time, else it is
//! `429 rate_limited` and never reaches the upstream.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::assert_record;
use crate::support::providers::{
    charge, is_refusal, limits_world, provider_rule, with_reason, Call, LimitsWorld, OPENAI_HOST,
    SECRET_TOML,
};

fn world(concurrency: u32, queue: &str) -> LimitsWorld {
    limits_world(
        &format!(
            "{SECRET_TOML}[limits.slots]\nconcurrency = {concurrency}\nqueue = \"{queue}\"\n{}",
            provider_rule("openai", OPENAI_HOST, "\"slots\"")
        ),
        |b| b,
    )
}

/// A request the fake holds until [`Providers::release`].
fn held(w: &LimitsWorld, n: u32) -> Call {
    Call::post(&w.url(OPENAI_HOST, "/upload"), &json!({"held": n})).header("x-fake-hold", "1")
}

fn quick(w: &LimitsWorld) -> Call {
    Call::post(&w.url(OPENAI_HOST, "/upload"), &json!({"quick": true}))
}

/// Waits (up to 5 s) until the fake has received `n` requests.
fn wait_received(w: &LimitsWorld, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while w.providers.received().len() < n {
        assert!(
            Instant::now() < deadline,
            "the fake received {} requests, expected {n}",
            w.providers.received().len()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_third_request_over_a_cap_of_two_waits_its_queue_then_gets_429() {
    let w = world(2, "1s");
    thread::scope(|s| {
        let first = s.spawn(|| w.run(&held(&w, 1)));
        let second = s.spawn(|| w.run(&held(&w, 2)));
        wait_received(&w, 2);

        let started = Instant::now();
        let third = w.run(&quick(&w));
        let waited = started.elapsed();
        assert!(is_refusal(&third, 429, "rate_limited"), "{third:#?}");
        assert!(
            waited >= Duration::from_millis(900),
            "refused after {waited:?}, before its 1 s queue ran out"
        );
        assert!(
            waited < Duration::from_secs(5),
            "refused only after {waited:?}"
        );
        assert_eq!(
            w.providers.received().len(),
            2,
            "the refused request reached the provider"
        );

        w.providers.release(2);
        assert_eq!(first.join().expect("first").status, 200);
        assert_eq!(second.join().expect("second").status, 200);
    });
    // Both slots are free again.
    let fourth = w.run(&quick(&w));
    assert_eq!(fourth.status, 200, "{fourth:#?}");

    let records = w.lk.wait_audit(4);
    let refused = with_reason(&records, "rate_limited");
    assert_eq!(refused.len(), 1, "{records:#?}");
    assert_record(
        refused[0],
        json!({"decision": "deny", "rule": "openai", "status": 429, "upstream": null}),
    );
    let c = charge(refused[0], "slots", "concurrency");
    assert_eq!(c["refused"], true, "{c:#}");
    assert_eq!(c["limit_value"], 2, "{c:#}");
    let allowed = with_reason(&records, "allowed");
    assert_eq!(allowed.len(), 3, "{records:#?}");
    for r in allowed {
        let c = charge(r, "slots", "concurrency");
        assert_eq!(c["charged"], 1, "{c:#}");
        assert_eq!(c["key"], "identity:default", "{c:#}");
        assert!(c.get("refused").is_none(), "{c:#}");
    }
    w.sweep();
}

#[test]
fn a_request_waiting_for_a_slot_goes_through_when_one_frees_within_the_queue() {
    let w = world(1, "5s");
    let w = &w;
    thread::scope(|s| {
        let first = s.spawn(|| w.run(&held(w, 1)));
        wait_received(w, 1);
        let started = Instant::now();
        let second = s.spawn(move || {
            let resp = w.run(&quick(w));
            (resp, started.elapsed())
        });
        thread::sleep(Duration::from_millis(400));
        assert_eq!(
            w.providers.received().len(),
            1,
            "the second request did not wait for the only slot"
        );
        w.providers.release(1);
        assert_eq!(first.join().expect("first").status, 200);
        let (resp, took) = second.join().expect("second");
        assert_eq!(resp.status, 200, "{resp:#?}");
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(5),
            "the queued request took {took:?}"
        );
    });
    assert_eq!(w.providers.received().len(), 2);
    let records = w.lk.wait_audit(2);
    for r in &records {
        assert_record(
            r,
            json!({"decision": "allow", "reason": "allowed", "status": 200}),
        );
        assert_eq!(charge(r, "slots", "concurrency")["charged"], 1, "{r:#}");
    }
    w.sweep();
}

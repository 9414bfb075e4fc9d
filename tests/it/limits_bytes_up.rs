//! `bytes_up`: the exfiltration budget. Request bytes are counted per key **and host**, for
//! uploads with a Content-Length and chunked ones alike; an upload whose bytes do not fit is
//! `429 budget_exhausted` before it reaches the upstream, naming the budget, what is used of
//! it and when it resets.

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::providers::{
    charge, header_num, is_refusal, limits_world, num, on_path, provider_rule, Call, LimitsWorld,
    ANTHROPIC_HOST, OPENAI_HOST, SECRET_TOML,
};

const BUDGET: u64 = 2000;

fn world() -> LimitsWorld {
    limits_world(
        &format!(
            "{SECRET_TOML}[limits.exfil]\nbytes_up = \"2KB/day\"\n{}",
            provider_rule(
                "uploads",
                &format!("{OPENAI_HOST}\", \"{ANTHROPIC_HOST}"),
                "\"exfil\""
            )
        ),
        |b| b,
    )
}

fn upload(w: &LimitsWorld, host: &str, n: usize) -> Call {
    Call::post(&w.url(host, "/upload"), &Value::Null)
        .raw_body(vec![b'x'; n])
        .header("content-type", "application/octet-stream")
}

/// How many bytes of uploads the fake received, complete ones only.
fn received_bytes(w: &LimitsWorld) -> usize {
    w.providers
        .received()
        .iter()
        .filter(|r| r.complete)
        .map(|r| r.body.len())
        .sum()
}

#[test]
fn uploads_with_and_without_a_length_count_and_the_one_that_does_not_fit_never_leaves() {
    let w = world();
    let a = w.run(&upload(&w, OPENAI_HOST, 1200));
    assert_eq!(a.status, 200, "{a:#?}");
    let b = w.run(&upload(&w, OPENAI_HOST, 800).chunked(100));
    assert_eq!(b.status, 200, "{b:#?}");
    assert_eq!(received_bytes(&w), 2000);

    // The budget is spent: neither kind of upload leaves.
    let over = w.run(&upload(&w, OPENAI_HOST, 10));
    assert!(is_refusal(&over, 429, "budget_exhausted"), "{over:#?}");
    assert!(
        over.text().contains("exfil"),
        "the refusal does not name the budget: {over:#?}"
    );
    assert!(
        over.text().contains("has 2000 of 2000 bytes used this day"),
        "the refusal does not say what is used of the budget: {over:#?}"
    );
    assert!(over.text().contains("resets at"), "{over:#?}");
    // Until the day's window ends.
    let retry = header_num(&over, "retry-after");
    assert!((1..=86_400).contains(&retry), "{over:#?}");
    let over_chunked = w.run(&upload(&w, OPENAI_HOST, 10).chunked(5));
    assert!(
        is_refusal(&over_chunked, 429, "budget_exhausted"),
        "{over_chunked:#?}"
    );
    assert_eq!(
        w.providers.received().len(),
        2,
        "a refused upload reached the upstream"
    );

    // Another host has its own budget.
    let elsewhere = w.run(&upload(&w, ANTHROPIC_HOST, 1500));
    assert_eq!(elsewhere.status, 200, "{elsewhere:#?}");

    let records = w.lk.wait_audit(5);
    let on = |host: &str| -> Vec<&Value> { records.iter().filter(|r| r["host"] == host).collect() };
    let openai = on(OPENAI_HOST);
    assert_eq!(openai.len(), 4);
    let mut allowed_used = Vec::new();
    for r in &openai {
        let c = charge(r, "exfil", "bytes_up");
        assert_eq!(c["key"], format!("identity:default@{OPENAI_HOST}"), "{c:#}");
        assert_eq!(c["limit_value"], BUDGET, "{c:#}");
        if r["reason"] == "allowed" {
            assert_eq!(c["charged"], r["bytes_up"], "charged what went up: {r:#}");
            allowed_used.push(c["used"].as_u64().expect("used"));
        } else {
            assert_record(
                r,
                json!({"reason": "budget_exhausted", "decision": "deny", "status": 429,
                       "rule": "uploads", "upstream": null}),
            );
            assert_eq!(c["refused"], true, "{c:#}");
            assert_eq!(c["used"], BUDGET, "{c:#}");
        }
    }
    allowed_used.sort_unstable();
    assert_eq!(allowed_used, [1200, 2000], "{records:#?}");
    let other = on(ANTHROPIC_HOST);
    let c = charge(other[0], "exfil", "bytes_up");
    assert_eq!(
        c["key"],
        format!("identity:default@{ANTHROPIC_HOST}"),
        "{c:#}"
    );
    assert_eq!(c["used"], 1500, "{c:#}");
    w.sweep();
}

#[test]
fn an_upload_larger_than_what_is_left_is_refused_whole_and_a_smaller_one_still_fits() {
    let w = world();
    assert_eq!(w.run(&upload(&w, OPENAI_HOST, 1500)).status, 200);
    // 500 bytes left: 800 is refused up front (its Content-Length says it does not fit).
    let big = w.run(&upload(&w, OPENAI_HOST, 800));
    assert!(is_refusal(&big, 429, "budget_exhausted"), "{big:#?}");
    assert!(
        big.text().contains("has 1500 of 2000 bytes used") && big.text().contains("needs 800"),
        "{big:#?}"
    );
    assert_eq!(w.providers.received().len(), 1);
    let small = w.run(&upload(&w, OPENAI_HOST, 400));
    assert_eq!(small.status, 200, "{small:#?}");
    assert_eq!(received_bytes(&w), 1900);

    let records = w.lk.wait_audit(3);
    let refused: Vec<&Value> = on_path(&records, "/upload")
        .into_iter()
        .filter(|r| r["reason"] == "budget_exhausted")
        .collect();
    assert_eq!(refused.len(), 1, "{records:#?}");
    let c = charge(refused[0], "exfil", "bytes_up");
    assert_eq!(
        (c["charged"].clone(), c["used"].clone()),
        (json!(800), json!(1500))
    );
    w.sweep();
}

#[test]
fn a_chunked_upload_that_outgrows_the_budget_is_cut_off_at_it() {
    const BIG: u64 = 300_000;
    let w = limits_world(
        &format!(
            "{SECRET_TOML}[limits.exfil]\nbytes_up = \"300KB/day\"\n{}",
            provider_rule("uploads", OPENAI_HOST, "\"exfil\"")
        ),
        |b| b,
    );
    // 600 KB in 16 KB chunks against 300 KB: what leaves stops at the budget.
    let chunked = || upload(&w, OPENAI_HOST, 600_000).chunked(16_000);
    let cut = w.run(&chunked());
    assert!(is_refusal(&cut, 429, "budget_exhausted"), "{cut:#?}");
    assert!(cut.text().contains("cut off"), "{cut:#?}");
    let first = w.providers.received();
    assert_eq!(first.len(), 1);
    assert!(!first[0].complete, "the cut upload ended cleanly upstream");
    // Again: whatever the budget had left is all that leaves.
    let again = w.run(&chunked());
    assert!(is_refusal(&again, 429, "budget_exhausted"), "{again:#?}");
    let sent: u64 = w
        .providers
        .received()
        .iter()
        .map(|r| {
            assert!(!r.complete, "{r:#?}");
            r.body.len() as u64
        })
        .sum();
    assert!(sent <= BIG, "{sent} bytes left against a budget of {BIG}");

    let records = w.lk.wait_audit(2);
    for r in &records {
        assert_record(
            r,
            json!({"reason": "budget_exhausted", "decision": "deny", "status": 429}),
        );
        let c = charge(r, "exfil", "bytes_up");
        assert_eq!(c["refused"], true, "the cut is the budget's refusal: {c:#}");
        assert!(num(&c, "used") <= BIG, "{c:#}");
    }
    let charged: u64 = records
        .iter()
        .map(|r| num(&charge(r, "exfil", "bytes_up"), "charged"))
        .sum();
    assert!(
        charged >= sent,
        "{sent} bytes left but only {charged} were charged: {records:#?}"
    );
    w.sweep();
}

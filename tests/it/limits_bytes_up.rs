//! `bytes_up`: the exfiltration budget. Request bytes — the head (request line and headers) and
//! the body — are counted per key **and host**, for uploads with a Content-Length and chunked
//! ones alike, and for body-less requests; a request whose bytes do not fit is
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

/// The bytes of `call`'s head as `bytes_up` counts them: the request line, `host:
/// HOST:PORT`, every header as sent (latchkey's test client adds `connection: close` and the
/// framing header), the blank line.
fn head_bytes(call: &Call) -> u64 {
    let rest = call.url.strip_prefix("https://").expect("https URL");
    let (authority, path) = rest.split_at(rest.find('/').expect("a path"));
    let line = |name: &str, value: &str| name.len() + 2 + value.len() + 2;
    let mut n = call.method.len() + 1 + path.len() + " HTTP/1.1\r\n".len();
    n += line("host", authority) + line("connection", "close");
    n += call.headers.iter().map(|(k, v)| line(k, v)).sum::<usize>();
    n += match call.chunked {
        Some(_) => line("transfer-encoding", "chunked"),
        None if call.method == "GET" && call.body.is_empty() => 0,
        None => line("content-length", &call.body.len().to_string()),
    };
    (n + 2) as u64
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
    let (a_call, b_call) = (
        upload(&w, OPENAI_HOST, 1200),
        upload(&w, OPENAI_HOST, 300).chunked(100),
    );
    let (a_cost, b_cost) = (1200 + head_bytes(&a_call), 300 + head_bytes(&b_call));
    let a = w.run(&a_call);
    assert_eq!(a.status, 200, "{a:#?}");
    let b = w.run(&b_call);
    assert_eq!(b.status, 200, "{b:#?}");
    assert_eq!(received_bytes(&w), 1500);
    let spent = a_cost + b_cost;
    assert!(spent + head_bytes(&upload(&w, OPENAI_HOST, 10)) + 10 > BUDGET);

    // The budget is spent: neither kind of upload leaves.
    let over = w.run(&upload(&w, OPENAI_HOST, 10));
    assert!(is_refusal(&over, 429, "budget_exhausted"), "{over:#?}");
    assert!(
        over.text().contains("exfil"),
        "the refusal does not name the budget: {over:#?}"
    );
    assert!(
        over.text()
            .contains(&format!("has {spent} of 2000 bytes used this day")),
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
    let elsewhere_call = upload(&w, ANTHROPIC_HOST, 1500);
    let elsewhere = w.run(&elsewhere_call);
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
            let body = num(r, "bytes_up");
            let head = if body == 1200 {
                a_cost - 1200
            } else {
                b_cost - 300
            };
            assert_eq!(
                num(&c, "charged"),
                body + head,
                "charged its head and body: {r:#}"
            );
            allowed_used.push(c["used"].as_u64().expect("used"));
        } else {
            assert_record(
                r,
                json!({"reason": "budget_exhausted", "decision": "deny", "status": 429,
                       "rule": "uploads", "upstream": null}),
            );
            assert_eq!(c["refused"], true, "{c:#}");
            assert_eq!(num(&c, "used"), spent, "{c:#}");
        }
    }
    allowed_used.sort_unstable();
    assert_eq!(allowed_used, [a_cost, spent], "{records:#?}");
    let other = on(ANTHROPIC_HOST);
    let c = charge(other[0], "exfil", "bytes_up");
    assert_eq!(
        c["key"],
        format!("identity:default@{ANTHROPIC_HOST}"),
        "{c:#}"
    );
    assert_eq!(num(&c, "used"), 1500 + head_bytes(&elsewhere_call), "{c:#}");
    w.sweep();
}

#[test]
fn an_upload_larger_than_what_is_left_is_refused_whole_and_a_smaller_one_still_fits() {
    let w = world();
    let first = upload(&w, OPENAI_HOST, 1500);
    let used = 1500 + head_bytes(&first);
    assert_eq!(w.run(&first).status, 200);
    // Less than 500 bytes left: 800 is refused up front (its Content-Length says it does not
    // fit).
    let big_call = upload(&w, OPENAI_HOST, 800);
    let big_needs = 800 + head_bytes(&big_call);
    let big = w.run(&big_call);
    assert!(is_refusal(&big, 429, "budget_exhausted"), "{big:#?}");
    assert!(
        big.text()
            .contains(&format!("has {used} of 2000 bytes used"))
            && big.text().contains(&format!("needs {big_needs}")),
        "{big:#?}"
    );
    assert_eq!(w.providers.received().len(), 1);
    let small = w.run(&upload(&w, OPENAI_HOST, 100));
    assert_eq!(small.status, 200, "{small:#?}");
    assert_eq!(received_bytes(&w), 1600);

    let records = w.lk.wait_audit(3);
    let refused: Vec<&Value> = on_path(&records, "/upload")
        .into_iter()
        .filter(|r| r["reason"] == "budget_exhausted")
        .collect();
    assert_eq!(refused.len(), 1, "{records:#?}");
    let c = charge(refused[0], "exfil", "bytes_up");
    assert_eq!(
        (c["charged"].clone(), c["used"].clone()),
        (json!(big_needs), json!(used))
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

/// Body-less requests move bytes too: a query and a header count like a body, on HTTP/1.1 and
/// HTTP/2 alike, and a GET that does not fit never reaches the upstream.
#[test]
fn body_less_requests_are_charged_their_query_and_headers_on_h1_and_h2() {
    let w = limits_world(
        &format!(
            "{SECRET_TOML}[limits.exfil]\nbytes_up = \"4KB/day\"\n{}",
            provider_rule("reads", OPENAI_HOST, "\"exfil\"")
        ),
        |b| b,
    );
    let query = "q".repeat(3000);
    let get = Call {
        method: "GET".into(),
        url: w.url(OPENAI_HOST, &format!("/search?{query}")),
        headers: Vec::new(),
        body: Vec::new(),
        chunked: None,
        user: None,
    };
    let first = w.run(&get);
    assert_eq!(first.status, 200, "{first:#?}");
    let cost = head_bytes(&get);
    assert!(cost > 3000);
    // Over HTTP/2 (curl): a 3 KB header on a GET, with 4000 - cost left: refused up front.
    let header = format!("x-note: {}", "h".repeat(3000));
    let out = crate::support::clients::curl(&w.lk)
        .args(["--http2", "-H", &header, &w.url(OPENAI_HOST, "/notes")])
        .run();
    assert_eq!(out.http_version, "2", "{out:#?}");
    assert!(
        is_refusal(&out.response, 429, "budget_exhausted"),
        "{out:#?}"
    );
    assert!(header_num(&out.response, "retry-after") >= 1, "{out:#?}");
    assert_eq!(
        w.providers.received().len(),
        1,
        "a refused GET reached the upstream"
    );
    // A small GET still fits in what is left (its head only).
    let small = crate::support::clients::curl(&w.lk)
        .args(["--http2", &w.url(OPENAI_HOST, "/small")])
        .run();
    assert_eq!(small.response.status, 200, "{small:#?}");

    let records = w.lk.wait_audit(3);
    let first = on_path(&records, "/search")[0];
    let c = charge(first, "exfil", "bytes_up");
    assert_eq!(num(&c, "charged"), cost, "{c:#}");
    let refused = on_path(&records, "/notes")[0];
    assert_record(
        refused,
        json!({"reason": "budget_exhausted", "status": 429}),
    );
    let c = charge(refused, "exfil", "bytes_up");
    assert!(
        num(&c, "charged") > 3000,
        "the header was not counted: {c:#}"
    );
    let small = on_path(&records, "/small")[0];
    let c = charge(small, "exfil", "bytes_up");
    assert!(num(&c, "used") <= 4000, "{c:#}");
    w.sweep();
}

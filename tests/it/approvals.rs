//! Approvals end to end: a request an `ask` rule (or `[ask] unknown`) holds for a person.
//! Approved within the hold it goes on (once, with the rule's credentials); unanswered it is
//! `403 approval_pending` and its retry goes on after approval; denied it is `403
//! approval_denied` at once; the scopes `once`, a duration and `session` let through what they
//! say and nothing more; an identity asking too often is `429 rate_limited`; nothing secret
//! reaches an approval, the API or the audit log. Every request leaves one audit record and
//! every decision one `method = "APPROVAL"` record.
//!
//! The admin API's own contract (tokens, errors, the CLI, signed links) is in
//! `approvals_admin.rs`.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::approvals::{
    agent, approval_header, ask_policy, ask_world, lab, retry_after, send, sha256_hex, with_method,
    AskWorld, AGENT_TOKEN,
};
use crate::support::secrets::OPENAI;
use crate::support::{assert_denial, assert_record, Echo};

const SCOPES: &str = r#""once", "1h", "session""#;

/// The record of the request whose audit id is `id`.
fn record_of<'a>(records: &'a [Value], id: &str) -> &'a Value {
    records
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no audit record {id}: {records:#?}"))
}

/// Asserts `resp` is `403 approval_pending` from `prod-writes` with an approval id and a
/// retry-after; returns the id.
fn assert_pending(resp: &crate::support::clients::RawResponse) -> String {
    assert_denial(resp, 403, Some("prod-writes"), "approval_pending");
    assert!(retry_after(resp) >= 1, "{resp:#?}");
    approval_header(resp)
}

#[test]
fn a_parked_request_approved_within_its_hold_goes_on_once_with_the_rules_credentials() {
    // A hold far longer than any scheduling delay: the release is timed from the answer, so a
    // loaded machine cannot make the check fail, and a request held to its end cannot pass it.
    let w = ask_world(&ask_policy("30s", SCOPES), |b| b);
    let body = r#"{"name":"widget","count":3,"tags":["a","b"]}"#;
    let url = w.url("api.test", "/v1/items?token=abc123secretish&mode=fast");
    let (out, approved, elapsed) = thread::scope(|s| {
        let held = s.spawn(|| {
            let out = send(&w.lk, Some(&agent()), "POST", &url, Some(body));
            (out, Instant::now())
        });
        let pending = w.admin.wait_pending(1, Duration::from_secs(15));
        let a = pending[0].clone();
        assert_eq!(w.upstream.received().len(), 0, "forwarded before approval");
        let answered = Instant::now();
        let approved = w.admin.approve(a["id"].as_str().expect("id"), Some("once"));
        let (out, done) = held.join().expect("curl thread");
        (out, (a, approved), done.saturating_duration_since(answered))
    });
    let (asked, approved) = approved;
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{resp:#?}");
    assert!(
        elapsed < Duration::from_secs(10),
        "the approved request was released {elapsed:?} after the approval (hold 30 s), not at once"
    );
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.method, "POST");
    assert_eq!(echo.body, body, "the held body reached the upstream whole");
    assert_eq!(echo.header_values("x-test-injected"), ["literal value"]);
    assert_eq!(
        w.upstream.received().len(),
        1,
        "exactly one request upstream"
    );

    // The approval as an approver saw it.
    let port = w.port();
    let id = asked["id"].as_str().expect("id").to_string();
    for (field, want) in [
        ("state", json!("pending")),
        ("identity", json!("agent")),
        (
            "labels",
            json!({"sandbox": "run-42", "owner": "ana", "env": "ci"}),
        ),
        ("method", json!("POST")),
        (
            "url",
            json!(format!(
                "https://api.test:{port}/v1/items?token=REDACTED&mode=REDACTED"
            )),
        ),
        ("scheme", json!("https")),
        ("host", json!("api.test")),
        ("port", json!(port)),
        ("path", json!("/v1/items")),
        ("rule", json!("prod-writes")),
        ("message", json!("Production write")),
        ("scopes", json!(["once", "1h", "session"])),
        ("body_bytes", json!(body.len())),
        ("body_sha256", json!(sha256_hex(body.as_bytes()))),
        ("answer", Value::Null),
    ] {
        assert_eq!(asked[field], want, "approval field {field}: {asked:#}");
    }
    let preview = asked["preview"]
        .as_str()
        .expect("a JSON body has a preview");
    assert!(preview.contains("widget"), "preview: {preview}");
    let text = asked.to_string();
    for hidden in [
        "abc123secretish",
        "fingerprint",
        "\"session\":\"",
        AGENT_TOKEN,
    ] {
        assert!(!text.contains(hidden), "{hidden:?} in the approval: {text}");
    }
    assert_eq!(approved["state"], "approved", "{approved:#}");
    assert_eq!(approved["answer"]["decision"], "approve");
    assert_eq!(approved["answer"]["scope"], "once");
    assert_eq!(approved["answer"]["by"], "ana");
    assert_eq!(approved["answer"]["note"], "looks fine");
    assert_eq!(w.admin.show(&id)["state"], "approved");

    let records = w.lk.wait_audit(2);
    let request = record_of(&records, asked["request_id"].as_str().expect("request_id"));
    assert_record(
        request,
        json!({"method": "POST", "decision": "allow", "reason": "allowed", "status": 200,
               "rule": "prod-writes", "identity": "agent",
               "path": "/v1/items?token=REDACTED&mode=REDACTED"}),
    );
    assert_eq!(request["approval"]["id"], id.as_str(), "{request:#}");
    assert_eq!(request["approval"]["state"], "approved");
    assert_eq!(request["approval"]["scope"], "once");
    let waited = request["approval"]["waited_ms"]
        .as_u64()
        .expect("waited_ms");
    assert!(waited < 6000, "waited_ms {waited}");
    let decisions = with_method(&records, "APPROVAL");
    assert_eq!(decisions.len(), 1, "{records:#?}");
    assert_record(
        decisions[0],
        json!({"decision": "allow", "reason": "allowed", "rule": "prod-writes",
               "identity": "agent", "host": "api.test"}),
    );
    assert_eq!(decisions[0]["approval"]["id"], id.as_str());
    assert_eq!(decisions[0]["approval"]["state"], "approved");
    assert_eq!(decisions[0]["approval"]["by"], "ana");
    assert!(!w.lk.audit_text().contains("abc123secretish"));
}

#[test]
fn unanswered_within_the_hold_is_approval_pending_and_the_retry_goes_on_after_approval() {
    let w = ask_world(&ask_policy("1s", SCOPES), |b| b);
    let url = w.url("api.test", "/v1/deploy");
    let body = r#"{"service":"web","version":"1.2.3"}"#;
    let started = Instant::now();
    let first = send(&w.lk, Some(&agent()), "POST", &url, Some(body));
    let held = started.elapsed();
    let id = assert_pending(first.ok());
    assert!(
        held >= Duration::from_millis(900) && held < Duration::from_secs(15),
        "held {held:?} with hold = 1s"
    );
    let pending = w.admin.list("pending");
    assert_eq!(pending.len(), 1, "{pending:#?}");
    assert_eq!(pending[0]["id"], id.as_str());
    assert_eq!(w.upstream.received().len(), 0);

    let approved = w.admin.approve(&id, None);
    assert_eq!(
        approved["answer"]["scope"], "once",
        "the default is the first scope"
    );
    assert!(w.admin.list("pending").is_empty());
    assert_eq!(w.admin.list("approved").len(), 1);

    let retry = send(&w.lk, Some(&agent()), "POST", &url, Some(body));
    assert_eq!(retry.ok().status, 200, "{retry:#?}");
    assert_eq!(Echo::parse(&retry.ok().text()).body, body);
    assert_eq!(w.upstream.received().len(), 1);

    // A different body is a different request: a new question, not let through.
    let other = send(
        &w.lk,
        Some(&agent()),
        "POST",
        &url,
        Some(r#"{"service":"db","version":"9.9.9"}"#),
    );
    let other_id = assert_pending(other.ok());
    assert_ne!(other_id, id, "a different body reused the approval");
    assert_eq!(
        w.upstream.received().len(),
        1,
        "the different body went upstream"
    );

    let records = w.lk.wait_audit(4);
    let posts = with_method(&records, "POST");
    assert_eq!(posts.len(), 3, "{records:#?}");
    let reasons: Vec<_> = posts
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(reasons, ["approval_pending", "allowed", "approval_pending"]);
    assert_eq!(posts[0]["approval"]["id"], id.as_str());
    assert_eq!(posts[0]["approval"]["state"], "pending");
    assert_eq!(posts[0]["status"], 403);
    assert_eq!(posts[1]["approval"]["id"], id.as_str());
    assert_eq!(posts[1]["approval"]["state"], "approved");
    assert_eq!(posts[2]["approval"]["id"], other_id.as_str());
    assert_eq!(with_method(&records, "APPROVAL").len(), 1);
}

#[test]
fn a_denied_request_is_released_at_once_and_its_retry_is_denied_too() {
    // Timed from the answer with a 30 s hold, as above: robust to load, fails if held to the end.
    let w = ask_world(&ask_policy("30s", SCOPES), |b| b);
    let url = w.url("api.test", "/v1/items/7");
    let (out, id, released_after) = thread::scope(|s| {
        let held = s.spawn(|| {
            let out = send(&w.lk, Some(&agent()), "DELETE", &url, None);
            (out, Instant::now())
        });
        let pending = w.admin.wait_pending(1, Duration::from_secs(15));
        let id = pending[0]["id"].as_str().expect("id").to_string();
        let answered = Instant::now();
        let denied = w.admin.deny(&id);
        assert_eq!(denied["state"], "denied", "{denied:#}");
        assert_eq!(denied["answer"]["scope"], Value::Null);
        let (out, done) = held.join().expect("curl thread");
        (out, id, done.saturating_duration_since(answered))
    });
    assert!(
        released_after < Duration::from_secs(10),
        "the denied request was released {released_after:?} after the denial (hold 30 s)"
    );
    assert_denial(out.ok(), 403, Some("prod-writes"), "approval_denied");
    assert_eq!(approval_header(out.ok()), id);

    let started = Instant::now();
    let retry = send(&w.lk, Some(&agent()), "DELETE", &url, None);
    assert_denial(retry.ok(), 403, Some("prod-writes"), "approval_denied");
    assert_eq!(approval_header(retry.ok()), id);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the retry was held {:?} (hold 30 s)",
        started.elapsed()
    );
    assert_eq!(
        w.upstream.received().len(),
        0,
        "a denied request went upstream"
    );
    assert!(w.admin.list("pending").is_empty());
    assert_eq!(w.admin.list("denied").len(), 1);

    let records = w.lk.wait_audit(3);
    let deletes = with_method(&records, "DELETE");
    assert_eq!(deletes.len(), 2, "{records:#?}");
    for r in &deletes {
        assert_record(
            r,
            json!({"decision": "deny", "reason": "approval_denied", "status": 403,
                   "upstream": null, "rule": "prod-writes"}),
        );
        assert_eq!(r["approval"]["id"], id.as_str());
        assert_eq!(r["approval"]["state"], "denied");
    }
    let decision = with_method(&records, "APPROVAL");
    assert_eq!(decision.len(), 1);
    assert_record(
        decision[0],
        json!({"decision": "deny", "reason": "approval_denied", "rule": "prod-writes"}),
    );
    assert_eq!(decision[0]["approval"]["note"], "not today");
}

/// A request held 1 s and unanswered: its approval id.
fn ask_once(w: &AskWorld, user: &str, path: &str, body: &str) -> String {
    let out = send(
        &w.lk,
        Some(user),
        "POST",
        &w.url("api.test", path),
        Some(body),
    );
    assert_pending(out.ok())
}

#[test]
fn scope_once_lets_one_request_through_and_the_next_identical_one_asks_again() {
    let w = ask_world(&ask_policy("1s", SCOPES), |b| b);
    let body = r#"{"n":1}"#;
    let id = ask_once(&w, &agent(), "/v1/once", body);
    w.admin.approve(&id, Some("once"));
    let url = w.url("api.test", "/v1/once");
    assert_eq!(
        send(&w.lk, Some(&agent()), "POST", &url, Some(body))
            .ok()
            .status,
        200
    );
    let again = send(&w.lk, Some(&agent()), "POST", &url, Some(body));
    let second = assert_pending(again.ok());
    assert_ne!(
        second, id,
        "a used once-approval was asked about again under its old id"
    );
    assert_eq!(w.upstream.received().len(), 1);
    let records = w.lk.wait_audit(4);
    let reasons: Vec<_> = with_method(&records, "POST")
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(reasons, ["approval_pending", "allowed", "approval_pending"]);
}

#[test]
fn a_duration_scope_covers_the_identity_rule_and_host_and_nobody_else() {
    let w = ask_world(&ask_policy("1s", SCOPES), |b| b);
    let id = ask_once(&w, &agent(), "/v1/a", r#"{"a":1}"#);
    let approved = w.admin.approve(&id, Some("1h"));
    assert_eq!(approved["answer"]["scope"], "1h");

    // Another path and body, another method of the same rule: no new question.
    for (method, path, body) in [
        ("POST", "/v1/a", Some(r#"{"a":1}"#)),
        ("POST", "/v2/elsewhere", Some(r#"{"b":2}"#)),
        ("DELETE", "/v1/things/3", None),
    ] {
        let out = send(
            &w.lk,
            Some(&agent()),
            method,
            &w.url("api.test", path),
            body,
        );
        assert_eq!(
            out.ok().status,
            200,
            "{method} {path} under the 1h grant: {out:#?}"
        );
    }
    assert_eq!(w.upstream.received().len(), 3);
    assert!(
        w.admin.list("pending").is_empty(),
        "the grant's requests asked"
    );
    let grants = w.admin.call("GET", "/grants", None);
    assert_eq!(grants.status, 200, "{grants:#?}");
    let grants = crate::support::approvals::json(&grants)["grants"].clone();
    assert!(
        grants
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g["approval"] == id.as_str())),
        "/grants does not list the 1h grant: {grants:#}"
    );

    // Another identity is not covered.
    let lab_id = ask_once(&w, &lab(), "/v2/elsewhere", r#"{"b":2}"#);
    assert_ne!(lab_id, id);
    assert_eq!(w.admin.show(&lab_id)["identity"], "lab");
    assert_eq!(w.upstream.received().len(), 3);

    let records = w.lk.wait_audit(6);
    let under_grant: Vec<_> = records
        .iter()
        .filter(|r| r["reason"] == "allowed" && r["method"] != "APPROVAL")
        .collect();
    assert_eq!(under_grant.len(), 3, "{records:#?}");
    for r in under_grant {
        assert_eq!(r["approval"]["id"], id.as_str(), "{r:#}");
        assert_eq!(r["approval"]["state"], "approved");
        assert_eq!(r["identity"], "agent");
    }
}

#[test]
fn a_session_scope_ends_when_the_identitys_token_changes() {
    const OLD: &str = "tok-agent-session-old-5a1f7c";
    const NEW: &str = "tok-agent-session-new-9d2e4b";
    let dir = tempfile::tempdir().expect("token dir");
    let token_file = dir.path().join("agent.token");
    std::fs::write(&token_file, OLD).expect("write token");
    let policy = ask_policy("1s", SCOPES).replace(
        "token  = \"env:AGENT_TOKEN\"",
        &format!("token  = \"file:{}\"", token_file.display()),
    );
    let w = ask_world(&policy, |b| b);
    let old = format!("agent:{OLD}");
    let new = format!("agent:{NEW}");
    let id = ask_once(&w, &old, "/v1/s", r#"{"s":1}"#);
    w.admin.approve(&id, Some("session"));
    let other = w.url("api.test", "/v1/other");
    let ok = send(&w.lk, Some(&old), "POST", &other, Some(r#"{"s":2}"#));
    assert_eq!(
        ok.ok().status,
        200,
        "same session, another request: {ok:#?}"
    );

    // A new token: a new session.
    std::fs::write(&token_file, NEW).expect("rewrite token");
    let reload = w.admin.call("POST", "/reload", None);
    assert_eq!(reload.status, 200, "{reload:#?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let probe = send(
            &w.lk,
            Some(&new),
            "GET",
            &w.url("api.test", "/v1/probe"),
            None,
        );
        if probe.ok().status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new token is never accepted: {probe:#?}"
        );
        thread::sleep(Duration::from_millis(200));
    }
    let after = send(&w.lk, Some(&new), "POST", &other, Some(r#"{"s":2}"#));
    let again = assert_pending(after.ok());
    assert_ne!(again, id);
    let posts_upstream = w
        .upstream
        .received()
        .iter()
        .filter(|r| r.method == "POST")
        .count();
    assert_eq!(
        posts_upstream, 1,
        "the old session's grant let the new token through"
    );
    // Found by its approval, not by its place in the file: a record is written when its
    // response ends, so the allowed request's record may land after this refusal's.
    let records = w.lk.audit_records();
    let refused = records
        .iter()
        .find(|r| r["method"] == "POST" && r["approval"]["id"] == again.as_str())
        .expect("the new token's POST record");
    assert_record(
        refused,
        json!({"reason": "approval_pending", "identity": "agent"}),
    );
}

#[test]
fn unknown_destinations_are_asked_about_and_go_on_without_credentials() {
    let policy = format!(
        "{}\n[ask]\nunknown = true\nhold = \"30s\"\nmessage = \"An agent wants a new host\"\n",
        ask_policy("1s", SCOPES)
    );
    let w = ask_world(&policy, |b| b);
    let url = w.url("other.test", "/v2/thing?q=1");
    let (out, id) = thread::scope(|s| {
        let held = s.spawn(|| send(&w.lk, Some(&agent()), "GET", &url, None));
        let pending = w.admin.wait_pending(1, Duration::from_secs(15));
        let a = &pending[0];
        assert_eq!(a["rule"], "unknown", "{a:#}");
        assert_eq!(a["denial"], "no_rule", "{a:#}");
        assert_eq!(a["host"], "other.test");
        assert_eq!(a["method"], "GET");
        assert_eq!(a["message"], "An agent wants a new host");
        assert_eq!(
            a["url"],
            format!("https://other.test:{}/v2/thing?q=REDACTED", w.port())
        );
        let id = a["id"].as_str().expect("id").to_string();
        w.admin.approve(&id, None);
        (held.join().expect("curl thread"), id)
    });
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{resp:#?}");
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.path, "/v2/thing?q=1");
    assert!(
        !echo.has_header("x-test-injected"),
        "a rule's credential on an unknown host"
    );
    assert!(!echo.has_header("proxy-authorization"));

    let records = w.lk.wait_audit(2);
    let get = with_method(&records, "GET");
    assert_eq!(get.len(), 1, "{records:#?}");
    assert_record(
        get[0],
        json!({"decision": "allow", "reason": "allowed", "rule": "unknown", "host": "other.test",
               "status": 200, "secrets": []}),
    );
    assert_eq!(get[0]["approval"]["id"], id.as_str());
}

#[test]
fn an_identity_over_its_rate_of_approval_requests_is_rate_limited_and_nobody_is_asked() {
    let policy = format!("{}\n[ask]\nrate = \"3/min\"\n", ask_policy("0s", SCOPES));
    let w = ask_world(&policy, |b| b);
    let url = w.url("api.test", "/v1/spam");
    let mut ids = Vec::new();
    for n in 0..3 {
        let out = send(
            &w.lk,
            Some(&agent()),
            "POST",
            &url,
            Some(&format!(r#"{{"n":{n}}}"#)),
        );
        ids.push(assert_pending(out.ok()));
    }
    let fourth = send(&w.lk, Some(&agent()), "POST", &url, Some(r#"{"n":4}"#));
    assert_denial(fourth.ok(), 429, Some("prod-writes"), "rate_limited");
    let wait = retry_after(fourth.ok());
    assert!((1..=60).contains(&wait), "retry-after {wait}");
    assert!(
        fourth.ok().header("x-latchkey-approval").is_none(),
        "{fourth:#?}"
    );

    let pending = w.admin.list("pending");
    assert_eq!(pending.len(), 3, "{pending:#?}");
    let all = w.admin.list("all");
    assert_eq!(
        all.len(),
        3,
        "the rate-limited request left an approval: {all:#?}"
    );
    for id in &ids {
        assert!(pending.iter().any(|a| a["id"] == id.as_str()));
    }
    // The same request again is the question already asked, not a new one.
    let twin = send(&w.lk, Some(&agent()), "POST", &url, Some(r#"{"n":0}"#));
    assert_eq!(assert_pending(twin.ok()), ids[0]);
    assert_eq!(w.upstream.received().len(), 0);

    let records = w.lk.wait_audit(5);
    let limited: Vec<_> = records
        .iter()
        .filter(|r| r["reason"] == "rate_limited")
        .collect();
    assert_eq!(limited.len(), 1, "{records:#?}");
    assert_record(
        limited[0],
        json!({"decision": "deny", "status": 429, "identity": "agent"}),
    );
}

#[test]
fn secret_values_and_placeholders_never_reach_an_approval_the_api_or_the_audit_log() {
    let policy = r#"
[secrets.openai]
source = "env:TEST_OPENAI_KEY"

[[rules]]
name         = "prod-writes"
hosts        = ["api.test"]
ports        = [PORT]
methods      = ["POST"]
secrets      = ["openai"]
placeholders = ["header", "query", "body"]
ask          = { hold = "0s", scope = ["once"] }
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"

[identities.agent]
token = "env:AGENT_TOKEN"
rules = ["prod-writes"]
"#;
    let w = ask_world(policy, |b| b.env("TEST_OPENAI_KEY", OPENAI));
    let placeholder = "__LATCHKEY_openai__";
    let cases = [
        (
            format!("/v1/chat?key={placeholder}"),
            format!(r#"{{"api_key":"{placeholder}","prompt":"hi"}}"#),
        ),
        (
            format!("/v1/chat?key={OPENAI}"),
            format!(r#"{{"api_key":"{OPENAI}","prompt":"hello"}}"#),
        ),
    ];
    let mut ids = Vec::new();
    for (path, body) in &cases {
        let out = send(
            &w.lk,
            Some(&agent()),
            "POST",
            &w.url("api.test", path),
            Some(body),
        );
        let id = assert_pending(out.ok());
        assert!(!out.ok().text().contains(OPENAI), "{out:#?}");
        ids.push(id.clone());
        w.admin.approve(&id, None);
        let retry = send(
            &w.lk,
            Some(&agent()),
            "POST",
            &w.url("api.test", path),
            Some(body),
        );
        assert_eq!(retry.ok().status, 200, "{retry:#?}");
    }
    // The upstream got the real value (the rule binds it) ...
    let got = w.upstream.received();
    assert_eq!(got.len(), 2);
    assert!(
        got[0].body_text().contains(OPENAI),
        "placeholder not replaced: {:?}",
        got[0]
    );

    // ... and nothing an approver or an auditor reads holds it.
    let mut seen = vec![
        Value::Array(w.admin.list("all")).to_string(),
        w.lk.audit_text(),
        w.lk.stderr_text(),
        w.admin.call("GET", "/grants", None).text(),
    ];
    for id in &ids {
        let a = w.admin.show(id);
        if let Some(p) = a["preview"].as_str() {
            assert!(p.contains("prompt"), "the preview lost the body: {p}");
        }
        seen.push(a.to_string());
    }
    for text in &seen {
        assert!(!text.contains(OPENAI), "the secret value leaked: {text}");
    }
    // Nor the state store's file.
    let mut stored = Vec::new();
    for entry in std::fs::read_dir(w.lk.scratch())
        .expect("scratch dir")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("state.db") {
            stored.push(name.clone());
            let bytes = std::fs::read(entry.path()).expect("read state file");
            assert!(
                !bytes
                    .windows(OPENAI.len())
                    .any(|win| win == OPENAI.as_bytes()),
                "{name} holds the secret value"
            );
        }
    }
    assert!(
        stored.contains(&"state.db".to_string()),
        "no state.db beside the audit log: {stored:?}"
    );
    w.lk.wait_audit(6);
}

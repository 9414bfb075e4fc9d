//! Hot reload and the admin API. A client in a keep-alive session sees new rules on its next
//! request after a policy file changes (file watcher, `SIGHUP`, `POST /reload`); an invalid set
//! keeps the old policy in force and shows its error at `/status` and in the metrics until it is
//! fixed; a request in flight keeps the policy it started with. The admin API answers health,
//! readiness, status, Prometheus metrics (parsed with `prometheus_client`) and explain, can be
//! guarded by a token, and is never reachable through the proxy.

use std::fs::OpenOptions;
use std::io::Write;
use std::thread;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::{json, Value};

use crate::support::admin::{
    admin_get, admin_request, digest, json_body, metrics, metrics_with, reload, status,
    wait_digest_change, wait_status,
};
use crate::support::session::PySession;
use crate::support::upstream::{echo, handler};
use crate::support::{
    api_policy, assert_denial, assert_record, curl, https_world, latchkey, raw_request, Echo,
    Latchkey, Upstream,
};

/// `api` (GET on `paths`) and `other` (anything), on `port`.
fn policy(port: u16, paths: &str) -> String {
    format!(
        r#"
[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
paths   = [{paths}]

[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [{port}]
"#
    )
}

const V1: &str = r#""/v1/**""#;
const V1_V2: &str = r#""/v1/**", "/v2/**""#;

/// Replaces policy file `name` atomically (write aside, then rename), the way a deploy tool
/// would, so the watcher never reads half a file.
fn write_policy(lk: &Latchkey, name: &str, contents: &str) {
    let dir = lk.scratch().join("policies");
    let aside = dir.join(format!(".{name}.new"));
    std::fs::write(&aside, contents).expect("write policy aside");
    std::fs::rename(&aside, dir.join(name)).expect("rename policy into place");
}

fn reason(resp: &crate::support::clients::RawResponse) -> Option<&str> {
    resp.header("x-latchkey-reason")
}

#[test]
fn a_keep_alive_session_sees_the_new_rules_on_its_next_request_after_a_policy_file_changes() {
    let w = https_world(|port| policy(port, V1));
    let port = w.upstream.port();
    let url = |path: &str| format!("https://api.test:{port}{path}");
    let old = digest(&w.lk);

    let mut session = PySession::start(&w.lk, None);
    let resp = session.request("GET", &url("/v1/a"));
    assert_eq!(resp.status, 200, "{resp:#?}");
    let resp = session.request("GET", &url("/v2/a"));
    assert_eq!(resp.status, 403, "{resp:#?}");
    assert_eq!(reason(&resp), Some("path_not_allowed"), "{resp:#?}");

    // Open /v2: the same session's next request is allowed.
    write_policy(&w.lk, "main.toml", &policy(port, V1_V2));
    let new = wait_digest_change(&w.lk, &old);
    let resp = session.request("GET", &url("/v2/a"));
    assert_eq!(resp.status, 200, "after the reload: {resp:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/v2/a");

    // Remove the rule the tunnel was opened under: requests inside the already-open tunnel are
    // decided against the policy in force now, not the one at CONNECT time.
    write_policy(
        &w.lk,
        "main.toml",
        "[[rules]]\nname = \"other\"\nhosts = [\"other.test\"]\n",
    );
    let newest = wait_digest_change(&w.lk, &new);
    let resp = session.request("GET", &url("/v1/b"));
    assert_eq!(resp.status, 403, "after removing the rule: {resp:#?}");
    assert_eq!(reason(&resp), Some("no_rule"), "{resp:#?}");
    drop(session);

    let records = w.lk.wait_audit(4);
    for (record, (path, reason, policy)) in records.iter().zip([
        ("/v1/a", "allowed", &old),
        ("/v2/a", "path_not_allowed", &old),
        ("/v2/a", "allowed", &new),
        ("/v1/b", "no_rule", &newest),
    ]) {
        assert_record(
            record,
            json!({"path": path, "reason": reason, "policy": policy}),
        );
    }
    assert!(
        records.iter().all(|r| r["client"] == records[0]["client"]),
        "the session should have kept one connection throughout: {records:#?}"
    );

    let s = status(&w.lk);
    assert_eq!(s["reload"]["reloads"], 2, "{s:#}");
    assert_eq!(s["reload"]["errors"], 0, "{s:#}");
    assert_eq!(s["reload"]["last_error"], Value::Null, "{s:#}");
}

#[test]
fn an_invalid_policy_keeps_the_old_rules_and_its_error_shows_in_status_and_metrics_until_fixed() {
    let w = https_world(|port| policy(port, V1));
    let port = w.upstream.port();
    let url = |path: &str| format!("https://api.test:{port}{path}");
    let old = digest(&w.lk);
    let before = metrics(&w.lk);
    assert_eq!(
        before.sum("latchkey_policy_reload_errors_total", &[]),
        0.0,
        "{}",
        before.text
    );

    // The new file would open /v2 but has an unknown key: refused whole.
    write_policy(
        &w.lk,
        "main.toml",
        &format!("{}\ncolour = \"red\"\n", policy(port, V1_V2)),
    );
    let s = wait_status(&w.lk, Duration::from_secs(5), |s| {
        s["reload"]["errors"].as_u64() >= Some(1)
    });
    assert_eq!(s["policy"]["digest"], old, "{s:#}");
    let error = s["reload"]["last_error"]
        .as_str()
        .unwrap_or_else(|| panic!("no reload.last_error at /status: {s:#}"));
    assert!(
        error.contains("main.toml") && error.contains("colour"),
        "the error should name the file and the bad key: {error:?}"
    );
    let m = metrics(&w.lk);
    assert_eq!(
        m.sum("latchkey_policy_reload_errors_total", &[]),
        s["reload"]["errors"].as_f64().expect("errors"),
        "{}",
        m.text
    );
    assert_eq!(m.value("latchkey_policy_info", &[("digest", &old)]), 1.0);

    // The old rules are still in force: /v1 allowed, /v2 still refused.
    let out = curl(&w.lk).args([url("/v1/still")]).run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let out = curl(&w.lk).args([url("/v2/not-yet")]).run();
    assert_denial(out.ok(), 403, Some("api"), "path_not_allowed");

    // Fixed: reloaded, error cleared.
    write_policy(&w.lk, "main.toml", &policy(port, V1_V2));
    let new = wait_digest_change(&w.lk, &old);
    let out = curl(&w.lk).args([url("/v2/now")]).run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let s = status(&w.lk);
    assert_eq!(s["reload"]["last_error"], Value::Null, "{s:#}");
    assert!(s["reload"]["last_ok"].is_string(), "{s:#}");
    assert_eq!(s["reload"]["reloads"], 1, "{s:#}");
    let m = metrics(&w.lk);
    assert_eq!(
        m.sum("latchkey_policy_reloads_total", &[]),
        1.0,
        "{}",
        m.text
    );
    assert_eq!(m.value("latchkey_policy_info", &[("digest", &new)]), 1.0);
    assert!(
        m.samples("latchkey_policy_info", &[("digest", &old)])
            .iter()
            .all(|s| s.value == 0.0),
        "the old digest is still reported as in force: {}",
        m.text
    );

    let records = w.lk.wait_audit(3);
    assert_record(
        &records[0],
        json!({"path": "/v1/still", "reason": "allowed", "policy": old}),
    );
    assert_record(
        &records[1],
        json!({"path": "/v2/not-yet", "reason": "path_not_allowed", "policy": old}),
    );
    assert_record(
        &records[2],
        json!({"path": "/v2/now", "reason": "allowed", "policy": new}),
    );
}

#[test]
fn post_reload_swaps_the_policy_now_and_refuses_an_invalid_set_with_422() {
    let w = https_world(|port| policy(port, V1));
    let port = w.upstream.port();
    let old = digest(&w.lk);

    let (code, body) = reload(&w.lk);
    assert_eq!(code, 200, "{body:#}");
    assert_eq!(body, json!({"changed": false, "policy": old}));

    // A broken second file: the whole set is refused, the old policy stays.
    write_policy(&w.lk, "broken.toml", "[[rules]\nname = \"x\"\n");
    let (code, body) = reload(&w.lk);
    assert_eq!(code, 422, "{body:#}");
    assert_eq!(body["policy"], old, "{body:#}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("broken.toml")),
        "the error should name the broken file: {body:#}"
    );
    assert_eq!(digest(&w.lk), old);
    let out = curl(&w.lk)
        .args([format!("https://api.test:{port}/v1/x")])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");

    std::fs::remove_file(w.lk.scratch().join("policies/broken.toml")).expect("remove broken");
    write_policy(&w.lk, "main.toml", &policy(port, V1_V2));
    let (code, body) = reload(&w.lk);
    assert_eq!(code, 200, "{body:#}");
    let new = body["policy"].as_str().expect("policy digest").to_string();
    assert_ne!(new, old, "{body:#}");
    assert!(body["changed"].is_boolean(), "{body:#}");
    assert_eq!(digest(&w.lk), new);
    let out = curl(&w.lk)
        .args([format!("https://api.test:{port}/v2/x")])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");

    let records = w.lk.wait_audit(2);
    assert_record(&records[0], json!({"reason": "allowed", "policy": old}));
    assert_record(&records[1], json!({"reason": "allowed", "policy": new}));
    let s = status(&w.lk);
    assert!(s["reload"]["errors"].as_u64() >= Some(1), "{s:#}");
}

#[test]
fn sighup_reloads_a_change_the_file_watcher_cannot_see() {
    let w = https_world(|port| policy(port, r#""/v1/**""#));
    let port = w.upstream.port();
    let old = digest(&w.lk);
    let path = w.lk.scratch().join("policies/main.toml");

    // Same length, written in place, modification time put back: invisible to a poll on size
    // and mtime, so only the signal can make latchkey reload it.
    let mtime = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .expect("mtime");
    let v2 = policy(port, r#""/v2/**""#);
    assert_eq!(v2.len(), policy(port, r#""/v1/**""#).len());
    let mut file = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open policy");
    file.write_all(v2.as_bytes()).expect("rewrite policy");
    file.set_modified(mtime).expect("restore mtime");
    drop(file);
    thread::sleep(Duration::from_millis(1600));
    assert_eq!(
        digest(&w.lk),
        old,
        "test premise: the watcher should not have seen this change"
    );

    w.lk.signal("HUP");
    let new = wait_digest_change(&w.lk, &old);
    let out = curl(&w.lk)
        .args([format!("https://api.test:{port}/v2/x")])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let out = curl(&w.lk)
        .args([format!("https://api.test:{port}/v1/x")])
        .run();
    assert_denial(out.ok(), 403, Some("api"), "path_not_allowed");

    // SIGHUP reloads; it does not end the process.
    let mut lk = w.lk;
    assert!(
        lk.wait_exit(Duration::from_millis(200)).is_none(),
        "SIGHUP stopped latchkey:\n{}",
        lk.stderr_text()
    );
    let records = lk.wait_audit(2);
    assert_record(&records[0], json!({"reason": "allowed", "policy": new}));
    assert_eq!(status(&lk)["reload"]["reloads"], 1);
}

#[test]
fn a_request_in_flight_during_a_reload_is_recorded_under_the_policy_it_started_with() {
    let upstream = Upstream::http_with(handler(|req| async move {
        if req.path.starts_with("/v1/slow") {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        echo(req).await
    }));
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .policy("main.toml", &policy(port, V1))
        .run();
    let old = digest(&lk);

    let proxy = lk.addr();
    let slow = thread::spawn(move || {
        raw_request(
            proxy,
            format!(
                "GET http://api.test:{port}/v1/slow HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while upstream.received().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow request never arrived"
        );
        thread::sleep(Duration::from_millis(10));
    }

    write_policy(&lk, "main.toml", &policy(port, V1_V2));
    let (code, body) = reload(&lk);
    assert_eq!(code, 200, "{body:#}");
    let new = body["policy"].as_str().expect("digest").to_string();
    assert_ne!(new, old);

    let resp = raw_request(
        proxy,
        format!("GET http://api.test:{port}/v2/fast HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(resp.status, 200, "{resp:#?}");
    let resp = slow.join().expect("slow request");
    assert_eq!(
        resp.status, 200,
        "the reload broke a request in flight: {resp:#?}"
    );

    let records = lk.wait_audit(2);
    let by_path = |p: &str| {
        records
            .iter()
            .find(|r| r["path"] == p)
            .unwrap_or_else(|| panic!("no record for {p}: {records:#?}"))
    };
    assert_record(
        by_path("/v1/slow"),
        json!({"reason": "allowed", "status": 200, "policy": old}),
    );
    assert_record(
        by_path("/v2/fast"),
        json!({"reason": "allowed", "status": 200, "policy": new}),
    );
}

#[test]
fn the_admin_api_answers_health_readiness_and_status() {
    let w = https_world(api_policy);
    let port = w.upstream.port();

    let resp = admin_get(&w.lk, "/healthz");
    assert_eq!(resp.status, 200, "{resp:#?}");
    assert_eq!(resp.text().trim(), "ok");
    let resp = admin_get(&w.lk, "/readyz");
    assert_eq!(resp.status, 200, "{resp:#?}");
    assert_eq!(admin_get(&w.lk, "/no-such-endpoint").status, 404);

    let out = curl(&w.lk)
        .args([format!("https://api.test:{port}/v1/x")])
        .run();
    assert_eq!(out.ok().status, 200);
    let records = w.lk.wait_audit(1);

    let s = status(&w.lk);
    let policy = &s["policy"];
    assert_eq!(policy["digest"], records[0]["policy"], "{s:#}");
    let files = policy["files"].as_array().expect("policy.files");
    assert_eq!(files.len(), 1, "{s:#}");
    assert!(
        files[0].as_str().is_some_and(|f| f.ends_with("main.toml")),
        "{s:#}"
    );
    assert_eq!(policy["rules"], 2, "{s:#}");
    assert_eq!(policy["identities"], json!([]), "{s:#}");
    assert_eq!(policy["secrets"], json!([]), "{s:#}");
    assert!(s["reload"]["last_ok"].is_string(), "{s:#}");
    assert_eq!(s["reload"]["last_error"], Value::Null, "{s:#}");
    assert_eq!(s["reload"]["reloads"], 0, "{s:#}");
    assert_eq!(s["reload"]["errors"], 0, "{s:#}");
    assert!(s["uptime_seconds"].as_f64().is_some(), "{s:#}");
    assert!(s["connections_active"].as_u64().is_some(), "{s:#}");
    assert_eq!(s["shutting_down"], false, "{s:#}");
}

#[test]
fn metrics_parse_with_prometheus_client_and_count_each_audited_request_once() {
    let w = https_world(api_policy);
    let port = w.upstream.port();

    let out = curl(&w.lk)
        .args([format!("https://api.test:{port}/v1/ok")])
        .run();
    assert_eq!(out.ok().status, 200);
    let out = curl(&w.lk)
        .args(["-X", "POST", &format!("https://api.test:{port}/v1/x")])
        .run();
    assert_denial(out.ok(), 403, Some("api"), "method_not_allowed");
    // Refused at the CONNECT gate: curl fails, latchkey audits.
    let out = curl(&w.lk)
        .args([format!("https://evil.test:{port}/")])
        .run();
    assert_ne!(out.exit, Some(0), "{out:#?}");
    let records = w.lk.wait_audit(3);

    let m = metrics(&w.lk);
    let requests = "latchkey_requests_total";
    assert_eq!(m.family_of(requests).kind, "counter");
    for s in m.samples(requests, &[]) {
        let mut names: Vec<&str> = s.labels.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["decision", "identity", "reason", "rule"],
            "labels of {s:?}"
        );
    }
    assert_eq!(
        m.value(
            requests,
            &[
                ("decision", "allow"),
                ("reason", "allowed"),
                ("rule", "api"),
                ("identity", "default")
            ]
        ),
        1.0,
        "{}",
        m.text
    );
    assert_eq!(
        m.value(
            requests,
            &[
                ("decision", "deny"),
                ("reason", "method_not_allowed"),
                ("rule", "api"),
                ("identity", "default")
            ]
        ),
        1.0,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum(requests, &[("decision", "deny"), ("reason", "no_rule")]),
        1.0,
        "{}",
        m.text
    );
    assert_eq!(
        m.sum(requests, &[]),
        records.len() as f64,
        "every audited request is counted once: {records:#?}\n{}",
        m.text
    );

    let histogram = "latchkey_upstream_response_seconds";
    assert_eq!(m.family_of(&format!("{histogram}_count")).kind, "histogram");
    assert!(
        m.sum(&format!("{histogram}_count"), &[]) >= 1.0,
        "{}",
        m.text
    );
    assert_eq!(m.family_of("latchkey_tls_handshakes_total").kind, "counter");
    assert!(
        m.samples("latchkey_tls_handshakes_total", &[])
            .iter()
            .all(|s| s.label("result").is_some()),
        "{}",
        m.text
    );
    assert!(
        m.sum("latchkey_tls_handshakes_total", &[]) >= 2.0,
        "{}",
        m.text
    );
    assert!(
        m.samples("latchkey_cert_cache_total", &[])
            .iter()
            .all(|s| s.label("result").is_some()),
        "{}",
        m.text
    );
    assert!(m.sum("latchkey_cert_cache_total", &[]) >= 1.0, "{}", m.text);
    for counter in [
        "latchkey_report_only_would_deny_total",
        "latchkey_redactions_total",
        "latchkey_policy_reloads_total",
        "latchkey_policy_reload_errors_total",
        "latchkey_audit_write_errors_total",
        "latchkey_secret_fetches_total",
    ] {
        assert_eq!(m.family_of(counter).kind, "counter", "{counter}");
    }
    for zero in [
        "latchkey_report_only_would_deny_total",
        "latchkey_policy_reload_errors_total",
        "latchkey_audit_write_errors_total",
    ] {
        assert_eq!(m.sum(zero, &[]), 0.0, "{zero}: {}", m.text);
    }
    for gauge in [
        "latchkey_connections_active",
        "latchkey_uptime_seconds",
        "latchkey_policy_rules",
    ] {
        assert_eq!(m.family_of(gauge).kind, "gauge", "{gauge}");
        assert!(m.value(gauge, &[]) >= 0.0, "{gauge}");
    }
    assert_eq!(m.value("latchkey_policy_rules", &[]), 2.0);
    let digest = records[0]["policy"].as_str().expect("digest");
    assert_eq!(
        m.value("latchkey_policy_info", &[("digest", digest)]),
        1.0,
        "{}",
        m.text
    );
}

#[test]
fn admin_explain_gives_the_decision_rule_and_reason_for_a_request() {
    let lk = latchkey()
        .env("LK_TOKEN_CI", "tok-ci-0a1b2c3d4e5f6a7b")
        .policy(
            "main.toml",
            &format!(
                "{}\n[identities.ci]\ntoken = \"env:LK_TOKEN_CI\"\nrules = [\"api\"]\n",
                api_policy(443)
            ),
        )
        .run();
    let explain = |method: &str, url: &str, identity: &str| -> (u16, Value) {
        let url = utf8_percent_encode(url, NON_ALPHANUMERIC);
        let resp = admin_get(
            &lk,
            &format!("/explain?method={method}&url={url}&identity={identity}"),
        );
        (resp.status, json_body(&resp))
    };

    let (code, v) = explain("GET", "https://api.test/v1/items", "ci");
    assert_eq!(code, 200, "{v:#}");
    assert_eq!(
        (&v["decision"], &v["reason"], &v["rule"]),
        (&json!("allow"), &json!("allowed"), &json!("api")),
        "{v:#}"
    );
    let (code, v) = explain("POST", "https://api.test/v1/items", "ci");
    assert_eq!(code, 200, "{v:#}");
    assert_eq!(
        (&v["decision"], &v["reason"], &v["rule"]),
        (&json!("deny"), &json!("method_not_allowed"), &json!("api")),
        "{v:#}"
    );
    let (code, v) = explain("GET", "https://other.test/", "ci");
    assert_eq!(code, 200, "{v:#}");
    assert_eq!(
        (&v["decision"], &v["reason"], &v["rule"]),
        (
            &json!("deny"),
            &json!("identity_not_allowed"),
            &json!("other")
        ),
        "{v:#}"
    );

    let resp = admin_get(&lk, "/explain?method=GET");
    assert_eq!(resp.status, 400, "explain without a url: {resp:#?}");
    // Asking is not a request: nothing audited.
    thread::sleep(Duration::from_millis(200));
    assert!(lk.audit_records().is_empty(), "{:#?}", lk.audit_records());
}

#[test]
fn the_admin_api_is_unreachable_through_the_proxy_even_where_a_rule_allows_its_address() {
    // A fixed admin port, so that the policy can name it.
    let admin_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("pick a port");
        l.local_addr().expect("port").port()
    };
    let lk = latchkey()
        .arg("--admin")
        .arg(&format!("127.0.0.1:{admin_port}"))
        .pin("admin.test")
        .pin("tunnel.test")
        .policy(
            "main.toml",
            &format!(
                r#"
[[rules]]
name  = "admin-plain"
hosts = ["127.0.0.1", "admin.test"]
ports = [{admin_port}]

[[rules]]
name   = "admin-tunnel"
hosts  = ["tunnel.test"]
ports  = [{admin_port}]
tunnel = true
"#
            ),
        )
        .run();
    assert_eq!(lk.admin_addr().port(), admin_port);
    assert_eq!(
        admin_get(&lk, "/healthz").status,
        200,
        "the admin API is up"
    );

    for url in [
        format!("http://127.0.0.1:{admin_port}/status"),
        format!("http://admin.test:{admin_port}/metrics"),
    ] {
        let out = curl(&lk).args([&url]).run();
        assert_denial(out.ok(), 403, None, "non_public_address");
    }
    let (_tcp, resp) =
        crate::support::connect_tunnel(lk.addr(), &format!("tunnel.test:{admin_port}"));
    assert_denial(&resp, 403, None, "non_public_address");

    let records = lk.wait_audit(3);
    for record in &records {
        assert_record(
            record,
            json!({"decision": "deny", "reason": "non_public_address", "status": 403,
                   "upstream": null, "port": admin_port}),
        );
    }
}

#[test]
fn an_admin_token_guards_every_endpoint_but_health_and_readiness() {
    const TOKEN: &str = "adm-5f0c2e9a7b3d4186c2";
    let lk = latchkey()
        .env("LK_ADMIN_TOKEN", TOKEN)
        .arg("--admin-token")
        .arg("env:LK_ADMIN_TOKEN")
        .policy("main.toml", &api_policy(443))
        .run();
    let addr = lk.admin_addr();
    let bearer = format!("Bearer {TOKEN}");
    let wrong = format!("Bearer {}x", &TOKEN[..TOKEN.len() - 1]);
    let explain = "/explain?method=GET&url=https%3A%2F%2Fapi.test%2Fv1%2Fx";

    for (method, path) in [("GET", "/healthz"), ("GET", "/readyz")] {
        let resp = admin_request(addr, method, path, &[]);
        assert_eq!(resp.status, 200, "{path} without a token: {resp:#?}");
    }
    for (method, path) in [
        ("GET", "/status"),
        ("GET", "/metrics"),
        ("GET", explain),
        ("POST", "/reload"),
    ] {
        for headers in [
            vec![],
            vec![("Authorization", wrong.as_str())],
            vec![("Authorization", TOKEN)],
        ] {
            let resp = admin_request(addr, method, path, &headers);
            assert_eq!(
                resp.status, 401,
                "{method} {path} with {headers:?}: {resp:#?}"
            );
            assert!(!resp.text().contains(TOKEN), "{resp:#?}");
        }
        let resp = admin_request(addr, method, path, &[("Authorization", &bearer)]);
        assert_eq!(
            resp.status, 200,
            "{method} {path} with the token: {resp:#?}"
        );
    }
    let m = metrics_with(&lk, &[("Authorization", &bearer)]);
    assert_eq!(m.value("latchkey_policy_rules", &[]), 2.0);
    assert!(
        !lk.stderr_text().contains(TOKEN),
        "the admin token reached the log:\n{}",
        lk.stderr_text()
    );
}

#[test]
fn an_admin_token_shorter_than_16_characters_is_refused_at_startup() {
    const SHORT: &str = "adm-short-15chr";
    assert_eq!(SHORT.len(), 15);
    let out = latchkey()
        .env("LK_ADMIN_TOKEN", SHORT)
        .arg("--admin-token")
        .arg("env:LK_ADMIN_TOKEN")
        .policy("main.toml", &api_policy(443))
        .run_expecting_failure();
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(out.stderr.contains("admin-token"), "{out:#?}");
    assert!(
        !out.stderr.contains(SHORT),
        "the refused token was printed: {out:#?}"
    );
}

#[test]
fn admin_off_serves_no_admin_api() {
    let ca = crate::support::TestCa::new();
    let upstream = Upstream::https(&ca);
    let lk = latchkey()
        .upstream_ca(&ca)
        .pin("api.test")
        .arg("--admin")
        .arg("off")
        .policy("main.toml", &api_policy(upstream.port()))
        .run();
    let out = curl(&lk)
        .args([format!("https://api.test:{}/v1/x", upstream.port())])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert!(
        !lk.stderr_text().contains("admin listening"),
        "--admin off still started the admin API:\n{}",
        lk.stderr_text()
    );
}

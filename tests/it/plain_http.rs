//! Plain `http://` absolute-form requests through the proxy.

use serde_json::json;

use crate::support::{assert_record, curl, latchkey, Echo, Upstream};

fn plain_policy(port: u16) -> String {
    format!(
        r#"
[[rules]]
name    = "plain-api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
[rules.inject.headers]
x-test-injected = "literal value"
"#
    )
}

#[test]
fn a_plain_http_get_reaches_the_upstream_without_hop_by_hop_headers_and_with_the_injected_header() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .policy("main.toml", &plain_policy(port))
        .run();

    let out = curl(&lk)
        .args([
            "-H",
            "Connection: x-foo",
            "-H",
            "X-Foo: bar",
            "-H",
            "Proxy-Connection: keep-alive",
            "-H",
            "Keep-Alive: timeout=5",
            "-H",
            "TE: gzip, trailers",
            "-H",
            "X-Test-Injected: from-client",
            "-H",
            "X-Kept: yes",
        ])
        .args([format!("http://api.test:{port}/v1/items")])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.method, "GET");
    assert_eq!(echo.path, "/v1/items");
    for hop in ["x-foo", "proxy-connection", "keep-alive"] {
        assert!(
            !echo.has_header(hop),
            "hop-by-hop header {hop} was forwarded: {echo:#?}"
        );
    }
    // TE is hop-by-hop, but `trailers` (all gRPC needs, and all h2 allows) is passed on.
    assert_eq!(echo.header_values("te"), ["trailers"], "{echo:#?}");
    assert!(
        echo.header_values("connection")
            .iter()
            .all(|v| !v.to_ascii_lowercase().contains("x-foo")),
        "the client's Connection header was forwarded: {echo:#?}"
    );
    assert_eq!(
        echo.header_values("x-test-injected"),
        ["literal value"],
        "the injected header must replace the client's: {echo:#?}"
    );
    assert_eq!(echo.header_values("x-kept"), ["yes"], "{echo:#?}");
    assert_eq!(upstream.connections(), 1);

    let records = lk.wait_audit(1);
    let record = &records[0];
    assert_record(
        record,
        json!({
            "method": "GET",
            "scheme": "http",
            "host": "api.test",
            "port": port,
            "path": "/v1/items",
            "identity": "default",
            "decision": "allow",
            "rule": "plain-api",
            "reason": "allowed",
            "status": 200,
            "upstream": upstream.addr_string(),
        }),
    );
    assert!(
        record["bytes_down"].as_u64().is_some_and(|n| n > 0),
        "bytes_down: {record:#}"
    );
    let id = record["id"].as_str().expect("id");
    assert_eq!(
        resp.header("x-latchkey-id"),
        Some(id),
        "the response should carry the audit id: {resp:#?}"
    );
    let log = lk.stderr_text();
    assert_eq!(
        log.lines().filter(|l| l.contains(id)).count(),
        1,
        "expected one decision log line for {id}:\n{log}"
    );
}

#[test]
fn query_values_reach_the_upstream_but_are_redacted_in_the_audit_record() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .policy("main.toml", &plain_policy(port))
        .run();

    let out = curl(&lk)
        .args([format!(
            "http://api.test:{port}/v1/search?token=supersecret&page=2"
        )])
        .run();
    let echo = Echo::parse(&out.ok().text());
    assert_eq!(echo.path, "/v1/search?token=supersecret&page=2");

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "path": "/v1/search?token=REDACTED&page=REDACTED",
            "decision": "allow",
            "status": 200,
        }),
    );
    assert!(
        !records[0].to_string().contains("supersecret"),
        "a query value leaked into the audit record: {:#}",
        records[0]
    );
}

#[test]
fn a_plain_http_request_to_a_host_no_rule_allows_is_refused_without_dialing() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .pin("evil.test")
        .policy("main.toml", &plain_policy(port))
        .run();

    let out = curl(&lk)
        .args([format!("http://evil.test:{port}/v1/items")])
        .run();
    crate::support::assert_denial(out.ok(), 403, Some("none"), "no_rule");
    assert!(
        out.response.text().contains("evil.test"),
        "the denial should name the target: {out:#?}"
    );
    assert_eq!(upstream.connections(), 0, "a denied request was dialed");

    let records = lk.wait_audit(1);
    assert_eq!(
        out.response.header("x-latchkey-id"),
        records[0]["id"].as_str(),
        "the denial should carry the audit id: {out:#?}"
    );
    assert_record(
        &records[0],
        json!({
            "method": "GET",
            "scheme": "http",
            "host": "evil.test",
            "port": port,
            "decision": "deny",
            "rule": null,
            "reason": "no_rule",
            "status": 403,
            "upstream": null,
        }),
    );
}

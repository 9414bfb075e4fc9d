//! Requests no well-behaved client sends, on raw sockets: each gets an error status and an audit
//! record, and none reaches an upstream.

use serde_json::json;

use crate::support::{assert_denial, assert_record, latchkey, raw_request, Latchkey, Upstream};

fn proxy_for(upstream: &Upstream) -> Latchkey {
    let port = upstream.port();
    latchkey()
        .pin("api.test")
        .pin("evil.test")
        .policy(
            "main.toml",
            &format!(
                r#"
[[rules]]
name  = "plain-api"
hosts = ["api.test"]
ports = [{port}]
"#
            ),
        )
        .run()
}

#[test]
fn a_malformed_request_line_gets_400_and_an_audit_record() {
    let upstream = Upstream::http();
    let lk = proxy_for(&upstream);

    let resp = raw_request(lk.addr(), b"GARBAGE\r\n\r\n");
    assert_eq!(resp.status, 400, "{resp:#?}");

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "decision": "deny",
            "reason": "bad_request",
            "status": 400,
            "upstream": null,
        }),
    );
    assert_eq!(upstream.connections(), 0);
}

#[test]
fn a_header_block_over_64_kib_gets_431_and_an_audit_record() {
    let upstream = Upstream::http();
    let lk = proxy_for(&upstream);
    let port = upstream.port();

    let big = "a".repeat(70_000);
    let request = format!(
        "GET http://api.test:{port}/v1/items HTTP/1.1\r\nHost: api.test:{port}\r\nX-Big: {big}\r\n\r\n"
    );
    let resp = raw_request(lk.addr(), request.as_bytes());
    assert_eq!(resp.status, 431, "{resp:#?}");
    assert_eq!(
        upstream.connections(),
        0,
        "an oversized request was forwarded"
    );

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "decision": "deny",
            "reason": "header_too_large",
            "status": 431,
            "upstream": null,
        }),
    );
}

#[test]
fn userinfo_in_an_absolute_url_is_refused() {
    let upstream = Upstream::http();
    let lk = proxy_for(&upstream);
    let port = upstream.port();

    let requests = [
        // A naive parser would see api.test (allowed) and dial evil.test.
        format!("GET http://api.test@evil.test:{port}/ HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n"),
        format!(
            "GET http://user:hunter2@api.test:{port}/v1/items HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n"
        ),
    ];
    for request in &requests {
        let resp = raw_request(lk.addr(), request.as_bytes());
        assert_denial(&resp, 400, None, "userinfo_in_url");
    }
    assert_eq!(
        upstream.connections(),
        0,
        "a URL with userinfo was forwarded"
    );

    let records = lk.wait_audit(requests.len());
    for record in &records {
        assert_record(
            record,
            json!({
                "method": "GET",
                "decision": "deny",
                "reason": "userinfo_in_url",
                "status": 400,
                "upstream": null,
            }),
        );
        assert!(
            !record.to_string().contains("hunter2"),
            "a password from the URL reached the audit log: {record:#}"
        );
    }
}

#[test]
fn an_origin_form_request_to_the_proxy_is_refused() {
    let upstream = Upstream::http();
    let lk = proxy_for(&upstream);
    let port = upstream.port();

    let request = format!("GET /v1/items HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n");
    let resp = raw_request(lk.addr(), request.as_bytes());
    assert_denial(&resp, 400, None, "not_a_proxy_request");
    assert_eq!(upstream.connections(), 0);

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "method": "GET",
            "decision": "deny",
            "reason": "not_a_proxy_request",
            "status": 400,
            "upstream": null,
        }),
    );
}

//! Upstream failures after policy allowed a request: a clear 502 naming the host, and a record
//! that says policy allowed it and the upstream failed it.

use serde_json::json;

use crate::support::{assert_record, curl, latchkey, TestCa, Upstream};

/// A port on loopback with nothing listening: bind, read the port, drop the listener.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn an_unreachable_upstream_gets_a_502_naming_the_host_and_an_allow_record() {
    let port = closed_port();
    let lk = latchkey()
        .policy(
            "main.toml",
            &format!("[[rules]]\nname = \"down\"\nhosts = [\"down.test\"]\nports = [{port}]\n"),
        )
        .pin("down.test")
        .run();

    let out = curl(&lk).args([format!("http://down.test:{port}/x")]).run();
    let resp = out.ok();
    assert_eq!(resp.status, 502, "{resp:#?}");
    assert_eq!(resp.header("x-latchkey-decision"), Some("allow"));
    assert_eq!(
        resp.header("x-latchkey-reason"),
        Some("upstream_unreachable")
    );
    assert_eq!(resp.header("x-latchkey-rule"), Some("down"));
    assert!(resp.text().contains("down.test"), "{resp:#?}");

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "allow", "rule": "down", "reason": "upstream_unreachable", "status": 502}),
    );
}

#[test]
fn an_upstream_certificate_latchkey_does_not_trust_is_refused_with_upstream_tls() {
    // The upstream's CA is NOT passed with --upstream-ca: verification must fail closed.
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let lk = latchkey()
        .policy(
            "main.toml",
            &format!("[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{port}]\n"),
        )
        .pin("api.test")
        .run();

    let out = curl(&lk)
        .args([format!("https://api.test:{port}/v1/x")])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 502, "{resp:#?}");
    assert_eq!(resp.header("x-latchkey-reason"), Some("upstream_tls"));

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "allow", "rule": "api", "reason": "upstream_tls", "status": 502}),
    );
}

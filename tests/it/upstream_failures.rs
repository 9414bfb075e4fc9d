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
    // The flag that fixes it is named, in the sandbox's answer and in latchkey's log.
    let hint = "trust that CA with `latchkey serve --upstream-ca PEM`";
    assert!(
        resp.text().contains("UnknownIssuer") && resp.text().contains(hint),
        "{resp:#?}"
    );
    assert!(
        lk.wait_stderr_contains(hint, std::time::Duration::from_secs(5)),
        "{}",
        lk.stderr_text()
    );

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "allow", "rule": "api", "reason": "upstream_tls", "status": 502}),
    );
}

#[test]
fn a_name_latchkey_cannot_resolve_gets_a_502_naming_the_resolve_flag() {
    // `.invalid` never resolves (RFC 6761), and nothing pins it.
    let lk = latchkey()
        .policy(
            "main.toml",
            "[[rules]]\nname = \"local\"\nhosts = [\"svc.latchkey.invalid\"]\nports = [8080]\n",
        )
        .run();
    let out = curl(&lk)
        .args(["http://svc.latchkey.invalid:8080/x".to_string()])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 502, "{resp:#?}");
    assert_eq!(
        resp.header("x-latchkey-reason"),
        Some("upstream_unreachable")
    );
    assert!(
        resp.text()
            .contains("pin it with `latchkey serve --resolve svc.latchkey.invalid=ADDR`"),
        "{resp:#?}"
    );
}

#[test]
fn a_refused_loopback_address_names_the_allow_private_flag() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .policy(
            "main.toml",
            &format!("[[rules]]\nname = \"local\"\nhosts = [\"local.test\"]\nports = [{port}]\n"),
        )
        .guarded()
        .resolve("local.test", "127.0.0.1")
        .run();
    let out = curl(&lk)
        .args([format!("http://local.test:{port}/x")])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 403, "{resp:#?}");
    assert_eq!(resp.header("x-latchkey-reason"), Some("non_public_address"));
    assert!(
        resp.text().contains("--allow-private 127.0.0.1/32"),
        "{resp:#?}"
    );
}

//! The CONNECT gate and the TLS interception boundary: what is refused before any TLS, what is
//! refused during the handshake, and what is refused inside the intercepted connection.

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use serde_json::json;

use crate::support::{
    api_policy, assert_denial, assert_record, connect_tunnel, curl, https_world, tls_config, Echo,
};

#[test]
fn a_connect_to_a_host_no_rule_allows_is_refused_before_any_upstream_connection() {
    let w = https_world(api_policy);
    let port = w.upstream.port();

    let (_tcp, resp) = connect_tunnel(w.lk.addr(), &format!("evil.test:{port}"));
    assert_denial(&resp, 403, Some("none"), "no_rule");
    assert!(
        resp.text().contains("evil.test"),
        "the denial should name the host: {resp:#?}"
    );
    assert_eq!(w.upstream.connections(), 0, "a refused CONNECT was dialed");

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "method": "CONNECT",
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

#[test]
fn a_connect_to_an_allowed_host_on_a_port_no_rule_lists_is_refused() {
    let w = https_world(api_policy);
    let other_port = if w.upstream.port() == 1 { 2 } else { 1 };

    let (_tcp, resp) = connect_tunnel(w.lk.addr(), &format!("api.test:{other_port}"));
    assert_denial(&resp, 403, None, "port_not_allowed");
    assert_eq!(w.upstream.connections(), 0);

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "method": "CONNECT",
            "host": "api.test",
            "port": other_port,
            "decision": "deny",
            "reason": "port_not_allowed",
            "status": 403,
            "upstream": null,
        }),
    );
}

#[test]
fn a_connect_without_a_port_is_a_bad_request() {
    let w = https_world(api_policy);

    let (_tcp, resp) = connect_tunnel(w.lk.addr(), "api.test");
    assert_denial(&resp, 400, None, "missing_port");
    assert_eq!(w.upstream.connections(), 0);

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "method": "CONNECT",
            "decision": "deny",
            "reason": "missing_port",
            "status": 400,
            "upstream": null,
        }),
    );
}

#[test]
fn plain_text_after_an_allowed_connect_is_dropped_and_never_relayed() {
    let w = https_world(api_policy);
    let port = w.upstream.port();
    let (mut tcp, resp) = connect_tunnel(w.lk.addr(), &format!("api.test:{port}"));
    assert_eq!(resp.status, 200, "CONNECT answer: {resp:#?}");

    tcp.write_all(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
        .expect("send plain text into the tunnel");
    let mut received = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("latchkey kept a non-TLS tunnel open (received {received:?})")
            }
            Err(_) => break, // reset: closed
        }
        assert!(Instant::now() < deadline, "connection not closed");
    }
    let text = String::from_utf8_lossy(&received);
    assert!(
        !text.contains("HTTP/"),
        "an HTTP response came back through a non-TLS tunnel: {text:?}"
    );
    assert_eq!(
        w.upstream.connections(),
        0,
        "non-TLS bytes were relayed upstream"
    );

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "method": "CONNECT",
            "host": "api.test",
            "port": port,
            "decision": "deny",
            "reason": "not_tls",
            "status": null,
            "upstream": null,
        }),
    );
}

#[test]
fn an_sni_different_from_the_connect_host_fails_the_handshake() {
    let w = https_world(api_policy);
    let port = w.upstream.port();
    let (mut tcp, resp) = connect_tunnel(w.lk.addr(), &format!("api.test:{port}"));
    assert_eq!(resp.status, 200, "CONNECT answer: {resp:#?}");

    // other.test is allowed by policy too: only the mismatch with the CONNECT host is wrong.
    let config = tls_config(&w.lk.ca_pem_path(), &[b"http/1.1"]);
    let name = ServerName::try_from("other.test").expect("server name");
    let mut conn = rustls::ClientConnection::new(config, name).expect("TLS client");
    let mut handshake = || -> std::io::Result<()> {
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp)?;
        }
        Ok(())
    };
    let result = handshake();
    assert!(
        result.is_err(),
        "a handshake with SNI other.test inside CONNECT api.test succeeded"
    );
    assert_eq!(w.upstream.connections(), 0);

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "method": "CONNECT",
            "host": "api.test",
            "port": port,
            "decision": "deny",
            "reason": "sni_mismatch",
            "status": null,
            "upstream": null,
        }),
    );
}

#[test]
fn an_inner_host_different_from_the_connect_authority_is_refused_over_http1_and_http2() {
    let w = https_world(api_policy);
    let port = w.upstream.port();

    for flag in ["--http1.1", "--http2"] {
        let out = curl(&w.lk)
            .args([
                flag,
                "-H",
                &format!("Host: other.test:{port}"),
                &format!("https://api.test:{port}/v1/items"),
            ])
            .run();
        assert_denial(out.ok(), 403, None, "host_mismatch");
    }
    assert_eq!(
        w.upstream.connections(),
        0,
        "a Host-spoofed request was forwarded"
    );

    let records = w.lk.wait_audit(2);
    for record in &records {
        assert_record(
            record,
            json!({
                "method": "GET",
                "scheme": "https",
                "decision": "deny",
                "reason": "host_mismatch",
                "status": 403,
                "upstream": null,
            }),
        );
    }
}

#[test]
fn a_wildcard_host_matches_a_subdomain_but_not_the_apex() {
    let w = https_world(|port| {
        format!(
            r#"
[[rules]]
name  = "wild"
hosts = ["*.wild.test"]
ports = [{port}]
"#
        )
    });
    let port = w.upstream.port();

    let out = curl(&w.lk)
        .args([format!("https://a.wild.test:{port}/anything")])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_eq!(Echo::parse(&out.response.text()).path, "/anything");

    let (_tcp, resp) = connect_tunnel(w.lk.addr(), &format!("wild.test:{port}"));
    assert_denial(&resp, 403, Some("none"), "no_rule");

    let records = w.lk.wait_audit(2);
    let allowed = records
        .iter()
        .find(|r| r["decision"] == "allow")
        .expect("a record for the subdomain");
    assert_record(
        allowed,
        json!({"host": "a.wild.test", "rule": "wild", "status": 200}),
    );
    let denied = records
        .iter()
        .find(|r| r["decision"] == "deny")
        .expect("a record for the apex");
    assert_record(
        denied,
        json!({"method": "CONNECT", "host": "wild.test", "reason": "no_rule"}),
    );
}

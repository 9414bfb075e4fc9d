//! HTTPS through latchkey's interception: real clients trusting only latchkey's CA.
//!
//! Each client trusts nothing but `latchkey-ca.pem` (curl also gets an empty `--capath`), so a
//! successful request proves that the certificate it saw was issued by latchkey's CA.

use std::io::Write;
use std::thread;
use std::time::Duration;

use rustls_pki_types::ServerName;
use serde_json::json;

use crate::support::{
    api_policy, assert_record, connect_tunnel, curl, https_world, python_request, read_response,
    tls_config, Echo, World,
};

fn assert_allowed_get(w: &World, path: &str) {
    let port = w.upstream.port();
    let records = w.lk.wait_audit(1);
    let record = &records[0];
    assert_record(
        record,
        json!({
            "method": "GET",
            "scheme": "https",
            "host": "api.test",
            "port": port,
            "path": path,
            "identity": "default",
            "decision": "allow",
            "rule": "api",
            "reason": "allowed",
            "status": 200,
            "upstream": w.upstream.addr_string(),
        }),
    );
    assert!(
        record["bytes_down"].as_u64().is_some_and(|n| n > 0),
        "bytes_down: {record:#}"
    );
}

fn curl_get_through_mitm(http_flag: &str, expected_version: &str) {
    let w = https_world(api_policy);
    let port = w.upstream.port();

    let out = curl(&w.lk)
        .args([
            http_flag,
            "-H",
            "X-Test-Injected: from-client",
            &format!("https://api.test:{port}/v1/items"),
        ])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    assert_eq!(
        out.http_version, expected_version,
        "protocol curl negotiated with latchkey: {out:#?}"
    );
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.method, "GET");
    assert_eq!(echo.path, "/v1/items");
    assert_eq!(echo.header_values("x-test-injected"), ["literal value"]);
    assert_eq!(w.upstream.connections(), 1);

    assert_allowed_get(&w, "/v1/items");
}

#[test]
fn curl_over_http1_is_intercepted_with_a_certificate_from_the_latchkey_ca() {
    curl_get_through_mitm("--http1.1", "1.1");
}

#[test]
fn curl_over_http2_is_intercepted_with_a_certificate_from_the_latchkey_ca() {
    curl_get_through_mitm("--http2", "2");
}

#[test]
fn python_requests_is_intercepted_and_reaches_the_upstream() {
    let w = https_world(api_policy);
    let port = w.upstream.port();

    let resp = python_request(
        &w.lk,
        "GET",
        &format!("https://api.test:{port}/v1/from-python"),
        &["X-Test-Injected: from-client"],
    );
    assert_eq!(resp.status, 200, "{resp:#?}");
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.path, "/v1/from-python");
    assert_eq!(echo.header_values("x-test-injected"), ["literal value"]);

    assert_allowed_get(&w, "/v1/from-python");
}

#[test]
fn a_client_hello_split_into_one_byte_segments_is_still_intercepted() {
    let w = https_world(api_policy);
    let port = w.upstream.port();
    let (mut tcp, resp) = connect_tunnel(w.lk.addr(), &format!("api.test:{port}"));
    assert_eq!(resp.status, 200, "CONNECT answer: {resp:#?}");
    tcp.set_nodelay(true).expect("TCP_NODELAY");

    let config = tls_config(&w.lk.ca_pem_path(), &[b"http/1.1"]);
    let name = ServerName::try_from("api.test").expect("server name");
    let mut conn = rustls::ClientConnection::new(config, name).expect("TLS client");
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).expect("serialise ClientHello");
    }
    assert!(hello.len() > 100, "ClientHello is {} bytes", hello.len());
    for byte in &hello {
        tcp.write_all(std::slice::from_ref(byte))
            .expect("send one ClientHello byte");
        thread::sleep(Duration::from_millis(1));
    }

    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET /v1/split HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
    )
    .expect("handshake with latchkey (trusting only its CA) and send the request");
    let resp = read_response(&mut tls, false).expect("read the inner response");
    assert_eq!(resp.status, 200, "{resp:#?}");
    assert_eq!(Echo::parse(&resp.text()).path, "/v1/split");

    assert_allowed_get(&w, "/v1/split");
}

#[test]
fn a_request_body_reaches_the_upstream_unchanged_and_is_counted() {
    let w = https_world(api_policy);
    let port = w.upstream.port();

    let out = curl(&w.lk)
        .args([
            "-X",
            "PUT",
            "--data-binary",
            "hello from the sandbox",
            &format!("https://other.test:{port}/upload"),
        ])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let echo = Echo::parse(&out.response.text());
    assert_eq!(echo.method, "PUT");
    assert_eq!(echo.body, "hello from the sandbox");
    assert!(
        !echo.has_header("x-test-injected"),
        "the api rule's injection leaked onto another rule's host: {echo:#?}"
    );

    let records = w.lk.wait_audit(1);
    let record = &records[0];
    assert_record(
        record,
        json!({
            "method": "PUT",
            "host": "other.test",
            "path": "/upload",
            "rule": "other",
            "status": 200,
        }),
    );
    assert!(
        record["bytes_up"]
            .as_u64()
            .is_some_and(|n| n >= "hello from the sandbox".len() as u64),
        "bytes_up should count the request body: {record:#}"
    );
}

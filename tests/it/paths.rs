//! Paths an upstream could read differently than policy matched them (`/ok/..;/admin`, which
//! Tomcat and Spring serve as `/admin`) are refused with `400 ambiguous_path` and an audit record,
//! on the proxy hop, inside an intercepted CONNECT over HTTP/1.1 and over h2, and never reach the
//! upstream; their harmless neighbours still go through, byte for byte.

use std::io::Write;
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use serde_json::Value;

use crate::support::clients::RawResponse;
use crate::support::{
    connect_tunnel, curl, latchkey, raw_request, read_response, tls_config, Latchkey, TestCa,
    Upstream,
};

/// Refused under `paths = ["/ok/**"]`: every spelling of a dot segment with `;` parameters, in
/// the middle, at the end and in the first segment, and the encodings that decode to structure.
const AMBIGUOUS: &[&str] = &[
    "/ok/..;/admin",
    "/ok/%2e%2e;/admin",
    "/ok/..%3b/admin",
    "/ok/%2e%2e%3B/admin",
    "/ok/.%2e;/admin",
    "/ok/%2E%2e;x=1/admin",
    "/ok/.;/admin",
    "/ok/%2e;jsessionid=1/admin",
    "/ok/..;",
    "/ok/%2e%2e%3b",
    "/..;/admin",
    "/%2e%2e;/ok/x",
    "/ok/.../admin",
    "/ok/..%20/admin",
    "/ok/..",
    "/ok/%2e%2e",
    "/ok/%5c../admin",
    "/ok/..\\admin",
    "/ok/%5C",
    "/ok%2f..%2fadmin",
    "/ok/%252e%252e/admin",
    "/ok/%252e%252e%253b/admin",
    "/ok/%25%32%65%25%32%65/admin",
    "/ok/%c0%ae%c0%ae/admin",
    "/ok/%C0%AE",
    "/ok/%c0%af",
    "/ok/%00/admin",
    "/ok/x%00",
    "/%00",
    "/ok/%u002e%u002e/admin",
    // The same classes in the first segment and at the end.
    "/%5c/admin",
    "/\\admin",
    "/%252e%252e/ok/x",
    "/%c0%ae%c0%ae/admin",
    "/ok/%252e",
    "/ok/..%5c",
    "/ok/%2e%2e%5C",
];

/// Neighbours that stay allowed under `/ok/**` and must reach the upstream as sent.
const ALLOWED: &[&str] = &[
    "/ok/x..y",
    "/ok/..x",
    "/ok/x.",
    "/ok/.well-known/a",
    "/ok/caf%C3%A9",
    "/ok/100%25",
    "/ok/%41",
];

/// Under a rule without `paths`, `;` parameters on ordinary segments are no ambiguity.
const ALLOWED_OPEN: &[&str] = &["/any/file;v=1", "/any/a%3bb", "/any/;..", "/any/x;y/z"];

fn policy(port: u16) -> String {
    format!(
        r#"
[[rules]]
name  = "ok"
hosts = ["api.test"]
ports = [{port}]
paths = ["/ok/**"]

[[rules]]
name  = "open"
hosts = ["other.test"]
ports = [{port}]
"#
    )
}

/// Waits up to 3 s for record number `index` (0-based).
fn record_at(lk: &Latchkey, index: usize) -> Option<Value> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        if let Some(record) = lk.audit_records().get(index) {
            return Some(record.clone());
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What is wrong with a refusal: a 400 from latchkey (`ambiguous_path`, or hyper's own
/// `bad_request` for a target it cannot parse), a deny record, nothing forwarded.
fn judge_refusal(
    path: &str,
    resp: std::io::Result<RawResponse>,
    record: Option<Value>,
    forwarded: usize,
) -> Vec<String> {
    let mut problems = Vec::new();
    match resp {
        Ok(resp) => {
            let reason = resp.header("x-latchkey-reason").unwrap_or_default();
            if resp.status != 400 || !matches!(reason, "ambiguous_path" | "bad_request") {
                problems.push(format!("{path}: status {} reason {reason:?}", resp.status));
            }
        }
        Err(e) => problems.push(format!("{path}: no response ({e})")),
    }
    match record {
        Some(r) => {
            let reason = r["reason"].as_str().unwrap_or_default();
            if !matches!(reason, "ambiguous_path" | "bad_request")
                || r["decision"] != "deny"
                || r["status"] != 400
                || !r["upstream"].is_null()
            {
                problems.push(format!(
                    "{path}: audit decision {} reason {} status {} upstream {}",
                    r["decision"], r["reason"], r["status"], r["upstream"]
                ));
            }
        }
        None => problems.push(format!("{path}: no audit record")),
    }
    if forwarded > 0 {
        problems.push(format!("{path}: forwarded to the upstream"));
    }
    problems
}

/// What is wrong with an allowed request: a 200, an allow record, the path verbatim upstream.
fn judge_allowed(
    path: &str,
    resp: std::io::Result<RawResponse>,
    record: Option<Value>,
    upstream: &Upstream,
    before: usize,
) -> Vec<String> {
    let mut problems = Vec::new();
    match resp {
        Ok(resp) if resp.status == 200 => {}
        Ok(resp) => problems.push(format!("{path}: status {} ({resp:?})", resp.status)),
        Err(e) => problems.push(format!("{path}: no response ({e})")),
    }
    if record.as_ref().is_none_or(|r| r["decision"] != "allow") {
        problems.push(format!("{path}: audit record {record:?}"));
    }
    let received = upstream.received();
    match received.get(before) {
        Some(r) if r.path_only() == path => {}
        Some(r) => problems.push(format!("{path}: upstream saw {:?}", r.path_only())),
        None => problems.push(format!("{path}: never reached the upstream")),
    }
    problems
}

#[test]
fn ambiguous_paths_on_the_proxy_hop_are_refused_and_never_forwarded() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .pin("other.test")
        .policy("main.toml", &policy(port))
        .run();
    let mut problems = Vec::new();
    let mut index = 0;
    for path in AMBIGUOUS {
        let before = upstream.received().len();
        let req = format!(
            "GET http://api.test:{port}{path} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
        );
        let resp = raw_request(lk.addr(), req.as_bytes());
        let record = record_at(&lk, index);
        index += 1;
        problems.extend(judge_refusal(
            path,
            Ok(resp),
            record,
            upstream.received().len() - before,
        ));
    }
    for (host, path) in ALLOWED
        .iter()
        .map(|p| ("api.test", p))
        .chain(ALLOWED_OPEN.iter().map(|p| ("other.test", p)))
    {
        let before = upstream.received().len();
        let req = format!(
            "GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
        );
        let resp = raw_request(lk.addr(), req.as_bytes());
        let record = record_at(&lk, index);
        index += 1;
        problems.extend(judge_allowed(path, Ok(resp), record, &upstream, before));
    }
    assert!(
        problems.is_empty(),
        "paths on the proxy hop:\n{}",
        problems.join("\n")
    );
    lk.wait_audit(index);
}

#[test]
fn ambiguous_paths_inside_an_intercepted_connect_are_refused_and_never_forwarded() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let lk = latchkey()
        .upstream_ca(&ca)
        .pin("api.test")
        .pin("other.test")
        .policy("main.toml", &policy(port))
        .run();
    let config = tls_config(&lk.ca_pem_path(), &[b"http/1.1"]);
    let send = |host: &str, path: &str| -> std::io::Result<RawResponse> {
        let (tcp, connect) = connect_tunnel(lk.addr(), &format!("{host}:{port}"));
        assert_eq!(connect.status, 200, "{connect:#?}");
        let name = ServerName::try_from(host.to_string()).expect("server name");
        let conn = rustls::ClientConnection::new(config.clone(), name).expect("TLS client");
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n");
        tls.write_all(req.as_bytes())
            .and_then(|()| read_response(&mut tls, false))
    };
    let mut problems = Vec::new();
    let mut index = 0;
    for path in AMBIGUOUS {
        let before = upstream.received().len();
        let resp = send("api.test", path);
        let record = record_at(&lk, index);
        index += 1;
        problems.extend(judge_refusal(
            path,
            resp,
            record,
            upstream.received().len() - before,
        ));
    }
    for (host, path) in ALLOWED
        .iter()
        .map(|p| ("api.test", p))
        .chain(ALLOWED_OPEN.iter().map(|p| ("other.test", p)))
    {
        let before = upstream.received().len();
        let resp = send(host, path);
        let record = record_at(&lk, index);
        index += 1;
        problems.extend(judge_allowed(path, resp, record, &upstream, before));
    }
    assert!(
        problems.is_empty(),
        "paths inside CONNECT:\n{}",
        problems.join("\n")
    );
}

#[test]
fn ambiguous_paths_over_http2_are_refused_and_never_forwarded() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let lk = latchkey()
        .upstream_ca(&ca)
        .pin("api.test")
        .policy("main.toml", &policy(port))
        .run();
    let mut problems = Vec::new();
    let paths = [
        "/ok/..;/admin",
        "/ok/%2e%2e;/admin",
        "/ok/.%2e%3b/admin",
        "/..;/admin",
        "/ok/%252e%252e/admin",
        "/ok/%c0%ae%c0%ae/admin",
        "/ok/%00",
    ];
    for (i, path) in paths.iter().enumerate() {
        let out = curl(&lk)
            .args([
                "--http2",
                "--path-as-is",
                &format!("https://api.test:{port}{path}"),
            ])
            .run();
        if out.http_version != "2" {
            problems.push(format!("{path}: HTTP version {:?}", out.http_version));
        }
        let record = record_at(&lk, i);
        problems.extend(judge_refusal(path, Ok(out.ok().clone()), record, 0));
    }
    assert!(
        problems.is_empty(),
        "paths over h2:\n{}",
        problems.join("\n")
    );
    assert_eq!(
        upstream.received().len(),
        0,
        "an ambiguous path was forwarded"
    );
    lk.wait_audit(paths.len());
}

/// Under a rule with `paths`, any `;` / `%3b` parameter and any empty segment is refused, in
/// every segment position; the same paths pass a rule without `paths`.
#[test]
fn parameters_and_empty_segments_under_a_rule_with_paths_are_refused() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .pin("other.test")
        .policy("main.toml", &policy(port))
        .run();
    let refused = [
        "/ok/file;v=1",
        "/ok/a%3bb",
        "/ok/x%3B",
        "/ok/key.pem;.txt",
        "/ok/x;y/admin",
        "/ok/x;",
        "/ok//admin",
        "/ok/x//",
    ];
    let mut problems = Vec::new();
    let mut index = 0;
    for path in refused {
        let before = upstream.received().len();
        let req = format!(
            "GET http://api.test:{port}{path} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
        );
        let resp = raw_request(lk.addr(), req.as_bytes());
        if resp.header("x-latchkey-rule") != Some("ok") && resp.status == 400 {
            problems.push(format!(
                "{path}: rule header {:?}",
                resp.header("x-latchkey-rule")
            ));
        }
        let record = record_at(&lk, index);
        index += 1;
        problems.extend(judge_refusal(
            path,
            Ok(resp),
            record,
            upstream.received().len() - before,
        ));
    }
    for path in ["/any/file;v=1", "/any//x", "/any/a%3Bb"] {
        let before = upstream.received().len();
        let req = format!(
            "GET http://other.test:{port}{path} HTTP/1.1\r\nHost: other.test:{port}\r\nConnection: close\r\n\r\n"
        );
        let resp = raw_request(lk.addr(), req.as_bytes());
        let record = record_at(&lk, index);
        index += 1;
        problems.extend(judge_allowed(path, Ok(resp), record, &upstream, before));
    }
    assert!(
        problems.is_empty(),
        "; under paths:\n{}",
        problems.join("\n")
    );
    lk.wait_audit(index);
}

/// `latchkey explain` says what the proxy does: `ambiguous_path` for dot segments with
/// parameters, and for `;` under a rule with `paths`; allowed without `paths`.
#[test]
fn explain_names_ambiguous_paths_and_the_parameter_rule() {
    let dir = crate::support::policy_dir(&[("main.toml", &policy(443))]);
    let explain = |url: &str| -> Value {
        let out = crate::support::run_cli([
            "explain",
            "--json",
            "--policies",
            dir.path().to_str().expect("utf-8 temp path"),
            "GET",
            url,
        ]);
        serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("explain --json printed no JSON ({e}): {out:#?}"))
    };
    for url in [
        "https://api.test/ok/..;/admin",
        "https://api.test/ok/%2e%2e%3b/admin",
        "https://api.test/ok/file;v=1",
        "https://api.test/ok//x",
    ] {
        let v = explain(url);
        assert_eq!(v["decision"], "deny", "{url}: {v:#}");
        assert_eq!(v["reason"], "ambiguous_path", "{url}: {v:#}");
    }
    let v = explain("https://other.test/any/file;v=1");
    assert_eq!(v["decision"], "allow", "{v:#}");
}

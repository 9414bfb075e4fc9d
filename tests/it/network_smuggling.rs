//! Request smuggling: framing that two HTTP parsers could read differently (RFC 9112 §6.3) is
//! refused with `400` and an audit record, on the proxy hop and inside an intercepted CONNECT,
//! and never forwarded. latchkey refuses what reaches its pipeline with `ambiguous_framing`;
//! what hyper already refuses while parsing is recorded as `bad_request`. Either is fine; a
//! request that reaches the upstream is not.

use std::io::Write;
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use serde_json::Value;

use crate::support::clients::RawResponse;
use crate::support::{
    connect_tunnel, latchkey, raw_request, read_response, tls_config, Latchkey, TestCa, Upstream,
};

/// One ambiguous request: the header lines after `Host` and the bytes after the head.
struct Smuggle {
    what: &'static str,
    headers: &'static str,
    body: &'static str,
}

const fn smuggle(what: &'static str, headers: &'static str, body: &'static str) -> Smuggle {
    Smuggle {
        what,
        headers,
        body,
    }
}

const CASES: &[Smuggle] = &[
    smuggle(
        "Content-Length and Transfer-Encoding",
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "Transfer-Encoding and Content-Length",
        "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "two equal Content-Lengths",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
        "hello",
    ),
    smuggle(
        "two different Content-Lengths",
        "Content-Length: 5\r\nContent-Length: 6\r\n",
        "hello!",
    ),
    smuggle("a Content-Length list", "Content-Length: 5, 5\r\n", "hello"),
    smuggle("a signed Content-Length", "Content-Length: +5\r\n", "hello"),
    smuggle(
        "Transfer-Encoding: gzip, chunked",
        "Transfer-Encoding: gzip, chunked\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "Transfer-Encoding: identity",
        "Transfer-Encoding: identity\r\n",
        "hello",
    ),
    smuggle(
        "Transfer-Encoding: chunked, chunked",
        "Transfer-Encoding: chunked, chunked\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "two Transfer-Encoding headers",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "whitespace before the colon",
        "Transfer-Encoding : chunked\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "obsolete line folding",
        "Content-Length: 5\r\nX-Folded: first\r\n  continued\r\n",
        "hello",
    ),
];

/// Waits up to 3 s for record number `index` (0-based); `None` if it never came.
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

/// What is wrong with the outcome of one case, if anything.
fn judge(
    case: &Smuggle,
    resp: Result<RawResponse, std::io::Error>,
    record: Option<Value>,
    forwarded: usize,
) -> Vec<String> {
    let mut problems = Vec::new();
    let what = case.what;
    match resp {
        Ok(resp) => {
            if resp.status != 400 {
                problems.push(format!(
                    "{what}: status {} (reason {:?}), expected 400",
                    resp.status,
                    resp.header("x-latchkey-reason")
                ));
            }
            if let Some(reason) = resp.header("x-latchkey-reason") {
                if reason != "ambiguous_framing" && resp.status == 400 {
                    problems.push(format!("{what}: x-latchkey-reason {reason}"));
                }
            }
        }
        Err(e) => problems.push(format!("{what}: no response ({e})")),
    }
    match record {
        Some(record) => {
            let reason = record["reason"].as_str().unwrap_or_default();
            if !matches!(reason, "ambiguous_framing" | "bad_request")
                || record["decision"] != "deny"
                || record["status"] != 400
                || !record["upstream"].is_null()
            {
                problems.push(format!(
                    "{what}: audit decision {} reason {} status {} upstream {}",
                    record["decision"], record["reason"], record["status"], record["upstream"]
                ));
            }
        }
        None => problems.push(format!("{what}: no audit record")),
    }
    if forwarded > 0 {
        problems.push(format!("{what}: forwarded to the upstream"));
    }
    problems
}

#[test]
fn ambiguous_framing_on_the_proxy_hop_is_refused_and_never_forwarded() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .policy(
            "main.toml",
            &format!("[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{port}]\n"),
        )
        .run();

    let mut problems = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let before = upstream.received().len();
        let request = format!(
            "POST http://api.test:{port}/v1/upload HTTP/1.1\r\nHost: api.test:{port}\r\n{}\r\n{}",
            case.headers, case.body
        );
        let resp = raw_request(lk.addr(), request.as_bytes());
        let record = record_at(&lk, i);
        let forwarded = upstream.received().len() - before;
        problems.extend(judge(case, Ok(resp), record, forwarded));
    }
    assert!(
        problems.is_empty(),
        "ambiguous framing on the proxy hop:\n{}",
        problems.join("\n")
    );
    assert_eq!(upstream.connections(), 0);
    lk.wait_audit(CASES.len());
}

#[test]
fn ambiguous_framing_inside_an_intercepted_connect_is_refused_and_never_forwarded() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let lk = latchkey()
        .upstream_ca(&ca)
        .pin("api.test")
        .policy(
            "main.toml",
            &format!("[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{port}]\n"),
        )
        .run();
    let config = tls_config(&lk.ca_pem_path(), &[b"http/1.1"]);

    let mut problems = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let before = upstream.received().len();
        let (tcp, connect) = connect_tunnel(lk.addr(), &format!("api.test:{port}"));
        assert_eq!(connect.status, 200, "{connect:#?}");
        let name = ServerName::try_from("api.test").expect("server name");
        let conn = rustls::ClientConnection::new(config.clone(), name).expect("TLS client");
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let request = format!(
            "POST /v1/upload HTTP/1.1\r\nHost: api.test:{port}\r\n{}\r\n{}",
            case.headers, case.body
        );
        let resp = tls
            .write_all(request.as_bytes())
            .and_then(|()| read_response(&mut tls, false));
        let record = record_at(&lk, i);
        let forwarded = upstream.received().len() - before;
        problems.extend(judge(case, resp, record, forwarded));
    }
    assert!(
        problems.is_empty(),
        "ambiguous framing inside CONNECT:\n{}",
        problems.join("\n")
    );
    assert_eq!(upstream.connections(), 0);
}

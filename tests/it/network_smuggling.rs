//! Request smuggling: framing that two HTTP parsers could read differently (RFC 9112 §6.3) is
//! refused with `400` and an audit record, on the proxy hop and inside an intercepted CONNECT,
//! and never forwarded — with CRLF or bare-LF line endings, as the first head on a connection,
//! pipelined behind another, after a body, and split across reads. latchkey refuses what reaches its pipeline with `ambiguous_framing`;
//! what hyper already refuses while parsing is recorded as `bad_request`. Either is fine; a
//! request that reaches the upstream is not.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use serde_json::Value;

use crate::support::clients::{dial, RawResponse};
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
    smuggle(
        "a folded Transfer-Encoding",
        "Transfer-Encoding:\r\n chunked\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "a folded Content-Length next to Transfer-Encoding",
        "Transfer-Encoding: chunked\r\nContent-Length:\r\n 5\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "whitespace before the colon of Content-Length",
        "Content-Length : 5\r\nTransfer-Encoding: chunked\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "Transfer-Encoding: chunked, identity",
        "Transfer-Encoding: chunked, identity\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "a non-chunked final transfer coding",
        "Transfer-Encoding: chunked, gzip\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "two Transfer-Encodings, one of them not chunked",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "a Content-Length list of different values",
        "Content-Length: 5, 6\r\n",
        "hello!",
    ),
    smuggle("a hex Content-Length", "Content-Length: 0x5\r\n", "hello"),
    smuggle(
        "a Transfer-Encoding with a parameter",
        "Transfer-Encoding: chunked;q=1\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "a Transfer-Encoding that only contains chunked",
        "Transfer-Encoding: xchunked\r\n",
        "0\r\n\r\n",
    ),
    smuggle(
        "two Content-Lengths in different case",
        "content-length: 5\r\nCONTENT-LENGTH: 5\r\n",
        "hello",
    ),
];

/// Each case as sent: CRLF line endings; bare LF throughout (which the old raw-head check,
/// looking for CRLF only, let through); and mixed (CRLF request line and `Host`, bare LF after).
fn forms(case: &Smuggle, line: &str) -> [(String, Vec<u8>); 3] {
    let crlf = format!("{line}\r\n{}\r\n{}", case.headers, case.body);
    let lf = format!(
        "{}\n{}\n{}",
        line.replace("\r\n", "\n"),
        case.headers.replace("\r\n", "\n"),
        case.body
    );
    let mixed = format!(
        "{line}\n{}\n{}",
        case.headers.replace("\r\n", "\n"),
        case.body
    );
    [
        (format!("{} (CRLF)", case.what), crlf.into_bytes()),
        (format!("{} (bare LF)", case.what), lf.into_bytes()),
        (format!("{} (mixed)", case.what), mixed.into_bytes()),
    ]
}

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
    what: &str,
    resp: Result<RawResponse, std::io::Error>,
    record: Option<Value>,
    forwarded: usize,
) -> Vec<String> {
    let mut problems = Vec::new();
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
    let line = format!("POST http://api.test:{port}/v1/upload HTTP/1.1\r\nHost: api.test:{port}");
    let mut i = 0;
    for case in CASES {
        for (what, request) in forms(case, &line) {
            let before = upstream.received().len();
            let resp = raw_request(lk.addr(), &request);
            let record = record_at(&lk, i);
            i += 1;
            let forwarded = upstream.received().len() - before;
            problems.extend(judge(&what, Ok(resp), record, forwarded));
        }
    }
    // Transfer-Encoding on HTTP/1.0 (RFC 9112 §6.1: such a message is faulty).
    let line10 = format!("POST http://api.test:{port}/v1/upload HTTP/1.0\r\nHost: api.test:{port}");
    let te10 = smuggle(
        "Transfer-Encoding on HTTP/1.0",
        "Transfer-Encoding: chunked\r\n",
        "0\r\n\r\n",
    );
    for (what, request) in forms(&te10, &line10) {
        let before = upstream.received().len();
        let resp = raw_request(lk.addr(), &request);
        let record = record_at(&lk, i);
        i += 1;
        let forwarded = upstream.received().len() - before;
        problems.extend(judge(&what, Ok(resp), record, forwarded));
    }
    assert!(
        problems.is_empty(),
        "ambiguous framing on the proxy hop:\n{}",
        problems.join("\n")
    );
    assert_eq!(upstream.connections(), 0);
    lk.wait_audit(i);
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
    let line = format!("POST /v1/upload HTTP/1.1\r\nHost: api.test:{port}");
    let mut i = 0;
    for case in CASES {
        for (what, request) in forms(case, &line) {
            let before = upstream.received().len();
            let mut tls = intercepted(&lk, &config, port);
            let resp = tls
                .write_all(&request)
                .and_then(|()| read_response(&mut tls, false));
            let record = record_at(&lk, i);
            i += 1;
            let forwarded = upstream.received().len() - before;
            problems.extend(judge(&what, resp, record, forwarded));
        }
    }
    assert!(
        problems.is_empty(),
        "ambiguous framing inside CONNECT:\n{}",
        problems.join("\n")
    );
    assert_eq!(upstream.connections(), 0);
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

/// A TLS connection to `api.test:{port}` through an intercepted CONNECT.
fn intercepted(lk: &Latchkey, config: &Arc<rustls::ClientConfig>, port: u16) -> Tls {
    let (tcp, connect) = connect_tunnel(lk.addr(), &format!("api.test:{port}"));
    assert_eq!(connect.status, 200, "{connect:#?}");
    let name = ServerName::try_from("api.test").expect("server name");
    let conn = rustls::ClientConnection::new(config.clone(), name).expect("TLS client");
    rustls::StreamOwned::new(conn, tcp)
}

/// One connection's script: each step writes some bytes and then reads some responses; the
/// statuses expected in order. The smuggled request (if the proxy forwarded it) asks for
/// `/v1/smuggled`, and the clean bodies hide a head for `/v1/hidden`: neither may reach the
/// upstream.
struct Script {
    what: String,
    steps: Vec<(Vec<u8>, usize)>,
    expect: Vec<u16>,
}

/// The scripts for one hop: `target(path)` is the request target (absolute-form on the proxy
/// hop, origin-form inside CONNECT).
fn scripts(port: u16, target: impl Fn(&str) -> String) -> Vec<Script> {
    let host = format!("Host: api.test:{port}");
    let clean = format!("GET {} HTTP/1.1\r\n{host}\r\n\r\n", target("/v1/clean"));
    let clean_lf = format!("GET {} HTTP/1.1\n{host}\n\n", target("/v1/clean"));
    let smuggle = format!(
        "POST {} HTTP/1.1\n{host}\nContent-Length: 4\nTransfer-Encoding: chunked\n\n0\r\n\r\n",
        target("/v1/smuggled")
    );
    let two_cl = format!(
        "POST {} HTTP/1.1\n{host}\nContent-Length: 5\nContent-Length: 5\n\nhello",
        target("/v1/smuggled")
    );
    let hidden = format!("GET {} HTTP/1.1\r\n{host}\r\n\r\n", target("/v1/hidden"));
    let sized = format!(
        "POST {} HTTP/1.1\r\n{host}\r\nContent-Length: {}\r\n\r\n{hidden}",
        target("/v1/clean"),
        hidden.len()
    );
    let chunked = format!(
        "POST {} HTTP/1.1\r\n{host}\r\nTransfer-Encoding: chunked\r\n\r\n\
         {:x};name=\"v\"\r\n{hidden}\r\n0\r\nX-Trailer: 1\r\n\r\n",
        target("/v1/clean"),
        hidden.len()
    );
    let b = |s: &str| s.as_bytes().to_vec();
    let cat = |a: &str, z: &str| format!("{a}{z}").into_bytes();
    let mut out = vec![
        Script {
            what: "CL+TE (bare LF) pipelined behind a clean request".into(),
            steps: vec![(cat(&clean, &smuggle), 2)],
            expect: vec![200, 400],
        },
        Script {
            what: "two Content-Lengths (bare LF) pipelined behind a bare-LF request".into(),
            steps: vec![(cat(&clean_lf, &two_cl), 2)],
            expect: vec![200, 400],
        },
        Script {
            what: "CL+TE after a Content-Length body that holds a head".into(),
            steps: vec![(cat(&sized, &smuggle), 2)],
            expect: vec![200, 400],
        },
        Script {
            what: "CL+TE after a chunked body with an extension and a trailer".into(),
            steps: vec![(cat(&chunked, &smuggle), 2)],
            expect: vec![200, 400],
        },
        Script {
            what: "clean requests pipelined after a chunked and a sized body".into(),
            steps: vec![(format!("{chunked}{sized}{clean_lf}{clean}").into_bytes(), 4)],
            expect: vec![200, 200, 200, 200],
        },
        Script {
            what: "CL+TE on the second request of a keep-alive connection".into(),
            steps: vec![(b(&clean), 1), (b(&smuggle), 1)],
            expect: vec![200, 400],
        },
    ];
    // Split across reads: part of the smuggling head rides behind the first request, the rest
    // comes after its answer (mid request line, mid header name, between the final LFs).
    for cut in [
        5,
        smuggle.find("Transfer-Enc").map_or(0, |i| i + 8),
        smuggle.find("\n\n").map_or(0, |i| i + 1),
    ] {
        out.push(Script {
            what: format!("CL+TE split across reads at byte {cut}"),
            steps: vec![(cat(&clean, &smuggle[..cut]), 1), (b(&smuggle[cut..]), 1)],
            expect: vec![200, 400],
        });
    }
    out
}

/// Runs one script; the statuses read, or why it stopped.
fn run_script<S: Read + Write>(s: &mut S, script: &Script) -> Result<Vec<u16>, String> {
    let mut statuses = Vec::new();
    for (bytes, reads) in &script.steps {
        s.write_all(bytes)
            .and_then(|()| s.flush())
            .map_err(|e| format!("write: {e} after {statuses:?}"))?;
        for _ in 0..*reads {
            let resp =
                read_response(s, false).map_err(|e| format!("read: {e} after {statuses:?}"))?;
            statuses.push(resp.status);
        }
    }
    Ok(statuses)
}

/// What is wrong with a script's outcome: statuses, records (one allow per 200, one
/// `ambiguous_framing` deny per 400), and what reached the upstream.
fn judge_script(
    lk: &Latchkey,
    upstream: &Upstream,
    script: &Script,
    outcome: Result<Vec<u16>, String>,
    records_before: usize,
    received_before: usize,
) -> Vec<String> {
    let what = &script.what;
    let mut problems = Vec::new();
    match outcome {
        Ok(statuses) if statuses == script.expect => {}
        Ok(statuses) => problems.push(format!(
            "{what}: statuses {statuses:?}, expected {:?}",
            script.expect
        )),
        Err(e) => problems.push(format!("{what}: {e}")),
    }
    let want = records_before + script.expect.len();
    let Some(_) = record_at(lk, want - 1) else {
        problems.push(format!(
            "{what}: fewer than {} new audit records",
            script.expect.len()
        ));
        return problems;
    };
    let records = lk.audit_records();
    let new = &records[records_before..];
    let denied = new
        .iter()
        .filter(|r| {
            r["reason"] == "ambiguous_framing"
                && r["decision"] == "deny"
                && r["status"] == 400
                && r["upstream"].is_null()
        })
        .count();
    let allowed = new.iter().filter(|r| r["decision"] == "allow").count();
    let want_denied = script.expect.iter().filter(|s| **s == 400).count();
    if denied != want_denied
        || allowed != script.expect.len() - want_denied
        || new.len() != script.expect.len()
    {
        problems.push(format!("{what}: audit records {new:#?}"));
    }
    let received = upstream.received();
    let fresh = &received[received_before.min(received.len())..];
    if fresh.len() != script.expect.len() - want_denied {
        problems.push(format!(
            "{what}: upstream received {} requests",
            fresh.len()
        ));
    }
    for r in fresh {
        if r.path_only() != "/v1/clean" {
            problems.push(format!("{what}: upstream received {:?}", r.path_only()));
        }
    }
    problems
}

#[test]
fn pipelined_split_and_after_body_heads_on_the_proxy_hop_are_judged_one_by_one() {
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
    for script in scripts(port, |p| format!("http://api.test:{port}{p}")) {
        let (records, received) = (lk.audit_records().len(), upstream.received().len());
        let mut tcp = dial(lk.addr());
        let outcome = run_script(&mut tcp, &script);
        problems.extend(judge_script(
            &lk, &upstream, &script, outcome, records, received,
        ));
    }
    assert!(problems.is_empty(), "proxy hop:\n{}", problems.join("\n"));
}

#[test]
fn pipelined_split_and_after_body_heads_inside_an_intercepted_connect_are_judged_one_by_one() {
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
    for script in scripts(port, str::to_string) {
        let (records, received) = (lk.audit_records().len(), upstream.received().len());
        let mut tls = intercepted(&lk, &config, port);
        let outcome = run_script(&mut tls, &script);
        problems.extend(judge_script(
            &lk, &upstream, &script, outcome, records, received,
        ));
    }
    assert!(
        problems.is_empty(),
        "inside CONNECT:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_connect_with_ambiguous_framing_is_refused_before_any_tunnel() {
    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .policy(
            "main.toml",
            &format!("[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{port}]\n"),
        )
        .run();
    let req = format!(
        "CONNECT api.test:{port} HTTP/1.1\nHost: api.test:{port}\nTransfer-Encoding: chunked\nContent-Length: 5\n\n0\r\n\r\n"
    );
    let resp = raw_request(lk.addr(), req.as_bytes());
    let record = record_at(&lk, 0);
    let problems = judge(
        "CONNECT with CL+TE (bare LF)",
        Ok(resp),
        record,
        upstream.received().len(),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(upstream.connections(), 0);
}

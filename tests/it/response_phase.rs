//! The response phase against hostile upstreams: every part of a response the sandbox can see
//! (status line, header names and values, body under any coding, trailers) is scanned or
//! dropped; codings are decided on the head as the upstream sent it; decompression is bounded.
//!
//! The upstream here writes raw HTTP/1.1 bytes over TLS (so it can send what no well-behaved
//! server library would); the h2 cases use the support echo server with its own handler.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::support::secrets::{compress, tls_through};
use crate::support::upstream::{handler, Received, UpBody};
use crate::support::{latchkey, Latchkey, TestCa, Upstream};

/// Mixed case on purpose: HTTP lower-cases header names, which must not hide it.
pub(crate) const KEY: &str = "sk-Reflect-Key-0123456789abcdef";

fn policy(port: u16) -> String {
    format!(
        r#"
[secrets.key]
source = "env:LK_RESPONSE_KEY"

[[rules]]
name  = "api"
hosts = ["api.test"]
ports = [{port}]
[rules.inject.headers]
authorization = "Bearer {{{{secret.key}}}}"

# Binds nothing itself, but the rule below binds the key to the same host: its responses
# are scanned too.
[[rules]]
name    = "open"
hosts   = ["other.test"]
ports   = [{port}]
methods = ["GET", "HEAD"]

[[rules]]
name    = "other-post"
hosts   = ["other.test"]
ports   = [{port}]
methods = ["POST"]
secrets = ["key"]
"#
    )
}

pub(crate) fn start(ca: &TestCa, port: u16) -> Latchkey {
    latchkey()
        .upstream_ca(ca)
        .policy("main.toml", &policy(port))
        .env("LK_RESPONSE_KEY", KEY)
        .pin("api.test")
        .pin("other.test")
        .run()
}

/// Whether `bytes` hold the key in any ASCII case.
pub(crate) fn holds_key(bytes: &[u8]) -> bool {
    let lower = String::from_utf8_lossy(bytes).to_ascii_lowercase();
    lower.contains(&KEY.to_ascii_lowercase())
}

// ---------------------------------------------------------------------------------------------
// A raw HTTP/1.1-over-TLS upstream

/// Answers each connection's one request with the canned bytes of the first route whose path
/// prefix matches, then closes.
pub(crate) struct RawUpstream {
    pub(crate) port: u16,
}

impl RawUpstream {
    pub(crate) fn start(ca: &TestCa, routes: Vec<(&'static str, Vec<u8>)>) -> RawUpstream {
        let (chain, key) = ca.issue(crate::support::ca::UPSTREAM_NAMES);
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("certificate");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let routes = Arc::new(routes);
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { continue };
                let config = config.clone();
                let routes = routes.clone();
                std::thread::spawn(move || {
                    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match tls.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let text = String::from_utf8_lossy(&head);
                    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let answer = routes
                        .iter()
                        .find(|(prefix, _)| path.starts_with(prefix))
                        .map(|(_, bytes)| bytes.clone())
                        .unwrap_or_else(|| {
                            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                                .to_vec()
                        });
                    let _ = tls.write_all(&answer);
                    let _ = tls.flush();
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                });
            }
        });
        RawUpstream { port }
    }
}

pub(crate) fn with_body(head: &str, body: &[u8]) -> Vec<u8> {
    let mut out = head.replace('\n', "\r\n").into_bytes();
    out.extend_from_slice(body);
    out
}

pub(crate) fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// `GET path` over HTTP/1.1 inside a CONNECT to `authority`; the raw response bytes.
pub(crate) fn h1_raw(lk: &Latchkey, authority: &str, path: &str, extra: &str) -> Vec<u8> {
    let mut tls = tls_through(lk, authority);
    let req =
        format!("GET {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n{extra}\r\n");
    tls.write_all(req.as_bytes()).expect("write request");
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 16 * 1024];
    while std::time::Instant::now() < deadline {
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
            Err(_) => break,
        }
    }
    out
}

/// What an h2 client saw.
#[derive(Debug)]
pub(crate) struct H2Response {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
    pub(crate) trailers: Option<HeaderMap>,
    /// The body ended in an error (stream reset).
    pub(crate) error: Option<String>,
}

/// `method path` over h2 inside a CONNECT to `authority`.
pub(crate) fn h2_request(lk: &Latchkey, authority: &str, method: &str, path: &str) -> H2Response {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let proxy = lk.addr();
    let ca = lk.ca_pem_path();
    let (authority, method, path) = (authority.to_string(), method.to_string(), path.to_string());
    rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let std_tcp = crate::support::clients::dial(proxy);
        std_tcp.set_nonblocking(true).expect("non-blocking");
        let mut tcp = tokio::net::TcpStream::from_std(std_tcp).expect("tokio socket");
        tcp.write_all(
            format!("CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n\r\n").as_bytes(),
        )
        .await
        .expect("CONNECT");
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(
                tcp.read(&mut b).await.expect("CONNECT answer"),
                1,
                "CONNECT closed"
            );
            head.push(b[0]);
        }
        assert!(
            head.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        let host = authority.split(':').next().expect("host").to_string();
        let config = crate::support::tls_config(&ca, &[b"h2"]);
        let name = rustls_pki_types::ServerName::try_from(host).expect("name");
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .expect("TLS with latchkey");
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .expect("h2 handshake");
        tokio::spawn(conn);
        let req = http::Request::builder()
            .method(method.as_str())
            .uri(format!("https://{authority}{path}"))
            .header("te", "trailers")
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let res = tokio::time::timeout(Duration::from_secs(20), sender.send_request(req))
            .await
            .expect("response in time")
            .expect("response");
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let mut body = res.into_body();
        let mut out = H2Response {
            status,
            headers,
            body: Vec::new(),
            trailers: None,
            error: None,
        };
        loop {
            match tokio::time::timeout(Duration::from_secs(20), body.frame()).await {
                Ok(Some(Ok(frame))) => match frame.into_data() {
                    Ok(d) => out.body.extend_from_slice(&d),
                    Err(f) => out.trailers = f.into_trailers().ok(),
                },
                Ok(Some(Err(e))) => {
                    out.error = Some(e.to_string());
                    break;
                }
                Ok(None) => break,
                Err(_) => {
                    out.error = Some("timed out".to_string());
                    break;
                }
            }
        }
        out
    })
}

pub(crate) fn record_for<'a>(records: &'a [Value], path: &str) -> &'a Value {
    records
        .iter()
        .find(|r| r["path"].as_str().is_some_and(|p| p.starts_with(path)))
        .unwrap_or_else(|| panic!("no audit record for {path}: {records:#?}"))
}

/// Waits until the audit log has a record for every path.
pub(crate) fn records_for(lk: &Latchkey, paths: &[&str]) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let records = lk.audit_records();
        let all = paths.iter().all(|p| {
            records
                .iter()
                .any(|r| r["path"].as_str().is_some_and(|rp| rp.starts_with(p)))
        });
        if all || std::time::Instant::now() > deadline {
            return records;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn peak_rss_kib(lk: &Latchkey) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", lk.pid())).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn a_secret_in_the_reason_phrase_a_header_name_or_a_forged_latchkey_header_never_reaches_the_sandbox(
) {
    let ca = TestCa::new();
    let lower = KEY.to_ascii_lowercase();
    let up = RawUpstream::start(
        &ca,
        vec![
            (
                "/reason",
                with_body(
                    &format!("HTTP/1.1 200 Fine {KEY}\ncontent-length: 2\nconnection: close\n\n"),
                    b"ok",
                ),
            ),
            (
                "/name",
                with_body(
                    &format!(
                        "HTTP/1.1 200 OK\nx-{KEY}: 1\n{lower}: 2\nx-plain: kept\ncontent-length: 2\nconnection: close\n\n"
                    ),
                    b"ok",
                ),
            ),
            (
                "/early-hints",
                with_body(
                    &format!("HTTP/1.1 103 Early Hints {KEY}\nlink: </{KEY}>; rel=preload\n\nHTTP/1.1 100 Continue\nx-echo: {KEY}\n\nHTTP/1.1 200 OK\ncontent-length: 2\nconnection: close\n\n"),
                    b"ok",
                ),
            ),
            (
                "/forged",
                with_body(
                    "HTTP/1.1 200 OK\nx-latchkey-decision: deny\nX-Latchkey-Rule: forged\nx-latchkey-reason: no_rule\nx-latchkey-id: forged-id\ncontent-length: 2\nconnection: close\n\n",
                    b"ok",
                ),
            ),
        ],
    );
    let lk = start(&ca, up.port);
    let authority = format!("api.test:{}", up.port);

    for (path, via_h2) in [
        ("/reason", false),
        ("/reason", true),
        ("/name", false),
        ("/name", true),
        // Informational responses (a 103 and a 100 holding the key) never reach the sandbox.
        ("/early-hints", false),
        ("/early-hints", true),
    ] {
        let what = format!("{path} over {}", if via_h2 { "h2" } else { "HTTP/1.1" });
        if via_h2 {
            let r = h2_request(&lk, &authority, "GET", path);
            assert_eq!(r.status, 200, "{what}: {r:?}");
            for (name, value) in &r.headers {
                assert!(
                    !holds_key(name.as_str().as_bytes()),
                    "{what}: header name {name}"
                );
                assert!(!holds_key(value.as_bytes()), "{what}: header {name}");
            }
            assert_eq!(r.body, b"ok", "{what}");
        } else {
            let raw = h1_raw(&lk, &authority, path, "");
            assert!(
                !holds_key(&raw),
                "{what}: {}",
                String::from_utf8_lossy(&raw)
            );
            assert!(
                raw.starts_with(b"HTTP/1.1 200 OK\r\n"),
                "{what}: canonical reason: {}",
                String::from_utf8_lossy(&raw)
            );
            if path == "/name" {
                let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
                assert!(
                    text.contains("x-plain: kept"),
                    "{what}: other headers stay: {text}"
                );
            }
        }
    }

    // Forged latchkey headers are removed; the id is latchkey's own and names the record.
    let r = h2_request(&lk, &authority, "GET", "/forged");
    assert_eq!(r.status, 200);
    for name in [
        "x-latchkey-decision",
        "x-latchkey-rule",
        "x-latchkey-reason",
    ] {
        assert!(
            !r.headers.contains_key(name),
            "{name} forged through: {:?}",
            r.headers
        );
    }
    let id = r.headers["x-latchkey-id"].to_str().expect("id").to_string();
    assert_ne!(id, "forged-id");

    let records = records_for(&lk, &["/reason", "/name", "/forged"]);
    let name_records: Vec<_> = records.iter().filter(|r| r["path"] == "/name").collect();
    assert_eq!(name_records.len(), 2);
    for r in name_records {
        assert_eq!(r["reason"], "allowed", "{r:#}");
        assert!(r["redactions"].as_u64().unwrap_or(0) >= 2, "{r:#}");
    }
    assert!(
        records.iter().any(|r| r["id"] == id.as_str()),
        "x-latchkey-id names the record"
    );
    assert!(!holds_key(lk.audit_text().as_bytes()));
    assert!(!holds_key(lk.stderr_text().as_bytes()));
}

#[test]
fn compression_hidden_behind_connection_or_a_transfer_coding_is_decoded_or_refused() {
    let ca = TestCa::new();
    let body = format!("the key is {KEY} and that is all\n");
    let gz = compress("gzip", body.as_bytes());
    let br = compress("br", body.as_bytes());
    let mut te_gzip =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\nconnection: close\r\n\r\n"
            .to_vec();
    te_gzip.extend_from_slice(&chunk(&gz));
    te_gzip.extend_from_slice(b"0\r\n\r\n");
    let mut te_gzip_alone =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\nconnection: close\r\n\r\n".to_vec();
    te_gzip_alone.extend_from_slice(&gz);
    let up = RawUpstream::start(
        &ca,
        vec![
            (
                "/conn-gzip",
                with_body(
                    &format!("HTTP/1.1 200 OK\ncontent-type: text/plain\nconnection: close, content-encoding\ncontent-encoding: gzip\ncontent-length: {}\n\n", gz.len()),
                    &gz,
                ),
            ),
            (
                "/conn-br-upper",
                with_body(
                    &format!("HTTP/1.1 200 OK\nConnection: Content-Encoding, close\nContent-Encoding: BR\ncontent-length: {}\n\n", br.len()),
                    &br,
                ),
            ),
            ("/te-gzip-chunked", te_gzip),
            ("/te-gzip", te_gzip_alone),
            (
                "/zstd",
                with_body(
                    "HTTP/1.1 200 OK\ncontent-encoding: zstd\ncontent-length: 4\nconnection: close\n\n",
                    b"abcd",
                ),
            ),
        ],
    );
    let lk = start(&ca, up.port);
    let authority = format!("api.test:{}", up.port);

    for path in ["/conn-gzip", "/conn-br-upper"] {
        let r = h2_request(&lk, &authority, "GET", path);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert!(
            !holds_key(&r.body),
            "{path}: {:?}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(
            String::from_utf8_lossy(&r.body),
            "the key is [REDACTED:key] and that is all\n",
            "{path}: decoded and redacted"
        );
        assert!(!r.headers.contains_key("content-encoding"), "{path}");
        let raw = h1_raw(&lk, &authority, path, "");
        assert!(!holds_key(&raw), "{path} over HTTP/1.1");
        assert!(
            String::from_utf8_lossy(&raw).contains("[REDACTED:key]"),
            "{path} over HTTP/1.1: {}",
            String::from_utf8_lossy(&raw)
        );
    }
    for path in ["/te-gzip-chunked", "/te-gzip", "/zstd"] {
        let r = h2_request(&lk, &authority, "GET", path);
        assert_eq!(r.status, 502, "{path}: {r:?}");
        assert_eq!(
            r.headers["x-latchkey-reason"], "uninspectable_body",
            "{path}"
        );
        assert!(!holds_key(&r.body));
    }

    let records = records_for(
        &lk,
        &[
            "/conn-gzip",
            "/conn-br-upper",
            "/te-gzip-chunked",
            "/te-gzip",
            "/zstd",
        ],
    );
    for path in ["/conn-gzip", "/conn-br-upper"] {
        let r = record_for(&records, path);
        assert_eq!(r["reason"], "allowed", "{r:#}");
        assert!(r["redactions"].as_u64().unwrap_or(0) >= 1, "{r:#}");
    }
    for path in ["/te-gzip-chunked", "/te-gzip", "/zstd"] {
        let r = record_for(&records, path);
        assert_eq!(r["reason"], "uninspectable_body", "{r:#}");
        assert_eq!(r["status"], 502, "{r:#}");
    }
}

#[test]
fn trailers_from_an_http1_upstream_reach_an_h2_sandbox_scrubbed_not_dropped() {
    let ca = TestCa::new();
    let lower = KEY.to_ascii_lowercase();
    let mut chunked = b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ntransfer-encoding: chunked\r\ntrailer: grpc-status, grpc-message\r\nconnection: close\r\n\r\n".to_vec();
    chunked.extend_from_slice(&chunk(format!("body holds {KEY} once").as_bytes()));
    chunked.extend_from_slice(
        format!("0\r\ngrpc-status: 7\r\ngrpc-message: bad key {KEY}\r\nx-{lower}: 1\r\nx-latchkey-decision: deny\r\n\r\n").as_bytes(),
    );
    let up = RawUpstream::start(&ca, vec![("/trailers", chunked)]);
    let lk = start(&ca, up.port);
    let authority = format!("api.test:{}", up.port);

    let r = h2_request(&lk, &authority, "GET", "/trailers");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.error, None, "{r:?}");
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        "body holds [REDACTED:key] once"
    );
    let t = r.trailers.expect("trailers are passed on");
    assert_eq!(t["grpc-status"], "7");
    assert_eq!(t["grpc-message"], "bad key [REDACTED:key]");
    assert_eq!(
        t.len(),
        2,
        "a trailer named after the key and forged latchkey trailers are dropped: {t:?}"
    );
    let records = records_for(&lk, &["/trailers"]);
    let rec = record_for(&records, "/trailers");
    assert!(rec["redactions"].as_u64().unwrap_or(0) >= 3, "{rec:#}");
}

/// A body of fixed frames, trailers included (for the h2 echo upstream).
pub(crate) struct FramesBody(pub(crate) VecDeque<Frame<Bytes>>);

impl http_body::Body for FramesBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

#[test]
fn trailers_from_an_h2_upstream_are_scrubbed_and_te_trailers_reaches_it() {
    let ca = TestCa::new();
    let up = Upstream::https_with(
        &ca,
        handler(|req: Received| async move {
            let te = req.header("te").unwrap_or("none").to_string();
            let mut t = HeaderMap::new();
            t.insert("grpc-status", "3".parse().expect("v"));
            t.insert(
                "grpc-message",
                format!("reflected {KEY}").parse().expect("v"),
            );
            t.insert("x-te-seen", te.parse().expect("v"));
            let frames = VecDeque::from(vec![
                Frame::data(Bytes::from(format!("version {:?}", req.version))),
                Frame::trailers(t),
            ]);
            let body: UpBody = FramesBody(frames).boxed();
            http::Response::builder()
                .header("content-type", "application/grpc")
                .body(body)
                .expect("response")
        }),
    );
    let lk = start(&ca, up.port());
    let authority = format!("api.test:{}", up.port());
    let r = h2_request(&lk, &authority, "POST", "/svc.Echo/Call");
    // POST on api.test is allowed by the injecting rule.
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        String::from_utf8_lossy(&r.body).contains("HTTP/2"),
        "the upstream leg is h2: {:?}",
        String::from_utf8_lossy(&r.body)
    );
    let t = r.trailers.expect("trailers");
    assert_eq!(t["grpc-status"], "3");
    assert_eq!(t["grpc-message"], "reflected [REDACTED:key]");
    assert_eq!(
        t["x-te-seen"], "trailers",
        "TE: trailers reaches an h2 upstream"
    );
}

#[test]
fn a_decompression_bomb_is_refused_or_cut_off_with_bounded_memory() {
    let ca = TestCa::new();
    let zeros = vec![0u8; 200 * 1024 * 1024];
    let br = compress("br", &zeros);
    let gz = compress("gzip", &zeros);
    assert!(
        br.len() < 100_000 && gz.len() < 300_000,
        "{} {}",
        br.len(),
        gz.len()
    );
    let up = RawUpstream::start(
        &ca,
        vec![
            (
                "/bomb-br",
                with_body(
                    &format!("HTTP/1.1 200 OK\ncontent-encoding: br\ncontent-length: {}\nconnection: close\n\n", br.len()),
                    &br,
                ),
            ),
            (
                "/bomb-gzip",
                with_body(
                    &format!("HTTP/1.1 200 OK\ncontent-encoding: gzip\ncontent-length: {}\nconnection: close\n\n", gz.len()),
                    &gz,
                ),
            ),
        ],
    );
    let lk = start(&ca, up.port);
    let authority = format!("api.test:{}", up.port);
    let before = peak_rss_kib(&lk);

    // One small frame that already inflates past the limit: refused before the head is sent.
    let r = h2_request(&lk, &authority, "GET", "/bomb-br");
    assert_eq!(r.status, 502, "{:?} {:?}", r.status, r.headers);
    assert_eq!(r.headers["x-latchkey-reason"], "decompression_limit");
    // Spread over many frames: refused at the head or cut off mid-body, never delivered whole.
    let r = h2_request(&lk, &authority, "GET", "/bomb-gzip");
    if r.status == 200 {
        assert!(r.error.is_some(), "the body must be cut off");
        assert!(
            r.body.len() <= 64 * 1024 * 1024 + 64 * 1024,
            "{}",
            r.body.len()
        );
    } else {
        assert_eq!(r.status, 502);
    }

    let records = records_for(&lk, &["/bomb-br", "/bomb-gzip"]);
    for path in ["/bomb-br", "/bomb-gzip"] {
        assert_eq!(
            record_for(&records, path)["reason"],
            "decompression_limit",
            "{path}"
        );
    }
    let grown = peak_rss_kib(&lk).saturating_sub(before);
    eprintln!(
        "bombs: brotli {} B, gzip {} B; peak RSS {before} KiB before, grew by {grown} KiB",
        br.len(),
        gz.len()
    );
    assert!(
        grown < 100 * 1024,
        "latchkey's peak RSS grew by {grown} KiB on two bombs"
    );
}

#[test]
fn bodiless_responses_with_a_content_coding_work_over_h2_and_http1() {
    let ca = TestCa::new();
    let up = RawUpstream::start(
        &ca,
        vec![
            (
                "/304",
                b"HTTP/1.1 304 Not Modified\r\ncontent-encoding: gzip\r\netag: \"x\"\r\nconnection: close\r\n\r\n".to_vec(),
            ),
            (
                "/204",
                b"HTTP/1.1 204 No Content\r\ncontent-encoding: gzip\r\nconnection: close\r\n\r\n".to_vec(),
            ),
            (
                "/head",
                b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 120\r\nconnection: close\r\n\r\n".to_vec(),
            ),
            (
                "/empty",
                b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec(),
            ),
        ],
    );
    let lk = start(&ca, up.port);
    for (path, method, status) in [
        ("/304", "GET", 304),
        ("/204", "GET", 204),
        ("/head", "HEAD", 200),
        ("/empty", "GET", 200),
    ] {
        let out = crate::support::curl(&lk)
            .args([
                "--http2",
                "-X",
                method,
                if method == "HEAD" {
                    "--head"
                } else {
                    "--compressed"
                },
                &format!("https://other.test:{}{path}", up.port),
            ])
            .run();
        assert_eq!(out.exit, Some(0), "{path} over h2: {out:#?}");
        assert_eq!(out.http_version, "2", "{path}");
        assert_eq!(out.response.status, status, "{path}");
        let r = h2_request(&lk, &format!("other.test:{}", up.port), method, path);
        assert_eq!(r.status, status, "{path}");
        assert_eq!(r.error, None, "{path}: {r:?}");
    }
}

#[test]
fn a_rule_that_binds_no_secret_is_scanned_when_another_rule_binds_one_to_the_host() {
    let ca = TestCa::new();
    let up = RawUpstream::start(
        &ca,
        vec![(
            "/reflect",
            with_body(
                &format!(
                    "HTTP/1.1 200 OK\nx-echo: {KEY}\ncontent-length: {}\nconnection: close\n\n",
                    KEY.len()
                ),
                KEY.as_bytes(),
            ),
        )],
    );
    let lk = start(&ca, up.port);
    let r = h2_request(&lk, &format!("other.test:{}", up.port), "GET", "/reflect");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"[REDACTED:key]");
    assert_eq!(r.headers["x-echo"], "[REDACTED:key]");
    let records = records_for(&lk, &["/reflect"]);
    let rec = record_for(&records, "/reflect");
    assert_eq!(rec["rule"], "open");
    assert_eq!(rec["redactions"], 2);
}

/// A real gRPC client and server (grpcio) through the MITM: `TE: trailers` reaches the server
/// (grpc refuses a call without it), the status travels in trailers, and a credential the
/// server reflects in `grpc-message` reaches the client redacted.
#[test]
fn a_grpc_call_round_trips_through_the_mitm_and_a_reflected_credential_is_redacted_in_its_status() {
    let (server, lk) = grpc_world();
    let call = |payload: &str| grpc_client(&lk, server.port(), "call", payload);
    let ok = call("hello");
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(
        ok["reply"],
        format!("ok:{}", "Bearer ".len() + KEY.len()),
        "the injected credential reached the server"
    );
    let failed = call("fail");
    assert_eq!(failed["ok"], false, "{failed}");
    assert_eq!(failed["code"], "PERMISSION_DENIED", "{failed}");
    assert_eq!(
        failed["details"], "rejected credential Bearer [REDACTED:key]",
        "{failed}"
    );
    let calls = server.wait_events("call", 2);
    assert!(
        calls.iter().all(|c| c["auth"] == format!("Bearer {KEY}")),
        "{calls:?}"
    );
    let records = records_for(&lk, &["/test.Echo/Call"]);
    let recs: Vec<_> = records
        .iter()
        .filter(|r| r["path"] == "/test.Echo/Call")
        .collect();
    assert_eq!(recs.len(), 2, "{records:#?}");
    assert!(recs
        .iter()
        .all(|r| r["reason"] == "allowed" && r["rule"] == "api"));
    assert!(recs
        .iter()
        .any(|r| r["redactions"].as_u64().unwrap_or(0) >= 1));
}

/// The grpcio server (`grpc_echo.py --tls`, its certificate from a fresh test CA) and latchkey
/// in front of it, trusting that CA.
fn grpc_world() -> (crate::support::credentials::PyServer, Latchkey) {
    let ca = TestCa::new();
    let (cert, key) = ca.issue_pem_files(crate::support::ca::UPSTREAM_NAMES, "grpc");
    let server = crate::support::credentials::PyServer::start("grpc_echo.py", &cert, &key, &[]);
    let lk = start(&ca, server.port());
    (server, lk)
}

/// Runs `tests/clients/grpc_echo.py MODE` against the gRPC server on `port` through latchkey,
/// trusting only latchkey's CA; its JSON line. Nothing it prints may hold the key.
fn grpc_client(lk: &Latchkey, port: u16, mode: &str, arg: &str) -> Value {
    let mut cmd = std::process::Command::new(crate::support::toolchain::python());
    cmd.arg(format!(
        "{}/tests/clients/grpc_echo.py",
        env!("CARGO_MANIFEST_DIR")
    ))
    .args([mode, &format!("api.test:{port}")])
    .arg(lk.ca_pem_path())
    .arg(lk.proxy_url())
    .arg(arg);
    for var in crate::support::latchkey::SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd.env_remove("no_grpc_proxy").env_remove("NO_GRPC_PROXY");
    let out = crate::support::latchkey::wait_with_timeout(&mut cmd, Duration::from_secs(40));
    assert!(
        !holds_key(out.stdout.as_bytes()) && !holds_key(out.stderr.as_bytes()),
        "{out:?}"
    );
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("grpc client output ({e}): {out:?}"))
}

/// Streaming gRPC through the MITM (grpcio both ends): a server stream's messages all arrive and
/// its final status, which reflects the injected credential, arrives redacted; a bidirectional
/// ping-pong (each message sent only after the previous reply came back, so a proxy buffering
/// either direction would stall it) completes, and its status is redacted too.
#[test]
fn grpc_server_streaming_and_bidi_ping_pong_stream_through_the_mitm_with_the_status_redacted() {
    let (server, lk) = grpc_world();

    let streamed = grpc_client(&lk, server.port(), "stream", "25");
    let parts: Vec<String> = (0..25).map(|i| format!("part-{i}")).collect();
    assert_eq!(streamed["replies"], json!(parts), "{streamed}");
    assert_eq!(streamed["code"], "PERMISSION_DENIED", "{streamed}");
    assert_eq!(
        streamed["details"], "stream ended, credential Bearer [REDACTED:key]",
        "{streamed}"
    );

    let chat = grpc_client(&lk, server.port(), "chat", "8");
    let echoes: Vec<String> = (0..8).map(|i| format!("echo:m{i}")).collect();
    assert_eq!(chat["replies"], json!(echoes), "{chat}");
    assert_eq!(chat["code"], "PERMISSION_DENIED", "{chat}");
    assert_eq!(
        chat["details"], "chat over, credential Bearer [REDACTED:key]",
        "{chat}"
    );

    let seen = server.wait_events("stream", 1);
    assert_eq!(
        seen[0]["auth"],
        format!("Bearer {KEY}"),
        "the credential reached the server"
    );
    let chats = server.wait_events("chat", 1);
    assert_eq!(chats[0]["messages"], 8, "{chats:?}");
    assert_eq!(chats[0]["auth"], format!("Bearer {KEY}"));

    let records = records_for(&lk, &["/test.Echo/Stream", "/test.Echo/Chat"]);
    for path in ["/test.Echo/Stream", "/test.Echo/Chat"] {
        let rec = record_for(&records, path);
        assert_eq!(rec["reason"], "allowed", "{rec:#}");
        assert_eq!(rec["rule"], "api", "{rec:#}");
        assert!(rec["redactions"].as_u64().unwrap_or(0) >= 1, "{rec:#}");
        assert!(rec["bytes_down"].as_u64().unwrap_or(0) > 0, "{rec:#}");
    }
}

//! Request bodies stream; memory is a budget. An upload reaches the upstream while the client is
//! still sending it (curl over HTTP/1.1 chunked and h2); a secret found mid-stream aborts the
//! upstream request (the upstream never gets the value, nor the rest of the body) and the client
//! gets the refusal; trailers are checked like headers (h1 chunked and h2, small bodies and
//! bodies over 8 MiB); bodies latchkey must hold whole are charged to `--max-buffered-bytes` and
//! a client's share (`503 too_busy` past it, released when the body is sent); a client that
//! stops sending its body is cut by `--body-timeout` (`408 body_timeout`, the upstream request
//! aborted).

use std::convert::Infallible;
use std::io::{Read, Write};
use std::pin::Pin;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;

use crate::support::clients::{dial, read_response, tls_config, RawResponse};
use crate::support::latchkey::SCRUBBED_ENV;
use crate::support::secrets::{
    assert_no_leak, contains, env_secrets_world, secrets_toml, tls_through, SecretsWorld, OPENAI,
    SECRET_ENV,
};
use crate::support::upstream::Received;
use crate::support::{assert_denial, assert_record, latchkey, Latchkey, Upstream};

/// `openai` injected on api.test; other.test binds nothing.
const RULES: &str = crate::support::secrets::OPENAI_RULES;

const MIB: usize = 1024 * 1024;

fn world() -> SecretsWorld {
    env_secrets_world(&["openai"], RULES)
}

/// Waits up to 10 s for the upstream to have received a request to `path` whose body so far
/// satisfies `done`.
pub(crate) fn wait_upstream(
    w: &Upstream,
    path: &str,
    done: impl Fn(&Received) -> bool,
) -> Received {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = w.received().into_iter().find(|r| r.path == path && done(r)) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "the upstream did not receive what the test waited for at {path}: {:#?}",
            w.received()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// curl uploading from a pipe the test writes, so the test decides when each part is sent

pub(crate) struct Upload {
    child: Child,
    stdin: Option<ChildStdin>,
    headers: std::path::PathBuf,
    body: std::path::PathBuf,
}

/// `curl -T - URL` through latchkey: the body is what the test writes to stdin (chunked over
/// HTTP/1.1, DATA frames over h2).
pub(crate) fn curl_upload(lk: &Latchkey, flag: &str, url: &str) -> Upload {
    let dir = tempfile::Builder::new()
        .prefix("upload")
        .tempdir_in(lk.scratch())
        .expect("scratch")
        .keep();
    let capath = dir.join("capath");
    std::fs::create_dir(&capath).expect("capath");
    let (headers, body) = (dir.join("headers"), dir.join("body"));
    let mut cmd = Command::new(crate::support::toolchain::tool("curl"));
    cmd.args(["-q", "-sS", "--max-time", "30", flag, "-x"])
        .arg(lk.proxy_url())
        .arg("--cacert")
        .arg(lk.ca_pem_path())
        .arg("--capath")
        .arg(&capath)
        .arg("-D")
        .arg(&headers)
        .arg("-o")
        .arg(&body)
        .args(["-T", "-", url])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("stderr")).expect("stderr file"),
        ));
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let mut child = cmd.spawn().expect("spawn curl");
    let stdin = child.stdin.take();
    Upload {
        child,
        stdin,
        headers,
        body,
    }
}

impl Upload {
    /// Writes `bytes` (ignoring a pipe curl has closed: it may have stopped on the refusal).
    pub(crate) fn send(&mut self, bytes: &[u8]) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(bytes);
            let _ = stdin.flush();
        }
    }

    /// Ends the body, waits for curl and returns the status, reason header and body it got.
    pub(crate) fn finish(mut self) -> (u16, Option<String>, String) {
        self.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("poll curl").is_none() {
            assert!(Instant::now() < deadline, "curl did not finish");
            std::thread::sleep(Duration::from_millis(20));
        }
        let head = std::fs::read_to_string(&self.headers).unwrap_or_default();
        let block = head
            .replace("\r\n", "\n")
            .split("\n\n")
            .filter(|b| b.starts_with("HTTP/") && !b.contains(" 100 "))
            .last()
            .unwrap_or_default()
            .to_string();
        let status = block
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let reason = block.lines().find_map(|l| {
            l.split_once(':')
                .filter(|(n, _)| n.eq_ignore_ascii_case("x-latchkey-reason"))
                .map(|(_, v)| v.trim().to_string())
        });
        let mut body = std::fs::read_to_string(&self.body).unwrap_or_default();
        if reason.is_none() {
            // For the failure message: what curl said.
            let stderr = self.headers.with_file_name("stderr");
            body.push_str(&std::fs::read_to_string(stderr).unwrap_or_default());
            body.push_str(&head);
        }
        (status, reason, body)
    }
}

#[test]
fn an_upload_reaches_the_upstream_before_the_client_has_sent_all_of_it_h1_chunked_and_h2() {
    let w = world();
    let part_one = format!("part-one:{}", "a".repeat(200_000));
    let part_two = format!("part-two:{}:the-end", "b".repeat(200_000));
    for (i, flag) in ["--http1.1", "--http2"].iter().enumerate() {
        let path = format!("/stream/{i}");
        let mut up = curl_upload(&w.lk, flag, &w.url("other.test", &path));
        up.send(part_one.as_bytes());
        // The client holds the rest back until the upstream has the first part: a proxy that
        // buffered the body before dialing would never get there.
        let early = wait_upstream(&w.upstream, &path, |r| r.body.len() >= part_one.len() - 256);
        assert!(!early.complete, "{flag}: the body cannot be complete yet");
        assert!(early.body.starts_with(b"part-one:"), "{flag}");
        up.send(part_two.as_bytes());
        let (status, reason, body) = up.finish();
        assert_eq!((status, reason), (200, None), "{flag}: {body}");
        let seen = w.received_one(&path);
        assert!(seen.complete, "{flag}: {}", seen.body.len());
        assert_eq!(
            seen.body,
            format!("{part_one}{part_two}").into_bytes(),
            "{flag}: the body arrives byte for byte"
        );
    }
    let records = w.lk.wait_audit(2);
    for record in &records {
        assert_record(
            record,
            json!({"rule": "other", "decision": "allow", "reason": "allowed", "status": 200}),
        );
        assert_eq!(
            record["bytes_up"].as_u64(),
            Some((part_one.len() + part_two.len()) as u64),
            "{record:#}"
        );
    }
    w.sweep();
}

#[test]
fn a_secret_found_mid_stream_aborts_the_upstream_request_and_the_client_gets_the_refusal() {
    let w = world();
    let clean = "c".repeat(300_000);
    for (i, flag) in ["--http1.1", "--http2"].iter().enumerate() {
        let path = format!("/leak/{i}");
        let mut up = curl_upload(&w.lk, flag, &w.url("other.test", &path));
        up.send(clean.as_bytes());
        // A tail that could begin a variant of a secret is held back: most of it is enough.
        wait_upstream(&w.upstream, &path, |r| r.body.len() >= clean.len() - 256);
        // The value split over two writes: its first half must not go out on its own.
        let (a, b) = OPENAI.split_at(10);
        up.send(format!("x={a}").as_bytes());
        std::thread::sleep(Duration::from_millis(100));
        up.send(format!("{b}&rest={}the-end", "d".repeat(100_000)).as_bytes());
        let (status, reason, body) = up.finish();
        assert_eq!(
            (status, reason.as_deref()),
            (403, Some("secret_value_unbound")),
            "{flag}: {body}"
        );
        assert!(body.starts_with("latchkey: "), "{flag}: {body}");
        let seen = w.received_one(&path);
        assert!(!seen.complete, "{flag}: the upstream got a complete body");
        assert!(
            !contains(&seen.body, a.as_bytes()),
            "{flag}: part of the value went out"
        );
        assert!(!contains(&seen.body, b"the-end"), "{flag}");
        assert!(
            seen.body.len() >= clean.len() - 256,
            "{flag}: the clean part streamed"
        );
    }
    let records = w.lk.wait_audit(2);
    for record in &records {
        assert_record(
            record,
            json!({"rule": "other", "decision": "deny", "reason": "secret_value_unbound", "status": 403}),
        );
    }
    w.sweep();
}

// ---------------------------------------------------------------------------------------------
// h2 with trailers: a hyper client over TLS through a CONNECT

/// A request body the test feeds frame by frame.
pub(crate) struct Frames(pub(crate) tokio::sync::mpsc::Receiver<Frame<Bytes>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|f| f.map(Ok))
    }
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// An h2 connection to `authority` through latchkey.
pub(crate) async fn h2_through(
    lk: &Latchkey,
    authority: &str,
) -> hyper::client::conn::http2::SendRequest<Frames> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The test plays the sandbox: it dials the proxy, never an upstream.
    #[allow(clippy::disallowed_methods)]
    let mut tcp = tokio::net::TcpStream::connect(lk.addr())
        .await
        .expect("connect to latchkey");
    tcp.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .expect("CONNECT");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(tcp.read(&mut b).await.expect("CONNECT answer"), 1);
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let host = authority.split(':').next().expect("host").to_string();
    let tls = tokio_rustls::TlsConnector::from(tls_config(&lk.ca_pem_path(), &[b"h2"]))
        .connect(
            rustls_pki_types::ServerName::try_from(host).expect("name"),
            tcp,
        )
        .await
        .expect("TLS through latchkey");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

/// Sends `frames` as the body of `POST https://authority/path` over h2; returns status, reason
/// header and body text.
async fn h2_post(
    lk: &Latchkey,
    authority: &str,
    path: &str,
    frames: Vec<Frame<Bytes>>,
) -> (u16, Option<String>, String) {
    let mut sender = h2_through(lk, authority).await;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let req = http::Request::post(format!("https://{authority}{path}"))
        .body(Frames(rx))
        .expect("request");
    let feed = tokio::spawn(async move {
        for f in frames {
            if tx.send(f).await.is_err() {
                return;
            }
        }
    });
    let res = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
        .await
        .expect("an answer in time")
        .expect("a response");
    feed.abort();
    let status = res.status().as_u16();
    let reason = res
        .headers()
        .get("x-latchkey-reason")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = res
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (status, reason, String::from_utf8_lossy(&body).into_owned())
}

fn trailers(name: &str, value: &str) -> Frame<Bytes> {
    let mut t = http::HeaderMap::new();
    t.insert(
        http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
        http::HeaderValue::from_str(value).expect("value"),
    );
    Frame::trailers(t)
}

fn data_frames(total: usize) -> Vec<Frame<Bytes>> {
    let chunk = Bytes::from(vec![b'z'; 64 * 1024]);
    let mut out = Vec::new();
    let mut left = total;
    while left > 0 {
        let n = left.min(chunk.len());
        out.push(Frame::data(chunk.slice(..n)));
        left -= n;
    }
    out
}

#[test]
fn h2_request_trailers_holding_a_secret_are_refused_on_small_and_large_bodies() {
    let w = world();
    let rt = runtime();
    let authority = format!("other.test:{}", w.port());
    let cases = [
        (
            "small body, value in a trailer",
            1024,
            "x-checksum",
            OPENAI.to_string(),
        ),
        (
            "9 MiB body, value in a trailer",
            9 * MIB,
            "x-checksum",
            OPENAI.to_string(),
        ),
        (
            "9 MiB body, value as a trailer name",
            9 * MIB,
            OPENAI,
            "1".to_string(),
        ),
        (
            "small body, placeholder in a trailer",
            10,
            "x-key",
            "__LATCHKEY_openai__".to_string(),
        ),
    ];
    for (i, (what, len, name, value)) in cases.iter().enumerate() {
        let mut frames = data_frames(*len);
        frames.push(trailers(name, value));
        let path = format!("/trailers/{i}");
        let (status, reason, body) = rt.block_on(h2_post(&w.lk, &authority, &path, frames));
        w.saw(what, body.as_bytes());
        let expected = if value.starts_with("__LATCHKEY_") {
            "placeholder_not_bound"
        } else {
            "secret_value_unbound"
        };
        assert_eq!(
            (status, reason.as_deref()),
            (403, Some(expected)),
            "{what}: {body}"
        );
        for seen in w.received(&path) {
            assert!(
                seen.trailers.is_empty(),
                "{what}: trailers reached the upstream: {seen:#?}"
            );
            assert!(!seen.complete, "{what}: the upstream request completed");
        }
    }
    // Clean trailers still go through.
    let mut frames = data_frames(2048);
    frames.push(trailers("x-checksum", "abc123"));
    let (status, _, body) = rt.block_on(h2_post(&w.lk, &authority, "/trailers/ok", frames));
    assert_eq!(status, 200, "{body}");
    let seen = w.received_one("/trailers/ok");
    assert!(seen.complete && seen.body.len() == 2048, "{seen:#?}");

    let records = w.lk.wait_audit(cases.len() + 1);
    for (record, (_, _, _, value)) in records.iter().zip(&cases) {
        let reason = if value.starts_with("__LATCHKEY_") {
            "placeholder_not_bound"
        } else {
            "secret_value_unbound"
        };
        assert_record(
            record,
            json!({"rule": "other", "decision": "deny", "reason": reason, "status": 403}),
        );
    }
    w.sweep();
}

#[test]
fn h1_chunked_trailers_holding_a_secret_are_refused_on_small_and_large_bodies() {
    let w = world();
    let authority = format!("other.test:{}", w.port());
    for (i, len) in [16usize, 9 * MIB].iter().enumerate() {
        let mut tls = tls_through(&w.lk, &authority);
        tls.sock
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let path = format!("/h1-trailers/{i}");
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: {authority}\r\nTransfer-Encoding: chunked\r\nTrailer: x-sig\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        let chunk = vec![b'q'; 64 * 1024];
        let mut left = *len;
        while left > 0 {
            let n = left.min(chunk.len());
            req.extend_from_slice(format!("{n:x}\r\n").as_bytes());
            req.extend_from_slice(&chunk[..n]);
            req.extend_from_slice(b"\r\n");
            left -= n;
        }
        req.extend_from_slice(format!("0\r\nx-sig: {OPENAI}\r\n\r\n").as_bytes());
        let _ = tls.write_all(&req);
        let _ = tls.flush();
        let resp = read_response(&mut tls, false).expect("a response");
        w.saw_response("h1 trailers", &resp);
        assert_denial(&resp, 403, Some("other"), "secret_value_unbound");
        for seen in w.received(&path) {
            assert!(seen.trailers.is_empty() && !seen.complete, "{seen:#?}");
        }
    }
    let records = w.lk.wait_audit(2);
    for record in &records {
        assert_record(
            record,
            json!({"rule": "other", "decision": "deny", "reason": "secret_value_unbound", "status": 403}),
        );
    }
    w.sweep();
}

// ---------------------------------------------------------------------------------------------
// The buffer budget and the body-progress timeout, over plain HTTP with raw sockets

const PLACEHOLDER: &str = "__LATCHKEY_openai__";

/// latchkey with one rule on a plain HTTP upstream that replaces body placeholders (so it holds
/// bodies whole), plus `args`.
fn budget_world(args: &[&str]) -> (Latchkey, Upstream) {
    let upstream = Upstream::http();
    let policy = format!(
        "{}[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{port}]\nsecrets = [\"openai\"]\nplaceholders = [\"body\"]\ndangerously_allow_cleartext = true\n\n[[rules]]\nname = \"other\"\nhosts = [\"other.test\"]\nports = [{port}]\n",
        secrets_toml(&["openai"]),
        port = upstream.port()
    );
    let mut b = latchkey()
        .pin("api.test")
        .pin("other.test")
        .policy("main.toml", &policy);
    for (name, value) in SECRET_ENV {
        b = b.env(name, value);
    }
    for a in args {
        b = b.arg(a);
    }
    (b.run(), upstream)
}

/// Starts `POST http://host:port/path` with a `len`-byte body (on `api.test`, a placeholder at
/// its start) and sends the first `sent` bytes of it; returns the socket and the rest.
fn start_post(
    lk: &Latchkey,
    host: &str,
    port: u16,
    path: &str,
    len: usize,
    sent: usize,
) -> (std::net::TcpStream, Vec<u8>) {
    let mut body = vec![b'p'; len];
    if host == "api.test" {
        body[..PLACEHOLDER.len()].copy_from_slice(PLACEHOLDER.as_bytes());
    }
    let mut tcp = dial(lk.addr());
    tcp.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let head = format!(
        "POST http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).expect("head");
    tcp.write_all(&body[..sent]).expect("first part");
    let rest = body.split_off(sent);
    (tcp, rest)
}

fn finish_post(mut tcp: std::net::TcpStream, rest: &[u8]) -> RawResponse {
    let _ = tcp.write_all(rest);
    read_response(&mut tcp, false).expect("a response")
}

#[test]
fn bodies_held_whole_are_charged_to_the_budget_refused_past_it_and_released_when_sent() {
    let (lk, upstream) = budget_world(&[
        "--max-buffered-bytes",
        "1MiB",
        "--max-buffered-bytes-per-client",
        "1MiB",
    ]);
    let port = upstream.port();
    // Replacing a placeholder briefly holds the body twice, so the numbers leave room for it.
    const LEN: usize = 300 * 1024;
    // Two uploads held whole, each stalled half way: 600 KiB of the 1 MiB are charged.
    let a = start_post(&lk, "api.test", port, "/budget/a", LEN, LEN / 2);
    let b = start_post(&lk, "api.test", port, "/budget/b", LEN, LEN / 2);
    std::thread::sleep(Duration::from_millis(500));
    // A third does not fit: refused at once, nothing dialed for it.
    let (c, rest) = start_post(&lk, "api.test", port, "/budget/c", 500 * 1024, 1024);
    let refused = finish_post(c, &rest);
    assert_denial(&refused, 503, Some("api"), "too_busy");
    assert!(
        refused.text().contains("--max-buffered-bytes"),
        "{refused:#?}"
    );
    // A streamed body needs no budget: it still goes through meanwhile.
    let (s, rest) = start_post(&lk, "other.test", port, "/budget/streamed", 2 * MIB, 4096);
    let streamed = finish_post(s, &rest);
    assert_eq!(streamed.status, 200, "{streamed:#?}");

    // The held uploads complete, placeholder replaced; their charge goes with them.
    for ((tcp, rest), path) in [(a, "/budget/a"), (b, "/budget/b")] {
        let resp = finish_post(tcp, &rest);
        assert_eq!(resp.status, 200, "{resp:#?}");
        let seen = upstream
            .received()
            .into_iter()
            .find(|r| r.path == path)
            .expect("forwarded");
        assert!(
            seen.complete && seen.body.starts_with(OPENAI.as_bytes()),
            "{path}"
        );
    }
    assert!(upstream.received().iter().all(|r| r.path != "/budget/c"));
    // Released: a body that only fits an empty budget (held twice while replaced) is held now.
    let (d, rest) = start_post(&lk, "api.test", port, "/budget/d", 480 * 1024, 0);
    let resp = finish_post(d, &rest);
    assert_eq!(resp.status, 200, "{resp:#?}");

    let records = lk.wait_audit(5);
    let reasons: Vec<&str> = records
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        reasons.iter().filter(|r| **r == "too_busy").count(),
        1,
        "{records:#?}"
    );
    let busy = records
        .iter()
        .find(|r| r["reason"] == "too_busy")
        .expect("too_busy record");
    assert_record(
        busy,
        json!({"rule": "api", "decision": "deny", "status": 503, "path": "/budget/c", "upstream": null}),
    );
    assert_no_leak(
        "the audit file",
        lk.audit_text().as_bytes(),
        &[("openai".into(), OPENAI.into())],
    );
}

#[test]
fn one_client_gets_an_eighth_of_the_budget_by_default() {
    let (lk, upstream) = budget_world(&["--max-buffered-bytes", "1MiB"]);
    let port = upstream.port();
    // 128 KiB each; a replaced body is held twice for a moment.
    let (small, rest) = start_post(&lk, "api.test", port, "/share/ok", 60 * 1024, 0);
    assert_eq!(finish_post(small, &rest).status, 200);
    let (big, rest) = start_post(&lk, "api.test", port, "/share/big", 200 * 1024, 0);
    let resp = finish_post(big, &rest);
    assert_denial(&resp, 503, Some("api"), "too_busy");
    assert!(resp.text().contains("share"), "{resp:#?}");
    let records = lk.wait_audit(2);
    assert_record(&records[1], json!({"reason": "too_busy", "status": 503}));
}

#[test]
fn a_stalled_upload_is_cut_by_the_body_timeout_and_the_upstream_request_aborted() {
    let (lk, upstream) = budget_world(&["--body-timeout", "1s"]);
    let port = upstream.port();
    let started = Instant::now();
    // Streamed: the upstream has the head and the first bytes, then nothing more comes.
    let (mut streamed, _) = start_post(&lk, "other.test", port, "/slow/streamed", 100_000, 5000);
    // Held whole (placeholder rule): refused before any dial.
    let (mut held, _) = start_post(&lk, "api.test", port, "/slow/held", 100_000, 5000);
    // Nothing at all after the head.
    let (mut silent, _) = start_post(&lk, "other.test", port, "/slow/silent", 100_000, 0);
    for (what, tcp) in [
        ("streamed", &mut streamed),
        ("held", &mut held),
        ("silent", &mut silent),
    ] {
        let resp = read_response(tcp, false).expect("a response");
        assert_denial(&resp, 408, None, "body_timeout");
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{what}: cut late"
        );
    }
    let seen = upstream
        .received()
        .into_iter()
        .find(|r| r.path == "/slow/streamed")
        .expect("the streamed upload was dialed");
    assert!(
        !seen.complete,
        "the upstream got a complete body: {}",
        seen.body.len()
    );
    assert_eq!(seen.body.len(), 5000, "what the client sent went through");
    assert!(upstream.received().iter().all(|r| r.path != "/slow/held"));
    let records = lk.wait_audit(3);
    for record in &records {
        assert_record(
            record,
            json!({"decision": "deny", "reason": "body_timeout", "status": 408}),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// SigV4 past the budget: S3 streams UNSIGNED-PAYLOAD, another service is refused

#[test]
fn past_the_budget_an_s3_upload_streams_unsigned_and_a_signed_only_service_gets_too_busy() {
    use crate::support::credentials::{Bench, CRED_HOSTS};
    const AKID: &str = "AKIDLATCHKEYTEST7Q2X";
    const KEY: &str = "lkTEST/sigv4+Secret/Key9f8e7d6c5b4a3210zz";
    let bench = Bench::new();
    let verifier = bench.server(
        "verify_sigv4.py",
        &[("VERIFY_AKID", AKID), ("VERIFY_SECRET", KEY)],
    );
    let port = verifier.port();
    let policy = format!(
        r#"
[credentials.s3]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "env:TEST_AWS_SECRET"
region = "us-west-2"
service = "s3"

[credentials.ddb]
kind = "aws_sigv4"
access_key_id = "env:TEST_AWS_AKID"
secret_access_key = "env:TEST_AWS_SECRET"
region = "us-east-1"
service = "dynamodb"

[[rules]]
name = "s3"
hosts = ["s3.test"]
ports = [{port}]
credential = "s3"

[[rules]]
name = "dynamodb"
hosts = ["dynamodb.test"]
ports = [{port}]
credential = "ddb"
"#
    );
    let mut b = latchkey()
        .upstream_ca(&bench.ca)
        .policy("main.toml", &policy)
        .env("TEST_AWS_AKID", AKID)
        .env("TEST_AWS_SECRET", KEY)
        .args_for_budget();
    for host in CRED_HOSTS {
        b = b.pin(host);
    }
    let lk = b.run();
    let body: Vec<u8> = (0..300 * 1024)
        .map(|i| b"0123456789abcdef"[i % 16])
        .collect();
    let file = lk.scratch().join("body.bin");
    std::fs::write(&file, &body).expect("body file");
    let data = format!("@{}", file.display());
    let put = |host: &str| {
        crate::support::curl(&lk)
            .args([
                "-X",
                "PUT",
                "-H",
                "Expect:",
                "--data-binary",
                &data,
                &format!("https://{host}:{port}/bucket/obj"),
            ])
            .run()
    };
    // 300 KiB does not fit a 64 KiB share: S3 takes it unsigned, streamed.
    let out = put("s3.test");
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let v = verifier.wait_events("verify", 1)[0].clone();
    assert_eq!(v["valid"], true, "{v:#}");
    assert_eq!(v["content_sha256"], "UNSIGNED-PAYLOAD", "{v:#}");
    // DynamoDB signs every payload: refused rather than held past the budget.
    let out = put("dynamodb.test");
    assert_denial(&out.response, 503, Some("dynamodb"), "too_busy");
    let records = lk.wait_audit(2);
    assert_record(
        &records[0],
        json!({"rule": "s3", "status": 200, "decision": "allow"}),
    );
    assert_record(
        &records[1],
        json!({"rule": "dynamodb", "status": 503, "reason": "too_busy", "upstream": null}),
    );
    assert_eq!(
        verifier.wait_events("verify", 1).len(),
        1,
        "nothing reached the upstream for dynamodb"
    );
}

trait BudgetArgs {
    fn args_for_budget(self) -> Self;
}

impl BudgetArgs for crate::support::latchkey::LatchkeyBuilder {
    /// A budget no SigV4 body here fits: 64 KiB for the one client.
    fn args_for_budget(self) -> Self {
        self.arg("--max-buffered-bytes")
            .arg("64KiB")
            .arg("--max-buffered-bytes-per-client")
            .arg("64KiB")
    }
}

#[test]
fn budget_and_timeout_flags_refuse_bad_values_with_a_clear_error() {
    for (args, needle) in [
        (["--max-buffered-bytes", "12XB"], "unknown unit"),
        (["--max-buffered-bytes", "lots"], "not a byte count"),
        (["--body-timeout", "0s"], "--body-timeout"),
    ] {
        let mut b = latchkey().policy("main.toml", "");
        for a in args {
            b = b.arg(a);
        }
        let out = b.run_expecting_failure();
        assert_ne!(out.code(), Some(0), "{out:#?}");
        assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
    }
}

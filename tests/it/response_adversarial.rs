//! Adversarial variants of the response phase: bodiless responses that carry data and trailers
//! anyway, protocol switches nobody asked for, doubled transfer codings, coding stacks spread
//! over headers, secrets in encoded forms in trailers and header names, and the hosts whose
//! responses are scanned (report-only requests, wildcard rules).

use std::collections::VecDeque;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use http_body_util::BodyExt;

use crate::response_phase::{
    chunk, h1_raw, h2_request, holds_key, record_for, records_for, start, with_body, FramesBody,
    RawUpstream, KEY,
};
use crate::support::secrets::compress;
use crate::support::upstream::{handler, Received, UpBody};
use crate::support::{latchkey, TestCa, Upstream};

/// The audit records for `path`, once there are `n` of them.
fn wait_records(lk: &crate::support::Latchkey, path: &str, n: usize) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let recs: Vec<_> = lk
            .audit_records()
            .into_iter()
            .filter(|r| r["path"] == path)
            .collect();
        if recs.len() >= n || std::time::Instant::now() > deadline {
            assert_eq!(recs.len(), n, "{recs:#?}");
            return recs;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn trailers_with_key() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("x-reflect", format!("echo {KEY}").parse().expect("v"));
    t.insert("x-latchkey-decision", "allow".parse().expect("v"));
    t
}

fn assert_clean_h2(what: &str, r: &crate::response_phase::H2Response) {
    for (name, value) in &r.headers {
        assert!(!holds_key(name.as_str().as_bytes()), "{what}: name {name}");
        assert!(!holds_key(value.as_bytes()), "{what}: header {name}");
    }
    assert!(
        !holds_key(&r.body),
        "{what}: body {:?}",
        String::from_utf8_lossy(&r.body)
    );
    if let Some(t) = &r.trailers {
        for (name, value) in t {
            assert!(
                !holds_key(name.as_str().as_bytes()),
                "{what}: trailer {name}"
            );
            assert!(!holds_key(value.as_bytes()), "{what}: trailer {name}");
            assert!(
                !name.as_str().starts_with("x-latchkey-"),
                "{what}: forged trailer {name}"
            );
        }
    }
}

/// An h2 upstream answers a HEAD, a 204 and a 304 with DATA and trailers holding the key:
/// a bodiless response carries neither to the sandbox unscrubbed.
#[test]
fn bodiless_responses_from_an_h2_upstream_never_carry_a_secret_in_data_or_trailers() {
    let ca = TestCa::new();
    let up = Upstream::https_with(
        &ca,
        handler(|req: Received| async move {
            let status = match req.path.as_str() {
                "/204" => 204,
                "/304" => 304,
                _ => 200,
            };
            let frames = VecDeque::from(vec![
                Frame::data(Bytes::from(format!("data {KEY}"))),
                Frame::trailers(trailers_with_key()),
            ]);
            let body: UpBody = FramesBody(frames).boxed();
            http::Response::builder()
                .status(status)
                .header("x-head", format!("h {KEY}"))
                .body(body)
                .expect("response")
        }),
    );
    let lk = start(&ca, up.port());
    let authority = format!("api.test:{}", up.port());
    for (method, path, status) in [
        ("HEAD", "/head", 200),
        ("GET", "/204", 204),
        ("GET", "/304", 304),
    ] {
        let what = format!("{method} {path} over h2");
        let r = h2_request(&lk, &authority, method, path);
        assert_eq!(r.status, status, "{what}: {r:?}");
        assert_clean_h2(&what, &r);
        assert!(
            r.body.is_empty(),
            "{what}: a bodiless response has no body: {r:?}"
        );
        let raw = h1_raw(&lk, &authority, path, "");
        assert!(
            !holds_key(&raw),
            "{path} over HTTP/1.1: {}",
            String::from_utf8_lossy(&raw)
        );
    }
    let records = records_for(&lk, &["/head", "/204", "/304"]);
    for path in ["/head", "/204", "/304"] {
        let r = record_for(&records, path);
        assert!(r["redactions"].as_u64().unwrap_or(0) >= 1, "{r:#}");
    }
    assert!(!holds_key(lk.audit_text().as_bytes()));
}

/// A `101 Switching Protocols` to a request that asked for no upgrade is refused: the sandbox
/// never gets a status line for a protocol switch latchkey cannot inspect.
#[test]
fn a_protocol_switch_nobody_asked_for_is_refused() {
    let ca = TestCa::new();
    let up = RawUpstream::start(
        &ca,
        vec![(
            "/switch",
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\nx-echo: {KEY}\r\n\r\nraw bytes {KEY}"
            )
            .into_bytes(),
        )],
    );
    let lk = start(&ca, up.port);
    let authority = format!("api.test:{}", up.port);
    let r = h2_request(&lk, &authority, "GET", "/switch");
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(r.headers["x-latchkey-reason"], "upstream_error", "{r:?}");
    assert_clean_h2("101 over h2", &r);
    let raw = h1_raw(&lk, &authority, "/switch", "");
    let text = String::from_utf8_lossy(&raw);
    assert!(!holds_key(&raw), "{text}");
    assert!(text.starts_with("HTTP/1.1 502"), "{text}");
    let recs = wait_records(&lk, "/switch", 2);
    for r in &recs {
        assert_eq!(r["reason"], "upstream_error", "{r:#}");
        assert_eq!(r["status"], 502, "{r:#}");
    }
}

/// `chunked` applied twice (in one header or two) leaves one chunked framing undecoded: the
/// inner chunk lines could split a secret past the scanner. Refused.
#[test]
fn chunked_applied_twice_is_refused() {
    let ca = TestCa::new();
    let mut inner = Vec::new();
    inner.extend_from_slice(&chunk(&KEY.as_bytes()[..10]));
    inner.extend_from_slice(&chunk(&KEY.as_bytes()[10..]));
    inner.extend_from_slice(b"0\r\n\r\n");
    let mut outer = chunk(&inner);
    outer.extend_from_slice(b"0\r\n\r\n");
    let one_header = with_body(
        "HTTP/1.1 200 OK\ntransfer-encoding: chunked, chunked\nconnection: close\n\n",
        &outer,
    );
    let two_headers = with_body(
        "HTTP/1.1 200 OK\ntransfer-encoding: chunked\ntransfer-encoding: Chunked\nconnection: close\n\n",
        &outer,
    );
    let up = RawUpstream::start(&ca, vec![("/te-one", one_header), ("/te-two", two_headers)]);
    let lk = start(&ca, up.port);
    let authority = format!("api.test:{}", up.port);
    for path in ["/te-one", "/te-two"] {
        let r = h2_request(&lk, &authority, "GET", path);
        assert_eq!(r.status, 502, "{path}: {r:?}");
        assert_eq!(
            r.headers["x-latchkey-reason"], "uninspectable_body",
            "{path}"
        );
        assert_clean_h2(path, &r);
    }
    let records = records_for(&lk, &["/te-one", "/te-two"]);
    for path in ["/te-one", "/te-two"] {
        assert_eq!(record_for(&records, path)["reason"], "uninspectable_body");
    }
}

fn gzip_members(parts: &[&[u8]]) -> Vec<u8> {
    parts.iter().flat_map(|p| compress("gzip", p)).collect()
}

fn zlib(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("w");
    e.finish().expect("zlib")
}

fn raw_deflate(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("w");
    e.finish().expect("deflate")
}

/// Coding neighbours: a stack spread over two `Content-Encoding` headers, gzip under chunked
/// with trailers holding the key in encoded forms, raw and zlib deflate, multi-member gzip
/// with the key across members; a gzip-declared plain body and an undecodable coding the
/// sandbox itself asked for are refused.
#[test]
fn every_coding_shape_is_decoded_and_scrubbed_or_refused() {
    let ca = TestCa::new();
    let body = format!("the key is {KEY} and that is all\n");
    let expected = "the key is [REDACTED:key] and that is all\n";
    let stacked = compress("br", &compress("gzip", body.as_bytes()));
    let gz = compress("gzip", body.as_bytes());
    let mut gz_chunked = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\ntrailer: x-b64, x-pct, x-json, x-raw\r\nconnection: close\r\n\r\n".to_vec();
    for piece in gz.chunks(7) {
        gz_chunked.extend_from_slice(&chunk(piece));
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(KEY);
    let pct = percent_encoding::percent_encode(KEY.as_bytes(), percent_encoding::NON_ALPHANUMERIC)
        .to_string();
    let json = serde_json::to_string(&serde_json::json!({ "k": KEY })).expect("json");
    gz_chunked.extend_from_slice(
        format!("0\r\nx-b64: {b64}\r\nx-pct: {pct}\r\nx-json: {json}\r\nx-raw: {KEY}\r\n\r\n")
            .as_bytes(),
    );
    let (a, b) = body.as_bytes().split_at(15);
    let multi = gzip_members(&[a, b]);
    let len = |b: &[u8]| b.len();
    let up = RawUpstream::start(
        &ca,
        vec![
            (
                "/two-headers",
                with_body(
                    &format!("HTTP/1.1 200 OK\ncontent-encoding: gzip\ncontent-encoding: br\ncontent-length: {}\nconnection: close\n\n", len(&stacked)),
                    &stacked,
                ),
            ),
            ("/gzip-chunked", gz_chunked),
            (
                "/zlib",
                with_body(
                    &format!("HTTP/1.1 200 OK\ncontent-encoding: deflate\ncontent-length: {}\nconnection: close\n\n", zlib(body.as_bytes()).len()),
                    &zlib(body.as_bytes()),
                ),
            ),
            (
                "/raw-deflate",
                with_body(
                    &format!("HTTP/1.1 200 OK\ncontent-encoding: deflate\ncontent-length: {}\nconnection: close\n\n", raw_deflate(body.as_bytes()).len()),
                    &raw_deflate(body.as_bytes()),
                ),
            ),
            (
                "/multi-member",
                with_body(
                    &format!("HTTP/1.1 200 OK\ncontent-encoding: gzip\ncontent-length: {}\nconnection: close\n\n", multi.len()),
                    &multi,
                ),
            ),
            (
                "/plain-as-gzip",
                with_body(
                    &format!("HTTP/1.1 200 OK\ncontent-encoding: gzip\ncontent-length: {}\nconnection: close\n\n", body.len()),
                    body.as_bytes(),
                ),
            ),
            (
                "/zstd",
                with_body(
                    &format!("HTTP/1.1 200 OK\ncontent-encoding: zstd\ncontent-length: {}\nconnection: close\n\n", body.len()),
                    body.as_bytes(),
                ),
            ),
        ],
    );
    let lk = start(&ca, up.port);
    let authority = format!("api.test:{}", up.port);
    for path in [
        "/two-headers",
        "/gzip-chunked",
        "/zlib",
        "/raw-deflate",
        "/multi-member",
    ] {
        let r = h2_request(&lk, &authority, "GET", path);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert_eq!(r.error, None, "{path}: {r:?}");
        assert_clean_h2(path, &r);
        assert_eq!(String::from_utf8_lossy(&r.body), expected, "{path}");
        assert!(!r.headers.contains_key("content-encoding"), "{path}");
        if path == "/gzip-chunked" {
            let t = r.trailers.as_ref().expect("trailers kept");
            for name in ["x-b64", "x-pct", "x-json", "x-raw"] {
                assert!(
                    t[name].to_str().expect("ascii").contains("[REDACTED:key]"),
                    "{name}: {t:?}"
                );
            }
        }
        let raw = h1_raw(&lk, &authority, path, "te: trailers\r\n");
        if path == "/gzip-chunked" {
            // Declared trailers reach an HTTP/1.1 sandbox that accepts them, scrubbed.
            let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
            for name in ["x-b64", "x-pct", "x-json", "x-raw"] {
                assert!(
                    text.contains(&format!("\r\n{name}: ")),
                    "{name} over HTTP/1.1: {text}"
                );
            }
        }
        assert!(
            !holds_key(&raw),
            "{path} over HTTP/1.1: {}",
            String::from_utf8_lossy(&raw)
        );
        assert!(
            String::from_utf8_lossy(&raw).contains("[REDACTED:key]"),
            "{path} over HTTP/1.1: {}",
            String::from_utf8_lossy(&raw)
        );
    }
    for path in ["/plain-as-gzip", "/zstd"] {
        let r = h2_request(&lk, &authority, "GET", path);
        assert_eq!(r.status, 502, "{path}: {r:?}");
        assert_eq!(
            r.headers["x-latchkey-reason"], "uninspectable_body",
            "{path}"
        );
        assert_clean_h2(path, &r);
        let raw = h1_raw(&lk, &authority, path, "accept-encoding: zstd\r\n");
        assert!(
            !holds_key(&raw),
            "{path}: {}",
            String::from_utf8_lossy(&raw)
        );
        assert!(raw.starts_with(b"HTTP/1.1 502"), "{path}");
    }
    let records = records_for(&lk, &["/gzip-chunked", "/plain-as-gzip", "/zstd"]);
    assert!(
        record_for(&records, "/gzip-chunked")["redactions"]
            .as_u64()
            .unwrap_or(0)
            >= 5
    );
    assert_eq!(
        record_for(&records, "/plain-as-gzip")["reason"],
        "uninspectable_body"
    );
    assert!(!holds_key(lk.audit_text().as_bytes()));
}

/// Header names and values: a `Connection`-named latchkey header, the key in header names in
/// encoded forms and with underscores, and split across two fields of the same name.
#[test]
fn header_shapes_never_carry_a_secret() {
    let ca = TestCa::new();
    let pct = percent_encoding::percent_encode(KEY.as_bytes(), percent_encoding::NON_ALPHANUMERIC)
        .to_string()
        .to_ascii_lowercase();
    let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(KEY);
    let (a, b) = KEY.split_at(12);
    let up = RawUpstream::start(
        &ca,
        vec![(
            "/headers",
            with_body(
                &format!("HTTP/1.1 200 OK\nconnection: x-latchkey-foo, close\nx-latchkey-foo: {KEY}\nx-latchkey-reason: forged\nx_latchkey_decision: forged\nx-{pct}: 1\nx-{b64url}: 2\nx_{KEY}_y: 3\nx-split: {a}\nx-split: {b}\nx-plain: kept\ncontent-length: 2\n\n"),
                b"ok",
            ),
        )],
    );
    let lk = start(&ca, up.port);
    let authority = format!("api.test:{}", up.port);
    let r = h2_request(&lk, &authority, "GET", "/headers");
    assert_eq!(r.status, 200, "{r:?}");
    assert_clean_h2("headers", &r);
    assert_eq!(r.headers["x-plain"], "kept");
    assert!(!r.headers.contains_key("x-latchkey-foo"));
    assert!(!r.headers.contains_key("x-latchkey-reason"));
    assert!(
        !r.headers.contains_key("x_latchkey_decision"),
        "{:?}",
        r.headers
    );
    let joined: String = r
        .headers
        .get_all("x-split")
        .iter()
        .map(|v| v.to_str().unwrap_or_default())
        .collect();
    assert!(
        !holds_key(joined.as_bytes()),
        "split across two fields: {joined}"
    );
    let raw = h1_raw(&lk, &authority, "/headers", "");
    let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(!holds_key(&raw), "{text}");
    assert!(
        !text.contains(&format!("{a}\r\nx-split: {b}").to_ascii_lowercase()),
        "{text}"
    );
    assert!(
        !text.contains("x-latchkey-foo") && !text.contains("forged"),
        "{text}"
    );
}

fn scan_policy(port: u16) -> String {
    format!(
        r#"
[secrets.key]
source = "env:LK_RESPONSE_KEY"

[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["POST"]
mode    = "report"
[rules.inject.headers]
authorization = "Bearer {{{{secret.key}}}}"

[[rules]]
name    = "wild-get"
hosts   = ["*.wild.test"]
ports   = [{port}]
methods = ["GET"]

[[rules]]
name    = "wild-post"
hosts   = ["*.wild.test"]
ports   = [{port}]
methods = ["POST"]
secrets = ["key"]
dangerously_inject_into_wildcard = true

[[rules]]
name    = "exact-get"
hosts   = ["b.wild.test"]
ports   = [{port}]
methods = ["GET"]
"#
    )
}

/// Responses are scanned on every route to a host that any rule binds the key to: a
/// report-only request (which carries no secret), and hosts reached under a wildcard rule or an
/// exact rule while a wildcard rule binds the key.
#[test]
fn report_only_and_wildcard_routes_to_a_bound_host_are_scanned() {
    let ca = TestCa::new();
    let reflect = with_body(
        &format!(
            "HTTP/1.1 200 OK\nx-echo: {KEY}\ncontent-length: {}\nconnection: close\n\n",
            KEY.len()
        ),
        KEY.as_bytes(),
    );
    let up = RawUpstream::start(&ca, vec![("/reflect", reflect)]);
    let lk = latchkey()
        .upstream_ca(&ca)
        .policy("main.toml", &scan_policy(up.port))
        .env("LK_RESPONSE_KEY", KEY)
        .pin("api.test")
        .pin("a.wild.test")
        .pin("b.wild.test")
        .run();
    for host in ["api.test", "a.wild.test", "b.wild.test"] {
        let r = h2_request(&lk, &format!("{host}:{}", up.port), "GET", "/reflect");
        assert_eq!(r.status, 200, "{host}: {r:?}");
        assert_clean_h2(host, &r);
        assert_eq!(r.body, b"[REDACTED:key]", "{host}");
    }
    let recs = wait_records(&lk, "/reflect", 3);
    for r in &recs {
        assert_eq!(r["redactions"], 2, "{r:#}");
    }
    assert!(recs.iter().any(|r| r["would_deny"] == true), "{recs:#?}");
}

/// A bomb from an h2 upstream spread over many small DATA frames: cut off at the limit, with
/// the record saying why and latchkey's memory bounded.
#[test]
fn a_bomb_over_h2_in_small_frames_is_cut_off_with_bounded_memory() {
    let ca = TestCa::new();
    let zeros = vec![0u8; 200 * 1024 * 1024];
    let gz = Bytes::from(compress("gzip", &zeros));
    drop(zeros);
    let up = Upstream::https_with(
        &ca,
        handler(move |_req: Received| {
            let gz = gz.clone();
            async move {
                let frames: VecDeque<_> = (0..gz.len())
                    .step_by(1024)
                    .map(|i| Frame::data(gz.slice(i..(i + 1024).min(gz.len()))))
                    .collect();
                let body: UpBody = FramesBody(frames).boxed();
                http::Response::builder()
                    .header("content-encoding", "gzip")
                    .body(body)
                    .expect("response")
            }
        }),
    );
    let lk = start(&ca, up.port());
    let before = crate::response_phase::peak_rss_kib(&lk);
    let r = h2_request(&lk, &format!("api.test:{}", up.port()), "GET", "/bomb");
    if r.status == 200 {
        assert!(r.error.is_some(), "the body must be cut off");
    } else {
        assert_eq!(r.status, 502, "{r:?}");
    }
    let records = records_for(&lk, &["/bomb"]);
    assert_eq!(
        record_for(&records, "/bomb")["reason"],
        "decompression_limit"
    );
    let grown = crate::response_phase::peak_rss_kib(&lk).saturating_sub(before);
    assert!(grown < 100 * 1024, "peak RSS grew by {grown} KiB");
}

/// A host no rule binds a secret to is not scanned, but its responses still get latchkey's
/// framing and head rules: one framing (a `Content-Length` next to `chunked` never reaches the
/// sandbox), no forged latchkey header, the canonical reason phrase, no unsolicited 101.
#[test]
fn unscanned_responses_still_get_one_framing_and_no_forged_head() {
    let ca = TestCa::new();
    let mut cl_te = b"HTTP/1.1 200 Totally Fine\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\nx-latchkey-decision: deny\r\nx_latchkey_rule: forged\r\nconnection: close\r\n\r\n".to_vec();
    cl_te.extend_from_slice(&chunk(b"hello world, longer than three"));
    cl_te.extend_from_slice(b"0\r\n\r\n");
    let up = RawUpstream::start(
        &ca,
        vec![
            ("/cl-te", cl_te),
            (
                "/switch",
                b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n"
                    .to_vec(),
            ),
        ],
    );
    let lk = latchkey()
        .upstream_ca(&ca)
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"plain\"\nhosts = [\"tunnel.test\"]\nports = [{}]\n",
                up.port
            ),
        )
        .pin("tunnel.test")
        .run();
    let authority = format!("tunnel.test:{}", up.port);
    let raw = h1_raw(&lk, &authority, "/cl-te", "");
    let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 200 ok\r\n"), "{text}");
    assert!(
        !(text.contains("content-length:") && text.contains("transfer-encoding:")),
        "{text}"
    );
    assert!(text.contains("hello world, longer than three"), "{text}");
    assert!(
        !text.contains("forged") && !text.contains("x-latchkey-decision"),
        "{text}"
    );
    let r = h2_request(&lk, &authority, "GET", "/cl-te");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.error, None, "{r:?}");
    assert_eq!(r.body, b"hello world, longer than three");
    let r = h2_request(&lk, &authority, "GET", "/switch");
    assert_eq!(r.status, 502, "{r:?}");
    let recs = wait_records(&lk, "/switch", 1);
    assert_eq!(recs[0]["reason"], "upstream_error");
}

//! Adversarial variants of the request-side checks (issue 11 §3, §4): bodies whose content
//! latchkey cannot read as sent (a `Content-Encoding` or `grpc-encoding` from the sandbox) are
//! refused (`415 uninspectable_request_body`), never forwarded unscanned; a secret written with
//! escapes a parser on the upstream undoes (every byte `%XX`, JSON `\u00XX`, quoted-printable
//! `=XX`, base64 wrapped across lines in a MIME part or PEM string, JSON in a header or query
//! value) is refused like the plain value, held whole or streamed, none of it sent first; a host
//! holding a secret inside a CONNECT is refused as a secret before admission can quote it; a
//! client that trickles its body is cut by the minimum body progress, not only when it stops.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::json;

use crate::support::clients::{dial, read_response};
use crate::support::secrets::{contains, env_secrets_world, secrets_toml, OPENAI, SECRET_ENV};
use crate::support::{assert_denial, assert_record, latchkey, Upstream};

/// `openai` injected on api.test; other.test binds nothing.
const RULES: &str = crate::support::secrets::OPENAI_RULES;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

/// A compressed request body hides its content from the leak detector: refused whatever it
/// holds (`415 uninspectable_request_body`), over h1 and h2, held or streamed, never forwarded.
#[test]
fn a_request_body_with_a_content_coding_is_refused_not_forwarded_unscanned() {
    let w = env_secrets_world(&["openai"], RULES);
    let dir = w.dir.path();
    let secret_gz = dir.join("secret.gz");
    std::fs::write(
        &secret_gz,
        gzip(format!("{{\"k\":\"{OPENAI}\"}}").as_bytes()),
    )
    .expect("f");
    let big = dir.join("big.gz");
    let mut body = vec![b'x'; 3 * 1024 * 1024];
    body.extend_from_slice(OPENAI.as_bytes());
    std::fs::write(&big, gzip(&body)).expect("f");
    let clean = dir.join("clean.gz");
    std::fs::write(&clean, gzip(b"nothing to see")).expect("f");
    let mut n = 0;
    for flag in ["--http1.1", "--http2"] {
        for (i, (coding, file)) in [
            ("gzip", &secret_gz),
            ("GZIP", &big),
            ("deflate", &clean),
            ("br", &clean),
            ("identity, gzip", &secret_gz),
            ("x-custom", &clean),
        ]
        .iter()
        .enumerate()
        {
            let path = format!("/ce/{flag}/{i}");
            let data = format!("@{}", file.display());
            let out = w.curl(&[
                flag,
                "-H",
                &format!("Content-Encoding: {coding}"),
                "--data-binary",
                &data,
                &w.url("other.test", &path),
            ]);
            assert_eq!(out.exit, Some(0), "{flag} {coding}: {out:#?}");
            assert_denial(
                &out.response,
                415,
                Some("other"),
                "uninspectable_request_body",
            );
            n += 1;
        }
    }
    assert!(
        w.received("/ce/").is_empty(),
        "a compressed body reached the upstream: {:#?}",
        w.received("/ce/")
    );
    // Identity (and no coding) still go through.
    let out = w.curl(&[
        "-H",
        "Content-Encoding: identity",
        "--data-binary",
        "plain",
        &w.url("other.test", "/ce-ok"),
    ]);
    assert_eq!(out.ok().status, 200, "{out:#?}");
    // Without a body there is nothing to inspect: the header alone is no reason to refuse.
    let out = w.curl(&[
        "-H",
        "Content-Encoding: gzip",
        &w.url("other.test", "/ce-empty"),
    ]);
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let records = w.lk.wait_audit(n + 2);
    for r in &records[..n] {
        assert_record(
            r,
            json!({"rule": "other", "decision": "deny", "reason": "uninspectable_request_body", "status": 415, "upstream": null}),
        );
    }
    w.sweep();
}

/// Escapes a parser on the upstream undoes: every byte `%XX` in a form body, every character
/// `\u00XX` in a JSON body (upper- and lower-case hex), mixed with `\/`; held whole and
/// streamed (a body over the pre-dial window), over h1 and h2.
#[test]
fn a_secret_escaped_byte_by_byte_in_a_body_is_refused_held_or_streamed() {
    let w = env_secrets_world(&["openai"], RULES);
    let pct: String = OPENAI.bytes().map(|b| format!("%{b:02X}")).collect();
    let pct_lower: String = OPENAI.bytes().map(|b| format!("%{b:02x}")).collect();
    let uni: String = OPENAI
        .chars()
        .map(|c| format!("\\u{:04X}", c as u32))
        .collect();
    let uni_lower: String = OPENAI
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    let half = OPENAI.len() / 2;
    let mixed = format!(
        "{}{}",
        &OPENAI[..half],
        OPENAI[half..]
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect::<String>()
    );
    let dir = w.dir.path();
    let mut n = 0;
    for (what, text) in [
        ("form, every byte %XX", format!("a=1&key={pct}")),
        ("form, lower-case hex", format!("key={pct_lower}&b=2")),
        ("json \\u00XX", format!("{{\"key\":\"{uni}\"}}")),
        ("json \\u00xx", format!("{{\"key\":\"{uni_lower}\"}}")),
        ("json half escaped", format!("{{\"key\":\"{mixed}\"}}")),
    ] {
        for size in ["small", "large"] {
            let mut body = Vec::new();
            if size == "large" {
                body.extend(std::iter::repeat_n(b' ', 200 * 1024));
            }
            body.extend_from_slice(text.as_bytes());
            let file = dir.join(format!("b{n}"));
            std::fs::write(&file, &body).expect("body");
            for flag in ["--http1.1", "--http2"] {
                let path = format!("/esc/{n}/{flag}");
                let out = w.curl(&[
                    flag,
                    "--data-binary",
                    &format!("@{}", file.display()),
                    &w.url("other.test", &path),
                ]);
                assert_eq!(out.exit, Some(0), "{what} {size} {flag}: {out:#?}");
                assert_denial(&out.response, 403, Some("other"), "secret_value_unbound");
                for seen in w.received(&path) {
                    assert!(!seen.complete, "{what} {size} {flag}: completed");
                    assert!(
                        !contains(&seen.body, &text.as_bytes()[..12]),
                        "{what} {size} {flag}: the start of the escaped value went out"
                    );
                }
            }
            n += 1;
        }
    }
    // Ordinary escapes pass untouched.
    let body = "{\"k\":\"caf\\u00e9 \\/ 100%25\"}";
    let out = w.curl(&["--data-binary", body, &w.url("other.test", "/esc-ok")]);
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_eq!(w.received_one("/esc-ok").body, body.as_bytes());
    let records = w.lk.wait_audit(2 * n + 1);
    for r in &records[..2 * n] {
        assert_record(
            r,
            json!({"rule": "other", "decision": "deny", "reason": "secret_value_unbound", "status": 403}),
        );
    }
    w.sweep();
}

/// One byte every 0.7 s never lets a 1 s `--body-timeout` fire on its own; the minimum body
/// rate cuts it anyway (streamed and held bodies), within a bounded time.
#[test]
fn a_client_trickling_its_body_is_cut_by_the_minimum_rate() {
    let upstream = Upstream::http();
    let policy = format!(
        "{}[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{port}]\nsecrets = [\"openai\"]\nplaceholders = [\"body\"]\ndangerously_allow_cleartext = true\n\n[[rules]]\nname = \"other\"\nhosts = [\"other.test\"]\nports = [{port}]\n",
        secrets_toml(&["openai"]),
        port = upstream.port()
    );
    let mut b = latchkey()
        .pin("api.test")
        .pin("other.test")
        .policy("main.toml", &policy)
        .arg("--body-timeout")
        .arg("1s");
    for (name, value) in SECRET_ENV {
        b = b.env(name, value);
    }
    let lk = b.run();
    let port = upstream.port();
    for host in ["other.test", "api.test"] {
        let mut tcp = dial(lk.addr());
        tcp.set_read_timeout(Some(Duration::from_millis(700)))
            .expect("timeout");
        let head = format!(
            "POST http://{host}:{port}/trickle HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).expect("head");
        let started = Instant::now();
        let mut got = Vec::new();
        loop {
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{host}: a trickling body was never cut"
            );
            if tcp.write_all(b"t").is_err() {
                break;
            }
            let mut buf = [0u8; 4096];
            match tcp.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => {
                    got.extend_from_slice(&buf[..k]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
        tcp.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest);
        got.extend_from_slice(&rest);
        let resp = read_response(&mut std::io::Cursor::new(got), false).expect("a response");
        assert_denial(&resp, 408, None, "body_timeout");
    }
    let records = lk.wait_audit(2);
    for r in &records {
        assert_record(
            r,
            json!({"decision": "deny", "reason": "body_timeout", "status": 408}),
        );
    }
}

/// A multipart part in `Content-Transfer-Encoding: base64`, wrapped at 76 columns (and a PEM-style
/// JSON string wrapped with `\n` escapes) with the secret's base64 straddling a line break:
/// the upstream's MIME parser joins the lines, so the detector does too.
#[test]
fn a_secret_in_line_wrapped_base64_is_refused_held_or_streamed() {
    let w = env_secrets_world(&["openai"], RULES);
    let mut n = 0;
    for pad in [40usize, 41, 42, 60] {
        let mut inner = vec![b'#'; pad];
        inner.extend_from_slice(OPENAI.as_bytes());
        inner.extend_from_slice(b" and more text after the value");
        let b64 = STANDARD.encode(&inner);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(76)
            .map(|c| std::str::from_utf8(c).expect("ascii"))
            .collect();
        let mime = format!(
            "--XyZ\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a.txt\"\r\nContent-Transfer-Encoding: base64\r\n\r\n{}\r\n--XyZ--\r\n",
            lines.join("\r\n")
        );
        let pem = format!("{{\"pem\":\"{}\"}}", lines.join("\\n"));
        for (what, body) in [("mime", mime), ("pem-json", pem)] {
            for size in ["small", "large"] {
                let mut bytes = Vec::new();
                if size == "large" {
                    bytes.extend(std::iter::repeat_n(b'.', 150 * 1024));
                }
                bytes.extend_from_slice(body.as_bytes());
                let file = w.dir.path().join(format!("wrapped{n}"));
                std::fs::write(&file, &bytes).expect("body");
                let path = format!("/wrapped/{n}");
                let out = w.curl(&[
                    "-H",
                    "Content-Type: multipart/form-data; boundary=XyZ",
                    "--data-binary",
                    &format!("@{}", file.display()),
                    &w.url("other.test", &path),
                ]);
                assert_eq!(out.exit, Some(0), "{what} {size} pad {pad}: {out:#?}");
                assert_denial(&out.response, 403, Some("other"), "secret_value_unbound");
                for seen in w.received(&path) {
                    assert!(!seen.complete, "{what} {size} pad {pad}: completed");
                }
                n += 1;
            }
        }
    }
    let records = w.lk.wait_audit(n);
    for r in &records {
        assert_record(
            r,
            json!({"rule": "other", "decision": "deny", "reason": "secret_value_unbound", "status": 403}),
        );
    }
    w.sweep();
}

/// A secret (any case) in the Host header or h2 `:authority` inside an intercepted CONNECT is
/// refused as a secret before admission compares it with the CONNECT host: admission's
/// `host_mismatch` message quotes the host lowercased, which redaction would not recognise.
#[test]
fn a_secret_in_the_host_inside_a_connect_is_refused_before_admission_quotes_it() {
    let w = env_secrets_world(&["openai"], RULES);
    let lower = OPENAI.to_ascii_lowercase();
    let upper = OPENAI.to_ascii_uppercase();
    let mut n = 0;
    for flag in ["--http1.1", "--http2"] {
        for host in [
            format!("{upper}.other.test"),
            format!("{OPENAI}.other.test."),
            format!("{lower}.other.test:{}", w.port()),
        ] {
            let out = w.curl(&[
                flag,
                "-H",
                &format!("Host: {host}"),
                &w.url("other.test", "/host-in-tunnel"),
            ]);
            assert_eq!(out.exit, Some(0), "{flag} {host}: {out:#?}");
            assert_denial(&out.response, 403, None, "secret_value_unbound");
            assert!(
                !out.response.text().to_ascii_lowercase().contains(&lower),
                "{flag}: the refusal quotes the value: {:?}",
                out.response.text()
            );
            n += 1;
        }
    }
    assert!(w.received("/host-in-tunnel").is_empty());
    let records = w.lk.wait_audit(n);
    for r in &records {
        assert_record(
            r,
            json!({"decision": "deny", "reason": "secret_value_unbound", "status": 403, "upstream": null}),
        );
        assert!(
            !r.to_string().to_ascii_lowercase().contains(&lower),
            "the record holds the value: {r:#}"
        );
    }
    w.sweep();
}

/// Other escapes an upstream's parser undoes: a MIME part in quoted-printable with every byte
/// `=XX` (held and streamed), JSON `\u00XX` in a header value (`Dropbox-API-Arg` is JSON) and in
/// a query value (GraphQL `variables`, percent-encoded on top), over h1 and h2.
#[test]
fn a_secret_in_quoted_printable_or_json_escaped_header_and_query_values_is_refused() {
    let w = env_secrets_world(&["openai"], RULES);
    let qp: String = OPENAI.bytes().map(|b| format!("={b:02X}")).collect();
    let uni: String = OPENAI.bytes().map(|b| format!("\\u{b:04x}")).collect();
    let uni_pct: String = format!("{{\"k\":\"{uni}\"}}")
        .bytes()
        .map(|b| format!("%{b:02X}"))
        .collect();
    let mut n = 0;
    for size in ["small", "large"] {
        let mut bytes = Vec::new();
        if size == "large" {
            bytes.extend(std::iter::repeat_n(b'.', 150 * 1024));
        }
        bytes.extend_from_slice(
            format!("--B\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nkey: {qp}=\r\n tail\r\n--B--\r\n").as_bytes(),
        );
        let file = w.dir.path().join(format!("qp-{size}"));
        std::fs::write(&file, &bytes).expect("body");
        for flag in ["--http1.1", "--http2"] {
            let out = w.curl(&[
                flag,
                "-H",
                "Content-Type: multipart/mixed; boundary=B",
                "--data-binary",
                &format!("@{}", file.display()),
                &w.url("other.test", "/qp"),
            ]);
            assert_denial(&out.response, 403, Some("other"), "secret_value_unbound");
            n += 1;
        }
    }
    for flag in ["--http1.1", "--http2"] {
        let out = w.curl(&[
            flag,
            "-H",
            &format!("Dropbox-API-Arg: {{\"path\":\"{uni}\"}}"),
            &w.url("other.test", "/json-header"),
        ]);
        assert_denial(&out.response, 403, Some("other"), "secret_value_unbound");
        let out = w.curl(&[
            flag,
            &w.url("other.test", &format!("/json-query?variables={uni_pct}")),
        ]);
        assert_denial(&out.response, 403, Some("other"), "secret_value_unbound");
        n += 2;
    }
    for path in ["/qp", "/json-header", "/json-query"] {
        for seen in w.received(path) {
            assert!(!seen.complete, "{path}: completed: {seen:#?}");
        }
    }
    // A JSON header without a secret still goes through unchanged.
    let out = w.curl(&[
        "-H",
        "Dropbox-API-Arg: {\"path\":\"/caf\\u00e9\"}",
        &w.url("other.test", "/json-ok"),
    ]);
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let records = w.lk.wait_audit(n + 1);
    for r in &records[..n] {
        assert_record(
            r,
            json!({"rule": "other", "decision": "deny", "reason": "secret_value_unbound", "status": 403}),
        );
    }
    w.sweep();
}

/// A chunk extension holding a secret (`5;ext=VALUE`) is never forwarded: the body is
/// re-framed upstream, extensions dropped. The upstream here records the raw bytes it gets.
#[test]
fn a_secret_in_a_chunk_extension_never_reaches_the_upstream() {
    use std::net::TcpListener;
    // The test's own upstream on loopback: it keeps every byte and answers 200.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let keep = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            conn.set_read_timeout(Some(Duration::from_millis(500)))
                .expect("timeout");
            let mut buf = [0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(5).any(|w| w == b"0\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                }
            }
            keep.lock().expect("seen").extend_from_slice(&got);
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    let policy = format!(
        "{}[[rules]]\nname = \"raw\"\nhosts = [\"raw.test\"]\nports = [{port}]\n",
        secrets_toml(&["openai"])
    );
    let mut b = latchkey().pin("raw.test").policy("main.toml", &policy);
    for (name, value) in SECRET_ENV {
        b = b.env(name, value);
    }
    let lk = b.run();
    for ext in [
        format!(";ext={OPENAI}"),
        format!(";{OPENAI}"),
        format!(";a=\"{OPENAI}\";b"),
    ] {
        let mut tcp = dial(lk.addr());
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let req = format!(
            "POST http://raw.test:{port}/ext HTTP/1.1\r\nHost: raw.test:{port}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5{ext}\r\nhello\r\n0\r\n\r\n"
        );
        tcp.write_all(req.as_bytes()).expect("request");
        let resp = read_response(&mut tcp, false).expect("a response");
        assert!(
            !contains(&resp.body, OPENAI.as_bytes()),
            "the response quotes the value"
        );
    }
    let _ = lk.wait_audit(3);
    let got = seen.lock().expect("seen").clone();
    assert!(
        contains(&got, b"hello"),
        "the bodies reached the upstream: {}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        !contains(&got, OPENAI.as_bytes()),
        "a chunk extension carried the value upstream: {}",
        String::from_utf8_lossy(&got)
    );
}

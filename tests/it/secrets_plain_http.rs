//! The same brokering on plain `http://` requests (absolute-form, no interception) under a rule
//! that opts out of TLS (`dangerously_allow_cleartext = true`): injection, redaction of the
//! response, and refusal of placeholders and values for unbound hosts.

use serde_json::json;

use crate::support::assert_denial;
use crate::support::assert_record;
use crate::support::secrets::{
    assert_no_leak, env_secrets_world, redacted, redactions_of, response_bytes, OPENAI,
};

const RULES: &str = r#"
[[rules]]
name  = "openai-plain"
hosts = ["api.test"]
ports = [PLAIN_PORT]
# The opt-out: a credential on plain HTTP (see secrets_cleartext.rs for the default refusal).
dangerously_allow_cleartext = true
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"

[[rules]]
name  = "other-plain"
hosts = ["other.test"]
ports = [PLAIN_PORT]
"#;

#[test]
fn plain_http_requests_get_the_secret_injected_and_the_reflection_redacted() {
    let w = env_secrets_world(&["openai"], RULES);

    let resp = w.curl_ok(&[
        "-H",
        "Authorization: Bearer sandbox-own",
        &w.plain_url("api.test", "/reflect?ce=gzip&chunked=1"),
    ]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w
        .plain
        .received()
        .into_iter()
        .find(|r| r.path.starts_with("/reflect"))
        .expect("the request reached the plain upstream");
    assert_eq!(
        seen.header_values("authorization"),
        [format!("Bearer {OPENAI}")],
        "{seen:#?}"
    );
    let text = resp.text();
    assert!(
        text.contains(&redacted("openai")) && text.ends_with("end of reflection\n"),
        "the plain HTTP response must arrive decoded and redacted: {text:?}"
    );
    assert_no_leak(
        "the plain HTTP response",
        &response_bytes(&resp),
        &w.tracked(),
    );

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "scheme": "http",
            "rule": "openai-plain",
            "status": 200,
            "secrets": ["openai"],
        }),
    );
    assert!(redactions_of(&records[0]) > 0, "{:#}", records[0]);
    w.sweep();
}

#[test]
fn plain_http_requests_with_a_placeholder_or_a_value_for_an_unbound_host_are_refused() {
    let w = env_secrets_world(&["openai"], RULES);
    let out = w.curl(&[
        "-H",
        "Authorization: Bearer __LATCHKEY_openai__",
        &w.plain_url("other.test", "/p/1"),
    ]);
    assert_denial(&out.response, 403, None, "placeholder_not_bound");
    let out = w.curl(&[
        "--data-binary",
        &format!("stolen={OPENAI}"),
        &w.plain_url("other.test", "/p/2"),
    ]);
    assert_denial(&out.response, 403, None, "secret_value_unbound");
    assert!(
        w.plain.received().is_empty(),
        "a refused request was forwarded: {:#?}",
        w.plain.received()
    );
    let records = w.lk.wait_audit(2);
    assert_record(
        &records[0],
        json!({"scheme": "http", "reason": "placeholder_not_bound", "status": 403}),
    );
    assert_record(
        &records[1],
        json!({"scheme": "http", "reason": "secret_value_unbound", "status": 403}),
    );
    w.sweep();
}

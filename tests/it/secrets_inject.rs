//! Injection: a rule's `inject.headers`, `inject.query` and `inject.basic_auth` put the real
//! secret on the request that leaves latchkey, after the auth headers the sandbox sent are
//! stripped. What left is read from the upstream's record of what it received (the response the
//! sandbox gets reflects it, so it is redacted there).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::json;

use crate::support::assert_record;
use crate::support::secrets::{
    contains, env_secrets_world, redacted, redactions_of, GH, MAPS, OPENAI, WEIRD,
};

const RULES: &str = r#"
[[rules]]
name  = "openai"
hosts = ["api.test"]
ports = [PORT]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"

[[rules]]
name  = "maps"
hosts = ["other.test"]
ports = [PORT]
[rules.inject.query]
key = "{{secret.maps}}"

[[rules]]
name  = "github"
hosts = ["tunnel.test"]
ports = [PORT]
[rules.inject.basic_auth]
user     = "x-access-token"
password = "{{secret.gh}}"

[[rules]]
name         = "keeps-cookie"
hosts        = ["a.wild.test"]
ports        = [PORT]
keep_headers = ["cookie"]
[rules.inject.headers]
x-api-key = "{{secret.weird}}"
"#;

const NAMES: &[&str] = &["openai", "maps", "gh", "weird"];

/// Every auth header a sandbox might send, each with a value of its own.
const SANDBOX_AUTH: &[&str] = &[
    "Authorization: Bearer sandbox-own-token",
    "Proxy-Authorization: Basic c2FuZGJveDpwdw==",
    "X-Api-Key: sandbox-x-api-key",
    "Api-Key: sandbox-api-key",
    "X-Goog-Api-Key: sandbox-goog-key",
    "Cookie: session=sandbox-cookie",
];

fn curl_args<'a>(extra: &[&'a str], url: &'a str) -> Vec<&'a str> {
    let mut args = Vec::new();
    for header in SANDBOX_AUTH {
        args.push("-H");
        args.push(*header);
    }
    args.push("-H");
    args.push("X-Unrelated: kept as is");
    args.extend_from_slice(extra);
    args.push(url);
    args
}

#[test]
fn a_header_template_injects_the_secret_and_strips_every_auth_header_the_sandbox_sent() {
    let w = env_secrets_world(NAMES, RULES);
    let url = w.url("api.test", "/v1/models");

    let resp = w.curl_ok(&curl_args(&[], &url));
    assert_eq!(resp.status, 200, "{resp:#?}");

    let seen = w.received_one("/v1/models");
    assert_eq!(
        seen.header_values("authorization"),
        [format!("Bearer {OPENAI}")],
        "the upstream must see exactly the injected credential: {seen:#?}"
    );
    for stripped in [
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
    ] {
        assert!(
            seen.header_values(stripped).is_empty(),
            "{stripped} sent by the sandbox reached the upstream: {seen:#?}"
        );
    }
    assert_eq!(seen.header_values("x-unrelated"), ["kept as is"]);

    // The echo reflects the injected header: the sandbox sees it redacted.
    let text = resp.text();
    assert!(text.contains(&redacted("openai")), "{text}");

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "host": "api.test",
            "decision": "allow",
            "rule": "openai",
            "reason": "allowed",
            "status": 200,
            "secrets": ["openai"],
        }),
    );
    assert!(redactions_of(&records[0]) >= 1, "{:#}", records[0]);
    w.sweep();
}

#[test]
fn a_query_template_sets_the_parameter_replacing_the_one_the_sandbox_sent() {
    let w = env_secrets_world(NAMES, RULES);
    let url = w.url(
        "other.test",
        "/maps/api/geocode?key=sandbox-key&address=Main+St",
    );

    let resp = w.curl_ok(&curl_args(&[], &url));
    assert_eq!(resp.status, 200, "{resp:#?}");

    let seen = w.received_one("/maps/");
    assert_eq!(
        seen.query_values("key"),
        [MAPS],
        "the upstream must see exactly one key, the injected one: {seen:#?}"
    );
    assert_eq!(seen.query_values("address"), ["Main+St"], "{seen:#?}");
    assert_eq!(seen.path_only(), "/maps/api/geocode");
    // An injecting rule strips the sandbox's auth headers whatever it injects.
    for stripped in ["authorization", "x-api-key", "cookie"] {
        assert!(
            seen.header_values(stripped).is_empty(),
            "{stripped} sent by the sandbox reached the upstream: {seen:#?}"
        );
    }
    assert!(resp.text().contains(&redacted("maps")), "{resp:#?}");

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"host": "other.test", "rule": "maps", "status": 200, "secrets": ["maps"]}),
    );
    let path = records[0]["path"].as_str().unwrap_or_default();
    assert!(
        !path.contains(MAPS),
        "the audit path holds the injected key: {path}"
    );
    w.sweep();
}

#[test]
fn a_basic_auth_template_replaces_the_sandbox_credentials() {
    let w = env_secrets_world(NAMES, RULES);
    let url = w.url("tunnel.test", "/repos/o/r");

    // `-u` sends the sandbox's own Basic credentials: they must not survive.
    let resp = w.curl_ok(&["-u", "sandbox:sandbox-pw", &url]);
    assert_eq!(resp.status, 200, "{resp:#?}");

    let seen = w.received_one("/repos/");
    let expected = format!("Basic {}", STANDARD.encode(format!("x-access-token:{GH}")));
    assert_eq!(seen.header_values("authorization"), [expected], "{seen:#?}");
    assert!(
        !contains(resp.text().as_bytes(), b"x-access-token:"),
        "{resp:#?}"
    );

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"host": "tunnel.test", "rule": "github", "status": 200, "secrets": ["gh"]}),
    );
    w.sweep();
}

#[test]
fn keep_headers_keeps_the_cookie_while_the_other_auth_headers_are_stripped() {
    let w = env_secrets_world(NAMES, RULES);
    let url = w.url("a.wild.test", "/kept");

    let resp = w.curl_ok(&curl_args(&[], &url));
    assert_eq!(resp.status, 200, "{resp:#?}");

    let seen = w.received_one("/kept");
    assert_eq!(seen.header_values("x-api-key"), [WEIRD], "{seen:#?}");
    assert_eq!(
        seen.header_values("cookie"),
        ["session=sandbox-cookie"],
        "keep_headers = [\"cookie\"] must keep the sandbox's cookie: {seen:#?}"
    );
    for stripped in [
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-goog-api-key",
    ] {
        assert!(
            seen.header_values(stripped).is_empty(),
            "{stripped} sent by the sandbox reached the upstream: {seen:#?}"
        );
    }
    assert!(resp.text().contains(&redacted("weird")), "{resp:#?}");

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"host": "a.wild.test", "rule": "keeps-cookie", "status": 200, "secrets": ["weird"]}),
    );
    w.sweep();
}

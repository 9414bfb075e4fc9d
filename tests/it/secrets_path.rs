//! A credential in the URL path: a rule's `inject.path_prefix` (`/bot{{secret.telegram}}`) is
//! prepended to the path latchkey sends upstream. Policy decides on the path the sandbox sent,
//! the record keeps that path, the token reaches only the rule's hosts over TLS, and a response
//! reflecting the URL shows the sandbox the token redacted.

use serde_json::json;

use crate::support::secrets::{
    assert_refusal, contains, redacted, secrets_world, SecretsWorld, SECRET_ENV,
};
use crate::support::{assert_record, policy_dir, run_cli};

/// A Telegram-style bot token: digits, `:`, then URL-safe characters.
const TOKEN: &str = "123456789:AAH-telegramTEST_token~x9";

const POLICY: &str = r#"
[secrets.telegram]
source = "env:TEST_TELEGRAM_TOKEN"

[secrets.weird]
source = "env:TEST_WEIRD_KEY"

[[rules]]
name  = "telegram"
hosts = ["api.test"]
ports = [PORT, PLAIN_PORT]
paths = ["/sendMessage", "/getUpdates"]
[rules.inject]
path_prefix = "/bot{{secret.telegram}}"

[[rules]]
name  = "weird-in-path"
hosts = ["other.test"]
ports = [PORT]
[rules.inject]
path_prefix = "/k/{{secret.weird}}"
"#;

fn world() -> SecretsWorld {
    let mut env: Vec<(&str, &str)> = SECRET_ENV.to_vec();
    env.push(("TEST_TELEGRAM_TOKEN", TOKEN));
    secrets_world(&env, |_| {}, |s| s.ports(POLICY))
}

#[test]
fn the_upstream_gets_the_token_in_the_path_and_the_sandbox_and_the_record_never_see_it() {
    let w = world();
    let resp = w.curl_ok(&[&w.url("api.test", "/sendMessage?chat_id=7")]);
    assert_eq!(resp.status, 200, "{resp:#?}");

    let seen = w.received_one(&format!("/bot{TOKEN}/"));
    assert_eq!(seen.path, format!("/bot{TOKEN}/sendMessage?chat_id=7"));
    // The echo reflects the URL it was asked for: the sandbox reads it redacted.
    let text = resp.text();
    assert!(
        text.contains(&format!("/bot{}/sendMessage", redacted("telegram"))),
        "{text}"
    );

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "host": "api.test",
            "decision": "allow",
            "rule": "telegram",
            "status": 200,
            "secrets": ["telegram"],
        }),
    );
    let path = records[0]["path"].as_str().unwrap_or_default();
    assert!(
        path.starts_with("/sendMessage"),
        "the record keeps the sandbox's path: {path}"
    );
    w.track("TEST_TELEGRAM_TOKEN", TOKEN);
    w.sweep();
}

#[test]
fn policy_decides_on_the_path_the_sandbox_sent() {
    let w = world();
    // A path the rule does not list is refused, and nothing goes upstream.
    let out = w.curl(&[&w.url("api.test", "/deleteWebhook")]);
    assert_refusal(out.ok(), 403, "path_not_allowed");
    assert!(w.upstream.received().is_empty());
    w.track("TEST_TELEGRAM_TOKEN", TOKEN);
    w.sweep();
}

#[test]
fn a_path_prefix_is_never_sent_in_cleartext() {
    let w = world();
    let out = w.curl(&[&w.plain_url("api.test", "/sendMessage")]);
    assert_refusal(out.ok(), 403, "credential_needs_tls");
    assert!(w.plain.received().is_empty(), "{:#?}", w.plain.received());
    w.track("TEST_TELEGRAM_TOKEN", TOKEN);
    w.sweep();
}

#[test]
fn a_value_that_does_not_fit_a_path_segment_is_refused_naming_the_secret() {
    let w = world();
    let out = w.curl(&[&w.url("other.test", "/x")]);
    let resp = out.ok();
    assert_refusal(resp, 503, "secret_unavailable");
    let text = resp.text();
    assert!(
        text.contains("\"weird\"") && text.contains("URL path segment"),
        "{text}"
    );
    assert!(w.upstream.received().is_empty());
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"host": "other.test", "rule": "weird-in-path", "reason": "secret_unavailable"}),
    );
    w.sweep();
}

#[test]
fn explain_says_the_rule_injects_into_the_path() {
    let dir = policy_dir(&[(
        "main.toml",
        &POLICY.replace("PLAIN_PORT", "80").replace("PORT", "443"),
    )]);
    let p = dir.path().to_str().expect("utf-8");
    let out = run_cli([
        "explain",
        "--policies",
        p,
        "GET",
        "https://api.test/sendMessage",
    ]);
    assert!(
        out.stdout.contains("path prefix /bot{{secret.telegram}}"),
        "{out:#?}"
    );
    assert!(!contains(out.stdout.as_bytes(), TOKEN.as_bytes()));
}

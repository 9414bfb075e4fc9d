//! Real clients holding only a placeholder: Python `requests` and the official `openai` SDK
//! against an upstream that mimics `POST /v1/chat/completions` and echoes the Authorization it
//! received in the completion. The upstream must see the real key; the client must not.

use serde_json::{json, Value};

use crate::support::assert_record;
use crate::support::secrets::{assert_no_leak, env_secrets_world, redacted, SecretsWorld, OPENAI};

/// OpenAI's host binds the key for placeholders in headers (the default) and injects nothing.
const RULES: &str = r#"
[[rules]]
name    = "openai"
hosts   = ["api.test"]
ports   = [PORT]
methods = ["POST"]
paths   = ["/v1/**"]
secrets = ["openai"]
"#;

fn world() -> SecretsWorld {
    env_secrets_world(&["openai"], RULES)
}

fn assert_upstream_saw_the_real_key(w: &SecretsWorld) {
    let seen = w.received_one("/v1/chat/completions");
    assert_eq!(
        seen.header_values("authorization"),
        [format!("Bearer {OPENAI}")],
        "{seen:#?}"
    );
    assert_eq!(seen.method, "POST");
}

fn assert_allowed_with_the_key(w: &SecretsWorld) {
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "method": "POST",
            "path": "/v1/chat/completions",
            "rule": "openai",
            "decision": "allow",
            "status": 200,
            "secrets": ["openai"],
        }),
    );
    assert!(
        records[0]["redactions"].as_u64().is_some_and(|n| n >= 2),
        "the completion's content and its x-echo-auth header: {:#}",
        records[0]
    );
}

#[test]
fn python_requests_with_a_placeholder_key_gets_a_completion_without_the_real_key() {
    let w = world();
    let proxy = w.lk.proxy_url();
    let ca = w.lk.ca_pem_path();
    let stdout = w.python(
        "py_request.py",
        &[
            &proxy,
            ca.to_str().expect("UTF-8 CA path"),
            "POST",
            &w.url("api.test", "/v1/chat/completions"),
            "Authorization: Bearer __LATCHKEY_openai__",
            "Content-Type: application/json",
            r#"--data={"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}"#,
        ],
        &[],
    );
    let out: Value = serde_json::from_str(&stdout).expect("py_request.py JSON");
    assert_eq!(out["status"], 200, "{out:#}");
    let body: Value = serde_json::from_str(out["body"].as_str().expect("body"))
        .unwrap_or_else(|e| panic!("the completion is not JSON ({e}): {out:#}"));
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert_eq!(
        content,
        format!("you sent: Bearer {}", redacted("openai")),
        "{body:#}"
    );
    assert_upstream_saw_the_real_key(&w);
    assert_allowed_with_the_key(&w);
    w.sweep();
}

#[test]
fn the_openai_sdk_with_a_placeholder_key_gets_a_completion_without_the_real_key() {
    let w = world();
    let stdout = w.python(
        "openai_chat.py",
        &[&w.url("api.test", "/v1")],
        &[("OPENAI_API_KEY", "__LATCHKEY_openai__")],
    );
    let out: Value = serde_json::from_str(&stdout).expect("openai_chat.py JSON");
    assert_eq!(
        out["content"],
        format!("you sent: Bearer {}", redacted("openai")),
        "{out:#}"
    );
    assert_eq!(out["model"], "gpt-test", "{out:#}");
    assert_no_leak("the SDK's result", stdout.as_bytes(), &w.tracked());
    assert_upstream_saw_the_real_key(&w);
    assert_allowed_with_the_key(&w);
    w.sweep();
}

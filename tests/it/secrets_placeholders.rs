//! Placeholders: the sandbox holds `__LATCHKEY_<name>__` where an SDK insists on a key. Latchkey
//! replaces it only on a request whose rule binds that secret, only in the places the rule
//! enables; anywhere else the request is refused (`placeholder_not_bound`) and never forwarded.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::json;

use crate::support::secrets::{env_secrets_world, redacted, SecretsWorld, OPENAI};
use crate::support::{assert_denial, assert_record};

const RULES: &str = r#"
# Every place enabled.
[[rules]]
name         = "everywhere"
hosts        = ["api.test"]
ports        = [PORT]
secrets      = ["openai"]
placeholders = ["header", "basic_auth", "query", "body"]

# The default: headers only.
[[rules]]
name    = "header-only"
hosts   = ["other.test"]
ports   = [PORT]
secrets = ["openai"]

# Binds no secret.
[[rules]]
name  = "plain"
hosts = ["tunnel.test"]
ports = [PORT]

# Binds maps, not openai.
[[rules]]
name  = "maps"
hosts = ["a.wild.test"]
ports = [PORT]
[rules.inject.query]
key = "{{secret.maps}}"
"#;

const NAMES: &[&str] = &["openai", "maps"];

const PLACEHOLDER: &str = "__LATCHKEY_openai__";
const PLACEHOLDER_PCT: &str = "%5F%5FLATCHKEY_openai%5F%5F";

fn world() -> SecretsWorld {
    env_secrets_world(NAMES, RULES)
}

#[test]
fn a_header_placeholder_is_replaced_on_a_rule_that_binds_the_secret() {
    let w = world();
    let resp = w.curl_ok(&[
        "-H",
        &format!("Authorization: Bearer {PLACEHOLDER}"),
        "-H",
        &format!("X-Openai-Key: {PLACEHOLDER}"),
        &w.url("other.test", "/v1/chat"),
    ]);
    assert_eq!(resp.status, 200, "{resp:#?}");

    let seen = w.received_one("/v1/chat");
    assert_eq!(
        seen.header_values("authorization"),
        [format!("Bearer {OPENAI}")],
        "{seen:#?}"
    );
    assert_eq!(seen.header_values("x-openai-key"), [OPENAI], "{seen:#?}");
    assert!(resp.text().contains(&redacted("openai")), "{resp:#?}");

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({
            "host": "other.test",
            "rule": "header-only",
            "decision": "allow",
            "status": 200,
            "secrets": ["openai"],
        }),
    );
    w.sweep();
}

#[test]
fn query_basic_auth_and_body_placeholders_are_replaced_where_the_rule_enables_them() {
    let w = world();

    // Query, raw and percent-encoded.
    let resp = w.curl_ok(&[&w.url("api.test", &format!("/q/raw?api_key={PLACEHOLDER}&other=1"))]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w.received_one("/q/raw");
    assert_eq!(seen.query_values("api_key"), [OPENAI], "{seen:#?}");
    assert_eq!(seen.query_values("other"), ["1"], "{seen:#?}");

    let resp = w.curl_ok(&[&w.url("api.test", &format!("/q/pct?api_key={PLACEHOLDER_PCT}"))]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w.received_one("/q/pct");
    assert_eq!(seen.query_values("api_key"), [OPENAI], "{seen:#?}");

    // Inside Authorization: Basic base64(user:password).
    let resp = w.curl_ok(&[
        "-u",
        &format!("user:{PLACEHOLDER}"),
        &w.url("api.test", "/basic"),
    ]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w.received_one("/basic");
    assert_eq!(
        seen.header_values("authorization"),
        [format!(
            "Basic {}",
            STANDARD.encode(format!("user:{OPENAI}"))
        )],
        "{seen:#?}"
    );

    // In a body, with the length fixed up: over h2 with content-length, and chunked over h1.
    let body = format!(r#"{{"api_key":"{PLACEHOLDER}","n":1}}"#);
    let expected = format!(r#"{{"api_key":"{OPENAI}","n":1}}"#);
    let resp = w.curl_ok(&[
        "--http2",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &body,
        &w.url("api.test", "/body/h2"),
    ]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w.received_one("/body/h2");
    assert_eq!(seen.body_text(), expected, "{seen:#?}");
    if let Some(len) = seen.header("content-length") {
        assert_eq!(len, expected.len().to_string(), "{seen:#?}");
    }

    let resp = w.curl_ok(&[
        "--http1.1",
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        &body,
        &w.url("api.test", "/body/chunked"),
    ]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w.received_one("/body/chunked");
    assert_eq!(seen.body_text(), expected, "{seen:#?}");

    let records = w.lk.wait_audit(5);
    for record in &records {
        assert_record(
            record,
            json!({
                "host": "api.test",
                "rule": "everywhere",
                "decision": "allow",
                "reason": "allowed",
                "status": 200,
                "secrets": ["openai"],
            }),
        );
    }
    for seen in w.upstream.received() {
        let mut text = format!("{} {:?} ", seen.path, seen.headers);
        text.push_str(&seen.body_text());
        assert!(
            !text.contains("LATCHKEY_"),
            "a placeholder reached the upstream: {seen:#?}"
        );
    }
    w.sweep();
}

/// One refusal case: curl args, and words the denial sentence must hold.
struct Refused {
    what: &'static str,
    args: Vec<String>,
    words: Vec<&'static str>,
}

#[test]
fn a_placeholder_anywhere_it_is_not_bound_is_refused_and_never_forwarded() {
    let w = world();
    let url = |host: &str, path: &str| w.url(host, path);
    let header = |v: &str| vec!["-H".to_string(), format!("Authorization: Bearer {v}")];
    let cases = vec![
        Refused {
            what: "a header placeholder to a host whose rule binds no secret",
            args: [header(PLACEHOLDER), vec![url("tunnel.test", "/r/1")]].concat(),
            words: vec!["placeholder for secret 'openai' not bound to host tunnel.test"],
        },
        Refused {
            what: "an unknown placeholder name",
            args: [header("__LATCHKEY_nosuch__"), vec![url("api.test", "/r/2")]].concat(),
            words: vec!["'nosuch'", "api.test"],
        },
        Refused {
            what: "a placeholder for a secret bound only to another host",
            args: [header("__LATCHKEY_maps__"), vec![url("api.test", "/r/3")]].concat(),
            words: vec!["placeholder for secret 'maps' not bound to host api.test"],
        },
        Refused {
            what: "a placeholder for a secret the host's rule does not bind (openai to maps)",
            args: [header(PLACEHOLDER), vec![url("a.wild.test", "/r/4")]].concat(),
            words: vec!["placeholder for secret 'openai' not bound to host a.wild.test"],
        },
        Refused {
            what: "a body placeholder where only headers are enabled",
            args: vec![
                "--data-binary".into(),
                format!(r#"{{"api_key":"{PLACEHOLDER}"}}"#),
                url("other.test", "/r/5"),
            ],
            words: vec!["'openai'", "body"],
        },
        Refused {
            what: "a query placeholder where only headers are enabled",
            args: vec![url("other.test", &format!("/r/6?api_key={PLACEHOLDER}"))],
            words: vec!["'openai'", "query"],
        },
        Refused {
            what: "a percent-encoded query placeholder where only headers are enabled",
            args: vec![url(
                "other.test",
                &format!("/r/7?api_key={PLACEHOLDER_PCT}"),
            )],
            words: vec!["'openai'", "query"],
        },
        Refused {
            what: "a basic-auth placeholder where only headers are enabled",
            args: vec![
                "-u".into(),
                format!("user:{PLACEHOLDER}"),
                url("other.test", "/r/8"),
            ],
            words: vec!["'openai'", "basic"],
        },
        Refused {
            what: "a placeholder in the URL path, even where every place is enabled",
            args: vec![url("api.test", &format!("/r/9/{PLACEHOLDER}/x"))],
            words: vec!["'openai'"],
        },
        Refused {
            what: "a body placeholder to a host whose rule binds no secret",
            args: vec![
                "--data-binary".into(),
                format!("key={PLACEHOLDER}"),
                url("tunnel.test", "/r/10"),
            ],
            words: vec!["placeholder for secret 'openai' not bound to host tunnel.test"],
        },
        Refused {
            what: "a percent-encoded query placeholder to a host whose rule binds no secret",
            args: vec![url("tunnel.test", &format!("/r/11?k={PLACEHOLDER_PCT}"))],
            words: vec!["placeholder for secret 'openai' not bound to host tunnel.test"],
        },
    ];

    for case in &cases {
        let args: Vec<&str> = case.args.iter().map(String::as_str).collect();
        let out = w.curl(&args);
        assert_eq!(out.exit, Some(0), "{}: {out:#?}", case.what);
        let resp = &out.response;
        assert_denial(resp, 403, None, "placeholder_not_bound");
        let text = resp.text();
        for word in &case.words {
            assert!(
                text.contains(word),
                "{}: the denial should say {word:?}: {text:?}",
                case.what
            );
        }
    }
    assert!(
        w.received("/r/").is_empty(),
        "a request holding a placeholder was forwarded: {:#?}",
        w.received("/r/")
    );

    let records = w.lk.wait_audit(cases.len());
    for (record, case) in records.iter().zip(&cases) {
        assert!(
            record["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/r/")),
            "{}: {record:#}",
            case.what
        );
        assert_record(
            record,
            json!({
                "decision": "deny",
                "reason": "placeholder_not_bound",
                "status": 403,
                "upstream": null,
            }),
        );
    }
    w.sweep();
}

#[test]
fn a_rule_that_binds_no_secret_forwards_the_sandbox_auth_headers_untouched() {
    let w = world();
    let resp = w.curl_ok(&[
        "-H",
        "Authorization: Bearer sandbox-own-token",
        "-H",
        "Cookie: a=b",
        &w.url("tunnel.test", "/plain"),
    ]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let seen = w.received_one("/plain");
    assert_eq!(
        seen.header_values("authorization"),
        ["Bearer sandbox-own-token"]
    );
    assert_eq!(seen.header_values("cookie"), ["a=b"]);
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"rule": "plain", "status": 200, "secrets": [], "redactions": 0}),
    );
    w.sweep();
}

#[test]
fn a_placeholder_in_a_body_over_8_mib_is_refused_even_where_bodies_are_enabled() {
    let w = world();
    let mut body = vec![b'a'; 9 * 1024 * 1024];
    let at = body.len() - 100;
    body[at..at + PLACEHOLDER.len()].copy_from_slice(PLACEHOLDER.as_bytes());
    let path = w.dir.path().join("big-body");
    std::fs::write(&path, body).expect("write body file");

    let out = w.curl(&[
        "--data-binary",
        &format!("@{}", path.display()),
        &w.url("api.test", "/big-body"),
    ]);
    assert_eq!(out.exit, Some(0), "{out:#?}");
    for seen in w.received("/big-body") {
        assert!(
            !crate::support::secrets::contains(&seen.body, OPENAI.as_bytes()),
            "the placeholder was substituted in a body over 8 MiB"
        );
        assert!(
            !crate::support::secrets::contains(&seen.body, PLACEHOLDER.as_bytes()),
            "the placeholder was forwarded in a body over 8 MiB ({} bytes arrived)",
            seen.body.len()
        );
    }
    assert_eq!(
        (
            out.response.status,
            out.response.header("x-latchkey-reason")
        ),
        (403, Some("placeholder_not_bound")),
        "{:#?}",
        out.response
    );
    assert_denial(&out.response, 403, None, "placeholder_not_bound");
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "deny", "reason": "placeholder_not_bound", "status": 403}),
    );
    w.sweep();
}

#[test]
fn a_placeholder_is_refused_even_when_the_policy_declares_no_secret_at_all() {
    use crate::support::clients::raw_request;
    use crate::support::{latchkey, Upstream};

    let upstream = Upstream::http();
    let port = upstream.port();
    let lk = latchkey()
        .pin("api.test")
        .policy(
            "main.toml",
            &format!("[[rules]]\nname = \"api\"\nhosts = [\"api.test\"]\nports = [{port}]\nmethods = [\"GET\", \"POST\"]\n"),
        )
        .run();
    let head = |extra: &str, path: &str, body: &str| {
        format!(
            "POST http://api.test:{port}{path} HTTP/1.1\r\nHost: api.test:{port}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let cases = [
        head(
            &format!("Authorization: Bearer {PLACEHOLDER}\r\n"),
            "/h",
            "",
        ),
        head("", &format!("/q?key={PLACEHOLDER_PCT}"), ""),
        head("", "/b", &format!("{{\"key\":\"{PLACEHOLDER}\"}}")),
    ];
    for req in &cases {
        let resp = raw_request(lk.addr(), req.as_bytes());
        assert_denial(&resp, 403, Some("api"), "placeholder_not_bound");
        assert!(
            resp.text().contains("openai"),
            "the denial names the placeholder's secret: {resp:#?}"
        );
    }
    assert!(
        upstream.received().is_empty(),
        "a placeholder was forwarded: {:#?}",
        upstream.received()
    );
    let records = lk.wait_audit(cases.len());
    for r in &records {
        assert_record(
            r,
            json!({"decision": "deny", "reason": "placeholder_not_bound", "rule": "api", "status": 403}),
        );
    }
    // Without placeholders the same policy forwards.
    let ok = raw_request(lk.addr(), head("", "/plain", "{}").as_bytes());
    assert_eq!(ok.status, 200, "{ok:#?}");
}

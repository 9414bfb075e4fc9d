//! What the sandbox sends: every part of a request is checked. A secret value in the method,
//! the host, the path, a query name or value, a header name or value, the basic-auth
//! credentials or the body — raw, percent-encoded or base64 — is refused
//! (`secret_value_unbound`) over HTTP/1.1 and h2, audited, and never reaches the upstream; a
//! secret or a placeholder in the host is refused before any DNS lookup or dial, the CONNECT
//! authority included; a placeholder where latchkey does not replace it (a query *name*, raw or
//! percent-encoded, a header name, the method, the path) is refused (`placeholder_not_bound`).

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::json;

use crate::support::clients::python_request;
use crate::support::secrets::{
    assert_no_leak, env_secrets_world, percent, secrets_toml, OPENAI, SECRET_ENV, WEIRD,
};
use crate::support::{assert_denial, assert_record, curl, latchkey, TestCa, Upstream};

const RULES: &str = r#"
[[rules]]
name  = "openai"
hosts = ["api.test"]
ports = [PORT]
placeholders = ["header", "query"]
[rules.inject.headers]
authorization = "Bearer {{secret.openai}}"

[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [PORT]
"#;

/// Every byte of `value` percent-encoded (upper-case hex): no encoder writes this, so only a
/// check that decodes before it searches finds the value.
fn every_byte_percent(value: &str) -> String {
    value.bytes().map(|b| format!("%{b:02X}")).collect()
}

/// (position, encoding, curl arguments) for a request to `url(path)` carrying a secret value.
fn cases(url: &dyn Fn(&str) -> String) -> Vec<(String, Vec<String>)> {
    let raw = OPENAI.to_string();
    let pct = every_byte_percent(OPENAI);
    let b64url = URL_SAFE_NO_PAD.encode(OPENAI);
    let b64 = STANDARD.encode(format!("prefix:{OPENAI}"));
    let weird_pct = percent(WEIRD.as_bytes(), true, false);
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut n = 0;
    let mut add = |what: &str, make: &dyn Fn(&str) -> Vec<String>| {
        n += 1;
        let path = format!("/rc/{n}");
        out.push((what.to_string(), make(&path)));
    };
    // Tokens (method, header name, query name) cannot hold `+` or `/`: URL-safe base64.
    for (enc, v) in [("raw", &raw), ("percent", &pct), ("base64", &b64url)] {
        add(&format!("method ({enc})"), &|p| {
            vec!["-X".into(), v.clone(), url(p)]
        });
        add(&format!("header name ({enc})"), &|p| {
            vec!["-H".into(), format!("{v}: 1"), url(p)]
        });
        add(&format!("query name ({enc})"), &|p| {
            vec![url(&format!("{p}?{v}=1"))]
        });
        add(&format!("path ({enc})"), &|p| {
            vec![url(&format!("{p}/{v}"))]
        });
    }
    for (enc, v) in [("raw", &raw), ("percent", &weird_pct), ("base64", &b64)] {
        add(&format!("header value ({enc})"), &|p| {
            vec!["-H".into(), format!("X-Note: {v}"), url(p)]
        });
        add(&format!("query value ({enc})"), &|p| {
            vec![url(&format!("{p}?a=1&q={v}"))]
        });
        add(&format!("body ({enc})"), &|p| {
            vec!["--data-binary".into(), format!("x={v}"), url(p)]
        });
        add(&format!("basic auth password ({enc})"), &|p| {
            vec!["-u".into(), format!("user:{v}"), url(p)]
        });
    }
    out
}

#[test]
fn a_secret_value_in_any_part_of_the_request_in_any_encoding_is_refused_over_h1_and_h2() {
    let w = env_secrets_world(&["openai", "weird"], RULES);
    let url = |p: &str| w.url("other.test", p);
    let cases = cases(&url);
    let mut expected = 0;
    for flag in ["--http1.1", "--http2"] {
        for (what, args) in &cases {
            let mut all = vec![flag];
            all.extend(args.iter().map(String::as_str));
            let out = w.curl(&all);
            assert_eq!(out.exit, Some(0), "{flag} {what}: {out:#?}");
            assert_denial(&out.response, 403, None, "secret_value_unbound");
            assert!(
                out.response.text().contains("'openai'") || out.response.text().contains("'weird'"),
                "{flag} {what}: the refusal names the secret: {:?}",
                out.response.text()
            );
            expected += 1;
        }
    }
    assert!(
        w.received("/rc/").is_empty(),
        "a request carrying a secret value reached the upstream: {:#?}",
        w.received("/rc/")
    );
    assert_eq!(w.upstream.connections(), 0, "no request needed an upstream");
    let records = w.lk.wait_audit(expected);
    for record in &records {
        assert_record(
            record,
            json!({
                "host": "other.test",
                "rule": "other",
                "decision": "deny",
                "reason": "secret_value_unbound",
                "status": 403,
                "upstream": null,
                "secrets": [],
            }),
        );
    }
    w.sweep();
}

#[test]
fn python_requests_sending_a_secret_as_a_header_name_method_or_query_name_is_refused() {
    let w = env_secrets_world(&["openai"], RULES);
    let cases = [
        (
            "GET",
            w.url("other.test", "/py/1"),
            vec![format!("{OPENAI}: x")],
        ),
        (OPENAI, w.url("other.test", "/py/2"), vec![]),
        (
            "GET",
            w.url("other.test", &format!("/py/3?{OPENAI}=1")),
            vec![],
        ),
        // The bound host does not make the method or a header name a place for a secret.
        (OPENAI, w.url("api.test", "/py/4"), vec![]),
        (
            "GET",
            w.url("api.test", "/py/5"),
            vec![format!("{OPENAI}: x")],
        ),
    ];
    for (method, url, headers) in &cases {
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        let resp = python_request(&w.lk, method, url, &headers);
        w.saw_response(&format!("python {method} {url}"), &resp);
        assert_denial(&resp, 403, None, "secret_value_unbound");
    }
    assert!(
        w.received("/py/").is_empty(),
        "forwarded: {:#?}",
        w.received("/py/")
    );
    let records = w.lk.wait_audit(cases.len());
    for record in &records {
        assert_record(
            record,
            json!({"decision": "deny", "reason": "secret_value_unbound", "status": 403, "upstream": null}),
        );
    }
    w.sweep();
}

const PLACEHOLDER: &str = "__LATCHKEY_openai__";

#[test]
fn a_placeholder_in_a_query_name_header_name_method_or_path_is_refused_not_replaced() {
    let w = env_secrets_world(&["openai"], RULES);
    let pct = "%5F%5FLATCHKEY_openai%5F%5F";
    let lower_pct = "%5f%5fLATCHKEY_openai%5f%5f";
    let api = |p: &str| w.url("api.test", p);
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "query name, raw",
            vec![api(&format!("/ph/1?{PLACEHOLDER}=1"))],
        ),
        (
            "query name, percent-encoded",
            vec![api(&format!("/ph/2?{pct}=1"))],
        ),
        (
            "query name, lower-case percent",
            vec![api(&format!("/ph/3?{lower_pct}=x&b=2"))],
        ),
        (
            "query name without a value",
            vec![api(&format!("/ph/4?{pct}"))],
        ),
        (
            "header name",
            vec!["-H".into(), format!("{PLACEHOLDER}: 1"), api("/ph/5")],
        ),
        (
            "method",
            vec!["-X".into(), PLACEHOLDER.into(), api("/ph/6")],
        ),
        ("path", vec![api(&format!("/ph/7/{PLACEHOLDER}"))]),
        ("path, percent-encoded", vec![api(&format!("/ph/8/{pct}"))]),
    ];
    let mut n = 0;
    for flag in ["--http1.1", "--http2"] {
        for (what, args) in &cases {
            let mut all = vec![flag];
            all.extend(args.iter().map(String::as_str));
            let out = w.curl(&all);
            assert_eq!(out.exit, Some(0), "{flag} {what}: {out:#?}");
            assert_denial(&out.response, 403, Some("openai"), "placeholder_not_bound");
            n += 1;
        }
    }
    assert!(
        w.received("/ph/").is_empty(),
        "forwarded: {:#?}",
        w.received("/ph/")
    );

    // The same placeholder in a query value is replaced, raw and percent-encoded.
    for (i, v) in [PLACEHOLDER, pct].iter().enumerate() {
        let out = w.curl(&["--http2", &api(&format!("/ok/{i}?key={v}"))]);
        assert_eq!(out.ok().status, 200, "{out:#?}");
        let seen = w.received_one(&format!("/ok/{i}"));
        assert_eq!(seen.query_values("key"), [OPENAI], "{seen:#?}");
        n += 1;
    }
    let records = w.lk.wait_audit(n);
    for record in &records[..records.len() - 2] {
        assert_record(
            record,
            json!({"rule": "openai", "decision": "deny", "reason": "placeholder_not_bound", "status": 403}),
        );
    }
    for record in &records[records.len() - 2..] {
        assert_record(
            record,
            json!({"rule": "openai", "decision": "allow", "status": 200, "secrets": ["openai"]}),
        );
    }
    w.sweep();
}

/// A secret value (or a placeholder) as a subdomain under a `*.wild.test` rule is refused
/// before any lookup or dial: the names are pinned to the upstream, so a dial would show up in
/// its connection count, and a lookup would need the name to leave latchkey at all.
#[test]
fn a_secret_in_a_subdomain_is_refused_before_dns_at_the_connect_gate_and_in_plain_http() {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let plain = Upstream::http();
    let lower = OPENAI.to_ascii_lowercase();
    let b64 = URL_SAFE_NO_PAD.encode(OPENAI);
    let policy = format!(
        "{}[[rules]]\nname = \"wild\"\nhosts = [\"*.wild.test\"]\nports = [{}, {}]\n",
        secrets_toml(&["openai"]),
        upstream.port(),
        plain.port()
    );
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .policy("main.toml", &policy)
        .pin("a.wild.test")
        .pin(&format!("{lower}.wild.test"))
        .pin(&format!("{}.wild.test", b64.to_ascii_lowercase()))
        .pin("__latchkey_openai__.wild.test");
    for (name, value) in SECRET_ENV {
        builder = builder.env(name, value);
    }
    let lk = builder.run();
    let https = |label: &str| format!("https://{label}.wild.test:{}/sub", upstream.port());
    let http = |label: &str| format!("http://{label}.wild.test:{}/sub", plain.port());
    let mut seen: Vec<Vec<u8>> = Vec::new();

    // curl keeps the case of the host; the CONNECT is refused before TLS.
    for label in [OPENAI, b64.as_str(), &lower, PLACEHOLDER] {
        let out = curl(&lk).args(["--http2", https(label).as_str()]).run();
        assert_ne!(out.exit, Some(0), "the CONNECT must fail: {out:#?}");
        let reason = if label == PLACEHOLDER {
            "placeholder_not_bound"
        } else {
            "secret_value_unbound"
        };
        // curl keeps no body of a refused CONNECT: the status and latchkey's headers.
        assert_eq!(out.response.status, 403, "{out:#?}");
        assert_eq!(
            out.response.header("x-latchkey-reason"),
            Some(reason),
            "{out:#?}"
        );
        seen.push(out.stderr.into_bytes());
        // Absolute-form plain HTTP: refused before the upstream request is made.
        let out = curl(&lk).args([http(label).as_str()]).run();
        assert_eq!(out.exit, Some(0), "{out:#?}");
        assert_denial(&out.response, 403, None, reason);
        seen.push(out.response.body.clone());
    }
    // Python requests lowercases the host before it sends the CONNECT and the request line.
    for url in [http(OPENAI), http(&b64)] {
        let resp = python_request(&lk, "GET", &url, &[]);
        assert_denial(&resp, 403, None, "secret_value_unbound");
        seen.push(resp.body.clone());
    }
    assert_eq!(
        (upstream.connections(), plain.connections()),
        (0, 0),
        "latchkey dialed a host named after a secret"
    );
    let records = lk.wait_audit(10);
    for record in &records {
        assert_record(
            record,
            json!({"decision": "deny", "status": 403, "upstream": null}),
        );
        assert!(
            ["secret_value_unbound", "placeholder_not_bound"]
                .contains(&record["reason"].as_str().unwrap_or_default()),
            "{record:#}"
        );
        let host = record["host"]
            .as_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            !host.contains(&lower) && !host.contains(&b64.to_ascii_lowercase()),
            "the audit record holds the secret as a host: {record:#}"
        );
    }

    // The same rule reaches an ordinary subdomain: the setup would have dialed.
    let ok = curl(&lk).args([https("a").as_str()]).run();
    assert_eq!(ok.ok().status, 200, "{ok:#?}");
    assert_eq!(upstream.connections(), 1);

    let secrets: Vec<(String, String)> = vec![
        ("openai".into(), OPENAI.into()),
        ("openai lowercased".into(), lower.clone()),
    ];
    for bytes in &seen {
        assert_no_leak("what the client saw", bytes, &secrets);
    }
    assert_no_leak("the audit file", lk.audit_text().as_bytes(), &secrets);
    assert_no_leak("latchkey's stderr", lk.stderr_text().as_bytes(), &secrets);
}

/// A refusal decided on the head, before the body is read, still reaches a client that is
/// uploading: latchkey reads and drops the body (bounded) before it answers, so an h2 client does
/// not see a reset instead of the 403, nor an HTTP/1.1 client a connection reset.
#[test]
fn a_refusal_on_the_head_of_an_upload_reaches_the_client_over_h1_and_h2() {
    let w = env_secrets_world(&["openai"], RULES);
    let file = w.dir.path().join("upload.bin");
    std::fs::write(&file, vec![b'u'; 512 * 1024]).expect("body file");
    let data = format!("@{}", file.display());
    for flag in ["--http1.1", "--http2"] {
        for _ in 0..3 {
            let out = w.curl(&[
                flag,
                "-H",
                &format!("X-Note: {OPENAI}"),
                "--data-binary",
                &data,
                &w.url("other.test", "/upload"),
            ]);
            assert_eq!(out.exit, Some(0), "{flag}: {out:#?}");
            assert_denial(&out.response, 403, Some("other"), "secret_value_unbound");
        }
    }
    assert!(w.received("/upload").is_empty());
    w.lk.wait_audit(6);
    w.sweep();
}

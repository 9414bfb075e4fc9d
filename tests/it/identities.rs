//! Identities: which sandbox is asking, and which rules it may use. Two sandboxes with two
//! tokens reach only their own rules; an unknown or missing token gets `407` with a challenge;
//! every common `Proxy-Authorization` form identifies; the token never leaves latchkey (not to
//! the upstream, not into the audit or the log); inside an intercepted CONNECT the CONNECT's
//! identity is the one that counts; a source-address identity needs no token, and one with both
//! a token and sources needs both.

use std::io::Write;
use std::process::Command;

use base64::Engine;
use serde_json::{json, Value};

use crate::support::admin::{metrics, status};
use crate::support::clients::{dial, read_response, RawResponse};
use crate::support::latchkey::SCRUBBED_ENV;
use crate::support::session::PySession;
use crate::support::{
    assert_denial, assert_record, curl, latchkey, policy_dir, raw_request, run_cli, Echo, Latchkey,
    TestCa, Upstream, PINNED,
};

const TOKEN_CI: &str = "tok-ci-7f3a9c2e5b1d4086e2";
const TOKEN_LAB: &str = "tok-lab-2c8e6a1f9d3b5074aa";
const WRONG_TOKEN: &str = "tok-nobody-91e0c4d7b2a65f38";

const CHALLENGE: &str = r#"Basic realm="latchkey", charset="UTF-8""#;

/// An HTTPS and a plain HTTP echo upstream, and latchkey with `policy(https_port, http_port)`,
/// both sandboxes' tokens in its environment.
struct World {
    lk: Latchkey,
    https: Upstream,
    http: Upstream,
    _ca: TestCa,
}

fn world(policy: impl FnOnce(u16, u16) -> String) -> World {
    let ca = TestCa::new();
    let https = Upstream::https(&ca);
    let http = Upstream::http();
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .env("LK_TOKEN_CI", TOKEN_CI)
        .env("LK_TOKEN_LAB", TOKEN_LAB)
        .policy("main.toml", &policy(https.port(), http.port()));
    for host in PINNED {
        builder = builder.pin(host);
    }
    World {
        lk: builder.run(),
        https,
        http,
        _ca: ca,
    }
}

/// `api` (GET under /v1/) for `ci`, `other` (anything) for `lab`; both tell the upstream who
/// asked through `{{identity}}`.
fn two_sandboxes(https: u16, http: u16) -> String {
    format!(
        r#"
[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{https}, {http}]
methods = ["GET"]
paths   = ["/v1/**"]
[rules.inject.headers]
x-agent = "{{{{identity}}}}"

[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [{https}, {http}]
[rules.inject.headers]
x-agent = "{{{{identity}}}}"

[identities.ci]
token = "env:LK_TOKEN_CI"
rules = ["api"]

[identities.lab]
token = "env:LK_TOKEN_LAB"
rules = ["other"]
"#
    )
}

fn basic(user_pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    )
}

/// A plain-HTTP proxy request for `url` with extra header lines.
fn plain_get(lk: &Latchkey, url: &str, headers: &[(&str, &str)]) -> RawResponse {
    let authority = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .expect("http:// URL");
    let mut req = format!("GET {url} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    raw_request(lk.addr(), req.as_bytes())
}

/// `CONNECT authority` with extra header lines; the proxy's answer.
fn connect_with(lk: &Latchkey, authority: &str, headers: &[(&str, &str)]) -> RawResponse {
    let mut tcp = dial(lk.addr());
    let mut req = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    tcp.write_all(req.as_bytes()).expect("send CONNECT");
    read_response(&mut tcp, true).expect("read CONNECT answer")
}

/// The token must not be anywhere latchkey writes: the audit file and its log.
fn assert_token_kept_in(lk: &Latchkey, token: &str) {
    assert!(
        !lk.audit_text().contains(token),
        "a Proxy-Authorization token reached the audit log:\n{}",
        lk.audit_text()
    );
    assert!(
        !lk.stderr_text().contains(token),
        "a Proxy-Authorization token reached the log:\n{}",
        lk.stderr_text()
    );
}

/// `403 identity_not_allowed` naming the identity and the rule it may not use.
fn assert_identity_denial(resp: &RawResponse, identity: &str, rule: &str) {
    assert_denial(resp, 403, Some(rule), "identity_not_allowed");
    let sentence = format!("identity '{identity}' may not use rule '{rule}'");
    assert!(
        resp.text().contains(&sentence),
        "the denial should say {sentence:?}: {resp:#?}"
    );
}

fn assert_no_proxy_authorization(echo: &Echo) {
    assert!(
        !echo.has_header("proxy-authorization"),
        "the Proxy-Authorization token was forwarded to the upstream: {echo:#?}"
    );
}

#[test]
fn two_sandboxes_with_their_own_tokens_each_reach_their_own_rule_and_the_upstream_never_sees_a_token(
) {
    let w = world(two_sandboxes);
    let port = w.https.port();

    let out = curl(&w.lk)
        .args([
            "--proxy-user",
            &format!("ci:{TOKEN_CI}"),
            &format!("https://api.test:{port}/v1/ci"),
        ])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.header_values("x-agent"), ["ci"], "{echo:#?}");
    assert_no_proxy_authorization(&echo);

    let out = curl(&w.lk)
        .args([
            "--proxy-user",
            &format!("lab:{TOKEN_LAB}"),
            &format!("https://other.test:{port}/anything"),
        ])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.header_values("x-agent"), ["lab"], "{echo:#?}");
    assert_no_proxy_authorization(&echo);

    // Plain HTTP sends the token on every request; it is stripped there too.
    let http_port = w.http.port();
    let resp = plain_get(
        &w.lk,
        &format!("http://api.test:{http_port}/v1/plain"),
        &[("Proxy-Authorization", &basic(&format!("ci:{TOKEN_CI}")))],
    );
    assert_eq!(resp.status, 200, "{resp:#?}");
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.header_values("x-agent"), ["ci"], "{echo:#?}");
    assert_no_proxy_authorization(&echo);
    for seen in w.https.received().iter().chain(w.http.received().iter()) {
        assert!(
            seen.header("proxy-authorization").is_none(),
            "an upstream received Proxy-Authorization: {seen:#?}"
        );
    }

    let records = w.lk.wait_audit(3);
    assert_record(
        &records[0],
        json!({"identity": "ci", "host": "api.test", "path": "/v1/ci", "decision": "allow",
               "rule": "api", "reason": "allowed", "status": 200, "would_deny": false}),
    );
    assert_record(
        &records[1],
        json!({"identity": "lab", "host": "other.test", "decision": "allow", "rule": "other",
               "reason": "allowed", "status": 200}),
    );
    assert_record(
        &records[2],
        json!({"identity": "ci", "scheme": "http", "host": "api.test", "rule": "api",
               "reason": "allowed", "status": 200}),
    );
    assert_token_kept_in(&w.lk, TOKEN_CI);
    assert_token_kept_in(&w.lk, TOKEN_LAB);

    // Metrics count by identity; /status lists the identities; neither holds a token.
    let m = metrics(&w.lk);
    let requests = "latchkey_requests_total";
    let allowed = |rule, identity| {
        m.value(
            requests,
            &[
                ("decision", "allow"),
                ("reason", "allowed"),
                ("rule", rule),
                ("identity", identity),
            ],
        )
    };
    assert_eq!(allowed("api", "ci"), 2.0, "{}", m.text);
    assert_eq!(allowed("other", "lab"), 1.0, "{}", m.text);
    let s = status(&w.lk);
    assert_eq!(s["policy"]["identities"], json!(["ci", "lab"]), "{s:#}");
    for token in [TOKEN_CI, TOKEN_LAB] {
        assert!(!m.text.contains(token), "a token in /metrics");
        assert!(!s.to_string().contains(token), "a token in /status: {s:#}");
    }
}

#[test]
fn one_sandbox_cannot_use_the_other_sandboxs_rule_at_the_connect_gate_or_in_plain_http() {
    let w = world(two_sandboxes);
    let port = w.https.port();
    let http_port = w.http.port();

    // ci asks for lab's host over HTTPS: refused at the CONNECT gate, before any TLS.
    let resp = connect_with(
        &w.lk,
        &format!("other.test:{port}"),
        &[("Proxy-Authorization", &basic(&format!("ci:{TOKEN_CI}")))],
    );
    assert_identity_denial(&resp, "ci", "other");

    // ci in plain HTTP.
    let resp = plain_get(
        &w.lk,
        &format!("http://other.test:{http_port}/x"),
        &[("Proxy-Authorization", &format!("Bearer {TOKEN_CI}"))],
    );
    assert_identity_denial(&resp, "ci", "other");

    // And lab may not use ci's rule.
    let resp = plain_get(
        &w.lk,
        &format!("http://api.test:{http_port}/v1/x"),
        &[("Proxy-Authorization", &basic(&format!("lab:{TOKEN_LAB}")))],
    );
    assert_identity_denial(&resp, "lab", "api");

    assert_eq!(w.https.connections(), 0, "a refused identity was dialed");
    assert_eq!(w.http.connections(), 0, "a refused identity was forwarded");

    let records = w.lk.wait_audit(3);
    assert_record(
        &records[0],
        json!({"method": "CONNECT", "identity": "ci", "host": "other.test", "port": port,
               "decision": "deny", "rule": "other", "reason": "identity_not_allowed",
               "status": 403, "upstream": null}),
    );
    assert_record(
        &records[1],
        json!({"method": "GET", "identity": "ci", "host": "other.test", "decision": "deny",
               "reason": "identity_not_allowed", "status": 403, "upstream": null}),
    );
    assert_record(
        &records[2],
        json!({"identity": "lab", "host": "api.test", "decision": "deny",
               "reason": "identity_not_allowed", "status": 403, "upstream": null}),
    );
    assert_token_kept_in(&w.lk, TOKEN_CI);
    assert_token_kept_in(&w.lk, TOKEN_LAB);
}

#[test]
fn an_unknown_or_missing_token_gets_407_with_a_challenge_and_an_unidentified_record() {
    let w = world(two_sandboxes);
    let port = w.https.port();
    let http_port = w.http.port();
    let url = format!("http://api.test:{http_port}/v1/x");

    let unknown = plain_get(
        &w.lk,
        &url,
        &[("Proxy-Authorization", &basic(&format!("ci:{WRONG_TOKEN}")))],
    );
    let missing = plain_get(&w.lk, &url, &[]);
    let connect = connect_with(
        &w.lk,
        &format!("api.test:{port}"),
        &[("Proxy-Authorization", &format!("Bearer {WRONG_TOKEN}"))],
    );
    for (what, resp) in [
        ("unknown token", &unknown),
        ("no token", &missing),
        ("CONNECT with an unknown token", &connect),
    ] {
        assert_denial(resp, 407, None, "proxy_auth_required");
        assert_eq!(
            resp.header("proxy-authenticate"),
            Some(CHALLENGE),
            "{what}: {resp:#?}"
        );
        assert!(
            !resp.text().contains(WRONG_TOKEN),
            "{what}: the 407 echoes the token: {resp:#?}"
        );
    }
    assert_eq!(w.https.connections() + w.http.connections(), 0);

    let records = w.lk.wait_audit(3);
    for (record, method) in records.iter().zip(["GET", "GET", "CONNECT"]) {
        assert_record(
            record,
            json!({"identity": "unidentified", "method": method, "host": "api.test",
                   "decision": "deny", "reason": "proxy_auth_required", "status": 407,
                   "upstream": null, "would_deny": false}),
        );
    }
    assert_token_kept_in(&w.lk, WRONG_TOKEN);
}

#[test]
fn every_common_proxy_authorization_form_identifies_the_sandbox_by_its_token() {
    let w = world(two_sandboxes);
    let http_port = w.http.port();
    let forms = [
        ("Basic NAME:TOKEN", basic(&format!("ci:{TOKEN_CI}"))),
        // The token alone identifies: the user name is not checked.
        ("Basic ANY:TOKEN", basic(&format!("whoever:{TOKEN_CI}"))),
        ("Basic TOKEN:", basic(&format!("{TOKEN_CI}:"))),
        ("Bearer TOKEN", format!("Bearer {TOKEN_CI}")),
    ];
    for (i, (what, value)) in forms.iter().enumerate() {
        let resp = plain_get(
            &w.lk,
            &format!("http://api.test:{http_port}/v1/form-{i}"),
            &[("Proxy-Authorization", value)],
        );
        assert_eq!(resp.status, 200, "{what}: {resp:#?}");
        let echo = Echo::parse(&resp.text());
        assert_eq!(echo.header_values("x-agent"), ["ci"], "{what}: {echo:#?}");
        assert_no_proxy_authorization(&echo);
    }

    let records = w.lk.wait_audit(forms.len());
    for (i, record) in records.iter().enumerate() {
        assert_record(
            record,
            json!({"identity": "ci", "path": format!("/v1/form-{i}"), "reason": "allowed"}),
        );
    }
    assert_token_kept_in(&w.lk, TOKEN_CI);
}

#[test]
fn inside_an_intercepted_connect_the_connect_identity_applies_to_every_inner_request() {
    let w = world(two_sandboxes);
    let port = w.https.port();

    // Python requests with credentials in the proxy URL: one CONNECT carries them, then two
    // requests on the kept-alive tunnel carry none.
    let proxy = format!("http://ci:{TOKEN_CI}@{}", w.lk.addr());
    let mut session = PySession::start(&w.lk, Some(&proxy));
    for path in ["/v1/one", "/v1/two"] {
        let resp = session.request("GET", &format!("https://api.test:{port}{path}"));
        assert_eq!(resp.status, 200, "{resp:#?}");
        let echo = Echo::parse(&resp.text());
        assert_eq!(echo.header_values("x-agent"), ["ci"], "{echo:#?}");
        assert_no_proxy_authorization(&echo);
    }
    drop(session);

    // A Proxy-Authorization header sent *inside* the tunnel (curl -H goes to the origin, not
    // the proxy) neither switches the identity nor reaches the upstream.
    let out = curl(&w.lk)
        .args([
            "--proxy-user",
            &format!("ci:{TOKEN_CI}"),
            "-H",
            &format!("Proxy-Authorization: Bearer {TOKEN_LAB}"),
            &format!("https://api.test:{port}/v1/three"),
        ])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 200, "{out:#?}");
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.header_values("x-agent"), ["ci"], "{echo:#?}");
    assert_no_proxy_authorization(&echo);
    let seen = w.https.received();
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert!(
        seen.iter()
            .all(|r| r.header("proxy-authorization").is_none()),
        "{seen:#?}"
    );

    let records = w.lk.wait_audit(3);
    for (record, path) in records.iter().zip(["/v1/one", "/v1/two", "/v1/three"]) {
        assert_record(
            record,
            json!({"identity": "ci", "path": path, "rule": "api", "reason": "allowed",
                   "status": 200}),
        );
    }
    assert_eq!(
        records[0]["client"], records[1]["client"],
        "the session's two requests should share one tunnel: {records:#?}"
    );
    assert_token_kept_in(&w.lk, TOKEN_CI);
    assert_token_kept_in(&w.lk, TOKEN_LAB);
}

#[test]
fn a_source_address_identity_needs_no_token_and_a_token_identity_with_sources_needs_both() {
    let w = world(|https, http| {
        format!(
            r#"
[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{https}, {http}]

[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [{https}, {http}]
[rules.inject.headers]
x-agent = "{{{{identity}}}}"

[identities.lab]
sources = ["127.0.0.0/8"]
rules   = ["other"]

[identities.ci]
token   = "env:LK_TOKEN_CI"
sources = ["10.0.0.0/8"]
rules   = ["*"]
"#
        )
    });
    let http_port = w.http.port();

    // No token, from 127.0.0.1: lab.
    let resp = plain_get(&w.lk, &format!("http://other.test:{http_port}/lab"), &[]);
    assert_eq!(resp.status, 200, "{resp:#?}");
    let echo = Echo::parse(&resp.text());
    assert_eq!(echo.header_values("x-agent"), ["lab"], "{echo:#?}");

    // lab may not use api.
    let resp = plain_get(&w.lk, &format!("http://api.test:{http_port}/x"), &[]);
    assert_identity_denial(&resp, "lab", "api");

    // ci's token is right but 127.0.0.1 is outside ci's sources: both are needed.
    let resp = plain_get(
        &w.lk,
        &format!("http://api.test:{http_port}/x"),
        &[("Proxy-Authorization", &format!("Bearer {TOKEN_CI}"))],
    );
    assert_denial(&resp, 407, None, "proxy_auth_required");
    assert_eq!(resp.header("proxy-authenticate"), Some(CHALLENGE));

    assert_eq!(w.http.received().len(), 1);
    let records = w.lk.wait_audit(3);
    assert_record(
        &records[0],
        json!({"identity": "lab", "rule": "other", "reason": "allowed", "status": 200}),
    );
    assert_record(
        &records[1],
        json!({"identity": "lab", "reason": "identity_not_allowed", "status": 403}),
    );
    assert_record(
        &records[2],
        json!({"identity": "unidentified", "reason": "proxy_auth_required", "status": 407}),
    );
    assert_token_kept_in(&w.lk, TOKEN_CI);
}

#[test]
fn a_client_outside_every_identitys_sources_is_refused_with_407() {
    let w = world(|https, http| {
        format!(
            r#"
[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [{https}, {http}]

[identities.lab]
sources = ["10.77.0.0/24"]
rules   = ["*"]
"#
        )
    });

    let resp = plain_get(
        &w.lk,
        &format!("http://other.test:{}/x", w.http.port()),
        &[],
    );
    assert_denial(&resp, 407, None, "proxy_auth_required");
    assert_eq!(resp.header("proxy-authenticate"), Some(CHALLENGE));
    assert_eq!(w.http.connections(), 0);

    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"identity": "unidentified", "decision": "deny", "reason": "proxy_auth_required",
               "status": 407}),
    );
}

#[test]
fn explain_takes_the_identity_into_account() {
    let dir = policy_dir(&[(
        "main.toml",
        r#"
[[rules]]
name  = "api"
hosts = ["api.test"]

[[rules]]
name  = "other"
hosts = ["other.test"]

[identities.ci]
token = "env:LK_TOKEN_CI"
rules = ["api"]
"#,
    )]);
    let explain = |identity: &str, url: &str| {
        let mut cmd = Command::new(crate::support::latchkey::BIN);
        cmd.arg("explain")
            .arg("--policies")
            .arg(dir.path())
            .arg("--identity")
            .arg(identity)
            .arg("GET")
            .arg(url);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        // explain decides; it must not need the token's value.
        cmd.env_remove("LK_TOKEN_CI");
        crate::support::latchkey::wait_with_timeout(&mut cmd, std::time::Duration::from_secs(20))
    };

    let out = explain("ci", "https://api.test/v1/x");
    assert_eq!(out.code(), Some(0), "{out:#?}");
    assert!(out.stdout.contains("allowed"), "{out:#?}");

    let out = explain("ci", "https://other.test/x");
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stdout.contains("identity_not_allowed"),
        "explain should give the reason: {out:#?}"
    );
    assert!(
        out.stdout.contains("'ci'") && out.stdout.contains("other"),
        "explain should name the identity and the rule: {out:#?}"
    );

    // The same question through run_cli's defaults, as JSON.
    let out = run_cli([
        "explain",
        "--policies",
        dir.path().to_str().expect("utf-8 path"),
        "--identity",
        "ci",
        "--json",
        "GET",
        "https://other.test/x",
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let v: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("explain --json printed no JSON ({e}): {out:#?}"));
    assert_eq!(v["decision"], "deny", "{v:#}");
    assert_eq!(v["reason"], "identity_not_allowed", "{v:#}");
}

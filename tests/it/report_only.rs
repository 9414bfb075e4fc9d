//! Report-only rules (`mode = "report"`) and `--mode report`: traffic policy would deny is
//! forwarded without secrets and audited `decision = "allow"`, `would_deny = true`, with the
//! denial it would have been as `reason`; metrics count it. Never for the address guard,
//! ambiguous paths, placeholders or secret values sent where they do not belong, nor for an
//! unidentified client.

use serde_json::json;

use crate::support::admin::metrics;
use crate::support::session::PySession;
use crate::support::{
    assert_denial, assert_record, connect_tunnel, curl, latchkey, Echo, Latchkey, TestCa, Upstream,
    PINNED,
};

const SECRET: &str = "sk-report-3f9a1c7e5d2b8046";

/// `api` (GET under /v1/, injects secret `k`, mode `api_mode`) and `other` (GET only,
/// enforced) on `port`.
fn policy(port: u16, api_mode: &str) -> String {
    format!(
        r#"
[secrets.k]
source = "env:LK_SECRET_K"

[[rules]]
name    = "api"
hosts   = ["api.test"]
ports   = [{port}]
methods = ["GET"]
paths   = ["/v1/**"]
{api_mode}
[rules.inject.headers]
x-key = "{{{{secret.k}}}}"

[[rules]]
name    = "other"
hosts   = ["other.test"]
ports   = [{port}]
methods = ["GET"]
"#
    )
}

struct World {
    lk: Latchkey,
    upstream: Upstream,
    _ca: TestCa,
}

/// An HTTPS echo upstream and latchkey with `policy(port)` and `args`; `meta.test` resolves to
/// the cloud metadata address.
fn world(policy: impl FnOnce(u16) -> String, args: &[&str]) -> World {
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let mut builder = latchkey()
        .upstream_ca(&ca)
        .env("LK_SECRET_K", SECRET)
        .resolve("meta.test", "169.254.169.254")
        .policy("main.toml", &policy(upstream.port()));
    for host in PINNED {
        builder = builder.pin(host);
    }
    for arg in args {
        builder = builder.arg(arg);
    }
    World {
        lk: builder.run(),
        upstream,
        _ca: ca,
    }
}

/// The secret must not have left latchkey on any request the upstream received for `path`.
fn assert_not_injected(upstream: &Upstream, path: &str) {
    let seen: Vec<_> = upstream
        .received()
        .into_iter()
        .filter(|r| r.path_only() == path)
        .collect();
    assert_eq!(seen.len(), 1, "expected one request for {path}: {seen:#?}");
    assert!(
        seen[0].header("x-key").is_none() && !format!("{seen:?}").contains(SECRET),
        "a secret was injected into a request policy would deny: {seen:#?}"
    );
}

#[test]
fn a_report_only_rule_forwards_what_it_would_deny_without_secrets_and_marks_the_record() {
    let w = world(|port| policy(port, "mode = \"report\""), &[]);
    let port = w.upstream.port();
    let url = |host: &str, path: &str| format!("https://{host}:{port}{path}");

    // Allowed as usual: the secret is injected, the record is not marked.
    let out = curl(&w.lk).args([url("api.test", "/v1/ok")]).run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    let ok = w.upstream.received();
    assert_eq!(ok[0].header("x-key"), Some(SECRET), "{ok:#?}");

    // Would be denied (method, then path): forwarded, no secret.
    let out = curl(&w.lk)
        .args(["-X", "POST", "-d", "a=1", &url("api.test", "/v1/post")])
        .run();
    let resp = out.ok();
    assert_eq!(resp.status, 200, "report-only should forward: {out:#?}");
    assert_eq!(Echo::parse(&resp.text()).method, "POST");
    assert_not_injected(&w.upstream, "/v1/post");
    let out = curl(&w.lk).args([url("api.test", "/v2/path")]).run();
    assert_eq!(out.ok().status, 200, "report-only should forward: {out:#?}");
    assert_not_injected(&w.upstream, "/v2/path");

    // `other` is enforced, and a host no rule names has no report-only rule to fall under.
    let out = curl(&w.lk)
        .args(["-X", "POST", &url("other.test", "/x")])
        .run();
    assert_denial(out.ok(), 403, Some("other"), "method_not_allowed");
    let out = curl(&w.lk).args([url("evil.test", "/x")]).run();
    assert_ne!(
        out.exit,
        Some(0),
        "a CONNECT no rule allows went through: {out:#?}"
    );
    assert_eq!(w.upstream.received().len(), 3);

    let records = w.lk.wait_audit(5);
    let upstream = w.upstream.addr_string();
    assert_record(
        &records[0],
        json!({"path": "/v1/ok", "decision": "allow", "reason": "allowed", "would_deny": false,
               "secrets": ["k"]}),
    );
    assert_record(
        &records[1],
        json!({"method": "POST", "path": "/v1/post", "decision": "allow", "would_deny": true,
               "reason": "method_not_allowed", "rule": "api", "secrets": [], "status": 200,
               "upstream": upstream}),
    );
    assert_record(
        &records[2],
        json!({"path": "/v2/path", "decision": "allow", "would_deny": true,
               "reason": "path_not_allowed", "rule": "api", "secrets": [], "status": 200,
               "upstream": upstream}),
    );
    assert_record(
        &records[3],
        json!({"host": "other.test", "decision": "deny", "would_deny": false,
               "reason": "method_not_allowed", "status": 403}),
    );
    assert_record(
        &records[4],
        json!({"method": "CONNECT", "host": "evil.test", "decision": "deny",
               "would_deny": false, "reason": "no_rule", "status": 403}),
    );

    let m = metrics(&w.lk);
    assert_eq!(
        m.sum("latchkey_report_only_would_deny_total", &[]),
        2.0,
        "{}",
        m.text
    );
    assert!(!w.lk.audit_text().contains(SECRET));
}

#[test]
fn global_report_mode_intercepts_a_host_no_rule_names_and_marks_every_inner_request() {
    let w = world(|port| policy(port, ""), &["--mode", "report"]);
    let port = w.upstream.port();

    // No rule names a.wild.test: in report mode the CONNECT is intercepted and each request on
    // the kept-alive tunnel is forwarded and marked.
    let mut session = PySession::start(&w.lk, None);
    for path in ["/a", "/b"] {
        let resp = session.request("GET", &format!("https://a.wild.test:{port}{path}"));
        assert_eq!(resp.status, 200, "{resp:#?}");
        assert_eq!(Echo::parse(&resp.text()).path, path);
    }
    drop(session);

    // A method the rule does not allow, under report mode: forwarded without its secret.
    let out = curl(&w.lk)
        .args(["-X", "DELETE", &format!("https://api.test:{port}/v1/x")])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_not_injected(&w.upstream, "/v1/x");

    let records = w.lk.wait_audit(3);
    for (record, path) in records.iter().zip(["/a", "/b"]) {
        assert_record(
            record,
            json!({"host": "a.wild.test", "path": path, "decision": "allow", "would_deny": true,
                   "reason": "no_rule", "rule": "report-only", "secrets": [], "status": 200,
                   "upstream": w.upstream.addr_string()}),
        );
    }
    assert_record(
        &records[2],
        json!({"method": "DELETE", "decision": "allow", "would_deny": true,
               "reason": "method_not_allowed", "rule": "api", "secrets": []}),
    );
    let m = metrics(&w.lk);
    assert_eq!(
        m.sum("latchkey_report_only_would_deny_total", &[]),
        3.0,
        "{}",
        m.text
    );
}

#[test]
fn report_mode_forwards_a_connect_to_a_port_no_rule_lists_and_marks_it() {
    let ca = TestCa::new();
    let listed = Upstream::https(&ca);
    let unlisted = Upstream::https(&ca);
    let lk = latchkey()
        .upstream_ca(&ca)
        .pin("api.test")
        .env("LK_SECRET_K", SECRET)
        .arg("--mode")
        .arg("report")
        .policy("main.toml", &policy(listed.port(), ""))
        .run();

    let out = curl(&lk)
        .args([format!("https://api.test:{}/v1/x", unlisted.port())])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_eq!(listed.received().len(), 0);
    assert_not_injected(&unlisted, "/v1/x");

    let records = lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"port": unlisted.port(), "decision": "allow", "would_deny": true,
               "reason": "port_not_allowed", "rule": "api", "secrets": [],
               "upstream": unlisted.addr_string()}),
    );
}

/// In `--mode report`, `curl ARGS` (with `{port}` replaced by the upstream's) is still refused
/// with `status` and `reason`: nothing reaches the upstream, the record is a plain denial, and
/// nothing counts as would-deny.
fn assert_refused_in_report_mode(args: &[&str], status: u16, reason: &str) {
    let w = world(|port| policy(port, ""), &["--mode", "report"]);
    let port = w.upstream.port().to_string();
    let args: Vec<String> = args.iter().map(|a| a.replace("{port}", &port)).collect();

    let out = curl(&w.lk).args(args.clone()).run();
    assert_denial(out.ok(), status, None, reason);
    assert_eq!(
        w.upstream.received().len(),
        0,
        "report mode let through {args:?}: {:#?}",
        w.upstream.received()
    );
    let records = w.lk.wait_audit(1);
    assert_record(
        &records[0],
        json!({"decision": "deny", "would_deny": false, "reason": reason, "status": status}),
    );
    let m = metrics(&w.lk);
    assert_eq!(
        m.sum("latchkey_report_only_would_deny_total", &[]),
        0.0,
        "{}",
        m.text
    );
    assert!(!w.lk.audit_text().contains(SECRET));
}

#[test]
fn report_mode_never_lets_a_request_past_the_address_guard() {
    // No rule names meta.test, so report mode would let it through, but it resolves to the
    // cloud metadata address.
    assert_refused_in_report_mode(
        &["http://meta.test/latest/meta-data/"],
        403,
        "non_public_address",
    );
}

#[test]
fn report_mode_never_forwards_an_ambiguous_path() {
    assert_refused_in_report_mode(
        &["--path-as-is", "https://api.test:{port}/v1/../admin"],
        400,
        "ambiguous_path",
    );
}

#[test]
fn report_mode_never_forwards_a_placeholder_to_a_host_its_secret_is_not_bound_to() {
    assert_refused_in_report_mode(
        &[
            "-H",
            "authorization: Bearer __LATCHKEY_k__",
            "https://other.test:{port}/x",
        ],
        403,
        "placeholder_not_bound",
    );
}

#[test]
fn report_mode_never_forwards_a_secret_value_to_a_host_it_is_not_bound_to() {
    let header = format!("x-leak: {SECRET}");
    assert_refused_in_report_mode(
        &["-H", &header, "https://other.test:{port}/x"],
        403,
        "secret_value_unbound",
    );
}

#[test]
fn a_report_only_rule_lets_an_identity_through_marked_but_an_unknown_token_still_gets_407() {
    const TOKEN_CI: &str = "tok-ci-report-8d2f6b0a4c1e";
    let ca = TestCa::new();
    let upstream = Upstream::https(&ca);
    let port = upstream.port();
    let lk = latchkey()
        .upstream_ca(&ca)
        .pin("api.test")
        .pin("other.test")
        .env("LK_SECRET_K", SECRET)
        .env("LK_TOKEN_CI", TOKEN_CI)
        .policy(
            "main.toml",
            &format!(
                r#"
[secrets.k]
source = "env:LK_SECRET_K"

[[rules]]
name  = "api"
hosts = ["api.test"]
ports = [{port}]

[[rules]]
name  = "other"
hosts = ["other.test"]
ports = [{port}]
mode  = "report"
[rules.inject.headers]
x-key = "{{{{secret.k}}}}"

[identities.ci]
token = "env:LK_TOKEN_CI"
rules = ["api"]
"#
            ),
        )
        .run();

    // ci may not use `other`, but `other` only reports: through the CONNECT gate, forwarded
    // without other's secret, marked.
    let out = curl(&lk)
        .args([
            "--proxy-user",
            &format!("ci:{TOKEN_CI}"),
            &format!("https://other.test:{port}/x"),
        ])
        .run();
    assert_eq!(out.ok().status, 200, "{out:#?}");
    assert_not_injected(&upstream, "/x");

    // Not knowing who asks is not a policy denial: still 407.
    let (_tcp, resp) = connect_tunnel(lk.addr(), &format!("other.test:{port}"));
    assert_denial(&resp, 407, None, "proxy_auth_required");

    let records = lk.wait_audit(2);
    assert_record(
        &records[0],
        json!({"identity": "ci", "host": "other.test", "decision": "allow", "would_deny": true,
               "reason": "identity_not_allowed", "rule": "other", "secrets": [], "status": 200}),
    );
    assert_record(
        &records[1],
        json!({"identity": "unidentified", "method": "CONNECT", "decision": "deny",
               "would_deny": false, "reason": "proxy_auth_required", "status": 407}),
    );
    assert!(!lk.audit_text().contains(TOKEN_CI));
}
